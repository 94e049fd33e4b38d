"""Graph rewrites after translation: clean-up passes, then fusions into high-level ONNX ops.

`optimize` is the single entry point the translator calls; `optimize_report`
does the same and says which fusions fired.

The pipeline: shape inference (the checks need static shapes), size-limited
constant folding, clean-up to one canonical form (cleanup.py), CSE and DCE,
then each fusion rule in a fixed order, the exact algebraic rewrites that save ONNX Runtime
passes over large tensors (algebra.py), and a last clean-up.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from hlo2onnx.patterns import algebra, attention, body_shapes, convolution, engine, last_axis, movement, remainder
from hlo2onnx.patterns.cleanup import drop_unread_initializers, canonicalize, clean
from hlo2onnx.patterns.fusions import fusion_rules
from hlo2onnx.patterns.layout import sink_transposes
from hlo2onnx.targets import Target

@dataclass
class Report:
    """What `optimize` did to one model."""

    fusions: dict[str, int] = field(default_factory=dict)  # rule name -> times it fired
    rewrites: int = 0  # nodes the algebraic rewrites (algebra.py) replaced
    nodes_before: int = 0
    nodes_after: int = 0
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def __str__(self) -> str:
        fired = ", ".join(f"{name} x{n}" for name, n in self.fusions.items()) or "none"
        return (f"nodes {self.nodes_before} -> {self.nodes_after} in {self.seconds * 1e3:.1f} ms; "
                f"fusions: {fired}")


def _build_extra_rules(opset: int, target: Target) -> tuple[list, list]:
    return (convolution.rules(opset, target),
            convolution.late_rules(opset, target) + attention.rules(opset, target))


# The convolution rules, and the rules over ops other fusions make (BatchNormalization, Softmax), built
# once per opset and target and lent to one translation at a time (tracing a pattern costs; rules keep
# per-match state: see engine.RulePool).
_EXTRA_RULES = engine.RulePool(_build_extra_rules)


def optimize_report(model: ir.Model, target: Target) -> Report:
    """Rewrites `model` in place; returns which fusions fired and the node counts before and after."""
    start = time.perf_counter()
    ops_before = Counter(node.op_type for node in model.graph.all_nodes())
    opset = model.opset_imports.get("", 0)
    report = Report(nodes_before=sum(ops_before.values()), ops_before=dict(ops_before))
    body_shapes.fill_elementwise_shapes(model)  # before the clean-up, whose rules need static shapes
    canonicalize(model)
    if sink_transposes(model):  # NHWC<->NCHW pairs around convolutions cancel; merge what that exposes
        clean(model)
    with fusion_rules(model, opset, target) as rules, \
            _EXTRA_RULES.borrow((opset, target.name), opset, target) as (early, late):
        fusions = engine.apply_rules(model, rules + early)
        if any(node.op_type in ("BatchNormalization", "Softmax") for node in model.graph) and late:
            clean(model)  # the first fusions leave dead nodes behind; a pattern needs its values used only once
            fusions += engine.apply_rules(model, late)
    report.fusions = dict(fusions)
    report.rewrites = algebra.simplify(model, target, {**algebra.RULES, **movement.RULES, **remainder.RULES})
    clean(model)
    report.rewrites += algebra.widen_broadcasts(model)
    report.rewrites += last_axis.widen_last_axes(model)
    # Rewrites build small constants as Constant nodes; the translator's style is initializers.
    common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    drop_unread_initializers(model)
    common_passes.OutputFixPass()(model)
    common_passes.NameFixPass()(model)
    ops_after = Counter(node.op_type for node in model.graph.all_nodes())
    report.nodes_after, report.ops_after = sum(ops_after.values()), dict(ops_after)
    report.seconds = time.perf_counter() - start
    return report


