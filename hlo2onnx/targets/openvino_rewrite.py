"""ONNX rewrites that make OpenVINO 2026.4's CPU plugin compute what the model says (docs/runtime.md).

Each rewrite is exact: it replaces a pattern OpenVINO crashes on or answers wrongly by an equivalent
one it handles (and f32 -> bf16/f16 Casts, whose rounding it drops, rounded first: targets/rounding.py).
The pipeline applies them to every model written for the target, after the NaN guards of
targets/portable.py (which give Max, Min, Clip and Relu XLA's NaN on any consumer), so OpenVINO's own API
runs what mnjit runs.
"""
from __future__ import annotations

import onnx
from onnx import helper

from hlo2onnx.targets.rounding import FORMATS, round_as

# OpenVINO's Greater and GreaterOrEqual are true when an operand is NaN; Less and LessOrEqual are right.
_MIRRORED = {"Greater": "Less", "GreaterOrEqual": "LessOrEqual"}
# Unary float ops whose answer OpenVINO gets wrong at one special input x, where the right answer is x itself:
# Exp(NaN) is inf (so are cosh, exp2 and logsumexp of NaN, written with Exp), HardSigmoid(NaN) is 1 and
# Gelu(inf) is NaN. Each becomes Where(test(x), x, op(x)).
_SPECIAL_INPUT = {"Exp": ("IsNaN", {}), "HardSigmoid": ("IsNaN", {}), "Gelu": ("IsInf", {"detect_negative": 0})}
# Softmax and LogSoftmax skip NaN (and inf - inf) in a row where XLA's max-subtracted form makes the whole row
# NaN: the row's sum of x - max(x) is NaN exactly then (its other terms are <= 0), and it is passed on.
_ROW_WISE = ("Softmax", "LogSoftmax")
# ReduceMax of a row of -inf gives f32's lowest finite value, ReduceMin of +inf its highest (its initial value):
# where the row holds nothing else, the infinity is put back.
_EXTREME = {"ReduceMax": -1, "ReduceMin": 1}
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def for_openvino(proto: onnx.ModelProto) -> bool:
    """Rewrites `proto` in place (subgraphs included); True if anything changed."""
    types, ranks = _elem_types(proto.graph, {}, {})
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 21)
    return _rewrite(proto.graph, frozenset(), frozenset(), types, ranks, [0], opset)


def _elem_types(graph: onnx.GraphProto, types: dict[str, int],
                ranks: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """Element types and (where known) ranks of the values of `graph` and its subgraphs, by name."""
    for v in [*graph.input, *graph.output, *graph.value_info]:
        if v.type.HasField("tensor_type"):
            types[v.name] = v.type.tensor_type.elem_type
            if v.type.tensor_type.HasField("shape"):
                ranks[v.name] = len(v.type.tensor_type.shape.dim)
    for t in graph.initializer:
        types[t.name], ranks[t.name] = t.data_type, len(t.dims)
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Constant" and attr.name == "value":
                types[node.output[0]], ranks[node.output[0]] = attr.t.data_type, len(attr.t.dims)
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                _elem_types(sub, types, ranks)
    return types, ranks


def _rewrite(graph: onnx.GraphProto, outer_empty: frozenset[str], outer_const: frozenset[str],
             types: dict[str, int], ranks: dict[str, int], counter: list[int], opset: int) -> bool:
    """`outer_*`: empty shape constants and constants of enclosing graphs, which Loop/If bodies read by name."""
    constants = set(outer_const) | {t.name for t in graph.initializer} | {
        n.output[0] for n in graph.node if n.op_type == "Constant"}
    empty = set(outer_empty) | {t.name for t in graph.initializer if list(t.dims) == [0]}
    empty |= {n.output[0] for n in graph.node if n.op_type == "Constant" and any(
        a.name == "value" and list(a.t.dims) == [0] for a in n.attribute)}
    # A zero-size constant (an initializer or Constant node) comes out of OpenVINO with shape [] when an Identity
    # passes it to the output (a zero-size result folded to a constant); ConstantOfShape keeps the shape.
    zero_size = {t.name: (list(t.dims), t.data_type) for t in graph.initializer if 0 in t.dims}
    zero_size.update({n.output[0]: (list(a.t.dims), a.t.data_type) for n in graph.node if n.op_type == "Constant"
                      for a in n.attribute if a.name == "value" and 0 in a.t.dims})
    # compile_model segfaults on MatMul followed by a Reshape to [] (Reshape alone and Squeeze compile). A
    # reshape to [] has a size-1 input, so Squeeze with no axes is the same op. Only after MatMul/Gemm: a
    # Squeeze of a Loop-body value of unknown rank does not compile (measured).
    products = {n.output[0] for n in graph.node if n.op_type in ("MatMul", "Gemm")}
    outputs = {v.name for v in graph.output} - {i for n in graph.node for i in n.input}  # read by no node
    changed = False
    nodes = list(graph.node)
    new_nodes: list[onnx.NodeProto] = []
    for node in nodes:
        if node.domain not in ("", "ai.onnx"):
            new_nodes.append(node)
            continue
        if node.op_type == "Reshape" and len(node.input) == 2 and node.input[1] in empty \
                and node.input[0] in products:
            node.op_type = "Squeeze"
            del node.input[1]
            del node.attribute[:]  # Reshape's allowzero means nothing to Squeeze
            changed = True
        elif node.op_type == "Identity" and node.input[0] in zero_size:
            new_nodes += _constant_of_shape(node, *zero_size[node.input[0]], counter)
            changed = True
            continue
        elif node.op_type == "Cast" and _narrowing(node, types) and node.output[0] not in outputs:
            # OpenVINO drops f32 -> bf16/f16 -> f32 inside a graph (targets/rounding.py): round first, then the
            # Cast is exact whether it is kept or not. A graph output's Cast is kept (measured).
            rounding, rounded = round_as(node.input[0], _cast_to(node), node.output[0], counter)
            new_nodes += rounding
            node.input[0] = rounded
            changed = True
        elif node.op_type in _MIRRORED and len(node.input) == 2:  # a > b is b < a, NaN included
            node.op_type = _MIRRORED[node.op_type]
            node.input[0], node.input[1] = node.input[1], node.input[0]
            changed = True
        elif node.op_type in _SPECIAL_INPUT and types.get(node.input[0]) in _FLOATS:
            new_nodes += _pass_special_input(node, counter)
            changed = True
            continue
        elif node.op_type in _ROW_WISE and types.get(node.input[0]) in _FLOATS:
            new_nodes += _poison_rows(node, counter, opset)
            changed = True
            continue
        elif node.op_type in _EXTREME and types.get(node.input[0]) in _FLOATS:
            new_nodes += _restore_infinity(node, counter, types[node.input[0]])
            changed = True
            continue
        elif node.op_type in ("Max", "Min") and len(node.input) == 2:
            # OpenVINO fuses Min and Max with one-element constants into a Clamp of the other operand's shape,
            # dropping the rank the constant broadcasts it to (Min(x[], c[1]) came back as []): the other
            # operand is given that rank first, as broadcasting would (leading axes of 1).
            a, b = node.input
            for const, other, i in ((b, a, 0), (a, b, 1)):
                if const in constants and other not in constants and ranks.get(other, -1) >= 0 \
                        and ranks.get(const, -1) > ranks[other]:
                    counter[0] += 1
                    axes, lifted = f"{node.output[0]}__ov_axes{counter[0]}", f"{node.output[0]}__ov_rank{counter[0]}"
                    new_nodes.append(helper.make_node("Constant", [], [axes], value=helper.make_tensor(
                        axes, onnx.TensorProto.INT64, [ranks[const] - ranks[other]],
                        list(range(ranks[const] - ranks[other])))))
                    new_nodes.append(helper.make_node("Unsqueeze", [other, axes], [lifted]))
                    node.input[i] = lifted
                    ranks[lifted], types[lifted] = ranks[const], types.get(other, 0)
                    changed = True
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                changed |= _rewrite(sub, frozenset(empty), frozenset(constants), types, ranks, counter, opset)
        new_nodes.append(node)
    if changed:
        del graph.node[:]
        graph.node.extend(new_nodes)
    return changed


def _pass_special_input(node: onnx.NodeProto, counter: list[int]) -> list[onnx.NodeProto]:
    """`node`, writing a new name, then Where(test(x), x, node's result) under its output's name."""
    counter[0] += 1
    x, out = node.input[0], node.output[0]
    computed, special = f"{out}__ov_op{counter[0]}", f"{out}__ov_special{counter[0]}"
    node.output[0] = computed
    test, attributes = _SPECIAL_INPUT[node.op_type]
    return [node, helper.make_node(test, [x], [special], **attributes),
            helper.make_node("Where", [special, x, computed], [out])]


def _poison_rows(node: onnx.NodeProto, counter: list[int], opset: int) -> list[onnx.NodeProto]:
    """`node` (Softmax or LogSoftmax), writing a new name, then Where(IsNaN(s), s, its result) under its output's
    name, where s = ReduceSum(x - ReduceMax(x)) along its axis."""
    counter[0] += 1
    x, out, tag = node.input[0], node.output[0], f"{node.output[0]}__ov_row{counter[0]}"
    node.output[0] = f"{tag}_op"
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    axes = [helper.make_node("Constant", [], [f"{tag}_axes"], value=helper.make_tensor(
        f"{tag}_axes", onnx.TensorProto.INT64, [1], [axis]))]

    def reduce(op: str, value: str, name: str, axes_as_input: bool) -> onnx.NodeProto:
        if axes_as_input:
            return helper.make_node(op, [value, f"{tag}_axes"], [name], keepdims=1)
        return helper.make_node(op, [value], [name], axes=[axis], keepdims=1)

    return [node, *axes,
            reduce("ReduceMax", x, f"{tag}_max", opset >= 18),
            helper.make_node("Sub", [x, f"{tag}_max"], [f"{tag}_shifted"]),
            reduce("ReduceSum", f"{tag}_shifted", f"{tag}_sum", opset >= 13),
            helper.make_node("IsNaN", [f"{tag}_sum"], [f"{tag}_nan"]),
            helper.make_node("Where", [f"{tag}_nan", f"{tag}_sum", node.output[0]], [out])]


def _restore_infinity(node: onnx.NodeProto, counter: list[int], elem_type: int) -> list[onnx.NodeProto]:
    """`node` (ReduceMax or ReduceMin), writing a new name, then Where(every reduced value is that infinity,
    the infinity, its result) under its output's name. The test is a ReduceMin of IsInf as 0/1 over the same
    axes (a copy of `node` on it)."""
    counter[0] += 1
    sign = _EXTREME[node.op_type]
    x, out, tag = node.input[0], node.output[0], f"{node.output[0]}__ov_inf{counter[0]}"
    node.output[0] = f"{tag}_op"
    every = onnx.NodeProto()
    every.CopyFrom(node)
    every.op_type, every.input[0], every.output[0] = "ReduceMin", f"{tag}_is", f"{tag}_every"
    infinity = helper.make_tensor(f"{tag}_f32", onnx.TensorProto.FLOAT, [], [sign * float("inf")])
    return [node,
            helper.make_node("IsInf", [x], [f"{tag}_isinf"], detect_negative=int(sign < 0),
                             detect_positive=int(sign > 0)),
            helper.make_node("Cast", [f"{tag}_isinf"], [f"{tag}_is"], to=onnx.TensorProto.FLOAT),
            every,
            helper.make_node("Cast", [f"{tag}_every"], [f"{tag}_all"], to=onnx.TensorProto.BOOL),
            helper.make_node("Constant", [], [f"{tag}_f32"], value=infinity),
            helper.make_node("Cast", [f"{tag}_f32"], [f"{tag}_value"], to=elem_type),
            helper.make_node("Where", [f"{tag}_all", f"{tag}_value", node.output[0]], [out])]


def _constant_of_shape(node: onnx.NodeProto, dims: list[int], elem_type: int,
                       counter: list[int]) -> list[onnx.NodeProto]:
    """ConstantOfShape(dims) of `elem_type` (zero elements: its value is never read) in place of `node`."""
    counter[0] += 1
    shape = f"{node.output[0]}__ov_shape{counter[0]}"
    return [helper.make_node("Constant", [], [shape], value=helper.make_tensor(
                shape, onnx.TensorProto.INT64, [len(dims)], dims)),
            helper.make_node("ConstantOfShape", [shape], [node.output[0]],
                             value=helper.make_tensor(f"{shape}_value", elem_type, [1], [0]))]


def _cast_to(node: onnx.NodeProto) -> int:
    return next(a.i for a in node.attribute if a.name == "to")


def _narrowing(node: onnx.NodeProto, types: dict[str, int]) -> bool:
    """A Cast from f32 to bf16 or f16."""
    return types.get(node.input[0]) == onnx.TensorProto.FLOAT and _cast_to(node) in FORMATS
