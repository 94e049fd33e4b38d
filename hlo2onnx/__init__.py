"""hlo2onnx: StableHLO -> ONNX, one small rule per op.

    model = hlo2onnx.translate(lowered.compiler_ir("stablehlo"))
    conversion = hlo2onnx.convert("model.mlir", "model.onnx")  # files, no Python source
"""
from __future__ import annotations

import onnx_ir as ir
from jax.extend.mlir import ir as mlir

from hlo2onnx import ops  # noqa: F401  (fills the rule table)
from hlo2onnx import targets
from hlo2onnx.convert import DEFAULT_OPSET, Conversion, convert
from hlo2onnx.errors import Hlo2OnnxError, InvalidInputError, UnsupportedOpError
from hlo2onnx.interrupts import InterruptGuard
from hlo2onnx.mlir_io import make_context, parse_module, prepare
from hlo2onnx.patterns import optimize_report
from hlo2onnx.report import ConversionReport
from hlo2onnx.support import ORT_CPU, Target
from hlo2onnx.targets import TARGETS, TargetError
from hlo2onnx.translator import Translator

__all__ = ["translate", "translate_report", "Hlo2OnnxError", "InvalidInputError", "UnsupportedOpError",
           "TargetError", "Target", "TARGETS", "DEFAULT_OPSET", "make_context", "parse_module", "convert",
           "Conversion", "ConversionReport"]


def translate(module: mlir.Module, *, target: Target | str = ORT_CPU, opset: int = DEFAULT_OPSET,
              name: str = "main", fuse: bool = True) -> ir.Model:
    """Translates an in-memory StableHLO module into an onnx-ir Model.

    Raises TargetError when a strict target (`core`) cannot run the result.
    """
    return translate_report(module, target=target, opset=opset, name=name, fuse=fuse).model


def translate_report(module: mlir.Module, *, target: Target | str = ORT_CPU, opset: int = DEFAULT_OPSET,
                     name: str = "main", fuse: bool = True) -> ConversionReport:
    """`translate`, keeping what it did: the model is the report's `.model`."""
    target = targets.get(target)
    with InterruptGuard():  # Ctrl-C raised, not lost in a garbage-collector callback
        prepared = prepare(module)
        with module.context:
            translator = Translator(prepared, target, opset)
            model = translator.translate(graph_name=name)
        optimized = optimize_report(model, target) if fuse else None
        violations = targets.check(model, target)
    return ConversionReport(model, dict(translator.op_counts), optimized, target, violations)
