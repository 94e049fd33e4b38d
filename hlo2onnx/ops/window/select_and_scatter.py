"""stablehlo.select_and_scatter (the gradient of max pooling): each window's pick selected as XLA does, then
`source` scattered onto the picks with ScatterElements' reduction."""
from __future__ import annotations

from math import prod

import numpy as np
import onnx_ir as ir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.ops.core import dims
from hlo2onnx.ops.core.reduce import single_reducer
from hlo2onnx.ops.core.shape import reshape_to, transpose_to
from hlo2onnx.ops.window.windows import Window, axis_slice, edge_pad
from hlo2onnx.registry import allow_dynamic, register
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import is_float

_SELECT = {"GE": "GreaterOrEqual", "GT": "Greater", "LE": "LessOrEqual", "LT": "Less"}
_SCATTER = {"stablehlo.add": "add", "stablehlo.multiply": "mul", "stablehlo.maximum": "max",
            "stablehlo.minimum": "min"}
# On bool, add and or are max, multiply and and are min (StableHLO's bool add is or); computed on int32.
_BOOL_SCATTER = {"stablehlo.add": "max", "stablehlo.or": "max", "stablehlo.maximum": "max",
                 "stablehlo.multiply": "min", "stablehlo.and": "min", "stablehlo.minimum": "min"}


allow_dynamic("stablehlo.select_and_scatter")


@register("stablehlo.select_and_scatter")
def select_and_scatter(ctx: RuleContext, operand, source, init, *, window_dimensions, window_strides=None,
                       padding=None):
    """Selects each window's element as XLA does (row-major, keep the pick while `select(pick, next)`),
    then scatters `source` onto the picks with ScatterElements' reduction."""
    select_op = _select_compare(ctx.hlo_op.regions[0].blocks[0])
    reducer = single_reducer(ctx.hlo_op.regions[1].blocks[0])
    bool_ = ctx.out_type.dtype == np.bool_
    scatter = (_BOOL_SCATTER if bool_ else _SCATTER).get(reducer)
    if select_op is None or scatter is None:
        raise NotImplementedError("select_and_scatter with a select other than one compare, "
                                  "or a scatter other than add/mul/max/min")
    b = ctx.b
    shape, src_shape = list(ctx.in_types[0].shape), list(ctx.in_types[1].shape)
    win = Window.read(window_dimensions, window_strides, padding)
    symbolic = [a for a in range(len(shape)) if shape[a] < 0]
    if not symbolic:
        return _scatter_picks(b, operand, source, init, shape, src_shape, win, select_op, scatter, ctx.out_type.dtype)
    dims.refuse(ctx, [a for a in symbolic if win.active(a)], "a window along a symbolic dim")
    # The symbolic dims (a batch) pass through the windows: moved in front and merged into one axis of rows,
    # each row scatters onto its own picks (ScatterElements along the flattened window axes).
    rest = [a for a in range(len(shape)) if a not in symbolic]
    perm = symbolic + rest
    moved = transpose_to(b, operand, perm)
    rows = reshape_to(b, moved, [-1] + [shape[a] for a in rest])
    src_rows = reshape_to(b, transpose_to(b, source, perm), [-1] + [src_shape[a] for a in rest])
    def lead(field, value):  # the window along the rows: one element, no stride, no padding
        return (value,) + tuple(field[a] for a in rest)

    rows_win = Window(lead(win.size, 1), lead(win.stride, 1), lead(win.lo, 0), lead(win.hi, 0),
                      lead(win.base_dilation, 1), lead(win.dilation, 1))
    out = _scatter_picks(b, rows, src_rows, init, [-1] + [shape[a] for a in rest],
                         [-1] + [src_shape[a] for a in rest], rows_win, select_op, scatter, ctx.out_type.dtype)
    out = b.op("Reshape", out, b.op("Shape", moved), allowzero=1)
    return transpose_to(b, out, np.argsort(perm).tolist())


def _scatter_picks(b, operand, source, init, shape, src_shape, win: Window, select_op: str, scatter: str,
                   dtype: np.dtype) -> ir.Value:
    """select_and_scatter over static shapes, or over a first axis of rows of symbolic size (-1) that no
    window spans: the picks are then indexed within each row, and each row scattered along axis 1."""
    rank = len(shape)
    rows = shape[0] < 0
    first = 1 if rows else 0
    bool_ = dtype == np.bool_
    padded = edge_pad(b, operand, win.lo, win.hi, b.const(np.zeros((), dtype)), dtype)
    flat_strides = [prod(shape[a + 1:]) for a in range(rank)]
    src_dims = b.op("Shape", source) if rows else None  # static: a constant, made where first used
    has_padding = any(win.lo) or any(win.hi)
    best = best_off = best_ok = None
    for t in np.ndindex(*win.size):
        starts = list(t)
        ends = [s + (j - 1) * st + 1 for s, j, st in zip(starts, src_shape, win.stride)]
        if rows:
            ends[0] = np.iinfo(np.int64).max  # the whole axis of rows
        cand = b.op("Slice", padded, b.shape_const(starts), b.shape_const(ends), b.shape_const(range(rank)),
                    b.shape_const(win.stride))
        off = b.const(np.int64(sum(ti * fs for ti, fs in zip(t[first:], flat_strides[first:]))))
        valid = _valid_mask(b, t, shape, src_shape, win, src_dims) if has_padding else None
        if best is None:
            best, best_off, best_ok = cand, b.op("Expand", off, _spelled(b, src_shape, src_dims)), valid
            continue
        take = b.op("Not", b.typed(select_op, best, cand, dtype=dtype, result_dtype=np.bool_))
        if valid is not None:
            take = b.op("And", valid, b.op("Or", b.op("Not", best_ok), take))
            best_ok = b.op("Or", best_ok, valid)
        best = b.typed("Where", take, cand, best, dtype=dtype, cast=(1, 2))
        best_off = b.op("Where", take, off, best_off)
    # Flat index of each pick in the unpadded operand (in its row); windows that saw padding only go to a
    # dummy slot.
    index = best_off
    for a in range(first, rank):
        base = (np.arange(src_shape[a], dtype=np.int64) * win.stride[a] - win.lo[a]) * flat_strides[a]
        index = b.op("Add", index, b.const(base.reshape([-1] + [1] * (rank - 1 - a))))
    size = prod(shape[first:])
    if best_ok is not None:
        index = b.op("Where", best_ok, index, b.const(np.int64(size)))
    flat = [-1, prod(src_shape[1:])] if rows else [-1]
    index = reshape_to(b, index, flat)
    # Measured: ORT 1.31 has no f16 ScatterElements kernel for reduction add/mul (nor bf16 for any).
    compute = np.dtype(np.float32) if dtype.itemsize < 4 and is_float(dtype) else dtype
    compute = np.dtype(np.int32) if bool_ else compute
    init = b.cast(reshape_to(b, init, [1] * len(flat)), compute)
    slots = dims.shape_value(b, [b.op("Shape", source, start=0, end=1), size + int(has_padding)]) if rows \
        else b.shape_const([size + int(has_padding)])
    data = b.op("Expand", init, slots)
    updates = b.cast(reshape_to(b, source, flat), compute)
    result = b.op("ScatterElements", data, index, updates, axis=first, reduction=scatter)
    if has_padding:
        result = axis_slice(b, result, first, 0, size)
    return reshape_to(b, b.cast(result, dtype), shape)


def _select_compare(body) -> str | None:
    ops = list(body.operations)
    if len(ops) != 2 or ops[0].operation.name != "stablehlo.compare" or list(ops[0].operands) != list(body.arguments):
        return None
    attrs = ops[0].attributes
    if "compare_type" in attrs and stablehlo.ComparisonTypeAttr(attrs["compare_type"]).value == "TOTALORDER":
        return None
    return _SELECT.get(stablehlo.ComparisonDirectionAttr(attrs["comparison_direction"]).value)


def _spelled(b, shape, value: ir.Value | None) -> ir.Value:
    return b.shape_const(shape) if value is None else value


def _valid_mask(b, t, shape, src_shape, win: Window, src_dims: ir.Value | None) -> ir.Value:
    """Where window offset `t` lands inside the unpadded operand, for every window (`src_dims`: their shape,
    read from the graph where it is symbolic)."""
    mask = None
    for a in range(len(shape)):
        if not win.active(a):  # no window, no padding: always inside (and the size may be symbolic)
            continue
        pos = np.arange(src_shape[a]) * win.stride[a] + t[a] - win.lo[a]
        inside = (pos >= 0) & (pos < shape[a])
        if inside.all():
            continue
        part = b.const(inside.reshape([-1] + [1] * (len(shape) - 1 - a)))
        mask = part if mask is None else b.op("And", mask, part)
    if mask is None:
        return b.op("Expand", b.const(np.bool_(True)), _spelled(b, src_shape, src_dims))
    return b.op("Expand", mask, _spelled(b, src_shape, src_dims))
