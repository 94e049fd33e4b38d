"""gather and dynamic_gather, with XLA's out-of-bounds rule: each start index is clamped so its slice fits.

The result is one ONNX Slice, GatherElements, Gather or GatherND, by the plan in plan.py.
"""
from __future__ import annotations

from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.ops.core import dims as symbolic
from hlo2onnx.ops.core.shape import reshape_to, transpose_to
from hlo2onnx.ops.indexing.plan import (I64, arrange, axis_labels, clamp_starts, crop, elements_form, known_within,
                                        operand_order, read_starts, single_column, start_bounds, window_offsets,
                                        with_batching_columns)
from hlo2onnx.registry import allow_dynamic, register
from hlo2onnx.translator import RuleContext

allow_dynamic("stablehlo.gather", "stablehlo.dynamic_gather")


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
    s = read_starts(b, indices, ctx.in_types[1].shape, dn.index_vector_dim, dn.start_index_map,
                dn.operand_batching_dims, dn.start_indices_batching_dims)
    high = start_bounds(b, operand, shape, slice_sizes, s.dims)
    if not known_within(s, high):
        s.matrix = clamp_starts(b, s.matrix, high)  # XLA clamps so the slice fits
    dropped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    target = axis_labels(len(out_shape), dn.offset_dims, [d for d in range(rank) if d not in dropped])
    batch_labels = [("b", j) for j in range(len(s.batch))]
    symbolic_window = [d for d in s.dims if not isinstance(slice_sizes[d], int)]
    if symbolic_window and not s.batch:
        # One window (jnp's x[:, 1:] over a symbolic dim): a Slice, which takes run-time sizes.
        end = b.op("Add", s.matrix, symbolic.shape_value(b, [slice_sizes[d] for d in s.dims]))
        result = b.op("Slice", operand, s.matrix, end, b.shape_const(s.dims))
        result = crop(b, result, shape, slice_sizes, [d for d in range(rank) if d not in s.dims])
        return arrange(b, result, [("o", d) for d in range(rank)], target, out_shape)

    elements = elements_form(s, rank, slice_sizes)
    if elements is not None:
        axis, order = elements
        idx = operand_order(b, single_column(b, s), s.batch, order)
        result = b.op("GatherElements", operand, idx, axis=axis)
        labels = [("o", axis) if j is None else ("b", j) for j in order]
    elif len(s.dims) == 1 and not s.pairs and slice_sizes[s.dims[0]] == 1:
        axis = s.dims[0]
        data = crop(b, operand, shape, slice_sizes, [d for d in range(rank) if d != axis])
        result = b.op("Gather", data, single_column(b, s), axis=axis)
        labels = [("o", d) for d in range(axis)] + batch_labels + [("o", d) for d in range(axis + 1, rank)]
    else:
        matrix, dims = with_batching_columns(b, s)
        rest = [d for d in range(rank) if d not in dims]
        data = crop(b, operand, shape, slice_sizes, rest)
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
    return arrange(b, result, labels, target, out_shape)
