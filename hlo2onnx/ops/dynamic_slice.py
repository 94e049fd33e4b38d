"""dynamic_slice and dynamic_update_slice, with XLA's out-of-bounds rule: each start index is clamped so the
window fits (the start-index helpers are gather's and scatter's, ops/indexing.py)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx_ir as ir

from hlo2onnx.ops import dims as symbolic
from hlo2onnx.ops.indexing import I64, clamp_starts, start_bounds, window_offsets
from hlo2onnx.ops.shape import reshape_to, transpose_to
from hlo2onnx.registry import allow_dynamic, register
from hlo2onnx.translator import RuleContext


def _start_vector(b, starts: Sequence[ir.Value], high: Sequence[int]) -> ir.Value:
    column = [reshape_to(b, b.cast(x, I64), [1]) for x in starts]
    return clamp_starts(b, column[0] if len(column) == 1 else b.op("Concat", *column, axis=0), high)


allow_dynamic("stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice")


def _narrower(shape: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """The dims a window of `sizes` covers only in part: smaller than a static dim, or static in a symbolic one
    (a symbolic size in a symbolic dim is jax's whole-dim window)."""
    return [d for d, (n, k) in enumerate(zip(shape, sizes)) if (k < n if n >= 0 else k >= 0)]


@register("stablehlo.dynamic_slice")
def dynamic_slice(ctx: RuleContext, x, *starts, slice_sizes):
    b = ctx.b
    shape = ctx.in_types[0].shape
    if symbolic.is_static(shape) and ctx.out_type.size == 0:
        return b.splat(0, ctx.out_type.dtype, ctx.out_type.shape)
    axes = _narrower(shape, slice_sizes)
    if not axes:
        return b.op("Identity", x)  # every start clamps to 0
    begin = _start_vector(b, [starts[d] for d in axes], start_bounds(b, x, shape, slice_sizes, axes))
    end = b.op("Add", begin, b.shape_const([slice_sizes[d] for d in axes]))
    return b.op("Slice", x, begin, end, b.shape_const(axes))


@register("stablehlo.dynamic_update_slice")
def dynamic_update_slice(ctx: RuleContext, x, update, *starts):
    b = ctx.b
    shape, upd_shape = ctx.in_types[0].shape, ctx.in_types[1].shape
    if symbolic.is_static(upd_shape) and ctx.in_types[1].size == 0:
        return b.op("Identity", x)
    if not symbolic.is_static(upd_shape):
        return _update_by_mask(b, x, update, starts, shape, upd_shape, ctx.out_type.dtype)
    dims = _narrower(shape, upd_shape)
    if not dims:
        return b.op("Identity", update)  # every start clamps to 0
    rest = [d for d in range(len(shape)) if d not in dims]
    begin = _start_vector(b, [starts[d] for d in dims], start_bounds(b, x, shape, upd_shape, dims))
    idx = window_offsets(b, begin, [], [upd_shape[d] for d in dims])
    perm = dims + rest
    moved = transpose_to(b, update, perm)
    wide = [upd_shape[d] for d in dims if upd_shape[d] > 1] + [shape[d] for d in rest]
    if symbolic.is_static(wide):
        updates = reshape_to(b, moved, wide)
    else:  # the update's own symbolic sizes (its windowed dims are static and lead)
        kept = [i for i, d in enumerate(dims) if upd_shape[d] > 1] + list(range(len(dims), len(shape)))
        updates = symbolic.reshape(b, moved, [symbolic.dim(b, moved, i, ([upd_shape[d] for d in perm])[i])
                                              for i in kept])
    result = b.op("ScatterND", transpose_to(b, x, perm), idx, updates)
    return transpose_to(b, result, np.argsort(perm).tolist())


def _update_by_mask(b, x, update, starts: Sequence[ir.Value], shape: Sequence[int], upd_shape: Sequence[int],
                    dtype: np.dtype) -> ir.Value:
    """dynamic_update_slice of an update with symbolic dims: the update padded out to the operand's shape at
    the clamped starts, and a mask padded alike choosing it. A symbolic update dim in a symbolic operand dim
    may be a different, smaller dim (x of (b, t), u of (b, s)), so its extent is read at run time too."""
    lo: list[symbolic.Dim] = []
    hi: list[symbolic.Dim] = []
    for d, (n, k) in enumerate(zip(shape, upd_shape)):
        if n >= 0 and k == n:  # a static whole dim (a complex value's pair axis too, which has no start)
            lo.append(0)
            hi.append(0)
            continue
        high = symbolic.difference(b, symbolic.dim(b, x, d, n), symbolic.dim(b, update, d, k))
        begin = _start_vector(b, [starts[d]], [high])
        lo.append(begin)
        hi.append(symbolic.difference(b, high, begin))
    pads = symbolic.shape_value(b, lo + hi)
    padded = b.typed("Pad", update, pads, b.const(np.zeros((), dtype)), dtype=dtype, cast=(0, 2), mode="constant")
    inside = b.op("ConstantOfShape", b.op("Shape", update), value=ir.tensor(np.ones(1, np.bool_)))
    mask = b.typed("Pad", inside, pads, b.const(np.zeros((), np.bool_)), dtype=np.dtype(np.bool_), cast=(0, 2),
                   mode="constant")
    return b.typed("Where", mask, padded, x, dtype=dtype, cast=(1, 2))
