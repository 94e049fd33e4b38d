"""Symbolic dims (jax.export shape polymorphism) and jax.export's shape assertions.

Dynamic dims reach ONNX as dim_params; sizes known only at run time come
from `get_dimension_size` and travel as shape tensors. Only the ops listed in
`allow_dynamic` below may see a dynamic dim: enough for MLP-style models.
"""
from __future__ import annotations

import numpy as np

from hlo2onnx.ops.dims import known_entries
from hlo2onnx.ops.shape import iota_line, transpose_to, unsqueeze_missing
from hlo2onnx.registry import allow_dynamic, register, register_custom_call
from hlo2onnx.translator import RuleContext

_ELEMENTWISE = (
    "add subtract multiply divide remainder power maximum minimum negate abs sign exponential log sqrt rsqrt "
    "cbrt tanh sine cosine tan floor ceil round_nearest_even round_nearest_afz logistic exponential_minus_one "
    "log_plus_one is_finite and or xor not compare select clamp convert"
)
allow_dynamic(*(f"stablehlo.{op}" for op in _ELEMENTWISE.split()))
# These rules take their sizes from their operands, or handle -1 dims themselves.
allow_dynamic("func.call", "stablehlo.composite", "stablehlo.custom_call", "stablehlo.optimization_barrier", "stablehlo.transpose",
              "stablehlo.concatenate", "stablehlo.get_dimension_size", "stablehlo.dot_general",
              "stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.reduce",
              "stablehlo.dynamic_broadcast_in_dim", "stablehlo.dynamic_reshape", "stablehlo.dynamic_iota",
              "stablehlo.slice", "stablehlo.pad", "stablehlo.reverse", "stablehlo.real_dynamic_slice",
              "stablehlo.dynamic_pad")


@register("stablehlo.real_dynamic_slice")
def real_dynamic_slice(ctx: RuleContext, x, start, limit, strides):
    # StableHLO requires 0 <= start <= limit <= dim, which is ONNX Slice's meaning of in-range bounds.
    b = ctx.b
    rank = ctx.in_types[0].rank
    return b.op("Slice", x, b.cast(start, np.int64), b.cast(limit, np.int64), b.shape_const(list(range(rank))),
                b.cast(strides, np.int64))


@register("stablehlo.dynamic_pad")
def dynamic_pad(ctx: RuleContext, x, value, low, high, interior):
    b = ctx.b
    if any(n != 0 for n in known_entries(interior, ctx.in_types[0].rank)):
        raise NotImplementedError("interior padding given as a tensor")
    pads = b.op("Concat", b.cast(low, np.int64), b.cast(high, np.int64), axis=0)
    return b.typed("Pad", x, pads, value, dtype=ctx.out_type.dtype, cast=(0, 2), mode="constant")


@register("stablehlo.dynamic_iota")
def dynamic_iota(ctx: RuleContext, output_shape, *, iota_dimension):
    b = ctx.b
    shape = ctx.out_type.shape
    full = b.cast(output_shape, np.int64)
    n = None if shape[iota_dimension] >= 0 else b.op("Gather", full, b.shape_const([iota_dimension]), axis=0)
    return iota_line(b, shape, ctx.out_type.dtype, iota_dimension, n, full)


@register("stablehlo.dynamic_broadcast_in_dim")
def dynamic_broadcast_in_dim(ctx: RuleContext, x, output_dimensions, *, broadcast_dimensions, **_hints):
    b = ctx.b
    dims = list(broadcast_dimensions)
    x = transpose_to(b, x, sorted(range(len(dims)), key=dims.__getitem__))
    x = unsqueeze_missing(b, x, dims, ctx.out_type.rank)
    # Expand broadcasts both ways; the operand's dims are 1 or the output's, as StableHLO requires.
    return b.op("Expand", x, b.cast(output_dimensions, np.int64))


@register("stablehlo.dynamic_reshape")
def dynamic_reshape(ctx: RuleContext, x, output_shape):
    # allowzero: a run-time 0 is a size, never "copy the input dim".
    return ctx.b.op("Reshape", x, ctx.b.cast(output_shape, np.int64), allowzero=1)


@register_custom_call("shape_assertion", dynamic=True)
def shape_assertion(ctx: RuleContext, *_inputs):
    # jax.export's shape assertions guard the symbolic dims when XLA runs the
    # module; ONNX Runtime checks input ranks and static dims itself.
    if ctx.out_types:
        raise NotImplementedError("custom call @shape_assertion with results")
    return []
