"""stablehlo.custom_call: one rule that dispatches on the call target's name.

The targets' rules live with their families (`register_custom_call`): LAPACK
in ops/linalg/, jax.export's shape assertions in ops/core/dynamic.py, top_k in ops/sort/, host
callbacks in callbacks.py.
A target without a rule is refused with a hint at what emitted it and how to
work around it.
"""
from __future__ import annotations

import re
from dataclasses import replace

from jax.extend.mlir import ir as mlir

from hlo2onnx import attrs as attr_codec
from hlo2onnx.registry import CUSTOM_CALLS, CUSTOM_DYNAMIC_OK, register
from hlo2onnx.translator import RuleContext

_LAPACK = re.compile(r"lapack_([sdcz])(\w+?)(_ffi)?$")
# Every LAPACK routine jax's CPU lowering emits has a rule (linalg*.py); of jaxlib's CPU custom calls only the
# perturbed tridiagonal solve has none.
_EMITTED_BY = {"tridiagonal_solve_perturbed_ffi": "lax.linalg.tridiagonal_solve(..., perturb_singular=True) emits "
                                                  "it (without perturb_singular, the solve is translated)"}
_OUTSIDE = "run that part with jax.jit outside the converted function and pass its result in"


def hint(target: str) -> str:
    """What to do about a custom call without a translation."""
    if target in _EMITTED_BY:
        return f"{_EMITTED_BY[target]}; {_OUTSIDE}"
    match = _LAPACK.match(target)
    if match is None:
        return f"{_OUTSIDE}, or write it with jax.numpy ops"
    if match.group(1) in "cz":
        # Named from the rule table, so the list cannot go stale.
        translated = sorted({m.group(2) for m in map(_LAPACK.match, CUSTOM_CALLS) if m and m.group(1) in "cz"})
        return (f"this complex LAPACK routine is not translated (complex {', '.join(translated)} are); "
                f"{_OUTSIDE}")
    return _OUTSIDE


def backend_config(op: mlir.Operation) -> dict:
    """The call's configuration dictionary (api_version 4 puts it in `backend_config`, JAX's FFI lowering in
    `mhlo.backend_config`), decoded like attributes."""
    attributes = op.attributes
    config = attributes["backend_config"] if "backend_config" in attributes else None
    if not isinstance(config, mlir.DictAttr):
        config = attributes["mhlo.backend_config"] if "mhlo.backend_config" in attributes else None
    if not isinstance(config, mlir.DictAttr):
        return {}
    return {entry.name: attr_codec.decode(entry.name, entry.attr) for entry in (config[i] for i in range(len(config)))}


@register("stablehlo.custom_call")
def custom_call(ctx: RuleContext, *inputs, call_target_name: str, **_attrs):
    rule = CUSTOM_CALLS.get(call_target_name)
    if rule is None:
        raise NotImplementedError(f"custom call @{call_target_name} has no ONNX translation; "
                                  f"{hint(call_target_name)}")
    if call_target_name not in CUSTOM_DYNAMIC_OK and any(
            d < 0 for t in ctx.in_types + ctx.out_types for d in t.shape):
        raise NotImplementedError(f"custom call @{call_target_name}: dynamic dimensions are not supported")
    attributes = ctx.hlo_op.attributes
    if "indices_of_shape_operands" in attributes:
        # Under shape polymorphism jax's FFI calls also take their results' shapes as operands; the rules read
        # the sizes from the data operands, and see only those.
        shape_operands = {int(i) for i in mlir.DenseIntElementsAttr(attributes["indices_of_shape_operands"])}
        kept = [i for i in range(len(inputs)) if i not in shape_operands]
        inputs = tuple(inputs[i] for i in kept)
        ctx = replace(ctx, in_types=[ctx.in_types[i] for i in kept])
    return rule(ctx, *inputs, **backend_config(ctx.hlo_op))
