"""Complex ops that move data or act on each part alike, and those that take complex numbers apart and back.

Data movement and the ops that act on each part alike (add, reshape, slice, gather, while ...) run the
ordinary rule on the pair tensors: `_lift` hands it the storage types and extends its axis attributes by the
pair axis. pad, select, compare, convert, iota, real, imag and complex work on the parts.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Callable

from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.ops.complex.pairs import as_pairs, from_real, part, real_type
from hlo2onnx.ops.complex.reduce import body_applier
from hlo2onnx.ops.core import shape as shape_ops
from hlo2onnx.ops.core.reduce import single_reducer
from hlo2onnx.ops.elementwise.arithmetic import convert as real_convert
from hlo2onnx.registry import RULES, register, register_complex
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import is_complex, real_dtype


def _lift(extend: Callable[..., dict] | None, ctx: RuleContext, *inputs, **attrs):
    rule = RULES[ctx.hlo_op.name]
    return rule(as_pairs(ctx), *inputs, **(extend(ctx, **attrs) if extend else attrs))


for _name in ("add", "subtract", "negate", "reshape", "concatenate", "reverse", "dynamic_update_slice",
              "while", "if", "case", "optimization_barrier"):
    register_complex(f"stablehlo.{_name}")(partial(_lift, None))
register_complex("func.call", "sdy.sharding_constraint")(partial(_lift, None))


def _with_pair_axis(ctx: RuleContext, **attrs) -> dict:
    """Axis attributes extended by the trailing pair axis, which every op keeps whole."""
    extra = {"permutation": ctx.in_types[0].rank, "broadcast_dimensions": ctx.out_type.rank,
             "start_indices": 0, "limit_indices": 2, "strides": 1, "slice_sizes": 2}
    return {k: (*v, extra[k]) if k in extra else v for k, v in attrs.items()}


for _name in ("transpose", "broadcast_in_dim", "slice", "dynamic_slice"):
    register_complex(f"stablehlo.{_name}")(partial(_lift, _with_pair_axis))


@register_complex("stablehlo.gather")
def gather(ctx: RuleContext, operand, indices, *, dimension_numbers, **attrs):
    dn = stablehlo.GatherDimensionNumbers(dimension_numbers)
    pair_dn = stablehlo.GatherDimensionNumbers.get(
        offset_dims=[*dn.offset_dims, ctx.out_type.rank], collapsed_slice_dims=dn.collapsed_slice_dims,
        operand_batching_dims=dn.operand_batching_dims, start_indices_batching_dims=dn.start_indices_batching_dims,
        start_index_map=dn.start_index_map, index_vector_dim=dn.index_vector_dim, context=ctx.hlo_op.context)
    return RULES["stablehlo.gather"](as_pairs(ctx), operand, indices, dimension_numbers=pair_dn,
                                     **_with_pair_axis(ctx, **attrs))


@register_complex("stablehlo.scatter")
def scatter(ctx: RuleContext, *args, scatter_dimension_numbers, **hints):
    body = ctx.hlo_op.regions[0].blocks[0]
    ops = list(body.operations)
    replaces = len(ops) == 1 and list(ops[0].operands) == [body.arguments[1]]
    if not replaces and single_reducer(body) != "stablehlo.add":
        # mul, max, min (a lexicographic choice) ...: the body itself, one index row at a time, in order
        apply = body_applier(ctx, body)
        hints["combine"] = lambda sb, current, update: apply([current], [update], sb)[0]
    dn = stablehlo.ScatterDimensionNumbers(scatter_dimension_numbers)
    pair_dn = stablehlo.ScatterDimensionNumbers.get(
        update_window_dims=[*dn.update_window_dims, ctx.in_types[-1].rank],
        inserted_window_dims=dn.inserted_window_dims, input_batching_dims=dn.input_batching_dims,
        scatter_indices_batching_dims=dn.scatter_indices_batching_dims,
        scattered_dims_to_operand_dims=dn.scattered_dims_to_operand_dims, index_vector_dim=dn.index_vector_dim,
        context=ctx.hlo_op.context)
    return RULES["stablehlo.scatter"](as_pairs(ctx), *args, scatter_dimension_numbers=pair_dn, **hints)


@register_complex("stablehlo.pad")
def pad(ctx: RuleContext, x, padding_value, **attrs):
    """ONNX Pad fills with one scalar: pad each part with its own."""
    b = ctx.b
    plane_ctx = dataclasses.replace(ctx, in_types=[real_type(t) for t in ctx.in_types],
                                    out_types=[real_type(t) for t in ctx.out_types])
    parts = [shape_ops.pad(plane_ctx, part(b, x, i), part(b, padding_value, i), **attrs) for i in (0, 1)]
    return b.op("Concat", *(b.op("Unsqueeze", p, b.shape_const([-1])) for p in parts), axis=-1)



@register_complex("stablehlo.select")
def select(ctx: RuleContext, pred, on_true, on_false):
    # Unsqueezed even when scalar-typed: reduction bodies run on whole tensors (reduce.py).
    return ctx.b.op("Where", ctx.b.op("Unsqueeze", pred, ctx.b.shape_const([-1])), on_true, on_false)


@register_complex("stablehlo.compare")
def compare(ctx: RuleContext, x, y, *, comparison_direction: str, compare_type: str | None = None):
    if comparison_direction not in ("EQ", "NE"):
        raise NotImplementedError(f"complex compare {comparison_direction}")
    b = ctx.b
    same = b.op("Equal", x, y)
    equal = b.op("And", part(b, same, 0), part(b, same, 1))
    return equal if comparison_direction == "EQ" else b.op("Not", equal)


@register_complex("stablehlo.convert")
def convert(ctx: RuleContext, x):
    """real -> complex takes a zero imaginary part; complex -> real keeps the real part (StableHLO convert)."""
    b = ctx.b
    source, target = ctx.in_types[0].dtype, ctx.out_type.dtype
    if not is_complex(source):
        return from_real(b, x, ctx.in_types[0], target)
    if is_complex(target):
        return b.cast(x, real_dtype(target)) if source != target else b.op("Identity", x)
    real_ctx = dataclasses.replace(ctx, in_types=[real_type(ctx.in_types[0])])
    return real_convert(real_ctx, part(b, x, 0))


@register_complex("stablehlo.iota")
def iota(ctx: RuleContext, *, iota_dimension):
    real_ctx = dataclasses.replace(ctx, out_types=[real_type(ctx.out_type)])
    line = RULES["stablehlo.iota"](real_ctx, iota_dimension=iota_dimension)
    return from_real(ctx.b, line, real_ctx.out_type, ctx.out_type.dtype)


# -- real, imag, complex ----------------------------------------------------------------
@register_complex("stablehlo.real")
def real(ctx: RuleContext, x):
    return part(ctx.b, x, 0)


@register_complex("stablehlo.imag")
def imag(ctx: RuleContext, x):
    return part(ctx.b, x, 1)


@register("stablehlo.real")
def real_of_real(ctx: RuleContext, x):
    return ctx.b.op("Identity", x)


@register("stablehlo.imag")
def imag_of_real(ctx: RuleContext, x):
    return ctx.b.splat(0, ctx.out_type.dtype, ctx.out_type.shape)


@register_complex("stablehlo.complex")
def complex_(ctx: RuleContext, re, im):
    b = ctx.b
    return b.op("Concat", b.op("Unsqueeze", re, b.shape_const([-1])), b.op("Unsqueeze", im, b.shape_const([-1])),
                axis=-1)
