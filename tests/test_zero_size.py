"""0-size arrays: shape ops, reductions to their identity, dots, elementwise ops, scans, sorts and gathers.

ONNX Runtime refuses some kernels on empty tensors (Reshape of a 0-size input among them);
every row is compared with jax.jit.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from harness import Case, rand, run_case
from mnjit import mnjit

F32, I32 = np.float32, np.int32
e0 = np.zeros((0,), F32)
e03 = np.zeros((0, 3), F32)
e30 = np.zeros((3, 0), F32)
e204 = np.zeros((2, 0, 4), F32)
i03 = np.zeros((0, 3), I32)
u0 = np.zeros((0,), np.uint8)
x34 = rand((3, 4))
i34 = rand((3, 4), I32)

CASES = [
    # reshape to, from and between 0-size shapes
    Case("reshape_0_to_0x5", lambda a: a.reshape(0, 5), (e0,)),
    Case("reshape_0x3_to_3x0", lambda a: a.reshape(3, 0), (e03,)),
    Case("reshape_2x0x4_to_0x8", lambda a: a.reshape(0, 8), (e204,)),
    Case("reshape_2x0x4_to_flat", lambda a: a.reshape(-1), (e204,)),
    Case("reshape_i32", lambda a: a.reshape(3, 0, 1), (i03,)),
    Case("reshape_after_math", lambda a: (a * 2 + 1).reshape(0, 1, 3), (e03,)),
    Case("squeeze_expand", lambda a: jnp.expand_dims(a, 1)[:, 0], (e03,)),
    Case("ravel", jnp.ravel, (e30,)),
    # broadcasts, concatenation, slicing, transposes, padding
    Case("broadcast_to", lambda a: jnp.broadcast_to(a, (2, 0, 3)), (e03,)),
    Case("broadcast_scalar_to_empty", lambda a: jnp.broadcast_to(a[0, 0], (0, 4)), (x34,)),
    Case("broadcast_row", lambda a: jnp.broadcast_to(a[:1], (0, 4)), (x34,)),
    Case("concat_with_empty", lambda a, e: jnp.concatenate([a, e[:, :4]], axis=0), (x34, np.zeros((0, 5), F32))),
    Case("concat_empty_first", lambda e, a: jnp.concatenate([e, a], axis=1), (e30, x34)),
    Case("concat_all_empty", lambda a, b: jnp.concatenate([a, b]), (e03, e03)),
    Case("slice_to_empty", lambda a: a[2:2], (x34,)),
    Case("slice_cols_to_empty", lambda a: a[:, 5:], (x34,)),
    Case("slice_strided_empty", lambda a: a[3:0:1, ::2], (x34,)),
    Case("slice_of_empty", lambda a: a[:, 1:], (e03,)),
    Case("transpose", lambda a: a.T, (e03,)),
    Case("transpose_3d", lambda a: jnp.transpose(a, (2, 0, 1)), (e204,)),
    Case("pad_empty", lambda a: jnp.pad(a, ((1, 1), (0, 0))), (e03,)),
    Case("reverse", lambda a: a[::-1], (e03,)),
    Case("tile", lambda a: jnp.tile(a, (2, 1)), (e03,)),
    Case("stack", lambda a: jnp.stack([a, a]), (e03,)),
    Case("split_empty_piece", lambda a: jnp.split(a, [0, 2], axis=1), (x34,)),
    Case("iota_empty", lambda a: a + jnp.arange(0, dtype=F32), (e0,)),
    Case("zeros_empty", lambda a: (jnp.zeros((0, 3)) + a, jnp.ones((2, 0), I32)), (e03,)),
    # reductions over an empty axis give the identity
    Case("sum_empty", lambda a: (a.sum(), a.sum(axis=0), a.sum(axis=1)), (e03,)),
    Case("prod_empty", lambda a: (a.prod(), a.prod(axis=0)), (e03,)),
    Case("max_min_empty", lambda a: (a.max(axis=0, initial=-jnp.inf), a.min(axis=0, initial=jnp.inf)), (e03,)),
    Case("lax_max_min_empty", lambda a: (lax.reduce_max(a, (0,)), lax.reduce_min(a, (0,))), (e03,)),
    Case("int_reductions_empty", lambda a: (a.sum(0), a.prod(0), lax.reduce_max(a, (0,)), lax.reduce_min(a, (0,))),
         (i03,)),
    Case("uint8_reductions_empty", lambda a: (a.sum(dtype=a.dtype), lax.reduce_max(a, (0,)), lax.reduce_min(a, (0,))),
         (u0,)),
    Case("any_all_empty", lambda a: (jnp.any(a > 0, axis=0), jnp.all(a > 0, axis=0)), (e03,)),
    Case("mean_empty_rows", lambda a: a.mean(axis=1), (e03,)),
    Case("reduce_keeps_empty", lambda a: a.sum(axis=0), (e30,)),
    Case("argmax_over_full_axis", lambda a: jnp.argmax(a, axis=1), (e03,)),
    # dots
    Case("dot_zero_contraction", lambda a, b: a @ b, (e30, np.zeros((0, 4), F32))),
    Case("dot_zero_contraction_i32", lambda a, b: a @ b, (np.zeros((3, 0), I32), np.zeros((0, 2), I32))),
    Case("dot_zero_rows", lambda a, b: a @ b, (e03, rand((3, 4)))),
    Case("dot_zero_batch", lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
         (np.zeros((0, 2, 3), F32), np.zeros((0, 3, 4), F32))),
    Case("vdot_empty", jnp.dot, (e0, e0)),
    # elementwise and select
    Case("elementwise", lambda a, b: (a + b, a * b, jnp.exp(a), -a, a > b, jnp.maximum(a, b)), (e03, e03)),
    Case("elementwise_broadcast", lambda a, b: a + b, (e03, rand((3,)))),
    Case("int_elementwise", lambda a: (a // 3, a % 3, a << 1, ~a, jnp.abs(a)), (i03,)),
    Case("where", lambda p, a, b: jnp.where(p, a, b), (e03 > 0, e03, e03)),
    Case("where_scalar", lambda a: jnp.where(a > 0, a, 0.0), (e03,)),
    Case("convert", lambda a: (a.astype(I32), a.astype(jnp.float16), a.astype(bool)), (e03,)),
    Case("clamp", lambda a: jnp.clip(a, -1, 1), (e03,)),
    # scans, sorts, gathers
    Case("cumsum", lambda a: (jnp.cumsum(a, axis=0), jnp.cumsum(a, axis=1)), (e03,)),
    Case("cumsum_rows", lambda a: jnp.cumsum(a, axis=1), (e30,)),
    Case("cumprod_cummax", lambda a: (jnp.cumprod(a, axis=0), lax.cummax(a, axis=0)), (e03,)),
    Case("sort", lambda a: (jnp.sort(a, axis=0), jnp.sort(a, axis=1)), (e03,)),
    Case("argsort", lambda a: (jnp.argsort(a, axis=0), jnp.argsort(a, axis=1)), (e03,)),
    Case("sort_1d", jnp.sort, (e0,)),
    Case("take_empty_index", lambda a, i: jnp.take(a, i, axis=0), (x34, np.zeros((0,), I32))),
    Case("take_from_empty_cols", lambda a, i: jnp.take(a, i, axis=0), (e30, np.array([0, 2], I32))),
    Case("index_with_empty", lambda a, i: a[i], (x34, np.zeros((0, 2), I32))),
    Case("gather_rows_into_empty", lambda a, i: a[i, :0], (x34, np.array([1, 0], I32))),
    Case("scatter_into_empty", lambda a, i: a.at[i].set(1.0), (e30, np.array([0, 2], I32))),
    Case("scatter_empty_updates", lambda a, i: a.at[i].add(1.0), (x34, np.zeros((0,), I32))),
    Case("dynamic_slice_empty", lambda a, i: lax.dynamic_slice(a, (i, 0), (0, 4)), (x34, np.int32(1))),
    # rules with regions, custom calls, windows and random bits
    Case("reduce_init_empty", lambda a: (lax.reduce(a, np.float32(5), lax.add, (0,)),
                                         lax.reduce(a > 0, True, lax.bitwise_and, (0,))), (e03,)),
    Case("conv_empty_batch", lambda x, w: lax.conv(x, w, (1, 1), "SAME"),
         (np.zeros((0, 2, 4, 4), F32), rand((3, 2, 3, 3)))),
    Case("conv_empty_channels", lambda x, w: lax.conv(x, w, (1, 1), "SAME"),
         (np.zeros((1, 0, 4, 4), F32), np.zeros((3, 0, 3, 3), F32))),
    Case("window_max_empty", lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 2), (1, 1), "VALID"), (e03,)),
    Case("maxpool_grad_empty", jax.grad(lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 2), (1, 1),
                                                                   "VALID").sum()), (e03,)),
    Case("top_k_0", lambda a: lax.top_k(a, 0), (x34,)),
    Case("inv_0x0", jnp.linalg.inv, (np.zeros((0, 0), F32),)),
    Case("cholesky_0x0", jnp.linalg.cholesky, (np.zeros((0, 0), F32),)),
    Case("fori_mixed_carry", lambda a, s: lax.fori_loop(0, 3, lambda i, c: (c[0] * 2 + 1, c[1] + 1), (a, s)),
         (e03, np.float32(1))),
    Case("cond_empty", lambda p, a: lax.cond(p, lambda x: x + 1, lambda x: x - 1, a), (True, e03)),
    Case("scan_over_empty", lambda a: lax.scan(lambda c, x: (c + x.sum(), x * 2), np.float32(0), a), (e03,)),
    Case("uniform_empty", lambda a: jax.random.uniform(jax.random.key(0), (0, 3)) + a, (e03,)),
    Case("complex_empty", lambda a: (a * 1j + a).imag, (e03,)),
    Case("dynamic_update_empty", lambda a, u, i: lax.dynamic_update_slice(a, u, (i, 0)),
         (x34, np.zeros((0, 4), F32), np.int32(1))),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_zero_size(case: Case) -> None:
    run_case(case)


def test_empty_kernel_convolution_is_zeros() -> None:
    """No Conv node for a kernel without input channels: ORT 1.31's Conv never returns on one."""
    x, w = np.zeros((1, 0, 4, 4), F32), np.zeros((3, 0, 3, 3), F32)
    model = mnjit(lambda x, w: lax.conv(x, w, (1, 1), "SAME")).lower(x, w).onnx_model
    assert "Conv" not in {node.op_type for node in model.graph.node}
