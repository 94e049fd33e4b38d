"""Shardy annotations and collectives: on one device (ONNX Runtime runs one) they change no value."""
from __future__ import annotations

import numpy as np
from jax.extend.mlir import ir as mlir

from hlo2onnx.registry import allow_dynamic, register, register_complex
from hlo2onnx.translator import RuleContext


@register("sdy.sharding_constraint")
def sharding_constraint(ctx: RuleContext, x, **_sharding):
    # jax.random.split/fold_in emit one with an empty mesh.
    return ctx.b.op("Identity", x)


allow_dynamic("sdy.sharding_constraint")  # an Identity: right on any shape (a symbolic batch of typed keys)


def _one_device(ctx: RuleContext) -> None:
    if ctx.translator.devices != 1:
        raise NotImplementedError(f"a collective in a module lowered for {ctx.translator.devices} devices "
                                  "(ONNX Runtime runs one)")


# shard_map over a mesh of one device (code written for several, run on one) lowers its psum, all_gather, ...
# to collectives whose one participant is the device itself: each returns its operands.
_COLLECTIVES = (  # jax emits these for complex values too
    "stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter")


@register(*_COLLECTIVES, "stablehlo.collective_broadcast")
@register_complex(*_COLLECTIVES)  # complex operands arrive as float pairs: returned as they are too
def one_device_collective(ctx: RuleContext, *args, **_attributes):
    _one_device(ctx)
    if [t.shape for t in ctx.in_types] != [t.shape for t in ctx.out_types]:
        raise NotImplementedError("a collective whose results are shaped unlike its operands on one device")
    return [ctx.b.op("Identity", x) for x in args]


@register("stablehlo.collective_permute")
@register_complex("stablehlo.collective_permute")
def collective_permute(ctx: RuleContext, x, *, source_target_pairs, **_attributes):
    _one_device(ctx)
    pairs = [int(i) for i in mlir.DenseIntElementsAttr(source_target_pairs)]
    if any(pairs):
        raise NotImplementedError("a collective_permute naming a device other than 0 on one device")
    if pairs:  # (0, 0): the device sends itself its value
        return ctx.b.op("Identity", x)
    out = ctx.out_type.storage  # a device no pair sends to gets zeros (StableHLO's spec)
    return ctx.b.const(np.zeros(out.shape, out.dtype))


@register("stablehlo.partition_id", "stablehlo.replica_id")
def device_id(ctx: RuleContext):
    _one_device(ctx)
    return ctx.b.const(np.uint32(0))
