"""Transpose sinking: move a Transpose down through layout-agnostic ops until it meets its inverse.

JAX code is usually NHWC while ONNX's Conv and pools are NCHW, so the
translator wraps every convolution in Transpose(NHWC->NCHW) ... Transpose(NCHW->NHWC).
Between two convolutions the activations pass through elementwise ops (bias,
batch norm, relu), slices (a max pool's windows) and reductions, none of which
care about the layout. Running that region in the layout before the first
Transpose makes it meet the second one, and both disappear.

The rewrite is all-or-nothing per Transpose: every consumer reached from it
must be an op the region can absorb, a Transpose that cancels it, or a
reduction whose result no longer depends on the layout. Operands from outside
the region are re-laid: constants are transposed here, small inputs (a
per-channel bias) get a Reshape when their non-1 dims keep their order.
"""
from __future__ import annotations

import heapq

import numpy as np
import onnx_ir as ir

from hlo2onnx.patterns.cleanup import BROADCASTING, const_array, static_shape

# Elementwise ops of one tensor input (their other inputs, if any, must be scalars: Clip's bounds).
_UNARY = frozenset({"Relu", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Tanh", "Sigmoid", "Abs", "Cast", "Erf",
                    "Floor", "Ceil", "Round", "Identity", "Not", "IsNaN", "IsInf", "Sign", "Sin", "Cos", "Softplus",
                    "LeakyRelu", "HardSigmoid", "HardSwish", "Gelu", "Elu", "Clip"})
_REDUCES = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"})


def _perm(node: ir.Node) -> list[int] | None:
    attr = node.attributes.get("perm")
    return None if attr is None else list(attr.as_ints())


class _Region:
    """The nodes a Transpose can sink through, and what the rewrite must change."""

    def __init__(self, transpose: ir.Node):
        self.transpose = transpose
        self.perm = _perm(transpose)
        self.rank = len(self.perm)
        self.nodes: list[ir.Node] = []  # in discovery order
        self.moved: set[ir.Value] = set()  # values that will hold the untransposed layout
        self.exits: list[ir.Node] = []  # Transposes that cancel
        self.reduce_exits: list[ir.Node] = []  # keepdims=0 reductions whose output keeps its layout
        self.boundary: list[ir.Value] = []  # region outputs read outside it: they get the Transpose back

    def grow(self, position: dict[ir.Node, int]) -> bool:
        """Visits the consumers in graph (topological) order, so every operand from inside is known as such.

        A consumer the region cannot absorb (or a graph output) keeps reading the transposed layout through
        a Transpose put back on that value. The rewrite is worth it when it puts back fewer Transposes than
        it removes, or as many while exposing a fusion (an elementwise op next to the Conv).
        """
        start = self.transpose.outputs[0]
        self.moved.add(start)
        # The consumers by position (a heap), not a scan of the graph from the Transpose on: a gradient reads
        # forward values thousands of nodes later, and the scan made the pass quadratic in the model's size.
        pending: list[tuple[int, ir.Node]] = []
        queued: set[ir.Node] = set()

        def queue_readers(value: ir.Value) -> bool:
            for reader in {use.node for use in value.uses()} - queued:
                if reader not in position:  # a consumer in a subgraph (a Loop body reading the value): not handled
                    return False
                queued.add(reader)
                heapq.heappush(pending, (position[reader], reader))
            return True

        if not queue_readers(start):
            return False
        while pending:
            _, node = heapq.heappop(pending)
            if self._absorb(node) == "region":
                self.nodes.append(node)
                self.moved.add(node.outputs[0])
                if not queue_readers(node.outputs[0]):
                    return False
        inside = set(self.nodes) | set(self.exits) | set(self.reduce_exits)
        self.boundary = [v for v in self.moved if v.is_graph_output() or any(u.node not in inside for u in v.uses())]
        if start in self.boundary:  # the Transpose itself would stay
            return False
        removed = 1 + len(self.exits)
        return len(self.boundary) < removed or (len(self.boundary) == removed and bool(self.nodes))

    def _absorb(self, node: ir.Node) -> str | None:
        if node.domain != "" or len(node.outputs) != 1:
            return None
        if node.op_type == "Transpose":
            q = _perm(node)
            if q is not None and len(q) == self.rank and all(self.perm[q[i]] == i for i in range(self.rank)) \
                    and node.inputs[0] in self.moved and not node.outputs[0].is_graph_output():
                self.exits.append(node)
                return "exit"
            return None
        if node.op_type == "Slice":
            if node.inputs[0] not in self.moved or any(v in self.moved for v in node.inputs[1:]):
                return None
            return "region" if len(node.inputs) >= 4 and const_array(node.inputs[3]) is not None else None
        if node.op_type in _REDUCES:
            axes = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
            keepdims = node.attributes.get("keepdims")
            if axes is None or axes.size == 0 or node.inputs[0] not in self.moved:
                return None
            if keepdims is None or keepdims.as_int() == 1:
                return "region"
            picked = {int(a) % self.rank for a in axes.reshape(-1)}
            kept = [self.perm[i] for i in range(self.rank) if i not in picked]
            if kept != sorted(kept):  # the result's axes would come out in another order
                return None
            self.reduce_exits.append(node)
            return "exit"
        if node.op_type in _UNARY:
            others = [v for v in node.inputs[1:] if v is not None]
            ok = node.inputs[0] in self.moved and all(static_shape(v) in ((), (1,)) for v in others)
            return "region" if ok else None
        if node.op_type in BROADCASTING:
            if static_shape(node.outputs[0]) is None or len(node.outputs[0].shape) != self.rank:
                return None
            for v in node.inputs:
                if v is not None and v not in self.moved and self._relaid_shape(v) is None:
                    return None
            return "region"
        return None

    def _relaid_shape(self, value: ir.Value) -> tuple[int, ...] | None:
        """The shape `value` (an operand from outside) takes in the untransposed layout, if it can."""
        shape = static_shape(value)
        if shape is None or len(shape) > self.rank:
            return None
        full = (1,) * (self.rank - len(shape)) + shape
        relaid = [1] * self.rank
        for i, d in enumerate(full):
            relaid[self.perm[i]] = d
        if const_array(value) is None:  # a Reshape only: the non-1 dims must keep their order
            order = [self.perm[i] for i, d in enumerate(full) if d != 1]
            if order != sorted(order):
                return None
        return tuple(relaid)

    def rewrite(self, graph: ir.Graph) -> None:
        inverse = list(np.argsort(self.perm))
        source = self.transpose.inputs[0]
        ir.convenience.replace_all_uses_with(self.transpose.outputs[0], source)
        self.moved.discard(self.transpose.outputs[0])
        self.moved.add(source)
        for node in self.nodes:
            if node.op_type == "Slice":
                self._remap_axes(graph, node, 3)
            elif node.op_type in _REDUCES:
                self._remap_axes(graph, node, 1)
            elif node.op_type in BROADCASTING:
                for i, v in enumerate(node.inputs):
                    if v is not None and v not in self.moved and any(d != 1 for d in static_shape(v)):
                        node.replace_input_with(i, self._relaid(graph, node, v))
            out = node.outputs[0]
            if out.shape is not None:  # symbolic dims move too (a graph output's names come back with them)
                out.shape = ir.Shape([out.shape.dims[i] for i in inverse])
        for node in self.reduce_exits:
            self._remap_axes(graph, node, 1)
        inside = set(self.nodes) | set(self.exits) | set(self.reduce_exits)
        for value in self.boundary:
            self._transpose_back(graph, value, inside)
        for node in self.exits:
            ir.convenience.replace_all_uses_with(node.outputs[0], node.inputs[0])
            graph.remove(node, safe=True)
        graph.remove(self.transpose, safe=True)

    def _transpose_back(self, graph: ir.Graph, value: ir.Value, inside: set[ir.Node]) -> None:
        """Consumers outside the region (and the graph output) read `value` transposed as before."""
        back = ir.node("Transpose", [value], {"perm": self.perm}, metadata_props=dict(self.transpose.metadata_props))
        producer = value.producer()
        if producer is None:
            graph.insert_before(self.transpose, back)
        else:
            graph.insert_after(producer, back)
        out = back.outputs[0]
        out.type = value.type
        if value.shape is not None:
            out.shape = ir.Shape([value.shape.dims[p] for p in self.perm])
        for use in list(value.uses()):
            if use.node not in inside and use.node is not back:
                use.node.replace_input_with(use.idx, out)
        if value.is_graph_output():
            index = list(graph.outputs).index(value)
            name = value.name
            value.name = f"{name}_untransposed"
            out.name = name
            graph.outputs[index] = out

    def _remap_axes(self, graph: ir.Graph, node: ir.Node, index: int) -> None:
        axes = const_array(node.inputs[index]).reshape(-1)
        remapped = np.asarray([self.perm[int(a) % self.rank] for a in axes], dtype=axes.dtype)
        node.replace_input_with(index, _initializer(graph, remapped, f"{node.name}_axes"))

    def _relaid(self, graph: ir.Graph, node: ir.Node, value: ir.Value) -> ir.Value:
        shape = self._relaid_shape(value)
        array = const_array(value)
        if array is not None:
            full = array.reshape((1,) * (self.rank - array.ndim) + array.shape)
            return _initializer(graph, np.ascontiguousarray(full.transpose(np.argsort(self.perm))),
                                f"{value.name}_relaid")
        producer = value.producer()
        if producer is not None and producer.op_type == "Reshape" and producer.domain == "":
            value = producer.inputs[0]  # reshape the original (the bias vector) once
        target = _initializer(graph, np.asarray(shape, np.int64), f"{node.name}_relaid_shape")
        reshape = ir.node("Reshape", [value, target], metadata_props=dict(node.metadata_props))
        graph.insert_before(node, reshape)
        out = reshape.outputs[0]
        out.type, out.shape = value.type, ir.Shape(shape)
        return out


def _initializer(graph: ir.Graph, array: np.ndarray, hint: str) -> ir.Value:
    n = len(graph.initializers)
    while f"{hint}_{n}" in graph.initializers:
        n += 1
    name = f"{hint}_{n}"
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=ir.Tensor(array, name=name))
    graph.register_initializer(value)
    return value


def sink_transposes(model: ir.Model) -> int:
    """Sinks every Transpose of the main graph that can meet its inverse; returns how many were removed."""
    graph, removed = model.graph, 0
    order = list(graph)
    position = {node: i for i, node in enumerate(order)}
    for node in [n for n in order if n.op_type == "Transpose" and n.domain == "" and _perm(n) is not None]:
        if node.graph is not graph:  # removed as the exit of an earlier region
            continue
        region = _Region(node)
        if region.grow(position):
            removed += 1 + len(region.exits)
            region.rewrite(graph)
            order = list(graph)  # the rewrite inserts Reshapes and removes the Transposes
            position = {n: i for i, n in enumerate(order)}
    return removed
