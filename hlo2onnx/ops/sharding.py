"""Shardy annotations: on one device (ONNX Runtime runs one) they change no value."""
from __future__ import annotations

from hlo2onnx.registry import allow_dynamic, register
from hlo2onnx.translator import RuleContext


@register("sdy.sharding_constraint")
def sharding_constraint(ctx: RuleContext, x, **_sharding):
    # jax.random.split/fold_in emit one with an empty mesh.
    return ctx.b.op("Identity", x)


allow_dynamic("sdy.sharding_constraint")  # an Identity: right on any shape (a symbolic batch of typed keys)
