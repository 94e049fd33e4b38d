"""The persistent cache's pre-lowering key (mnjit/trace_key.py): a warm process finds a signature's translation
from jax.jit's trace alone, and anything that changes the lowering is another key, never a stale hit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from harness import assert_same, rand
from mnjit import mnjit, persist, trace_key

ROOT = Path(__file__).resolve().parent.parent
TOL = (1e-5, 1e-5)


def _count(path: Path, kind: str) -> int:
    return len(list(path.glob(f"{kind}/*.bin")))


WARM = """
    import json
    import hlo2onnx, jax, jax.numpy as jnp, numpy as np
    import mnjit
    from jax._src import stages

    mnjit.configure_cache(CACHE)
    table = np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64)  # a closed-over constant

    def f(x, w):
        return jnp.tanh(x @ w + table[: x.shape[0], : w.shape[1]]).sum(axis=0) * 0.5

    x = jnp.asarray(np.linspace(-1, 1, 16 * 32, dtype=np.float32).reshape(16, 32))
    w = jnp.asarray(np.linspace(-0.5, 0.5, 32 * 32, dtype=np.float32).reshape(32, 32))
    counts = {"lower": 0, "translate": 0}
    if WARM:
        lower, translate = stages.Traced.lower, hlo2onnx.translate_report

        def counting_lower(self, *args, **kwargs):
            counts["lower"] += 1
            return lower(self, *args, **kwargs)

        def counting_translate(*args, **kwargs):
            counts["translate"] += 1
            return translate(*args, **kwargs)
        stages.Traced.lower, hlo2onnx.translate_report = counting_lower, counting_translate
    out = mnjit.mnjit(f)(x, w)
    ok = bool(np.allclose(out, jax.jit(f)(x, w), rtol=1e-5, atol=1e-5))
    print(json.dumps({"ok": ok, **counts}))
"""


def _run(code: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_warm_process_neither_lowers_nor_translates(tmp_path):
    header = f"CACHE = {str(tmp_path / 'c')!r}\n"
    cold = _run(header + "WARM = False\n" + textwrap.dedent(WARM))
    assert cold["ok"]
    assert _count(tmp_path / "c", persist.TRACE) == 1
    warm = _run(header + "WARM = True\n" + textwrap.dedent(WARM))
    assert warm == {"ok": True, "lower": 0, "translate": 0}, warm


def test_changed_closed_over_constants_miss(cache):
    """The same function text over other constant values: an array (a const of the jaxpr), one inside a loop's
    body and a cond's branch (consts of the jaxprs in parameters), and a Python scalar (a literal). Each is a new
    closure: jax.jit itself reuses a function's trace while the function object lives."""
    def make(table, scale):
        def f(x):
            y = jax.lax.fori_loop(0, 2, lambda i, c: c * 0.5 + jnp.asarray(table[:8]), x)
            z = jax.lax.cond(x[0] > 0, lambda: jnp.asarray(table[8:16]), lambda: jnp.asarray(table[16:24]))
            return x * jnp.asarray(table[:8]) * scale + y + z
        return f

    base = np.linspace(-1, 1, 64, dtype=np.float32)
    changed = [base.copy() for _ in range(3)]
    changed[0][3], changed[1][12], changed[2][20] = 9.0, -4.0, 5.0
    x = rand((8,))
    seen = set()
    for table, scale in ((base, 2.0), (changed[0], 2.0), (changed[1], 2.0), (changed[2], 2.0), (base, 3.0)):
        f = make(table, scale)
        assert_same(mnjit(f)(x), jax.jit(f)(x), TOL)
        assert_same(mnjit(f)(-x), jax.jit(f)(-x), TOL)  # both branches of the cond
        seen.add(trace_key.digest(jax.jit(f).trace(x)))
    assert len(seen) == 5
    assert _count(cache, persist.TRACE) == 5 and _count(cache, persist.TRANSLATION) == 5


def test_changed_static_argument_misses(cache):
    def f(x, n):
        return x * n + jnp.arange(x.shape[0], dtype=x.dtype)

    x = rand((4,))
    for n in (2, 3, 2):
        assert_same(mnjit(f, static_argnums=1)(x, n), jax.jit(f, static_argnums=1)(x, n), TOL)
    assert _count(cache, persist.TRACE) == 2


def test_x64_on_and_off_are_other_keys(cache):
    def f(x):
        return x * 2.5 + 1

    x = np.arange(4, dtype=np.float32)
    results = {}
    for x64 in (False, True, False):
        with jax.enable_x64(x64):
            results[x64] = mnjit(f)(x)
            assert_same(results[x64], jax.jit(f)(x), TOL)
            assert results[x64].dtype == jax.jit(f)(x).dtype
    assert _count(cache, persist.TRACE) == 2


def test_trace_context_is_in_the_key(cache):
    """threefry_partitionable changes random bits without changing the jaxpr: jax keys its caches on it too."""
    def f(key):
        return jax.random.uniform(key, (4, 3))

    key = jax.random.key(1)
    before = jax.config.jax_threefry_partitionable
    try:
        for value in (False, True):
            jax.config.update("jax_threefry_partitionable", value)
            assert_same(mnjit(f)(key), jax.jit(f)(key), TOL)
    finally:
        jax.config.update("jax_threefry_partitionable", before)
    assert _count(cache, persist.TRACE) == 2


def test_host_callbacks_are_never_keyed(cache):
    def f(x):
        return jax.pure_callback(lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1

    x = rand((4,))
    for _ in range(2):
        assert_same(mnjit(f)(x), jax.jit(f)(x), TOL)
    assert _count(cache, persist.TRACE) == 0 and _count(cache, persist.TRANSLATION) == 0


def test_argument_names_are_in_the_key():
    """The ONNX inputs are named after the arguments: the same program under other names is another key."""
    def f(x, y):
        return x + y

    def g(a, b):
        return a + b

    x = rand((3,))
    assert trace_key.digest(jax.jit(f).trace(x, x)) != trace_key.digest(jax.jit(g).trace(x, x))
    assert trace_key.digest(jax.jit(f).trace(x, x)) == trace_key.digest(jax.jit(f).trace(x, x))
