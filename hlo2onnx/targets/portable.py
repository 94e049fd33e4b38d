"""What a model may not leave to its consumer where the ONNX spec is silent, applied by the pipeline to every
finished model.

- NaN in Max, Min, Clip and Relu: ONNX does not say what they give for a NaN operand (Clip-13 is defined
  as Min(max, Max(input, min)) and Relu as max(0, x)). XLA returns the NaN; ONNX Runtime does too
  (microsoft/onnxruntime#21492), OpenVINO's CPU plugin and TVM return the other operand, IREE one of them.
  On a target whose table does not record that its runtime propagates NaN (`Target.propagates_nan`),
  each float one gets a guard: Where(IsNaN(x), x, op(...)) for each operand that may hold a NaN (a
  constant without NaN needs none), which any conforming consumer computes as XLA does.
- What a model still assumes is recorded in its metadata_props under ASSUMES: integer Add, Sub and Mul
  wrap around (two's complement), as every runtime measured does and XLA requires, though the spec does
  not state it (narrow integer types are widened for missing kernels on the same assumption: targets.WIDER).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.tape import Tape

ASSUMES = "hlo2onnx.assumes"
WRAPS = "integer Add, Sub and Mul wrap around (two's complement), as in XLA"

_GUARDED = ("Max", "Min", "Clip", "Relu")
_WRAPPING = ("Add", "Sub", "Mul")


def graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """`graph` and every subgraph under it (Loop and If bodies)."""
    yield graph
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield from graphs(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.value:
                    yield from graphs(sub)


def _dtype(value: ir.Value | None) -> np.dtype | None:
    return None if value is None or value.dtype is None else np.dtype(value.dtype.numpy())


def _may_hold_nan(value: ir.Value) -> bool:
    """False for a constant without NaN (ReLU's 0, a clip's bounds); True otherwise."""
    const = value.const_value
    if const is None and value.producer() is not None and value.producer().op_type == "Constant":
        attr = value.producer().attributes.get("value")
        const = attr.value if attr is not None else None
    if const is None:
        return True
    array = const.numpy()
    return array.dtype.kind not in "iub" and bool(np.isnan(array.astype(np.float32)).any())


def guard_nan(model: ir.Model) -> int:
    """Guards the float Max, Min, Clip and Relu of `model` (subgraphs included); returns how many."""
    count = 0
    for graph in list(graphs(model.graph)):
        for node in list(graph):
            if node.op_type not in _GUARDED or node.domain not in ("", "ai.onnx"):
                continue
            out = node.outputs[0]
            dtype = _dtype(out)
            if dtype is None or (dtype.kind != "f" and dtype.name != "bfloat16"):
                continue
            operands = node.inputs if node.op_type in ("Max", "Min") else node.inputs[:1]
            operands = [v for v in dict.fromkeys(operands) if v is not None and _may_hold_nan(v)]
            if operands:
                _guard(graph, node, operands)
                count += 1
    return count


def _guard(graph: ir.Graph, node: ir.Node, operands: list[ir.Value]) -> None:
    """`node` again, then Where(IsNaN(x), x, result) for each of `operands`, in place of `node`'s output."""
    tape = Tape()
    out = node.outputs[0]
    result = tape.op(node.op_type, list(node.inputs), domain=node.domain)
    result.type, result.shape = out.type, out.shape
    for x in reversed(operands):  # the first operand's NaN wins, as in XLA (outermost Where)
        isnan = tape.op("IsNaN", [x])
        isnan.type, isnan.shape = ir.TensorType(ir.DataType.BOOL), x.shape
        result = tape.op("Where", [isnan, x, result])
        result.type, result.shape = out.type, out.shape
    for new in tape.nodes:
        new.metadata_props.update(node.metadata_props)
    graph.insert_before(node, tape.nodes)
    if out.is_graph_output():  # the guard takes the output's place and its name (callers see it)
        name, out.name = out.name, None
        result.name = name
    ir.convenience.replace_all_uses_with(out, result, replace_graph_outputs=True)
    graph.remove(node, safe=True)


def record_assumptions(model: ir.Model) -> None:
    """Writes ASSUMES into the model's metadata_props when it relies on integer wraparound."""
    for graph in graphs(model.graph):
        for node in graph:
            if node.op_type in _WRAPPING and node.domain in ("", "ai.onnx") \
                    and (dtype := _dtype(node.outputs[0])) is not None and dtype.kind in "iu":
                model.metadata_props[ASSUMES] = WRAPS
                return


def add_functions(proto: onnx.ModelProto, functions: tuple[onnx.FunctionProto, ...]) -> bool:
    """Adds each of `functions` that a node of `proto` calls (and is not there yet), with its domain's opset
    import; returns whether it added any. A function may call another of them."""
    wanted = {(f.domain, f.name): f for f in functions}
    have = {(f.domain, f.name) for f in proto.functions}
    added = False
    pending = [proto.graph.node]
    while pending:
        for node in pending.pop():
            key = (node.domain, node.op_type)
            if key in wanted and key not in have:
                proto.functions.append(wanted[key])
                have.add(key)
                pending.append(wanted[key].node)
                if node.domain not in {o.domain for o in proto.opset_import}:
                    proto.opset_import.append(onnx.helper.make_opsetid(node.domain, 1))
                added = True
            for attr in node.attribute:
                pending.extend(g.node for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs))
    return added
