"""Translation from many threads at once: new functions, new shapes and the same new signature.

Every thread is released by a Barrier, and the interpreter switches threads every microsecond, so that
threads interleave inside the optimisation pass (shared rewrite-rule state failed 38 of 400 such calls).
Every result is compared with jax.jit.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import hlo2onnx
from harness import assert_same, rand
from mnjit import mnjit

THREADS = 16


@contextlib.contextmanager
def fast_switching():
    """Switches threads every microsecond: makes any interleaving of two translations likely."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def run_together(jobs: list[Callable[[], object]]) -> list:
    """Runs each job on its own thread, all released at once; returns results or the exceptions raised."""
    barrier = threading.Barrier(len(jobs))
    results: list = [None] * len(jobs)

    def work(i: int) -> None:
        barrier.wait()
        try:
            results[i] = jobs[i]()
        except Exception as e:  # noqa: BLE001 (collected: the test reports every failure)
            results[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    with fast_switching():
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


def _softmax(x):
    return jax.nn.softmax(x, axis=-1)


def _layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5)


def _gelu(x):
    return jax.nn.gelu(x, approximate=False)


def _mlp(x, w, b):
    return jax.nn.relu(x @ w + b).sum(0)


def _int_reduce(x):
    return jnp.sum(x * 3, axis=0), jnp.max(x)


def _loop(x):
    return jax.lax.fori_loop(0, 5, lambda i, c: c * 0.5 + jnp.tanh(c), x)


def _attention(q, k):
    return jax.nn.softmax(q @ k.T / 8.0, axis=-1) @ k


def _args(kind: str, n: int) -> tuple:
    """Arguments of a shape unique to `n`, so that every call is the first of its signature."""
    rows = 2 + n
    if kind == "mlp":
        return rand((rows, 8), seed=n), rand((8, 5), seed=n + 1), rand((5,), seed=n + 2)
    if kind == "attention":
        return rand((rows, 8), seed=n), rand((4, 8), seed=n + 1)
    if kind == "int_reduce":
        return (rand((rows, 3), np.int32, seed=n),)
    return (rand((rows, 6), seed=n),)


KINDS = {"softmax": _softmax, "layer_norm": _layer_norm, "gelu": _gelu, "mlp": _mlp, "int_reduce": _int_reduce,
         "loop": _loop, "attention": _attention}


@pytest.mark.parametrize("rounds", [6])
def test_simultaneous_first_calls_of_new_shapes(rounds):
    # One mnjit function per kind, shared by all threads: each call is a new signature of a shared cache.
    functions = {kind: mnjit(fn) for kind, fn in KINDS.items()}
    kinds = list(KINDS)
    failures = []
    for r in range(rounds):
        calls = [(kinds[(i + r) % len(kinds)], r * THREADS + i) for i in range(THREADS)]
        args = [_args(kind, n) for kind, n in calls]
        expected = [jax.jit(KINDS[kind])(*a) for (kind, _), a in zip(calls, args)]
        results = run_together([lambda f=functions[kind], a=a: f(*a) for (kind, _), a in zip(calls, args)])
        for (kind, n), got, want in zip(calls, results, expected):
            if isinstance(got, Exception):
                failures.append(f"{kind}#{n}: {type(got).__name__}: {got}")
                continue
            assert_same(got, want, tol=(1e-5, 1e-5), what=f"{kind}#{n}")
    assert not failures, f"{len(failures)} of {rounds * THREADS} first calls failed:\n" + "\n".join(failures[:5])
    assert sum(f.translations for f in functions.values()) == rounds * THREADS


def test_simultaneous_new_functions():
    # A fresh mnjit object per thread (the decorator applied inside a loop, as a sweep would).
    results = run_together([lambda kind=kind, n=n: mnjit(KINDS[kind])(*_args(kind, n))
                            for n, kind in enumerate(list(KINDS) * 2)])
    for n, (kind, got) in enumerate(zip(list(KINDS) * 2, results)):
        assert not isinstance(got, Exception), f"{kind}: {type(got).__name__}: {got}"
        assert_same(got, jax.jit(KINDS[kind])(*_args(kind, n)), tol=(1e-5, 1e-5), what=kind)


def _block(x, w):
    """Three rounds of layer norm, Gemm, erf GELU and softmax: many fusion matches in one translation."""
    for _ in range(3):
        x = jax.nn.softmax(_gelu(_layer_norm(x) @ w + 1.0), axis=-1)
    return x


def _check_model(model, want: list, args: tuple, what: str) -> None:
    """`model` run by ONNX Runtime on `args` gives `want` (jax.jit's output leaves)."""
    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {v.name: np.asarray(a) for v, a in zip(model.graph.inputs, args)})
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-5, err_msg=what)


def test_simultaneous_translate_of_different_modules():
    # Translating such modules 16 at a time failed 15 of 64 times while the rewrite rules were shared.
    cases = [(_block, (rand((4 + n, 8), seed=n), rand((8, 8), seed=99))) for n in range(THREADS)]
    cases += [(KINDS[kind], _args(kind, n)) for n, kind in enumerate(KINDS)]
    modules = [jax.jit(fn).lower(*args).compiler_ir("stablehlo") for fn, args in cases]
    expected = [jax.tree_util.tree_leaves(jax.jit(fn)(*args)) for fn, args in cases]
    for r in range(2):
        models = run_together([lambda m=m: hlo2onnx.translate(m) for m in modules])
        for n, ((fn, args), want, model) in enumerate(zip(cases, expected, models)):
            what = f"round {r}, {fn.__name__}#{n}"
            assert not isinstance(model, Exception), f"{what}: {type(model).__name__}: {model}"
            _check_model(model, want, args, what)


def test_simultaneous_translate_of_one_module():
    # One module (and so one MLIR context) read by every thread: translate clones it, never changes it.
    args = (rand((6, 8)), rand((8, 8), seed=1))
    module = jax.jit(_block).lower(*args).compiler_ir("stablehlo")
    text = str(module)
    models = run_together([lambda: hlo2onnx.translate(module)] * 8)
    want = jax.tree_util.tree_leaves(jax.jit(_block)(*args))
    for model in models:
        assert not isinstance(model, Exception), f"{type(model).__name__}: {model}"
        _check_model(model, want, args, "same module")
    assert str(module) == text


def test_same_new_signature_translates_once():
    f = mnjit(_attention)
    args = _args("attention", 3)
    results = run_together([lambda: f(*args)] * THREADS)
    want = jax.jit(_attention)(*args)
    for got in results:
        assert not isinstance(got, Exception), f"{type(got).__name__}: {got}"
        assert_same(got, want, tol=(1e-5, 1e-5))
    assert f.translations == 1
    assert f.cache_size == 1


def test_capped_cache_under_threads():
    f = mnjit(_softmax, max_cache_size=3)
    # Four threads per signature, eight signatures: hits, misses and evictions interleave.
    ns = [n % 8 for n in range(32)]
    results = run_together([lambda n=n: f(*_args("softmax", n)) for n in ns])
    for n, got in zip(ns, results):
        assert not isinstance(got, Exception), f"{type(got).__name__}: {got}"
        assert_same(got, jax.jit(_softmax)(*_args("softmax", n)), tol=(1e-5, 1e-5))
    assert f.cache_size == 3
    assert 8 <= f.translations <= 32


@pytest.mark.parametrize("options", [{}, {"max_cache_size": 2}], ids=["fast", "capped"])
def test_calls_while_another_thread_clears_the_cache(options):
    # jax.jit's clear_cache fails no call in flight: a session released under a running executable is run anew.
    f, x = mnjit(lambda a: jnp.tanh(a) * 2 + 1, **options), rand((3,))
    want, stop, failures = jax.jit(lambda a: jnp.tanh(a) * 2 + 1)(x), threading.Event(), []

    def call():
        for _ in range(100):
            try:
                assert_same(f(x), want, tol=(1e-6, 1e-6))
            except Exception as e:  # noqa: BLE001 (collected: a thread's exception would be lost)
                failures.append(e)

    def clear():
        while not stop.is_set():
            f.clear_cache()
    callers, clearer = [threading.Thread(target=call) for _ in range(3)], threading.Thread(target=clear)
    clearer.start()
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    stop.set()
    clearer.join()
    assert not failures, f"{len(failures)} calls failed, first: {failures[0]!r}"


def test_failed_translation_is_not_shared_by_waiting_threads(monkeypatch):
    # The first translation fails; threads that waited for it translate again instead of failing with it.
    from hlo2onnx.patterns.base import Fusion

    available, failed = Fusion.available, []

    def fail_once(self, *a, **k):
        if not failed:
            failed.append(True)
            raise RuntimeError("first translation fails")
        return available(self, *a, **k)

    monkeypatch.setattr(Fusion, "available", fail_once)
    f = mnjit(_gelu)
    args = _args("gelu", 5)
    results = run_together([lambda: f(*args)] * 8)
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1 and "first translation fails" in str(errors[0])
    for got in results:
        if not isinstance(got, Exception):
            assert_same(got, jax.jit(_gelu)(*args), tol=(1e-5, 1e-5))
    assert f.translations == 1 and f.cache_size == 1
