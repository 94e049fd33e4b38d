"""The conversion report: what each StableHLO op kind became, which fusions fired, node counts, target fit.

    print(mnjit(f).lower(x).report())        hlo2onnx model.mlir --report

The mapping is read from the node metadata the translator writes (which
StableHLO op made each node) and the fusions merge (a fused node names every
op it replaced), so it describes the final graph, after clean-up and fusion.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import onnx_ir as ir

from hlo2onnx.patterns import Report
from hlo2onnx.targets import Target
from hlo2onnx.targets import Violation
from hlo2onnx.provenance import RULE, SOURCE_OP


@dataclass
class ConversionReport:
    """What one translation did; `str()` gives the text report."""

    model: ir.Model
    op_counts: dict[str, int]  # StableHLO op kind -> ops translated
    optimized: Report | None = None  # None when fusion was off
    target: Target | None = None
    violations: list[Violation] = field(default_factory=list)

    def mapping(self) -> dict[str, Counter]:
        """StableHLO op kind -> ONNX op types of the final nodes it produced (fused nodes count for each source)."""
        result: dict[str, Counter] = defaultdict(Counter)
        for node in ir.traversal.RecursiveGraphIterator(self.model.graph):
            for source in node.metadata_props.get(SOURCE_OP, "").split(","):
                if source:
                    result[source][node.op_type] += 1
        return dict(result)

    def fused_types(self) -> dict[str, set[str]]:
        """StableHLO op kind -> ONNX op types that a fusion made out of it."""
        result: dict[str, set[str]] = defaultdict(set)
        fusions = set(self.optimized.fusions) if self.optimized else set()
        for node in ir.traversal.RecursiveGraphIterator(self.model.graph):
            if node.metadata_props.get(RULE) in fusions:
                for source in node.metadata_props.get(SOURCE_OP, "").split(","):
                    result[source].add(node.op_type)
        return dict(result)

    def __str__(self) -> str:
        nodes = Counter(node.op_type if not node.domain else f"{node.domain}.{node.op_type}"
                        for node in ir.traversal.RecursiveGraphIterator(self.model.graph))
        initializers = list(self.model.graph.initializers.values())
        size = sum(v.const_value.nbytes for v in initializers if v.const_value is not None)
        lines = [f"StableHLO ops: {sum(self.op_counts.values())} ({len(self.op_counts)} kinds)"]
        lines += _table(self.op_counts)
        lines.append(f"ONNX nodes: {sum(nodes.values())} ({len(nodes)} types), "
                     f"initializers: {len(initializers)} ({_bytes(size)})")
        lines += _table(nodes)
        lines.append("What each StableHLO op kind became (* from a fusion):")
        mapping, fused = self.mapping(), self.fused_types()
        for kind, count in sorted(self.op_counts.items(), key=lambda kv: (-kv[1], kv[0])):
            became = mapping.get(kind)
            if kind == "func.call":
                text = "inlined (its ops are listed under their own kinds)"
            elif became:
                text = ", ".join(f"{op}{'*' if op in fused.get(kind, ()) else ''} x{n}"
                                 for op, n in sorted(became.items(), key=lambda kv: (-kv[1], kv[0])))
            else:
                text = "no node (a constant, folded, or removed by clean-up)"
            lines.append(f"- {kind} x{count} -> {text}")
        if self.optimized is not None:
            fired = ", ".join(f"{name} x{n}" for name, n in self.optimized.fusions.items()) or "none"
            lines.append(f"Fusions: {fired}")
            lines.append(f"Nodes: {self.optimized.nodes_before} translated -> {self.optimized.nodes_after} "
                         f"after clean-up and fusion")
        if self.target is not None:
            lines.append(_target_line(self.target, self.violations))
        return "\n".join(lines)


def _target_line(target: Target, violations: Sequence[Violation]) -> str:
    if not violations:
        return f"Target {target.name}: every node fits"
    counts = Counter(str(v) for v in violations)
    what = "run on the fallback (ORT CPU)" if target.fallback is not None else "do not fit"
    listed = "; ".join(f"{text}" + (f" [x{n}]" if n > 1 else "") for text, n in counts.items())
    return f"Target {target.name}: {len(violations)} node(s) {what}: {listed}"


def _table(counts: Mapping[str, int]) -> list[str]:
    width = max((len(k) for k in counts), default=0)
    return [f"  {k:<{width}}  {n:>6}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
