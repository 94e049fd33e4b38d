"""The keys of mnjit's persistent cache (mnjit/persist.py says what it keeps): a SHA-256 over the environment that
can change a cached value, and the parts that name one entry; and the facts that only the environment decides.

Below mnjit's runtime (it imports no runner), so that the runtime's own modules can keep measured facts.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import platform
import struct
from pathlib import Path
from typing import Callable

import jax
import numpy as np
import onnx
import onnx_ir as ir

import hlo2onnx
from mnjit import disk_cache

FACT = "fact"


@functools.lru_cache(maxsize=1)
def environment() -> bytes:
    """Everything outside the module that can change a cached value, once per process (a few ms: module
    attributes and stat calls; importlib.metadata took 11 ms for jax's version alone)."""
    import jaxlib
    import ml_dtypes
    import onnxruntime

    import mnjit

    versions = {module.__name__: module.__version__ for module in (jax, jaxlib, onnxruntime, onnx, ir, np, ml_dtypes)}
    sources = hashlib.sha256()
    for package in (os.path.dirname(mnjit.__file__), os.path.dirname(hlo2onnx.__file__)):
        for folder, dirs, files in os.walk(package):  # os.walk: a third of Path.rglob's time
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    stat = os.stat(os.path.join(folder, name))
                    sources.update(f"{folder[len(package):]}/{name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return json.dumps({"format": disk_cache.FORMAT, "mnjit": mnjit.__version__, "versions": versions,
                       "iree": _iree_versions(), "sources": sources.hexdigest(), "cpu": _cpu(),
                       "python": platform.python_version()}, sort_keys=True).encode()


def _iree_versions() -> str:
    """IREE's compiler and runtime versions, read from their version.py files without importing IREE."""
    spec = importlib.util.find_spec("iree")
    texts = []
    for part in ("compiler", "runtime"):
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            try:
                texts.append(Path(folder, part, "version.py").read_text())
            except OSError:
                pass
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()


def _cpu() -> str:
    """The CPU's model and feature flags (/proc/cpuinfo's first processor; the platform elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            fields = {}
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                name, _, value = line.partition(":")
                fields[name.strip()] = value.strip()
        return f"{fields.get('model name', '')}|{fields.get('flags', fields.get('Features', ''))}"
    except OSError:
        return f"{platform.machine()}|{platform.processor()}"


def key(*parts: bytes | str) -> str:
    """The hex SHA-256 of the environment and `parts`, each length-prefixed (no two part lists collide)."""
    digest = hashlib.sha256()
    for part in (environment(), *parts):
        data = part.encode() if isinstance(part, str) else part
        digest.update(struct.pack("<Q", len(data)))
        digest.update(data)
    return digest.hexdigest()


def stored_number(parts: tuple[str, ...], measure: Callable[[], int], below: int) -> int:
    """`measure()`, a number from 0 to `below` - 1 kept under the environment and `parts`, or the one an earlier
    process kept there; anything else found there is measured again and replaced."""
    store = disk_cache.current()
    if store is None:
        return measure()
    fact_key = key(FACT, *parts)
    stored = store.get(FACT, fact_key)
    if stored is not None and stored.isdigit() and stored == str(int(stored)).encode() and int(stored) < below:
        return int(stored)
    value = int(measure())
    store.put(FACT, fact_key, str(value).encode())
    return value
