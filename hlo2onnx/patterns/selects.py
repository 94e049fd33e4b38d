"""Dominated selects: a region analysis over the uses of a Where, run before the node rules (algebra.simplify).

A select is dominated when everything computed from it is selected again on the same mask: then the
masked-out branch never reaches a result, and the outer select alone decides. Seeing that takes the
whole forward region of uses, which no single-node rule can.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hlo2onnx.patterns.cleanup import static_shape

# Nodes whose output at each position depends only on their inputs at that position
# (after broadcasting): a value's positions keep their meaning through them.
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log",
    "Sin", "Cos", "Tan", "Tanh", "Sigmoid", "Erf", "Sign", "Floor", "Ceil", "Round", "Relu", "Cast", "Identity",
    "Not", "And", "Or", "Xor", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "IsNaN", "IsInf",
    "Where", "Softplus", "Atan", "Asin", "Acos", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
})


# Integer kernels that fail on some inputs: a masked-out position must still be computable.
_TRAPS = frozenset({"Div", "Mod"})


def drop_dominated_selects(graph: ir.Graph) -> int:
    """where(m, a, b) -> a when every use of it only reaches the `x` input of a where(m, ...) (b: the `y` input).

    jnp.where's gradient and jax-md's safe_mask select on the same mask again after some
    arithmetic: `where(m, f(where(m, a, 0)), 0)` is `where(m, f(a), 0)`. Positions
    correspond only through elementwise nodes of one shape, so the search stops at any other.
    """
    count = 0
    for node in list(graph):
        if node.op_type != "Where" or node.domain != "" or node.graph is not graph:
            continue
        out, (m, a, b) = node.outputs[0], node.inputs
        shape = static_shape(out)
        if shape is None:
            continue
        side = _side(out, m, shape, {})
        keep = a if side == 1 else b if side == 2 else None
        if keep is None or keep.dtype != out.dtype or not _fits(keep, out):
            continue
        ir.convenience.replace_all_uses_with(out, keep)
        graph.remove(node, safe=True)
        count += 1
    return count


def _fits(small: ir.Value, value: ir.Value) -> bool:
    """Whether `small` may replace `value` in each of its users: their broadcasts still give their shapes."""
    if static_shape(small) == static_shape(value):
        return True
    if static_shape(small) is None:
        return False
    for user, index in value.uses():
        shapes = [static_shape(v) for v in user.inputs]
        shapes[index] = static_shape(small)
        if None in shapes or np.broadcast_shapes(*shapes) != static_shape(user.outputs[0]):
            return False
    return True


def _side(value: ir.Value, mask: ir.Value, shape: tuple, memo: dict) -> int | None:
    """1 (2) when every use of `value` flows through same-shape elementwise nodes into the x (y) input of a
    where on `mask` of that shape; None otherwise."""
    if value in memo:
        return memo[value]
    memo[value] = None  # also what a cycle would give (graphs have none)
    uses = list(value.uses())
    if value.is_graph_output() or not uses:
        return None
    sides = set()
    for user, index in uses:
        if user.graph is not value.graph or user.domain != "" or len(user.outputs) != 1:
            return None
        if static_shape(user.outputs[0]) != shape:
            return None
        if user.op_type == "Where" and user.inputs[0] is mask and index in (1, 2):
            sides.add(index)
        elif user.op_type in _TRAPS and not user.outputs[0].dtype.is_floating_point():
            return None  # an integer divisor made safe by the select: ORT fails on x / 0
        elif user.op_type in ELEMENTWISE:
            sides.add(_side(user.outputs[0], mask, shape, memo))
        else:
            return None
        if None in sides or len(sides) > 1:
            return None
    memo[value] = sides.pop()
    return memo[value]
