"""Two slow ORT forms along a short axis, rewritten into block copies.

1. Binary elementwise ops whose operand broadcasts along a short last axis: s[..., 1] * v[..., K].

ORT's broadcasting loop calls its kernel once per contiguous run the operands share,
here one call of K elements per position: JAX-MD's force, dR[N, N, 2] * f(r)[N, N, 1],
was 14% of a FIRE step in one Mul (docs/performance.md). Concatenating K copies of s
along the last axis is one pass of block copies, and the op then runs on two operands of
the same shape in one kernel call. Concat copies values bit for bit, so every value
(NaN, infinities, signed zeros) is what the broadcast would have read. algebra.py's
widen rule materializes an operand that broadcasts before the last axis; this one the
last axis itself (Expand is no help there: it copies in runs of one element too).

2. Slices with a step along one axis, x[..., t::k]: the windows of a pooling whose stride is its size
(a 2x2 max pool in NCHW), which ORT's Slice copies element by element (a quarter of a CNN's time). Along the
last axis, a Reshape to (..., n/k, k), a Transpose that puts the k axis in front and a Split give all k of
them, in whole blocks: two strided Slices and their Max took 1013 us on f32[32, 32, 16, 32], this form 464 us
(measured). Along an inner axis (the pool's H in NCHW) a Reshape to (..., n/k, k * rows) and a Split of the
rows need no Transpose: a whole 2x2 pool of f32[32, 32, 32, 32] took 1.02 ms with strided Slices along H and
0.72 ms with this (measured, ORT 1.32). The same bits move, so the values are exact.
"""
from __future__ import annotations


import numpy as np
import onnx_ir as ir

from hlo2onnx.patterns import noderules
from hlo2onnx.patterns.cleanup import all_graphs, const_array, static_shape

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


# Strides up to this many: the Split's outputs, one per window position.
MAX_STRIDE = 8


# An inner axis's windows are split as blocks of what follows the axis: rows of at least this many elements.
MIN_BLOCK = 16


def _axis_stride(node: ir.Node) -> tuple[int, int, int, int] | None:
    """(axis, t, k, count) when the Slice is x[..., t : t + k * count : k, ...] along one axis of x, k > 1, and
    that axis is the last one or what follows it makes rows of MIN_BLOCK elements or more."""
    shape, arrays = static_shape(node.inputs[0]), [const_array(v) for v in node.inputs[1:5]]
    if shape is None or len(arrays) != 4 or any(a is None or a.size != 1 for a in arrays):
        return None
    start, end, axis, step = (int(a.reshape(())) for a in arrays)
    axis %= len(shape)
    n = shape[axis]
    if not 1 < step <= MAX_STRIDE or not 0 <= start < step:
        return None
    if axis != len(shape) - 1 and int(np.prod(shape[axis + 1:])) < MIN_BLOCK:
        return None
    count = len(range(start, min(end, n) if end >= 0 else n + end, step))
    # Whole windows only: x[..., ::2] of an odd length has one element more than (..., n // 2, 2) holds.
    return (axis, start, step, count) if 0 < count and count * step <= n else None


class _StridedSlices:
    """The Slice rule; remembers each (x, axis, k, count) Split so that x's other window positions share it."""

    def __init__(self) -> None:
        self.splits: dict[tuple[int, int, int, int], list[ir.Value]] = {}

    def __call__(self, node: ir.Node, emit: noderules.Emitter) -> ir.Value | None:
        found, x = _axis_stride(node), node.inputs[0]
        out = static_shape(node.outputs[0])
        if found is None or int(np.prod(static_shape(x))) < MIN_ELEMENTS or 0 in out:
            return None
        axis, t, k, count = found
        key = (id(x), axis, k, count)
        if key not in self.splits:
            if not all(emit.allows(op, x) for op in ("Reshape", "Transpose", "Split")):
                return None
            self.splits[key] = self._split(emit, x, axis, k, count, node.outputs[0])
        return emit("Reshape", self.splits[key][t], emit.graph_shape(out), like=node.outputs[0])

    @staticmethod
    def _split(emit: noderules.Emitter, x: ir.Value, axis: int, k: int, count: int, like: ir.Value) -> list[ir.Value]:
        shape = static_shape(x)
        rank, before, after = len(shape), list(shape[:axis]), list(shape[axis + 1:])
        if count * k != shape[axis]:  # crop to whole windows: a unit-step Slice copies rows
            ends = emit.graph_shape((count * k,))
            x = emit("Slice", x, emit.graph_shape((0,)), ends, emit.graph_shape((axis,)), like=x)
            x.shape = ir.Shape(before + [count * k] + after)
        if after:  # an inner axis: window position j is the j-th block of each (count, k * rows) row
            rows = int(np.prod(after))
            blocks = emit("Reshape", x, emit.graph_shape(tuple(before + [count, k * rows])), like=x)
            blocks.shape = ir.Shape(before + [count, k * rows])
            split = ir.Node("", "Split", [blocks, emit.graph_shape((rows,) * k)], [ir.AttrInt64("axis", axis + 1)],
                            num_outputs=k)
            part_shape = before + [count, rows]
        else:
            blocks = emit("Reshape", x, emit.graph_shape(tuple(before + [count, k])), like=x)
            blocks.shape = ir.Shape(before + [count, k])
            front = emit("Transpose", blocks, like=x, attrs=(ir.AttrInt64s("perm", [rank] + list(range(rank))),))
            front.shape = ir.Shape([k] + before + [count])
            split = ir.Node("", "Split", [front, emit.graph_shape((1,) * k)], [ir.AttrInt64("axis", 0)],
                            num_outputs=k)
            part_shape = [1] + before + [count]
        emit.graph.insert_before(emit.anchor, split)
        emit.created.append(split)
        for part in split.outputs:
            part.type, part.shape = like.type, ir.Shape(part_shape)
        return list(split.outputs)


def widen_last_axes(model: ir.Model, broadcasts: bool = True) -> int:
    """The rewrites over every graph; returns how many nodes they replaced. Runs after the clean-ups
    (which would fold the copies back into a broadcast). `broadcasts=False` leaves the broadcasting ops (1.)
    as they are: a compiler that fuses the broadcast into the op's loop reads s in place, where the Concat
    writes it out twice (IREE: two strided copy dispatches, 2.4 of the f32 FIRE step's 11 ms)."""
    total = 0
    for graph in all_graphs(model.graph):
        rules = {**(dict.fromkeys(_OPS, _widen_last_axis) if broadcasts else {}), "Slice": _StridedSlices()}
        total += noderules.rewrite(graph, rules)
    return total
