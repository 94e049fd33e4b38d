"""Integer arithmetic wraps two's-complement as in XLA: reductions, scans, scatters, dots, convs, elementwise.

Each op runs on every integer dtype with inputs drawn from the dtype's whole
range (so sums and products overflow) and compared exactly with jax.jit.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest
from jax import export, lax
from onnx import helper

import hlo2onnx
from harness import Case, run_case
from hlo2onnx.targets import ORT_CPU
from hlo2onnx.types import onnx_dtype

NARROW = ("int8", "int16", "int32", "uint8", "uint16", "uint32")
WIDE = ("int64", "uint64")  # run under x64


def full_range(shape, dtype, seed=0, odd=False) -> np.ndarray:
    """Values over the dtype's whole range, extremes included; `odd` keeps products from collapsing to 0."""
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    x = np.random.default_rng(seed).integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    flat = x.reshape(-1)
    flat[:4] = [info.max, info.min, info.max, info.max - 1][:flat.size]
    return x | dtype.type(1) if odd else x


def _same(f):
    """`f` with its result in the input's dtype: jnp.sum/prod/cumsum promote narrow ints to the default int."""
    return lambda a: f(a, dtype=a.dtype)


# name -> (function of one array, input shape, odd inputs)
UNARY = {
    "sum_all": (_same(jnp.sum), (5, 6), False),
    "sum_axis0": (lambda a: jnp.sum(a, axis=0, dtype=a.dtype), (7, 3), False),
    "sum_axes02": (lambda a: jnp.sum(a, axis=(0, 2), dtype=a.dtype), (3, 4, 5), False),
    "sum_promoted": (jnp.sum, (4, 5), False),
    "prod_all": (_same(jnp.prod), (6,), True),
    "prod_axis1": (lambda a: jnp.prod(a, axis=1, dtype=a.dtype), (3, 11), True),
    "prod_axes01": (lambda a: jnp.prod(a, axis=(0, 1), dtype=a.dtype), (3, 3, 2), True),
    "prod_promoted": (jnp.prod, (3, 5), True),
    "reduce_init": (lambda a: lax.reduce(a, a.dtype.type(np.iinfo(a.dtype).max), lax.add, (1,)), (3, 4), False),
    "window_sum": (lambda a: lax.reduce_window(a, a.dtype.type(0), lax.add, (3,), (1,), "VALID"), (9,), False),
    "window_sum_long": (lambda a: lax.reduce_window(a, a.dtype.type(0), lax.add, (11,), (2,), "SAME"), (20,), False),
    "window_prod": (lambda a: lax.reduce_window(a, a.dtype.type(1), lax.mul, (2, 3), (1, 1), "VALID"), (4, 5), True),
    "cumsum": (lambda a: jnp.cumsum(a, axis=1, dtype=a.dtype), (3, 7), False),
    "cumsum_promoted": (jnp.cumsum, (9,), False),
    "lax_cumsum_rev": (lambda a: lax.cumsum(a, axis=0, reverse=True), (6, 2), False),
    "cumprod": (lambda a: jnp.cumprod(a, dtype=a.dtype), (12,), True),
    "lax_cumprod": (lambda a: lax.cumprod(a, axis=1), (2, 10), True),
    "scan_add": (lambda a: lax.associative_scan(jnp.add, a), (10,), False),
    "scan_mul": (lambda a: lax.associative_scan(jnp.multiply, a, axis=1), (2, 9), True),
    "scatter_add": (lambda a: a.at[jnp.array([0, 2, 0, 1, 0])].add(a[:5]), (8,), False),
    "scatter_mul": (lambda a: a.at[jnp.array([1, 1, 3, 1])].multiply(a[2:6]), (8,), True),
    "scatter_add_2d": (lambda a: a.at[jnp.array([0, 0, 2]), 1:].add(a[1:, :-1]), (4, 5), False),
    "segment_sum": (lambda a: jax.ops.segment_sum(a, jnp.array([0, 0, 1, 1, 1, 2, 0, 2]), 3), (8,), False),
    "neg": (lambda a: -a, (9,), False),
    "abs": (jnp.abs, (9,), False),
    "square": (lambda a: a * a, (9,), False),
    "double": (lambda a: a + a, (9,), False),
    "sub_flip": (lambda a: a - a[::-1], (9,), False),
}
BINARY = {
    "dot": (jnp.dot, (7,), (7,)),
    "matmul": (jnp.matmul, (3, 5), (5, 4)),
    "batched_matmul": (jnp.matmul, (2, 3, 4), (2, 4, 2)),
    "einsum": (lambda a, b: jnp.einsum("ijk,kj->i", a, b), (3, 4, 5), (5, 4)),
    "conv": (lambda a, w: lax.conv_general_dilated(a, w, (1,), "SAME"), (1, 2, 6), (3, 2, 3)),
    "conv_2d": (lambda a, w: lax.conv(a, w, (1, 1), "VALID"), (1, 1, 4, 4), (2, 1, 2, 2)),
}


U64_HIGH = np.array([[2**63, 1, 2**64 - 1, 5], [0, 2**63 - 1, 2**63 + 1, 9]], np.uint64)


def _cases(dtypes, x64):
    cases = []
    for dtype in dtypes:
        for name, (fun, shape, odd) in UNARY.items():
            cases.append(Case(f"{name}_{dtype}", fun, (full_range(shape, dtype, 1, odd),), x64=x64))
        for name, (fun, lhs, rhs) in BINARY.items():
            cases.append(Case(f"{name}_{dtype}", fun, (full_range(lhs, dtype, 2), full_range(rhs, dtype, 3)),
                              x64=x64))
    return cases


CASES = [
    *_cases(NARROW, False),
    *_cases(WIDE, True),
    # The held-out reports: int16 products promoted to int32, min-int arithmetic, sums just over the edge.
    Case("prod_i16_to_i32", jnp.prod, (np.array([32767, 32767, 3, -5], np.int16),)),
    Case("sum_i32_edge", jnp.sum, (np.array([2**31 - 1, 1], np.int32),)),
    Case("sum_i32_below", jnp.sum, (np.array([-2**31, -1], np.int32),)),
    Case("sum_i32_axis0_zero", lambda a: a.sum(axis=0), (np.array([[2**31 - 1], [2**31 - 1], [2]], np.int32),)),
    Case("prod_u32_wrap", jnp.prod, (np.array([2**31 + 1, 3], np.uint32),)),
    Case("min_int_i32", lambda a: (-a, jnp.abs(a), a - 1, a * -1, a + a),
         (np.array([-2**31, 2**31 - 1], np.int32),)),
    Case("min_int_i8", lambda a: (-a, jnp.abs(a), a - 1, a * -1), (np.array([-128, 127], np.int8),)),
    Case("min_int_i64", lambda a: (-a, jnp.abs(a), a - 1, a * -1), (np.array([-2**63, 2**63 - 1], np.int64),),
         x64=True),
    # 64-bit sums past 2^53, where a trip through float64 loses the low bits.
    Case("sum_i64_past_2p53", jnp.sum, (np.array([2**53 + 1, 2, 2**60 + 3], np.int64),), x64=True),
    Case("dot_i64_past_2p53", jnp.dot, (np.array([2**53 + 1, 3], np.int64), np.array([3, 2**52 + 1], np.int64)),
         x64=True),
    # uint64 runs its order-dependent reductions in int64, whose order differs from 2**63 on.
    *[Case(f"u64_order_{name}", fun, (U64_HIGH,), x64=True) for name, fun in {
        "max_min": lambda a: (a.max(), a.min(), a.max(axis=1), a.min(axis=0)),
        "argmax_argmin": lambda a: (a.argmax(axis=1), a.argmin(axis=0)),
        "window_max": lambda a: lax.reduce_window(a, np.uint64(0), lax.max, (1, 2), (1, 1), "VALID"),
        "window_min": lambda a: lax.reduce_window(a, np.uint64(2**64 - 1), lax.min, (2, 1), (1, 1), "VALID"),
        "sort_top_k": lambda a: (jnp.sort(a, axis=1), lax.top_k(a, 2)),
        "segment_max": lambda a: jax.ops.segment_max(a.ravel(), jnp.array([0, 1, 0, 1, 2, 2, 0, 1]), 3),
    }.items()],
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_int_wrap(case: Case) -> None:
    run_case(case)


# Float to integer converts saturating (NaN to 0), as XLA's: the bounds are clamped in the float type, where
# int32's max is 2**31 in float32 and int16's is 32768 in float16 (past the bound), and int32's is inf.
SATURATE = np.array([np.nan, np.inf, -np.inf, 1e20, -1e20, 3.9, -3.9, 2.0**31, -2.0**31, 2.0**32, 2.0**63,
                     -2.0**63, 2.0**64, 32768, -32769, 65535, 65536, 255.5, -0.5], np.float64)
CONVERT_SOURCES = ("float16", "bfloat16", "float32")


@pytest.mark.parametrize("target", NARROW + WIDE)
@pytest.mark.parametrize("source", CONVERT_SOURCES + ("float64",))
def test_float_to_int_saturates(source, target):
    x64 = source == "float64" or target in WIDE
    with np.errstate(over="ignore", invalid="ignore"):
        x = SATURATE.astype(jnp.dtype(source))
    run_case(Case(f"{source}_to_{target}", lambda a: a.astype(target), (x,), x64=x64))


def _ort(op: str, inputs: list[np.ndarray], **attrs) -> np.ndarray:
    """One ORT CPU node on `inputs`; the output has the first input's dtype."""
    elem = int(onnx_dtype(inputs[0].dtype))
    infos = [helper.make_tensor_value_info(f"x{i}", int(onnx_dtype(a.dtype)), a.shape) for i, a in enumerate(inputs)]
    graph = helper.make_graph([helper.make_node(op, [i.name for i in infos], ["y"], **attrs)], "g", infos,
                              [helper.make_tensor_value_info("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {f"x{i}": a for i, a in enumerate(inputs)})[0]


def test_ort_integer_reductions_saturate():
    """Why targets.py lists ORT's integer ReduceSum/ReduceProd as wrong. If this fails, ORT wraps now and the
    entries (and ops/core/reduce.py's halving tree) can go."""
    axes = np.array([0], np.int64)
    assert _ort("ReduceSum", [np.array([2**31 - 1, 1], np.int32), axes], keepdims=0) == 2**31 - 1
    assert _ort("ReduceSum", [np.array([2**53 + 1, 2], np.int64), axes], keepdims=0) == 2**53 + 2  # via float64
    assert _ort("ReduceProd", [np.array([65536, 65536], np.int32), axes], keepdims=0) == 2**31 - 1
    with pytest.raises(NotImplementedError, match="does not match XLA"):
        ORT_CPU.compute_dtype("ReduceSum", np.dtype(np.int8))  # int8 would widen to the wrong int32 kernel


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint32", "uint64"])
def test_ort_integer_kernels_the_rules_use_wrap(dtype):
    """The exact forms rely on ORT's Add, Mul, MatMul (dots, integer convs) and CumSum wrapping."""
    dtype = np.dtype(dtype)
    x = full_range((6,), dtype, 4, odd=True)
    with np.errstate(over="ignore"):
        assert np.array_equal(_ort("Add", [x, x[::-1].copy()]), x + x[::-1])
        assert np.array_equal(_ort("Mul", [x, x[::-1].copy()]), x * x[::-1])
        assert np.array_equal(_ort("MatMul", [x.reshape(2, 3), x.reshape(3, 2)]), x.reshape(2, 3) @ x.reshape(3, 2))
        if dtype.kind == "i":  # unsigned CumSum runs in int64, the same bits
            assert np.array_equal(_ort("CumSum", [x, np.array(0, np.int64)]), np.cumsum(x, dtype=dtype))


def _run_dynamic(fun, spec: str, x: np.ndarray):
    exported = export.export(jax.jit(fun))(jax.ShapeDtypeStruct(export.symbolic_shape(spec), x.dtype))
    proto = hlo2onnx.convert(exported, dynamic=True).to_proto()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("axis", [0, 1, None])
def test_sum_over_symbolic_dims_wraps(axis):
    """Dynamic reduced axes sum by MatMul with ones, static ones by the halving tree."""
    x = full_range((5, 7), np.int32, 5)
    fun = lambda a: jnp.sum(a, axis=axis)  # noqa: E731
    for spec in ("b, 7", "b, c"):
        np.testing.assert_array_equal(_run_dynamic(fun, spec, x), jax.jit(fun)(x), err_msg=spec)


def test_product_over_a_symbolic_dim_is_refused():
    with pytest.raises(hlo2onnx.UnsupportedOpError, match="integer product over a dynamic axis"):
        _run_dynamic(lambda a: jnp.prod(a, axis=0), "b, 7", full_range((5, 7), np.int32))
