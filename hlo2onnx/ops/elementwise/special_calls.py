"""jaxlib's CPU kernels for lgamma and digamma (`custom_call @cpu_lgamma_ffi`, `@cpu_digamma_ffi`).

jax 0.12.1 lowers lax.lgamma and lax.digamma on CPU to these calls, where older jax emitted chlo.lgamma and
chlo.digamma, which `mlir_io.prepare`'s chlo legalization expands into elementwise StableHLO (a Lanczos series,
a reflection for negative arguments, and digamma's asymptotic form). The rule translates that same
expansion: it writes the chlo op for the call's operand type into a one-op function, legalizes it with the
pipeline every module goes through, and emits the function's body inline: the values are the chlo
expansion's, which the special-function tables have always checked (digamma(-0) aside: see below); f16 and
bf16 compute in f32 there. The calls are elementwise: their `num_batch_dims` frontend attribute (how many
leading dims the kernel loops over, all of them) changes nothing.
"""
from __future__ import annotations

from functools import partial

import onnx_ir as ir

from hlo2onnx import mlir_io
from hlo2onnx.registry import register_custom_call
from hlo2onnx.translator import RuleContext

_CHLO = {"cpu_lgamma_ffi": "chlo.lgamma", "cpu_digamma_ffi": "chlo.digamma"}


def _expanded(chlo_op: str, ctx: RuleContext, x: ir.Value, **_backend_config) -> ir.Value:
    if len(ctx.in_types) != 1 or len(ctx.out_types) != 1:
        raise NotImplementedError(f"{chlo_op} takes one operand and gives one result")
    operand = ctx.hlo_op.operands[0].type
    if str(operand) != str(ctx.hlo_op.results[0].type):
        raise NotImplementedError(f"{chlo_op} from {operand} to {ctx.hlo_op.results[0].type}")
    text = (f"func.func @expansion(%x: {operand}) -> {operand} {{\n"
            f"  %0 = {chlo_op} %x : {operand} -> {operand}\n"
            f"  return %0 : {operand}\n}}")
    # Parsed in the op's own context (which has the chlo dialect: the module came through it), so that the
    # expansion's types and attributes are of the kind the translator reads everywhere else.
    module = mlir_io.prepare(mlir_io.parse_module(text, ctx.hlo_op.context))
    func = module.regions[0].blocks[0].operations[0]
    result = ctx.translator.emit_block(func.regions[0].blocks[0], [x], ctx.b)[0]
    if chlo_op != "chlo.digamma":
        return result
    # The kernel's digamma(-0) is +inf, the limit from below (jax.jit on 0.12.1), where the expansion gives
    # -inf at both zeros: -1/x is -inf at +0 and +inf at -0. Never 0, so in Where's first branch (ORT's Where
    # turns a -0 from it into +0).
    b, dtype = ctx.b, ctx.out_type.dtype
    t = partial(b.typed, dtype=dtype)
    zero = t("Equal", x, b.const(0, dtype), result_dtype=bool)
    return t("Where", zero, t("Neg", t("Reciprocal", x)), result, cast=(1, 2))


for _target, _op in _CHLO.items():
    register_custom_call(_target)(partial(_expanded, _op))
