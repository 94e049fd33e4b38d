"""Reading StableHLO through jaxlib's MLIR bindings (never a hand-written parser)."""
from __future__ import annotations

import re

from jax.extend.mlir import ir, passmanager

from hlo2onnx import compat
from hlo2onnx.errors import InvalidInputError

compat.register_stablehlo_passes()
# Deprecated ops with no StableHLO replacement (stablehlo.rng) are kept, so that the translator refuses
# them by name and source line instead of the pass failing on the whole module.
_PIPELINE = ("builtin.module(func.func(chlo-legalize-to-stablehlo, "
             "stablehlo-legalize-deprecated-ops{fail-on-unused=false}))")

_POSITION = re.compile(r":(\d+):(\d+)")


def make_context() -> ir.Context:
    """A context with the StableHLO/CHLO/func dialects registered (jax's own factory)."""
    return compat.make_ir_context()


def parse_module(source: str | bytes, context: ir.Context | None = None) -> ir.Module:
    """Parses MLIR text or bytecode (StableHLO or portable artifact)."""
    context = context or make_context()
    try:
        with context:
            return ir.Module.parse(source)
    except ir.MLIRError as e:  # the first diagnostic says what is wrong; the header line does not
        raise InvalidInputError(f"cannot parse MLIR: {_first_error(e)}") from None


def _first_error(error: ir.MLIRError) -> str:
    if not error.error_diagnostics:
        return " ".join(str(error).split()) or type(error).__name__
    diagnostic = error.error_diagnostics[0]
    position = _POSITION.search(str(diagnostic.location))  # bytecode errors sit at line 0
    where = f"line {position[1]}, column {position[2]}: " if position and position[1] != "0" else ""
    return where + " ".join(diagnostic.message.split())

def prepare(module: ir.Module) -> ir.Operation:
    """A translation-ready copy: cloned (the caller's module is left untouched), chlo legalized."""
    with module.context:
        cloned = module.operation.clone()
        passmanager.PassManager.parse(_PIPELINE).run(cloned)
    return cloned
