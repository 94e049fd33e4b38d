"""Shardy annotations: on one device (ONNX Runtime runs one) they change no value."""
from __future__ import annotations

from hlo2onnx.registry import register
from hlo2onnx.translator import RuleContext


@register("sdy.sharding_constraint")
def sharding_constraint(ctx: RuleContext, x, **_sharding):
    # jax.random.split/fold_in emit one with an empty mesh.
    return ctx.b.op("Identity", x)
