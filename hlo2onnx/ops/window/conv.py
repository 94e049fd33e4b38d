"""stablehlo.convolution: ONNX Conv, ConvTranspose for input dilation, or a MatMul over gathered windows.

Operands are transposed to ONNX's [N, C, spatial...] / [O, I, spatial...]
layouts and the result back to the op's output layout. Where ORT has no Conv
kernel for the dtype (f64, integers) the windows are gathered with one Gather
whose constant indices fold in padding, dilations, strides and reversal, and
contracted with MatMul, so the result stays exact in the op's own dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

import numpy as np
import onnx_ir as ir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.ops.core.dims import known_entries, refuse
from hlo2onnx.ops.core.shape import reshape_to, transpose_to
from hlo2onnx.ops.window.windows import axis_slice, dilate
from hlo2onnx.registry import allow_dynamic, register
from hlo2onnx.translator import RuleContext


@dataclass(frozen=True)
class ConvWindow:
    """Per spatial axis: stride, padding, input (lhs) and kernel (rhs) dilation, kernel reversal."""

    stride: list[int]
    lo: list[int]
    hi: list[int]
    lhs_dilation: list[int]
    rhs_dilation: list[int]
    reversal: list[bool]


allow_dynamic("stablehlo.convolution", "stablehlo.dynamic_conv")


@register("stablehlo.dynamic_conv")
def dynamic_conv(ctx: RuleContext, lhs, rhs, padding, *, dimension_numbers, **attributes):
    """convolution with its padding as a tensor: jax's strided SAME padding over symbolic image sizes. Padding
    the graph holds as constants is the convolution's own; else the input is padded first (ONNX Pad takes
    run-time amounts, Conv's pads attribute does not) and convolved unpadded."""
    rank = ctx.in_types[0].rank
    known = known_entries(padding, 2 * (rank - 2))
    if None not in known:
        return convolution(ctx, lhs, rhs, dimension_numbers=dimension_numbers, padding=known, **attributes)
    if any(d != 1 for d in attributes.get("lhs_dilation") or [1]):
        refuse(ctx, range(rank), "a convolution with input dilation padded by a symbolic amount")
    b = ctx.b
    spatial = list(stablehlo.ConvDimensionNumbers(dimension_numbers).input_spatial_dimensions)
    pairs = b.cast(padding, np.int64)  # (spatial, 2): low, high
    side = lambda i, j: b.op("Slice", b.op("Gather", pairs, b.shape_const([i]), axis=0),  # noqa: E731
                             b.shape_const([j]), b.shape_const([j + 1]), b.shape_const([1]))
    pads = [b.op("Reshape", side(spatial.index(a), j), b.shape_const([1])) if a in spatial else b.shape_const([0])
            for j in (0, 1) for a in range(rank)]
    dtype = ctx.out_type.dtype
    padded = b.typed("Pad", b.cast(lhs, dtype), b.op("Concat", *pads, axis=0), b.const(np.zeros((), dtype)),
                     dtype=dtype, cast=(0, 2), mode="constant")
    # The padded input's spatial sizes differ from the operand's: they are symbolic to the convolution.
    shape = tuple(-1 if a in spatial else n for a, n in enumerate(ctx.in_types[0].shape))
    padded_ctx = replace(ctx, in_types=[ctx.in_types[0]._replace(shape=shape), *ctx.in_types[1:]])
    return convolution(padded_ctx, padded, rhs, dimension_numbers=dimension_numbers, **attributes)


@register("stablehlo.convolution")
def convolution(ctx: RuleContext, lhs, rhs, *, dimension_numbers, feature_group_count=1, batch_group_count=1,
                window_strides=None, padding=None, lhs_dilation=None, rhs_dilation=None, window_reversal=None):
    b = ctx.b
    dims = stablehlo.ConvDimensionNumbers(dimension_numbers)
    dtype = ctx.out_type.dtype
    if feature_group_count > 1 and batch_group_count > 1:
        raise NotImplementedError("feature_group_count and batch_group_count both above 1")
    out_shape = ctx.out_type.shape
    # A symbolic batch every form takes (their reshapes keep it as the one -1). Symbolic spatial dims only ONNX
    # Conv with static pads >= 0 and no input dilation takes as they are; the other forms spell spatial sizes
    # (the MatMul over gathered windows, ConvTranspose's crops, the crops of negative pads).
    rank = ctx.in_types[0].rank
    in_sp = list(dims.input_spatial_dimensions)
    plain = all(p >= 0 for p in np.asarray(padding if padding is not None else [0], np.int64).reshape(-1)) and \
        all(d == 1 for d in (lhs_dilation or [1])) and _has_kernel(b, "Conv", dtype)
    why = "only the batch and (for a plain ONNX Conv) spatial dimensions of a convolution may be symbolic"
    free = {dims.input_batch_dimension} if batch_group_count == 1 else set()
    refuse(ctx, [d for d in range(rank) if d not in free and not (plain and d in in_sp)], why)
    refuse(ctx, range(rank), why, operand=1)
    if 0 in ctx.in_types[1].shape:
        refuse(ctx, range(rank), "an empty kernel gives a result of zeros, which needs a static shape")
    if 0 in ctx.in_types[1].shape and 0 not in out_shape and all(isinstance(d, int) for d in out_shape):
        # An empty kernel (no input features, or an empty window) sums nothing: XLA gives zeros. ORT 1.31's
        # Conv never returns on zero input channels, and OpenVINO leaves such outputs uninitialized (measured).
        return b.splat(0, dtype, out_shape)
    k_sp = list(dims.kernel_spatial_dimensions)
    out_sp = list(dims.output_spatial_dimensions)
    nsp = len(in_sp)
    pads = np.zeros((nsp, 2), np.int64) if padding is None else np.array(padding, np.int64).reshape(nsp, 2)
    win = ConvWindow(list(window_strides or [1] * nsp), [int(p) for p in pads[:, 0]], [int(p) for p in pads[:, 1]],
                     list(lhs_dilation or [1] * nsp), list(rhs_dilation or [1] * nsp),
                     [bool(r) for r in (window_reversal or [False] * nsp)])
    lhs_perm = [dims.input_batch_dimension, dims.input_feature_dimension] + in_sp
    rhs_perm = [dims.kernel_output_feature_dimension, dims.kernel_input_feature_dimension] + k_sp
    x = transpose_to(b, b.cast(lhs, dtype), lhs_perm)
    w = transpose_to(b, b.cast(rhs, dtype), rhs_perm)
    x_shape = [ctx.in_types[0].shape[d] for d in lhs_perm]
    w_shape = [ctx.in_types[1].shape[d] for d in rhs_perm]
    y_shape = [ctx.out_type.shape[d] for d in [dims.output_batch_dimension, dims.output_feature_dimension] + out_sp]
    if nsp == 0:  # a dot in disguise: give ONNX one spatial axis of size 1
        x, w = (b.op("Unsqueeze", v, b.shape_const([2])) for v in (x, w))
        x_shape, w_shape = x_shape + [1], w_shape + [1]
        win = ConvWindow([1], [0], [0], [1], [1], [False])
    groups = feature_group_count
    if batch_group_count > 1:
        x, x_shape = _fold_batch_groups(b, x, x_shape, batch_group_count)
        groups = batch_group_count
    out_spatial = y_shape[2:] or [1]
    try:
        b.target.compute_dtype("Conv", dtype)
    except NotImplementedError:
        y = _conv_by_matmul(b, x, w, x_shape, w_shape, out_spatial, win, groups, dtype)
    else:
        if any(d > 1 for d in win.lhs_dilation) and all(s == 1 for s in win.stride) \
                and _has_kernel(b, "ConvTranspose", dtype):
            y = _conv_transpose(b, x, w, w_shape, win, groups, dtype)
        else:
            y = _conv(b, x, w, x_shape, w_shape, win, groups, dtype)
    if nsp == 0:
        y = b.op("Squeeze", y, b.shape_const([2]))
    out_perm = [dims.output_batch_dimension, dims.output_feature_dimension] + out_sp
    return transpose_to(b, y, [int(i) for i in np.argsort(out_perm)])


def _has_kernel(b, op_type: str, dtype) -> bool:
    """Whether the target runs `op_type` on `dtype` or a wider type: Conv (else the MatMul form, which needs
    static sizes), ConvTranspose (IREE's importer lacks it)."""
    try:
        b.target.compute_dtype(op_type, dtype)
    except NotImplementedError:
        return False
    return True


def _fold_batch_groups(b, x, x_shape, count) -> tuple[ir.Value, list[int]]:
    """[N, C, S] -> [N/g, g*C, S]: batch group i becomes feature group i of an ordinary grouped conv."""
    n, c, spatial = x_shape[0], x_shape[1], x_shape[2:]
    x = reshape_to(b, x, [count, n // count, c] + spatial)
    x = b.op("Transpose", x, perm=[1, 0] + list(range(2, 3 + len(spatial))))
    shape = [n // count, count * c] + spatial
    return reshape_to(b, x, shape), shape


def _reverse(b, w, axes: list[int]) -> ir.Value:
    if not axes:
        return w
    n = len(axes)
    return b.op("Slice", w, b.shape_const([-1] * n), b.shape_const([np.iinfo(np.int64).min] * n),
                b.shape_const(axes), b.shape_const([-1] * n))


def _conv(b, x, w, x_shape, w_shape, win: ConvWindow, groups, dtype) -> ir.Value:
    fill = b.const(np.zeros((), dtype))
    spatial = list(x_shape[2:])
    for i, factor in enumerate(win.lhs_dilation):
        if factor > 1:  # with window strides too: ConvTranspose cannot stride its output
            x = dilate(b, x, list(x_shape[:2]) + spatial, 2 + i, factor, fill, dtype)
            spatial[i] = (spatial[i] - 1) * factor + 1
    for i, (lo, hi) in enumerate(zip(win.lo, win.hi)):
        if lo < 0 or hi < 0:  # Conv pads must be >= 0: crop first
            x = axis_slice(b, x, 2 + i, max(-lo, 0), spatial[i] - max(-hi, 0))
    w = _reverse(b, w, [2 + i for i, r in enumerate(win.reversal) if r])
    return b.typed("Conv", x, w, dtype=dtype, group=groups, strides=win.stride, dilations=win.rhs_dilation,
                   pads=[max(p, 0) for p in win.lo] + [max(p, 0) for p in win.hi],
                   kernel_shape=list(w_shape[2:]))


def _conv_transpose(b, x, w, w_shape, win: ConvWindow, groups, dtype) -> ir.Value:
    """A stride-1 conv over a zero-dilated input is ConvTranspose with the kernel flipped and its in/out swapped.

    ConvTranspose crops `extent - 1 - lo` at the start (`extent` the dilated
    kernel's span); where that is negative the missing rows are all-padding
    windows, i.e. zeros, and are padded back on afterwards.
    """
    o, cg, k = w_shape[0], w_shape[1], list(w_shape[2:])
    nsp = len(k)
    w = reshape_to(b, w, [groups, o // groups, cg] + k)
    w = b.op("Transpose", w, perm=[0, 2, 1] + list(range(3, 3 + nsp)))
    w = reshape_to(b, w, [groups * cg, o // groups] + k)
    w = _reverse(b, w, [2 + i for i, r in enumerate(win.reversal) if not r])
    crop_lo = [d * (n - 1) - lo for d, n, lo in zip(win.rhs_dilation, k, win.lo)]
    crop_hi = [d * (n - 1) - hi for d, n, hi in zip(win.rhs_dilation, k, win.hi)]
    y = b.typed("ConvTranspose", x, w, dtype=dtype, group=groups, strides=win.lhs_dilation,
                dilations=win.rhs_dilation, kernel_shape=k,
                pads=[max(c, 0) for c in crop_lo] + [max(c, 0) for c in crop_hi])
    if any(c < 0 for c in crop_lo + crop_hi):
        extra = [0, 0] + [max(-c, 0) for c in crop_lo] + [0, 0] + [max(-c, 0) for c in crop_hi]
        y = b.typed("Pad", y, b.shape_const(extra), b.const(np.zeros((), dtype)), dtype=dtype, cast=(0, 2))
    return y


def _conv_by_matmul(b, x, w, x_shape, w_shape, out_spatial, win: ConvWindow, groups, dtype) -> ir.Value:
    """[N, C, S] gathered to [N, C, K, OUT] windows, then [G, O/G, Cg*K] @ [N, G, Cg*K, OUT]."""
    n, c, spatial = x_shape[0], x_shape[1], x_shape[2:]
    o, cg, k = w_shape[0], w_shape[1], w_shape[2:]
    index, any_hole = _window_index(spatial, k, out_spatial, win)
    x = reshape_to(b, x, [n, c, prod(spatial)])
    if any_hole:  # one zero after the data for padding and dilation holes to read
        x = b.typed("Pad", x, b.shape_const([0, 0, 0, 0, 0, 1]), b.const(np.zeros((), dtype)), dtype=dtype,
                    cast=(0, 2))
    patches = b.op("Gather", x, b.const(index), axis=2)
    patches = reshape_to(b, patches, [n, groups, cg * prod(k), prod(out_spatial)])
    w = reshape_to(b, w, [groups, o // groups, cg * prod(k)])
    y = b.typed("MatMul", w, patches, dtype=dtype)
    return reshape_to(b, y, [n, o] + list(out_spatial))


def _window_index(spatial, k, out_spatial, win: ConvWindow) -> tuple[np.ndarray, bool]:
    """[K, OUT] flat input positions read by kernel element K at output position OUT; holes read prod(spatial)."""
    nsp = len(spatial)
    flat = np.zeros(list(k) + list(out_spatial), np.int64)
    valid = np.ones(flat.shape, bool)
    for a in range(nsp):
        t = np.arange(k[a])
        offset = (k[a] - 1 - t) if win.reversal[a] else t
        # Position in the padded, dilated input, then back to an input element.
        pos = np.arange(out_spatial[a])[None, :] * win.stride[a] + offset[:, None] * win.rhs_dilation[a] - win.lo[a]
        ld = win.lhs_dilation[a]
        ok = (pos >= 0) & (pos <= (spatial[a] - 1) * ld) & (pos % ld == 0)
        shape = [1] * (2 * nsp)
        shape[a], shape[nsp + a] = k[a], out_spatial[a]
        flat = flat + (np.where(ok, pos // ld, 0) * prod(spatial[a + 1:])).reshape(shape)
        valid = valid & ok.reshape(shape)
    flat = np.where(valid, flat, prod(spatial))
    return flat.reshape(prod(k), prod(out_spatial)), not valid.all()
