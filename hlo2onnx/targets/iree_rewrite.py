"""ONNX rewrites that let IREE 3.13 compile what the translator writes (docs/runtime.md, IREE section).

Each rewrite is exact, the same values by construction (tests/test_iree.py checks them at tolerance 0
against ORT on the original model). The pipeline applies them to every model written for the target
(`rewrite_for_iree`, after the NaN guards of targets/portable.py), so IREE's own tools compile what mnjit runs:

- Pad with negative pads (StableHLO's crop, which ONNX's Pad allows): iree-compile refuses it ("expected
  offsets to be non-negative"). The crop becomes a Slice, and the Pad keeps the non-negative pads.
- Pad with mode="wrap" (periodic boundaries, patterns/movement.py): iree-compile did not finish in minutes
  on a 4x5 input. It becomes the Concat of Slices it was fused from.
- Pad (constant mode, pads >= 0) becomes the Concat of x and the fill value expanded to each padded block
  where iree-compile fails on it: one that widens a size-1 axis at its end (how the translator spreads an
  axis apart for StableHLO's interior padding) in a 1-d associative_scan ("expected rank to be smaller or
  equal to the other rank", any dtype), and an int64 or float64 Pad filling with anything but a constant 0:
  two of them feeding one elementwise op failed ("'stream.yield' op used resource not listed in explicit
  captures": an int64 cumprod; a float64 max over -inf fills alike).
- Slice with starts or ends past the axis (ONNX clamps them): iree-compile refuses a start at or past the
  end ("slice along dimension 0 runs out-of-bounds: 18 >= 18"). Constant bounds on a static shape are
  clamped as ONNX says; a Slice that selects nothing becomes the empty constant it is.
- Neg on int32/int64: IREE 3.13 computes it through f32 (-(2**31 - 1) came back as -2**31). It becomes
  Sub(0, x), which wraps as XLA does.
- (Max and Min on floats return a NaN only from their second operand, and Clip drops it: the pipeline's NaN
  guards, targets/portable.py, cover them as for any consumer not known to propagate NaN.)
- Loop and If bodies reading the main graph's shape operands (the [1, 1] sizes of the Split that takes a
  complex value apart, axes, shapes): ONNX shape inference, which the importer runs first, reads no
  outer-scope constant, so the body's values come out unranked, and torch-mlir crashes on them (in the Split
  conversion; a Loop is not legalized). Each body gets Constant copies of the int64 scalars and vectors it
  reads, and its values get their static shapes.
- Loop without a condition input (a trip count only: fori_loop): torch-mlir's conversion does not take the
  empty input. A constant true condition means the same. (While loops and loops with scan outputs are
  refused by the target: targets/iree.py.)
- ReduceL2 on float64: torch-mlir's conversion takes the square root in f32 (the sum truncated to f32,
  its sqrt extended back: the norm came back an f32 value, 2e-8 off), which put JAX-MD's f64 FIRE step 1e-9
  off jax.jit (its force norm). It becomes Sqrt(ReduceSumSquare), both kept in f64 by IREE.
- ReduceSumSquare over a short last axis (2 to 4: a displacement's components): IREE reduces it in tiles of a
  few rows (31250 of them on JAX-MD's f32[1000, 1000, 2] pair displacements, 1.2 ms of the FIRE step), and
  fuses nothing after it. It becomes Mul(x, x) and its slices along the axis added in order (ORT's order;
  XLA's for 2 components), elementwise. The squares come from one Mul so that none is contracted with an
  add into an FMA, which IREE does to x0 * x0 + x1 * x1 written out (an ulp off in 16% of the sums).
- ScatterND with indices of rank 1 (one index tuple: a one-element dynamic_update_slice of a vector):
  torch-mlir's conversion does not legalize it ("failed to legalize operation ... onnx.ScatterND"). Indices
  and updates get a leading axis of 1, the same scatter as a batch of one.
- MatMul over an empty contracted axis (jnp.dot of (3, 0) by (0, 4)): iree-compile crashes (in
  AnnotateDispatches, after warning that it reads a tensor.empty). On static shapes it is the zeros constant
  it is, as an empty Slice is the empty constant.

The model must carry inferred shapes (onnx.shape_inference) for the Slice, MatMul, ScatterND, ReduceSumSquare
and Pad-as-Concat rewrites;
others need none.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

_END = np.iinfo(np.int64).max  # Slice's "to the end"
_BEFORE_START = np.iinfo(np.int64).min  # a negative-step Slice's "through index 0"
_WIDE_INTS = {onnx.TensorProto.INT32, onnx.TensorProto.INT64}
_WIDE_64 = {onnx.TensorProto.INT64, onnx.TensorProto.DOUBLE}
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def rewrite_for_iree(proto: onnx.ModelProto) -> bool:
    """The target's rewrite: `for_iree` after shape inference, which the Slice, MatMul, ScatterND,
    ReduceSumSquare and Pad rewrites read (the inferred value types stay in the model)."""
    proto.CopyFrom(onnx.shape_inference.infer_shapes(proto, data_prop=True))
    return for_iree(proto)


def for_iree(proto: onnx.ModelProto) -> bool:
    """Rewrites `proto` in place (subgraphs included); True if anything changed."""
    return _rewrite(proto.graph, {}, [0])


def _shapes(graph: onnx.GraphProto, outer: dict[str, tuple]) -> dict[str, tuple]:
    """Static shapes by value name (inputs, outputs, value_info, initializers); unknown dims leave a value out."""
    shapes = dict(outer)
    for v in [*graph.input, *graph.output, *graph.value_info]:
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
            dims = v.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                shapes[v.name] = tuple(d.dim_value for d in dims)
    shapes.update({t.name: tuple(t.dims) for t in graph.initializer})
    return shapes


def _elem_types(graph: onnx.GraphProto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output, *graph.value_info]
            if v.type.HasField("tensor_type")}


def _constants(graph: onnx.GraphProto, outer: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    values = dict(outer)
    values.update({t.name: numpy_helper.to_array(t) for t in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _rewrite(graph: onnx.GraphProto, outer: dict[str, np.ndarray], counter: list[int],
             outer_shapes: dict[str, tuple] | None = None) -> bool:
    changed = _local_shape_operands(graph, outer, counter) if outer else False
    constants = _constants(graph, outer)
    shapes = _shapes(graph, outer_shapes or {})
    elem_types = _elem_types(graph)
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                changed |= _rewrite(sub, constants, counter, shapes)
        replacement = None
        if node.domain in ("", "ai.onnx"):
            if node.op_type == "Slice":
                replacement = _clamped_slice(node, constants, shapes, graph, counter)
            elif node.op_type == "MatMul" and shapes.get(node.input[0], (1,))[-1:] == (0,):
                replacement = _zeros(node, shapes.get(node.output[0]), elem_types.get(node.output[0]))
            elif node.op_type == "Neg" and elem_types.get(node.input[0]) in _WIDE_INTS:
                replacement = [helper.make_node("Sub", [_zero(graph, counter, elem_types[node.input[0]]),
                                                        node.input[0]], list(node.output))]
            elif node.op_type == "Loop" and len(node.input) > 1 and node.input[0] and not node.input[1]:
                node.input[1] = _scalar(graph, counter, np.bool_(True))
                replacement = [node]
            elif node.op_type == "ScatterND" and len(shapes.get(node.input[1], ())) == 1:
                replacement = _one_more_update_axis(node, graph, counter)
            elif node.op_type == "ReduceL2" and elem_types.get(node.input[0]) == onnx.TensorProto.DOUBLE:
                replacement = _sqrt_of_sum_square(node, counter)
            elif node.op_type == "ReduceSumSquare" and elem_types.get(node.input[0]) in _FLOATS:
                replacement = _sum_square_by_slices(node, constants, shapes.get(node.input[0]), graph, counter)
        if replacement is not None:
            new_nodes += replacement
            changed = True
            continue
        pads = constants.get(node.input[1]) if node.op_type == "Pad" and len(node.input) > 1 else None
        if pads is None or node.domain not in ("", "ai.onnx") or (len(node.input) > 3 and node.input[3]):
            new_nodes.append(node)  # not a Pad, pads not constant, or pads over a subset of axes
            continue
        mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "constant")
        rank = pads.size // 2
        lo, hi = pads[:rank].astype(np.int64), pads[rank:].astype(np.int64)
        if mode == "wrap" and ((lo > 0).any() or (hi > 0).any()) and (lo >= 0).all() and (hi >= 0).all():
            new_nodes += _wrap_as_concat(node, lo, hi, graph, counter)
            changed = True
        elif mode == "constant" and ((lo < 0).any() or (hi < 0).any()):
            shape, elem = shapes.get(node.input[0]), elem_types.get(node.input[0])
            new_nodes += _crop_then_pad(node, lo, hi, graph, counter)
            if new_nodes[-1] is node and shape is not None and _wide_fill(node, elem, constants):
                cropped = tuple(int(d) for d in np.add(shape, np.minimum(lo, 0) + np.minimum(hi, 0)))
                new_nodes[-1:] = _pad_as_concat(node, np.maximum(lo, 0), np.maximum(hi, 0), cropped, elem, graph,
                                                counter)
            changed = True
        elif mode == "constant" and node.input[0] in shapes and node.input[0] in elem_types \
                and (_spreads_unit_axis(lo, hi, shapes[node.input[0]])
                     or _wide_fill(node, elem_types[node.input[0]], constants)):
            new_nodes += _pad_as_concat(node, lo, hi, shapes[node.input[0]], elem_types[node.input[0]], graph, counter)
            changed = True
        else:
            new_nodes.append(node)
    if changed:
        del graph.node[:]
        graph.node.extend(new_nodes)
    return changed


def _one_more_update_axis(node: onnx.NodeProto, graph: onnx.GraphProto, counter: list[int]) -> list[onnx.NodeProto]:
    """ScatterND with one index tuple (indices of rank 1): the same scatter as a batch of one."""
    axes = _const(graph, counter, [0])
    indices, updates = _fresh(node.input[1], counter), _fresh(node.input[2], counter)
    lifted = [helper.make_node("Unsqueeze", [node.input[1], axes], [indices]),
              helper.make_node("Unsqueeze", [node.input[2], axes], [updates])]
    node.input[1], node.input[2] = indices, updates
    return [*lifted, node]


def _local_shape_operands(body: onnx.GraphProto, outer: dict[str, np.ndarray], counter: list[int]) -> bool:
    """Gives a Loop or If body its own Constant copy of each outer int64 scalar or vector it reads past a
    node's first input (the sizes, axes, shapes and bounds of Split, Unsqueeze, Reshape, Slice...)."""
    own = _constants(body, {})
    copies: dict[str, str] = {}
    for node in body.node:
        for i, name in enumerate(node.input):
            value = outer.get(name)
            if i == 0 or name in own or value is None or value.dtype != np.int64 or value.ndim > 1:
                continue
            if name not in copies:
                copies[name] = _fresh(name, counter)
            node.input[i] = copies[name]
    local = [helper.make_node("Constant", [], [copy], value=numpy_helper.from_array(outer[name], copy))
             for name, copy in copies.items()]
    if local:
        nodes = [*local, *body.node]
        del body.node[:]
        body.node.extend(nodes)
    return bool(local)


def _const(graph: onnx.GraphProto, counter: list[int], values) -> str:
    counter[0] += 1
    name = f"__iree_const{counter[0]}"
    graph.initializer.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
    return name


def _zero(graph: onnx.GraphProto, counter: list[int], elem: int) -> str:
    counter[0] += 1
    name = f"__iree_zero{counter[0]}"
    graph.initializer.append(numpy_helper.from_array(np.zeros((), onnx.helper.tensor_dtype_to_np_dtype(elem)), name))
    return name


def _scalar(graph: onnx.GraphProto, counter: list[int], value: np.generic) -> str:
    counter[0] += 1
    name = f"__iree_scalar{counter[0]}"
    graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def _sqrt_of_sum_square(node, counter: list[int]) -> list[onnx.NodeProto]:
    """ReduceL2 as Sqrt(ReduceSumSquare) with the same axes and attributes (keepdims, noop_with_empty_axes)."""
    out = node.output[0]
    node.op_type, node.output[0] = "ReduceSumSquare", _fresh(out, counter)
    return [node, helper.make_node("Sqrt", [node.output[0]], [out])]


_SHORT_AXIS = 4  # the longest last axis whose squares are added one by one


def _sum_square_by_slices(node, constants, shape: tuple | None, graph, counter) -> list[onnx.NodeProto] | None:
    """ReduceSumSquare over a short last axis (a displacement's 2 or 3 components) as Mul(x, x), then its
    slices along that axis added in order, as ORT adds them (None where the axis is another, or longer).
    Squares of one Mul, so that no product is fused into an add (IREE contracts x0 * x0 + x1 * x1 into an
    FMA, which rounds once where the reduction rounds twice)."""
    axes = constants.get(node.input[1]) if len(node.input) > 1 and node.input[1] else next(
        (np.asarray(a.ints) for a in node.attribute if a.name == "axes"), None)
    if shape is None or axes is None or axes.size != 1 or not 1 < shape[-1] <= _SHORT_AXIS \
            or int(axes.reshape(-1)[0]) % len(shape) != len(shape) - 1:
        return None
    keep = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
    out, x = node.output[0], node.input[0]
    squares = _fresh(out, counter)
    nodes = [helper.make_node("Mul", [x, x], [squares])]
    total = None
    for i in range(shape[-1]):
        part = _fresh(out, counter)
        index = _const(graph, counter, [i] if keep else i)
        nodes.append(helper.make_node("Gather", [squares, index], [part], axis=len(shape) - 1))
        if total is not None:
            added = out if i == shape[-1] - 1 else _fresh(out, counter)
            nodes.append(helper.make_node("Add", [total, part], [added]))
            part = added
        total = part
    return nodes


def _fresh(base: str, counter: list[int]) -> str:
    counter[0] += 1
    return f"{base}__iree{counter[0]}"


def _slice(graph, counter, x: str, axis: int, start: int, stop: int) -> onnx.NodeProto:
    return helper.make_node("Slice", [x, _const(graph, counter, [start]), _const(graph, counter, [stop]),
                                      _const(graph, counter, [axis])], [_fresh(x, counter)])


def _wrap_as_concat(node, lo, hi, graph, counter) -> list[onnx.NodeProto]:
    """Pad(x, wrap) axis by axis: concat(x[-lo:], x, x[:hi]) (each pad at most the axis' size: ONNX's wrap)."""
    nodes: list[onnx.NodeProto] = []
    x = node.input[0]
    axes = [axis for axis in range(len(lo)) if lo[axis] or hi[axis]]
    for k, axis in enumerate(axes):
        parts = []
        if lo[axis]:
            nodes.append(_slice(graph, counter, x, axis, -int(lo[axis]), _END))
            parts.append(nodes[-1].output[0])
        parts.append(x)
        if hi[axis]:
            nodes.append(_slice(graph, counter, x, axis, 0, int(hi[axis])))
            parts.append(nodes[-1].output[0])
        out = node.output[0] if k == len(axes) - 1 else _fresh(node.output[0], counter)
        nodes.append(helper.make_node("Concat", parts, [out], axis=axis))
        x = out
    return nodes


def _spreads_unit_axis(lo, hi, shape: tuple) -> bool:
    """Pads that widen one size-1 axis at its end only (the spread of StableHLO's interior padding)."""
    return not lo.any() and np.count_nonzero(hi) == 1 and shape[int(np.flatnonzero(hi)[0])] == 1


def _fill_input(node) -> str:
    """A Pad's constant_value input, "" when it has none (a zero fill)."""
    return node.input[2] if len(node.input) > 2 else ""


def _wide_fill(node, elem: int, constants: dict[str, np.ndarray]) -> bool:
    """A 64-bit Pad whose fill value is not a constant of zero bits (-0.0 is not)."""
    fill = constants.get(_fill_input(node)) if _fill_input(node) else np.zeros(())
    return elem in _WIDE_64 and (fill is None or any(fill.tobytes()))


def _pad_as_concat(node, lo, hi, shape, elem: int, graph, counter) -> list[onnx.NodeProto]:
    """Pad(x) by pads >= 0 axis by axis: Concat(fill block, x, fill block), the fill value expanded to each
    block's shape."""
    fill = _fill_input(node) or _zero(graph, counter, elem)
    nodes: list[onnx.NodeProto] = []
    x, shape = node.input[0], list(shape)
    axes = [axis for axis in range(len(lo)) if lo[axis] or hi[axis]]
    for k, axis in enumerate(axes):
        parts = []
        for size in (int(lo[axis]), None, int(hi[axis])):
            if size is None or size:
                block = x if size is None else _fresh(node.output[0], counter)
                if size:
                    block_shape = _const(graph, counter, [*shape[:axis], size, *shape[axis + 1:]])
                    nodes.append(helper.make_node("Expand", [fill, block_shape], [block]))
                parts.append(block)
        out = node.output[0] if k == len(axes) - 1 else _fresh(node.output[0], counter)
        nodes.append(helper.make_node("Concat", parts, [out], axis=axis))
        x, shape[axis] = out, shape[axis] + int(lo[axis] + hi[axis])
    return nodes


def _crop_then_pad(node, lo, hi, graph, counter) -> list[onnx.NodeProto]:
    """Pad with negative pads: Slice off the cropped ends, then Pad by what is left (>= 0)."""
    axes = [axis for axis in range(len(lo)) if lo[axis] < 0 or hi[axis] < 0]
    starts = [int(max(-lo[a], 0)) for a in axes]
    stops = [int(hi[a]) if hi[a] < 0 else _END for a in axes]  # a negative stop counts from the end
    cropped = _fresh(node.output[0], counter)
    nodes = [helper.make_node("Slice", [node.input[0], _const(graph, counter, starts), _const(graph, counter, stops),
                                        _const(graph, counter, axes)], [cropped])]
    rest = np.concatenate([np.maximum(lo, 0), np.maximum(hi, 0)])
    if not rest.any():
        nodes.append(helper.make_node("Identity", [cropped], list(node.output)))
        return nodes
    node.input[0] = cropped
    node.input[1] = _const(graph, counter, rest)
    nodes.append(node)
    return nodes


def _zeros(node, shape, elem: int | None) -> list[onnx.NodeProto] | None:
    """`node` as a Constant of zeros of `shape` (None when the shape or dtype is not known)."""
    if shape is None or elem is None:
        return None
    values = np.zeros(shape, onnx.helper.tensor_dtype_to_np_dtype(elem))
    return [helper.make_node("Constant", [], list(node.output), value=numpy_helper.from_array(values, node.output[0]))]


def _clamped_slice(node, constants, shapes, graph, counter) -> list[onnx.NodeProto] | None:
    """The Slice with its bounds clamped into the axes as ONNX defines (None when they already are, or
    when a bound or the shape is not static); an empty Slice as an empty constant."""
    shape = shapes.get(node.input[0])
    bounds = [constants.get(name) if name else None for name in list(node.input[1:]) + [""] * (5 - len(node.input))]
    starts, ends, axes, steps = bounds
    if shape is None or starts is None or ends is None or (len(node.input) > 3 and node.input[3] and axes is None) \
            or (len(node.input) > 4 and node.input[4] and steps is None):
        return None
    rank = len(shape)
    axes = [int(a) % rank for a in (range(len(starts)) if axes is None else axes)]
    steps = [1] * len(axes) if steps is None else [int(s) for s in steps]
    new_starts, new_ends, out_shape = [], [], list(shape)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        # Python's slice.indices clamps exactly as ONNX's Slice does (both follow numpy).
        lo, hi, _ = slice(int(start), int(end), step).indices(shape[axis])
        out_shape[axis] = len(range(lo, hi, step))
        new_starts.append(lo)
        new_ends.append(_BEFORE_START if step < 0 and hi < 0 else hi)
    if 0 in out_shape:
        return _zeros(node, out_shape, _elem_types(graph).get(node.output[0]))
    if list(starts) == new_starts and list(ends) == new_ends:
        return None
    node.input[1] = _const(graph, counter, new_starts)
    node.input[2] = _const(graph, counter, new_ends)
    return [node]
