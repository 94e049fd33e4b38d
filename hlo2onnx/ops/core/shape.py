"""Shape and data-movement ops: broadcast, reshape, transpose, slice, concat, pad, reverse, iota."""
from __future__ import annotations

from math import prod
from typing import Sequence

import numpy as np
import onnx_ir as ir

from hlo2onnx.ops.core import dims
from hlo2onnx.registry import register
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import onnx_dtype

_INT64_MIN = np.iinfo(np.int64).min


def reshape_to(b, x: ir.Value, shape) -> ir.Value:
    # ONNX infers one -1 dim from the element count; two would be ambiguous.
    if sum(d < 0 for d in shape) > 1:
        raise NotImplementedError("reshape to more than one dynamic dimension")
    return b.op("Reshape", x, b.shape_const(shape))


def merged(dims) -> int:
    """The size of `dims` flattened into one: -1 (dynamic) if any of them is."""
    return -1 if any(d < 0 for d in dims) else prod(dims)


def transpose_to(b, x: ir.Value, perm) -> ir.Value:
    perm = list(perm)
    return x if perm == sorted(perm) else b.op("Transpose", x, perm=perm)


@register("stablehlo.broadcast_in_dim")
def broadcast_in_dim(ctx: RuleContext, x, *, broadcast_dimensions):
    b = ctx.b
    in_shape, out_shape = ctx.in_types[0].shape, ctx.out_type.shape
    dims = list(broadcast_dimensions)
    order = sorted(range(len(dims)), key=dims.__getitem__)
    x = transpose_to(b, x, order)  # ONNX broadcasting needs the kept dims in order
    kept = [in_shape[i] for i in order]
    aligned = [1] * len(out_shape)
    for i in order:
        aligned[dims[i]] = in_shape[i]
    if any(n < 0 and a >= 0 for n, a in zip(out_shape, aligned)):
        raise NotImplementedError("broadcast to a dynamic size the operand does not carry")
    if aligned != kept:
        # Reshape cannot spell two dynamic dims; Unsqueeze needs none.
        x = unsqueeze_missing(b, x, dims, len(out_shape)) if -1 in in_shape else reshape_to(b, x, aligned)
    if aligned != list(out_shape):
        # Expanding a dynamic dim by 1 keeps the operand's own size.
        x = b.typed("Expand", x, b.shape_const([n if n >= 0 else 1 for n in out_shape]), dtype=ctx.out_type.dtype,
                    cast=(0,))
    return x


def broadcast_of(x: ir.Value) -> ir.Node | None:
    """The Expand that broadcast `x` (broadcast_in_dim's last step), or None: a rule may work on its smaller
    operand, inputs[0], and leave the broadcast to ops that broadcast by themselves."""
    producer = x.producer()
    return producer if producer is not None and producer.op_type == "Expand" and producer.domain == "" else None


def unsqueeze_missing(b, x: ir.Value, dims, rank: int) -> ir.Value:
    """Inserts unit axes for the result axes not in `dims` (x's axes already in result order)."""
    missing = [d for d in range(rank) if d not in dims]
    return b.op("Unsqueeze", x, b.shape_const(missing)) if missing else x


@register("stablehlo.reshape")
def reshape(ctx: RuleContext, x):
    return reshape_to(ctx.b, x, ctx.out_type.shape)


@register("stablehlo.transpose")
def transpose(ctx: RuleContext, x, *, permutation):
    return ctx.b.op("Transpose", x, perm=list(permutation))


@register("stablehlo.slice")
def slice_(ctx: RuleContext, x, *, start_indices, limit_indices, strides):
    b = ctx.b
    # A symbolic axis the result keeps symbolic is taken whole (jax slices symbolic extents with
    # real_dynamic_slice); one sliced to a static extent is sliced as written.
    whole = [n < 0 and m < 0 and s == 0 and st == 1
             for n, m, s, st in zip(ctx.in_types[0].shape, ctx.out_type.shape, start_indices, strides)]
    axes = [i for i, (s, e, n) in enumerate(zip(start_indices, limit_indices, ctx.in_types[0].shape))
            if ((s, e) != (0, n) or strides[i] != 1) and not whole[i]]
    if not axes:
        return b.op("Identity", x)
    pick = lambda seq: b.shape_const([seq[i] for i in axes])  # noqa: E731
    return b.op("Slice", x, pick(start_indices), pick(limit_indices), b.shape_const(axes), pick(strides))


@register("stablehlo.concatenate")
def concatenate(ctx: RuleContext, *xs, dimension):
    return ctx.b.op("Concat", *xs, axis=dimension)


@register("stablehlo.reverse")
def reverse(ctx: RuleContext, x, *, dimensions):
    b = ctx.b
    dims = list(dimensions)
    if not dims:
        return b.op("Identity", x)
    n = len(dims)
    return b.op("Slice", x, b.shape_const([-1] * n), b.shape_const([_INT64_MIN] * n), b.shape_const(dims),
                b.shape_const([-1] * n))


@register("stablehlo.pad")
def pad(ctx: RuleContext, x, padding_value, *, edge_padding_low, edge_padding_high, interior_padding):
    b = ctx.b
    dtype = ctx.out_type.dtype
    x = interior_pad(b, x, padding_value, list(ctx.in_types[0].shape), interior_padding, dtype)
    if any(edge_padding_low) or any(edge_padding_high):
        # ONNX Pad crops for negative pads, like StableHLO.
        pads = b.shape_const(list(edge_padding_low) + list(edge_padding_high))
        x = b.typed("Pad", x, pads, padding_value, dtype=dtype, cast=(0, 2), mode="constant")
    elif not any(interior_padding):
        x = b.op("Identity", x)
    return x


def interior_pad(b, x: ir.Value, value: ir.Value, shape: list[int], interiors: Sequence[int],
                 dtype: np.dtype) -> ir.Value:
    """StableHLO's interior padding: each axis spread apart by its count of `value` elements (symbolic sizes
    are read from x)."""
    for axis, interior in enumerate(interiors):
        if interior and shape[axis] != 0:
            x = _interior_pad(b, x, value, shape, axis, interior, dtype)
            shape[axis] = shape[axis] + (shape[axis] - 1) * interior if shape[axis] > 0 else -1
    return x


def _interior_pad(b, x, value, shape, axis, interior, dtype):
    """Spreads `axis` apart by `interior` fill elements: (n) -> (n, 1 + interior) -> n*(1+interior) -> crop.

    Symbolic sizes are read from x; the crop then counts from the end."""
    n = shape[axis]
    parts = dims.dims(b, x, shape)
    x = b.op("Unsqueeze", x, b.shape_const([axis + 1]))
    pads = [0] * (2 * (len(shape) + 1))
    pads[len(shape) + 1 + axis + 1] = interior
    x = b.typed("Pad", x, b.shape_const(pads), value, dtype=dtype, cast=(0, 2), mode="constant")
    if n < 0:
        parts[axis] = dims.product(b, [parts[axis], 1 + interior])
        x = dims.reshape(b, x, parts)
        return b.op("Slice", x, b.shape_const([0]), b.shape_const([-interior]), b.shape_const([axis]))
    flat = shape[:axis] + [n * (1 + interior)] + shape[axis + 1:]
    x = dims.reshape(b, x, parts[:axis] + [n * (1 + interior)] + parts[axis + 1:]) if not dims.is_static(shape) \
        else reshape_to(b, x, flat)
    keep = n + (n - 1) * interior
    return b.op("Slice", x, b.shape_const([0]), b.shape_const([keep]), b.shape_const([axis]))


@register("stablehlo.iota")
def iota(ctx: RuleContext, *, iota_dimension):
    return iota_line(ctx.b, ctx.out_type.shape, ctx.out_type.dtype, iota_dimension)


def iota_line(b, shape, dtype, axis: int, n=None, full=None) -> ir.Value:
    """0, 1, ... along `axis`, broadcast to `shape`; `n` and `full` (int64 tensors) give symbolic sizes."""
    compute = np.dtype(np.float32) if dtype.kind == "f" and dtype.itemsize < 4 else dtype
    if compute.kind in "ub" or compute.itemsize < 4 or (
            # A line longer than the type's range (XLA wraps it): counted in int64, then cast.
            compute.kind == "i" and n is None and shape[axis] > np.iinfo(compute).max):
        compute = np.dtype(np.int64)
    start = b.const(0, compute)  # (constants made in the static rule's order: same initializer names)
    stop = b.const(shape[axis], compute) if n is None else b.cast(reshape_to(b, n, []), compute)
    line = b.op("Range", start, stop, b.const(1, compute))
    line = b.cast(line, dtype) if compute != dtype else line
    if len(shape) == 1:
        return line
    aligned = [1] * len(shape)
    aligned[axis] = shape[axis] if n is None else -1
    line = reshape_to(b, line, aligned)
    return b.typed("Expand", line, b.shape_const(shape) if full is None else full, dtype=dtype, cast=(0,))


@register("stablehlo.get_dimension_size")
def get_dimension_size(ctx: RuleContext, x, *, dimension):
    b = ctx.b
    size = b.op("Shape", x, start=dimension, end=dimension + 1)
    return b.op("Cast", reshape_to(b, size, []), to=onnx_dtype(ctx.out_type.dtype))
