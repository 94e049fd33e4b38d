"""gather, scatter, dynamic_slice and dynamic_update_slice through JAX user code, each compared with jax.jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from harness import Case, rand, run_case

F16, F32, F64, BF16 = np.float16, np.float32, np.float64, ml_dtypes.bfloat16
I8, I32, I64, U8 = np.int8, np.int32, np.int64, np.uint8

x54 = rand((5, 4))
x345 = rand((3, 4, 5), seed=3)
rows = np.array([0, 2, 2, 4], I32)  # repeated on purpose: scatter-add must accumulate
cols = np.array([3, 0, 1], I32)
neg = np.array([-1, -5, 2], I32)
oob = np.array([7, -9, 1, 5, -6], I32)  # past both ends, after JAX's negative wrap too
upd44 = rand((4, 4), seed=7)
_nan_x = np.array([1, np.nan, 3, 4, 0], F32)
_nan_u = np.array([np.nan, 0, 2, 9, np.nan, -1], F32)  # a NaN update, then a number, at index 3


def idx(*values, dtype=I32):
    return np.array(values, dtype)


GATHER = [
    Case("take_rows", lambda x, i: x[i], (x54, rows)),
    Case("take_cols", lambda x, i: x[:, i], (x54, cols)),
    Case("take_pairs", lambda x, i, j: x[i, j], (x54, idx(0, 4, 2), cols)),
    Case("take_negative", lambda x, i: x[i], (x54, neg)),
    Case("take_out_of_bounds", lambda x, i: x[i], (x54, oob)),
    Case("take_2d_indices", lambda x, i: x[i], (x54, np.array([[0, 1], [4, 3], [2, 2]], I32))),
    Case("take_last_axis_3d", lambda x, i: x[..., i], (x345, cols)),
    Case("take_middle_axis_3d", lambda x, i: x[:, i], (x345, cols)),
    Case("take_split_advanced", lambda x, i, j: x[i, :, j], (x345, idx(0, 2, 1), idx(4, 0, 3))),
    Case("take_rows_then_slice", lambda x, i: x[i, 1:3], (x54, rows)),
    Case("take_empty", lambda x, i: x[i], (x54, np.zeros(0, I32))),
    Case("take_unit_dim", lambda x, i: x[i], (rand((1, 4)), idx(0, 0, -1))),
    Case("take_scalar_index", lambda x, i: x[i], (x54, np.int32(3))),
    Case("take_scalar_index_oob", lambda x, i: x[i], (x54, np.int32(9))),
    Case("take_two_scalars", lambda x, i, j: x[i, j], (x54, np.int32(-2), np.int32(1))),
    Case("jnp_take_axis1", lambda x, i: jnp.take(x, i, axis=1), (x54, cols)),
    Case("jnp_take_clip", lambda x, i: jnp.take(x, i, axis=0, mode="clip"), (x54, oob)),
    Case("jnp_take_fill", lambda x, i: jnp.take(x, i, axis=0, mode="fill"), (x54, oob)),
    Case("jnp_take_fill_value", lambda x, i: jnp.take(x, i, axis=1, mode="fill", fill_value=-7.0), (x54, oob)),
    Case("get_fill_mode", lambda x, i: x.at[i].get(mode="fill", fill_value=0.5), (x54, oob)),
    Case("get_promise_in_bounds", lambda x, i: x.at[i].get(mode="promise_in_bounds"), (x54, rows)),
    Case("take_flat", lambda x, i: jnp.take(x, i), (x54, idx(0, 19, 7, 20, -3))),
    Case("take_along_axis1", lambda x, i: jnp.take_along_axis(x, i, axis=1),
         (x54, rand((5, 3), I32, seed=4, low=0, high=0.3))),
    Case("take_along_axis0_3d", lambda x, i: jnp.take_along_axis(x, i, axis=0),
         (x345, rand((2, 4, 5), I32, seed=5, low=0, high=0.2))),
    Case("take_along_broadcast", lambda x, i: jnp.take_along_axis(x, i, axis=1), (x54, idx(1, 3)[None, :])),
    Case("take_along_oob_fill", lambda x, i: jnp.take_along_axis(x, i, axis=1, mode="fill"),
         (x54, rand((5, 2), I32, seed=6, low=-1, high=1))),
    Case("argsort_take_along", lambda x: jnp.take_along_axis(x, jnp.argmax(x, axis=1)[:, None], axis=1), (x54,)),
    Case("vmap_take", lambda x, i: jax.vmap(lambda r, j: r[j])(x, i), (x54, idx(3, 0, 1, 2, 3))),
    Case("vmap_take_many", lambda x, i: jax.vmap(lambda r, j: r[j])(x, i),
         (x54, rand((5, 3), I32, seed=8, low=0, high=0.3))),
    Case("vmap_take_rows_3d", lambda x, i: jax.vmap(lambda m, j: m[j])(x, i), (x345, idx(0, 3, 3))),
    Case("vmap_dynamic_slice", lambda x, i: jax.vmap(lambda j: lax.dynamic_slice(x, (j, 1), (2, 3)))(i),
         (x54, idx(0, 4, -2, 1))),
    Case("vmap_both_dynamic_slice", lambda x, i: jax.vmap(lambda r, j: lax.dynamic_slice(r, (j,), (2,)))(x, i),
         (x54, idx(0, 3, 9, -1, 1))),
    Case("constant_indices", lambda x: x[np.array([4, 0, 1])], (x54,)),
    Case("gather_f16", lambda x, i: x[i], (x54.astype(F16), rows)),
    Case("gather_bf16", lambda x, i: x.astype(BF16)[i].astype(F32), (x54, oob)),
    Case("gather_bf16_along", lambda x, i: jnp.take_along_axis(x.astype(BF16), i, axis=1, mode="clip").astype(F32),
         (x54, rand((5, 2), I32, 2, 0, 0.3))),
    Case("gather_f64", lambda x, i: x[:, i], (x54.astype(F64), cols), x64=True),
    Case("gather_i32", lambda x, i: x[i], (rand((5, 4), I32), oob)),
    Case("gather_i64_x64", lambda x, i: x[i], (rand((5, 4), I64), rows.astype(I64)), x64=True),
    Case("gather_u8", lambda x, i: x[i], (rand((5, 4), U8), rows)),
    Case("gather_i8", lambda x, i: jnp.take_along_axis(x, i, axis=0), (rand((5, 4), I8), rand((2, 4), I32, 1, 0, 0.4))),
    Case("gather_bool", lambda x, i: x[:, i], (x54 > 0, cols)),
    Case("gather_u8_indices", lambda x, i: x[i], (x54, idx(4, 1, 200, dtype=U8))),
    Case("gather_i8_indices", lambda x, i: x[i], (x54, idx(-1, 3, -128, 127, dtype=I8))),
    Case("grad_of_take", jax.grad(lambda x, i: (x[i] ** 2).sum()), (x54, rows)),
    Case("grad_of_take_along", jax.grad(lambda x, i: jnp.take_along_axis(x, i, axis=1).sum()),
         (x54, rand((5, 6), I32, seed=9, low=0, high=0.3))),
]

SCATTER = [
    Case("set_rows", lambda x, i, u: x.at[i].set(u), (x54, idx(4, 0, 2, 1), upd44)),
    Case("set_scalar_bcast", lambda x, i: x.at[i].set(9.0), (x54, idx(3, 1))),
    Case("add_repeated", lambda x, i, u: x.at[i].add(u), (x54, rows, upd44)),
    Case("mul_repeated", lambda x, i, u: x.at[i].multiply(u), (x54, rows, upd44)),
    Case("min_repeated", lambda x, i, u: x.at[i].min(u), (x54, rows, upd44)),
    Case("max_repeated", lambda x, i, u: x.at[i].max(u), (x54, rows, upd44)),
    Case("min_nan", lambda x, i, u: x.at[i].min(u), (_nan_x, idx(0, 1, 2, 2, 3, 3), _nan_u)),
    Case("max_nan", lambda x, i, u: x.at[i].max(u), (_nan_x, idx(0, 1, 2, 2, 3, 3), _nan_u)),
    Case("max_nan_f16", lambda x, i, u: x.at[i].max(u), 
         (_nan_x.astype(F16), idx(0, 1, 2, 2, 3, 3), _nan_u.astype(F16))),
    Case("segment_min_nan", lambda u, i: jax.ops.segment_min(u, i, num_segments=5), (_nan_u, idx(3, 1, 2, 2, 1, 3))),
    Case("add_cols", lambda x, i: x.at[:, i].add(1.5), (x54, idx(1, 1, 3))),
    Case("add_pairs", lambda x, i, j: x.at[i, j].add(2.0), (x54, idx(0, 4, 0, 2), idx(3, 0, 3, 1))),
    Case("add_split_advanced", lambda x, i, j: x.at[i, :, j].add(1.0), (x345, idx(0, 2, 0), idx(4, 0, 4))),
    Case("set_negative", lambda x, i: x.at[i].set(-1.0), (x54, neg)),
    Case("add_drop_oob", lambda x, i: x.at[i].add(10.0), (x54, oob)),
    Case("add_drop_oob_mode", lambda x, i: x.at[i].add(10.0, mode="drop"), (x54, oob)),
    Case("set_drop_oob", lambda x, i: x.at[i].set(jnp.arange(20.0).reshape(5, 4), mode="drop"), (x54, oob)),
    Case("set_clip", lambda x, i: x.at[i].set(jnp.arange(5.0), mode="clip"), (rand((6,)), idx(9, -9, 2, 3, 4))),
    Case("max_drop_oob_pairs", lambda x, i, j: x.at[i, j].max(5.0), (x54, idx(0, 5, 2, -8), idx(3, 0, 9, 1))),
    Case("set_oob_pairs", lambda x, i, j: x.at[i, j].set(5.0), (x54, idx(0, 5, 2, -8), idx(3, 0, 9, 1))),
    Case("set_constant_indices", lambda x: x.at[np.array([0, 7, 2])].set(3.0), (x54,)),
    Case("add_empty", lambda x, i: x.at[i].add(1.0), (x54, np.zeros(0, I32))),
    Case("add_unit_dim", lambda x, i: x.at[i].add(1.0), (rand((1, 4)), idx(0, 0, 1))),
    Case("add_scalar_index", lambda x, i, u: x.at[i].add(u), (x54, np.int32(2), rand((4,), seed=2))),
    Case("add_2d_indices", lambda x, i: x.at[i].add(1.0), (x54, np.array([[0, 1], [4, 1]], I32))),
    Case("add_slice_window", lambda x, i: x.at[i, 1:3].add(1.0), (x54, rows)),
    Case("segment_sum", lambda d, s: jax.ops.segment_sum(d, s, num_segments=4), (upd44, idx(3, 0, 3, 7))),
    Case("segment_max", lambda d, s: jax.ops.segment_max(d, s, num_segments=3), (upd44, idx(2, 0, 2, 1))),
    Case("put_along_axis", lambda x, i, u: jnp.put_along_axis(x, i, u, axis=1, inplace=False),
         (x54, np.array([[0], [3], [1], [2], [0]], I32), rand((5, 1), seed=3))),
    Case("vmap_set", lambda x, i: jax.vmap(lambda r, j: r.at[j].set(2.0))(x, i), (x54, idx(3, 0, 9, -1, 2))),
    Case("vmap_add_many", lambda x, i: jax.vmap(lambda r, j: r.at[j].add(1.0))(x, i),
         (x54, rand((5, 3), I32, seed=8, low=0, high=0.3))),
    Case("vmap_add_rows_3d", lambda x, i: jax.vmap(lambda m, j: m.at[j].add(1.0))(x, i), (x345, idx(0, 3, 7))),
    Case("vmap_dynamic_update_slice", lambda x, u, i: jax.vmap(lambda r, v, j: lax.dynamic_update_slice(r, v, (j,)))(
        x, u, i), (x54, rand((5, 2), seed=4), idx(0, 3, 9, -1, 1))),
    Case("scatter_f16_add", lambda x, i, u: x.at[i].add(u), (x54.astype(F16), rows, upd44.astype(F16))),
    Case("scatter_f16_max", lambda x, i, u: x.at[i].max(u), (x54.astype(F16), oob[:4], upd44.astype(F16))),
    Case("scatter_f16_set", lambda x, i: x.at[i].set(1.0), (x54.astype(F16), oob)),
    # bf16 made inside: mnjit's runtime does not take bf16 arguments yet.
    Case("scatter_bf16_add", lambda x, i, u: x.astype(BF16).at[i].add(u.astype(BF16)).astype(F32),
         (x54, oob[:4], upd44)),
    Case("scatter_bf16_set", lambda x, i, u: x.astype(BF16).at[i].set(u.astype(BF16)).astype(F32),
         (x54, oob[:4], upd44)),
    Case("scatter_f64_add", lambda x, i, u: x.at[i].add(u), (x54.astype(F64), rows, upd44.astype(F64)), x64=True),
    Case("scatter_i32_add", lambda x, i: x.at[i].add(3), (rand((5, 4), I32), oob)),
    Case("scatter_i32_min", lambda x, i: x.at[i].min(-7), (rand((5, 4), I32), oob)),
    Case("scatter_i64_add_x64", lambda x, i: x.at[i].add(3), (rand((5, 4), I64), rows.astype(I64)), x64=True),
    Case("scatter_u8_add", lambda x, i: x.at[i].add(U8(200)), (rand((5, 4), U8), rows)),
    # bodies no ONNX reduction expresses: applied one index row at a time, in order (twice on a repeated row)
    Case("scatter_apply_sin", lambda x, i: x.at[i].apply(jnp.sin, mode="drop"), (x54, oob)),
    Case("scatter_apply_affine", lambda x, i: x.at[i, 1:3].apply(lambda v: v * 2 + 1, mode="drop"), (x54, oob)),
    Case("scatter_apply_i32_x64", lambda x, i: x.at[i].apply(lambda v: v * 3 - 1), (rand((5, 4), I32), rows),
         x64=True),
    Case("scatter_i8_mul", lambda x, i: x.at[i].multiply(I8(3)), (rand((5, 4), I8), rows)),
    Case("scatter_bool_set", lambda x, i: x.at[i].set(True), (x54 > 1, oob)),
    Case("scatter_bool_max", lambda x, i, u: x.at[i].max(u), (x54 > 1, rows, upd44 > 0)),
    Case("scatter_bool_min", lambda x, i, u: x.at[i].min(u), (x54 > -1, rows, upd44 > 0)),
    Case("grad_of_take_oob", jax.grad(lambda x, i: (x[i] * jnp.arange(5.0)[:, None]).sum()), (x54, oob)),
]

DYNAMIC = [
    Case("dynamic_slice", lambda x, i, j: lax.dynamic_slice(x, (i, j), (2, 3)), (x54, np.int32(1), np.int32(1))),
    Case("dynamic_slice_clamped", lambda x, i, j: lax.dynamic_slice(x, (i, j), (2, 3)),
         (x54, np.int32(9), np.int32(-3))),
    Case("dynamic_slice_one_axis", lambda x, i: lax.dynamic_slice_in_dim(x, i, 2, axis=1), (x345, np.int32(3))),
    Case("dynamic_slice_full", lambda x, i: lax.dynamic_slice(x, (i, 0), (5, 4)), (x54, np.int32(2))),
    Case("dynamic_slice_empty", lambda x, i: lax.dynamic_slice(x, (i, 0), (0, 4)), (x54, np.int32(2))),
    Case("dynamic_slice_u8_index", lambda x, i: lax.dynamic_slice(x, (i, i), (2, 2)), (x54, np.uint8(250))),
    Case("dynamic_slice_i64_x64", lambda x, i: lax.dynamic_slice(x, (i, 1), (3, 2)), (x54.astype(F64), np.int64(-4)),
         x64=True),
    Case("dynamic_index_in_dim", lambda x, i: lax.dynamic_index_in_dim(x, i, axis=1, keepdims=False),
         (x345, np.int32(-1))),
    Case("dynamic_update_slice", lambda x, u, i, j: lax.dynamic_update_slice(x, u, (i, j)),
         (x54, rand((2, 3), seed=1), np.int32(1), np.int32(0))),
    Case("dynamic_update_slice_clamped", lambda x, u, i, j: lax.dynamic_update_slice(x, u, (i, j)),
         (x54, rand((2, 3), seed=1), np.int32(4), np.int32(-2))),
    Case("dynamic_update_slice_row", lambda x, u, i: lax.dynamic_update_slice(x, u, (i, 0)),
         (x54, rand((1, 4), seed=1), np.int32(3))),
    Case("dynamic_update_slice_middle", lambda x, u, i: lax.dynamic_update_slice(x, u, (0, i, 0)),
         (x345, rand((3, 2, 5), seed=1), np.int32(1))),
    Case("dynamic_update_slice_full", lambda x, u, i: lax.dynamic_update_slice(x, u, (i, i)),
         (x54, rand((5, 4), seed=1), np.int32(1))),
    Case("dynamic_update_slice_empty", lambda x, u, i: lax.dynamic_update_slice(x, u, (i, i)),
         (x54, np.zeros((0, 2), F32), np.int32(1))),
    Case("dynamic_update_slice_bool", lambda x, u, i: lax.dynamic_update_slice(x, u, (i,)),
         (x54[0] > 0, np.ones(2, bool), np.int32(1))),
    Case("dynamic_update_index_i64_x64", lambda x, u, i: lax.dynamic_update_index_in_dim(x, u, i, axis=0),
         (rand((5, 4), I64), rand((4,), I64, seed=2), np.int64(2)), x64=True),
    Case("dynamic_update_slice_f16", lambda x, u, i: lax.dynamic_update_slice(x, u, (i, 2)),
         (x54.astype(F16), rand((3, 2), F16), np.int32(2))),
]


# Dimension numbers JAX's numpy layer never produces, straight through lax.
_PROMISE, _DROP = lax.GatherScatterMode.PROMISE_IN_BOUNDS, lax.GatherScatterMode.FILL_OR_DROP
_GD, _SD = lax.GatherDimensionNumbers, lax.ScatterDimensionNumbers
RAW = [
    Case("gather_collapsed_unindexed", lambda x, i: lax.gather(
        x, i, _GD(offset_dims=(1,), collapsed_slice_dims=(0, 2), start_index_map=(2,)), (1, 4, 1), mode=_PROMISE),
         (x345, idx(4, 0, 7)[:, None])),
    Case("gather_window_kept_unit", lambda x, i: lax.gather(
        x, i, _GD(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(1,)), (5, 1), mode=_PROMISE),
         (x54, idx(3, -1, 2)[:, None])),
    Case("gather_broadcast_slice_bf16", lambda x, i: lax.gather(
        x.astype(BF16), i, _GD(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=()), (1, 3),
        mode=_PROMISE).astype(F32), (x54, np.zeros((4, 0), I32))),
    Case("gather_broadcast_slice", lambda x, i: lax.gather(
        x, i, _GD(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=()), (1, 3), mode=_PROMISE),
         (x54, np.zeros((4, 0), I32))),
    Case("scatter_add_window_past_end", lambda x, i, u: lax.scatter_add(
        x, i, u, _SD(update_window_dims=(1,), inserted_window_dims=(), scatter_dims_to_operand_dims=(0,)),
        mode=_DROP), (rand((6,)), idx(0, 4, 5, -1, 3)[:, None], rand((5, 2), seed=2))),
    Case("scatter_set_window_past_end", lambda x, i, u: lax.scatter(
        x, i, u, _SD(update_window_dims=(1,), inserted_window_dims=(), scatter_dims_to_operand_dims=(0,)),
        mode=_DROP), (rand((6,)), idx(0, 4, 5, -1)[:, None], rand((4, 2), seed=2))),
    # No index columns: every window is the whole operand (x.at[...].set(y), optimistix's NelderMead).
    Case("scatter_whole_set", lambda x, u: x.at[...].set(u), (x54, upd44[:, :4].repeat(2, 0)[:5])),
    Case("scatter_whole_add_0d", lambda x, u: x.at[()].add(u), (np.float32(1.5), np.float32(-4.0))),
    Case("scatter_whole_apply", lambda x: x.at[:].apply(jnp.sin), (x54,)),
    Case("scatter_whole_mul_c64", lambda x, u: x.at[...].multiply(u),
         ((x54 + 1j * x54[::-1]).astype(np.complex64), (x54[::-1] - 2j).astype(np.complex64))),
    Case("scatter_whole_rows_add", lambda x, i, u: lax.scatter_add(
        x, i, u, _SD(update_window_dims=(0, 2), inserted_window_dims=(), scatter_dims_to_operand_dims=())),
         (x54, np.zeros((3, 0), I32), rand((5, 3, 4), seed=2))),
    Case("scatter_whole_rows_max_nan", lambda x, i, u: lax.scatter_max(
        x, i, u, _SD(update_window_dims=(1,), inserted_window_dims=(), scatter_dims_to_operand_dims=())),
         (_nan_x, np.zeros((2, 0), I32), np.array([_nan_u[1:], _nan_u[:5]]))),
    Case("scatter_mul_2d_windows", lambda x, i, u: lax.scatter_mul(
        x, i, u, _SD(update_window_dims=(0, 2), inserted_window_dims=(), scatter_dims_to_operand_dims=(1, 0)),
        mode=_DROP), (x54, np.array([[0, 3], [2, 0], [1, 2]], I32), rand((2, 3, 2), seed=2))),
]


def _fire_like(positions, velocity, force, neighbors, mass, dt):
    """FIRE-style step: pair displacements by row gather, forces summed back by scatter-add, mixed dtypes."""
    n = positions.shape[0]
    i, j = neighbors
    dr = positions[j] - positions[i]  # j holds the sentinel n for padding: clamped by gather
    mask = (j < n)[:, None]
    pair = jnp.where(mask, dr * jnp.exp(-jnp.sum(dr ** 2, axis=1, keepdims=True)), 0.0)
    f = force + jax.ops.segment_sum(pair.astype(jnp.float32), i, num_segments=n).astype(positions.dtype)
    f = f.at[j].add(-pair, mode="drop")  # the sentinel row is dropped
    v = velocity + dt * f.astype(jnp.float16) / mass
    return positions + dt * v.astype(positions.dtype), v, f


_N = 6
_nbr = np.stack([np.array([0, 0, 1, 2, 3, 4, 5, 5], np.int64), np.array([1, 2, 2, 3, 6, 5, 0, 6], np.int64)])
FIRE = [
    Case("fire_like_x64", _fire_like,
         (rand((_N, 3), F64), rand((_N, 3), F16, seed=1), rand((_N, 3), F64, seed=2), _nbr, np.float64(1.5),
          np.float64(0.1)), x64=True, tol=(3e-3, 3e-3)),
    Case("fire_like_gather_f16", lambda v, nb: v[nb[1]] * v[nb[0]], (rand((_N, 3), F16), _nbr), x64=True),
    Case("fire_like_scatter_f16", lambda v, nb: jnp.zeros((_N, 3), jnp.float16).at[nb[0]].add(v[nb[1]], mode="drop"),
         (rand((_N + 1, 3), F16), _nbr), x64=True),
    Case("fire_like_segment_i64", lambda nb: jax.ops.segment_sum(jnp.ones(8, jnp.int64), nb[1], num_segments=_N),
         (_nbr,), x64=True),
]

# jax2onnx's own histogram cases: integer edges put searchsorted's binary search (a Loop) next to main-graph
# values, and a rewrite inside the bodies once named a value as the main graph had (ORT: not single assignment).
_xs, _xe, _ye = np.asarray([0, 1, 2, 3], I32), np.asarray([0, 2, 4], I32), np.asarray([0, 1, 4], I32)
HISTOGRAMS = [
    Case("histogram2d_integer_edges", lambda x, y, xe, ye: jnp.histogram2d(x, y, bins=(xe, ye)), (_xs, _xs, _xe, _ye)),
    Case("histogram2d_integer_edges_x64", lambda x, y, xe, ye: jnp.histogram2d(x, y, bins=(xe, ye)),
         (_xs, _xs, _xe, _ye), x64=True),
    Case("histogramdd_integer_edges", lambda s, xe, ye: jnp.histogramdd(s, bins=(xe, ye)),
         (np.stack([_xs, _xs], 1), _xe, _ye)),
    Case("histogram2d_float_out_of_range", lambda x, y: jnp.histogram2d(x, y, bins=3, range=[[0, 1], [0, 2]]),
         (rand((9,)), rand((9,), seed=1))),
]

CASES = GATHER + SCATTER + DYNAMIC + RAW + FIRE + HISTOGRAMS


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_indexing(case: Case) -> None:
    run_case(case)


# index_vector_dim before the last axis: JAX always puts it last, but StableHLO from other producers may not.
# The hand-written module is compared with jax.jit of the same op on indices moved to JAX's layout.
_GATHER_IVD0 = """
func.func public @main(%x: tensor<5x4xf32>, %i: tensor<2x3xi32>) -> tensor<2x3xf32> {
  %0 = "stablehlo.gather"(%x, %i) <{dimension_numbers = #stablehlo.gather<offset_dims = [0],
    collapsed_slice_dims = [1], start_index_map = [0, 1], index_vector_dim = 0>,
    indices_are_sorted = false, slice_sizes = array<i64: 2, 1>}>
    : (tensor<5x4xf32>, tensor<2x3xi32>) -> tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}"""
_GATHER_IVD_MIDDLE_BATCHED = """
func.func public @main(%x: tensor<2x5xf32>, %i: tensor<3x1x2xi32>) -> tensor<3x2xf32> {
  %0 = "stablehlo.gather"(%x, %i) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1],
    operand_batching_dims = [0], start_indices_batching_dims = [2], start_index_map = [1], index_vector_dim = 1>,
    indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}>
    : (tensor<2x5xf32>, tensor<3x1x2xi32>) -> tensor<3x2xf32>
  return %0 : tensor<3x2xf32>
}"""
_SCATTER_IVD0 = """
func.func public @main(%x: tensor<5x4xf32>, %i: tensor<2x3xi32>, %u: tensor<3xf32>) -> tensor<5x4xf32> {
  %0 = "stablehlo.scatter"(%x, %i, %u) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [],
    inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [1, 0], index_vector_dim = 0>,
    indices_are_sorted = false, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<5x4xf32>, tensor<2x3xi32>, tensor<3xf32>) -> tensor<5x4xf32>
  return %0 : tensor<5x4xf32>
}"""
_i23 = np.array([[0, 4, -2], [3, 1, 9]], I32)
_i312 = np.array([[[4, 0]], [[9, -1]], [[2, 3]]], I32)
HAND_WRITTEN = [
    (_GATHER_IVD0, lambda x, i: lax.gather(
        x, i.T, _GD(offset_dims=(0,), collapsed_slice_dims=(1,), start_index_map=(0, 1)), (2, 1), mode=_PROMISE),
     (x54, _i23)),
    (_GATHER_IVD_MIDDLE_BATCHED, lambda x, i: lax.gather(
        x, jnp.transpose(i, (0, 2, 1)), _GD(offset_dims=(), collapsed_slice_dims=(1,), start_index_map=(1,),
                                            operand_batching_dims=(0,), start_indices_batching_dims=(1,)),
        (1, 1), mode=_PROMISE), (rand((2, 5)), _i312)),
    (_SCATTER_IVD0, lambda x, i, u: lax.scatter_add(
        x, i.T, u, _SD(update_window_dims=(), inserted_window_dims=(0, 1), scatter_dims_to_operand_dims=(1, 0)),
        mode=_DROP), (x54, np.array([[0, 3, 3], [2, 4, 9]], I32), rand((3,), seed=1))),
]


@pytest.mark.parametrize("text, reference, args", HAND_WRITTEN,
                         ids=["gather_ivd0", "gather_ivd1_batched", "scatter_ivd0"])
def test_index_vector_dim_not_last(text, reference, args) -> None:
    import onnx_ir as ir
    import onnxruntime as ort

    import hlo2onnx

    model = ir.to_proto(hlo2onnx.translate(hlo2onnx.parse_module(text)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    actual = session.run(None, {inp.name: a for inp, a in zip(session.get_inputs(), args)})[0]
    np.testing.assert_allclose(actual, np.asarray(jax.jit(reference)(*args)), rtol=2e-6, atol=2e-6)


def test_scatter_with_other_body_is_refused() -> None:
    """`.at[].apply` with a body that is not elementwise (a loop): refused by name, never approximated."""
    import hlo2onnx
    from mnjit import mnjit

    body = lambda v: jax.lax.fori_loop(0, 3, lambda _, a: a * 2, v)  # noqa: E731
    with pytest.raises(hlo2onnx.UnsupportedOpError, match="stablehlo.scatter: stablehlo.scatter with body"):
        mnjit(lambda x, i: x.at[i].apply(body))(x54, rows)
