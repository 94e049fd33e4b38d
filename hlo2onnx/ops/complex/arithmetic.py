"""Ops on complex tensors, which the graph holds as float (real, imag) pairs on a trailing axis.

The translator sends every op that touches a complex type here (registry.COMPLEX_RULES):
- data movement and the ops that act on each part alike (add, reshape, slice, gather, while ...)
  run the ordinary rule on the pair tensors: `_lift` hands it the storage types and
  extends its axis attributes by the pair axis;
- arithmetic and functions split the pair into (real, imag) planes of shape S + (1,),
  combine them with XLA's formulas (xla/service/elemental_ir_emitter.cc) and join them back.
An op with no entry here is refused naming the op ("complex operands are not supported").
"""
from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Callable, NamedTuple

import numpy as np
import onnx_ir as ir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.ops.elementwise import arithmetic as elementwise
from hlo2onnx.ops.core import shape as shape_ops
from hlo2onnx.ops.core.reduce import single_reducer
from hlo2onnx.ops.elementwise.special import atan2_values, sign_bit
from hlo2onnx.ops.window.windows import Window
from hlo2onnx.registry import RULES, register, register_complex
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, is_complex, real_dtype


class Z(NamedTuple):
    """A complex value as two planes of shape S + (1,): they broadcast against each other and join by Concat."""

    re: ir.Value
    im: ir.Value


# -- the pair representation ------------------------------------------------------------
def as_pairs(ctx: RuleContext):
    """`ctx` as a rule sees it when it runs on the pair tensors: the storage types."""
    return dataclasses.replace(ctx, in_types=[t.storage for t in ctx.in_types],
                               out_types=[t.storage for t in ctx.out_types])


def split(b, x: ir.Value) -> Z:
    re, im = b.ops("Split", x, b.shape_const([1, 1]), num_outputs=2, axis=-1)
    return Z(re, im)


def join(b, z: Z) -> ir.Value:
    return b.op("Concat", z.re, z.im, axis=-1)


def part(b, x: ir.Value, index: int) -> ir.Value:
    """The real (0) or imaginary (1) part of a pair tensor, without the pair axis."""
    return b.op("Gather", x, b.const(np.int64(index)), axis=-1)


def from_real(b, x: ir.Value, ttype: TensorType, dtype: np.dtype) -> ir.Value:
    """The pair tensor of real `x` (of type `ttype`) as complex `dtype`: a zero imaginary part, even for NaN."""
    x = b.op("Unsqueeze", b.cast(x, real_dtype(dtype)), b.shape_const([-1]))
    return b.op("Concat", x, b.splat(0, real_dtype(dtype), ttype.shape + (1,)), axis=-1)


# -- rules that run the ordinary rule on the pair tensors -----------------------------------
def _lift(extend: Callable[..., dict] | None, ctx: RuleContext, *inputs, **attrs):
    rule = RULES[ctx.hlo_op.name]
    return rule(as_pairs(ctx), *inputs, **(extend(ctx, **attrs) if extend else attrs))


for _name in ("add", "subtract", "negate", "reshape", "concatenate", "reverse", "dynamic_update_slice",
              "while", "if", "case", "optimization_barrier"):
    register_complex(f"stablehlo.{_name}")(partial(_lift, None))
register_complex("func.call", "sdy.sharding_constraint")(partial(_lift, None))


def _with_pair_axis(ctx: RuleContext, **attrs) -> dict:
    """Axis attributes extended by the trailing pair axis, which every op keeps whole."""
    extra = {"permutation": ctx.in_types[0].rank, "broadcast_dimensions": ctx.out_type.rank,
             "start_indices": 0, "limit_indices": 2, "strides": 1, "slice_sizes": 2}
    return {k: (*v, extra[k]) if k in extra else v for k, v in attrs.items()}


for _name in ("transpose", "broadcast_in_dim", "slice", "dynamic_slice"):
    register_complex(f"stablehlo.{_name}")(partial(_lift, _with_pair_axis))


@register_complex("stablehlo.gather")
def gather(ctx: RuleContext, operand, indices, *, dimension_numbers, **attrs):
    dn = stablehlo.GatherDimensionNumbers(dimension_numbers)
    pair_dn = stablehlo.GatherDimensionNumbers.get(
        offset_dims=[*dn.offset_dims, ctx.out_type.rank], collapsed_slice_dims=dn.collapsed_slice_dims,
        operand_batching_dims=dn.operand_batching_dims, start_indices_batching_dims=dn.start_indices_batching_dims,
        start_index_map=dn.start_index_map, index_vector_dim=dn.index_vector_dim, context=ctx.hlo_op.context)
    return RULES["stablehlo.gather"](as_pairs(ctx), operand, indices, dimension_numbers=pair_dn,
                                     **_with_pair_axis(ctx, **attrs))


@register_complex("stablehlo.scatter")
def scatter(ctx: RuleContext, *args, scatter_dimension_numbers, **hints):
    body = ctx.hlo_op.regions[0].blocks[0]
    ops = list(body.operations)
    replaces = len(ops) == 1 and list(ops[0].operands) == [body.arguments[1]]
    if not replaces and single_reducer(body) != "stablehlo.add":
        # mul, max, min (a lexicographic choice) ...: the body itself, one index row at a time, in order
        from hlo2onnx.ops.complex.reduce import body_applier  # builds on this module's rules
        apply = body_applier(ctx, body)
        hints["combine"] = lambda sb, current, update: apply([current], [update], sb)[0]
    dn = stablehlo.ScatterDimensionNumbers(scatter_dimension_numbers)
    pair_dn = stablehlo.ScatterDimensionNumbers.get(
        update_window_dims=[*dn.update_window_dims, ctx.in_types[-1].rank],
        inserted_window_dims=dn.inserted_window_dims, input_batching_dims=dn.input_batching_dims,
        scatter_indices_batching_dims=dn.scatter_indices_batching_dims,
        scattered_dims_to_operand_dims=dn.scattered_dims_to_operand_dims, index_vector_dim=dn.index_vector_dim,
        context=ctx.hlo_op.context)
    return RULES["stablehlo.scatter"](as_pairs(ctx), *args, scatter_dimension_numbers=pair_dn, **hints)


@register_complex("stablehlo.reduce")
def reduce(ctx: RuleContext, *operands, dimensions):
    from hlo2onnx.ops.complex.reduce import complex_reduce_chooser  # builds on this module's rules
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
        from hlo2onnx.ops.complex.reduce import complex_reduce_window  # builds on this module's rules
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
    x = shape_ops.reshape_to(b, shape_ops.transpose_to(b, x, [*dimensions, *rest, len(shape)]), [n, *out])
    while n > 1:
        half, odd = n // 2, n % 2
        product = join(b, multiply(b, dtype, split(b, _rows(b, x, 0, half)), split(b, _rows(b, x, half, 2 * half))))
        x = b.op("Concat", product, _rows(b, x, 2 * half, n), axis=0) if odd else product
        n = half + odd
    result = shape_ops.reshape_to(b, x, out)
    one = init.const_value is not None and init.const_value.numpy().tolist() == [1, 0]
    return result if one else join(b, multiply(b, dtype, split(b, result), split(b, init)))


def _rows(b, x: ir.Value, lo: int, hi: int) -> ir.Value:
    return b.op("Slice", x, b.shape_const([lo]), b.shape_const([hi]), b.shape_const([0]))


@register_complex("stablehlo.pad")
def pad(ctx: RuleContext, x, padding_value, **attrs):
    """ONNX Pad fills with one scalar: pad each part with its own."""
    b = ctx.b
    plane_ctx = dataclasses.replace(ctx, in_types=[_real_type(t) for t in ctx.in_types],
                                    out_types=[_real_type(t) for t in ctx.out_types])
    parts = [shape_ops.pad(plane_ctx, part(b, x, i), part(b, padding_value, i), **attrs) for i in (0, 1)]
    return b.op("Concat", *(b.op("Unsqueeze", p, b.shape_const([-1])) for p in parts), axis=-1)


def _real_type(t: TensorType) -> TensorType:
    return TensorType(t.shape, real_dtype(t.dtype))


@register_complex("stablehlo.select")
def select(ctx: RuleContext, pred, on_true, on_false):
    # Unsqueezed even when scalar-typed: reduction bodies run on whole tensors (complex_window.py).
    return ctx.b.op("Where", ctx.b.op("Unsqueeze", pred, ctx.b.shape_const([-1])), on_true, on_false)


@register_complex("stablehlo.compare")
def compare(ctx: RuleContext, x, y, *, comparison_direction: str, compare_type: str | None = None):
    if comparison_direction not in ("EQ", "NE"):
        raise NotImplementedError(f"complex compare {comparison_direction}")
    b = ctx.b
    same = b.op("Equal", x, y)
    equal = b.op("And", part(b, same, 0), part(b, same, 1))
    return equal if comparison_direction == "EQ" else b.op("Not", equal)


@register_complex("stablehlo.convert")
def convert(ctx: RuleContext, x):
    """real -> complex takes a zero imaginary part; complex -> real keeps the real part (StableHLO convert)."""
    b = ctx.b
    source, target = ctx.in_types[0].dtype, ctx.out_type.dtype
    if not is_complex(source):
        return from_real(b, x, ctx.in_types[0], target)
    if is_complex(target):
        return b.cast(x, real_dtype(target)) if source != target else b.op("Identity", x)
    real_ctx = dataclasses.replace(ctx, in_types=[_real_type(ctx.in_types[0])])
    return elementwise.convert(real_ctx, part(b, x, 0))


@register_complex("stablehlo.iota")
def iota(ctx: RuleContext, *, iota_dimension):
    real_ctx = dataclasses.replace(ctx, out_types=[_real_type(ctx.out_type)])
    line = RULES["stablehlo.iota"](real_ctx, iota_dimension=iota_dimension)
    return from_real(ctx.b, line, real_ctx.out_type, ctx.out_type.dtype)


# -- real, imag, complex ----------------------------------------------------------------
@register_complex("stablehlo.real")
def real(ctx: RuleContext, x):
    return part(ctx.b, x, 0)


@register_complex("stablehlo.imag")
def imag(ctx: RuleContext, x):
    return part(ctx.b, x, 1)


@register("stablehlo.real")
def real_of_real(ctx: RuleContext, x):
    return ctx.b.op("Identity", x)


@register("stablehlo.imag")
def imag_of_real(ctx: RuleContext, x):
    return ctx.b.splat(0, ctx.out_type.dtype, ctx.out_type.shape)


@register_complex("stablehlo.complex")
def complex_(ctx: RuleContext, re, im):
    b = ctx.b
    return b.op("Concat", b.op("Unsqueeze", re, b.shape_const([-1])), b.op("Unsqueeze", im, b.shape_const([-1])),
                axis=-1)


# -- arithmetic -------------------------------------------------------------------------------
def _binary(fn: Callable, ctx: RuleContext, x, y):
    b, dtype = ctx.b, real_dtype(ctx.out_type.dtype)
    return join(b, fn(b, dtype, split(b, x), split(b, y)))


def _unary(fn: Callable, ctx: RuleContext, x):
    b, dtype = ctx.b, real_dtype(ctx.in_types[0].dtype)
    result = fn(b, dtype, split(b, x))
    if isinstance(result, Z):
        return join(b, result)
    return shape_ops.reshape_to(b, result, ctx.out_type.shape)  # a real result: drop the unit axis


def multiply(b, dtype, x: Z, y: Z) -> Z:
    t = partial(b.typed, dtype=dtype)
    return Z(t("Sub", t("Mul", x.re, y.re), t("Mul", x.im, y.im)),
             t("Add", t("Mul", x.re, y.im), t("Mul", x.im, y.re)))


def divide(b, dtype, x: Z, y: Z, xla_zero_divisor: bool = True) -> Z:
    """Smith's algorithm, and XLA's rule for a zero divisor: copysign(inf, y.re) * x. Without that rule (as
    LAPACK divides) a zero divisor gives NaN."""
    t = partial(b.typed, dtype=dtype)
    # |y.re| >= |y.im|: r = im/re; d = re + im*r; ((x.re + x.im*r)/d, (x.im - x.re*r)/d), else swapped roles.
    wide = t("GreaterOrEqual", t("Abs", y.re), t("Abs", y.im), result_dtype=bool)
    r1 = t("Div", y.im, y.re)
    d1 = t("Add", y.re, t("Mul", y.im, r1))
    r2 = t("Div", y.re, y.im)
    d2 = t("Add", y.im, t("Mul", y.re, r2))
    re = t("Where", wide, t("Div", t("Add", x.re, t("Mul", x.im, r1)), d1),
           t("Div", t("Add", t("Mul", x.re, r2), x.im), d2), cast=(1, 2))
    im = t("Where", wide, t("Div", t("Sub", x.im, t("Mul", x.re, r1)), d1),
           t("Div", t("Sub", t("Mul", x.im, r2), x.re), d2), cast=(1, 2))
    if not xla_zero_divisor:
        return Z(re, im)
    zero = b.const(0, dtype)
    y_zero = b.op("And", t("Equal", y.re, zero, result_dtype=bool), t("Equal", y.im, zero, result_dtype=bool))
    x_nan = b.op("Or", t("IsNaN", x.re, result_dtype=bool), t("IsNaN", x.im, result_dtype=bool))
    inf = t("Where", sign_bit(b, y.re, dtype), b.const(-np.inf, dtype), b.const(np.inf, dtype), cast=(1, 2))
    special = b.op("And", y_zero, b.op("Not", x_nan))
    return Z(t("Where", special, t("Mul", inf, x.re), re, cast=(1, 2)),
             t("Where", special, t("Mul", inf, x.im), im, cast=(1, 2)))


def _big_ratio(b, dtype, z: Z) -> tuple[ir.Value, ir.Value]:
    """(max, (min/max)^2) of the parts' magnitudes: |z| = max * sqrt(1 + that) without overflow."""
    t = partial(b.typed, dtype=dtype)
    a, c = t("Abs", z.re), t("Abs", z.im)
    big, small = t("Max", a, c), t("Min", a, c)
    ratio = t("Div", small, big)
    return big, t("Mul", ratio, ratio)


def _abs(b, dtype, z: Z, big_ratio: tuple[ir.Value, ir.Value] | None = None) -> ir.Value:
    """hypot without overflow: max * sqrt(1 + (min/max)^2), 0 for 0 and inf for an infinite part. `big_ratio`:
    _big_ratio(z), where the caller has it."""
    t = partial(b.typed, dtype=dtype)
    big, squared_ratio = big_ratio or _big_ratio(b, dtype, z)
    result = t("Mul", big, t("Sqrt", t("Add", b.const(1, dtype), squared_ratio)))
    result = t("Where", t("Equal", big, b.const(0, dtype), result_dtype=bool), b.const(0, dtype), result, cast=(1, 2))
    return t("Where", t("IsInf", big, result_dtype=bool), big, result, cast=(1, 2))


def _exp(b, dtype, z: Z) -> Z:
    """exp(a/2) * (exp(a/2) * cis b), exp(a/2) capped at the largest finite value: exp(a) * sin 0 would be
    inf * 0 = NaN past overflow (XLA: exp(100 + 0i) is (inf, 0) in complex64), and exp(a) * cos b overflows
    where the product is finite."""
    t = partial(b.typed, dtype=dtype)
    half = _half_exp(b, dtype, z.re)
    return Z(t("Mul", half, t("Mul", half, t("Cos", z.im))), t("Mul", half, t("Mul", half, t("Sin", z.im))))


def _half_exp(b, dtype, a: ir.Value) -> ir.Value:
    """min(exp(a / 2), max): exp(a) * x is this times (this times x), see _exp."""
    t = partial(b.typed, dtype=dtype)
    return t("Min", t("Exp", t("Mul", a, b.const(0.5, dtype))), b.const(np.finfo(dtype).max, dtype))


def _log_abs(b, dtype, z: Z) -> ir.Value:
    """log|z|; where |z| overflows with both parts finite, log(max) + log1p((min/max)^2) / 2."""
    t = partial(b.typed, dtype=dtype)
    big, squared_ratio = _big_ratio(b, dtype, z)
    magnitude = _abs(b, dtype, z, (big, squared_ratio))
    log1p = _real_rule(b, dtype, "stablehlo.log_plus_one", squared_ratio)
    scaled = t("Add", t("Log", big), t("Mul", log1p, b.const(0.5, dtype)))
    overflow = b.op("And", t("IsInf", magnitude, result_dtype=bool),
                    b.op("Not", t("IsInf", big, result_dtype=bool)))
    return t("Where", overflow, scaled, t("Log", magnitude), cast=(1, 2))


def _log(b, dtype, z: Z) -> Z:
    return Z(_log_abs(b, dtype, z), atan2_values(b, dtype, z.im, z.re))


def sqrt(b, dtype, z: Z) -> Z:
    """t = sqrt((|re| + |z|) / 2); re >= 0: (t, im / 2t), else (|im| / 2t, +-t by im < 0); 0 -> (0, im)."""
    t = partial(b.typed, dtype=dtype)
    # |z| and |re| + |z| overflow for parts past max / 4: there sqrt(z) = 2 sqrt(z / 4), both scalings exact.
    large = t("Greater", t("Max", t("Abs", z.re), t("Abs", z.im)), b.const(np.finfo(dtype).max / 4, dtype),
              result_dtype=bool)
    scale = lambda x, y: t("Where", large, b.const(x, dtype), b.const(y, dtype), cast=(1, 2))  # noqa: E731
    shrink, grow = scale(0.25, 1), scale(2, 1)
    z = Z(t("Mul", z.re, shrink), t("Mul", z.im, shrink))
    root = t("Sqrt", t("Mul", t("Add", t("Abs", z.re), _abs(b, dtype, z)), b.const(0.5, dtype)))
    other = t("Div", z.im, t("Add", root, root))
    negative = t("Less", z.re, b.const(0, dtype), result_dtype=bool)
    # XLA tests im < 0, not the sign bit: sqrt(-4 - 0i) is +2i.
    signed_root = t("Where", t("Less", z.im, b.const(0, dtype), result_dtype=bool), t("Neg", root), root,
                    cast=(1, 2))
    re = t("Where", negative, t("Abs", other), root, cast=(1, 2))
    im = t("Where", negative, signed_root, other, cast=(1, 2))
    zero = t("Equal", root, b.const(0, dtype), result_dtype=bool)
    return Z(t("Mul", t("Where", zero, b.const(0, dtype), re, cast=(1, 2)), grow),
             t("Mul", t("Where", zero, z.im, im, cast=(1, 2)), grow))


def _reciprocal(b, dtype, z: Z) -> Z:
    one = Z(b.const(1, dtype), b.const(0, dtype))
    return divide(b, dtype, one, z)


def _rsqrt(b, dtype, z: Z) -> Z:
    return _reciprocal(b, dtype, sqrt(b, dtype, z))


def _pow(b, dtype, x: Z, y: Z) -> Z:
    """|x|^y.re * exp(-y.im * arg x) * cis(y.re * arg x + y.im * log|x|)."""
    t = partial(b.typed, dtype=dtype)
    angle = atan2_values(b, dtype, x.im, x.re)
    log_abs = t("Log", _abs(b, dtype, x))
    scale = t("Exp", t("Sub", t("Mul", y.re, log_abs), t("Mul", y.im, angle)))
    q = t("Add", t("Mul", y.re, angle), t("Mul", y.im, log_abs))
    re, im = t("Mul", scale, t("Cos", q)), t("Mul", scale, t("Sin", q))
    # XLA: 0^0 = 1, 0^y = 0 for real y > 0, else NaN (the formula's value there).
    zero = b.const(0, dtype)
    is_zero = lambda v: t("Equal", v, zero, result_dtype=bool)  # noqa: E731
    base_zero = b.op("And", is_zero(x.re), is_zero(x.im))
    exp_zero = b.op("And", is_zero(y.re), is_zero(y.im))
    exp_positive = b.op("And", t("Greater", y.re, zero, result_dtype=bool), is_zero(y.im))
    defined = b.op("Or", exp_zero, exp_positive)
    nan = b.const(np.nan, dtype)
    special_re = t("Where", exp_zero, b.const(1, dtype), t("Where", exp_positive, zero, nan, cast=(1, 2)), cast=(1, 2))
    special_im = t("Where", defined, zero, nan, cast=(1, 2))
    return Z(t("Where", base_zero, special_re, re, cast=(1, 2)), t("Where", base_zero, special_im, im, cast=(1, 2)))


def _sign(b, dtype, z: Z) -> Z:
    """z / |z|, and 0 for 0."""
    t = partial(b.typed, dtype=dtype)
    magnitude = _abs(b, dtype, z)
    zero = t("Equal", magnitude, b.const(0, dtype), result_dtype=bool)
    safe = t("Where", zero, b.const(1, dtype), magnitude, cast=(1, 2))
    return Z(t("Div", z.re, safe), t("Div", z.im, safe))


def _cosh_sinh(b, dtype, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    # From Exp: ORT has no f64 Cosh/Sinh kernels.
    t = partial(b.typed, dtype=dtype)
    half = b.const(0.5, dtype)
    up = t("Exp", x)
    down = t("Exp", t("Neg", x))
    return t("Mul", t("Add", up, down), half), t("Mul", t("Sub", up, down), half)


def _sin(b, dtype, z: Z) -> Z:
    t = partial(b.typed, dtype=dtype)
    cosh, sinh = _cosh_sinh(b, dtype, z.im)
    return Z(t("Mul", t("Sin", z.re), cosh), t("Mul", t("Cos", z.re), sinh))


def _cos(b, dtype, z: Z) -> Z:
    t = partial(b.typed, dtype=dtype)
    cosh, sinh = _cosh_sinh(b, dtype, z.im)
    return Z(t("Mul", t("Cos", z.re), cosh), t("Neg", t("Mul", t("Sin", z.re), sinh)))


def _tan(b, dtype, z: Z) -> Z:
    """(sin 2a + i sinh 2b) / (cos 2a + cosh 2b); past |b| = 20 that is (0, sign b) to working precision."""
    t = partial(b.typed, dtype=dtype)
    two = b.const(2, dtype)
    cosh, sinh = _cosh_sinh(b, dtype, t("Mul", z.im, two))
    denominator = t("Add", t("Cos", t("Mul", z.re, two)), cosh)
    re = t("Div", t("Sin", t("Mul", z.re, two)), denominator)
    im = t("Div", sinh, denominator)
    big = t("Greater", t("Abs", z.im), b.const(20, dtype), result_dtype=bool)
    return Z(t("Where", big, b.const(0, dtype), re, cast=(1, 2)), t("Where", big, t("Sign", z.im), im, cast=(1, 2)))


def _expm1(b, dtype, z: Z) -> Z:
    """(expm1(a) cos b - 2 sin^2(b/2), exp(a) sin b): no cancellation near 0."""
    t = partial(b.typed, dtype=dtype)
    half_sin = t("Sin", t("Mul", z.im, b.const(0.5, dtype)))
    re = t("Sub", t("Mul", _real_rule(b, dtype, "stablehlo.exponential_minus_one", z.re), t("Cos", z.im)),
           t("Mul", b.const(2, dtype), t("Mul", half_sin, half_sin)))
    half = _half_exp(b, dtype, z.re)
    return Z(re, t("Mul", half, t("Mul", half, t("Sin", z.im))))


def _log1p(b, dtype, z: Z) -> Z:
    """(log1p(a (a + 2) + b^2) / 2, atan2(b, 1 + a)): no cancellation near 0."""
    t = partial(b.typed, dtype=dtype)
    one = b.const(1, dtype)
    inner = t("Add", t("Mul", z.re, t("Add", z.re, b.const(2, dtype))), t("Mul", z.im, z.im))
    re = t("Mul", _real_rule(b, dtype, "stablehlo.log_plus_one", inner), b.const(0.5, dtype))
    # a (a + 2) + b^2 overflows from |z| ~ sqrt(max) on (1e19 in complex64); log|1 + z| has no cancellation there.
    shifted = Z(t("Add", z.re, one), z.im)
    re = t("Where", t("IsInf", inner, result_dtype=bool), _log_abs(b, dtype, shifted), re, cast=(1, 2))
    return Z(re, atan2_values(b, dtype, z.im, shifted.re))


def _real_rule(b, dtype, name: str, x: ir.Value) -> ir.Value:
    """The real rule of an elementwise op that reads only its dtype, on one plane."""
    plane = TensorType((), dtype)
    return RULES[name](RuleContext(b, None, [plane], [plane], None), x)


def _tanh(b, dtype, z: Z) -> Z:
    """(sinh 2a + i sin 2b) / (cosh 2a + cos 2b); past |a| = 20 that is (sign a, 0) to working precision."""
    t = partial(b.typed, dtype=dtype)
    two = b.const(2, dtype)
    cosh, sinh = _cosh_sinh(b, dtype, t("Mul", z.re, two))
    denominator = t("Add", cosh, t("Cos", t("Mul", z.im, two)))
    re = t("Div", sinh, denominator)
    im = t("Div", t("Sin", t("Mul", z.im, two)), denominator)
    big = t("Greater", t("Abs", z.re), b.const(20, dtype), result_dtype=bool)
    return Z(t("Where", big, t("Sign", z.re), re, cast=(1, 2)), t("Where", big, b.const(0, dtype), im, cast=(1, 2)))


for _hlo, _fn in {"multiply": multiply, "divide": divide, "power": _pow}.items():
    register_complex(f"stablehlo.{_hlo}")(partial(_binary, _fn))
for _hlo, _fn in {"abs": _abs, "exponential": _exp, "log": _log, "sqrt": sqrt, "rsqrt": _rsqrt, "sign": _sign,
                  "sine": _sin, "cosine": _cos, "tan": _tan, "tanh": _tanh, "exponential_minus_one": _expm1,
                  "log_plus_one": _log1p}.items():
    register_complex(f"stablehlo.{_hlo}")(partial(_unary, _fn))


@register_complex("stablehlo.dot_general")
def dot_general(ctx: RuleContext, lhs, rhs, *, dot_dimension_numbers):
    """One real dot_general with each pair axis as one more free dim, then (rr - ii, ri + ir)."""
    b, dtype = ctx.b, ctx.out_type.dtype
    real = real_dtype(dtype)
    lhs, rhs = [x if is_complex(t.dtype) else from_real(b, x, t, dtype) for x, t in zip((lhs, rhs), ctx.in_types)]
    dims = dot_dimension_numbers
    lhs_rank = ctx.in_types[0].rank
    n_batch = len(dims.lhs_batching_dimensions)
    n_lhs_free = lhs_rank - n_batch - len(dims.lhs_contracting_dimensions)
    out = list(ctx.out_type.shape)
    # The real dot orders its result (batch, lhs free, rhs free); each pair axis is its side's last free dim.
    split_at = n_batch + n_lhs_free
    real_out = out[:split_at] + [2] + out[split_at:] + [2]
    # Each operand keeps its own precision (complex64 operands may ask for a complex128 result).
    in_reals = [real_dtype(t.dtype) if is_complex(t.dtype) else real for t in ctx.in_types]
    real_ctx = dataclasses.replace(ctx, in_types=[TensorType(t.shape + (2,), r)
                                                  for t, r in zip(ctx.in_types, in_reals)],
                                   out_types=[TensorType(tuple(real_out), real)])
    product = RULES["stablehlo.dot_general"](real_ctx, lhs, rhs, dot_dimension_numbers=dims)
    rank = len(real_out)
    perm = [d for d in range(rank) if d not in (split_at, rank - 1)] + [split_at, rank - 1]
    product = shape_ops.reshape_to(b, b.op("Transpose", product, perm=perm), out + [4])
    rr, ri, ir_, ii = b.ops("Split", product, b.shape_const([1, 1, 1, 1]), num_outputs=4, axis=-1)
    return join(b, Z(b.op("Sub", rr, ii), b.op("Add", ri, ir_)))


