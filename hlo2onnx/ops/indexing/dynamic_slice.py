"""dynamic_slice and dynamic_update_slice, with XLA's out-of-bounds rule: each start index is clamped so the
window fits (the start-index helpers are those of gather and scatter, plan.py)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx_ir as ir

from hlo2onnx.ops.core import dims as symbolic
from hlo2onnx.ops.core.shape import reshape_to, transpose_to
from hlo2onnx.ops.indexing.plan import I64, clamp_starts, start_bounds, window_offsets
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
    # A symbolic update dim is a window of run-time size, even in a symbolic operand dim: it may be a smaller
    # dim (an update of (b, s) into (b, t)), which taken as the whole dim would give the update back.
    dims = [d for d, (n, k) in enumerate(zip(shape, upd_shape)) if n < 0 or k != n]
    if not dims:
        return b.op("Identity", update)  # every start clamps to 0
    rest = [d for d in range(len(shape)) if d not in dims]
    sizes = symbolic.dims(b, update, upd_shape)
    begin = _start_vector(b, [starts[d] for d in dims], start_bounds(b, x, shape, sizes, dims))
    idx = window_offsets(b, begin, [], [sizes[d] for d in dims])
    perm = dims + rest
    moved = transpose_to(b, update, perm)
    wide = [i for i, d in enumerate(dims) if not 0 <= upd_shape[d] <= 1] + list(range(len(dims), len(shape)))
    if symbolic.is_static(upd_shape):
        updates = reshape_to(b, moved, [upd_shape[perm[i]] for i in wide])
    else:  # the update's own symbolic sizes
        updates = symbolic.reshape(b, moved, [symbolic.dim(b, moved, i, upd_shape[perm[i]]) for i in wide])
    result = b.op("ScatterND", transpose_to(b, x, perm), idx, updates)
    return transpose_to(b, result, np.argsort(perm).tolist())
