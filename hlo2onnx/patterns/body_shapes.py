"""Static shapes for elementwise nodes and Reshapes whose output has none (Loop and If bodies).

The shape inference before the rewrites reaches the main graph only, and some nodes
of a loop body come out of translation without an output shape (comparisons
against hoisted operands, measured in JAX-MD's FIRE step inside a fori_loop). Every
rewrite needs static shapes, so such a body kept its splat Expands, jnp.mod's full
fix-up and ORT's float Mod. An elementwise node's output shape is the broadcast of
its inputs' shapes, a Reshape's is its constant target: nothing else is assumed.
"""
from __future__ import annotations

from math import prod

import numpy as np
import onnx_ir as ir

from hlo2onnx.patterns.selects import ELEMENTWISE
from hlo2onnx.patterns.cleanup import all_graphs, const_array, static_shape


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


def _reshaped(node: ir.Node) -> tuple[int, ...] | None:
    """A Reshape's output shape from its constant target (0 copies the input's dim unless allowzero, -1 the rest)."""
    source, target = static_shape(node.inputs[0]), const_array(node.inputs[1])
    allowzero = node.attributes.get("allowzero")
    if source is None or target is None or (allowzero is not None and allowzero.value):
        return None
    dims = [source[i] if d == 0 and i < len(source) else int(d) for i, d in enumerate(target.tolist())]
    if dims.count(-1) > 1:
        return None
    total, known = prod(source), prod(d for d in dims if d != -1)
    if -1 in dims:
        if known == 0 or total % known:
            return None
        dims[dims.index(-1)] = total // known
    return tuple(dims) if prod(dims) == total else None


def fill_elementwise_shapes(model: ir.Model) -> int:
    """Sets the missing output shapes of elementwise nodes in every graph, in order; returns how many."""
    count = 0
    for graph in all_graphs(model.graph):
        for node in graph:
            op_type = node.op_type
            if (op_type != "Reshape" and op_type not in ELEMENTWISE) or node.domain != "" or len(node.outputs) != 1 \
                    or static_shape(node.outputs[0]) is not None:
                continue
            out = node.outputs[0]
            if op_type == "Reshape":
                shape = _reshaped(node)
                if shape is not None:
                    out.shape, out.type = ir.Shape(shape), out.type or node.inputs[0].type
                    count += 1
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
