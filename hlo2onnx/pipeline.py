"""The one translation pipeline: opset check, legalize, translate, optimize, the target's own steps (NaN
guards, exact rewrites: hlo2onnx/targets), target check.

`hlo2onnx.translate_report`, `hlo2onnx.convert` (and so the CLI) and mnjit all
come through `run`; what differs between them (progress, signature fixes for
jax.export artifacts, timings) is passed in, never copied.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Sequence

import jax
import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir
from onnxscript.rewriter.pattern import RewriteRuleSet

from hlo2onnx import ops  # noqa: F401  (fills the rule table)
from hlo2onnx import collector, compat, targets
from hlo2onnx.errors import InvalidInputError
from hlo2onnx.interrupts import InterruptGuard
from hlo2onnx.mlir_io import prepare
from hlo2onnx.opsets import (DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, OpsetError,  # noqa: F401  (public here)
                             check_opset)
from hlo2onnx.patterns import optimize_report
from hlo2onnx.patterns.scopes import unshadow_names
from hlo2onnx.report import ConversionReport
from hlo2onnx.targets import ORT_CPU, Target, portable, resolve_opset
from hlo2onnx.translator import Translator

# Progress is reported at most this often (seconds).
PROGRESS_PERIOD = 0.1

Progress = Callable[[int, int], None]


def run(module: mlir.Module, *, target: Target | str = ORT_CPU, opset: int | None = None, name: str = "main",
        fuse: bool = True, progress: Progress | None = None, timings: dict[str, float] | None = None,
        adjust: Callable[[ir.Model], None] | None = None,
        host_callbacks: Sequence[int] | None = None,
        constants: Sequence[np.ndarray] | None = None) -> ConversionReport:
    """Translates `module` (left unchanged) into an ONNX model with its report.

    `adjust(model)` runs inside the module's context right after translation,
    before optimization (jax.export artifacts rename and reshape inputs there).
    `timings` receives seconds per stage. `host_callbacks`: the ids mnjit runs
    the lowering's Python callbacks under (hlo2onnx/host_calls.py); without
    them a callback is refused. `constants`: the values of main's `jax.const`
    arguments (`compat.const_args` of the Lowered), which become initializers.
    `opset`: None for the target's own (DEFAULT_OPSET where it names none).
    Raises TargetError when a strict target cannot run the result.
    """
    if not isinstance(module, mlir.Module):  # else an AttributeError deep inside ('str' has no 'context')
        raise TypeError(f"expected a StableHLO mlir.Module or a jax.stages.Lowered (jax.jit(f).lower(*args)), got "
                        f"{type(module).__name__}; hlo2onnx.convert takes text, files and jax.export artifacts")
    if not isinstance(name, str):  # else accepted here and refused by onnx_ir only when the model is saved
        raise TypeError(f"the graph name must be a str, got {type(name).__name__}")
    target = targets.get(target)
    opset = resolve_opset(target, opset)
    # Ctrl-C raised, not lost in a garbage-collector callback; the collector waits (hlo2onnx/collector.py).
    with InterruptGuard(), collector.paused():
        return _run(module, target, opset, name, fuse, progress, {} if timings is None else timings, adjust,
                    host_callbacks, constants)


def _run(module, target, opset, name, fuse, progress, timings, adjust, host_callbacks,
         constants) -> ConversionReport:
    with timed(timings, "prepare"):
        try:
            prepared = prepare(module)
        except mlir.MLIRError as e:
            raise InvalidInputError(f"cannot legalize the module: {' '.join(str(e).split())}") from None
    with timed(timings, "translate"), module.context:
        translator = ProgressTranslator(prepared, target, opset, progress, host_callbacks, constants)
        model = translator.translate(graph_name=name)
        if adjust is not None:
            adjust(model)
    optimized = None
    if fuse:
        with timed(timings, "optimize"):
            optimized = optimize_report(model, target)
    unshadow_names(model.graph)
    with timed(timings, "target"):
        portable_for(model, target, fuse)
        violations = targets.enforce(model, target)  # before anything is written: a strict target refuses here
        model = rewritten_for(model, target)
    return ConversionReport(model, dict(translator.op_counts), optimized, target, violations)


def translate(module: mlir.Module | jax.stages.Lowered, *, target: Target | str = ORT_CPU,
              opset: int | None = None, name: str = "main", fuse: bool = True) -> ir.Model:
    """Translates an in-memory StableHLO module (or a jax.stages.Lowered, with its constants) into an onnx-ir
    Model.

    Raises TargetError when a strict target (`core`) cannot run the result.
    """
    return translate_report(module, target=target, opset=opset, name=name, fuse=fuse).model


def translate_report(module: mlir.Module | jax.stages.Lowered, *, target: Target | str = ORT_CPU,
                     opset: int | None = None, name: str = "main", fuse: bool = True,
                     host_callbacks: Sequence[int] | None = None) -> ConversionReport:
    """`translate`, keeping what it did: the model is the report's `.model`. `host_callbacks`: see `run`."""
    constants = None
    if isinstance(module, jax.stages.Lowered):
        module, constants = module.compiler_ir("stablehlo"), compat.const_args(module)
    return run(module, target=target, opset=opset, name=name, fuse=fuse, host_callbacks=host_callbacks,
               constants=constants)


def portable_for(model: ir.Model, target: Target, fuse: bool = True) -> None:
    """The target's own fusions (unless not `fuse`), then NaN guards where its runtime is not known to
    propagate NaN (targets/portable.py): the graph the target's table is checked against."""
    if target.fusions and fuse:
        RewriteRuleSet(list(target.fusions)).apply_to_model(model)
    if not target.propagates_nan:
        portable.guard_nan(model)


def rewritten_for(model: ir.Model, target: Target) -> ir.Model:
    """After the check: the ONNX functions of the custom ops the model calls, the target's exact rewrites in
    order (they change forms the table was measured on into ones the runtime takes: IREE's fori_loop Loop gets
    a condition input, which the table would read as a while loop), and the record of what the model assumes
    and of what its consumer must be told (`Target.metadata`).
    Every front end writes the result. Returns the model (a new one when anything changed it)."""
    if target.rewrites or target.functions:
        proto = ir.to_proto(model)
        changed = portable.add_functions(proto, target.functions)
        for rewrite in target.rewrites:
            changed |= bool(rewrite(proto))
        if changed:
            model = ir.from_proto(proto)
    portable.record_assumptions(model)  # last: a rewrite may add integer arithmetic (IREE's Neg as Sub)
    model.metadata_props.update(target.metadata)
    return model


@contextmanager
def timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    """Adds the seconds the block takes to `timings[stage]`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - start


class ProgressTranslator(Translator):
    """The translator, reporting how many ops it has emitted (for modules with thousands)."""

    def __init__(self, module: mlir.Operation, target: Target, opset: int, progress: Progress | None,
                 host_callbacks: Sequence[int] | None = None, constants: Sequence[np.ndarray] | None = None):
        super().__init__(module, target, opset, host_callbacks, constants)
        self._progress = progress
        self._done = 0
        self._last = 0.0
        self._total = _count_ops(self.functions, "main", {}) if progress else 0

    def emit_op(self, op, name, inputs, b, operands=None, results=None):
        outputs = super().emit_op(op, name, inputs, b, operands, results)
        if self._progress is not None:
            self._done += 1
            now = time.perf_counter()
            if now - self._last >= PROGRESS_PERIOD:
                self._last = now
                self._progress(min(self._done, self._total), self._total)
        return outputs

    def translate(self, name: str = "main", graph_name: str = "main") -> ir.Model:
        model = super().translate(name, graph_name)
        if self._progress is not None:
            self._progress(self._total, self._total)
        return model


def _count_ops(functions: Mapping[str, mlir.Operation], name: str, memo: dict[str, int]) -> int:
    """Ops emitted for function `name`, counting each inlined call again (an estimate: bodies of
    reductions are counted though they are not emitted)."""
    if name not in memo:
        memo[name] = 0  # recursion guard
        memo[name] = _count_region_ops(functions[name].regions[0], functions, memo) if name in functions else 0
    return memo[name]


def _count_region_ops(region: mlir.Region, functions, memo) -> int:
    total = 0
    for block in region.blocks:
        for op in block.operations:
            total += 1
            if op.operation.name == "func.call":
                total += _count_ops(functions, mlir.FlatSymbolRefAttr(op.attributes["callee"]).value, memo)
            for inner in op.regions:
                total += _count_region_ops(inner, functions, memo)
    return total
