"""The check of a finished model against a target: each node outside its profile, named with the StableHLO
op and source line that produced it (the node metadata the translator writes); and the exact expansions of
the ops a target takes only in expanded form.

Rules pick lowerings inside the profile (`Builder.typed` widens to a dtype the
target runs, fusions only emit ops it has). `validate` then walks the final graph.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import onnx_ir as ir
from onnx_ir.tape import Tape

from hlo2onnx import host_calls
from hlo2onnx.errors import Hlo2OnnxError
from hlo2onnx.provenance import SOURCE_LOC, SOURCE_OP
from hlo2onnx.targets.profile import Target

@dataclass(frozen=True)
class Violation:
    """One node outside a target's profile, and the StableHLO op behind it."""

    op_type: str
    reason: str
    source_op: str | None
    where: str | None

    def __str__(self) -> str:
        source = f" from {self.source_op}" if self.source_op else ""
        return f"{self.op_type} ({self.reason}){source}" + (f" at {self.where}" if self.where else "")


class TargetError(Hlo2OnnxError):
    """The model needs ops or dtypes the target does not accept."""

    def __init__(self, target: Target, violations: list[Violation]):
        self.target, self.violations = target, violations
        counts = Counter(str(v) for v in violations)
        lines = [f"{text}" + (f" [x{n}]" if n > 1 else "") for text, n in counts.items()]
        super().__init__(f"target {target.name} cannot run {len(violations)} node(s): " + "; ".join(lines))


# Ops whose kernel dtype is not their first input's (Where's first input is the bool condition).
_TYPED_INPUT = {"Where": 1}


def _kernel_dtype(node: ir.Node) -> np.dtype | None:
    values = [v for v in node.inputs if v is not None] or list(node.outputs)
    index = _TYPED_INPUT.get(node.op_type, 0)
    value = values[index] if index < len(values) else values[0] if values else None
    return None if value is None or value.dtype is None else np.dtype(value.dtype.numpy())


def _reasons(node: ir.Node, target: Target) -> Iterable[str]:
    if host_calls.is_host_call(node):
        if target.runtime != "onnxruntime" or target.device != "cpu":
            yield "a Python host callback runs only on mnjit's ort-cpu runtime"
        return
    if node.domain not in ("", "ai.onnx"):
        if node.op_type not in target.custom_ops.get(node.domain, ()):
            yield f"custom domain {node.domain}"
        return
    if target.ops is not None and node.op_type not in target.ops:
        yield "no kernel"
        return
    if target.dtypes is not None:
        bad = sorted({np.dtype(v.dtype.numpy()).name for v in [*node.inputs, *node.outputs]
                      if v is not None and v.dtype is not None and np.dtype(v.dtype.numpy()) not in target.dtypes})
        if bad:
            yield f"dtype {', '.join(bad)} not accepted"
            return
    if target.narrowed:
        bad = sorted({np.dtype(v.dtype.numpy()).name for v in [*node.inputs, *node.outputs]
                      if v is not None and v.dtype is not None and np.dtype(v.dtype.numpy()) in target.narrowed})
        if bad:
            yield f"{', '.join(bad)} would be computed in a narrower type"
            return
    dtype, key = _kernel_dtype(node), _kernel_key(node)
    if dtype is not None and dtype in target.wrong.get(key, ()):
        yield f"wrong results for {dtype.name}"
        return
    if dtype is not None and dtype in target.refused.get(key, ()):
        yield f"no kernel for {key if ':' in key else dtype.name}"
        return
    if target.ops is not None:  # a kernel table: check the op's dtype against it
        if dtype is not None and not target.supports(node.op_type, dtype):
            yield f"no kernel for {dtype.name}"


def _kernel_key(node: ir.Node) -> str:
    """The op's key in a `wrong` table: Pad and the scatters differ by mode or reduction (`ScatterND:add`),
    casts by the dtype they make (`Cast:int64`), MaxPool by whether it pads (`MaxPool:padded`), TopK by whether its
    indices are read (`TopK:indices`), Gelu by its form (`Gelu:tanh`), Loop by whether it has scan outputs (`Loop:scan`) or a condition (`Loop:while`)."""
    if node.op_type == "TopK" and len(node.outputs) > 1 and (node.outputs[1].uses()
                                                              or node.outputs[1].is_graph_output()):
        return "TopK:indices"  # the order of ties shows only in the indices
    if node.op_type == "Loop" and len(node.outputs) > len(node.inputs) - 2:
        return "Loop:scan"  # with scan outputs (values stacked per iteration) besides the carried ones
    if node.op_type == "Loop" and (node.inputs[0] is None or node.inputs[1] is not None):
        return "Loop:while"  # ended by a condition, not (only) by its trip count
    if node.op_type == "MaxPool" and any(node.attributes.get_ints("pads", ())):
        return "MaxPool:padded"  # padding of its own (IREE pads integers with 0, not the type's lowest value)
    if node.op_type == "Cast" and node.outputs[0].dtype is not None:  # keyed by the dtype it makes
        return f"Cast:{np.dtype(node.outputs[0].dtype.numpy()).name}"
    if node.op_type == "Gelu" and node.attributes.get_string("approximate", "none") == "tanh":
        return "Gelu:tanh"
    attr = node.attributes.get("mode" if node.op_type == "Pad" else "reduction")
    if node.op_type in ("Pad", "ScatterND", "ScatterElements") and attr is not None:
        return f"{node.op_type}:{attr.value}"
    return node.op_type


def validate(model: ir.Model, target: Target) -> list[Violation]:
    """Every node of `model` (subgraphs included) that `target` cannot run; empty for ORT CPU's own lowerings."""
    found: list[Violation] = []
    for value in [*model.graph.inputs, *model.graph.outputs]:
        if value.dtype is not None and np.dtype(value.dtype.numpy()) in target.boundary_narrowed | target.narrowed:
            where = "input" if value in model.graph.inputs else "output"
            found.append(Violation(f"graph {where} {value.name}", f"{np.dtype(value.dtype.numpy()).name} would be "
                                   "computed in a narrower type", None, None))
    if target.static_shapes:
        for value in [*model.graph.inputs, *model.graph.outputs]:
            if value.shape is None or not all(isinstance(d, int) for d in value.shape):
                where = "input" if value in model.graph.inputs else "output"
                found.append(Violation(f"graph {where} {value.name}", f"shape {value.shape} is not static", None,
                                       None))
    _validate_graph(model.graph, target, (None, None), found)
    return found


def _validate_graph(graph: ir.Graph, target: Target, outer: tuple[str | None, str | None],
                    found: list[Violation]) -> None:
    """`outer`: the source of the Loop/If holding `graph`, for body nodes a rule built without metadata."""
    for node in graph:
        source = (node.metadata_props[SOURCE_OP], node.metadata_props.get(SOURCE_LOC)) \
            if SOURCE_OP in node.metadata_props else outer
        found.extend(Violation(node.op_type, reason, *source) for reason in _reasons(node, target))
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                _validate_graph(attr.value, target, source, found)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.value:
                    _validate_graph(sub, target, source, found)


def _expand_isnan(tape: Tape, x: ir.Value, graph: ir.Graph) -> ir.Value:
    return tape.op("Not", [tape.op("Equal", [x, x])])


def _expand_isinf(tape: Tape, x: ir.Value, graph: ir.Graph) -> ir.Value:
    # An initializer, not a Constant node: core (the target that expands IsInf) has no Constant op.
    name = next(f"inf_{i}" for i in itertools.count(len(graph.initializers)) if f"inf_{i}" not in graph.initializers)
    inf = ir.Value(name=name, const_value=ir.tensor(np.asarray(np.inf, x.dtype.numpy())))
    inf.type, inf.shape = ir.TensorType(x.dtype), ir.Shape([])
    graph.register_initializer(inf)
    return tape.op("Equal", [tape.op("Abs", [x]), inf])


# Exact expansions into common ops, for the ops in a target's `expanded`. Applied after fusion, so the
# fusion patterns (which look for IsNaN in max's NaN guard) still see the translator's own form.
_EXPANSIONS = {"IsNaN": _expand_isnan, "IsInf": _expand_isinf}


def legalize(model: ir.Model, target: Target) -> int:
    """Replaces ops the target lacks by their exact expansions (main graph); returns how many."""
    count = 0
    for node in list(model.graph):
        if node.op_type not in target.expanded or node.domain != "":
            continue
        expand = _EXPANSIONS[node.op_type]
        tape = Tape()
        result = expand(tape, node.inputs[0], model.graph)
        result.type, result.shape = node.outputs[0].type, node.outputs[0].shape
        for new in tape.nodes:
            new.metadata_props.update(node.metadata_props)
        model.graph.insert_before(node, tape.nodes)
        out = node.outputs[0]
        if out.is_graph_output():  # the expansion takes the output's place and its name (callers see it)
            name, out.name = out.name, None
            result.name = name
        ir.convenience.replace_all_uses_with(out, result, replace_graph_outputs=True)
        model.graph.remove(node, safe=True)
        count += 1
    return count


def enforce(model: ir.Model, target: Target) -> list[Violation]:
    """Raises TargetError for a strict target (no fallback) the model does not fit; returns the fallbacks otherwise."""
    legalize(model, target)
    violations = validate(model, target)
    if violations and target.fallback is None:
        raise TargetError(target, violations)
    return violations
