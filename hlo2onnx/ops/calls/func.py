"""func.call (inlined) and optimization barriers."""
from __future__ import annotations

from hlo2onnx.registry import register
from hlo2onnx.translator import RuleContext


@register("func.call")
def call(ctx: RuleContext, *args, callee: str, **_ignored):
    return ctx.translator.call(callee, args, ctx.b, ctx.where)


@register("stablehlo.optimization_barrier")
def optimization_barrier(ctx: RuleContext, *args):
    return [ctx.b.op("Identity", x) for x in args]


@register("stablehlo.composite")
def composite(ctx: RuleContext, *args, decomposition: str, **_attributes):
    # A composite (jax's chlo.top_k under shape polymorphism, ...) is its decomposition, inlined.
    return ctx.translator.call(decomposition, args, ctx.b, ctx.where)
