"""Host callbacks (jax.pure_callback, io_callback, jax.debug.print) and the tokens that order them.

A callback becomes one `mnjit.HostCallback` node (hlo2onnx/host_calls.py) whose `callback` attribute is the id
the caller gave the function at `index` of the lowering's host callbacks. Tokens are bool scalars: an ordered
callback reads its token first and writes the next one first (jax's function passes it through), so data
dependence keeps the program's order.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir

from hlo2onnx import host_calls
from hlo2onnx.registry import register, register_custom_call
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import is_complex

_NEEDS_MNJIT = ("a Python host callback (jax.pure_callback, io_callback, jax.debug.print, or an equinox error "
                "check) runs only under mnjit, which calls the function from the ONNX graph: an ONNX file "
                "cannot call Python. Run the function with mnjit(f), or move the callback out of the converted "
                "function")


@register_custom_call(host_calls.CALL_TARGET)
def host_callback(ctx: RuleContext, *inputs, index: int, **_config):
    callbacks = ctx.translator.host_callbacks
    if callbacks is None:
        raise NotImplementedError(_NEEDS_MNJIT)
    if not 0 <= index < len(callbacks):
        raise NotImplementedError(f"host callback #{index} is not among the {len(callbacks)} functions given")
    op = ctx.hlo_op
    effects = "has_side_effect" in op.attributes and mlir.BoolAttr(op.attributes["has_side_effect"]).value
    # Complex values travel as float pairs: the runtime turns them back for the function (by position).
    pairs = {f"complex_{side}": [i for i, t in enumerate(types) if is_complex(t.dtype)]
             for side, types in (("inputs", ctx.in_types), ("outputs", ctx.out_types))}
    # A callback run for its effects writes one more output, a token that orders it (host_calls.order_effects).
    outputs = ctx.b.ops(host_calls.OP_TYPE, *inputs, num_outputs=len(ctx.out_types) + effects,
                        domain=host_calls.DOMAIN, callback=callbacks[index], effects=int(effects),
                        site=ctx.translator.next_site(),
                        **{name: positions for name, positions in pairs.items() if positions})
    if effects:
        outputs[-1].type, outputs[-1].shape = ir.TensorType(ir.DataType.BOOL), ir.Shape([])
    return outputs[:len(ctx.out_types)]


@register("stablehlo.after_all")
def after_all(ctx: RuleContext, *tokens):
    """Joins tokens: And keeps the joined token after every one of them (create_token is legalized to this)."""
    if not tokens:
        return ctx.b.const(np.bool_(True))
    joined = tokens[0]
    for token in tokens[1:]:
        joined = ctx.b.op("And", joined, token)
    return joined
