"""Static shapes for elementwise nodes whose output has none (Loop and If bodies).

The shape inference before the rewrites reaches the main graph only, and some nodes
of a loop body come out of translation without an output shape (comparisons
against hoisted operands, measured in JAX-MD's FIRE step inside a fori_loop). Every
rewrite needs static shapes, so such a body kept its splat Expands, jnp.mod's full
fix-up and ORT's float Mod. An elementwise node's output shape is the broadcast of
its inputs' shapes: nothing else is assumed.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hlo2onnx.patterns.algebra import ELEMENTWISE
from hlo2onnx.patterns.cleanup import all_graphs, static_shape


_PREDICATES = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "IsNaN", "IsInf", "Not",
                         "And", "Or", "Xor"})


def _type(node: ir.Node) -> ir.TypeProtocol | None:
    """The output's element type, from the op's definition (no guess: None where the inputs do not say)."""
    if node.op_type in _PREDICATES:
        return ir.TensorType(ir.DataType.BOOL)
    if node.op_type == "Cast":
        return ir.TensorType(ir.DataType(node.attributes["to"].value))
    source = node.inputs[1] if node.op_type == "Where" else node.inputs[0]
    return source.type if source is not None else None


def fill_elementwise_shapes(model: ir.Model) -> int:
    """Sets the missing output shapes of elementwise nodes in every graph, in order; returns how many."""
    count = 0
    for graph in all_graphs(model.graph):
        for node in graph:
            if node.op_type not in ELEMENTWISE or node.domain != "" or len(node.outputs) != 1:
                continue
            out = node.outputs[0]
            if static_shape(out) is not None:
                continue
            shapes = [static_shape(v) for v in node.inputs if v is not None]
            if not shapes or None in shapes:
                continue
            try:
                shape = np.broadcast_shapes(*shapes)
            except ValueError:
                continue
            out.shape = ir.Shape(shape)
            if out.type is None:
                out.type = _type(node)
            count += 1
    return count
