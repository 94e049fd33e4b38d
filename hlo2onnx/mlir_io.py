"""Reading StableHLO through jaxlib's MLIR bindings (never a hand-written parser)."""
from __future__ import annotations

from jax.extend.mlir import ir, passmanager
from jaxlib.mlir._mlir_libs import _stablehlo

# The StableHLO passes (chlo legalization among them) are not registered by
# importing jax; registration is global to the MLIR library and idempotent.
_stablehlo.register_stablehlo_passes()
_PIPELINE = "builtin.module(func.func(chlo-legalize-to-stablehlo, stablehlo-legalize-deprecated-ops))"

from hlo2onnx.errors import InvalidInputError


def make_context() -> ir.Context:
    """A context with the StableHLO/CHLO/func dialects registered.

    jax's own factory is private, but it is the only place that registers
    exactly the dialects jax emits; validated once here.
    """
    from jax._src.interpreters import mlir as jax_mlir  # private: see findings.md

    return jax_mlir.make_ir_context()


def parse_module(source: str | bytes, context: ir.Context | None = None) -> ir.Module:
    """Parses MLIR text or bytecode (StableHLO or portable artifact)."""
    context = context or make_context()
    try:
        with context:
            return ir.Module.parse(source)
    except Exception as e:  # MLIR raises a bare Exception/ValueError carrying diagnostics
        message = str(e).strip().splitlines()
        raise InvalidInputError("cannot parse MLIR: " + (message[0] if message else type(e).__name__)) from None


def prepare(module: ir.Module) -> ir.Operation:
    """A translation-ready copy: cloned (the caller's module is left untouched), chlo legalized."""
    with module.context:
        cloned = module.operation.clone()
        passmanager.PassManager.parse(_PIPELINE).run(cloned)
    return cloned
