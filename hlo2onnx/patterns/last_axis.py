"""Binary elementwise ops whose operand broadcasts along a short last axis: s[..., 1] * v[..., K].

ORT's broadcasting loop calls its kernel once per contiguous run the operands share,
here one call of K elements per position: JAX-MD's force, dR[N, N, 2] * f(r)[N, N, 1],
was 14% of a FIRE step in one Mul (docs/performance.md). Concatenating K copies of s
along the last axis is one pass of block copies, and the op then runs on two operands of
the same shape in one kernel call. Concat copies values bit for bit, so every value
(NaN, infinities, signed zeros) is what the broadcast would have read. algebra.py's
widen rule materializes an operand that broadcasts before the last axis; this one the
last axis itself (Expand is no help there: it copies in runs of one element too).
"""
from __future__ import annotations


import numpy as np
import onnx_ir as ir

from hlo2onnx.patterns import noderules
from hlo2onnx.patterns.cleanup import all_graphs, static_shape

# Below this many output elements the broadcast costs too little to matter.
MIN_ELEMENTS = 1 << 16
# Up to this many: a longer last axis already gives the kernel long enough runs.
MAX_AXIS = 4
_OPS = ("Add", "Sub", "Mul", "Div")


def _widen_last_axis(node: ir.Node, emit: noderules.Emitter) -> ir.Value | None:
    out = static_shape(node.outputs[0])
    if len(node.inputs) != 2 or not out or not 1 < out[-1] <= MAX_AXIS or int(np.prod(out)) < MIN_ELEMENTS:
        return None
    shapes = [static_shape(v) for v in node.inputs]
    for i in (0, 1):
        narrow, wide = shapes[i], shapes[1 - i]
        if narrow is None or wide is None or len(narrow) != len(out) or wide != out:
            continue
        if narrow[-1] == 1 and narrow[:-1] == out[:-1]:
            copies = emit("Concat", *[node.inputs[i]] * out[-1], like=node.outputs[0],
                          attrs=(ir.AttrInt64("axis", len(out) - 1),))
            copies.type = node.inputs[i].type  # Concat keeps its input's dtype (a comparison's output may differ)
            operands = [copies, node.inputs[1]] if i == 0 else [node.inputs[0], copies]
            return emit(node.op_type, *operands, like=node.outputs[0])
    return None


def widen_last_axes(model: ir.Model) -> int:
    """The rewrite over every graph; returns how many nodes it replaced. Runs after the clean-ups
    (which would fold the copies back into a broadcast)."""
    rules = dict.fromkeys(_OPS, _widen_last_axis)
    return sum(noderules.rewrite(graph, rules) for graph in all_graphs(model.graph))
