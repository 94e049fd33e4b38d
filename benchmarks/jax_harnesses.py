"""Run JAX's own primitive harnesses (jax/_src/internal_test_util/test_harnesses.py) through mnjit.

Every harness that JAX itself runs on CPU (the harness's own `filter("cpu")`, which drops
what JAX marks unimplemented there) is run as `mnjit(h.dyn_fun)` and `jax.jit(h.dyn_fun)` on
the same `h.dyn_args_maker(rng)` inputs, and classified:

  pass     same tree, shapes, dtypes, values within the dtype's tolerance, NaNs in place
  refused  a clean hlo2onnx error (UnsupportedOpError, ...) naming the op
  wrong    ran, but the result differs
  crash    any other exception (ORT rejecting the model, a Python error in a rule, ...)

Harnesses that jax.jit itself fails on are counted as `jax-fail` and left out of the rate.

    python benchmarks/jax_harnesses.py [--x64] [--only NAME] [--jobs N] [--json OUT] [--sample K]

--only keeps harnesses whose group or full name contains NAME. --jobs N runs N shards as
subprocesses and merges them. The x64 mode is fixed before jax is imported (the harness
list depends on it).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
import traceback

# The checkout this script lives in, ahead of any installed copy of mnjit/hlo2onnx.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOL = {  # (rtol, atol): jax's own harness tests use comparable per-dtype tolerances
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
    "float32": (1e-4, 1e-4),
    "float64": (1e-9, 1e-9),
    "complex64": (1e-4, 1e-4),
    "complex128": (1e-9, 1e-9),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--x64", action="store_true", help="run with jax_enable_x64")
    p.add_argument("--only", default=None, help="keep harnesses whose name contains this")
    p.add_argument("--jobs", type=int, default=1, help="parallel shards (subprocesses)")
    p.add_argument("--shard", default=None, help="i/N: run only this shard (used by --jobs)")
    p.add_argument("--sample", type=int, default=0, help="run every K-th harness only")
    p.add_argument("--json", default=None, help="write per-harness results here")
    p.add_argument("--rerun", default=None,
                   help="a previous --json: run again only its non-passing harnesses, keep its passes")
    p.add_argument("--verbose", "-v", action="store_true", help="print each non-pass with its message")
    p.add_argument("--opset", type=int, default=None, help="the ONNX opset mnjit writes (default: hlo2onnx's)")
    p.add_argument("--target", default=None,
                   help="mnjit's target (default ort-cpu); what the target refuses counts as refused")
    return p.parse_args(argv)


def select(harnesses, args):
    out = []
    for h in harnesses:
        if not h.filter("cpu", include_jax_unimpl=False):
            continue
        if any(l.skip_run and l.filter(device="cpu", dtype=h.dtype) for l in h.jax_unimplemented):
            continue
        if args.only and args.only not in h.fullname and args.only not in h.group_name:
            continue
        out.append(h)
    if args.sample > 1:
        out = out[:: args.sample]
    if args.rerun:
        with open(args.rerun) as f:
            again = {r["name"] for r in json.load(f) if r["status"] != "pass"}
        out = [h for h in out if h.fullname in again]
    if args.shard:
        i, n = map(int, args.shard.split("/"))
        out = out[i::n]
    return out


def compare(actual, expected):
    import jax
    import ml_dtypes
    import numpy as np

    a_leaves, a_tree = jax.tree_util.tree_flatten(actual)
    e_leaves, e_tree = jax.tree_util.tree_flatten(expected)
    if a_tree != e_tree:
        return f"tree {a_tree} != {e_tree}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"[{i}] {a.dtype}{a.shape} != {e.dtype}{e.shape}"
        if e.dtype.kind == "V" or str(e.dtype).startswith("key"):
            continue
        rtol, atol = TOL.get(e.dtype.name, (0, 0))
        if e.dtype == ml_dtypes.bfloat16 or e.dtype.kind == "f" and e.dtype.itemsize < 4:
            a, e = a.astype(np.float32), e.astype(np.float32)
        elif e.dtype.kind == "f" and e.dtype.itemsize == 1 or str(e.dtype).startswith("float8"):
            a, e = a.astype(np.float32), e.astype(np.float32)
        try:
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as err:
            return f"[{i}] " + " ".join(str(err).split())[:300]
    return None


def _close(name, actual, expected, dtype, scale=1.0):
    import numpy as np

    rtol, atol = TOL.get(np.dtype(dtype).name, (0, 0))
    try:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol * scale)
    except AssertionError as err:
        return f"{name}: " + " ".join(str(err).split())[:300]
    return None


def _unitary(name, q, dtype):
    """q's columns orthonormal: q^H q = I."""
    import numpy as np

    gram = np.conj(np.swapaxes(q, -1, -2)) @ q
    return _close(name, gram, np.broadcast_to(np.eye(q.shape[-1], dtype=gram.dtype), gram.shape), dtype)


def _check_svd(h, args, actual, expected):
    """(s, u, vt) = svd_p: u and vt are unique only up to a sign (a phase, complex) per singular vector, so
    like JAX's own tests (jax2tf's custom_assert for svd) they are held to U S Vt = A and orthonormality."""
    import numpy as np

    a = np.asarray(args[0])
    if len(actual) == 1:
        return compare(actual, expected)
    s, u, vt = (np.asarray(x) for x in actual)
    k = s.shape[-1]
    scale = max(1.0, float(np.abs(a).max(initial=0)))
    return (compare(actual[0], expected[0]) or _unitary("u", u, a.dtype)
            or _unitary("v", np.conj(np.swapaxes(vt, -1, -2)), a.dtype)
            or _close("u s vt = a", (u[..., :k] * s[..., None, :]) @ vt[..., :k, :], a, a.dtype, scale))


def _check_eigh(h, args, actual, expected):
    """(v, w) = eigh: eigenvectors are unique only up to a sign (a phase), and for equal eigenvalues up to a
    rotation; like JAX's own tests they are held to A v = v w and orthonormality (A: the Hermitian input)."""
    import numpy as np

    a = np.asarray(args[0])
    v, w = (np.asarray(x) for x in actual)
    scale = max(1.0, float(np.abs(a).max(initial=0)))
    return (compare(actual[1], expected[1]) or _unitary("v", v, a.dtype)
            or _close("a v = v w", a @ v, v * w[..., None, :], a.dtype, scale * a.shape[-1] ** 0.5))


def _matching(w, w0):
    """Per batch element, the order of w's entries nearest to w0's (greedily, w0's in turn)."""
    import numpy as np

    w, w0 = w.reshape(-1, w.shape[-1]), w0.reshape(-1, w0.shape[-1])
    order = np.zeros(w.shape, np.int64)
    for i in range(w.shape[0]):
        free = np.ones(w.shape[-1], bool)
        for j, value in enumerate(w0[i]):
            k = np.argmin(np.where(free, np.abs(w[i] - value), np.inf))
            order[i, j], free[k] = k, False
    return order


def _check_eig(h, args, actual, expected):
    """(w, [vl], [vr]) = eig: the eigenvalues come in the Schur form's order (LAPACK's multishift QR deflates
    elsewhere) and vectors are unique only up to a phase: w must match jax.jit's as a multiset, and the vectors
    satisfy A v = v w, u^H A = w u^H with unit norms."""
    import jax
    import numpy as np

    if jax.tree_util.tree_structure(actual) != jax.tree_util.tree_structure(expected):
        return "the result trees differ"
    actual, expected = [np.asarray(x) for x in actual], [np.asarray(x) for x in expected]
    for a, e in zip(actual, expected):
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"{a.dtype}{a.shape} != {e.dtype}{e.shape}"
    a = np.asarray(args[0])
    if a.size == 0:
        return None
    w, w0 = actual[0], expected[0]
    n = a.shape[-1]
    scale = max(1.0, float(np.abs(a).max())) * n ** 0.5
    matched = np.take_along_axis(w.reshape(-1, n), _matching(w, w0), -1).reshape(w0.shape)
    msg = _close("eigenvalues", matched, w0, a.dtype, scale)
    adjoint = lambda x: np.conj(np.swapaxes(x, -1, -2))
    vectors = iter(actual[1:])
    if not msg and h.params["compute_left_eigenvectors"]:
        u = next(vectors)
        msg = (_close("|u| = 1", np.linalg.norm(u, axis=-2), np.ones(w.shape), a.dtype)
               or _close("u^H a = w u^H", adjoint(u) @ a, w[..., :, None] * adjoint(u), a.dtype, scale))
    if not msg and h.params["compute_right_eigenvectors"]:
        v = next(vectors)
        msg = (_close("|v| = 1", np.linalg.norm(v, axis=-2), np.ones(w.shape), a.dtype)
               or _close("a v = v w", a @ v, v * w[..., None, :], a.dtype, scale))
    return msg


def _check_cholesky(h, args, actual, expected):
    """XLA's and our factorizations round differently, and the difference grows with n (JAX's own tests give
    float32 a 1e-2 tolerance here): L is held to L L^H = A, A the symmetrized input, with the error scaled
    by sqrt(n)."""
    import numpy as np

    a = np.asarray(args[0])
    a = (a + np.conj(np.swapaxes(a, -1, -2))) / 2
    lower = np.tril(np.asarray(actual, dtype=np.result_type(a, np.float32)))
    if np.isnan(np.asarray(expected, dtype=lower.dtype)).any():  # not positive definite: NaNs like XLA's
        return compare(actual, expected)
    scale = max(1.0, float(np.abs(a).max(initial=0))) * max(1, a.shape[-1]) ** 0.5
    return _close("l l^h = a", lower @ np.conj(np.swapaxes(lower, -1, -2)), a, a.dtype, scale)


def _check_unstable_sort(h, args, actual, expected):
    """is_stable=False leaves the order of equal keys to the implementation (XLA's too): the keys must
    match, and each run of equal keys must carry the same rows."""
    import numpy as np

    if h.params["is_stable"]:
        return compare(actual, expected)
    n_keys, axis = h.params["num_keys"], h.params["dimension"]
    msg = compare(tuple(actual[:n_keys]), tuple(expected[:n_keys]))
    if msg:
        return msg

    def rows(arrays):
        flat = np.stack([np.moveaxis(np.asarray(x), axis, -1).reshape(-1, x.shape[axis]) for x in arrays], -1)
        return np.stack([r[np.lexsort(r.T[::-1])] for r in flat])

    return None if np.array_equal(rows(actual), rows(expected), equal_nan=True) else "the rows of equal keys differ"


def _check_approx_top_k(h, args, actual, expected):
    """On CPU approx_top_k is an exact top-k whose order among equal values is XLA's sort's: the values must
    match, and the indices must be distinct and point at those values."""
    import numpy as np

    msg = compare(actual[0], expected[0])
    if msg:
        return msg
    values, indices = np.asarray(actual[0]), np.asarray(actual[1])
    picked = np.take_along_axis(np.asarray(args[0]), indices, -1)
    if not np.array_equal(picked, values, equal_nan=True):
        return "the indices do not point at the values"
    distinct = np.sort(indices, -1)
    return "repeated indices" if (distinct[..., 1:] == distinct[..., :-1]).any() else None


# Groups whose results are not unique (or whose rounding grows with size): checked by the properties
# that define them, as JAX's own tests do (jax2tf's custom asserts).
PROPERTY_CHECKS = {"svd": _check_svd, "eigh": _check_eigh, "eig": _check_eig, "cholesky": _check_cholesky,
                   "sort": _check_unstable_sort, "approx_top_k": _check_approx_top_k}


def run_one(h, seed=0, opset=None, target=None):
    import jax
    import numpy as np

    from hlo2onnx.errors import Hlo2OnnxError
    from mnjit import mnjit

    rng = np.random.RandomState(seed)
    args = h.dyn_args_maker(rng)
    try:
        expected = jax.jit(h.dyn_fun)(*args)
        jax.block_until_ready(expected)
    except Exception as err:  # noqa: BLE001
        return "jax-fail", f"{type(err).__name__}: {str(err)[:200]}"
    try:
        options = {"opset": opset, "target": target}
        actual = mnjit(h.dyn_fun, **{k: v for k, v in options.items() if v is not None})(*args)
    except Hlo2OnnxError as err:
        return "refused", f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
    except Exception as err:  # noqa: BLE001
        tb = traceback.extract_tb(err.__traceback__)
        where = f" at {tb[-1].filename.rsplit('/', 2)[-1]}:{tb[-1].lineno}" if tb else ""
        return "crash", f"{type(err).__name__}{where}: {' '.join(str(err).split())[:300]}"
    check = PROPERTY_CHECKS.get(h.group_name)
    msg = compare(actual, expected) if check is None else check(h, args, actual, expected)
    return ("wrong", msg) if msg else ("pass", "")


def dtype_name(h):
    import numpy as np

    try:
        return np.dtype(h.dtype).name
    except TypeError:
        return str(h.dtype)


def run_shard(args):
    if args.x64:
        os.environ["JAX_ENABLE_X64"] = "1"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_enable_x64", bool(args.x64))
    from jax._src.internal_test_util import test_harnesses

    results = []
    for h in select(test_harnesses.all_harnesses, args):
        t0 = time.perf_counter()
        status, msg = run_one(h, opset=args.opset, target=args.target)
        results.append(dict(name=h.fullname, group=h.group_name, dtype=dtype_name(h), status=status,
                            msg=msg, seconds=round(time.perf_counter() - t0, 3)))
        if args.verbose and status != "pass":
            print(f"{status:8s} {h.fullname}: {msg}", flush=True)
    return results


def run_parallel(args):
    procs = []
    outs = []
    for i in range(args.jobs):
        out = f"{args.json or '/tmp/jax_harnesses'}.shard{i}.json"
        outs.append(out)
        cmd = [sys.executable, __file__, "--shard", f"{i}/{args.jobs}", "--json", out]
        cmd += ["--x64"] if args.x64 else []
        cmd += ["--only", args.only] if args.only else []
        cmd += ["--sample", str(args.sample)] if args.sample else []
        cmd += ["-v"] if args.verbose else []
        cmd += ["--opset", str(args.opset)] if args.opset else []
        cmd += ["--target", args.target] if args.target else []
        procs.append(subprocess.Popen(cmd))
    for p in procs:
        p.wait()
    results = []
    for out in outs:
        with open(out) as f:
            results += json.load(f)
        os.remove(out)
    return results


def report(results, x64):
    counts = collections.Counter(r["status"] for r in results)
    eligible = len(results) - counts["jax-fail"]
    print(f"\n== x64={'on' if x64 else 'off'}: {counts['pass']} of {eligible} pass "
          f"({100 * counts['pass'] / max(eligible, 1):.1f}%); " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    by_dtype = collections.defaultdict(collections.Counter)
    by_group = collections.defaultdict(collections.Counter)
    for r in results:
        by_dtype[r["dtype"]][r["status"]] += 1
        by_group[r["group"]][r["status"]] += 1
    print("\nper dtype (pass/eligible):")
    for d, c in sorted(by_dtype.items()):
        print(f"  {d:12s} {c['pass']}/{sum(c.values()) - c['jax-fail']}  " +
              ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k != "pass"))
    print("\nprimitives with failures:")
    for g, c in sorted(by_group.items(), key=lambda kv: -(sum(kv[1].values()) - kv[1]["pass"])):
        if sum(c.values()) - c["pass"] - c["jax-fail"] > 0:
            print(f"  {g:32s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    print("\nnon-pass by message:")
    msgs = collections.Counter((r["status"], r["group"], r["msg"][:120]) for r in results
                               if r["status"] not in ("pass", "jax-fail"))
    for (s, g, m), n in msgs.most_common():
        print(f"  {n:4d} {s:8s} {g}: {m}")


def main(argv=None):
    args = parse_args(argv)
    results = run_parallel(args) if args.jobs > 1 and not args.shard else run_shard(args)
    if args.rerun and not args.shard:
        with open(args.rerun) as f:
            previous = json.load(f)
        fresh = {r["name"]: r for r in results}
        results = [fresh.get(r["name"], r) for r in previous]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=0)
    if not args.shard:
        report(results, args.x64)


if __name__ == "__main__":
    main()
