"""What the windowed ops share: the window attributes (`Window`), reducers' identities and combining ops,
strided slices, dilation and edge padding, and reduction bodies run on whole tensors (`body_applier`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from hlo2onnx.ops.core.shape import reshape_to
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import is_bool, is_float


# reducer -> (ONNX op on bool, ONNX op otherwise). XLA's add/mul on pred are or/and.
COMBINE = {
    "stablehlo.add": ("Or", "Add"),
    "stablehlo.multiply": ("And", "Mul"),
    "stablehlo.maximum": ("Or", "Max"),
    "stablehlo.minimum": ("And", "Min"),
    "stablehlo.and": ("And", "BitwiseAnd"),
    "stablehlo.or": ("Or", "BitwiseOr"),
}
# Windows up to this size combine one strided slice per element; longer ones double.
DIRECT_WINDOW = 8


def identity(reducer: str, dtype: np.dtype):
    """The value a reducer ignores, as a numpy scalar of `dtype`."""
    dtype = np.dtype(dtype)
    if is_bool(dtype):
        return np.bool_(reducer in ("stablehlo.multiply", "stablehlo.minimum", "stablehlo.and"))
    if reducer in ("stablehlo.add", "stablehlo.or"):
        return dtype.type(0)
    if reducer == "stablehlo.multiply":
        return dtype.type(1)
    if reducer == "stablehlo.and":
        return np.array(-1).astype(dtype)[()]  # all bits set
    if is_float(dtype):
        return dtype.type(-np.inf if reducer == "stablehlo.maximum" else np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.min if reducer == "stablehlo.maximum" else info.max)


def combine(b, reducer: str, dtype: np.dtype, x: ir.Value, y: ir.Value) -> ir.Value:
    bool_op, op = COMBINE[reducer]
    return b.op(bool_op, x, y) if is_bool(dtype) else b.typed(op, x, y, dtype=dtype)


def axis_slice(b, x: ir.Value, axis: int, start: int, stop: int, step: int = 1) -> ir.Value:
    return b.op("Slice", x, b.shape_const([start]), b.shape_const([stop]), b.shape_const([axis]),
                b.shape_const([step]))


def dilate(b, x: ir.Value, shape: list[int], axis: int, factor: int, fill: ir.Value, dtype) -> ir.Value:
    """Puts `factor - 1` fill elements between neighbours along `axis`: (n) -> (n, factor) -> n*factor -> crop."""
    n = shape[axis]
    x = b.op("Unsqueeze", x, b.shape_const([axis + 1]))
    pads = [0] * (2 * (len(shape) + 1))
    pads[len(shape) + 1 + axis + 1] = factor - 1
    x = b.typed("Pad", x, b.shape_const(pads), fill, dtype=dtype, cast=(0, 2), mode="constant")
    x = reshape_to(b, x, shape[:axis] + [n * factor] + shape[axis + 1:])
    return axis_slice(b, x, axis, 0, (n - 1) * factor + 1)


def edge_pad(b, x: ir.Value, lo, hi, fill: ir.Value, dtype) -> ir.Value:
    """ONNX Pad crops for negative pads, like StableHLO."""
    if not any(lo) and not any(hi):
        return x
    return b.typed("Pad", x, b.shape_const(list(lo) + list(hi)), fill, dtype=dtype, cast=(0, 2), mode="constant")


@dataclass(frozen=True)
class Window:
    """Per-axis window attributes with StableHLO's defaults filled in."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    base_dilation: tuple[int, ...]
    dilation: tuple[int, ...]

    @classmethod
    def read(cls, size, strides=None, padding=None, base_dilations=None, window_dilations=None) -> "Window":
        rank = len(size)
        ones = (1,) * rank
        pads = np.zeros((rank, 2), np.int64) if padding is None else np.array(padding, np.int64).reshape(rank, 2)
        return cls(tuple(size), tuple(strides or ones), tuple(int(p) for p in pads[:, 0]),
                   tuple(int(p) for p in pads[:, 1]), tuple(base_dilations or ones), tuple(window_dilations or ones))

    def active(self, axis: int) -> bool:
        return (self.size[axis], self.stride[axis], self.lo[axis], self.hi[axis], self.base_dilation[axis]) \
            != (1, 1, 0, 0, 1)


# Ops a reduction body may use to be emitted on whole tensors instead of scalars.
ELEMENTWISE_BODY_OPS = frozenset(f"stablehlo.{name}" for name in (
    "add subtract multiply divide maximum minimum compare select abs negate exponential exponential_minus_one "
    "log log_plus_one and or xor not constant convert clamp sqrt rsqrt power remainder tanh logistic sign "
    "floor ceil is_finite sine cosine tan atan2 cbrt round_nearest_even round_nearest_afz").split())


def body_applier(ctx: RuleContext, body, allowed: frozenset[str] = ELEMENTWISE_BODY_OPS):
    """apply(accumulators, elements, b=ctx.b): the results of a reduction body whose ops are all `allowed`,
    emitted on whole tensors (the body is typed on scalars)."""
    names = [op.operation.name for op in body.operations][:-1]
    if any(name not in allowed for name in names):
        raise NotImplementedError(f"{ctx.hlo_op.operation.name} with body {names}")

    def apply(accs, elements, b=ctx.b):
        first = b.graph.num_nodes()
        results = ctx.translator.emit_block(body, [*accs, *elements], b)
        for node in list(b.graph)[first:]:
            for value in node.outputs:
                value.type, value.shape = None, None
        return results
    return apply


def pad_and_dilate(b, x, shape, win: Window, fill, dtype) -> tuple[ir.Value, list[int]]:
    """x with its base dilation holes and edge padding filled with `fill`, and its new shape."""
    shape = list(shape)
    for axis, factor in enumerate(win.base_dilation):
        if factor > 1 and shape[axis] > 0:
            x = dilate(b, x, shape, axis, factor, fill, dtype)
            shape[axis] = (shape[axis] - 1) * factor + 1
    x = edge_pad(b, x, win.lo, win.hi, fill, dtype)
    return x, [n + lo + hi if n >= 0 else -1 for n, lo, hi in zip(shape, win.lo, win.hi)]
