"""stablehlo.dynamic_reduce_window: reduce_window whose window attributes are tensors (symbolic dims).

Where the graph holds them as constants it is the static reduce_window. jax's
cumulative reductions over a symbolic axis (window = the axis, padded by its
length - 1 on one side) become CumSum for sums, and otherwise a doubling scan
in an ONNX Loop: log2(n) steps, each combining the running result with itself
shifted by 1, 2, 4, ... elements (Hillis-Steele), since n is known only at run time.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir

from hlo2onnx.builder import graph_input
from hlo2onnx.ops.core import dims
from hlo2onnx.ops.core.reduce import is_constant, single_reducer
from hlo2onnx.ops.window.reduce_window import reduce_window_with, symbolic_window_axis
from hlo2onnx.ops.window.windows import COMBINE, DIRECT_WINDOW, Window, combine, identity
from hlo2onnx.registry import register_custom_call
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, is_bool

_SCALAR_I64 = TensorType((), np.dtype(np.int64))
_SCALAR_BOOL = TensorType((), np.dtype(np.bool_))
_SHIFT = TensorType((1,), np.dtype(np.int64))
_INT64_MAX = np.iinfo(np.int64).max


@register_custom_call("stablehlo.dynamic_reduce_window", dynamic=True)
def dynamic_reduce_window(ctx: RuleContext, x, init, window, strides, base_dilations, window_dilations, padding,
                          **_config):
    """jax's reduce_window with window attributes as tensors (symbolic dims): the static form where the graph
    holds them as constants, else jax's cumulative reductions over a symbolic axis: CumSum, or the doubling
    scan. That form is read from its shape (one symbolic window, padded by a symbolic amount on one side and
    nothing else): jax's cumsum/cummax/cumprod are what emit a symbolic window, as the axis' length."""
    if len(ctx.in_types) != 7:
        raise NotImplementedError("variadic dynamic_reduce_window")
    rank = ctx.in_types[0].rank
    callee = mlir.FlatSymbolRefAttr(mlir.ArrayAttr(ctx.hlo_op.attributes["called_computations"])[0]).value
    body = ctx.translator.functions[callee].regions[0].blocks[0]
    size, stride, base, dilation = (dims.known_entries(v, rank) for v in (window, strides, base_dilations,
                                                                            window_dilations))
    pads = dims.known_entries(padding, 2 * rank)
    if None not in size + stride + base + dilation + pads:
        win = Window.read(size, stride, pads, base, dilation)
        dims.refuse(ctx, [a for a in range(rank) if win.active(a)], "a window over a symbolic dimension")
        return reduce_window_with(ctx, x, init, body, win)
    reducer, dtype = single_reducer(body), ctx.out_type.dtype
    if None not in size + stride + base + dilation:
        return _padded_by_tensor(ctx, x, init, padding, reducer, Window.read(size, stride, None, base, dilation))
    unknown = [a for a in range(rank) if None in (size[a], pads[2 * a], pads[2 * a + 1])]
    axis = unknown[0]
    lo, hi = pads[2 * axis], pads[2 * axis + 1]
    plain = all(v == 1 for v in stride + base + dilation) and all(
        size[a] == 1 and pads[2 * a] == pads[2 * a + 1] == 0 for a in range(rank) if a != axis)
    if len(unknown) != 1 or not plain or size[axis] is not None or (lo, hi) not in ((None, 0), (0, None)):
        raise NotImplementedError("dynamic_reduce_window: a window of symbolic size that is not a cumulative "
                                  "reduction")
    if reducer not in COMBINE:
        raise NotImplementedError(f"dynamic_reduce_window: a cumulative reduction by "
                                  f"{reducer or 'a body of several ops'} over a symbolic dimension")
    b = ctx.b
    if reducer == "stablehlo.add" and not is_bool(dtype):
        result = b.typed("CumSum", x, b.const(np.int64(axis)), dtype=dtype, cast=(0,), reverse=int(hi is None))
    else:
        result = _doubling_scan(ctx, x, reducer, axis, hi is None)
    return result if is_constant(init, identity(reducer, dtype)) else combine(b, reducer, dtype, result, init)


def _padded_by_tensor(ctx: RuleContext, x, init, padding, reducer, win: Window) -> ir.Value:
    """A static window over an input padded by amounts known at run time (jax's SAME padding of a symbolic
    image size): Pad with the reducer's identity, then strided slices counted from the end."""
    rank, dtype = ctx.in_types[0].rank, ctx.out_type.dtype
    active = [a for a in range(rank) if win.active(a) or ctx.in_types[0].shape[a] < 0]
    if reducer not in COMBINE or any(win.base_dilation[a] > 1 or win.size[a] > DIRECT_WINDOW for a in active):
        dims.refuse(ctx, range(rank), f"a window padded by a symbolic amount (by {reducer}, base dilation, or "
                                      f"wider than {DIRECT_WINDOW})")
    b = ctx.b
    # (rank, 2) low/high pairs -> ONNX's [lows..., highs...]
    pads = b.op("Reshape", b.op("Transpose", b.cast(padding, np.int64), perm=[1, 0]), b.shape_const([-1]))
    x = b.typed("Pad", x, pads, b.const(identity(reducer, dtype)), dtype=dtype, cast=(0, 2), mode="constant")
    merge = lambda u, v, *_: combine(b, reducer, dtype, u, v)  # noqa: E731
    for axis in range(rank):
        if win.size[axis] > 1 or win.stride[axis] > 1:
            x = symbolic_window_axis(b, x, merge, axis, win.size[axis], win.stride[axis], win.dilation[axis])
    return x if is_constant(init, identity(reducer, dtype)) else combine(b, reducer, dtype, x, init)


def _doubling_scan(ctx: RuleContext, x: ir.Value, reducer: str, axis: int, reverse: bool) -> ir.Value:
    """Inclusive prefix (suffix when `reverse`) reduction along `axis`: y = y op shift(y, s) for s = 1, 2, 4 ..."""
    b = ctx.b
    ttype, dtype = ctx.in_types[0], ctx.out_type.dtype
    rank = ttype.rank
    n = b.op("Shape", x, start=axis, end=axis + 1)
    fill = b.const(identity(reducer, dtype))
    sb = b.subgraph("cumulative")
    iteration, cond_in, y, shift = (graph_input(t) for t in (_SCALAR_I64, _SCALAR_BOOL, ttype, _SHIFT))
    where = rank + axis if reverse else axis  # pad after the data for a suffix scan, before it for a prefix
    pads = [sb.shape_const([0] * where), shift, sb.shape_const([0] * (2 * rank - where - 1))]
    padded = sb.typed("Pad", y, sb.op("Concat", *[p for p in pads if p.shape is None or p.shape[0]], axis=0),
                      fill, dtype=dtype, cast=(0, 2), mode="constant")
    start = shift if reverse else sb.shape_const([0])
    end = sb.shape_const([_INT64_MAX]) if reverse else n
    shifted = sb.op("Slice", padded, start, end, sb.shape_const([axis]))
    merged = combine(sb, reducer, dtype, y, shifted)
    doubled = sb.op("Mul", shift, sb.shape_const([2]))
    more = sb.op("Squeeze", sb.op("Less", doubled, n))
    graph = sb.finish_subgraph([iteration, cond_in, y, shift], [more, merged, doubled],
                               [_SCALAR_BOOL, ttype, _SHIFT])
    first = b.op("Squeeze", b.op("Less", b.shape_const([1]), n))
    result, _ = b.ops("Loop", None, first, x, b.shape_const([1]), body=graph, num_outputs=2)
    return result
