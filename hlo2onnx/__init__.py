"""hlo2onnx: StableHLO -> ONNX, one small rule per op.

    model = hlo2onnx.translate(lowered.compiler_ir("stablehlo"))
    conversion = hlo2onnx.convert("model.mlir", "model.onnx")  # files, no Python source
    hlo2onnx.write_triton_repo(conversion, "models")            # a Triton/KServe model repository

Importing the package is cheap: jax and the rules load on first use of a name
below. The `hlo2onnx` command relies on that to answer Ctrl-C at start-up with
one line, and to keep jaxlib's parsers out of its own process (hlo2onnx.cli).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the module that defines it.
_EXPORTS = {
    "translate": "hlo2onnx.pipeline", "translate_report": "hlo2onnx.pipeline", "DEFAULT_OPSET": "hlo2onnx.pipeline",
    "convert": "hlo2onnx.conversion", "Conversion": "hlo2onnx.conversion",
    "Hlo2OnnxError": "hlo2onnx.errors", "InvalidInputError": "hlo2onnx.errors",
    "UnsupportedOpError": "hlo2onnx.errors",
    "TargetError": "hlo2onnx.targets", "TARGETS": "hlo2onnx.targets", "Target": "hlo2onnx.targets",
    "make_context": "hlo2onnx.mlir_io", "parse_module": "hlo2onnx.mlir_io",
    "ConversionReport": "hlo2onnx.report",
    "write_triton_repo": "hlo2onnx.serving",
    "register_custom_call": "hlo2onnx.registry",
}
__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # the names above, for type checkers and IDEs
    from hlo2onnx.conversion import Conversion, convert
    from hlo2onnx.errors import Hlo2OnnxError, InvalidInputError, UnsupportedOpError
    from hlo2onnx.mlir_io import make_context, parse_module
    from hlo2onnx.pipeline import DEFAULT_OPSET, translate, translate_report
    from hlo2onnx.report import ConversionReport
    from hlo2onnx.registry import register_custom_call
    from hlo2onnx.serving import write_triton_repo
    from hlo2onnx.targets import Target
    from hlo2onnx.targets import TARGETS, TargetError


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        importlib.import_module("hlo2onnx.pipeline")  # the rule table, before any name is used
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    try:  # hlo2onnx.targets and other submodules, as attribute access on an eagerly imported package gave
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
