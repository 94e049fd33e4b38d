"""Symbolic-dim exports that used to be refused, wrong or crashing:

* slices of symbolic size (jnp's x[:, 1:], jnp.diff: a StableHLO dynamic_gather whose window is symbolic), their
  gradients and .at[:, 1:] (a scatter of such windows);
* dynamic_update_slice with an update of symbolic size, whose symbolic dims are not necessarily the operand's
  (also where a loop writes it as a row of a stacked result);
* reduce_window by a general body (cumlogsumexp) along static axes beside a symbolic one;
* the gradient of strided sum/average pooling over symbolic sizes (a dynamic_pad with interior padding);
* lax.top_k with a symbolic k (jnp.partition along a symbolic axis).

Each row is a test_dynamic_export.DynCase, compared with jax.jit at several sizes in both x64 modes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from test_dynamic_export import CONV_TOL, Arg, DynCase, check_symbolic, I32

# s <= t where a case needs it; 1 and a large-ish size included.
SIZES = [{"b": 1, "s": 1, "t": 3}, {"b": 3, "s": 4, "t": 7}, {"b": 17, "s": 20, "t": 20}]


def update_columns(x, u, i):
    return lax.dynamic_update_slice_in_dim(x, u, i, axis=1)


def update_rows_in_loop(x, u):
    """A fori_loop writing u (s rows) at rows 0, 1, 2 of x (t rows)."""
    return lax.fori_loop(0, 3, lambda i, c: lax.dynamic_update_slice_in_dim(c, u * i, i, axis=0), x)


def stack_rows(c, u):
    """fori_loop's row i written with u (s columns) into c (t columns): not a scan output, which would be s wide."""
    return lax.fori_loop(0, 4, lambda i, c: lax.dynamic_update_slice(c, (u * i)[None], (i, 0 * i, 0 * i)), c)


def kv_cache_decode(x, wk, wv, positions):
    """A prompt of symbolic length t (its positions emb[:t]) written into a key/value cache of 24 rows, then 4 steps of
    attention over the cache, each writing its row at position t + i."""
    b, t, d = x.shape
    x, wk, wv = x + positions[:t], wk * 0.3, wv * 0.3
    keys = lax.dynamic_update_slice(jnp.zeros((b, 24, d), x.dtype), x @ wk, (0, 0, 0))
    values = lax.dynamic_update_slice(jnp.zeros((b, 24, d), x.dtype), x @ wv, (0, 0, 0))

    def step(carry, _):
        keys, values, h, pos = carry
        scores = jnp.where(jnp.arange(24) < pos, jnp.einsum("bd,bld->bl", h, keys), -1e9)
        h = jnp.einsum("bl,bld->bd", jax.nn.softmax(scores, -1), values)
        keys = lax.dynamic_update_slice(keys, (h @ wk)[:, None], (0, pos, 0))
        values = lax.dynamic_update_slice(values, (h @ wv)[:, None], (0, pos, 0))
        return (keys, values, h, pos + 1), h

    return lax.scan(step, (keys, values, x[:, -1], t), None, length=4)[1]


# A start index column, windows of t - 2 along it: XLA drops an update whose window does not fit.
COLUMNS = lax.ScatterDimensionNumbers(update_window_dims=(1, 2), inserted_window_dims=(),
                                      scatter_dims_to_operand_dims=(1,))


def scatter_columns(x, i, u):
    return lax.scatter(x, i, u[..., 2:], COLUMNS, mode=lax.GatherScatterMode.FILL_OR_DROP)


SLICES = [
    DynCase("slice_tail", lambda x: x[:, 1:], [Arg("b, t")], sizes=SIZES),
    DynCase("slice_both_ends", lambda x: x[1:, 1:-1], [Arg("b, t")], sizes=SIZES),
    DynCase("slice_last_three", lambda x: x[:, -3:], [Arg("b, t")], sizes=SIZES, constraints=["t >= 3"]),
    DynCase("slice_half", lambda x: x[:, : x.shape[1] // 2], [Arg("b, t")], sizes=SIZES),
    DynCase("slice_row_tail", lambda x, i: x[i, 1:], [Arg("b, t"), Arg("", I32, -4, 30)], sizes=SIZES),
    DynCase("slice_tail_column", lambda x: x[:, 1:, 2], [Arg("b, t, 4")], sizes=SIZES),
    # Several windows (a batch of start indices): GatherND over offsets of run-time size.
    DynCase("rows_then_tail", lambda x, i: x[i, 1:], [Arg("b, t"), Arg("5", I32, -3, 3)], sizes=SIZES),
    DynCase("vmapped_slice", jax.vmap(lambda r, i: lax.dynamic_slice_in_dim(r, i, r.shape[0] - 1)),
            [Arg("b, t"), Arg("b", I32, -2, 9)], sizes=SIZES),
    DynCase("vmapped_slice_mixed", jax.vmap(lambda r, i: lax.dynamic_slice(r, (i, i), (r.shape[0] - 1, 2))),
            [Arg("b, t, 4"), Arg("b", I32, -2, 9)], sizes=SIZES),
    DynCase("diff", lambda x: jnp.diff(x, axis=1), [Arg("b, t")], sizes=SIZES),
    DynCase("diff_over_batch", lambda x: jnp.diff(x, axis=0), [Arg("b, 3")], sizes=SIZES),
    DynCase("positions_sliced", lambda x, e: x + e[: x.shape[1]], [Arg("b, t, 4"), Arg("32, 4")], sizes=SIZES,
            constraints=["t <= 32"]),
]

SCATTERS = [
    DynCase("grad_of_diff", jax.grad(lambda x: jnp.sum(jnp.diff(x, axis=1) ** 2)), [Arg("b, t")], sizes=SIZES),
    DynCase("grad_of_rows_tail", jax.grad(lambda x, i: jnp.sum(jnp.sin(x[i, 1:]))), [Arg("b, t"),
                                                                                       Arg("5", I32, -3, 3)],
            sizes=SIZES),
    DynCase("set_tail", lambda x, u: x.at[:, 1:].set(u[:, 1:]), [Arg("b, t"), Arg("b, t")], sizes=SIZES),
    DynCase("set_row_tail", lambda x, i, u: x.at[i, 1:].set(u[1:]), [Arg("b, t"), Arg("", I32, -3, 30), Arg("t")],
            sizes=SIZES),
    DynCase("scatter_columns_dropped", scatter_columns, [Arg("b, t"), Arg("4, 1", I32, -2, 5), Arg("4, b, t")],
            sizes=SIZES[1:], constraints=["t >= 3"]),
    DynCase("scatter_max_columns_dropped", lambda x, i, u: lax.scatter_max(
        x, i, u[..., 2:], COLUMNS, mode=lax.GatherScatterMode.FILL_OR_DROP),
            [Arg("b, t"), Arg("4, 1", I32, -2, 5), Arg("4, b, t")], sizes=SIZES[1:], constraints=["t >= 3"]),
    DynCase("unique_of_size", lambda x: jnp.unique(x, size=3, fill_value=0), [Arg("b", I32, 0, 5)], sizes=SIZES),
]

def sum_pool_loss(window, strides, padding):
    """sum(sin(sum pool)): its gradient pads the cotangent inside (a dynamic_pad over symbolic sizes)."""
    return lambda x: jnp.sum(jnp.sin(lax.reduce_window(x, 0.0, lax.add, window, strides, padding)))


IMAGES = [{"b": 1, "h": 8, "w": 8}, {"b": 3, "h": 9, "w": 13}, {"b": 20, "h": 16, "w": 5}]
# reduce_window by a body of several ops (no ONNX reduction) along static axes, beside a symbolic batch; the
# gradients of strided sum pooling over symbolic image sizes.
WINDOWS = [
    DynCase("cumlogsumexp_static_axis", lambda x: lax.cumlogsumexp(x, axis=1), [Arg("b, 5")], sizes=SIZES),
    DynCase("cumlogsumexp_static_axis_reverse", lambda x: lax.cumlogsumexp(x, axis=2, reverse=True),
            [Arg("b, t, 5")], sizes=SIZES),
    DynCase("logaddexp_pool", lambda x: lax.reduce_window(x, jnp.asarray(-jnp.inf, x.dtype), jnp.logaddexp,
                                                          (1, 3, 1), (1, 2, 1), "SAME"), [Arg("b, 7, t")], sizes=SIZES),
    DynCase("sum_pool_grad_images", jax.grad(sum_pool_loss((1, 2, 2, 1), (1, 2, 2, 1), "VALID")),
            [Arg("b, h, w, 2")], CONV_TOL, sizes=IMAGES),
    DynCase("sum_pool_grad_images_same", jax.grad(sum_pool_loss((1, 3, 3, 1), (1, 2, 2, 1), "SAME")),
            [Arg("b, h, w, 2")], CONV_TOL, sizes=IMAGES),
    DynCase("sum_pool_grad_sequence", jax.grad(sum_pool_loss((1, 3), (1, 2), "VALID")), [Arg("b, t")], CONV_TOL,
            sizes=SIZES),
]

# lax.top_k with k computed from symbolic dims: the custom call @stablehlo.dynamic_top_k.
TOP_K = [
    DynCase("partition", lambda x: jnp.sort(jnp.partition(x, 0, axis=1), axis=1), [Arg("b, t")], sizes=SIZES),
    DynCase("argpartition", lambda x: jnp.sort(jnp.argpartition(x, 0, axis=1)[:, 1:], axis=1), [Arg("b, t")],
            sizes=SIZES),
    DynCase("top_k_all_with_nans", lambda x: lax.top_k(jnp.where(x > 1.2, jnp.nan, jnp.where(x < -1.5, -0.0, x)),
                                                       x.shape[1]), [Arg("b, t")], sizes=SIZES),
    DynCase("top_k_half_int", lambda x: lax.top_k(x, x.shape[1] // 2), [Arg("b, 2*t", I32)], sizes=SIZES),
]

UPDATES = [
    # The gradient of a slice of symbolic size: its cotangent (b, t - 1) written into zeros (b, t).
    DynCase("grad_of_dynamic_slice", jax.grad(lambda x, i: jnp.sum(jnp.sin(
        lax.dynamic_slice_in_dim(x, i, x.shape[1] - 1, axis=1)))), [Arg("b, t"), Arg("", I32, -2, 9)], sizes=SIZES),
    DynCase("update_columns_two_symbols", update_columns, [Arg("b, t"), Arg("b, s"), Arg("", I32, -2, 9)],
            sizes=SIZES, constraints=["s <= t"]),
    DynCase("update_rows_two_symbols", lambda x, u, i: lax.dynamic_update_slice_in_dim(x, u, i, axis=0),
            [Arg("t, b"), Arg("s, b"), Arg("", I32, -2, 9)], sizes=SIZES, constraints=["s <= t"]),
    DynCase("update_block_two_symbols", lambda x, u, i, j: lax.dynamic_update_slice(x, u, (i, i, j)),
            [Arg("b, t, t"), Arg("1, s, s"), Arg("", I32, -2, 9), Arg("", I32, -2, 9)], sizes=SIZES,
            constraints=["s <= t"]),
    # (The static export differs from jax.jit as much: attention over 20 keys in float32.)
    DynCase("kv_cache_decode", kv_cache_decode, [Arg("b, t, 8"), Arg("8, 8"), Arg("8, 8"), Arg("32, 8")],
            (2e-4, 2e-4), sizes=SIZES, constraints=["t <= 20"]),
    DynCase("update_symbolic_into_static", update_columns, [Arg("b, 20"), Arg("b, t"), Arg("", I32, -2, 22)],
            sizes=SIZES, constraints=["t <= 20"]),
    DynCase("update_bool_two_symbols", update_columns, [Arg("b, t", bool, 0, 2), Arg("b, s", bool, 0, 2),
                                                        Arg("", I32, -2, 9)], sizes=SIZES, constraints=["s <= t"]),
    DynCase("update_rows_in_loop", update_rows_in_loop, [Arg("t, b"), Arg("s, b")], sizes=SIZES,
            constraints=["s <= t"]),
    DynCase("stack_rows_two_symbols", stack_rows, [Arg("4, b, t"), Arg("b, s")], sizes=SIZES, constraints=["s <= t"]),
    DynCase("stack_rows_same_symbols", stack_rows, [Arg("4, b, t"), Arg("b, t")], sizes=SIZES),
]


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("case", SLICES + SCATTERS + WINDOWS + TOP_K + UPDATES, ids=repr)
def test_symbolic_windows(case: DynCase, x64: bool):
    check_symbolic(case, x64)
