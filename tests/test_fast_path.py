"""The fast path: jax.jit's dispatch running ORT as a custom call (mnjit/ffi.py), against jax.jit.

Which path a signature took is read off the cache entry (white-box on purpose: the two paths must
give the same results, so only the entry tells them apart).
"""
from __future__ import annotations

import gc
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from harness import assert_same, rand
from mnjit import ffi, mnjit, runtime

pytestmark = pytest.mark.skipif(ffi.status() != "ready", reason=f"fast path off: {ffi.status()}")


def _fast_entries(fun) -> list[bool]:
    return [entry.fast is not None for entry in fun._cache.values()]


CASES = [
    ("f32", lambda x: x * 2 + 1, (rand((3, 4)),)),
    ("bf16", lambda x: x * 2, (rand((5,)).astype(ml_dtypes.bfloat16),)),
    ("f16", lambda x: x + x, (rand((5,)).astype(np.float16),)),
    ("bool_out", lambda x: x > 0, (rand((6,)),)),
    ("bool_in", lambda b, x: jnp.where(b, x, -x), (rand((4,)) > 0, rand((4,)))),
    ("complex", lambda z: z * (1 + 2j), (rand((3,)) + 1j * rand((3,), seed=1),)),
    ("int8_wrap", lambda x: x * np.int8(100), (np.arange(-4, 4, dtype=np.int8),)),
    ("uint32", lambda x: x ^ np.uint32(0xFFFF0000), (np.arange(5, dtype=np.uint32),)),
    ("scalar_weak", lambda x: x * 2, (3.0,)),
    ("zero_size", lambda x: x + 1, (np.zeros((0, 3), np.float32),)),
    ("pytree", lambda d: {"s": d["a"] + d["b"], "p": (d["a"] * d["b"],)},
     ({"a": rand((2,)), "b": rand((2,), seed=2)},)),
    ("many_outputs", lambda x: tuple(x + i for i in range(20)), (rand((2,)),)),
]


@pytest.mark.parametrize("name,fun,args", CASES, ids=[c[0] for c in CASES])
def test_fast_path_matches_jit(name, fun, args):
    compiled = mnjit(fun)
    for _ in range(2):  # the first call traces, the second is jax.jit's cache hit
        assert_same(compiled(*args), jax.jit(fun)(*args))
    assert _fast_entries(compiled) == [True]


def test_x64_and_typed_keys():
    with jax.enable_x64(True):
        x = rand((4,), np.float64)
        assert_same(mnjit(lambda v: jnp.sin(v) * 2)(x), jax.jit(lambda v: jnp.sin(v) * 2)(x))
    key = jax.random.key(3)
    split = mnjit(lambda k: jax.random.split(k))
    out = split(key)
    assert jax.dtypes.issubdtype(out.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(out), jax.random.key_data(jax.random.split(key)))
    assert _fast_entries(split) == [True]


def test_transformations_and_outer_jit_still_work():
    fun = mnjit(lambda x: jnp.sum(jnp.tanh(x) ** 2))
    x = rand((5,))
    fun(x)
    ref = lambda x: jnp.sum(jnp.tanh(x) ** 2)  # noqa: E731
    assert_same(jax.grad(fun)(x), jax.grad(ref)(x))
    assert_same(jax.vmap(fun)(x[:, None]), jax.vmap(ref)(x[:, None]))
    assert_same(jax.jit(lambda v: fun(v) + 1)(x), jax.jit(lambda v: ref(v) + 1)(x))


def test_static_arguments_and_new_shapes():
    fun = mnjit(lambda x, n: x * n, static_argnums=1)
    for shape, n in [((2,), 3), ((2,), 4), ((3, 2), 3)]:
        x = rand(shape)
        assert_same(fun(x, n), jax.jit(lambda x, n: x * n, static_argnums=1)(x, n))
    assert fun.translations == 3 and fun.cache_size == 3


def test_while_loops_keep_the_interruptible_python_path():
    """A run whose length hangs on the data stays where Ctrl-C can end it; a fori_loop may take the fast path."""
    def grow(x):
        return lax.while_loop(lambda v: v.sum() < 100, lambda v: v * 2, x)

    fun = mnjit(grow)
    x = rand((3,), low=0.5, high=1)
    assert_same(fun(x), jax.jit(grow)(x))
    assert _fast_entries(fun) == [False]
    assert_same(fun(x), jax.jit(grow)(x))
    counted = mnjit(lambda x: lax.fori_loop(0, 3, lambda i, v: v * 2, x))
    assert_same(counted(x), jax.jit(lambda x: lax.fori_loop(0, 3, lambda i, v: v * 2, x))(x))
    assert _fast_entries(counted) == [True]


def test_concurrent_calls():
    fun = mnjit(lambda x: jnp.sort(x) * 3)
    inputs = [rand((64,), seed=i) for i in range(8)]
    expected = [jax.jit(lambda x: jnp.sort(x) * 3)(x) for x in inputs]
    fun(inputs[0])
    errors = []

    def work(i):
        try:
            for _ in range(50):
                assert_same(fun(inputs[i]), expected[i])
        except AssertionError as e:  # reported below: a thread's assert would vanish
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_sessions_released_with_their_function():
    """Functions dropped right after a call (results maybe still computing) never crash the process."""
    x = rand((256,))
    for i in range(30):
        y = mnjit(lambda v: v * 2 + i)(x)
        gc.collect()
        np.testing.assert_allclose(np.asarray(y), np.asarray(x) * 2 + i, rtol=1e-6)


def test_clear_cache_retraces():
    fun = mnjit(lambda x: x - 1)
    x = rand((2,))
    fun(x)
    fun.clear_cache()
    assert_same(fun(x), jnp.asarray(x) - 1)
    assert fun.translations == 2


@pytest.mark.parametrize("name,fun,args", CASES, ids=[c[0] for c in CASES])
def test_python_path_runs_the_same_session_kind(name, fun, args):
    """The Python path (here a capped cache) runs mnjit's own C session outside jax.jit, on fresh buffers."""
    compiled = mnjit(fun, max_cache_size=4)
    first = compiled(*args)
    assert_same(first, jax.jit(fun)(*args))
    (entry,) = compiled._cache.values()
    assert isinstance(entry.runner, ffi.FfiRunner)
    again = compiled(*args)
    leaves = jax.tree_util.tree_leaves(first)
    assert all(a.unsafe_buffer_pointer() != b.unsafe_buffer_pointer()
               for a, b in zip(leaves, jax.tree_util.tree_leaves(again)) if a.size)
    assert_same(first, jax.jit(fun)(*args))  # the second run wrote elsewhere


def test_pool_size_is_fixed_once_sessions_exist():
    mnjit(lambda x: x + 1)(jnp.ones(2))  # the shared pool exists from the first session on
    count = runtime.intra_op_threads()
    runtime.set_intra_op_threads(count)  # the same count is fine
    with pytest.raises(RuntimeError, match="already runs"):
        runtime.set_intra_op_threads(count + 1)
    with pytest.raises(ValueError, match="positive integer"):
        runtime.set_intra_op_threads(0)


def test_a_slow_signature_is_one_session(monkeypatch):
    """A signature the custom call cannot take runs the session its probe made: ORT builds it once."""
    made = []
    create = ffi.create
    monkeypatch.setattr(ffi, "create", lambda *a: made.append(1) or create(*a))
    fun = mnjit(lambda x: lax.while_loop(lambda v: v.sum() < 100, lambda v: v * 2, x))
    x = rand((3,), low=0.5, high=1)
    assert_same(fun(x), jax.jit(fun._fun)(x))
    assert _fast_entries(fun) == [False] and len(made) == 1


def test_a_fork_during_the_library_preload_leaves_the_child_a_free_lock():
    """mnjit(f) loads ORT's library on a daemon thread (ffi.preload); a process forked while that thread holds the
    library's lock must not inherit it held, or the child's first call would wait forever."""
    import os

    library = ffi._LIBRARY
    held, release = threading.Event(), threading.Event()

    def hold():
        with library._lock:  # as the preloading thread does while it loads
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: nothing of jax, only the lock
            os._exit(0 if library._lock.acquire(timeout=5) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0
