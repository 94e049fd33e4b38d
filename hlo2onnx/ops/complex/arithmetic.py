"""Complex arithmetic and functions: the pair is split into (real, imag) planes, combined with XLA's formulas
(xla/service/elemental_ir_emitter.cc) and joined back; dot_general as one real dot_general.

`multiply`, `divide` and `sqrt` are public: the complex LAPACK routines (linalg/) compute with them.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Callable

import numpy as np
import onnx_ir as ir

from hlo2onnx.ops.complex.pairs import Z, from_real, join, split
from hlo2onnx.ops.core import shape as shape_ops
from hlo2onnx.ops.elementwise.special import atan2_values, sign_bit
from hlo2onnx.registry import RULES, register_complex
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, is_complex, real_dtype


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


