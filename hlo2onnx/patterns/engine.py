"""Applying rewrite rules fast, and filling in the shapes their checks read.

onnxscript's RewriteRuleSet tries every rule at every node; its matcher costs
about 0.1 ms per try, which made `optimize` take a second on the MNIST step.
Here a rule is only tried at nodes of its pattern's root op type.
"""
from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Hashable, Iterable, Iterator, Sequence

import onnx
import onnx_ir as ir
from onnxscript.optimizer import basic_constant_propagation
from onnxscript.rewriter import pattern

# The one private onnxscript use in hlo2onnx, read by _signature only: a rule's traced pattern
# (RewriteRule._target_pattern) and the classes of its nodes. onnxscript 0.7 has no public accessor for either,
# and without them every rule is tried at every node (the matcher costs ~0.1 ms a try). If the attribute goes away,
# _signature returns None and rules are tried everywhere: slower, the same result.
from onnxscript.rewriter import _pattern_ir  # noqa: PLC2701

from hlo2onnx.graphs import detach, remove_detached
from hlo2onnx.interrupts import checkpoint
from hlo2onnx.provenance import inherit_sources

# onnxscript traces a pattern's arithmetic operators (x * 0.5) into a process-wide "current builder", so
# two patterns traced at once would swap nodes: rule sets are built one at a time (rarely: a pool is empty
# only when more translations than ever before run at once). Reentrant: a template lowers a function.
_BUILD_LOCK = threading.RLock()


class RulePool:
    """Rule lists lent to one translation at a time.

    A rule cannot be used by two threads at once: onnxscript's matcher keeps the match in progress on the
    rule's matcher, and our rules (and onnxscript's ReshapeReshape) pass what `check` found to `rewrite`
    through attributes of the rule object, so two threads matching with one rule read each other's state
    (AttributeError or wrong replacements in 1-10% of simultaneous first calls). Building a set costs about
    11 ms, a large share of a small function's translation, so sets are kept and lent out: as many get
    built as translations ever ran at once, whichever threads run them.
    """

    def __init__(self, build: Callable[..., Sequence]):
        self._build = build
        self._lock = threading.Lock()
        self._free: dict[Hashable, list[Sequence]] = {}

    @contextmanager
    def borrow(self, key: Hashable, *args) -> Iterator[Sequence]:
        """A set of the rules `build(*args)` makes (`key` names what `args` hold), this caller's alone
        until the block ends."""
        with self._lock:
            free = self._free.get(key)
            rules = free.pop() if free else None
        if rules is None:
            with _BUILD_LOCK:
                rules = self._build(*args)
        try:
            yield rules
        finally:
            # Returned even after an error: a matcher resets its state at the start of each match, and a
            # rule's check sets what its rewrite reads.
            with self._lock:
                self._free.setdefault(key, []).append(rules)


# Constants up to this size are handed to ONNX shape inference (Reshape/Expand read their shape input).
_INFERENCE_DATA_LIMIT = 64


def _signature(rule: pattern.RewriteRule) -> tuple[str, tuple[str | None, ...]] | None:
    """The pattern's root op type, and the op type producing each of its inputs (None: anything)."""
    target = getattr(rule, "_target_pattern", None)  # noqa: SLF001 (no public accessor: see the import)
    outputs = getattr(target, "output_nodes", None)
    if outputs is None:
        return None
    if len(outputs) != 1 or _op_type(outputs[0]) is None:
        return None
    feeds = tuple(_op_type(value.producer()) if isinstance(value, _pattern_ir.NodeOutputPattern) else None
                  for value in outputs[0].inputs)
    return _op_type(outputs[0]), feeds


def _op_type(node: _pattern_ir.NodePattern) -> str | None:
    # Commuted copies of a pattern keep the op as a StringConstantPattern, without an op_identifier.
    fixed = isinstance(node.op, _pattern_ir.StringConstantPattern)
    return node.op_type if fixed and isinstance(node.domain, _pattern_ir.StringConstantPattern) else None


def _may_match(node: ir.Node, signature) -> bool:
    """A cheap pre-check: the root op type and the op types feeding it (the matcher costs ~0.1 ms a try)."""
    if signature is None:
        return True
    op_type, feeds = signature
    if node.op_type != op_type or len(node.inputs) < len(feeds):
        return False
    for value, feed in zip(node.inputs, feeds):
        if feed is not None and (value is None or value.producer() is None or value.producer().op_type != feed):
            return False
    return True


class CandidateIndex:
    """The main graph's nodes by op type, and per pattern signature the nodes that pass `_may_match`.

    A signature's answer is computed once and kept until the next rewrite changes the graph: rules share
    signatures (the commuted copies of one pattern, up to 64), and each would otherwise pre-check every node
    of its root op type again.
    """

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.by_op: dict[str, list[ir.Node]] = {}
        for node in graph:
            self.by_op.setdefault(node.op_type, []).append(node)
        self._passing: dict[tuple, list[tuple[int, ir.Node]]] = {}

    def passing(self, signature: tuple) -> list[tuple[int, ir.Node]]:
        """The graph's nodes that may match `signature`, each with its position in `by_op[signature[0]]`."""
        found = self._passing.get(signature)
        if found is None:
            graph = self.graph
            found = self._passing[signature] = [
                (position, node) for position, node in enumerate(self.by_op.get(signature[0], ()))
                if node.graph is graph and _may_match(node, signature)]
        return found

    def rewritten(self, new_nodes: Sequence[ir.Node]) -> None:
        for node in new_nodes:
            self.by_op.setdefault(node.op_type, []).append(node)
        self._passing.clear()


def apply_rule(model: ir.Model, rule: pattern.RewriteRule, index: CandidateIndex | None = None,
               inferred: dict | None = None) -> int:
    """Applies `rule` wherever it matches in the main graph; returns how often.

    `index` holds the graph's nodes by op type; rewrites add their new nodes to it. `inferred`: shape
    inference results to reuse (see infer_shapes)."""
    graph, signature, count = model.graph, _signature(rule), 0
    if signature is None or index is None:
        candidates, start = list(graph), 0
    else:
        candidates = list(index.by_op.get(signature[0], ()))
        # Up to the first rewrite the pre-check's answer holds (the graph is as it was when it was computed):
        # only the nodes that passed are tried. After it, the remaining candidates are checked again.
        start = len(candidates)
        for position, node in index.passing(signature):
            if _rewrite_at(model, rule, node, index, inferred):
                count, start = 1, position + 1
                break
    for node in candidates[start:]:
        if node.graph is not graph or not _may_match(node, signature):  # removed by an earlier rewrite
            continue
        count += _rewrite_at(model, rule, node, index, inferred)
    return count


def _rewrite_at(model: ir.Model, rule: pattern.RewriteRule, node: ir.Node, index: CandidateIndex | None,
                inferred: dict | None) -> bool:
    """Rewrites the match of `rule` rooted at `node`, if there is one."""
    graph = model.graph
    delta = rule.try_rewrite(model, graph, node)
    if delta is None:
        return False
    for initializer in delta.new_initializers:
        existing = graph.initializers.get(initializer.name)
        if existing is initializer:
            continue
        if existing is not None:
            # Rules name initializers after the value they rewrite (onnxscript's Reshape merge: "<out>/shape"),
            # and a rewritten value keeps its name, so a second merge at the same value asks for the same
            # name: the new initializer gets its own instead of being left out of the graph.
            initializer.name = _free_name(initializer.name, graph.initializers)
        graph.register_initializer(initializer)
    basic_constant_propagation(delta.new_nodes)
    inherit_sources(delta.match.nodes, delta.new_nodes, rule.name)
    _replace_nodes_and_values(graph, node, delta.match.nodes, delta.new_nodes, delta.match.outputs,
                              delta.new_outputs)
    infer_shapes(model, delta.new_nodes, inferred)
    if index is not None:
        index.rewritten(delta.new_nodes)
    return True


def _replace_nodes_and_values(graph: ir.Graph, insertion_point: ir.Node, old_nodes: Sequence[ir.Node],
                              new_nodes: Sequence[ir.Node], old_values: Sequence[ir.Value],
                              new_values: Sequence[ir.Value]) -> None:
    """ir.convenience.replace_nodes_and_values, with the old nodes removed as graphs.remove_detached does.

    onnx-ir's graph.remove(safe=True) copies the graph's outputs into a set on every call: with a gradient's
    hundreds of outputs, that was most of a rewrite's cost, and quadratic in the model's size. Its check stays.
    """
    for old, new in zip(old_values, new_values):  # what onnx-ir's function hands on, in its order
        new.type = old.type if old.type is not None else new.type
        new.shape = old.shape if old.shape is not None else new.shape
        new.const_value = old.const_value if old.const_value is not None else new.const_value
        new.name = old.name if old.name is not None else new.name
    ir.convenience.replace_all_uses_with(old_values, new_values, replace_graph_outputs=True)
    graph.insert_after(insertion_point, new_nodes)
    removed = set(old_nodes)
    for old in old_nodes:
        for value in old.outputs:
            if value.is_graph_output() or any(use.node not in removed for use in value.uses()):
                raise ValueError(f"a rewrite left {value.name!r} of {old.op_type} in use")
    for old in old_nodes:
        detach(old)
    remove_detached(graph, old_nodes)


def _free_name(name: str, taken) -> str:
    suffix = 1
    while f"{name}_{suffix}" in taken:
        suffix += 1
    return f"{name}_{suffix}"


def apply_rules(model: ir.Model, rules: Iterable[pattern.RewriteRule]) -> Counter:
    """Each rule in turn over the whole graph, so an earlier rule wins over a later one."""
    counts: Counter = Counter()
    index = CandidateIndex(model.graph)
    inferred: dict = {}  # a rule's rewrites repeat the same nodes on the same types (one per layer of a model)
    for rule in rules:
        checkpoint()  # a Ctrl-C taken by the guard is raised between rules
        n = apply_rule(model, rule, index, inferred)
        if n:
            counts[rule.name] += n
    return counts


def _type_proto(value: ir.Value) -> onnx.TypeProto:
    proto = ir.serde.serialize_type(value.type)
    if value.shape is not None:
        ir.serde.serialize_shape_into(proto, value.shape)
    return proto


def infer_shapes(model: ir.Model, nodes: Iterable[ir.Node] | None = None, memo: dict | None = None) -> None:
    """ONNX shape inference node by node, for outputs that have no static shape yet (graph order is topological).

    `memo` keeps each result by what it depends on (_inference_key) for the next node that asks the same: ONNX's
    inference goes through protobuf, ~0.1 ms a node."""
    opsets = model.opset_imports
    for node in model.graph if nodes is None else nodes:
        for v in node.outputs:
            if v.type is None or v.shape is None:
                break
        else:
            continue  # every output typed and shaped already (most nodes: the translator sets them)
        inputs = [v for v in node.inputs if v is not None]
        if any(v.type is None for v in inputs) or any(a.type == ir.AttributeType.GRAPH
                                                      for a in node.attributes.values()):
            continue
        for v in node.outputs:
            if v.name is None:
                v.name = f"{node.op_type.lower()}_{id(v)}"
        key = _inference_key(node, opsets) if memo is not None else None
        try:
            known = key is not None and key in memo
        except TypeError:  # a type or dim onnx-ir cannot hash: inferred afresh
            known, key = False, None
        if known:
            protos = memo[key]
        else:
            protos = _infer_node(node, inputs, opsets)
            if key is not None:
                memo[key] = protos
        for v, proto in zip(node.outputs, protos or ()):
            if proto is not None:
                v.type = ir.serde.deserialize_type_proto_for_type(proto)
                v.shape = ir.serde.deserialize_type_proto_for_shape(proto)


def _infer_node(node: ir.Node, inputs: list[ir.Value], opsets) -> list[onnx.TypeProto | None] | None:
    """ONNX's inferred type of each output of `node` (None where it has none), or None if inference failed."""
    data = {v.name: ir.serde.serialize_tensor(v.const_value) for v in inputs
            if v.const_value is not None and v.const_value.size <= _INFERENCE_DATA_LIMIT}
    try:
        schema = onnx.defs.get_schema(node.op_type, opsets[node.domain], node.domain)
        inferred = onnx.shape_inference.infer_node_outputs(
            schema, ir.serde.serialize_node(node), {v.name: _type_proto(v) for v in inputs}, data)
    except Exception:  # noqa: BLE001 (inference is best effort: a rule's check then fails on the shape)
        return None
    return [inferred.get(v.name) for v in node.outputs]


_KEYED_ATTRIBUTES = frozenset({ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING,
                               ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS})


def _inference_key(node: ir.Node, opsets) -> tuple | None:
    """All that ONNX's inference reads of `node`: op, opset, attributes (plain ones by value, small tensors by
    dtype, shape and bytes), and per input its type, shape, small constant value and which earlier input has
    its name (inference sees inputs by name); None when an attribute is of another kind."""
    attributes = []
    for name, a in node.attributes.items():
        if a.type in _KEYED_ATTRIBUTES:
            attributes.append((name, a.type, repr(a.value)))
        elif a.type == ir.AttributeType.TENSOR and a.value.size <= _INFERENCE_DATA_LIMIT:
            data = _array_key(a.value)  # ConstantOfShape's fill
            if data is None:
                return None
            attributes.append((name, a.type, data))
        else:
            return None
    names: dict[str, int] = {}
    inputs = []
    for i, v in enumerate(node.inputs):
        if v is None:
            inputs.append(None)
            continue
        const = v.const_value
        data = None
        if const is not None and const.size <= _INFERENCE_DATA_LIMIT:
            data = _array_key(const)
            if data is None:
                return None
        inputs.append((v.type, None if v.shape is None else v.shape.dims, data, names.setdefault(v.name, i)))
    return (node.domain, node.op_type, opsets.get(node.domain), len(node.outputs), tuple(attributes), tuple(inputs))


def _array_key(tensor: ir.TensorProtocol) -> tuple | None:
    array = tensor.numpy()
    return None if array.dtype.hasobject else (array.dtype, array.shape, array.tobytes())
