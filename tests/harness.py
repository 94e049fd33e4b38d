"""JAX-harness-style op testing: a case is a row; one check compares mnjit with jax.jit.

Expected values always come from jax.jit on the same inputs, never from our code.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import ml_dtypes
import numpy as np
import onnx

from mnjit import mnjit

# (rtol, atol) per dtype: ORT and XLA may order float arithmetic differently.
TOLERANCE = {
    np.dtype(np.float16): (2e-3, 2e-3),
    np.dtype(ml_dtypes.bfloat16): (1.6e-2, 1.6e-2),
    np.dtype(np.float32): (2e-6, 2e-6),
    np.dtype(np.float64): (1e-13, 1e-13),
    np.dtype(np.complex64): (2e-6, 2e-6),
    np.dtype(np.complex128): (1e-13, 1e-13),
}


@dataclass
class Case:
    name: str
    fun: Callable
    args: Sequence[Any]
    tol: tuple[float, float] | None = None  # overrides TOLERANCE
    x64: bool = False
    static_argnums: tuple[int, ...] = ()
    kwargs: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return self.name


def rand(shape, dtype=np.float32, seed: int = 0, low: float = -3, high: float = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, int(low) * 10), min(info.max, int(high) * 10) + 1, shape, dtype=dtype)
    if dtype.kind == "c":
        return (rng.uniform(low, high, shape) + 1j * rng.uniform(low, high, shape)).astype(dtype)
    return rng.uniform(low, high, shape).astype(dtype)


def assert_same(actual, expected, tol=None, what: str = "output") -> None:
    """Same tree, shapes, dtypes and weak types; values within the dtype's tolerance; NaNs in the same places."""
    a_leaves, a_tree = jax.tree_util.tree_flatten(actual)
    e_leaves, e_tree = jax.tree_util.tree_flatten(expected)
    assert a_tree == e_tree, f"{what}: tree {a_tree} != {e_tree}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        assert isinstance(a, jax.Array), f"{what}[{i}] is {type(a).__name__}, not a jax.Array"
        assert a.shape == e.shape, f"{what}[{i}]: shape {a.shape} != {e.shape}"
        assert a.dtype == e.dtype, f"{what}[{i}]: dtype {a.dtype} != {e.dtype}"
        assert a.weak_type == e.weak_type, f"{what}[{i}]: weak_type {a.weak_type} != {e.weak_type}"
        a_np, e_np = np.asarray(a), np.asarray(e)
        rtol, atol = tol or TOLERANCE.get(a_np.dtype, (0, 0))
        if a_np.dtype == ml_dtypes.bfloat16 or a_np.dtype.kind == "f" and a_np.dtype.itemsize < 4:
            a_np, e_np = a_np.astype(np.float32), e_np.astype(np.float32)
        np.testing.assert_allclose(a_np, e_np, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{what}[{i}]")


def check_concurrent_calls(target: str, size: int, threads: int, repeats: int, warm: bool) -> None:
    """`threads` threads call one mnjit signature `repeats` times each on their own input: each keeps its own
    answer (the runtimes share sessions, requests or VM contexts between calls). Without `warm`, the threads
    also race to compile the signature."""
    import threading

    fun = lambda a: jax.numpy.tanh(a @ a.T).sum(axis=1)  # noqa: E731
    f = mnjit(fun, target=target)
    inputs = [rand((size, size), seed=s) for s in range(threads)]
    expected = [jax.jit(fun)(x) for x in inputs]
    if warm:
        f(inputs[0])
    results: dict[int, object] = {}

    def work(i: int) -> None:
        for _ in range(repeats):
            results[i] = f(inputs[i])

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    for i, e in enumerate(expected):
        assert_same(results[i], e, (1e-5, 1e-5))


def check_model(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, strict_mode=True, check_type=True)
    assert_single_assignment(model.graph)


def assert_single_assignment(graph: onnx.GraphProto, outer: frozenset[str] = frozenset()) -> None:
    """Every value name is defined once in the whole model, Loop/If/Scan bodies included: a body may not define
    a name its outer scopes define (ORT refuses that as INVALID_GRAPH; onnx.checker lets it pass)."""
    defined = set(outer)
    for name in [v.name for v in graph.input] + [t.name for t in graph.initializer]:
        assert name not in defined, f"{graph.name}: {name!r} is defined twice"
        defined.add(name)
    for node in graph.node:
        for attr in node.attribute:
            for body in [attr.g] * attr.HasField("g") + list(attr.graphs):
                assert_single_assignment(body, frozenset(defined))
        for name in node.output:
            if name:
                assert name not in defined, f"{graph.name}: {name!r} is defined twice (node {node.name})"
                defined.add(name)


def run_case(case: Case, target: str = "ort-cpu") -> None:
    scope = jax.enable_x64(True) if case.x64 else contextlib.nullcontext()
    with scope:
        args = [np.asarray(a) if isinstance(a, (list, tuple)) else a for a in case.args]
        expected = jax.jit(case.fun, static_argnums=case.static_argnums)(*args, **case.kwargs)
        compiled = mnjit(case.fun, static_argnums=case.static_argnums, target=target)
        actual = compiled(*args, **case.kwargs)
        assert_same(actual, expected, case.tol, case.name)
        check_model(compiled.lower(*args, **case.kwargs).onnx_model)


def both(fun, args, x64: bool):
    """(mnjit's, jax.jit's) results as numpy trees, after checking shapes and dtypes agree; and the ONNX model."""
    with jax.enable_x64(True) if x64 else contextlib.nullcontext():
        expected = jax.jit(fun)(*args)
        compiled = mnjit(fun)
        actual = compiled(*args)
        check_model(compiled.lower(*args).onnx_model)
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        assert (a.shape, a.dtype) == (e.shape, e.dtype)
    return [np.asarray(x) for x in actual], [np.asarray(x) for x in expected]
