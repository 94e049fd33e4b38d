"""Clean-up passes: put translated graphs in one canonical form before fusion (with the constant folding of
patterns/folding.py).

StableHLO broadcasts explicitly, so every scalar reaches its elementwise op
through Reshape+Expand, and keepdims reductions come out as Reduce+Reshape.
ONNX broadcasts by itself; once these are undone, `jax.nn.softmax`, a
hand-written softmax and stax's LogSoftmax all become the same small graph,
and the fusion patterns only need to know that one form.
"""
from __future__ import annotations

import copy
from math import prod
from typing import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter.rules import common as common_rules

from hlo2onnx import host_calls
from hlo2onnx.graphs import all_graphs, all_nodes, detach, remove_detached  # noqa: F401  (imported from here too)
from hlo2onnx.patterns import engine, passes

# Elementwise ops with numpy (multidirectional) broadcasting.
BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "PRelu", "Where",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor",
    "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitShift",
})


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    shape = value.shape if value is not None else None
    if shape is None:
        return None
    dims = shape.dims  # a new tuple; the loop is cheaper than all() over a generator (called ~10 times a node)
    for d in dims:
        if not isinstance(d, int):
            return None
    return dims


def symbolic_shape(value: ir.Value | None) -> tuple[int | None, ...] | None:
    """The value's dims where its rank is known, None for each dim that is not a number (a symbolic batch);
    None when the value has no shape, or when every dim is static (static_shape covers those)."""
    if value is None or value.shape is None or static_shape(value) is not None:
        return None
    return tuple(d if isinstance(d, int) else None for d in value.shape.dims)


def known_dims(value: ir.Value | None) -> tuple[int | None, ...] | None:
    """static_shape, or else symbolic_shape: the dims of a value whose rank is known (None where symbolic)."""
    static = static_shape(value)
    return static if static is not None else symbolic_shape(value)


def const_array(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


class ScalarConstants:
    """Scalar initializers of one graph, shared by value."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self._cache: dict[tuple, ir.Value] = {}

    def get(self, scalar: np.ndarray) -> ir.Value:
        scalar = np.asarray(scalar).reshape(())
        key = (scalar.dtype.str, scalar.tobytes())
        value = self._cache.get(key)
        if value is None:
            name = f"scalar_{len(self._cache)}"
            while name in self.graph.initializers:
                name += "_"
            tensor = ir.Tensor(scalar.copy(), name=name)
            value = ir.Value(name=name, shape=ir.Shape([]), type=ir.TensorType(tensor.dtype), const_value=tensor)
            self.graph.register_initializer(value)
            self._cache[key] = value
        return value


# Dense constants above this size are not scanned for a repeated value (the translator emits splats as such).
_SPLAT_SCAN_LIMIT = 1 << 16


def splat_of(value: ir.Value) -> np.ndarray | None:
    """The one value `value` holds everywhere, when it is a splat: ConstantOfShape or an all-equal constant."""
    if value.const_value is not None and value.const_value.size > _SPLAT_SCAN_LIMIT:
        return None
    array = const_array(value)
    if array is not None:
        flat = array.reshape(-1)
        return flat[0] if array.ndim > 0 and flat.size > 0 and (flat == flat[0]).all() else None
    producer = value.producer()
    if producer is None or producer.domain != "":
        return None
    if producer.op_type == "ConstantOfShape":
        fill = producer.attributes.get("value")
        return fill.as_tensor().numpy().reshape(-1)[0] if fill is not None else np.float32(0)
    if producer.op_type in ("Expand", "Reshape") and producer.inputs[0] is not None:
        return splat_of(producer.inputs[0])  # a splat stays one when broadcast or reshaped
    return None


_RESHAPES = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten"})
# The producers through which an input that is not a constant can be a splat or hold something smaller.
_SMALL_SOURCES = _RESHAPES | {"Expand", "ConstantOfShape"}


def drop_broadcasts(graph: ir.Graph, scalars: ScalarConstants, nodes: Sequence[ir.Node] | None = None) -> int:
    """Feeds broadcasting ops the small operand of an Expand, or a scalar instead of a splat.

    Valid when the op's own broadcasting still yields its static output shape. `nodes`: the graph's nodes in
    order, when the caller listed them already (those since removed are skipped).
    """
    count = 0
    for node in graph if nodes is None else nodes:
        if node.op_type not in BROADCASTING or node.domain != "" or node.graph is not graph:
            continue
        out = static_shape(node.outputs[0])
        if out is None:
            continue
        for i, x in enumerate(node.inputs):
            if x is None:
                continue
            producer = x.producer()
            if x.const_value is None and (producer is None or producer.op_type not in _SMALL_SOURCES):
                continue  # neither a splat nor a broadcast or reshape of something smaller (splat_of says None)
            if static_shape(x) == ():
                continue
            splat = splat_of(x)
            if splat is not None:
                small = scalars.get(splat)
            elif producer is not None and producer.op_type == "Expand" and producer.domain == "":
                small = producer.inputs[0]
            elif (producer is not None and producer.op_type in _RESHAPES and producer.domain == ""
                  and static_shape(producer.inputs[0]) is not None and prod(static_shape(producer.inputs[0])) == 1):
                small = producer.inputs[0]  # one element broadcasts the same from any shape: a scalar's [1, 1]
            else:
                continue
            shapes = [static_shape(v) for v in node.inputs]
            shapes[i] = static_shape(small)
            if None not in shapes and np.broadcast_shapes(*shapes) == out:
                node.replace_input_with(i, small)
                count += 1
    return count


# Never folded (patterns/folding.py) nor merged as common subexpressions: splats stay splats, random ops stay
# random.
NOT_FOLDED = frozenset({"ConstantOfShape", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Multinomial", "Bernoulli"})


# -- no-op removal ------------------------------------------------------------------------------
# op -> (neutral constant, operand positions it may take): x op neutral == x.
# max(x, -inf) and min(x, inf) are x with NaN too (XLA's max/min propagate NaN);
# x + 0 turns -0 into +0, which compares equal.
_NEUTRAL = {"Max": (-np.inf, (0, 1)), "Min": (np.inf, (0, 1)), "Add": (0, (0, 1)), "Sub": (0, (1,)),
            "Mul": (1, (0, 1)), "Div": (1, (1,))}
_REDUCES = frozenset({"ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ReduceProd"})


_CHUNK = 1 << 20


def _all_equal(array: np.ndarray, fill) -> bool:
    """(array == fill).all() in chunks: a large weight is not shadowed by a temporary mask of its size."""
    flat = array.reshape(-1)
    return all((flat[i:i + _CHUNK] == fill).all() for i in range(0, flat.size, _CHUNK))


def _no_op_result(node: ir.Node) -> ir.Value | None:
    """The existing value `node` computes, when it computes nothing new."""
    out, ins = node.outputs[0], node.inputs
    if node.op_type in _NEUTRAL and len(ins) == 2:
        fill, positions = _NEUTRAL[node.op_type]
        for pos in positions:
            array = const_array(ins[pos])
            if array is not None and array.dtype.kind in "fiu" and array.size > 0 and _all_equal(array, fill):
                return ins[1 - pos]
    elif node.op_type == "Where":
        array = const_array(ins[0])
        if array is not None and array.size > 0 and (array.all() or not array.any()):
            return ins[1] if array.all() else ins[2]
    elif node.op_type in ("Reshape", "Expand", "Identity"):
        return ins[0]
    elif node.op_type == "Transpose":
        perm = node.attributes.get("perm")
        return ins[0] if perm is not None and list(perm.as_ints()) == sorted(perm.as_ints()) else None
    elif node.op_type == "Cast":
        return ins[0] if ins[0].dtype is not None and ins[0].dtype == out.dtype else None
    return None


# The ops drop_no_ops may drop: those _no_op_result knows, and the reshapes of a reduction.
_MAYBE_NO_OP = frozenset(_NEUTRAL) | {"Where", "Reshape", "Expand", "Identity", "Transpose", "Cast", "Unsqueeze"}


def _keep_reduced_dims(node: ir.Node) -> ir.Value | None:
    """Reshape(Reduce(x, keepdims=0)) to the keepdims shape: the reduction keeps its dims instead."""
    reduced = node.inputs[0]
    reduce = reduced.producer()
    if (reduce is None or reduce.op_type not in _REDUCES or reduce.domain != "" or len(reduced.consumers()) != 1
            or reduced.is_graph_output() or reduce.attributes.get("keepdims") is None
            or reduce.attributes["keepdims"].as_int() != 0 or len(reduce.inputs) < 2):
        return None
    x_shape, axes = static_shape(reduce.inputs[0]), const_array(reduce.inputs[1])
    if x_shape is None or axes is None or not x_shape:
        return None
    picked = {int(a) % len(x_shape) for a in axes.reshape(-1).tolist()}
    kept = tuple(1 if i in picked else d for i, d in enumerate(x_shape))
    if kept != static_shape(node.outputs[0]):
        return None
    reduce.attributes["keepdims"] = ir.AttrInt64("keepdims", 1)
    reduced.shape = ir.Shape(kept)
    return reduced


def _unsqueeze_reduced_dims(node: ir.Node) -> ir.Value | None:
    """Unsqueeze(Reduce(x, keepdims=0)) at the reduced axes, over a symbolic shape (static shapes come as
    Reshape): the reduction keeps its dims instead."""
    reduced = node.inputs[0]
    reduce = reduced.producer()
    if (reduce is None or reduce.op_type not in _REDUCES or reduce.domain != "" or len(reduced.consumers()) != 1
            or reduced.is_graph_output() or reduce.attributes.get("keepdims") is None
            or reduce.attributes["keepdims"].as_int() != 0 or len(reduce.inputs) < 2 or len(node.inputs) < 2):
        return None
    x_shape, axes, inserted = symbolic_shape(reduce.inputs[0]), const_array(reduce.inputs[1]), \
        const_array(node.inputs[1])
    if x_shape is None or axes is None or inserted is None or not x_shape:
        return None
    rank = len(x_shape)
    picked = sorted({int(a) % rank for a in axes.reshape(-1).tolist()})
    if sorted(int(a) % rank for a in inserted.reshape(-1).tolist()) != picked:
        return None
    reduce.attributes["keepdims"] = ir.AttrInt64("keepdims", 1)
    reduced.shape = ir.Shape([1 if i in picked else d for i, d in enumerate(reduce.inputs[0].shape.dims)])
    return reduced


def _scalar_no_op(node: ir.Node, result: ir.Value) -> bool:
    """Over symbolic shapes: x op neutral where the neutral is a scalar keeps x's shape by broadcasting, as
    does Where(c, x, y) with a constant c that picks x everywhere and c, y of single elements of no higher rank
    than x (jnp.var's guard where(n > ddof, var, nan) over a static n, whose rows are symbolic)."""
    out = node.outputs[0]
    if symbolic_shape(out) is None or result.shape is None or result.shape.rank() != out.shape.rank():
        return False
    other = [v for v in node.inputs if v is not result]
    if node.op_type == "Where":
        shapes = [static_shape(v) for v in other]
        return len(other) == 2 and all(s is not None and len(s) <= len(out.shape) and prod(s) == 1
                                       for s in shapes)
    return node.op_type in _NEUTRAL and len(other) == 1 and static_shape(other[0]) == ()


def drop_no_ops(graph: ir.Graph, nodes: Sequence[ir.Node] | None = None) -> int:
    """Drops no-op nodes (same shape and dtype in and out); returns how many. `nodes`: as drop_broadcasts."""
    dropped = []
    for node in list(graph) if nodes is None else nodes:
        op_type = node.op_type
        if op_type not in _MAYBE_NO_OP or node.domain != "" or len(node.outputs) != 1 \
                or node.outputs[0].is_graph_output() or node.graph is not graph:
            continue
        out = node.outputs[0]
        if op_type == "Reshape" and (kept := _keep_reduced_dims(node)) is not None:
            result = kept
        elif op_type == "Unsqueeze" and (kept := _unsqueeze_reduced_dims(node)) is not None:
            result = kept
        else:
            result = _no_op_result(node)
            if result is not None and result.dtype == out.dtype and _scalar_no_op(node, result):
                pass
            elif (result is None or static_shape(result) is None or static_shape(result) != static_shape(out)
                    or result.dtype != out.dtype):
                continue
        ir.convenience.replace_all_uses_with(out, result)
        detach(node)
        dropped.append(node)
    if dropped:
        remove_detached(graph, dropped)
    return len(dropped)


# onnxscript's rules for pairs that cancel or merge. Its module-level rule objects keep per-match state and
# anyone else in the process may be matching with them, so they are copied once, here, into templates no one
# matches with; each rule set the pool builds is a copy of those (its own matcher and check state).
_PAIR_RULES = copy.deepcopy([common_rules.cast_cast_rule, common_rules.reshape_reshape_rule,
                             common_rules.transpose_transpose_rule,
                             common_rules.unsqueeze_unsqueeze_rule])


def _build_clean_rules() -> list:
    return copy.deepcopy(_PAIR_RULES)


_CLEAN_RULES = engine.RulePool(_build_clean_rules)


def clean(model: ir.Model) -> None:
    """Canonical form: broadcasting instead of Expand, scalars instead of splats, no no-ops, CSE, DCE.

    Loop and If bodies get the same clean-up (a loop body runs once per iteration, so it matters
    most there); their new scalars live in the main graph, which every body may read.
    """
    scalars = ScalarConstants(model.graph)
    for _ in range(4):
        with _CLEAN_RULES.borrow("clean") as rules:
            changed = sum(engine.apply_rules(model, rules).values())
        # Each graph's nodes are listed once a round (a walk of onnx-ir's node list costs ~1 us a node); the
        # passes skip the nodes an earlier one removed, and none of them adds nodes but the CSE, rarely (an
        # Identity for a graph output), after which the list is taken again.
        main = list(model.graph)
        merged = passes.merge_common_subexpressions(model, main)  # onnx-ir's CSE pass, faster
        if merged:
            main = list(model.graph)
        changed += merged
        for graph in all_graphs(model.graph, main):
            nodes = main if graph is model.graph else list(graph)
            changed += drop_broadcasts(graph, scalars, nodes) + drop_no_ops(graph, nodes)
            if graph is not model.graph:
                changed += eliminate_common_subexpressions(graph)
            changed += remove_unused(graph, nodes)
        if not changed:
            break
    # onnx-ir's pass would drop callbacks run for their effects. A model holding one imports their domain (the
    # translator adds it), so one without it is not walked.
    if host_calls.DOMAIN in model.graph.opset_imports and any(
            host_calls.is_host_call(node) for node in all_nodes(model.graph)):
        for graph in all_graphs(model.graph):
            remove_unused(graph)
        drop_unread_initializers(model)
    else:
        passes.remove_unused_nodes(model)  # onnx-ir's RemoveUnusedNodesPass: initializers and subgraphs too


def eliminate_common_subexpressions(graph: ir.Graph) -> int:
    """Merges nodes that apply the same op to the same inputs (onnx-ir's CSE pass sees the main graph only)."""
    seen: dict[tuple, ir.Node] = {}
    count = 0
    for node in list(graph):
        if not node.inputs or any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                                  for a in node.attributes.values()) or node.op_type in NOT_FOLDED:
            continue
        attrs = tuple(sorted((name, repr(a.value)) for name, a in node.attributes.items()))
        key = (node.domain, node.op_type, node.overload, len(node.outputs), tuple(map(id, node.inputs)), attrs)
        kept = seen.get(key)
        if kept is None:
            seen[key] = node
            continue
        if any(v.is_graph_output() for v in node.outputs):
            continue
        for old, new in zip(node.outputs, kept.outputs):
            ir.convenience.replace_all_uses_with(old, new)
        graph.remove(node, safe=True)
        count += 1
    return count


def remove_unused(graph: ir.Graph, nodes: Sequence[ir.Node] | None = None) -> int:
    """Drops nodes none of whose outputs is used (a quick DCE; only host callbacks have side effects).
    `nodes`: as drop_broadcasts."""
    dropped = []
    for node in reversed(list(graph) if nodes is None else nodes):
        if node.graph is not graph:
            continue
        for v in node.outputs:
            if v.uses() or v.is_graph_output():
                break
        else:
            if not host_calls.pinned(node):
                detach(node)  # its producers may go next
                dropped.append(node)
    if dropped:
        remove_detached(graph, dropped)
    return len(dropped)


def drop_unread_initializers(model: ir.Model) -> int:
    """Removes main-graph initializers that no node of any graph reads.

    onnx-ir's RemoveUnusedNodesPass keeps them when a node that was replaced (a folded
    loop's old body) still lists them as inputs. ORT drops such initializers at load, and
    then fails to find them when mnjit hands it their buffers by name.
    """
    read = {id(value) for node in all_nodes(model.graph) for value in node.inputs if value is not None}
    unread = [name for name, value in model.graph.initializers.items()
              if id(value) not in read and not value.is_graph_output()]
    for name in unread:
        model.graph.initializers.pop(name)
    return len(unread)
