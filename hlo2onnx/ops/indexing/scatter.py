"""scatter, with XLA's out-of-bounds rule: every update whose window does not fit is skipped.

Bodies that ONNX's reductions express (replace, add, mul, max, min) become one ScatterElements/ScatterND by the
plan in plan.py; any other body runs one index row at a time, in order (`_scatter_in_order`).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import onnx_ir as ir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.builder import Builder
from hlo2onnx.ops.control.loops import loop, loop_step
from hlo2onnx.ops.core import dims as symbolic
from hlo2onnx.ops.core.reduce import single_reducer
from hlo2onnx.ops.core.shape import reshape_to, transpose_to
from hlo2onnx.ops.indexing.plan import (I64, Starts, arrange, axis_labels, bounds_value, crop, elements_form,
                                        operand_order, read_starts, single_column, start_bounds, starts_fit,
                                        window_offsets, with_batching_columns)
from hlo2onnx.ops.window.windows import body_applier
from hlo2onnx.registry import allow_dynamic, register
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, is_bool, is_float

allow_dynamic("stablehlo.scatter")

# (builder, current slice, update slice) -> the combined slice: a scatter body no ONNX reduction expresses.
Combine = Callable[[Builder, ir.Value, ir.Value], ir.Value]


_REDUCTIONS = {"stablehlo.add": "add", "stablehlo.multiply": "mul", "stablehlo.maximum": "max",
               "stablehlo.minimum": "min", "stablehlo.or": "max", "stablehlo.and": "min"}


def _reduction(body, dtype: np.dtype, strict: bool = True) -> str | None:
    """ONNX's `reduction` for a scatter body: "none" when it returns the update, else the combining op;
    for another body, an error (or None when not `strict`)."""
    ops = list(body.operations)
    if len(ops) == 1 and list(ops[0].operands) == [body.arguments[1]]:
        return "none"
    reducer = single_reducer(body)
    if reducer not in _REDUCTIONS or (reducer in ("stablehlo.or", "stablehlo.and") and not is_bool(dtype)):
        if not strict:
            return None
        raise NotImplementedError(f"scatter with body {[op.operation.name for op in ops]}")
    return _REDUCTIONS[reducer]


def _neutral(reduction: str, dtype: np.dtype):
    """The update that leaves an element unchanged (-0.0 keeps a -0.0 operand for add)."""
    if reduction == "add":
        return -0.0 if is_float(dtype) else 0
    if reduction == "mul":
        return 1
    big = np.inf if is_float(dtype) else (True if is_bool(dtype) else np.iinfo(dtype).max)
    small = -np.inf if is_float(dtype) else (False if is_bool(dtype) else np.iinfo(dtype).min)
    return small if reduction == "max" else big


def _scatter_node(b, op: str, data, idx, updates, dtype: np.dtype, reduction: str, **attrs) -> ir.Value:
    # The support table keys reductions as "ScatterND:add": ORT lacks some only for some reductions.
    compute = b.target.compute_dtype(op if reduction == "none" else f"{op}:{reduction}", dtype)
    out = b.op(op, b.cast(data, compute), idx, b.cast(updates, compute), reduction=reduction, **attrs)
    out = b.cast(out, dtype)
    if reduction in ("min", "max") and is_float(dtype):
        out = _propagate_nan(b, op, data, idx, updates, out, dtype, **attrs)
    return out


def _propagate_nan(b, op: str, data, idx, updates, out, dtype: np.dtype, **attrs) -> ir.Value:
    """XLA's min/max propagate NaN; ORT's scatter reductions let a later number replace a NaN.

    An element is NaN if it was, or if any NaN update reached it (found by a second, uint8 scatter-max).
    """
    nan_updates = b.cast(b.typed("IsNaN", updates, dtype=dtype, result_dtype=np.bool_), np.uint8)
    zeros = b.op("ConstantOfShape", b.op("Shape", data), value=ir.tensor(np.zeros(1, np.uint8)))
    hit = b.op(op, zeros, idx, nan_updates, reduction="max", **attrs)
    poisoned = b.op("Or", b.typed("IsNaN", data, dtype=dtype, result_dtype=np.bool_), b.cast(hit, np.bool_))
    return b.typed("Where", poisoned, b.const(np.asarray(np.nan, dtype)), out, dtype=dtype, cast=(1, 2))


def _skip_invalid(b, matrix, updates, valid, extra_axes: int, reduction: str, dtype: np.dtype,
                  trash: Sequence[symbolic.Dim]):
    """Neutralizes the updates whose window does not fit (XLA skips them).

    `valid` has the matrix's shape less its last axis, and the updates' less `extra_axes` trailing axes.
    A reduction gets the neutral update at start 0; "none" is sent to `trash`, a row past the
    operand's end that the caller pads on and crops off.
    """
    if valid is None:
        return matrix, updates
    valid_m = b.op("Unsqueeze", valid, b.shape_const([-1]))
    if reduction == "none":
        return b.op("Where", valid_m, matrix, bounds_value(b, trash)), updates
    valid_u = b.op("Unsqueeze", valid, b.shape_const(list(range(-extra_axes, 0)))) if extra_axes else valid
    neutral = b.const(np.asarray(_neutral(reduction, dtype), dtype))
    updates = b.typed("Where", valid_u, updates, neutral, dtype=dtype, cast=(1, 2))
    return b.op("Where", valid_m, matrix, b.const(np.zeros(1, I64))), updates


def _pad_end(b, x: ir.Value, rank: int, axis: int, size: symbolic.Dim, dtype: np.dtype) -> ir.Value:
    pads: list[symbolic.Dim] = [0] * (2 * rank)
    pads[rank + axis] = size
    return b.typed("Pad", x, symbolic.shape_value(b, pads), dtype=dtype, cast=(0,), mode="constant")


@register("stablehlo.scatter")
def scatter(ctx: RuleContext, *args, scatter_dimension_numbers, indices_are_sorted=False, unique_indices=False,
            combine: Combine | None = None):
    """`combine` (for callers like the complex rules, never from an attribute): apply the updates one index row
    at a time, in order, combining each with the slice it lands on, as XLA on CPU does."""
    # The hints change nothing here: ORT's kernels take no such promise.
    if len(args) != 3:
        raise NotImplementedError(f"scatter of {len(args) // 2} operands at once")
    operand, indices, updates = args
    dn = stablehlo.ScatterDimensionNumbers(scatter_dimension_numbers)
    b = ctx.b
    dtype = ctx.out_type.dtype
    body = ctx.hlo_op.regions[0].blocks[0]
    if combine is None and _reduction(body, dtype, strict=False) is None:
        # A body no ONNX reduction expresses (x * 2 + y, ...): applied as written, one row at a time.
        apply = body_applier(ctx, body)
        combine = lambda sb, current, update: apply([current], [update], sb)[0]  # noqa: E731
    reduction = "none" if combine else _reduction(body, dtype)
    shape, upd_shape = ctx.in_types[0].shape, ctx.in_types[2].shape
    rank = len(shape)
    no_window = set(dn.inserted_window_dims) | set(dn.input_batching_dims)
    window_dims = [d for d in range(rank) if d not in no_window]
    window = [1] * rank
    for d, axis in zip(window_dims, dn.update_window_dims):
        window[d] = upd_shape[axis]
    static = symbolic.is_static(shape) and symbolic.is_static(upd_shape)
    if static and (ctx.in_types[2].size == 0 or ctx.out_type.size == 0 or any(w > n for w, n in zip(window, shape))):
        return b.op("Identity", operand)  # no update window fits anywhere
    s = read_starts(b, indices, ctx.in_types[1].shape, dn.index_vector_dim, dn.scattered_dims_to_operand_dims,
                dn.input_batching_dims, dn.scatter_indices_batching_dims)
    window: list[symbolic.Dim] = list(window)
    for d, axis in zip(window_dims, dn.update_window_dims):
        if d in s.dims and window[d] < 0:  # an indexed window of symbolic size (x.at[:, 1:]): its run-time size
            window[d] = symbolic.dim(b, updates, axis, -1)
    valid = starts_fit(b, s, start_bounds(b, operand, shape, window, s.dims))
    # The operand's sizes, symbolic ones read from the graph (where the trash row and crop need them).
    sizes = symbolic.dims(b, operand, shape) if not static else list(shape)
    labels = axis_labels(len(upd_shape), dn.update_window_dims, window_dims)

    elements = None if combine else elements_form(s, rank, window)
    if elements is not None:
        axis, order = elements
        updates = arrange(b, updates, labels, [("b", j) for j in range(len(s.batch))], s.batch)
        matrix, updates = _skip_invalid(b, s.matrix, updates, valid, 0, reduction, dtype, [sizes[axis]])
        idx = operand_order(b, single_column(b, Starts(matrix, s.batch, s.dims, s.pairs, None)), s.batch, order)
        updates = operand_order(b, updates, s.batch, order)
        padded = valid is not None and reduction == "none"
        data = _pad_end(b, operand, rank, axis, 1, dtype) if padded else operand
        result = _scatter_node(b, "ScatterElements", data, idx, updates, dtype, reduction, axis=axis)
        return crop(b, result, [n + (d == axis) if n >= 0 else -1 for d, n in enumerate(shape)], sizes, [axis]) \
            if padded else result

    matrix, dims = with_batching_columns(b, s)
    # Dims the windows cover only in part are indexed too, from 0.
    # (A symbolic window over a symbolic dim is jax's whole-dim slice.)
    partial = [d for d in range(rank) if d not in dims and (window[d] < shape[d] or window[d] >= 0 > shape[d])]
    if partial and symbolic.is_static(s.batch):
        zeros = b.splat(0, I64, s.batch + [len(partial)])
        matrix = b.op("Concat", matrix, zeros, axis=-1)
    elif partial:
        zeros = b.op("ConstantOfShape", symbolic.shape_value(b, symbolic.dims(b, matrix, s.batch) + [len(partial)]),
                     value=ir.tensor(np.zeros(1, I64)))
        matrix = b.op("Concat", matrix, zeros, axis=-1)
    dims = dims + partial
    if not dims:
        return _scatter_whole(b, operand, updates, labels, s.batch, shape, reduction, combine, dtype)
    rest = [d for d in range(rank) if d not in dims]
    wide = [d for d in dims if not isinstance(window[d], int) or window[d] > 1]
    target = [("b", j) for j in range(len(s.batch))] + [("o", d) for d in wide] + [("o", d) for d in rest]
    out_shape = s.batch + [window[d] if isinstance(window[d], int) else -1 for d in wide] + [shape[d] for d in rest]
    updates = arrange(b, updates, labels, target, out_shape)
    trash = [sizes[dims[0]]] + [0] * (len(dims) - 1)
    extra = len(out_shape) - len(s.batch)
    matrix, updates = _skip_invalid(b, matrix, updates, valid, extra, reduction, dtype, trash)
    idx = window_offsets(b, matrix, s.batch, [window[d] for d in dims])
    data = transpose_to(b, operand, dims + rest)
    padded = valid is not None and reduction == "none"
    if padded:
        data = _pad_end(b, data, rank, 0, window[dims[0]], dtype)
    if combine is None:
        result = _scatter_node(b, "ScatterND", data, idx, updates, dtype, reduction)
    elif not static:
        raise NotImplementedError("a scatter body no ONNX reduction expresses, over symbolic dimensions")
    else:
        data_shape = [shape[d] + (window[d] if padded and i == 0 else 0) for i, d in enumerate(dims + rest)]
        count = int(np.prod(out_shape[:len(out_shape) - len(rest)]))
        result = _scatter_in_order(b, data, idx, updates, combine, data_shape, len(dims), count, dtype)
    if padded:
        result = crop(b, result, [shape[dims[0]] + window[dims[0]] if static else -1], [sizes[dims[0]]], [0])
    return transpose_to(b, result, np.argsort(dims + rest).tolist())


def _scatter_whole(b: Builder, operand: ir.Value, updates: ir.Value, labels: list, batch: list, shape: list,
                   reduction: str, combine: Combine | None, dtype: np.dtype) -> ir.Value:
    """A scatter without index columns (`x.at[...].set(y)`): every window is the whole operand. The operand gets
    a leading unit axis that every update row indexes at 0, so ScatterND applies them as XLA does."""
    if not symbolic.is_static(batch):
        raise NotImplementedError("scatter without index columns over symbolic batch dimensions")
    rank = len(shape)
    updates = arrange(b, updates, labels, [("b", j) for j in range(len(batch))] + [("o", d) for d in range(rank)],
                       batch + list(shape))
    data = b.op("Unsqueeze", operand, b.shape_const([0]))
    idx = b.splat(0, I64, batch + [1])
    if combine is None:
        result = _scatter_node(b, "ScatterND", data, idx, updates, dtype, reduction)
    elif not symbolic.is_static(shape):
        raise NotImplementedError("a scatter body no ONNX reduction expresses, over symbolic dimensions")
    else:
        result = _scatter_in_order(b, data, idx, updates, combine, [1, *shape], 1, int(np.prod(batch)), dtype)
    return b.op("Squeeze", result, b.shape_const([0]))


def _scatter_in_order(b: Builder, data: ir.Value, idx: ir.Value, updates: ir.Value, combine: Combine,
                      data_shape: list[int], k: int, count: int, dtype: np.dtype) -> ir.Value:
    """ScatterND's `count` rows of `k` indices applied one at a time in a Loop: data[i] = combine(data[i], u)."""
    slice_shape = data_shape[k:]
    rows = reshape_to(b, idx, [count, k])
    slices = reshape_to(b, updates, [count, *slice_shape])

    def body(sb: Builder, j: ir.Value, carried: list[ir.Value]):
        current, = carried
        j1 = loop_step(sb, j)
        row = sb.op("Gather", rows, j1, axis=0)
        combined = combine(sb, sb.op("GatherND", current, row), sb.op("Gather", slices, j1, axis=0))
        return [sb.op("ScatterND", current, row, combined)], []

    return loop(b, "scatter", count, [data], [TensorType(tuple(data_shape), dtype)], body)[0]
