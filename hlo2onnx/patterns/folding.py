"""The canonical form the fusion patterns are written against: static shapes, small constants folded, then the
clean-up passes (patterns/cleanup.py)."""
from __future__ import annotations

from math import prod

import numpy as np
import onnx
import onnx.reference.ops
import onnx_ir as ir

from hlo2onnx.graphs import detach, remove_detached
from hlo2onnx.patterns import engine
from hlo2onnx.patterns.cleanup import NOT_FOLDED, clean, static_shape

# Constant folding never makes a tensor larger than its largest input (a splat
# stays a ConstantOfShape or a scalar) nor folds anything above this size.
_FOLD_MAX_ELEMENTS = 1 << 20
_FOLD_GROWTH_ALLOWANCE = 64


def canonicalize(model: ir.Model) -> None:
    """Static shapes everywhere, small constants folded, then `clean`."""
    engine.infer_shapes(model, memo={})
    fold_constants(model)
    clean(model)


def fold_constants(model: ir.Model) -> int:
    """Evaluates nodes whose inputs are all constants with ONNX's reference ops, in one topological sweep.

    (onnxscript's FoldConstantsPass does the same but visits every node at ~0.3 ms each, most of
    `optimize`'s time; translated graphs have only a handful of foldable nodes.)
    """
    graph, version, folded_nodes = model.graph, model.opset_imports.get("", 1), []
    # Results by op, attributes and input values: a model repeats the same few folds (each layer of a
    # transformer reshapes the same scalars), and the reference op costs ~0.1 ms a call.
    evaluated: dict[tuple | None, np.ndarray | None] = {}
    for node in list(graph):
        inputs = node.inputs
        if not inputs or inputs[0] is None or inputs[0].const_value is None:
            continue  # the common case, first: an input that is not a constant
        if (node.domain != "" or node.op_type in NOT_FOLDED or len(node.outputs) != 1
                or node.outputs[0].is_graph_output()
                or any(v is None or v.const_value is None for v in inputs)
                or any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())):
            continue
        out, sizes = static_shape(node.outputs[0]), [v.const_value.size for v in node.inputs]
        if out is None or prod(out) > min(_FOLD_MAX_ELEMENTS, max(sizes + [_FOLD_GROWTH_ALLOWANCE])):
            continue
        inputs = [v.const_value.numpy() for v in node.inputs]
        key = _fold_key(node, inputs)
        if key in evaluated:
            result = evaluated[key]
            if result is None:
                continue
            result = result.copy()
        else:
            attrs = {name: ir.serde.serialize_tensor(a.value) if a.type == ir.AttributeType.TENSOR else a.value
                     for name, a in node.attributes.items()}
            try:
                result = onnx.reference.ops.load_op("", node.op_type, version).eval(*inputs, **attrs)
            except Exception:  # noqa: BLE001 (an op the reference cannot evaluate just stays)
                result = None
            if result is not None:
                result = np.asarray(result[0] if isinstance(result, (tuple, list)) else result)
            if key is not None:
                evaluated[key] = result
            if result is None:
                continue
        value = node.outputs[0]
        if result.shape != out or value.dtype is None or result.dtype != np.dtype(value.dtype.numpy()):
            continue
        folded = ir.Value(name=f"folded_{value.name}", shape=ir.Shape(out), type=value.type,
                          const_value=ir.Tensor(result, name=f"folded_{value.name}"))
        graph.register_initializer(folded)
        ir.convenience.replace_all_uses_with(value, folded)
        detach(node)
        folded_nodes.append(node)
    if folded_nodes:
        remove_detached(graph, folded_nodes)
    return len(folded_nodes)


_KEYED_ATTRIBUTES = frozenset({ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING,
                               ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS})
# Inputs up to this many elements in all are compared by value to reuse a fold.
_FOLD_KEY_LIMIT = 1 << 10


def _fold_key(node: ir.Node, inputs: list[np.ndarray]) -> tuple | None:
    """What a fold's result depends on (None: not reused): op type, plain attributes (repr tells -0.0 from
    0.0) and the inputs' dtype, shape and bytes."""
    if (sum(x.size for x in inputs) > _FOLD_KEY_LIMIT or any(x.dtype.hasobject for x in inputs)
            or any(a.type not in _KEYED_ATTRIBUTES for a in node.attributes.values())):
        return None
    return (node.op_type, tuple((name, a.type, repr(a.value)) for name, a in node.attributes.items()),
            tuple((x.dtype, x.shape, x.tobytes()) for x in inputs))
