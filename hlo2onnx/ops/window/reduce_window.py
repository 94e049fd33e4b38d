"""reduce_window and select_and_scatter.

reduce_window becomes CumSum, MaxPool or AveragePool where the pattern fits,
else a general lowering: pad, then per windowed axis combine strided slices
(a few for small windows, log2(window) doublings for long ones, so cumprod and
cummax stay O(n log n)).

XLA (what jax.jit runs) skips padding cells and base-dilation holes and applies
`init` once per window, whatever `init` is; so both kinds of holes are filled
with the reducer's identity here and `init` is combined once at the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np
import onnx_ir as ir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.ops.core import dims
from hlo2onnx.ops.core.reduce import is_constant, single_reducer
from hlo2onnx.ops.core.shape import merged, reshape_to, transpose_to
from hlo2onnx.registry import allow_dynamic, register
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


allow_dynamic("stablehlo.reduce_window", "stablehlo.select_and_scatter")


@register("stablehlo.reduce_window")
def reduce_window(ctx: RuleContext, *operands, window_dimensions, window_strides=None, base_dilations=None,
                  window_dilations=None, padding=None):
    win = Window.read(window_dimensions, window_strides, padding, base_dilations, window_dilations)
    if len(operands) != 2:
        # (Its masks and index windows are built from static sizes.)
        dims.refuse(ctx, range(len(win.size)), "a variadic reduce_window")
        from hlo2onnx.ops.window.variadic import variadic_reduce_window  # it builds on this module
        return variadic_reduce_window(ctx, operands, win)
    return reduce_window_with(ctx, *operands, ctx.hlo_op.regions[0].blocks[0], win)


def reduce_window_with(ctx: RuleContext, x, init, body, win: Window) -> ir.Value:
    """reduce_window of `x` by the reduction `body` (a block) over the static window `win`."""
    reducer = single_reducer(body)
    shape, dtype = list(ctx.in_types[0].shape), ctx.out_type.dtype
    b = ctx.b
    symbolic = [a for a in range(len(shape)) if shape[a] < 0 and win.active(a)]
    if symbolic:
        # Windows sliding along a symbolic axis: the strided slices count from its end.
        if reducer not in COMBINE or any(win.base_dilation[a] > 1 or win.size[a] > DIRECT_WINDOW
                                         for a in symbolic):
            dims.refuse(ctx, symbolic, f"a window over a symbolic dimension (by {reducer}, base dilation, or "
                                       f"wider than {DIRECT_WINDOW})")
        result = _general(b, x, reducer, dtype, shape, win)
        return result if is_constant(init, identity(reducer, dtype)) else combine(b, reducer, dtype, result, init)
    if reducer not in COMBINE:
        return _general_body(ctx, x, init, body, dtype, shape, win)
    result = _cumsum(b, x, reducer, dtype, shape, win)
    if result is None:
        result = _pool(b, x, reducer, dtype, shape, win)
    if result is None:
        result = _general(b, x, reducer, dtype, shape, win)
    if not is_constant(init, identity(reducer, dtype)):
        result = combine(b, reducer, dtype, result, init)
    return result


def _cumsum(b, x, reducer, dtype, shape, win: Window) -> ir.Value | None:
    """JAX's cumsum: one axis, window = axis length, padded n-1 on one side."""
    active = [a for a in range(len(shape)) if win.active(a)]
    if reducer != "stablehlo.add" or is_bool(dtype) or len(active) != 1:
        return None
    axis = active[0]
    n = shape[axis]
    if (win.size[axis], win.stride[axis], win.base_dilation[axis]) != (n, 1, 1) or n < 2:
        return None
    if (win.lo[axis], win.hi[axis]) not in ((n - 1, 0), (0, n - 1)):
        return None
    return b.typed("CumSum", x, b.const(np.int64(axis)), dtype=dtype, cast=(0,), reverse=int(win.hi[axis] > 0))


def _pool(b, x, reducer, dtype, shape, win: Window) -> ir.Value | None:
    """MaxPool for integer max/min (min as ~max(~x)), AveragePool times the window size for float sums.

    Float max stays on the general path: ORT's MaxPool skips NaNs and gives
    -FLT_MAX, not -inf, for a window of -infs; XLA's max gives NaN and -inf.
    """
    active = [a for a in range(len(shape)) if win.active(a)]
    if not active or len(active) > 3 or any(win.base_dilation[a] != 1 for a in active):
        return None
    if reducer in ("stablehlo.maximum", "stablehlo.minimum") and dtype.kind in "iu":
        pool_op, compute = "MaxPool", dtype
    elif reducer == "stablehlo.add" and is_float(dtype):
        # AveragePool divides and the product re-multiplies: two roundings, too many for f16.
        pool_op, compute = "AveragePool", np.dtype(np.float32) if dtype.itemsize < 4 else dtype
    else:
        return None
    if not b.target.supports(pool_op, compute):
        return None
    invert = reducer == "stablehlo.minimum"  # ~x reverses the order of signed and unsigned integers alike
    x = b.typed("BitwiseNot", x, dtype=dtype) if invert else b.cast(x, compute)
    fill = b.const(identity("stablehlo.add" if pool_op == "AveragePool" else "stablehlo.maximum", compute))
    # Negative pads crop first; ORT needs pads < kernel, and a dilated window could see padding only.
    x = edge_pad(b, x, [min(p, 0) for p in win.lo], [min(p, 0) for p in win.hi], fill, compute)
    shape = [n + min(lo, 0) + min(hi, 0) for n, lo, hi in zip(shape, win.lo, win.hi)]
    lo, hi = [max(p, 0) for p in win.lo], [max(p, 0) for p in win.hi]
    if any(lo[a] >= win.size[a] or hi[a] >= win.size[a] or (win.dilation[a] > 1 and lo[a] + hi[a]) for a in active) \
            or (pool_op == "MaxPool" and any(lo + hi) and not b.target.supports("MaxPool:padded", compute)):
        x = edge_pad(b, x, lo, hi, fill, compute)
        shape = [n + p + q for n, p, q in zip(shape, lo, hi)]
        lo, hi = [0] * len(shape), [0] * len(shape)
    inactive = [a for a in range(len(shape)) if a not in active]
    perm = inactive + active
    x = transpose_to(b, x, perm)
    lead = dims.dims(b, x, [shape[a] for a in inactive])
    x = reshape_to(b, x, [merged([shape[a] for a in inactive]), 1] + [shape[a] for a in active])
    kernel = [win.size[a] for a in active]
    attrs = dict(kernel_shape=kernel, strides=[win.stride[a] for a in active],
                 pads=[lo[a] for a in active] + [hi[a] for a in active], dilations=[win.dilation[a] for a in active])
    if pool_op == "AveragePool":
        pooled = b.op("AveragePool", x, count_include_pad=1, **attrs)
        pooled = b.cast(b.op("Mul", pooled, b.const(np.asarray(prod(kernel), compute))), dtype)
    else:
        pooled = b.op("MaxPool", x, **attrs)
    out_shape = lead + [
        (shape[a] + lo[a] + hi[a] - win.dilation[a] * (win.size[a] - 1) - 1) // win.stride[a] + 1 for a in active]
    pooled = dims.reshape(b, pooled, out_shape)
    pooled = transpose_to(b, pooled, [int(i) for i in np.argsort(perm)])
    return b.typed("BitwiseNot", pooled, dtype=dtype) if invert else pooled


def _general(b, x, reducer, dtype, shape, win: Window) -> ir.Value:
    fill = b.const(identity(reducer, dtype))
    x, shape = pad_and_dilate(b, x, shape, win, fill, dtype)
    merge = lambda u, v, *_: combine(b, reducer, dtype, u, v)  # noqa: E731 - identity fill: nothing to mask
    for axis in range(len(shape)):
        if shape[axis] < 0 and (win.size[axis] > 1 or win.stride[axis] > 1):
            x = symbolic_window_axis(b, x, merge, axis, win.size[axis], win.stride[axis], win.dilation[axis])
        elif win.size[axis] > 1 or win.stride[axis] > 1:
            x, _ = _window_axis(b, x, merge, axis, shape[axis], win.size[axis], win.stride[axis],
                                win.dilation[axis], None)
    return x


def symbolic_window_axis(b, x, merge, axis, k, stride, dilation) -> ir.Value:
    """_window_axis's direct form along a symbolic axis: element t of every window is the slice from
    t * dilation that stops (extent - 1 - t * dilation) before the end, every `stride`: each holds
    ceil((n - extent + 1) / stride) elements, the window count."""
    extent = dilation * (k - 1) + 1
    result = None
    for t in range(k):
        before_end = extent - 1 - t * dilation
        part = axis_slice(b, x, axis, t * dilation, -before_end if before_end else np.iinfo(np.int64).max, stride)
        result = part if result is None else merge(result, part, axis, None, None)
    return result


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


def _general_body(ctx: RuleContext, x, init, body, dtype, shape, win: Window) -> ir.Value:
    """Any elementwise body (cumlogsumexp's logaddexp, ...): its identity is unknown, so holes are
    tracked as static per-axis masks and skipped when combining."""
    b = ctx.b
    rank = len(shape)
    apply_body = body_applier(ctx, body)

    def apply(u, v):
        return apply_body([u], [v])[0]

    def merge(u, v, axis, u_ok, v_ok):
        merged = apply(u, v)
        both = u_ok & v_ok
        if both.all():
            return merged
        mask = lambda m: b.const(m.reshape([-1] + [1] * (rank - 1 - axis)))  # noqa: E731
        either = b.typed("Where", mask(u_ok), u, v, dtype=dtype, cast=(1, 2))
        return b.typed("Where", mask(both), merged, either, dtype=dtype, cast=(1, 2))

    # A symbolic axis is never windowed here (reduce_window_with refuses that): one entry stands for all of it.
    valid = [np.ones(n if n >= 0 else 1, bool) for n in shape]
    for axis, factor in enumerate(win.base_dilation):
        if factor > 1 and shape[axis] > 0:
            valid[axis] = np.zeros((shape[axis] - 1) * factor + 1, bool)
            valid[axis][::factor] = True
    for axis, (lo, hi) in enumerate(zip(win.lo, win.hi)):
        valid[axis] = np.pad(valid[axis][max(-lo, 0):len(valid[axis]) - max(-hi, 0)], (max(lo, 0), max(hi, 0)))
    x, shape = pad_and_dilate(b, x, shape, win, init, dtype)
    for axis in range(rank):
        if win.size[axis] > 1 or win.stride[axis] > 1:
            x, valid[axis] = _window_axis(b, x, merge, axis, shape[axis], win.size[axis], win.stride[axis],
                                          win.dilation[axis], valid[axis])
    result = apply(init, x)  # XLA starts each window from init
    if all(v.all() for v in valid):
        return result
    ok = None
    for axis, v in enumerate(valid):
        if not v.all():
            part = b.const(v.reshape([-1] + [1] * (rank - 1 - axis)))
            ok = part if ok is None else b.op("And", ok, part)
    return b.typed("Where", ok, result, init, dtype=dtype, cast=(1, 2))


def pad_and_dilate(b, x, shape, win: Window, fill, dtype) -> tuple[ir.Value, list[int]]:
    shape = list(shape)
    for axis, factor in enumerate(win.base_dilation):
        if factor > 1 and shape[axis] > 0:
            x = dilate(b, x, shape, axis, factor, fill, dtype)
            shape[axis] = (shape[axis] - 1) * factor + 1
    x = edge_pad(b, x, win.lo, win.hi, fill, dtype)
    return x, [n + lo + hi if n >= 0 else -1 for n, lo, hi in zip(shape, win.lo, win.hi)]


def _window_axis(b, x, merge, axis, n, k, stride, dilation, valid):
    """Valid windows of `k` elements `dilation` apart, every `stride`, merged along one axis.

    `valid` (per position, or None for all) follows the values through the merges.
    """
    extent = dilation * (k - 1) + 1
    out = max(0, (n - extent) // stride + 1)
    ok = np.ones(n, bool) if valid is None else valid
    if out == 0:
        return axis_slice(b, x, axis, 0, 0), ok[:0]

    def merge_ok(u, v, u_ok, v_ok):
        return merge(u, v, axis, u_ok, v_ok), u_ok | v_ok

    if k <= DIRECT_WINDOW:
        result = result_ok = None
        for t in range(k):
            stop = t * dilation + (out - 1) * stride + 1
            part, part_ok = axis_slice(b, x, axis, t * dilation, stop, stride), ok[t * dilation:stop:stride]
            result, result_ok = (part, part_ok) if result is None else merge_ok(result, part, result_ok, part_ok)
        return result, result_ok
    # Doubling: block[m][i] merges x[i + u*dilation] for u < m; a window is a sum of power-of-two blocks.
    length = n - extent + 1  # windows at stride 1
    result = result_ok = None
    offset, block, block_ok, m = 0, x, ok, 1
    while True:
        if k & m:
            start = offset * dilation
            part, part_ok = axis_slice(b, block, axis, start, start + length), block_ok[start:start + length]
            result, result_ok = (part, part_ok) if result is None else merge_ok(result, part, result_ok, part_ok)
            offset += m
        if 2 * m > k:
            break
        shift, size = m * dilation, len(block_ok)
        block, block_ok = merge_ok(axis_slice(b, block, axis, 0, size - shift), axis_slice(b, block, axis, shift, size),
                                   block_ok[:size - shift], block_ok[shift:])
        m *= 2
    if stride > 1:
        result, result_ok = axis_slice(b, result, axis, 0, (out - 1) * stride + 1, stride), result_ok[::stride]
    return result, result_ok


# -- select_and_scatter -----------------------------------------------------------

_SELECT = {"GE": "GreaterOrEqual", "GT": "Greater", "LE": "LessOrEqual", "LT": "Less"}
_SCATTER = {"stablehlo.add": "add", "stablehlo.multiply": "mul", "stablehlo.maximum": "max",
            "stablehlo.minimum": "min"}
# On bool, add and or are max, multiply and and are min (StableHLO's bool add is or); computed on int32.
_BOOL_SCATTER = {"stablehlo.add": "max", "stablehlo.or": "max", "stablehlo.maximum": "max",
                 "stablehlo.multiply": "min", "stablehlo.and": "min", "stablehlo.minimum": "min"}


@register("stablehlo.select_and_scatter")
def select_and_scatter(ctx: RuleContext, operand, source, init, *, window_dimensions, window_strides=None,
                       padding=None):
    """Selects each window's element as XLA does (row-major, keep the pick while `select(pick, next)`),
    then scatters `source` onto the picks with ScatterElements' reduction."""
    select_op = _select_compare(ctx.hlo_op.regions[0].blocks[0])
    reducer = single_reducer(ctx.hlo_op.regions[1].blocks[0])
    bool_ = ctx.out_type.dtype == np.bool_
    scatter = (_BOOL_SCATTER if bool_ else _SCATTER).get(reducer)
    if select_op is None or scatter is None:
        raise NotImplementedError("select_and_scatter with a select other than one compare, "
                                  "or a scatter other than add/mul/max/min")
    b = ctx.b
    shape, src_shape = list(ctx.in_types[0].shape), list(ctx.in_types[1].shape)
    win = Window.read(window_dimensions, window_strides, padding)
    symbolic = [a for a in range(len(shape)) if shape[a] < 0]
    if not symbolic:
        return _scatter_picks(b, operand, source, init, shape, src_shape, win, select_op, scatter, ctx.out_type.dtype)
    dims.refuse(ctx, [a for a in symbolic if win.active(a)], "a window along a symbolic dim")
    # The symbolic dims (a batch) pass through the windows: moved in front and merged into one axis of rows,
    # each row scatters onto its own picks (ScatterElements along the flattened window axes).
    rest = [a for a in range(len(shape)) if a not in symbolic]
    perm = symbolic + rest
    moved = transpose_to(b, operand, perm)
    rows = reshape_to(b, moved, [-1] + [shape[a] for a in rest])
    src_rows = reshape_to(b, transpose_to(b, source, perm), [-1] + [src_shape[a] for a in rest])
    def lead(field, value):  # the window along the rows: one element, no stride, no padding
        return (value,) + tuple(field[a] for a in rest)

    rows_win = Window(lead(win.size, 1), lead(win.stride, 1), lead(win.lo, 0), lead(win.hi, 0),
                      lead(win.base_dilation, 1), lead(win.dilation, 1))
    out = _scatter_picks(b, rows, src_rows, init, [-1] + [shape[a] for a in rest],
                         [-1] + [src_shape[a] for a in rest], rows_win, select_op, scatter, ctx.out_type.dtype)
    out = b.op("Reshape", out, b.op("Shape", moved), allowzero=1)
    return transpose_to(b, out, np.argsort(perm).tolist())


def _scatter_picks(b, operand, source, init, shape, src_shape, win: Window, select_op: str, scatter: str,
                   dtype: np.dtype) -> ir.Value:
    """select_and_scatter over static shapes, or over a first axis of rows of symbolic size (-1) that no
    window spans: the picks are then indexed within each row, and each row scattered along axis 1."""
    rank = len(shape)
    rows = shape[0] < 0
    first = 1 if rows else 0
    bool_ = dtype == np.bool_
    padded = edge_pad(b, operand, win.lo, win.hi, b.const(np.zeros((), dtype)), dtype)
    flat_strides = [prod(shape[a + 1:]) for a in range(rank)]
    src_dims = b.op("Shape", source) if rows else None  # static: a constant, made where first used
    has_padding = any(win.lo) or any(win.hi)
    best = best_off = best_ok = None
    for t in np.ndindex(*win.size):
        starts = list(t)
        ends = [s + (j - 1) * st + 1 for s, j, st in zip(starts, src_shape, win.stride)]
        if rows:
            ends[0] = np.iinfo(np.int64).max  # the whole axis of rows
        cand = b.op("Slice", padded, b.shape_const(starts), b.shape_const(ends), b.shape_const(range(rank)),
                    b.shape_const(win.stride))
        off = b.const(np.int64(sum(ti * fs for ti, fs in zip(t[first:], flat_strides[first:]))))
        valid = _valid_mask(b, t, shape, src_shape, win, src_dims) if has_padding else None
        if best is None:
            best, best_off, best_ok = cand, b.op("Expand", off, _spelled(b, src_shape, src_dims)), valid
            continue
        take = b.op("Not", b.typed(select_op, best, cand, dtype=dtype, result_dtype=np.bool_))
        if valid is not None:
            take = b.op("And", valid, b.op("Or", b.op("Not", best_ok), take))
            best_ok = b.op("Or", best_ok, valid)
        best = b.typed("Where", take, cand, best, dtype=dtype, cast=(1, 2))
        best_off = b.op("Where", take, off, best_off)
    # Flat index of each pick in the unpadded operand (in its row); windows that saw padding only go to a
    # dummy slot.
    index = best_off
    for a in range(first, rank):
        base = (np.arange(src_shape[a], dtype=np.int64) * win.stride[a] - win.lo[a]) * flat_strides[a]
        index = b.op("Add", index, b.const(base.reshape([-1] + [1] * (rank - 1 - a))))
    size = prod(shape[first:])
    if best_ok is not None:
        index = b.op("Where", best_ok, index, b.const(np.int64(size)))
    flat = [-1, prod(src_shape[1:])] if rows else [-1]
    index = reshape_to(b, index, flat)
    # Measured: ORT 1.31 has no f16 ScatterElements kernel for reduction add/mul (nor bf16 for any).
    compute = np.dtype(np.float32) if dtype.itemsize < 4 and is_float(dtype) else dtype
    compute = np.dtype(np.int32) if bool_ else compute
    init = b.cast(reshape_to(b, init, [1] * len(flat)), compute)
    slots = dims.shape_value(b, [b.op("Shape", source, start=0, end=1), size + int(has_padding)]) if rows \
        else b.shape_const([size + int(has_padding)])
    data = b.op("Expand", init, slots)
    updates = b.cast(reshape_to(b, source, flat), compute)
    result = b.op("ScatterElements", data, index, updates, axis=first, reduction=scatter)
    if has_padding:
        result = axis_slice(b, result, first, 0, size)
    return reshape_to(b, b.cast(result, dtype), shape)


def _select_compare(body) -> str | None:
    ops = list(body.operations)
    if len(ops) != 2 or ops[0].operation.name != "stablehlo.compare" or list(ops[0].operands) != list(body.arguments):
        return None
    attrs = ops[0].attributes
    if "compare_type" in attrs and stablehlo.ComparisonTypeAttr(attrs["compare_type"]).value == "TOTALORDER":
        return None
    return _SELECT.get(stablehlo.ComparisonDirectionAttr(attrs["comparison_direction"]).value)


def _spelled(b, shape, value: ir.Value | None) -> ir.Value:
    return b.shape_const(shape) if value is None else value


def _valid_mask(b, t, shape, src_shape, win: Window, src_dims: ir.Value | None) -> ir.Value:
    """Where window offset `t` lands inside the unpadded operand, for every window (`src_dims`: their shape,
    read from the graph where it is symbolic)."""
    mask = None
    for a in range(len(shape)):
        if not win.active(a):  # no window, no padding: always inside (and the size may be symbolic)
            continue
        pos = np.arange(src_shape[a]) * win.stride[a] + t[a] - win.lo[a]
        inside = (pos >= 0) & (pos < shape[a])
        if inside.all():
            continue
        part = b.const(inside.reshape([-1] + [1] * (len(shape) - 1 - a)))
        mask = part if mask is None else b.op("And", mask, part)
    if mask is None:
        return b.op("Expand", b.const(np.bool_(True)), _spelled(b, src_shape, src_dims))
    return b.op("Expand", mask, _spelled(b, src_shape, src_dims))
