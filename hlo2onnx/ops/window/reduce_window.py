"""stablehlo.reduce_window (the variadic form: variadic.py; select_and_scatter: select_and_scatter.py).

reduce_window becomes CumSum, MaxPool or AveragePool where the pattern fits,
else a general lowering: pad, then per windowed axis combine strided slices
(a few for small windows, log2(window) doublings for long ones, so cumprod and
cummax stay O(n log n)).

XLA (what jax.jit runs) skips padding cells and base-dilation holes and applies
`init` once per window, whatever `init` is; so both kinds of holes are filled
with the reducer's identity here and `init` is combined once at the end.
"""
from __future__ import annotations

from math import prod

import numpy as np
import onnx_ir as ir

from hlo2onnx.ops.core import dims
from hlo2onnx.ops.core.reduce import is_constant, single_reducer
from hlo2onnx.ops.core.shape import merged, reshape_to, transpose_to
from hlo2onnx.ops.window.variadic import variadic_reduce_window
from hlo2onnx.ops.window.windows import (COMBINE, DIRECT_WINDOW, Window, axis_slice, body_applier, combine, edge_pad,
                                         identity, pad_and_dilate)
from hlo2onnx.registry import allow_dynamic, register
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import is_bool, is_float

allow_dynamic("stablehlo.reduce_window")


@register("stablehlo.reduce_window")
def reduce_window(ctx: RuleContext, *operands, window_dimensions, window_strides=None, base_dilations=None,
                  window_dilations=None, padding=None):
    win = Window.read(window_dimensions, window_strides, padding, base_dilations, window_dilations)
    if len(operands) != 2:
        # (Its masks and index windows are built from static sizes.)
        dims.refuse(ctx, range(len(win.size)), "a variadic reduce_window")
        return variadic_reduce_window(ctx, operands, win)
    return reduce_window_with(ctx, *operands, ctx.hlo_op.regions[0].blocks[0], win)


def reduce_window_with(ctx: RuleContext, x, init, body, win: Window) -> ir.Value:
    """reduce_window of `x` by the reduction `body` (a block) over the static window `win`."""
    reducer = single_reducer(body)
    shape, dtype = list(ctx.in_types[0].shape), ctx.out_type.dtype
    b = ctx.b
    symbolic = [a for a in range(len(shape)) if shape[a] < 0 and win.active(a)]
    if symbolic:
        # Windows sliding along a symbolic axis: the strided slices count from its end.
        if reducer not in COMBINE or any(win.base_dilation[a] > 1 or win.size[a] > DIRECT_WINDOW
                                         for a in symbolic):
            dims.refuse(ctx, symbolic, f"a window over a symbolic dimension (by {reducer}, base dilation, or "
                                       f"wider than {DIRECT_WINDOW})")
        result = _general(b, x, reducer, dtype, shape, win)
        return result if is_constant(init, identity(reducer, dtype)) else combine(b, reducer, dtype, result, init)
    if reducer not in COMBINE:
        return _general_body(ctx, x, init, body, dtype, shape, win)
    result = _cumsum(b, x, reducer, dtype, shape, win)
    if result is None:
        result = _pool(b, x, reducer, dtype, shape, win)
    if result is None:
        result = _general(b, x, reducer, dtype, shape, win)
    if not is_constant(init, identity(reducer, dtype)):
        result = combine(b, reducer, dtype, result, init)
    return result


def _cumsum(b, x, reducer, dtype, shape, win: Window) -> ir.Value | None:
    """JAX's cumsum: one axis, window = axis length, padded n-1 on one side."""
    active = [a for a in range(len(shape)) if win.active(a)]
    if reducer != "stablehlo.add" or is_bool(dtype) or len(active) != 1:
        return None
    axis = active[0]
    n = shape[axis]
    if (win.size[axis], win.stride[axis], win.base_dilation[axis]) != (n, 1, 1) or n < 2:
        return None
    if (win.lo[axis], win.hi[axis]) not in ((n - 1, 0), (0, n - 1)):
        return None
    return b.typed("CumSum", x, b.const(np.int64(axis)), dtype=dtype, cast=(0,), reverse=int(win.hi[axis] > 0))


def _pool(b, x, reducer, dtype, shape, win: Window) -> ir.Value | None:
    """MaxPool for integer max/min (min as ~max(~x)), AveragePool times the window size for float sums.

    Float max stays on the general path: ORT's MaxPool skips NaNs and gives
    -FLT_MAX, not -inf, for a window of -infs; XLA's max gives NaN and -inf.
    """
    active = [a for a in range(len(shape)) if win.active(a)]
    if not active or len(active) > 3 or any(win.base_dilation[a] != 1 for a in active):
        return None
    if reducer in ("stablehlo.maximum", "stablehlo.minimum") and dtype.kind in "iu":
        pool_op, compute = "MaxPool", dtype
    elif reducer == "stablehlo.add" and is_float(dtype):
        # AveragePool divides and the product re-multiplies: two roundings, too many for f16.
        pool_op, compute = "AveragePool", np.dtype(np.float32) if dtype.itemsize < 4 else dtype
    else:
        return None
    if not b.target.supports(pool_op, compute):
        return None
    invert = reducer == "stablehlo.minimum"  # ~x reverses the order of signed and unsigned integers alike
    x = b.typed("BitwiseNot", x, dtype=dtype) if invert else b.cast(x, compute)
    fill = b.const(identity("stablehlo.add" if pool_op == "AveragePool" else "stablehlo.maximum", compute))
    # Negative pads crop first; ORT needs pads < kernel, and a dilated window could see padding only.
    x = edge_pad(b, x, [min(p, 0) for p in win.lo], [min(p, 0) for p in win.hi], fill, compute)
    shape = [n + min(lo, 0) + min(hi, 0) for n, lo, hi in zip(shape, win.lo, win.hi)]
    lo, hi = [max(p, 0) for p in win.lo], [max(p, 0) for p in win.hi]
    if any(lo[a] >= win.size[a] or hi[a] >= win.size[a] or (win.dilation[a] > 1 and lo[a] + hi[a]) for a in active) \
            or (pool_op == "MaxPool" and any(lo + hi) and not b.target.supports("MaxPool:padded", compute)):
        x = edge_pad(b, x, lo, hi, fill, compute)
        shape = [n + p + q for n, p, q in zip(shape, lo, hi)]
        lo, hi = [0] * len(shape), [0] * len(shape)
    inactive = [a for a in range(len(shape)) if a not in active]
    perm = inactive + active
    x = transpose_to(b, x, perm)
    lead = dims.dims(b, x, [shape[a] for a in inactive])
    x = reshape_to(b, x, [merged([shape[a] for a in inactive]), 1] + [shape[a] for a in active])
    kernel = [win.size[a] for a in active]
    attrs = dict(kernel_shape=kernel, strides=[win.stride[a] for a in active],
                 pads=[lo[a] for a in active] + [hi[a] for a in active], dilations=[win.dilation[a] for a in active])
    if pool_op == "AveragePool":
        pooled = b.op("AveragePool", x, count_include_pad=1, **attrs)
        pooled = b.cast(b.op("Mul", pooled, b.const(np.asarray(prod(kernel), compute))), dtype)
    else:
        pooled = b.op("MaxPool", x, **attrs)
    out_shape = lead + [
        (shape[a] + lo[a] + hi[a] - win.dilation[a] * (win.size[a] - 1) - 1) // win.stride[a] + 1 for a in active]
    pooled = dims.reshape(b, pooled, out_shape)
    pooled = transpose_to(b, pooled, [int(i) for i in np.argsort(perm)])
    return b.typed("BitwiseNot", pooled, dtype=dtype) if invert else pooled


def _general(b, x, reducer, dtype, shape, win: Window) -> ir.Value:
    fill = b.const(identity(reducer, dtype))
    x, shape = pad_and_dilate(b, x, shape, win, fill, dtype)
    merge = lambda u, v, *_: combine(b, reducer, dtype, u, v)  # noqa: E731 - identity fill: nothing to mask
    for axis in range(len(shape)):
        if shape[axis] < 0 and (win.size[axis] > 1 or win.stride[axis] > 1):
            x = symbolic_window_axis(b, x, merge, axis, win.size[axis], win.stride[axis], win.dilation[axis])
        elif win.size[axis] > 1 or win.stride[axis] > 1:
            x, _ = _window_axis(b, x, merge, axis, shape[axis], win.size[axis], win.stride[axis],
                                win.dilation[axis], None)
    return x


def symbolic_window_axis(b, x, merge, axis, k, stride, dilation) -> ir.Value:
    """_window_axis's direct form along a symbolic axis: element t of every window is the slice from
    t * dilation that stops (extent - 1 - t * dilation) before the end, every `stride`: each holds
    ceil((n - extent + 1) / stride) elements, the window count."""
    extent = dilation * (k - 1) + 1
    result = None
    for t in range(k):
        before_end = extent - 1 - t * dilation
        part = axis_slice(b, x, axis, t * dilation, -before_end if before_end else np.iinfo(np.int64).max, stride)
        result = part if result is None else merge(result, part, axis, None, None)
    return result


def _general_body(ctx: RuleContext, x, init, body, dtype, shape, win: Window) -> ir.Value:
    """Any elementwise body (cumlogsumexp's logaddexp, ...): its identity is unknown, so holes are
    tracked as static per-axis masks and skipped when combining."""
    b = ctx.b
    rank = len(shape)
    apply_body = body_applier(ctx, body)

    def apply(u, v):
        return apply_body([u], [v])[0]

    def merge(u, v, axis, u_ok, v_ok):
        merged = apply(u, v)
        both = u_ok & v_ok
        if both.all():
            return merged
        mask = lambda m: b.const(m.reshape([-1] + [1] * (rank - 1 - axis)))  # noqa: E731
        either = b.typed("Where", mask(u_ok), u, v, dtype=dtype, cast=(1, 2))
        return b.typed("Where", mask(both), merged, either, dtype=dtype, cast=(1, 2))

    # A symbolic axis is never windowed here (reduce_window_with refuses that): one entry stands for all of it.
    valid = [np.ones(n if n >= 0 else 1, bool) for n in shape]
    for axis, factor in enumerate(win.base_dilation):
        if factor > 1 and shape[axis] > 0:
            valid[axis] = np.zeros((shape[axis] - 1) * factor + 1, bool)
            valid[axis][::factor] = True
    for axis, (lo, hi) in enumerate(zip(win.lo, win.hi)):
        valid[axis] = np.pad(valid[axis][max(-lo, 0):len(valid[axis]) - max(-hi, 0)], (max(lo, 0), max(hi, 0)))
    x, shape = pad_and_dilate(b, x, shape, win, init, dtype)
    for axis in range(rank):
        if win.size[axis] > 1 or win.stride[axis] > 1:
            x, valid[axis] = _window_axis(b, x, merge, axis, shape[axis], win.size[axis], win.stride[axis],
                                          win.dilation[axis], valid[axis])
    result = apply(init, x)  # XLA starts each window from init
    if all(v.all() for v in valid):
        return result
    ok = None
    for axis, v in enumerate(valid):
        if not v.all():
            part = b.const(v.reshape([-1] + [1] * (rank - 1 - axis)))
            ok = part if ok is None else b.op("And", ok, part)
    return b.typed("Where", ok, result, init, dtype=dtype, cast=(1, 2))


def _window_axis(b, x, merge, axis, n, k, stride, dilation, valid):
    """Valid windows of `k` elements `dilation` apart, every `stride`, merged along one axis.

    `valid` (per position, or None for all) follows the values through the merges.
    """
    extent = dilation * (k - 1) + 1
    out = max(0, (n - extent) // stride + 1)
    ok = np.ones(n, bool) if valid is None else valid
    if out == 0:
        return axis_slice(b, x, axis, 0, 0), ok[:0]

    def merge_ok(u, v, u_ok, v_ok):
        return merge(u, v, axis, u_ok, v_ok), u_ok | v_ok

    if k <= DIRECT_WINDOW:
        result = result_ok = None
        for t in range(k):
            stop = t * dilation + (out - 1) * stride + 1
            part, part_ok = axis_slice(b, x, axis, t * dilation, stop, stride), ok[t * dilation:stop:stride]
            result, result_ok = (part, part_ok) if result is None else merge_ok(result, part, result_ok, part_ok)
        return result, result_ok
    # Doubling: block[m][i] merges x[i + u*dilation] for u < m; a window is a sum of power-of-two blocks.
    length = n - extent + 1  # windows at stride 1
    result = result_ok = None
    offset, block, block_ok, m = 0, x, ok, 1
    while True:
        if k & m:
            start = offset * dilation
            part, part_ok = axis_slice(b, block, axis, start, start + length), block_ok[start:start + length]
            result, result_ok = (part, part_ok) if result is None else merge_ok(result, part, result_ok, part_ok)
            offset += m
        if 2 * m > k:
            break
        shift, size = m * dilation, len(block_ok)
        block, block_ok = merge_ok(axis_slice(b, block, axis, 0, size - shift), axis_slice(b, block, axis, shift, size),
                                   block_ok[:size - shift], block_ok[shift:])
        m *= 2
    if stride > 1:
        result, result_ok = axis_slice(b, result, axis, 0, (out - 1) * stride + 1, stride), result_ok[::stride]
    return result, result_ok
