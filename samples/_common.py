"""The command-line scaffolding the three samples share: `--jit module:attr` and `--check`.

Not part of the official examples: each sample's own code differs from its original only in `jit`.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Callable


def add_jit_options(parser: argparse.ArgumentParser, compared: str) -> None:
    parser.add_argument("--jit", help="use this jit instead of mnjit, as module:attr (e.g. jax:jit)")
    parser.add_argument("--check", action="store_true", help=f"also run jax.jit and compare {compared}")


def chosen_jit(spec: str | None, default: Callable) -> Callable:
    """The jit named by `--jit module:attr` (attr defaults to `jit`), else `default`."""
    if not spec:
        return default
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr or "jit")


def verdict(agrees: bool, failure: str) -> int:
    """Prints the outcome of --check; returns the process exit code."""
    print("OK: matches jax.jit" if agrees else f"FAIL: {failure}")
    return 0 if agrees else 1
