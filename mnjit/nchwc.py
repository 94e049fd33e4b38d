"""Convolutions on ONNX Runtime's blocked (NCHWc) CPU kernels when their weights are inputs.

ORT's CPU provider runs a float `Conv` through its NCHWc kernels (channels in blocks of the vector width) only
when the weights are constants: its graph optimizer reorders them once, at session creation. A jax function's
weights are arguments, so mnjit's Conv nodes read graph inputs and ORT falls back to im2col and a matrix
multiply: a CNN's convolutions ran 1.6x slower that way (docs/performance.md). This rewrite does the reorder
in the graph, each run (a Reshape and a Transpose of the small weight tensor), and calls the same kernels:

    Conv(x, W, b)  ->  ReorderOutput(nchwc.Conv(ReorderInput(x), reorder(W), b))

The rewrite is applied where a session is made on this machine (mnjit/ffi.py, mnjit/runtime.py), never to a
model that is saved: the ops are ORT's internal ones (domain com.microsoft.nchwc) and the block size is this
CPU's. ORT documents neither the ops nor the filter layout, so `block_size()` asks ORT itself once per
machine (the answer is kept in mnjit's persistent cache, keyed by ORT's version and the CPU): it lets ORT
reorder two known constant filters and accepts a block size only when this module's reorder gives the same
bytes for both of the layouts it uses. Any difference, or no NCHWc kernels, leaves models as they are.
"""
from __future__ import annotations

import functools
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from mnjit import cache_key

NCHWC = "com.microsoft.nchwc"
_FLOAT = onnx.TensorProto.FLOAT


def rewrite(proto: onnx.ModelProto) -> int:
    """Moves `proto`'s float 2-D convolutions whose filter is not a constant onto the NCHWc kernels, in place;
    returns how many. A BatchNormalization (with parameters the graph takes or holds) and a Relu that alone read
    the result go into the kernel too, as ORT's optimizer does with constant filters. Only the main graph: a
    Conv in a loop body stays."""
    graph = proto.graph
    if not any(map(_is_conv, graph.node)):
        return 0
    block = block_size()
    if block is None:
        return 0
    constants = {t.name for t in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"}
    # Values readable anywhere in the node list: a folded BatchNormalization's parameters must be.
    everywhere = {t.name for t in graph.initializer} | {v.name for v in graph.input}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {v.name for v in graph.output}

    def only_reader(value: str, op_type: str) -> onnx.NodeProto | None:
        """The node of `op_type` that alone reads `value`, as its data input; None if there is none."""
        found = readers.get(value, [])
        if value in outputs or len(found) != 1 or found[0].op_type != op_type or found[0].domain not in ("", "ai.onnx"):
            return None
        return found[0] if list(found[0].input).count(value) == 1 and found[0].input[0] == value else None

    shapes = _static_shapes(graph)
    absorbed: set[int] = set()
    rewritten = 0
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if id(node) in absorbed:
            continue
        plan = _plan(node, block, shapes, constants) if _is_conv(node) else None
        if plan is None:
            nodes.append(node)
            continue
        norm = only_reader(node.output[0], "BatchNormalization")
        if norm is not None and not _foldable(norm, everywhere):
            norm = None
        relu = only_reader((norm or node).output[0], "Relu")
        absorbed.update(id(n) for n in (norm, relu) if n is not None)
        nodes.extend(_replacement(node, block, *plan, graph, rewritten, norm, relu))
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
        if not any(o.domain == NCHWC for o in proto.opset_import):
            proto.opset_import.append(helper.make_opsetid(NCHWC, 1))
    return rewritten


def _is_conv(node: onnx.NodeProto) -> bool:
    return node.op_type == "Conv" and node.domain in ("", "ai.onnx")


def _foldable(norm: onnx.NodeProto, everywhere: set[str]) -> bool:
    """An inference BatchNormalization whose scale, bias, mean and variance the graph takes or holds."""
    attrs = {a.name: helper.get_attribute_value(a) for a in norm.attribute}
    return len(norm.output) == 1 and not attrs.get("training_mode", 0) and all(
        name in everywhere for name in norm.input[1:5]) and len(norm.input) == 5


def _plan(node: onnx.NodeProto, block: int, shapes: dict, constants: set[str]) -> tuple | None:
    """(filter shape, whether the input is reordered) where the NCHWc kernels take this Conv, else None."""
    if len(node.input) < 2 or node.input[1] in constants:
        return None  # a constant filter: ORT's own optimizer reorders it
    x, w = shapes.get(node.input[0]), shapes.get(node.input[1])
    if x is None or w is None or x[0] != _FLOAT or w[0] != _FLOAT or len(x[1]) != 4 or len(w[1]) != 4 \
            or None in w[1]:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("group", 1) != 1 or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    if len(node.input) > 2 and node.input[2]:
        bias = shapes.get(node.input[2])
        if bias is None or bias[1] != (w[1][0],):
            return None
    channels_in = w[1][1]
    if channels_in < block:
        return w[1], False  # ORT's kernels read a narrow input as plain NCHW
    if channels_in % block:
        return None
    return w[1], True


def _replacement(node: onnx.NodeProto, block: int, filter_shape: tuple, reorder_input: bool,
                 graph: onnx.GraphProto, index: int, norm: onnx.NodeProto | None,
                 relu: onnx.NodeProto | None) -> list[onnx.NodeProto]:
    out_channels, in_channels, kh, kw = filter_shape
    padded = -(-out_channels // block) * block
    name = f"{node.name or 'conv'}_nchwc{index}"
    nodes: list[onnx.NodeProto] = []

    def const(suffix: str, values, dtype=np.int64) -> str:
        tensor = numpy_helper.from_array(np.asarray(values, dtype), f"{name}_{suffix}")
        graph.initializer.append(tensor)
        return tensor.name

    def emit(op_type: str, inputs: list[str], suffix: str, **attrs) -> str:
        nodes.append(helper.make_node(op_type, inputs, [f"{name}_{suffix}"], **attrs))
        return f"{name}_{suffix}"

    w, bias = node.input[1], node.input[2] if len(node.input) > 2 and node.input[2] else ""
    if norm is not None:  # y = (conv + b - mean) * s + beta, s = gamma / sqrt(var + eps): into W and b
        gamma, beta, mean, var = norm.input[1:5]
        eps = next((helper.get_attribute_value(a) for a in norm.attribute if a.name == "epsilon"), 1e-5)
        s = emit("Div", [gamma, emit("Sqrt", [emit("Add", [var, const("eps", eps, np.float32)], "v")], "r")], "s")
        w = emit("Mul", [w, emit("Reshape", [s, const("sshape", [-1, 1, 1, 1])], "s4")], "wn")
        shifted = emit("Sub", [bias, mean], "bm") if bias else emit("Neg", [mean], "bm")
        bias = emit("Add", [emit("Mul", [shifted, s], "bs"), beta], "bn")
    if padded != out_channels:  # zero filters (and biases) for the last block's unused channels
        extra = padded - out_channels
        w = emit("Pad", [w, const("wpad", [0] * 4 + [extra, 0, 0, 0])], "wp")
        if bias:
            bias = emit("Pad", [bias, const("bpad", [0, extra])], "bp")
    blocked, perm = _filter_layout(padded, in_channels, kh, kw, block, reorder_input)
    w = emit("Reshape", [emit("Transpose", [emit("Reshape", [w, const("wsplit", blocked)], "ws")], "wt", perm=perm),
                         const("wshape", [padded, in_channels, kh, kw])], "w")
    x = node.input[0]
    if reorder_input:
        x = emit("ReorderInput", [x], "x", domain=NCHWC, channels_last=0)
    conv = helper.make_node("Conv", [x, w] + ([bias] if bias else []), [f"{name}_y"], name=name, domain=NCHWC)
    conv.attribute.extend(node.attribute)
    if relu is not None:
        conv.attribute.append(helper.make_attribute("activation", "Relu"))
    nodes.append(conv)
    last = relu or norm or node
    nodes.append(helper.make_node("ReorderOutput", [f"{name}_y"], [last.output[0]], domain=NCHWC,
                                  channels=out_channels, channels_last=0))
    return nodes


def _filter_layout(out_channels: int, in_channels: int, kh: int, kw: int, block: int,
                   blocked_input: bool) -> tuple[list[int], list[int]]:
    """The Reshape and Transpose that take an OIHW filter (out_channels a multiple of `block`) to ORT's layout:
    [O/b][I/b][H][W][b_in][b_out] for a blocked input, [O/b][I][H][W][b_out] for a plain NCHW one."""
    if blocked_input:
        return [out_channels // block, block, in_channels // block, block, kh, kw], [0, 2, 4, 5, 3, 1]
    return [out_channels // block, block, in_channels, kh, kw], [0, 2, 3, 4, 1]


def reorder(filters: np.ndarray, block: int, blocked_input: bool) -> np.ndarray:
    """`_filter_layout` applied in numpy: what the graph computes from a filter."""
    blocked, perm = _filter_layout(*filters.shape, block, blocked_input)
    return filters.reshape(blocked).transpose(perm).reshape(filters.shape)


def _static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, tuple]]:
    """Element type and shape (None for a dim that is not a number) of the values the graph declares."""
    shapes = {}
    for v in [*graph.input, *graph.value_info, *graph.output]:
        tensor = v.type.tensor_type
        if v.type.HasField("tensor_type") and tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
            shapes[v.name] = (tensor.elem_type, dims)
    for t in graph.initializer:
        shapes[t.name] = (t.data_type, tuple(t.dims))
    return shapes


@functools.cache
def block_size() -> int | None:
    """ORT's NCHWc block size on this CPU, once this module's filter reorder is checked against ORT's own; None
    where ORT has no NCHWc kernels here or lays filters out otherwise. MNJIT_NCHWC=0 turns the rewrite off.
    The probe takes 6-12 ms; mnjit's persistent cache keeps its answer for the next process."""
    if os.environ.get("MNJIT_NCHWC", "1") == "0":
        return None
    return cache_key.stored_number(("nchwc-block-size",), lambda: _probe() or 0, below=1 << 16) or None


def _probe() -> int | None:
    """The block size for which `reorder` gives the bytes ORT's own optimizer gives two known filters."""
    # Two constant-filter convolutions for ORT to reorder: 64 input channels (blocked) and 3 (plain NCHW input).
    rng = np.random.default_rng(0)
    filters = {"wide": rng.standard_normal((64, 64, 3, 3)).astype(np.float32),
               "narrow": rng.standard_normal((64, 3, 3, 3)).astype(np.float32)}
    x = helper.make_tensor_value_info("x", _FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", _FLOAT, None)
    nodes = [helper.make_node("Conv", ["x", "narrow"], ["h"], pads=[1] * 4),
             helper.make_node("Conv", ["h", "wide"], ["y"], pads=[1] * 4)]
    model = helper.make_model(
        helper.make_graph(nodes, "probe", [x], [y], [numpy_helper.from_array(a, n) for n, a in filters.items()]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # onnx's newest IR can be beyond ORT's
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with tempfile.TemporaryDirectory() as folder:
        options.optimized_model_filepath = os.path.join(folder, "probe.onnx")
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            optimized = onnx.load(options.optimized_model_filepath)
        except Exception:  # noqa: BLE001 - any failure here only means: no rewrite
            return None
    reordered = {t.name: numpy_helper.to_array(t) for t in optimized.graph.initializer}
    convs = [n for n in optimized.graph.node if n.domain == NCHWC and n.op_type == "Conv"]
    if len(convs) != 2:
        return None
    narrow, wide = (reordered.get(c.input[1]) for c in convs)
    for block in (4, 8, 16, 32, 64):
        if (narrow is not None and wide is not None and narrow.shape == filters["narrow"].shape
                and wide.shape == filters["wide"].shape
                and np.array_equal(narrow, reorder(filters["narrow"], block, False))
                and np.array_equal(wide, reorder(filters["wide"], block, True))):
            return block
    return None
