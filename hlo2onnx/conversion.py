"""Converting a saved model without its Python source: the API behind the `hlo2onnx` command.

    conversion = hlo2onnx.convert("model.mlir", "model.onnx")
    print(conversion.check().summary())

Reading is in `loading`, translation in `pipeline`, the numerical check in
`check`. `convert` runs jaxlib's parsers in this process: on malformed binary
input they can abort it (docs/formats.md); the `hlo2onnx` command contains
that by converting in a child process.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import jax
import numpy as np
import onnx
import onnx_ir as ir
from jax import export
from jax.extend.mlir import ir as mlir

from hlo2onnx import compat, names, pipeline, targets
from hlo2onnx.check import CheckError, CheckResult, check
from hlo2onnx.errors import Hlo2OnnxError
from hlo2onnx.files import save_model
from hlo2onnx.loading import (FORMATS, Loaded, check_signature, exported_adjuster, from_exported, load,
                              module_name, quiet_context, read_source)
from hlo2onnx.patterns import Report
from hlo2onnx.pipeline import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, Progress, timed
from hlo2onnx.report import ConversionReport
from hlo2onnx.targets import Target
from hlo2onnx.targets import Violation

__all__ = ["convert", "Conversion", "CheckError", "CheckResult", "DEFAULT_OPSET", "MIN_OPSET", "MAX_OPSET",
           "FORMATS", "Loaded"]


@dataclass
class Conversion:
    """The result of `convert`: the ONNX model and what was learned on the way."""

    model: ir.Model
    loaded: Loaded
    op_counts: dict[str, int]
    timings: dict[str, float] = field(default_factory=dict)
    optimized: Report | None = None  # what clean-up and fusion did (None: fusion off)
    target: Target | None = None
    violations: list[Violation] = field(default_factory=list)  # nodes the target runs on its fallback
    # Positions of the inputs and outputs made NCHW at the boundary (inputs_as_nchw, outputs_as_nchw).
    nchw: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))

    @property
    def format(self) -> str:
        return self.loaded.format

    def to_proto(self) -> onnx.ModelProto:
        return ir.to_proto(self.model)

    def save(self, path: str | os.PathLike, external_data: str | None = None) -> str | None:
        """Writes the model atomically: a failure leaves any existing file as it was.

        Weights go to `external_data` (a file name beside `path`) when given, and always when the model
        would pass protobuf's 2 GB limit. Returns the weights file's name, or None when there is none.
        """
        try:
            return save_model(self.model, path, external_data)
        except OSError as e:
            raise Hlo2OnnxError(f"cannot write {os.fspath(path)}: {e.strerror or e}") from None
        except ValueError as e:
            raise Hlo2OnnxError(str(e)) from None

    def report(self) -> str:
        """The signature (inputs and outputs by name), then what each StableHLO op kind became, the fusions,
        node counts and the nodes the target runs on its fallback."""
        report = ConversionReport(self.model, self.op_counts, self.optimized, self.target, self.violations)
        return f"signature: {names.signature(self.model)}\n{report}"

    def check(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None, *,
              sizes: Sequence[int] = (2, 5), seed: int = 0) -> CheckResult:
        return check(self.model, self.loaded, inputs, nchw=self.nchw, sizes=sizes, seed=seed)


def convert(source: str | os.PathLike | bytes | mlir.Module | export.Exported,
            output: str | os.PathLike | None = None, *, target: str | Target = "ort-cpu",
            opset: int | None = None, name: str | None = None, dynamic: bool = False, fuse: bool = True,
            progress: Progress | None = None, input_names: Sequence[str] | str | None = None,
            output_names: Sequence[str] | str | None = None, inputs_as_nchw: Sequence[str] | str = (),
            outputs_as_nchw: Sequence[str] | str = ()) -> Conversion:
    """Converts a saved model to ONNX; writes it to `output` (atomically) when given.

    `source` is a path (`-` for stdin), the file's bytes, a module's text (a str of several lines, as
    `Lowered.as_text()` gives it), an in-memory module, a `jax.stages.Lowered` or a `jax.export.Exported`.
    `dynamic` keeps symbolic dims (jax.export shape polymorphism) as ONNX dim_params; without it such inputs
    are rejected. `progress(done, total)` is called while ops are translated.

    Inputs and outputs are named by dict keys where the function takes or returns dicts (`image`, `probs`),
    else as jax names them (`x`, `out0`); `input_names`/`output_names` rename them all, in order (a list, or
    one comma-separated str). `inputs_as_nchw`/`outputs_as_nchw` name (by their final names) NHWC inputs and
    outputs to take and give as NCHW instead, with a Transpose at the boundary that the layout pass folds into
    the convolutions where it can.
    `target`: a name, a "package.module:NAME" path or a Target (docs/extending.md); `opset`: None for the
    target's own (else DEFAULT_OPSET).
    """
    target = targets.get(target)
    opset = pipeline.resolve_opset(target, opset)
    if dynamic and target.static_shapes:
        raise targets.TargetError(target, [Violation("graph inputs", "symbolic dims (dynamic=True): the target "
                                                     "takes static shapes only", None, None)])
    timings: dict[str, float] = {}
    constants = None
    if isinstance(source, jax.stages.Lowered):
        source, constants = source.compiler_ir("stablehlo"), compat.const_args(source)
    elif isinstance(source, str) and "\n" in source:  # text, not a path (opening it failed as a file name)
        source = source.encode()
    if not isinstance(source, (str, os.PathLike, bytes, bytearray, mlir.Module, export.Exported)):
        hint = " (a function converts as jax.jit(f).lower(*args))" if callable(source) else ""
        raise TypeError(f"expected a path, the file's bytes, a module's text, an mlir.Module, a jax.stages.Lowered "
                        f"or a jax.export.Exported, got {type(source).__name__}{hint}")
    with timed(timings, "read"):
        data = source if isinstance(source, (bytes, bytearray, mlir.Module, export.Exported)) \
            else read_source(source)
    with timed(timings, "parse"):
        if isinstance(data, mlir.Module):
            loaded = Loaded("module", data, module_name(data), constants=constants)
        elif isinstance(data, export.Exported):
            loaded = from_exported(data, quiet_context())
        else:
            loaded = load(data)
    check_signature(loaded, dynamic)
    result = pipeline.run(loaded.module, target=target, opset=opset, name=name or loaded.name, fuse=fuse,
                          progress=progress, timings=timings, adjust=exported_adjuster(loaded),
                          constants=loaded.constants)
    conversion = Conversion(result.model, loaded, result.op_counts, timings, result.optimized, result.target,
                            result.violations)
    conversion.nchw = names.apply(result.model, input_names=input_names, output_names=output_names,
                                  inputs_as_nchw=inputs_as_nchw, outputs_as_nchw=outputs_as_nchw)
    if output is not None:
        with timed(timings, "save"):
            conversion.save(output)
    return conversion
