"""gather and scatter, with XLA's out-of-bounds rules (dynamic slices: ops/dynamic_slice.py).

gather clamps each start index so its slice fits; scatter skips every update
whose window does not fit. Both follow one plan: the start indices become an
int64 matrix `batch + [K]`, batching dims become iota columns, windows wider
than one element add constant offsets, and a single ONNX Gather/GatherElements/
GatherND (or ScatterElements/ScatterND) runs on the operand with its indexed
dims moved first. Axes are tracked as labels, ("b", j) for batch axis j of the
indices and ("o", d) for operand dim d, so one transpose + reshape gives
StableHLO's result layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import onnx_ir as ir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.builder import Builder
from hlo2onnx.ops.core import dims as symbolic
from hlo2onnx.ops.control.loops import loop, loop_step
from hlo2onnx.ops.core.reduce import single_reducer
from hlo2onnx.ops.core.shape import reshape_to, transpose_to
from hlo2onnx.ops.window.windows import body_applier
from hlo2onnx.registry import allow_dynamic, register
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, is_bool, is_float

I64 = np.dtype(np.int64)
# (builder, current slice, update slice) -> the combined slice: a scatter body no ONNX reduction expresses.
Combine = Callable[[Builder, ir.Value, ir.Value], ir.Value]
Label = tuple[str, int]


# -- start indices ----------------------------------------------------------------
@dataclass
class _Starts:
    """Start indices as `matrix` (int64, `batch` + [len(dims)]); column k indexes operand dim dims[k].

    `pairs` are the batching dims: (operand dim, batch axis of the indices).
    """

    matrix: ir.Value
    batch: list[int]
    dims: list[int]
    pairs: list[tuple[int, int]]
    const: np.ndarray | None  # the matrix's values when the indices are a constant


def _starts(b, indices: ir.Value, shape: Sequence[int], index_vector_dim: int, index_map: Sequence[int],
            operand_batching: Sequence[int], indices_batching: Sequence[int]) -> _Starts:
    rank = len(shape)
    if index_vector_dim == rank:
        batch = list(shape)
        matrix = b.op("Unsqueeze", indices, b.shape_const([rank]))
    else:
        batch = [n for i, n in enumerate(shape) if i != index_vector_dim]
        matrix = transpose_to(b, indices, [i for i in range(rank) if i != index_vector_dim] + [index_vector_dim])
    const = None
    if indices.const_value is not None:
        array = indices.const_value.numpy().astype(np.int64)
        const = array[..., None] if index_vector_dim == rank else np.moveaxis(array, index_vector_dim, -1)
    pairs = [(d, axis if axis < index_vector_dim else axis - 1)
             for d, axis in zip(operand_batching, indices_batching)]
    return _Starts(b.cast(matrix, I64), batch, list(index_map), pairs, const)


def _with_batching_columns(b, s: _Starts) -> tuple[ir.Value, list[int]]:
    """The matrix with one iota column per batching dim, and the operand dim of every column."""
    columns, dims = [s.matrix], list(s.dims)
    for d, j in s.pairs:
        aligned = [-1 if i == j else 1 for i in range(len(s.batch))] + [1]
        if symbolic.is_static(s.batch):
            iota = b.const(np.arange(s.batch[j], dtype=np.int64).reshape(aligned))
            columns.append(b.op("Expand", iota, b.shape_const(s.batch + [1])))
        else:  # a symbolic batch: the iota's length and the broadcast shape read from the matrix
            n = b.op("Squeeze", b.op("Shape", s.matrix, start=j, end=j + 1))
            iota = reshape_to(b, b.op("Range", b.const(np.int64(0)), n, b.const(np.int64(1))), aligned)
            full = symbolic.shape_value(b, symbolic.dims(b, s.matrix, s.batch) + [1])
            columns.append(b.op("Expand", iota, full))
        dims.append(d)
    return (b.op("Concat", *columns, axis=-1) if len(columns) > 1 else s.matrix), dims


def _known_within(s: _Starts, high: Sequence[symbolic.Dim]) -> bool:
    """Whether every start column is known to lie in [0, high] (no columns, or constant indices)."""
    if not s.dims:
        return True
    if not all(isinstance(h, int) for h in high):
        return False
    return s.const is not None and bool(((s.const >= 0) & (s.const <= np.asarray(high))).all())


def start_bounds(b, operand: ir.Value, shape: Sequence[int], sizes: Sequence[symbolic.Dim], dims: Sequence[int]):
    """The largest start of each of `dims` whose window still fits (`dim - size`): an int, or a 1-element
    int64 tensor where the operand's dim or the size (a dynamic_gather's) is symbolic."""
    high: list[symbolic.Dim] = []
    for d in dims:
        if isinstance(sizes[d], int) and sizes[d] < 0:
            raise NotImplementedError(f"a window of symbolic size along indexed dimension {d}")
        high.append(symbolic.difference(b, symbolic.dim(b, operand, d, shape[d]), sizes[d]))
    return high


def _bound(b, high: Sequence[symbolic.Dim]) -> ir.Value:
    return b.const(np.asarray(high, np.int64)) if all(isinstance(h, int) for h in high) \
        else symbolic.shape_value(b, high)


def _fits(b, s: _Starts, high: Sequence[int]) -> ir.Value | None:
    """Bool of shape `batch`: every start column lies in [0, high]; None when that is known statically."""
    if _known_within(s, high):
        return None
    ok = b.op("And", b.op("GreaterOrEqual", s.matrix, b.const(np.zeros(1, I64))),
              b.op("LessOrEqual", s.matrix, _bound(b, high)))
    if len(s.dims) == 1:
        if sum(n < 0 for n in s.batch) > 1:  # as _drop_last: a Reshape spells one symbolic dim
            return b.op("Squeeze", ok, b.shape_const([len(s.batch)]))
        return reshape_to(b, ok, s.batch)
    return b.op("ReduceMin", ok, b.shape_const([-1]), keepdims=0)


def clamp_starts(b, starts: ir.Value, high: Sequence[int]) -> ir.Value:
    """XLA's clamp of start indices into [0, high] (high = dim - slice size)."""
    clipped = b.op("Min", starts, _bound(b, high))
    return b.op("Max", clipped, b.const(np.zeros(1, I64)))


def window_offsets(b, starts: ir.Value, batch: list[int], sizes: Sequence[symbolic.Dim]) -> ir.Value:
    """starts (batch + [K]) plus every offset of a window of `sizes` (one per column; a symbolic size is a
    1-element int64 tensor).

    Gives batch + [sizes above 1, and symbolic ones] + [K]: only windows wider than one element get an axis.
    """
    wide = [k for k, n in enumerate(sizes) if not isinstance(n, int) or n > 1]
    if not wide:
        return starts
    if all(isinstance(n, int) for n in sizes):
        grid = np.indices([sizes[k] for k in wide], dtype=np.int64)
        offsets = np.zeros([sizes[k] for k in wide] + [len(sizes)], np.int64)
        for axis, k in enumerate(wide):
            offsets[..., k] = grid[axis]
    else:  # each column's offsets a run-time Range along its own axis, broadcast into the grid by the sums
        offsets = None
        for axis, k in enumerate(wide):
            aligned = [1] * axis + [-1] + [1] * (len(wide) - axis - 1) + [1]
            if isinstance(sizes[k], int):
                line = b.const(np.arange(sizes[k], dtype=np.int64).reshape(aligned))
            else:
                n = b.op("Squeeze", sizes[k], b.shape_const([0]))
                line = reshape_to(b, b.op("Range", b.const(np.int64(0)), n, b.const(np.int64(1))), aligned)
            column = b.op("Mul", line, b.const(np.eye(len(sizes), dtype=np.int64)[k]))
            offsets = column if offsets is None else b.op("Add", offsets, column)
    if symbolic.is_static(batch):
        starts = reshape_to(b, starts, batch + [1] * len(wide) + [len(sizes)])
    else:
        starts = b.op("Unsqueeze", starts, b.shape_const(list(range(len(batch), len(batch) + len(wide)))))
    return b.op("Add", starts, b.const(offsets) if isinstance(offsets, np.ndarray) else offsets)


# -- layout -------------------------------------------------------------------------
def _arrange(b, x: ir.Value, labels: list[Label], target: list[Label], out_shape: Sequence[int]) -> ir.Value:
    """Transposes `x` (axes named by `labels`) into `target` order; axes in only one of them have size 1."""
    present = [label for label in target if label in labels]
    perm = [labels.index(label) for label in present] + [i for i, lb in enumerate(labels) if lb not in target]
    x = transpose_to(b, x, perm)
    if present != target or len(labels) != len(target):
        # Only unit axes come and go: symbolic sizes are read from x's own axes.
        parts = [symbolic.dim(b, x, present.index(label), n) if label in present else n
                 for label, n in zip(target, out_shape)]
        x = symbolic.reshape(b, x, parts)
    return x


def _labels(rank: int, window_axes: Sequence[int], window_dims: Sequence[int]) -> list[Label]:
    """Axis labels of a gather result or scatter update: window axes carry operand dims, the rest batch axes."""
    window = dict(zip(window_axes, window_dims))
    batch = iter(range(rank))
    return [("o", window[axis]) if axis in window else ("b", next(batch)) for axis in range(rank)]


def _crop(b, x: ir.Value, shape: Sequence[int], sizes: Sequence[symbolic.Dim], dims: Sequence[int]) -> ir.Value:
    """x[0:sizes[d]] along each of `dims` narrower than the operand (or not known not to be: symbolic)."""
    axes = [d for d in dims if not isinstance(sizes[d], int) or shape[d] < 0 or sizes[d] < shape[d]]
    if not axes:
        return x
    return b.op("Slice", x, b.shape_const([0] * len(axes)), symbolic.shape_value(b, [sizes[d] for d in axes]),
                b.shape_const(axes))


def _elements_form(s: _Starts, rank: int, window: Sequence[int]) -> tuple[int, list[int | None]] | None:
    """(axis, batch axis per operand dim) when GatherElements/ScatterElements fit, else None.

    They fit when one start column picks single elements along `axis`, every other operand dim is a
    batching dim, and at most one batch axis is left over: it runs along `axis` (None: a new unit axis).
    """
    if len(s.dims) != 1 or window[s.dims[0]] != 1 or len(s.pairs) != rank - 1:
        return None
    axis = s.dims[0]
    paired = dict(s.pairs)
    free = [j for j in range(len(s.batch)) if j not in paired.values()]
    if len(free) > 1:
        return None
    return axis, [paired[d] if d != axis else (free[0] if free else None) for d in range(rank)]


def _operand_order(b, x: ir.Value, batch: list[int], order: list[int | None]) -> ir.Value:
    """x (shaped `batch`) with its axes put in operand order: axis d of the result is batch axis order[d]."""
    if None in order:
        x = b.op("Unsqueeze", x, b.shape_const([len(batch)]))
    return transpose_to(b, x, [len(batch) if j is None else j for j in order])


# -- gather ---------------------------------------------------------------------------
allow_dynamic("stablehlo.gather", "stablehlo.dynamic_gather", "stablehlo.scatter")


@register("stablehlo.dynamic_gather")
def dynamic_gather(ctx: RuleContext, operand, indices, slice_sizes, *, dimension_numbers, indices_are_sorted=False):
    """gather with its slice sizes as a tensor (symbolic dims): sizes the graph folds to constants are read;
    the others are taken at run time, where gather can use them (crops of dims it does not index)."""
    b = ctx.b
    rank = ctx.in_types[0].rank
    known = symbolic.known_entries(slice_sizes, rank)
    sizes = b.cast(slice_sizes, I64)
    parts = [k if k is not None else b.op("Gather", sizes, b.shape_const([d]), axis=0) for d, k in enumerate(known)]
    return gather(ctx, operand, indices, dimension_numbers=dimension_numbers, slice_sizes=parts)


@register("stablehlo.gather")
def gather(ctx: RuleContext, operand, indices, *, dimension_numbers, slice_sizes, indices_are_sorted=False):
    dn = stablehlo.GatherDimensionNumbers(dimension_numbers)
    b = ctx.b
    shape, out_shape = ctx.in_types[0].shape, list(ctx.out_type.shape)
    if symbolic.is_static(out_shape) and ctx.out_type.size == 0:
        return b.splat(0, ctx.out_type.dtype, out_shape)
    rank = len(shape)
    s = _starts(b, indices, ctx.in_types[1].shape, dn.index_vector_dim, dn.start_index_map,
                dn.operand_batching_dims, dn.start_indices_batching_dims)
    high = start_bounds(b, operand, shape, slice_sizes, s.dims)
    if not _known_within(s, high):
        s.matrix = clamp_starts(b, s.matrix, high)  # XLA clamps so the slice fits
    dropped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    target = _labels(len(out_shape), dn.offset_dims, [d for d in range(rank) if d not in dropped])
    batch_labels = [("b", j) for j in range(len(s.batch))]
    symbolic_window = [d for d in s.dims if not isinstance(slice_sizes[d], int)]
    if symbolic_window and not s.batch:
        # One window (jnp's x[:, 1:] over a symbolic dim): a Slice, which takes run-time sizes.
        end = b.op("Add", s.matrix, symbolic.shape_value(b, [slice_sizes[d] for d in s.dims]))
        result = b.op("Slice", operand, s.matrix, end, b.shape_const(s.dims))
        result = _crop(b, result, shape, slice_sizes, [d for d in range(rank) if d not in s.dims])
        return _arrange(b, result, [("o", d) for d in range(rank)], target, out_shape)

    elements = _elements_form(s, rank, slice_sizes)
    if elements is not None:
        axis, order = elements
        idx = _operand_order(b, _drop_last(b, s), s.batch, order)
        result = b.op("GatherElements", operand, idx, axis=axis)
        labels = [("o", axis) if j is None else ("b", j) for j in order]
    elif len(s.dims) == 1 and not s.pairs and slice_sizes[s.dims[0]] == 1:
        axis = s.dims[0]
        data = _crop(b, operand, shape, slice_sizes, [d for d in range(rank) if d != axis])
        result = b.op("Gather", data, _drop_last(b, s), axis=axis)
        labels = [("o", d) for d in range(axis)] + batch_labels + [("o", d) for d in range(axis + 1, rank)]
    else:
        matrix, dims = _with_batching_columns(b, s)
        rest = [d for d in range(rank) if d not in dims]
        data = _crop(b, operand, shape, slice_sizes, rest)
        labels = batch_labels + [("o", d) for d in dims if not isinstance(slice_sizes[d], int) or slice_sizes[d] > 1] \
            + [("o", d) for d in rest]
        if dims:
            data = transpose_to(b, data, dims + rest)
            result = b.op("GatherND", data, window_offsets(b, matrix, s.batch, [slice_sizes[d] for d in dims]))
        else:  # no index columns: every result row is the same slice
            if not symbolic.is_static(s.batch) or not all(isinstance(slice_sizes[d], int) for d in rest):
                raise NotImplementedError("gather without index columns over symbolic dimensions")
            unit = reshape_to(b, data, [1] * len(s.batch) + [slice_sizes[d] for d in rest])
            result = b.typed("Expand", unit, b.shape_const(s.batch + [slice_sizes[d] for d in rest]),
                             dtype=ctx.out_type.dtype, cast=(0,))
    return _arrange(b, result, labels, target, out_shape)


def _drop_last(b, s: _Starts) -> ir.Value:
    """The single-column matrix shaped `batch`."""
    if sum(n < 0 for n in s.batch) > 1:
        return b.op("Squeeze", s.matrix, b.shape_const([len(s.batch)]))
    return reshape_to(b, s.matrix, s.batch)


# -- scatter --------------------------------------------------------------------------
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
        return b.op("Where", valid_m, matrix, _bound(b, trash)), updates
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
    s = _starts(b, indices, ctx.in_types[1].shape, dn.index_vector_dim, dn.scattered_dims_to_operand_dims,
                dn.input_batching_dims, dn.scatter_indices_batching_dims)
    window: list[symbolic.Dim] = list(window)
    for d, axis in zip(window_dims, dn.update_window_dims):
        if d in s.dims and window[d] < 0:  # an indexed window of symbolic size (x.at[:, 1:]): its run-time size
            window[d] = symbolic.dim(b, updates, axis, -1)
    valid = _fits(b, s, start_bounds(b, operand, shape, window, s.dims))
    # The operand's sizes, symbolic ones read from the graph (where the trash row and crop need them).
    sizes = symbolic.dims(b, operand, shape) if not static else list(shape)
    labels = _labels(len(upd_shape), dn.update_window_dims, window_dims)

    elements = None if combine else _elements_form(s, rank, window)
    if elements is not None:
        axis, order = elements
        updates = _arrange(b, updates, labels, [("b", j) for j in range(len(s.batch))], s.batch)
        matrix, updates = _skip_invalid(b, s.matrix, updates, valid, 0, reduction, dtype, [sizes[axis]])
        idx = _operand_order(b, _drop_last(b, _Starts(matrix, s.batch, s.dims, s.pairs, None)), s.batch, order)
        updates = _operand_order(b, updates, s.batch, order)
        padded = valid is not None and reduction == "none"
        data = _pad_end(b, operand, rank, axis, 1, dtype) if padded else operand
        result = _scatter_node(b, "ScatterElements", data, idx, updates, dtype, reduction, axis=axis)
        return _crop(b, result, [n + (d == axis) if n >= 0 else -1 for d, n in enumerate(shape)], sizes, [axis]) \
            if padded else result

    matrix, dims = _with_batching_columns(b, s)
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
    updates = _arrange(b, updates, labels, target, out_shape)
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
        result = _crop(b, result, [shape[dims[0]] + window[dims[0]] if static else -1], [sizes[dims[0]]], [0])
    return transpose_to(b, result, np.argsort(dims + rest).tolist())


def _scatter_whole(b: Builder, operand: ir.Value, updates: ir.Value, labels: list, batch: list, shape: list,
                   reduction: str, combine: Combine | None, dtype: np.dtype) -> ir.Value:
    """A scatter without index columns (`x.at[...].set(y)`): every window is the whole operand. The operand gets
    a leading unit axis that every update row indexes at 0, so ScatterND applies them as XLA does."""
    if not symbolic.is_static(batch):
        raise NotImplementedError("scatter without index columns over symbolic batch dimensions")
    rank = len(shape)
    updates = _arrange(b, updates, labels, [("b", j) for j in range(len(batch))] + [("o", d) for d in range(rank)],
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
