"""Variadic stablehlo.reduce_window: several operands reduced together by one elementwise body.

JAX emits it for `_select_and_gather_add` (the tangent of max pooling): pairs
(value, tangent) reduced by "keep the pair whose value is >= (or <=)". The body
compares across operands, so the windows cannot be merged in any order: like
XLA on CPU, each output folds its window's elements one by one, in row-major
window order, into an accumulator that starts at the init values,
`acc = body(acc, element)`. Padding cells and base-dilation holes are skipped
(XLA never feeds them to the body). The fold is unrolled over the window's
elements, each step a strided slice of every operand, so the window size is
bounded.
"""
from __future__ import annotations

import itertools
from math import prod

import numpy as np

from hlo2onnx.ops.window.windows import ELEMENTWISE_BODY_OPS, Window, axis_slice, pad_and_dilate
from hlo2onnx.translator import RuleContext

# Most elements one window may hold (the fold is unrolled).
_MAX_WINDOW = 64


def _valid_positions(shape, win: Window) -> list[np.ndarray]:
    """Per axis, which positions of the padded, dilated operand hold an element of the input."""
    valid = []
    for axis, n in enumerate(shape):
        v = np.ones(n, bool)
        factor = win.base_dilation[axis]
        if factor > 1 and n > 0:
            v = np.zeros((n - 1) * factor + 1, bool)
            v[::factor] = True
        lo, hi = win.lo[axis], win.hi[axis]
        valid.append(np.pad(v[max(-lo, 0):len(v) - max(-hi, 0)], (max(lo, 0), max(hi, 0))))
    return valid


def variadic_reduce_window(ctx: RuleContext, operands, win: Window):
    count = len(operands) // 2
    body = ctx.hlo_op.regions[0].blocks[0]
    names = [op.operation.name for op in body.operations][:-1]
    if any(name not in ELEMENTWISE_BODY_OPS for name in names):
        raise NotImplementedError(f"variadic reduce_window with body {names}")
    b = ctx.b

    def apply(accs, elements):
        first = b.graph.num_nodes()
        results = ctx.translator.emit_block(body, [*accs, *elements], b)
        for node in list(b.graph)[first:]:
            for value in node.outputs:  # the body is typed on scalars; here it runs on whole outputs
                value.type, value.shape = None, None
        return results

    return fold_windows(b, list(operands[:count]), list(operands[count:]), apply, win,
                        list(ctx.in_types[0].shape), list(ctx.out_types[0].shape), [t.dtype for t in ctx.out_types])


def fold_windows(b, xs, inits, apply, win: Window, shape, out_shape, dtypes):
    """Each output: `apply(accs, elements)` folded over its window in row-major order, from `inits`."""
    if prod(win.size) > _MAX_WINDOW:
        raise NotImplementedError(f"reduce_window over windows of {prod(win.size)} elements with a body that "
                                  f"must be folded in order (the fold is unrolled; at most {_MAX_WINDOW})")
    valid = _valid_positions(shape, win)
    # The fill is never read: padding cells and holes are masked out of the fold.
    padded = [pad_and_dilate(b, x, shape, win, b.const(0, dtype), dtype)[0] for x, dtype in zip(xs, dtypes)]
    rank = len(shape)

    accs = inits
    for offsets in itertools.product(*(range(k) for k in win.size)):
        elements = []
        mask = np.ones(out_shape, bool)
        for x in padded:
            for axis, t in enumerate(offsets):
                start = t * win.dilation[axis]
                stop = start + (out_shape[axis] - 1) * win.stride[axis] + 1
                x = axis_slice(b, x, axis, start, stop, win.stride[axis])
            elements.append(x)
        for axis, t in enumerate(offsets):
            start = t * win.dilation[axis]
            stop = start + (out_shape[axis] - 1) * win.stride[axis] + 1
            ok = valid[axis][start:stop:win.stride[axis]]
            mask &= ok.reshape([-1] + [1] * (rank - 1 - axis))
        if not mask.any():
            continue
        folded = apply(accs, elements)
        if not mask.all():
            keep = b.const(mask)
            folded = [b.typed("Where", keep, new, old, dtype=dtype, cast=(1, 2))
                      for new, old, dtype in zip(folded, accs, dtypes)]
        accs = folded
    shape_const = b.shape_const(out_shape)
    return [b.typed("Expand", acc, shape_const, dtype=dtype, cast=(0,)) for acc, dtype in zip(accs, dtypes)]
