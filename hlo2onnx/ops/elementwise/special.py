"""Transcendental ops that ONNX lacks or ORT runs in too few dtypes: atan2, tan.

The other special functions (erf, lgamma, digamma, igamma, betainc, bessel,
asin, asinh, ...) arrive as chlo ops that `chlo-legalize-to-stablehlo`
expands into StableHLO arithmetic before translation; asin, acos and atan
expand into atan2, which is why atan2 must keep full f64 precision here.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import onnx_ir as ir

from hlo2onnx.builder import Builder
from hlo2onnx.registry import register
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import is_float

F32 = np.dtype(np.float32)

# Cephes' atan rational forms: atan(z) = z + z * z^2 R(z^2) on a reduced |z|; about 1 ulp.
# float64 (atan.c): R = P / Q, with z reduced to |z| <= 0.66.
_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1)
_ATAN_Q = (1.0, 2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
           4.853903996359136964868e2, 1.945506571482613964425e2)
# float32 (atanf.c): R is a polynomial, with z reduced to |z| <= tan(pi/8).
_ATANF_P = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)


def in_compute_dtype(b: Builder, dtype: np.dtype, fn, *xs: ir.Value) -> ir.Value:
    """`fn(b, dtype, *xs)`, with 16-bit floats computed in f32 and rounded once at the end.

    XLA evaluates a half-precision transcendental in f32; rounding every step
    of a multi-op expansion to f16 instead costs several ulps.
    """
    if np.dtype(dtype).itemsize >= 4:
        return fn(b, np.dtype(dtype), *xs)
    return b.narrow(fn(b, F32, *(b.cast(x, F32) for x in xs)), dtype)


def _polynomial(b: Builder, x: ir.Value, coefficients, dtype: np.dtype) -> ir.Value:
    """Horner's scheme, highest power first."""
    result = b.const(coefficients[0], dtype)
    for c in coefficients[1:]:
        result = b.op("Add", b.op("Mul", result, x), b.const(c, dtype))
    return result


_PI_LO = 1.2246467991473532e-16  # pi - float64(pi)


def _split(multiple_of_pi: float, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """k * pi (k a power of two) as hi + lo in `dtype`: hi its rounding, lo what hi misses."""
    value = multiple_of_pi * np.pi
    hi = np.asarray(value, dtype)
    lo = multiple_of_pi * _PI_LO if dtype == np.float64 else value - float(hi)
    return hi, np.asarray(lo, dtype)


def _atan_unit(b: Builder, q: ir.Value, dtype: np.dtype) -> ir.Value:
    """atan(q) for q in [0, 1] (or NaN), by Cephes' rational form in `dtype` (f32 or f64).

    Not ONNX's Atan: ORT has no f64 kernel, and its f32 one is 1 ulp off even at atan(1).
    """
    f64 = dtype == np.float64
    one = b.const(1, dtype)
    # Above the threshold, reduce with atan(q) = pi/4 + atan((q - 1) / (q + 1)).
    reduced = b.op("Greater", q, b.const(0.66 if f64 else np.tan(np.pi / 8), dtype))
    z = b.op("Where", reduced, b.op("Div", b.op("Sub", q, one), b.op("Add", q, one)), q)
    zz = b.op("Mul", z, z)
    if f64:
        ratio = b.op("Div", b.op("Mul", zz, _polynomial(b, zz, _ATAN_P, dtype)), _polynomial(b, zz, _ATAN_Q, dtype))
    else:
        ratio = b.op("Mul", zz, _polynomial(b, zz, _ATANF_P, dtype))
    hi, lo = _split(0.25, dtype)
    zero = b.const(0, dtype)
    small = b.op("Add", b.op("Add", b.op("Mul", z, ratio), b.op("Where", reduced, b.const(lo, dtype), zero)), z)
    return b.op("Add", b.op("Where", reduced, b.const(hi, dtype), zero), small)


def sign_bit(b: Builder, x: ir.Value, dtype: np.dtype) -> ir.Value:
    """True for negative numbers and -0 (1/-0 is -inf); False for NaN."""
    zero = b.const(0, dtype)
    return b.op("Or", b.op("Less", x, zero), b.op("Less", b.op("Div", b.const(1, dtype), x), zero))


def _atan2(b: Builder, dtype: np.dtype, y: ir.Value, x: ir.Value) -> ir.Value:
    """IEEE atan2 from atan on [0, 1]: C99's signed zeros, infinities and NaNs included."""
    ay, ax = b.op("Abs", y), b.op("Abs", x)
    steep = b.op("Greater", ay, ax)
    small, large = b.op("Where", steep, ax, ay), b.op("Where", steep, ay, ax)
    q = b.op("Div", small, large)
    # 0/0 (both zero) means angle 0 and inf/inf (both infinite) angle pi/4, before the quadrant fix-ups.
    q = b.op("Where", b.op("Equal", large, b.const(0, dtype)), b.const(0, dtype), q)
    q = b.op("Where", b.op("IsInf", small), b.const(1, dtype), q)
    angle = _atan_unit(b, q, dtype)
    # By octant: angle, pi - angle, pi/2 - angle or pi/2 + angle, as hi + (±angle + lo).
    left = sign_bit(b, x, dtype)
    pi2, pi = _split(0.5, dtype), _split(1, dtype)
    zero = b.const(0, dtype)
    hi, lo = (b.op("Where", steep, b.const(pi2[i], dtype), b.op("Where", left, b.const(pi[i], dtype), zero))
              for i in (0, 1))
    flip = b.op("Where", b.op("Xor", steep, left), b.const(-1, dtype), b.const(1, dtype))
    angle = b.op("Add", hi, b.op("Add", b.op("Mul", flip, angle), lo))
    # angle * -1, not Where(.., Neg(angle), ..): ORT's Where turns a -0 from its first branch into +0.
    angle = b.op("Mul", angle, b.op("Where", sign_bit(b, y, dtype), b.const(-1, dtype), b.const(1, dtype)))
    nan = b.op("Or", b.op("IsNaN", x), b.op("IsNaN", y))
    return b.op("Where", nan, b.const(np.nan, dtype), angle)


def atan2_values(b: Builder, dtype: np.dtype, y: ir.Value, x: ir.Value) -> ir.Value:
    """IEEE atan2 of two real values of float `dtype` (the one atan2: complex log and angle use it too)."""
    return in_compute_dtype(b, dtype, _atan2, y, x)


@register("stablehlo.atan2")
def atan2(ctx: RuleContext, y, x):
    dtype = ctx.out_type.dtype
    if not is_float(dtype):
        raise NotImplementedError(f"atan2 of {dtype} (complex atan2 is not translated)")
    return atan2_values(ctx.b, dtype, y, x)


# fdlibm's pi/2 in three 33-bit parts (k * part is exact for |k| < 2^20, so x - k pi/2 loses nothing
# to cancellation when x is near a multiple of pi/2), then the tail, whose product need not be exact.
_PIO2_PARTS = (1.57079632673412561417e+00, 6.07710050630396597660e-11, 2.02226624871116645580e-21,
               8.47842766036889956997e-32)
_REDUCE_BELOW = 1e6  # < 2^20 pi/2; ORT's own reduction beyond (within 3 ulp there, measured)


def _quadrant_sin_cos(b: Builder, x: ir.Value, dtype: np.dtype):
    """sin and cos of r = x - k pi/2 (|r| <= pi/4), with k's quadrant as (odd, k mod 4 >= 2) masks.

    ORT's f64 Sin/Cos reduce the argument with too few bits of pi: near a zero (x close to k pi)
    their relative error reaches 1e-12 (1e-10 for tan near pi/2); on |r| <= pi/4 they are within 2 ulp.
    """
    # Far arguments go to Sin/Cos whole, as quadrant 0.
    far = b.op("GreaterOrEqual", b.op("Abs", x), b.const(_REDUCE_BELOW, dtype))
    k = b.op("Where", far, b.const(0, dtype), b.op("Round", b.op("Mul", x, b.const(2 / np.pi, dtype))))
    r = x
    for part in _PIO2_PARTS:
        r = b.op("Sub", r, b.op("Mul", k, b.const(part, dtype)))
    # Quadrant 0 takes x itself: -0 - (±0 * part) may be +0. x is Where's second branch: ORT's
    # Where turns a -0 from its first branch into +0.
    r = b.op("Where", b.op("Greater", b.op("Abs", k), b.const(0, dtype)), r, x)
    # The low two bits of k, as masks; no Not: ORT rewrites Where(Not(c), a, b) to Where(c, b, a).
    half = b.op("Floor", b.op("Mul", k, b.const(0.5, dtype)))
    quarter = b.op("Floor", b.op("Mul", half, b.const(0.5, dtype)))
    two, one_half = b.const(2, dtype), b.const(0.5, dtype)
    odd = b.op("Greater", b.op("Sub", k, b.op("Mul", half, two)), one_half)
    upper = b.op("Greater", b.op("Sub", half, b.op("Mul", quarter, two)), one_half)
    return b.op("Sin", r), b.op("Cos", r), odd, upper


def _signed(b: Builder, negative: ir.Value, x: ir.Value, dtype: np.dtype) -> ir.Value:
    """-x where `negative`, by a multiply: ORT's Where turns a -0 from its first branch into +0."""
    return b.op("Mul", x, b.op("Where", negative, b.const(-1, dtype), b.const(1, dtype)))


def _sine(b: Builder, dtype: np.dtype, x: ir.Value) -> ir.Value:
    sin, cos, odd, upper = _quadrant_sin_cos(b, x, dtype)
    return _signed(b, upper, b.op("Where", odd, cos, sin), dtype)  # sin, cos, -sin, -cos


def _cosine(b: Builder, dtype: np.dtype, x: ir.Value) -> ir.Value:
    sin, cos, odd, upper = _quadrant_sin_cos(b, x, dtype)
    return _signed(b, b.op("Xor", upper, odd), b.op("Where", odd, sin, cos), dtype)  # cos, -sin, -cos, sin


def _tan(b: Builder, dtype: np.dtype, x: ir.Value) -> ir.Value:
    sin, cos, odd, _ = _quadrant_sin_cos(b, x, dtype)
    return b.op("Where", odd, b.op("Neg", b.op("Div", cos, sin)), b.op("Div", sin, cos))


def _trig(fn, onnx_op: str, ctx: RuleContext, x: ir.Value) -> ir.Value:
    """ONNX's op in f32/f16 (ORT is within 2 ulp of XLA there); the reduced form in f64."""
    dtype = ctx.out_type.dtype
    if not is_float(dtype):
        raise NotImplementedError(f"{onnx_op} of {dtype} (complex trigonometry is not translated)")
    if dtype != np.float64:
        return ctx.b.typed(onnx_op, x, dtype=dtype)
    return fn(ctx.b, np.dtype(dtype), x)


register("stablehlo.sine")(partial(_trig, _sine, "Sin"))
register("stablehlo.cosine")(partial(_trig, _cosine, "Cos"))
register("stablehlo.tan")(partial(_trig, _tan, "Tan"))
