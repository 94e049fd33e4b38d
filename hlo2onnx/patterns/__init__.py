"""Graph rewrites after translation: clean-up passes, then fusions into high-level ONNX ops.

`optimize_report` is the single entry point the translator calls: it rewrites the model in place and says
which fusions fired.

The pipeline: shape inference (the checks need static shapes), size-limited constant folding, clean-up to
one canonical form, CSE and DCE, then each fusion rule in a fixed order, the exact algebraic rewrites that
save ONNX Runtime passes over large tensors, and a last clean-up.

Three ways to write a rewrite, one per kind of job; a new rewrite takes the first that fits:

* Fusions (many nodes -> one high-level op, checked against the opset and target): onnxscript pattern
  classes, subclasses of base.Fusion with `pattern`, `check` (a MatchResult whose fail() says why a near
  match was refused) and `rewrite`. activations.py, normalization.py, attention.py, convolution.py and
  fusions.py (which also fixes their order); engine.apply_rules applies them, tried only at their root op.
  Each is unit-tested in tests/test_fusions_unit.py.
* Exact algebra (one node, and what feeds it, -> an equal value with fewer passes over memory): node rules,
  one function per root op type, `rule(node, emit) -> value | None`, applied by the one driver
  noderules.rewrite. algebra.py (arithmetic, selects, reductions), movement.py (slices, pads, concats),
  remainder.py (float Mod) and last_axis.py (short broadcast last axes).
* Whole-graph passes, for rewrites that need more than a node's neighbourhood: cleanup.py (the canonical
  form every pattern is written against), layout.py (sinking a Transpose through the region it reaches)
  and selects.py (selects whose every use is selected again on the same mask).

Every rewrite hands the provenance of the nodes it replaces on to the nodes it makes
(hlo2onnx.provenance.inherit_sources). onnxscript is used through its public names; the one private use
(a rule's traced pattern, for the root-op pre-check) is isolated in engine.py.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from hlo2onnx.patterns import algebra, attention, body_shapes, convolution, engine, last_axis, movement, remainder
from hlo2onnx.patterns.cleanup import all_nodes, clean, drop_unread_initializers
from hlo2onnx.patterns.folding import canonicalize
from hlo2onnx.patterns.fusions import accumulate_into_gemms, fusion_rules
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
    ops_before = Counter(node.op_type for node in all_nodes(model.graph))
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
    report.rewrites += last_axis.widen_last_axes(model, broadcasts=not target.fuses_broadcasts)
    accumulated = accumulate_into_gemms(model)  # after the clean-ups: they settle the Gemms' forms
    if accumulated:
        report.fusions["GemmAccumulate"] = accumulated
    # Rewrites build small constants as Constant nodes; the translator's style is initializers.
    common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    drop_unread_initializers(model)
    common_passes.OutputFixPass()(model)
    common_passes.NameFixPass()(model)
    ops_after = Counter(node.op_type for node in all_nodes(model.graph))
    report.nodes_after, report.ops_after = sum(ops_after.values()), dict(ops_after)
    report.seconds = time.perf_counter() - start
    return report


