"""func.call (inlined) and optimization barriers."""
from __future__ import annotations

from hlo2onnx.registry import register


@register("func.call")
def call(ctx, *args, callee: str, **_ignored):
    return ctx.translator.call(callee, args, ctx.b, ctx.where)


@register("stablehlo.optimization_barrier")
def optimization_barrier(ctx, *args):
    return [ctx.b.op("Identity", x) for x in args]
