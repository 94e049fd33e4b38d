"""Composing data movement: a Slice of a Slice, Pad or Concat, a Pad of a Pad or Slice, each become one node.

jax-cfd shifts its grids with jnp.pad, slicing and jnp.roll, so a stencil leaves
chains like slice(pad(x)) behind: ONNX Runtime copies the whole array at each
node, where XLA fuses them into the consumer. Each rule here returns the same
elements with one copy fewer. Shapes must be static (the rewrite driver checks).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hlo2onnx.patterns.noderules import Emitter, producer_of, same_value
from hlo2onnx.patterns.cleanup import const_array, static_shape

Ranges = dict[int, tuple[int, int]]  # axis -> [start, stop) with step 1


def _ranges(node: ir.Node) -> Ranges | None:
    """The [start, stop) per sliced axis of a Slice with constant inputs and unit steps."""
    shape = static_shape(node.inputs[0])
    arrays = [const_array(v) if v is not None else None for v in node.inputs[1:]]
    if shape is None or len(arrays) < 2 or arrays[0] is None or arrays[1] is None or any(a is None for a in arrays[2:]):
        return None
    starts, ends = arrays[0].reshape(-1), arrays[1].reshape(-1)
    axes = arrays[2].reshape(-1) if len(arrays) > 2 else np.arange(len(starts))
    steps = arrays[3].reshape(-1) if len(arrays) > 3 else np.ones(len(starts), np.int64)
    ranges = {}
    for start, end, axis, step in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist()):
        axis %= len(shape)
        if step != 1 and shape[axis] != 1:  # reversing (or striding) a size-1 axis keeps it as it is
            return None
        ranges[axis] = tuple(int(i) for i in slice(start, end, step).indices(shape[axis])[:2]) if step == 1 else (0, 1)
    return ranges


def _slice(emit: Emitter, x: ir.Value, ranges: Ranges, like: ir.Value) -> ir.Value:
    shape = static_shape(x)
    kept = {a: r for a, r in sorted(ranges.items()) if r != (0, shape[a])}
    if not kept:
        return x
    consts = [emit.graph_shape(tuple(r[i] for r in kept.values())) for i in (0, 1)]
    return emit("Slice", x, *consts, emit.graph_shape(tuple(kept)), like=like)


def _pads(node: ir.Node) -> np.ndarray | None:
    """A Pad's pads as [rank, 2] (start, end), when constant and over every axis."""
    pads = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if pads is None or (len(node.inputs) > 3 and node.inputs[3] is not None):
        return None
    return pads.reshape(2, -1).T.astype(np.int64)


def _mode(node: ir.Node) -> str:
    mode = node.attributes.get("mode")
    return mode.as_string() if mode is not None else "constant"


def _pads_input(emit: Emitter, pads: np.ndarray) -> ir.Value:
    """Pad's `pads` input for [rank, 2] (start, end) pairs: all starts, then all ends."""
    return emit.graph_shape(tuple(pads.T.reshape(-1).tolist()))


def _pad(emit: Emitter, like_node: ir.Node, x: ir.Value, pads: np.ndarray, out: ir.Value) -> ir.Value:
    if not pads.any():
        return x
    value = like_node.inputs[2:3] if len(like_node.inputs) > 2 else []
    return emit("Pad", x, _pads_input(emit, pads), *value, like=out, attrs=tuple(like_node.attributes.values()))


def _slice_of_slice(node: ir.Node, inner: ir.Node, emit: Emitter) -> ir.Value | None:
    outer_ranges, inner_ranges = _ranges(node), _ranges(inner)
    if outer_ranges is None or inner_ranges is None:
        return None
    shape = static_shape(inner.inputs[0])
    combined = dict(inner_ranges)
    for axis, (start, stop) in outer_ranges.items():
        base = inner_ranges.get(axis, (0, shape[axis]))[0]
        combined[axis] = (base + start, base + stop)
    return _slice(emit, inner.inputs[0], combined, node.outputs[0])


def _slice_of_pad(node: ir.Node, pad: ir.Node, emit: Emitter) -> ir.Value | None:
    """Slicing off padding is padding less; cutting into the data is a negative pad (constant mode only:
    edge and reflect read the border the crop would move)."""
    ranges, pads = _ranges(node), _pads(pad)
    if ranges is None or pads is None:
        return None
    padded = static_shape(pad.outputs[0])
    pads = pads.copy()
    for axis, (start, stop) in ranges.items():
        pads[axis] -= (start, padded[axis] - stop)
    if (pads < 0).any() and _mode(pad) != "constant":
        return None
    return _pad(emit, pad, pad.inputs[0], pads, node.outputs[0])


def _slice_of_concat(node: ir.Node, concat: ir.Node, emit: Emitter) -> ir.Value | None:
    """A slice inside one of the joined pieces slices that piece; one along the joins that keeps whole
    pieces joins just those (jax-cfd pads a row on, then slices it off again)."""
    ranges = _ranges(node)
    axis = concat.attributes["axis"].as_int() % len(static_shape(node.outputs[0]))
    if ranges is None or axis not in ranges:
        return None
    start, stop = ranges[axis]
    offset, whole = 0, []
    for piece in concat.inputs:
        size = static_shape(piece)[axis]
        if offset <= start and stop <= offset + size:
            return _slice(emit, piece, {**ranges, axis: (start - offset, stop - offset)}, node.outputs[0])
        if start <= offset and offset + size <= stop:
            whole.append(piece)
        elif offset < stop and start < offset + size:
            return None  # cuts into a piece
        offset += size
    others = {a: r for a, r in ranges.items() if a != axis and r != (0, static_shape(node.inputs[0])[a])}
    if others or not whole:
        return None
    if len(whole) == 1:
        return whole[0]
    return emit("Concat", *whole, like=node.outputs[0], attrs=tuple(concat.attributes.values()))


_INNER = {"Slice": _slice_of_slice, "Pad": _slice_of_pad, "Concat": _slice_of_concat}


def slice_rule(node: ir.Node, emit: Emitter) -> ir.Value | None:
    # The inner node may have other users: the replacement is one node all the same, and the inner
    # one goes once every user is rewritten.
    inner = node.inputs[0].producer()
    if inner is None or inner.domain != "" or inner.op_type not in _INNER:
        return None
    return _INNER[inner.op_type](node, inner, emit)


def _pad_of_slice(node: ir.Node, inner: ir.Node, emit: Emitter) -> ir.Value | None:
    """pad(slice(x)) -> pad(x) with the crop as negative pads, where no side is both cropped and padded
    (ONNX Pad crops first, then pads). Constant mode only: edge and reflect read the new border."""
    ranges, pads = _ranges(inner), _pads(node)
    if ranges is None or pads is None or _mode(node) != "constant":
        return None
    shape = static_shape(inner.inputs[0])
    crops = np.zeros_like(pads)
    for axis, (start, stop) in ranges.items():
        crops[axis] = (start, shape[axis] - stop)
    if ((crops > 0) & (pads > 0)).any():
        return None
    return _pad(emit, node, inner.inputs[0], pads - crops, node.outputs[0])


def pad_rule(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """pad(pad(x)) -> one pad, when both fill with the same constant; pad(slice(x)) -> _pad_of_slice."""
    sliced = producer_of(node.inputs[0], "Slice")
    if sliced is not None:
        return _pad_of_slice(node, sliced, emit)
    inner = producer_of(node.inputs[0], "Pad")
    if inner is None:
        return None
    outer_pads, inner_pads, mode = _pads(node), _pads(inner), _mode(node)
    if outer_pads is None or inner_pads is None or mode != _mode(inner) or mode != "constant":
        return None
    if (outer_pads < 0).any() or (inner_pads < 0).any():
        return None
    values = [n.inputs[2] if len(n.inputs) > 2 else None for n in (node, inner)]
    if values[0] is not values[1] and (None in values or not same_value(*values)):
        return None
    return _pad(emit, node, inner.inputs[0], outer_pads + inner_pads, node.outputs[0])


def _tail(value: ir.Value, x: ir.Value, axis: int, at_end: bool) -> int | None:
    """k when `value` is x's last (at_end) or first k entries along `axis`, else None."""
    sliced = producer_of(value, "Slice")
    ranges = _ranges(sliced) if sliced is not None and sliced.inputs[0] is x else None
    if ranges is None or set(ranges) - {axis}:
        return None
    size = static_shape(x)[axis]
    start, stop = ranges.get(axis, (0, size))
    return stop - start if (stop == size if at_end else start == 0) else None


def concat_rule(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """concat(x[-k:], x, x[:m]) -> Pad(x, mode="wrap") (jnp.pad's wrap mode, jax-cfd's periodic boundaries)."""
    if emit.opset < 19 or (emit.target is not None and emit.target.ops is not None) or len(node.inputs) > 3:
        return None  # wrap came with Pad-19; targets with an op list may lack its modes
    rank = len(static_shape(node.outputs[0]))
    axis = node.attributes["axis"].as_int() % rank
    for middle, x in enumerate(node.inputs):
        before = [_tail(v, x, axis, at_end=True) for v in node.inputs[:middle]]
        after = [_tail(v, x, axis, at_end=False) for v in node.inputs[middle + 1:]]
        if len(before) <= 1 and len(after) <= 1 and None not in before + after and before + after:
            pads = np.zeros((rank, 2), np.int64)
            pads[axis] = (sum(before), sum(after))
            if pads[axis].max() > static_shape(x)[axis]:
                return None
            return emit("Pad", x, _pads_input(emit, pads), like=node.outputs[0], attrs=(ir.AttrString("mode", "wrap"),))
    return None


RULES = {"Slice": slice_rule, "Pad": pad_rule, "Concat": concat_rule}
