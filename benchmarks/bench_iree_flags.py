"""iree-cpu with other iree-compile flags against its defaults, in one process: each variant is a separate
mnjit function on iree-cpu compiled with the default flags plus the variant's, timed in the same interleaved
rounds as the default and jax.jit (order rotating by round), with its outputs' largest difference from the default's.

    python benchmarks/bench_iree_flags.py --only cnn,mlp [--rounds 7] \
        --variant ukernels=--iree-llvmcpu-enable-ukernels=all --variant o3=--iree-opt-level=O3

A variant's flags are separated by commas. Ratios are mnjit / jax.jit of the median (and of the fastest
round), as in bench_workloads.py; the load average is printed per row. A control variant that repeats a default
flag compiles the same code under another cache key: its spread from the default is the noise.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import bench_workloads  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from mnjit import iree_runner, mnjit  # noqa: E402


def _largest_difference(a, b) -> float:
    """The largest |a - b| over all leaves, relative to the largest |b| of its leaf."""
    worst = 0.0
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        scale = max(float(np.max(np.abs(y))), 1e-300) if y.size else 1.0
        worst = max(worst, float(np.max(np.abs(x - y))) / scale if y.size else 0.0)
    return worst


def timed(fns: dict, args, rounds: int, calls: int) -> dict[str, tuple[float, float]]:
    """(median, min) seconds per call over `rounds`; the order of the candidates rotates from round to round,
    so that none always runs right after jax.jit (at load 5-6 on 2 cores the first of a fixed order drew up to
    1.5x the time of the same code later in the round)."""
    names = list(fns)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            for _ in range(calls):
                out = fns[name](*args)
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: (statistics.median(s), min(s)) for name, s in samples.items()}


def measure(name: str, variants: dict[str, tuple[str, ...]], rounds: int, quick: bool) -> None:
    label, x64, make = bench_workloads.WORKLOADS[name]
    default = iree_runner.CPU
    with jax.enable_x64(x64):
        fn, args, calls = make(quick)
        fns, outputs = {}, {}
        for variant, flags in {"default": (), **variants}.items():
            # mnjit.device reads iree_runner.CPU when it makes a runner: each function keeps the flags it
            # was first called under.
            iree_runner.CPU = replace(default, flags=default.flags + flags)
            try:
                f = mnjit(bench_workloads._fresh(fn), target="iree-cpu", fallback=True)
                outputs[variant] = jax.block_until_ready(f(*args))
                fns[variant] = f
            except Exception as e:  # a flag iree-compile refuses, or a miscompile the runtime reports
                print(f"{label:30s} {variant}: failed: {' '.join(str(e).split())[:200]}", flush=True)
            finally:
                iree_runner.CPU = default
        fns["jax.jit"] = jax.jit(fn)
        jax.block_until_ready(fns["jax.jit"](*args))
        times = timed(fns, args, rounds, calls)
    base, base_min = times["jax.jit"]
    columns = "  ".join(
        f"{v} {times[v][0] * 1e3:8.3f} ms {times[v][0] / base:5.2f} (min {times[v][1] / base_min:5.2f})"
        + (f" (diff {_largest_difference(outputs[v], outputs['default']):.1e})" if v != "default" else "")
        for v in fns if v != "jax.jit")
    print(f"{label:30s} {columns}  jax.jit {base * 1e3:8.3f} ms  load {os.getloadavg()[0]:4.1f}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", required=True, help="comma-separated bench_workloads names")
    parser.add_argument("--variant", action="append", default=[], help="name=flag,flag,...")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    variants = {}
    for spec in args.variant:
        variant, _, flags = spec.partition("=")
        variants[variant] = tuple(flags.split(","))
    print(f"jax {jax.__version__}, load {os.getloadavg()}; default flags {' '.join(iree_runner.CPU.flags)}",
          flush=True)
    for name in args.only.split(","):
        measure(name, variants, args.rounds, args.quick)


if __name__ == "__main__":
    main()
