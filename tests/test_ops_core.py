"""The spine's op table: elementwise, shape, dot_general and reduce, each compared with jax.jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from harness import Case, rand, run_case

F32 = np.float32
x34, y34 = rand((3, 4)), rand((3, 4), seed=1)
pos34 = rand((3, 4), low=0.1, high=4, seed=2)
i34, j34 = rand((3, 4), np.int32), rand((3, 4), np.int32, seed=1)

CASES = [
    # elementwise arithmetic
    *[Case(f"{name}_f32", fn, (x34, y34)) for name, fn in {
        "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide, "max": jnp.maximum,
        "min": jnp.minimum, "rem": lax.rem, "atan2_like": lambda a, b: a * b + a / (b * b + 1)}.items()],
    Case("pow_f32", lambda a, b: a ** b, (pos34, y34), tol=(1e-5, 1e-6)),
    *[Case(f"{name}_f32", fn, (x34,), tol=(2e-6, 1e-6)) for name, fn in {
        "neg": jnp.negative, "abs": jnp.abs, "sign": jnp.sign, "exp": jnp.exp, "tanh": jnp.tanh,
        "sin": jnp.sin, "cos": jnp.cos, "floor": jnp.floor, "ceil": jnp.ceil, "round": jnp.round,
        "round_afz": lambda a: lax.round(a * 2.5, lax.RoundingMethod.AWAY_FROM_ZERO),
        "logistic": jax.nn.sigmoid, "expm1": jnp.expm1, "log1p": lambda a: jnp.log1p(a * 0.3),
        "is_finite": lambda a: jnp.isfinite(a / (a - a[0, 0])), "square": jnp.square}.items()],
    *[Case(f"{name}_f32", fn, (pos34,), tol=(2e-6, 1e-6)) for name, fn in {
        "log": jnp.log, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "cbrt": jnp.cbrt}.items()],
    Case("expm1_tiny", jnp.expm1, (np.array([1e-8, -1e-7, 1e-3, 30.0, -30.0], F32),)),
    Case("log1p_tiny", jnp.log1p, (np.array([1e-8, -1e-7, 1e-3, 30.0, -0.5], F32),)),
    Case("round_ties", lambda a: lax.round(a, lax.RoundingMethod.AWAY_FROM_ZERO),
         (np.array([0.5, 1.5, -0.5, -2.5, 0.49999997, 2.4], F32),)),
    Case("round_even_ties", jnp.round, (np.array([0.5, 1.5, -0.5, -2.5, 2.4], F32),)),
    # integers, with XLA's division semantics
    *[Case(f"{name}_i32", fn, (i34, j34)) for name, fn in {
        "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum,
        "div": lax.div, "rem": lax.rem, "floordiv": jnp.floor_divide, "mod": jnp.mod,
        "and": jnp.bitwise_and, "or": jnp.bitwise_or, "xor": jnp.bitwise_xor}.items()],
    Case("div_by_zero_i32", lax.div, (np.array([7, -7, 0, -2**31], np.int32), np.array([0, 0, 0, -1], np.int32))),
    Case("rem_by_zero_i32", lax.rem, (np.array([7, -7, 0, -2**31], np.int32), np.array([0, 0, 0, -1], np.int32))),
    Case("div_by_zero_u32", lax.div, (np.array([7, 0, 9], np.uint32), np.array([0, 0, 2], np.uint32))),
    Case("rem_by_zero_u8", lax.rem, (np.array([7, 0, 9], np.uint8), np.array([0, 0, 2], np.uint8))),
    Case("add_wrap_i8", jnp.add, (np.array([120, -128, 5], np.int8), np.array([10, -1, 3], np.int8))),
    Case("mul_wrap_u8", jnp.multiply, (np.array([200, 16, 5], np.uint8), np.array([2, 16, 3], np.uint8))),
    Case("neg_u8", lambda a: -a, (np.array([0, 1, 200], np.uint8),)),
    Case("abs_i16", jnp.abs, (np.array([-3, 0, 7], np.int16),)),
    Case("max_i16", jnp.maximum, (np.array([-3, 0, 7], np.int16), np.array([1, -1, 9], np.int16))),
    Case("not_i32", jnp.invert, (i34,)),
    Case("not_bool", jnp.logical_not, (x34 > 0,)),
    Case("and_bool", jnp.logical_and, (x34 > 0, y34 > 0)),
    Case("or_bool", jnp.logical_or, (x34 > 0, y34 > 0)),
    Case("xor_bool", jnp.logical_xor, (x34 > 0, y34 > 0)),
    # comparisons and select
    *[Case(f"cmp_{name}", fn, (x34, np.where(rand((3, 4), seed=5) > 0, x34, y34))) for name, fn in {
        "eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal, "gt": jnp.greater,
        "ge": jnp.greater_equal}.items()],
    Case("cmp_lt_u32", jnp.less, (np.array([0, 5, 2**31 + 3], np.uint32), np.array([1, 5, 2], np.uint32))),
    Case("select", lambda p, a, b: jnp.where(p, a, b), (x34 > 0, x34, y34)),
    Case("select_scalar_pred", lambda a, b: lax.select(a[0, 0] > 0, a, b), (x34, y34)),
    Case("select_i16", lambda p, a, b: jnp.where(p, a, b), (x34 > 0, rand((3, 4), np.int16), rand((3, 4), np.int16, 1))),
    Case("clamp", lambda a: jnp.clip(a, -1.0, 1.5), (x34,)),
    Case("clamp_array_bounds", lambda lo, a, hi: lax.clamp(lo, a, hi), (np.float32(-1), x34, np.float32(2))),
    # converts
    Case("f32_to_i32", lambda a: (a * 3).astype(jnp.int32), (x34,)),
    Case("f32_to_i32_saturate", lambda a: a.astype(jnp.int32),
         (np.array([np.nan, np.inf, -np.inf, 3e10, -3e10, 2.5, -2.5, 2147483520.0], F32),)),
    Case("f32_to_u8_saturate", lambda a: a.astype(jnp.uint8), (np.array([np.nan, 300, -5, 255, 3.7], F32),)),
    Case("f32_to_bool", lambda a: a.astype(bool), (np.array([0.0, -0.0, 2.0, np.nan], F32),)),
    Case("i32_to_f32", lambda a: a.astype(jnp.float32), (i34,)),
    Case("bool_to_f32", lambda a: (a > 0).astype(jnp.float32), (x34,)),
    Case("f32_to_f16", lambda a: a.astype(jnp.float16), (x34,)),
    Case("f16_add", jnp.add, (x34.astype(np.float16), y34.astype(np.float16))),
    Case("f16_exp", jnp.exp, (x34.astype(np.float16),)),
    # shapes
    Case("broadcast_row", lambda a, r: a + r, (x34, rand((4,)))),
    Case("broadcast_col", lambda a, c: a + c[:, None], (x34, rand((3,)))),
    Case("broadcast_transposed", lambda a: lax.broadcast_in_dim(a, (4, 2, 3), (2, 0)), (x34,)),
    Case("broadcast_scalar", lambda a: jnp.broadcast_to(a, (2, 3)), (np.float32(2.5),)),
    Case("reshape", lambda a: a.reshape(2, 6).T.reshape(-1), (x34,)),
    Case("transpose3", lambda a: jnp.transpose(a, (2, 0, 1)), (rand((2, 3, 4)),)),
    Case("slice", lambda a: a[1:, ::2], (x34,)),
    Case("slice_strided", lambda a: a[::2, 1:4:2, :], (rand((5, 6, 2)),)),
    Case("concat", lambda a, b: jnp.concatenate([a, b, a], axis=1), (x34, y34)),
    Case("pad_edges", lambda a: jnp.pad(a, ((1, 2), (0, 3))), (x34,)),
    Case("pad_negative", lambda a: lax.pad(a, 7.0, ((-1, 2, 0), (1, -2, 0))), (x34,)),
    Case("pad_interior", lambda a: lax.pad(a, -1.0, ((1, 0, 2), (0, 1, 1))), (x34,)),
    Case("pad_mixed_i32", lambda a: lax.pad(a, np.int32(9), ((-1, 1, 1), (2, -3, 2))), (i34,)),
    Case("reverse", lambda a: a[::-1, ::-1], (x34,)),
    Case("reverse_one", lambda a: jnp.flip(a, 1), (rand((2, 3, 4)),)),
    Case("iota_i32", lambda a: a + lax.broadcasted_iota(jnp.int32, (3, 4), 1), (i34,)),
    Case("iota_f32", lambda a: a * jnp.arange(4, dtype=jnp.float32), (x34,)),
    Case("iota_f16", lambda: jnp.arange(7, dtype=jnp.float16), ()),
    Case("iota_u8", lambda: lax.broadcasted_iota(jnp.uint8, (2, 5), 0), ()),
    Case("constant_dense", lambda a: a + jnp.array([[1.0, 2.0, 3.0, 4.0]]), (x34,)),
    Case("constant_splat", lambda a: a * jnp.full((3, 4), 0.5), (x34,)),
    Case("constant_u8_splat", lambda: jnp.full((2, 2), 255, jnp.uint8), ()),
    Case("constant_bool", lambda a: jnp.where(jnp.array([True, False, True, False]), a, 0.0), (x34,)),
    Case("passthrough", lambda a, b: (a, b, a), (x34, y34)),
    Case("constant_only", lambda: (jnp.ones(3), jnp.arange(4)), ()),
    # dot_general
    Case("matmul", jnp.matmul, (rand((3, 5)), rand((5, 4))), tol=(1e-5, 1e-5)),
    Case("matvec", jnp.matmul, (rand((3, 5)), rand((5,))), tol=(1e-5, 1e-5)),
    Case("vecdot", jnp.dot, (rand((5,)), rand((5,), seed=1)), tol=(1e-5, 1e-5)),
    Case("matmul_transposed_rhs", lambda a, b: a @ b.T, (rand((3, 5)), rand((4, 5))), tol=(1e-5, 1e-5)),
    Case("matmul_transposed_lhs", lambda a, b: a.T @ b, (rand((5, 3)), rand((5, 4))), tol=(1e-5, 1e-5)),
    Case("batched", jnp.matmul, (rand((2, 3, 5)), rand((2, 5, 4))), tol=(1e-5, 1e-5)),
    Case("einsum_batch_middle", lambda a, b: jnp.einsum("ibk,kbj->bij", a, b), (rand((3, 2, 5)), rand((5, 2, 4))),
         tol=(1e-5, 1e-5)),
    Case("einsum_multi_contract", lambda a, b: jnp.einsum("abcd,cdbe->abe", a, b),
         (rand((2, 3, 4, 5)), rand((4, 5, 3, 6))), tol=(1e-5, 1e-5)),
    Case("outer", jnp.outer, (rand((3,)), rand((4,))), tol=(1e-5, 1e-5)),
    Case("matmul_i32", jnp.matmul, (i34, j34.T)),
    Case("matmul_i8_to_i32", lambda a, b: lax.dot(a, b, preferred_element_type=jnp.int32),
         (rand((3, 4), np.int8), rand((4, 2), np.int8))),
    Case("matmul_f16", jnp.matmul, (rand((3, 5), np.float16), rand((5, 4), np.float16)), tol=(1e-2, 1e-2)),
    Case("grad_of_matmul", jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w))), (rand((5, 4)), rand((3, 5))),
         tol=(1e-5, 1e-5)),
    # reductions
    *[Case(f"reduce_{name}", fn, (x34,), tol=(1e-5, 1e-6)) for name, fn in {
        "sum": lambda a: a.sum(), "sum_axis": lambda a: a.sum(axis=0), "prod": lambda a: a.prod(axis=1),
        "max": lambda a: a.max(axis=1), "min": lambda a: a.min(axis=(0, 1)), "mean": lambda a: a.mean(0),
        "argmax": lambda a: jnp.argmax(a, axis=1), "argmin": lambda a: jnp.argmin(a, axis=0),
        "logsumexp": lambda a: jax.nn.logsumexp(a, axis=1)}.items()],
    Case("reduce_sum_i32", lambda a: a.sum(axis=1), (i34,)),
    Case("reduce_max_u8", lambda a: a.max(axis=1), (rand((3, 4), np.uint8),)),
    Case("reduce_all", lambda a: jnp.all(a > -2, axis=1), (x34,)),
    Case("reduce_any", lambda a: jnp.any(a > 2, axis=0), (x34,)),
    # any/all over a stack of rows: bool Or/And take two inputs, unlike the variadic Max/Min of number stacks
    Case("reduce_any_stack", lambda a: jnp.any(jnp.stack([a[0] > 0, a[1] > 0, a[2] > 0]), axis=0), (x34,)),
    Case("reduce_all_stack", lambda a: jnp.all(jnp.stack([a[0] > 0, a[1] > 0, a[2] > 0]), axis=0), (x34,)),
    Case("reduce_init", lambda a: lax.reduce(a, np.float32(10.0), lax.add, (1,)), (x34,)),
    # variadic reduce of independent reductions (a tuple of max and min, as lax.reduce writes it)
    Case("reduce_variadic_max_min_f32", lambda a, i: lax.reduce((a, i), (np.float32(3), np.int32(0)),
         lambda x, y: (lax.max(x[0], y[0]), lax.min(x[1], y[1])), (0,)), (rand((4, 6)), rand((4, 6), np.int32))),
    Case("reduce_variadic_add_mul_i32", lambda a, i: lax.reduce((a, i), (np.int32(1), np.int32(2)),
         lambda x, y: (lax.add(x[0], y[0]), lax.mul(y[1], x[1])), (0, 1)),
         (rand((3, 5), np.int32), rand((3, 5), np.int32))),
    Case("reduce_variadic_bool_u8", lambda a, i: lax.reduce((a, i), (np.bool_(True), np.uint8(0)),
         lambda x, y: (lax.max(x[0], y[0]), lax.max(x[1], y[1])), (1,)), (rand((4, 6), np.bool_), rand((4, 6), np.uint8))),
    Case("reduce_variadic_f64_i64", lambda a, i: lax.reduce((a, i), (np.float64(-1), np.int64(0)),
         lambda x, y: (lax.min(x[0], y[0]), lax.add(x[1], y[1])), (0,)), (rand((4, 6), np.float64), rand((4, 6), np.int64)),
         x64=True),
    Case("reduce_variadic_three_f32_x64", lambda a, b, c: lax.reduce((a, b, c), (np.float32(0), np.float32(1), np.float32(-np.inf)),
         lambda x, y: (lax.add(x[0], y[0]), lax.mul(x[1], y[1]), lax.max(x[2], y[2])), (1,)),
         (rand((3, 4)), rand((3, 4)), rand((3, 4))), x64=True),
    Case("argmax_ties_nan", lambda a: (jnp.argmax(a, axis=1), jnp.argmin(a, axis=1)),
         (np.array([[1, 3, 3, 0], [np.nan, 2, np.nan, 5], [4, 4, 4, 4]], F32),)),
    Case("reduce_max_nan", lambda a: (a.max(axis=1), a.min(axis=0), a.max()),
         (np.array([[1, np.nan, 3], [np.nan, 1, 2], [4, 5, 6]], F32),)),
    Case("bf16_in_out", lambda a, b: (a * b + 1, a.astype(jnp.float32)),
         (rand((3, 4)).astype(jnp.bfloat16), rand((3, 4), seed=1).astype(jnp.bfloat16))),
    Case("argmax_i32", lambda a: jnp.argmax(a, axis=0), (np.array([[1, 5], [5, 2], [3, 5]], np.int32),)),
    # pytrees, static args, python scalars
    Case("dict_in_out", lambda d: {"s": d["a"] + d["b"], "p": (d["a"] * 2,)}, ({"a": x34, "b": y34},)),
    Case("python_scalar", lambda a, s: a * s, (x34, 3.0)),
    Case("static_arg", lambda a, n: a * n, (x34, 4), static_argnums=(1,)),
    Case("weak_out", lambda a: (a.sum() * 0 + 2.0, 3.0 * 1), (x34,)),
    Case("f64_x64", lambda a, b: (a @ b, jnp.exp(a).sum(0)), (rand((3, 4), np.float64), rand((4, 2), np.float64)),
         x64=True),
    Case("i64_x64", lambda a: (a * 3 + 1).sum(0), (rand((3, 4), np.int64),), x64=True),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_op(case: Case) -> None:
    run_case(case)
