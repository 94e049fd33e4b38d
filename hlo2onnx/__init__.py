"""hlo2onnx: StableHLO -> ONNX, one small rule per op.

    model = hlo2onnx.translate(lowered.compiler_ir("stablehlo"))
    conversion = hlo2onnx.convert("model.mlir", "model.onnx")  # files, no Python source
"""
from __future__ import annotations

import onnx_ir as ir
from jax.extend.mlir import ir as mlir

from hlo2onnx import ops  # noqa: F401  (fills the rule table)
from hlo2onnx.convert import DEFAULT_OPSET, Conversion, convert
from hlo2onnx.errors import Hlo2OnnxError, InvalidInputError, UnsupportedOpError
from hlo2onnx.mlir_io import make_context, parse_module, prepare
from hlo2onnx.patterns import optimize
from hlo2onnx.support import ORT_CPU, TARGETS, Target
from hlo2onnx.translator import Translator

__all__ = ["translate", "Hlo2OnnxError", "InvalidInputError", "UnsupportedOpError", "Target", "TARGETS",
           "DEFAULT_OPSET", "make_context", "parse_module", "convert", "Conversion"]


def translate(module: mlir.Module, *, target: Target = ORT_CPU, opset: int = DEFAULT_OPSET,
              name: str = "main", fuse: bool = True) -> ir.Model:
    """Translates an in-memory StableHLO module into an onnx-ir Model."""
    prepared = prepare(module)
    with module.context:
        model = Translator(prepared, target, opset).translate(graph_name=name)
    return optimize(model, target) if fuse else model
