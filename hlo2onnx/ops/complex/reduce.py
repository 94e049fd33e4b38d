"""Complex reduce and reduce_window. A sum reduces each part alike (the real rule on the pair tensors); a product
halves the reduced axis with complex multiplies; other bodies (max, min, mul in reduce_window) as follows.

JAX writes complex max/min as a body that compares (real, imag) lexicographically
and selects one argument; mul is a complex multiply. Such bodies run here on
whole pair tensors (real, imag on a trailing axis) through their ordinary complex
rules:
- reduce_window folds each window's elements in row-major order from init, as
  XLA on CPU does (window/variadic.py's fold_windows);
- reduce of a chooser body (one that returns one of its arguments: max, min)
  halves the reduced axis log2(n) times; a choice between equal values is the
  same whichever way round, so the order does not matter.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from hlo2onnx.ops.complex.arithmetic import multiply
from hlo2onnx.ops.complex.pairs import as_pairs, join, split
from hlo2onnx.ops.core.reduce import single_reducer
from hlo2onnx.ops.core.shape import reshape_to, transpose_to
from hlo2onnx.ops.window.variadic import fold_windows
from hlo2onnx.ops.window.windows import ELEMENTWISE_BODY_OPS, Window, body_applier as real_body_applier
from hlo2onnx.registry import RULES, register_complex
from hlo2onnx.translator import RuleContext

_COMPLEX_PARTS = {"stablehlo.real", "stablehlo.imag", "stablehlo.complex"}


def body_applier(ctx: RuleContext, body):
    """windows.body_applier, with the ops that take complex numbers apart and back."""
    return real_body_applier(ctx, body, ELEMENTWISE_BODY_OPS | _COMPLEX_PARTS)


def complex_reduce_window(ctx: RuleContext, x, init, win: Window):
    body = ctx.hlo_op.regions[0].blocks[0]
    pair = Window(win.size + (1,), win.stride + (1,), win.lo + (0,), win.hi + (0,), win.base_dilation + (1,),
                  win.dilation + (1,))
    storage = ctx.out_type.storage
    init = ctx.b.op("Reshape", init, ctx.b.shape_const([1] * len(win.size) + [2]))
    return fold_windows(ctx.b, [x], [init], body_applier(ctx, body), pair, list(ctx.in_types[0].storage.shape),
                        list(storage.shape), [storage.dtype])[0]


def is_chooser(body, count: int = 1) -> bool:
    """Each of the body's `count` results chooses between its own pair of arguments (accumulator i and
    element i, either way round): a select of the two, or (for a real operand beside a complex one) their
    maximum or minimum."""
    ret = list(body.operations)[-1]
    args = list(body.arguments)
    for i, value in enumerate(ret.operands):
        op = value.owner
        name = op.operation.name if op is not None and hasattr(op, "operation") else None
        choices = (list(op.operands[1:]) if name == "stablehlo.select" else
                   list(op.operands) if name in ("stablehlo.maximum", "stablehlo.minimum") else None)
        if choices is None or set(choices) != {args[i], args[count + i]}:
            return False
    return True


def complex_reduce_chooser(ctx: RuleContext, operands: list, dimensions) -> list:
    """Reduce by a chooser body (over one operand or several, one choice each): halve the reduced (flattened,
    leading) axis, then choose against init. Returns one result per operand."""
    b = ctx.b
    body = ctx.hlo_op.regions[0].blocks[0]
    count = len(operands) // 2
    if not is_chooser(body, count):
        raise NotImplementedError("complex reduce with a body other than add, multiply, or a choice (max, min)")
    apply = body_applier(ctx, body)
    shape = ctx.in_types[0].shape
    rest = [d for d in range(len(shape)) if d not in dimensions]
    n = math.prod(shape[d] for d in dimensions)
    pairs = [t.storage.shape != t.shape for t in ctx.in_types[:count]]  # complex operands keep a pair axis
    outs = [[shape[d] for d in rest] + [2] * pair for pair in pairs]
    xs = [reshape_to(b, transpose_to(b, x, [*dimensions, *rest, *[len(shape)] * pair]), [n, *out])
          for x, pair, out in zip(operands[:count], pairs, outs)]
    while n > 1:
        half, odd = n // 2, n % 2
        chosen = apply([_rows(b, x, 0, half) for x in xs], [_rows(b, x, half, 2 * half) for x in xs])
        xs = [b.op("Concat", c, _rows(b, x, 2 * half, n), axis=0) if odd else c for c, x in zip(chosen, xs)]
        n = half + odd
    results = apply(list(operands[count:]), [reshape_to(b, x, out) for x, out in zip(xs, outs)])
    return [b.op("Expand", r, b.shape_const(out)) for r, out in zip(results, outs)]


@register_complex("stablehlo.reduce")
def reduce(ctx: RuleContext, *operands, dimensions):
    if len(operands) != 2:  # several operands: only choices (max/min, one per operand) are translated
        return complex_reduce_chooser(ctx, list(operands), dimensions)
    reducer = single_reducer(ctx.hlo_op.regions[0].blocks[0])
    if reducer == "stablehlo.add":  # sums each part alike
        return RULES["stablehlo.reduce"](as_pairs(ctx), *operands, dimensions=dimensions)
    if reducer == "stablehlo.multiply":
        return _reduce_product(ctx, *operands, dimensions=dimensions)
    return complex_reduce_chooser(ctx, list(operands), dimensions)[0]


@register_complex("stablehlo.reduce_window")
def reduce_window(ctx: RuleContext, x, init, *, window_dimensions, window_strides=None, base_dilations=None,
                  window_dilations=None, padding=None):
    rank = len(window_dimensions)
    if single_reducer(ctx.hlo_op.regions[0].blocks[0]) != "stablehlo.add":
        return complex_reduce_window(ctx, x, init, Window.read(window_dimensions, window_strides, padding,
                                                               base_dilations, window_dilations))
    pads = np.zeros((rank, 2), np.int64) if padding is None else np.array(padding, np.int64).reshape(rank, 2)
    return RULES["stablehlo.reduce_window"](
        as_pairs(ctx), x, init, window_dimensions=(*window_dimensions, 1),
        window_strides=(*(window_strides or (1,) * rank), 1), base_dilations=(*(base_dilations or (1,) * rank), 1),
        window_dilations=(*(window_dilations or (1,) * rank), 1), padding=np.concatenate([pads, [[0, 0]]]))


def _reduce_product(ctx: RuleContext, x, init, *, dimensions):
    """No ONNX op multiplies complex numbers: halve the reduced axis with pairwise products (log2 n steps)."""
    b, dtype = ctx.b, ctx.out_type.dtype
    shape = ctx.in_types[0].shape
    rest = [d for d in range(len(shape)) if d not in dimensions]
    n = math.prod(shape[d] for d in dimensions)
    out = [shape[d] for d in rest] + [2]
    if n == 0:
        return b.op("Expand", init, b.shape_const(out))
    x = reshape_to(b, transpose_to(b, x, [*dimensions, *rest, len(shape)]), [n, *out])
    while n > 1:
        half, odd = n // 2, n % 2
        product = join(b, multiply(b, dtype, split(b, _rows(b, x, 0, half)), split(b, _rows(b, x, half, 2 * half))))
        x = b.op("Concat", product, _rows(b, x, 2 * half, n), axis=0) if odd else product
        n = half + odd
    result = reshape_to(b, x, out)
    one = init.const_value is not None and init.const_value.numpy().tolist() == [1, 0]
    return result if one else join(b, multiply(b, dtype, split(b, result), split(b, init)))


def _rows(b, x: ir.Value, lo: int, hi: int) -> ir.Value:
    return b.op("Slice", x, b.shape_const([lo]), b.shape_const([hi]), b.shape_const([0]))
