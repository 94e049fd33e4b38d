"""onnx-ir's CSE and dead-code passes, making the same decisions at a fraction of the cost.

clean() runs both on the main graph after every round of clean-up, a dozen walks of a translation; onnx-ir's
versions read each node's attributes through their Python mapping (~2 us a node) and ask ONNX for the schema
of every node kept (~3 us). These read only the attributes of nodes that have some and ask each schema once
per op type; every decision (which nodes merge, which go, which optional outputs lose their name) is onnx-ir
1.1's own, line for line: tests/test_translation_speed.py compares the models with the ones onnx-ir's passes
give.
"""
from __future__ import annotations

from typing import Sequence

import onnx
import onnx_ir as ir

from hlo2onnx.graphs import detach, remove_detached, subgraphs

_GRAPH_TYPES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
_SEQUENCE_TYPES = (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS)
_NON_DETERMINISTIC = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike",
                                "Multinomial"})
# onnx-ir's CommonSubexpressionEliminationPass default: constant attributes above this size are never merged.
_CSE_SIZE_LIMIT = 10


def merge_common_subexpressions(model: ir.Model, nodes: Sequence[ir.Node] | None = None) -> int:
    """CommonSubexpressionEliminationPass()(model): merges main-graph nodes with the same op, inputs and
    attributes into the first of them; returns how many went. `nodes`: the main graph's nodes, when the
    caller listed them already."""
    graph = model.graph
    seen: dict[tuple, ir.Node] = {}
    merged: list[ir.Node] = []
    for node in graph if nodes is None else nodes:
        attrs = _attribute_key(node)
        if attrs is None or (node.op_type in _NON_DETERMINISTIC and node.domain == ""):
            continue
        key = (node.op_identifier(), len(node.outputs), tuple(map(id, node.inputs)), attrs)
        kept = seen.get(key)
        if kept is None:
            seen[key] = node
            continue
        _replace_node(graph, node, kept.outputs)
        merged.append(node)
    if merged:
        # Removed together: Graph.remove copies the graph's outputs into a set on every call (a gradient has
        # thousands). The merged nodes read nothing any more, as onnx-ir's immediate removal leaves them.
        remove_detached(graph, merged)
    return len(merged)


def _attribute_key(node: ir.Node) -> tuple | None:
    """The node's attributes as onnx-ir's CSE compares them; None for a node it never merges (a subgraph, or a
    tensor above the size limit)."""
    attributes = node.attributes
    if not attributes:
        return ()
    values = {}
    for name, attr in attributes.items():
        kind = attr.type
        if kind in _GRAPH_TYPES:
            return None
        value = attr.value
        if kind in _SEQUENCE_TYPES:
            value = tuple(value)
        elif kind is ir.AttributeType.TENSOR:
            if value.size > _CSE_SIZE_LIMIT:
                return None
            array = value.numpy()
            value = (array.shape, str(array.dtype), array.tobytes())
        values[name] = value
    return tuple(sorted(values.items()))


def _replace_node(graph: ir.Graph, node: ir.Node, new_values) -> None:
    """onnx-ir's _remove_node_and_replace_values: the node's uses (and graph outputs) read `new_values`."""
    old_values = node.outputs
    if any(value.is_graph_output() for value in old_values):
        replacement = dict(zip(old_values, new_values))
        for i, output in enumerate(graph.outputs):
            if output not in replacement:
                continue
            new_value = replacement[output]
            if new_value.is_graph_output() or new_value.is_graph_input():
                # The output keeps its own name through an Identity of the value it merges into.
                identity = ir.node("Identity", inputs=[new_value],
                                   outputs=[ir.Value(name=output.name, type=output.type, shape=output.shape)])
                graph.outputs[i] = identity.outputs[0]
                graph.insert_before(node, identity)
            else:
                new_value.name = output.name
                graph.outputs[i] = new_value
    ir.convenience.replace_all_uses_with(old_values, new_values)
    detach(node)


def remove_unused_nodes(model: ir.Model) -> bool:
    """RemoveUnusedNodesPass()(model).modified: drops unused nodes (subgraphs too) and initializers, trailing
    empty inputs, and the names of unused optional outputs."""
    schemas: dict[tuple[str, str, int], tuple[bool, list[bool]] | None] = {}
    count = _remove_unused_in(model.graph, None, schemas)
    graph_outputs, graph_inputs = frozenset(model.graph.outputs), frozenset(model.graph.inputs)
    initializers = model.graph.initializers
    for init in list(initializers.values()):
        if not (init.uses() or init in graph_outputs or init in graph_inputs):
            del initializers[init.name]
            count += 1
    for function in model.functions.values():
        count += _remove_unused_in(function, None, schemas)
    return bool(count)


def _remove_unused_in(graph: ir.Graph | ir.Function, opset: int | None, schemas: dict,
                      is_subgraph: bool = False) -> int:
    graph_outputs = frozenset(graph.outputs)
    if not is_subgraph:
        opset = graph.opset_imports.get("", opset)
    count = 0
    for node in reversed(graph):
        for output in node.outputs:
            if output in graph_outputs or output.uses():
                break
        else:
            graph.remove(node, safe=True)
            count += 1
            continue
        inputs = node.inputs
        if inputs and inputs[-1] is None:
            size = len(inputs)
            while size and inputs[size - 1] is None:
                size -= 1
            node.resize_inputs(size)
        if opset is not None:
            _drop_unused_optional_outputs(node, graph_outputs, opset, schemas)
        for sub in subgraphs(node):
            count += _remove_unused_in(sub, opset, schemas, is_subgraph=True)
    return count


def _schema_facts(op_type: str, domain: str, opset: int, schemas: dict) -> tuple[bool, list[bool] | None] | None:
    """Whether the op has a training_mode attribute, and which of its outputs are optional (None: some output
    is variadic); None for an op without a schema (as onnx-ir, those are left alone)."""
    key = (op_type, domain, opset)
    if key in schemas:
        return schemas[key]
    facts = None
    if domain in ("", "onnx.ai"):
        try:
            schema = onnx.defs.get_schema(op_type, opset, domain=domain)
        except Exception:  # noqa: BLE001 (as onnx-ir: no schema, nothing to remove)
            schema = None
        if schema is not None:
            options = [o.option for o in schema.outputs]
            variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic in options
            optional = None if variadic else [o == onnx.defs.OpSchema.FormalParameterOption.Optional for o in options]
            facts = ("training_mode" in schema.attributes, optional)
    schemas[key] = facts
    return facts


def _drop_unused_optional_outputs(node: ir.Node, graph_outputs: frozenset, opset: int, schemas: dict) -> None:
    """onnx-ir's _remove_unused_optional_outputs."""
    facts = _schema_facts(node.op_type, node.domain, opset, schemas)
    if facts is None:
        return
    has_training_mode, optional = facts
    if node.op_type == "BatchNormalization":
        # Before opset 14, output arity selects training or inference behavior.
        if not has_training_mode:
            return
        training_mode = node.attributes.get("training_mode")
        if training_mode is not None and (training_mode.is_ref() or training_mode.type != ir.AttributeType.INT
                                          or training_mode.as_int() != 0):
            return
        node.attributes.pop("training_mode", None)
    if optional is None or not any(optional):
        return
    for i, out in enumerate(node.outputs):
        if i < len(optional) and optional[i] and out not in graph_outputs and not out.uses():
            out.name = ""
    count = len(node.outputs)
    while count and not node.outputs[count - 1].name:
        count -= 1
    node.resize_outputs(count)
