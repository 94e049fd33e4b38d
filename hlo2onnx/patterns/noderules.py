"""The node-rule driver: exact rewrites written as one function per root op type.

A node rule is `rule(node, emit) -> ir.Value | None`: it looks at `node` (and the nodes feeding it), builds
any new nodes with `emit` in front of it, and returns the value that computes exactly what `node`'s output
did, or None to leave it. `rewrite` applies a table of them (op type -> rule) once over a graph and does
the rest: only default-domain, single-output nodes with static shapes are offered, a result of another
shape or dtype is refused, a graph output keeps its name, and the new nodes inherit the provenance of the
nodes they replace. algebra.py and movement.py are written in this form.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import onnx_ir as ir

from hlo2onnx.patterns.base import numpy_dtype
from hlo2onnx.patterns.cleanup import const_array, detach, remove_detached, static_shape
from hlo2onnx.provenance import inherit_sources
from hlo2onnx.targets import Target


def scalar_array(value: ir.Value | None) -> np.ndarray | None:
    """A one-element constant as a 0-d array (its dtype kept), else None."""
    array = const_array(value)
    return array.reshape(()) if array is not None and array.size == 1 else None


def same_value(a: ir.Value, b: ir.Value) -> bool:
    """The same value, or two one-element constants with the same bits and dtype."""
    if a is b:
        return True
    x, y = scalar_array(a), scalar_array(b)
    return (x is not None and y is not None and x.dtype == y.dtype and static_shape(a) == static_shape(b)
            and x.tobytes() == y.tobytes())


def producer_of(value: ir.Value | None, op_type: str) -> ir.Node | None:
    """The default-domain `op_type` node that computes `value`, if that is what computes it."""
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain == "" else None


def only_use(value: ir.Value) -> bool:
    """`value` feeds one node and is no graph output: a rewrite may take its producer's work over."""
    return len(value.uses()) == 1 and not value.is_graph_output()


class Emitter:
    """Builds the replacement nodes in front of the node being rewritten."""

    def __init__(self, graph: ir.Graph, anchor: ir.Node, target: Target | None = None, opset: int = 0):
        self.graph, self.anchor, self.target, self.opset = graph, anchor, target, opset
        self.created: list[ir.Node] = []

    def allows(self, op_type: str, like: ir.Value) -> bool:
        """Whether the target runs `op_type` on `like`'s dtype (rules that emit a new op type ask first)."""
        return self.target is None or self.target.supports(op_type, numpy_dtype(like))

    def __call__(self, op_type: str, *inputs: ir.Value, like: ir.Value, attrs: tuple = ()) -> ir.Value:
        node = ir.Node("", op_type, inputs, [ir.Attr(a.name, a.type, a.value) for a in attrs])
        self.graph.insert_before(self.anchor, node)
        self.created.append(node)
        out = node.outputs[0]
        out.type, out.shape = like.type, like.shape
        return out

    def graph_shape(self, dims: tuple) -> ir.Value:
        """An int64 shape initializer (Expand's second input) of the graph being rewritten."""
        root = self.graph
        array = np.asarray(dims, np.int64)
        tensor = ir.Tensor(array, name=f"shape_{'x'.join(map(str, dims))}")
        value = root.initializers.get(tensor.name)
        if value is None:
            value = ir.Value(name=tensor.name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.INT64),
                             const_value=tensor)
            root.register_initializer(value)
        return value

    def bool_like(self, op_type: str, a: ir.Value, b: ir.Value) -> ir.Value:
        shape = np.broadcast_shapes(static_shape(a), static_shape(b))
        node = ir.Node("", op_type, [a, b])
        self.graph.insert_before(self.anchor, node)
        self.created.append(node)
        node.outputs[0].type, node.outputs[0].shape = ir.TensorType(ir.DataType.BOOL), ir.Shape(shape)
        return node.outputs[0]


# (node, emit) -> the value that replaces the node's output, or None.
NodeRule = Callable[[ir.Node, Emitter], "ir.Value | None"]


def rewrite(graph: ir.Graph, rules: Mapping[str, NodeRule], target: Target | None = None, opset: int = 0) -> int:
    """One sweep of `rules` (op type -> rule) over `graph`; returns how many nodes were replaced."""
    replaced: list[ir.Node] = []
    for node in list(graph):
        rule = rules.get(node.op_type)
        if rule is None or node.graph is not graph or node.domain != "" or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        if static_shape(out) is None or any(v is None or static_shape(v) is None for v in node.inputs):
            continue
        emit = Emitter(graph, node, target, opset)
        result = rule(node, emit)
        # A value of another shape (one the node broadcast) cannot stand in; emitted nodes left unused go with DCE.
        if result is None or static_shape(result) != static_shape(out) or result.dtype != out.dtype:
            continue
        if out.is_graph_output():
            # Only a new node's output may take a graph output's place (and its name: callers see it).
            if result.producer() is None or result.producer().graph is not graph or result.is_graph_output():
                continue
            name, out.name = out.name, None
            ir.convenience.replace_all_uses_with(out, result, replace_graph_outputs=True)
            result.name = name
        else:
            ir.convenience.replace_all_uses_with(out, result)
        # The new nodes stand for the node and for the producers only it used.
        feeding = [v.producer() for v in node.inputs if v is not None and v.producer() is not None
                   and all(user is node for user, _ in v.uses())]
        inherit_sources([node, *feeding], emit.created, None)
        detach(node)  # removed with the others at the end (see graphs.detach)
        replaced.append(node)
    if replaced:
        remove_detached(graph, replaced)
    return len(replaced)
