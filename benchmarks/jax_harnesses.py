"""JAX's own primitive harnesses (jax/_src/internal_test_util/test_harnesses.py) through mnjit, against jax.jit.

    python benchmarks/jax_harnesses.py [--x64] [--only NAME] [--out results.jsonl] [--limit N]

Every harness jax runs on CPU (its own `filter("cpu")`; without --x64, those whose dtype is 64-bit are
left out, as jax would narrow them) is called through `mnjit(h.dyn_fun)` and `jax.jit(h.dyn_fun)` on the
same arguments, and classified:
- pass: same tree, shapes and dtypes; values within the dtype's tolerance, NaNs in the same places;
- refused: a clean hlo2onnx error (an op or form without a translation), raised before anything runs;
- wrong: results differ;
- crash: any other exception;
- jax-fails: jax.jit itself raises (not counted).
Prints the pass rate per mode and the failing groups; --out keeps one JSON line per harness.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Tolerances by dtype kind and width (rtol = atol): transcendental functions differ from XLA's by a few ulp.
_TOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12,
        "complex64": 1e-5, "complex128": 1e-12}
_WIDE = {"float64", "int64", "uint64", "complex128"}


def _close(actual, expected) -> str | None:
    a_leaves, a_tree = jax.tree_util.tree_flatten(actual)
    e_leaves, e_tree = jax.tree_util.tree_flatten(expected)
    if a_tree != e_tree:
        return f"tree {a_tree} != {e_tree}"
    for a, e in zip(a_leaves, e_leaves):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"{a.dtype}{list(a.shape)} != {e.dtype}{list(e.shape)}"
        tol = _TOL.get(str(a.dtype))
        if tol is None:  # bool, integers, float8: exact (float8 compared by bits)
            if not np.array_equal(a.view(np.uint8) if a.dtype.kind == "V" else a,
                                  e.view(np.uint8) if e.dtype.kind == "V" else e):
                return "values differ (exact dtype)"
            continue
        wide = np.complex128 if a.dtype.kind == "c" else np.float64  # bfloat16 converts too
        try:
            np.testing.assert_allclose(a.astype(wide), e.astype(wide), rtol=tol, atol=tol, equal_nan=True)
        except AssertionError as error:
            return " ".join(str(error).split())[:300]
    return None


def run(harness, mnjit, hlo2onnx) -> tuple[str, str]:
    rng = np.random.RandomState(0)
    args = harness.dyn_args_maker(rng)
    try:
        expected = jax.block_until_ready(jax.jit(harness.dyn_fun)(*args))
    except Exception as error:  # noqa: BLE001  jax's own failure: nothing to compare
        return "jax-fails", f"{type(error).__name__}: {str(error)[:200]}"
    try:
        actual = jax.block_until_ready(mnjit(harness.dyn_fun)(*args))
    except (hlo2onnx.Hlo2OnnxError, NotImplementedError) as error:
        return "refused", " ".join(str(error).split())[:300]
    except Exception as error:  # noqa: BLE001  classified, not hidden
        return "crash", f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
    problem = _close(actual, expected)
    return ("pass", "") if problem is None else ("wrong", problem)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--x64", action="store_true", help="run with jax_enable_x64")
    parser.add_argument("--only", help="harnesses whose full name contains this")
    parser.add_argument("--out", type=Path, help="write one JSON line per harness here")
    parser.add_argument("--limit", type=int, help="stop after this many harnesses")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", args.x64)
    from jax._src.internal_test_util import test_harnesses  # jax's own table (ships with jax)

    import hlo2onnx
    from mnjit import mnjit

    chosen = [h for h in test_harnesses.all_harnesses
              if h.filter("cpu", one_containing=args.only) and (args.x64 or np.dtype(h.dtype).name not in _WIDE)]
    if args.limit:
        chosen = chosen[:args.limit]
    outcomes: Counter = Counter()
    failing: dict[str, Counter] = defaultdict(Counter)
    out = args.out.open("w") if args.out else None
    start = time.perf_counter()
    for i, harness in enumerate(chosen):
        outcome, detail = run(harness, mnjit, hlo2onnx)
        outcomes[outcome] += 1
        if outcome not in ("pass", "jax-fails"):
            failing[outcome][harness.group_name] += 1
        if out:
            out.write(json.dumps({"name": harness.fullname, "group": harness.group_name,
                                  "dtype": np.dtype(harness.dtype).name, "outcome": outcome,
                                  "detail": detail}) + "\n")
            out.flush()
        if (i + 1) % 250 == 0:
            print(f"  {i + 1}/{len(chosen)} {dict(outcomes)} ({time.perf_counter() - start:.0f} s)", flush=True)
    counted = len(chosen) - outcomes["jax-fails"]
    mode = "x64" if args.x64 else "default (no x64)"
    print(f"{mode}: {outcomes['pass']} of {counted} CPU harnesses pass "
          f"({100 * outcomes['pass'] / max(counted, 1):.1f}%); {dict(outcomes)}")
    for outcome in ("wrong", "crash", "refused"):
        if failing[outcome]:
            print(f"  {outcome}: " + ", ".join(f"{g} {n}" for g, n in failing[outcome].most_common()))
    return 1 if outcomes["wrong"] or outcomes["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
