"""stablehlo.fma: a * b + c rounded once (IEEE fusedMultiplyAdd), bit for bit as XLA's CPU computes it.

jax >= 0.12.1 emits it for lax.fma and for every Horner step of lax.polynomial (erf_inv, erfc, the Bessel
functions, ...). ONNX has no fused multiply-add, and Mul then Add rounds twice. Both forms below are exact
(correctly rounded), built from float64 arithmetic only: opset 21 has no BitCast to read a float's bits.

f32, f16 and bf16 (`_narrow`): the product of two such floats is exact in f64 (at most 48 bits, exponents
within f64's), and TwoSum gives s = RN64(p + c) with its exact error e. RN_F(s) differs from RN_F(p + c) only
on a double-rounding tie: every midpoint of two neighbours in F is an f64 number, so no midpoint lies strictly
between p + c and its nearest double s unless s is one. When s is a midpoint and e != 0, the answer is the
neighbour on e's side. ORT's casts from f64 to f16 and bf16 go through f32 (two roundings: measured, ORT
1.31/1.32), so those formats take one more step: t = RN32(s), and the tie test is made on t, with the exact
direction (s - t) + e; F's midpoints are f32 numbers, so the same argument covers the second rounding.

f64 (`_wide`): Dekker's TwoProduct (Veltkamp's split) and TwoSum make a*b + c = s2 + e2 + err exactly, where
s2 = RN(th + w) is the one rounding left; the same tie test on (s2, e2), decided by err's sign, gives the
correctly rounded sum (see `_round_once`). Those transformations are exact while nothing overflows and the
product's low half is not below the subnormal range, so the operands are first scaled by powers of two into a
window where that holds (the regimes above `_wide`), and the result scaled back; where that lands among the
subnormals it rounds a second time, corrected by the same tie test (`_scale_back`).

The graph relies on ORT's kernels rounding each node once, to nearest even, with gradual underflow. A target
that computes f64 in f32 (openvino-cpu) or lacks f64 (core) refuses the op by name.
"""
from __future__ import annotations

from functools import partial

import ml_dtypes
import numpy as np
import onnx_ir as ir

from hlo2onnx.builder import Builder
from hlo2onnx.ops.core.shape import broadcast_of
from hlo2onnx.registry import allow_dynamic, register
from hlo2onnx.translator import RuleContext

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
_NARROW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), F32)
# Every op the f64 arithmetic below emits, checked against the target before anything is built.
_F64_OPS = ("Add", "Sub", "Mul", "Abs", "Sign", "Reciprocal", "Less", "Greater", "GreaterOrEqual", "Equal",
            "Where", "Max", "Min")


@register("stablehlo.fma")
def fma(ctx: RuleContext, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    dtype = np.dtype(ctx.out_type.dtype)
    if dtype not in (*_NARROW, F64):
        raise NotImplementedError(f"fma of {dtype} (only f16, bf16, f32 and f64 are emulated exactly)")
    target = ctx.b.target
    # A target that computes f64 in f32 (openvino-cpu) gets the form all the same: a fusion may replace it (the
    # exact GELU's erfc becomes one Gelu node), and the target check refuses what is left, naming its f64 nodes.
    for op in () if F64 in target.narrowed else _F64_OPS:
        try:
            exact = target.compute_dtype(op, F64) == F64
        except NotImplementedError:
            exact = False
        if not exact:
            why = "computes float64 in a narrower type" if F64 in target.narrowed else f"has no float64 {op} kernel"
            raise NotImplementedError(f"{target.name} cannot run fma's exact form, which needs float64 arithmetic: "
                                      f"{target.name} {why}")
    if dtype == F64:
        return _wide(ctx.b, a, b, c)
    return _narrow(ctx.b, dtype, a, b, c)


allow_dynamic("stablehlo.fma")  # elementwise nodes and scalar constants only: no dim is read


def two_sum(b: Builder, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(s, e) with s = RN(x + y) and x + y = s + e exactly (Knuth; no condition on the order of |x|, |y|)."""
    s = b.op("Add", x, y)
    y_part = b.op("Sub", s, x)
    x_part = b.op("Sub", s, y_part)
    return s, b.op("Add", b.op("Sub", x, x_part), b.op("Sub", y, y_part))


def _in_format(b: Builder, x: ir.Value, dtype: np.dtype) -> ir.Value:
    """Whether each f64 `x` is a number of `dtype` (a cast there and back changes nothing)."""
    return b.op("Equal", b.cast(b.cast(x, dtype), F64), x)


def _away_from(b: Builder, candidate: ir.Value, kept: ir.Value, direction: ir.Value) -> ir.Value:
    """True where `candidate` lies on `direction`'s side of `kept` (False where `direction` is 0 or NaN)."""
    zero = b.const(0.0, F64)
    return b.op("Or", b.op("And", b.op("Greater", direction, zero), b.op("Greater", candidate, kept)),
                b.op("And", b.op("Less", direction, zero), b.op("Less", candidate, kept)))


# -- f32, f16, bf16 -----------------------------------------------------------------------------------------
def _widen(b: Builder, v: ir.Value) -> ir.Value:
    """`v` cast to f64; a broadcast value (a Horner coefficient, lowered as broadcast_in_dim) is cast before its
    Expand, so that the cast folds into the constant and the clean-up drops the Expand into the Mul and Add
    that broadcast by themselves: the graph is then the same as on a scalar, where the erf/erfc templates of
    the Erf and Gelu fusions were traced."""
    expand = broadcast_of(v)
    if expand is not None:
        return b.op("Expand", b.cast(expand.inputs[0], F64), expand.inputs[1])
    return b.cast(v, F64)


def _narrow(b: Builder, dtype: np.dtype, a: ir.Value, x: ir.Value, c: ir.Value) -> ir.Value:
    a64, x64, c64 = (_widen(b, v) for v in (a, x, c))
    s, e = two_sum(b, b.op("Mul", a64, x64), c64)  # the product is exact; p + c = s + e
    if dtype == F32:
        t, direction = s, e
    else:  # t = RN32(s), the value whose cast to dtype rounds once; p + c - t = (s - t) + e, its sign exact
        t = b.cast(b.cast(s, F32), F64)
        direction = b.op("Add", b.op("Sub", s, t), e)
    rounded = b.cast(b.cast(t, dtype), F64)
    # t's neighbour across from `rounded` when t is a midpoint: 2t - rounded, exact in f64. A rounding to
    # infinity counts from 2^(emax+1), the first power of two past the format's largest number, so that the
    # midpoint below it has that largest number as its other neighbour.
    limit = float(np.ldexp(1.0, int(ml_dtypes.finfo(dtype).maxexp)))
    finite = b.op("Min", b.op("Max", rounded, b.const(-limit, F64)), b.const(limit, F64))
    other = b.op("Sub", b.op("Add", t, t), finite)
    # other is in the format only when t is a midpoint (or in it already, when other == rounded and
    # _away_from is False). `other` is never 0 and stays in Where's first branch: ORT's Where turns a -0 taken
    # from its first branch into +0, and `rounded` may be -0. NaN and infinite sums make `direction` NaN.
    fix = b.op("And", _in_format(b, other, dtype), _away_from(b, other, finite, direction))
    return b.cast(b.op("Where", fix, other, rounded), dtype)


# -- f64 ----------------------------------------------------------------------------------------------------
_SPLITTER = 2.0 ** 27 + 1  # Veltkamp: 26-bit halves, whose products are exact in 53 bits
# Scaling regimes (powers of two, so that every scaling is exact while it stays normal):
# - large terms, |a*b| or |c| >= 2^900: a, b times 2^-520 and c times 2^-1040. An exact product past f64's
#   range comes back as a double-double below 2^1008 (no Veltkamp or product overflow); with |a*b| >= 2^900
#   both operands are at least 2^-124, so they stay normal and the product's low half exact. A c that
#   underflows there is below 2^-600 while the product is above 2^-141: only its sign can matter, and it is
#   replaced by a sticky +-2^-600 (too small to move the rounding of the product, which is a multiple of
#   2^-245, off a midpoint it is not on).
# - small terms, |a*b| < 2^-900 and |c| < 2^-800: a, b times 2^600 and c times 2^1200, so that the product's
#   low half is not below f64's range (both operands are then below 2^174: nothing overflows). Scaling the
#   result back down rounds a second time where it lands among the subnormals (see _scale_back).
# - otherwise no scaling: the product is at least 2^-900 (its low half is exact), or c dominates it so far
#   (|c| >= 2^-800) that the product's low half cannot matter; nothing reaches 2^901. An operand past 2^995
#   (Veltkamp's C*a would overflow) trades 2^512 with the other, which is then below 2^-95.
_LARGE, _SMALL_PRODUCT, _SMALL_C, _SPLIT_LIMIT = 2.0 ** 900, 2.0 ** -900, 2.0 ** -800, 2.0 ** 995
_DOWN, _UP, _TRADE, _STICKY = 2.0 ** -520, 2.0 ** 600, 2.0 ** 512, 2.0 ** -600


def _wide(b: Builder, a: ir.Value, x: ir.Value, c: ir.Value) -> ir.Value:
    k = partial(b.const, dtype=F64)
    abs_a, abs_x, abs_c = b.op("Abs", a), b.op("Abs", x), b.op("Abs", c)
    product = b.op("Mul", a, x)  # rounded: enough to pick a regime, and exact where a or x is 0
    large = b.op("Or", b.op("GreaterOrEqual", b.op("Abs", product), k(_LARGE)),
                 b.op("GreaterOrEqual", abs_c, k(_LARGE)))
    small = b.op("And", b.op("Less", b.op("Abs", product), k(_SMALL_PRODUCT)), b.op("Less", abs_c, k(_SMALL_C)))
    scale = b.op("Where", large, k(_DOWN), b.op("Where", small, k(_UP), k(1.0)))
    trade = b.op("Where", large, k(1.0), b.op("Where", b.op("Greater", abs_a, k(_SPLIT_LIMIT)), k(1 / _TRADE),
                                              b.op("Where", b.op("Greater", abs_x, k(_SPLIT_LIMIT)), k(_TRADE),
                                                   k(1.0))))
    a_s = b.op("Mul", a, b.op("Mul", scale, trade))
    x_s = b.op("Mul", x, b.op("Mul", scale, b.op("Reciprocal", trade)))
    c_s = b.op("Mul", b.op("Mul", c, scale), scale)
    sticky = b.op("And", b.op("And", large, b.op("Greater", abs_c, k(0.0))),
                  b.op("Less", b.op("Abs", c_s), k(_STICKY)))
    c_s = b.op("Where", sticky, b.op("Where", b.op("Greater", c, k(0.0)), k(_STICKY), k(-_STICKY)), c_s)
    core = _scale_back(b, *_round_once(b, a_s, x_s, c_s), scale, small)
    # Non-finite operands, and a zero product (exact as a plain product, c's sign rules included), take the
    # plain a * x + c; a non-finite c with finite a, x is c itself (their product may have overflowed).
    finite = [b.op("Less", v, k(np.inf)) for v in (abs_a, abs_x, abs_c)]
    finite_ax = b.op("And", finite[0], finite[1])
    plain = b.op("Add", b.op("Where", b.op("And", finite_ax, b.op("Not", finite[2])), k(0.0), product), c)
    use_core = b.op("And", b.op("And", finite_ax, finite[2]),
                    b.op("And", b.op("Greater", abs_a, k(0.0)), b.op("Greater", abs_x, k(0.0))))
    return _select_signed(b, use_core, core, plain)


def _split(b: Builder, v: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Veltkamp's split: v = hi + lo exactly, each with at most 26 significant bits (|v| <= 2^995)."""
    t = b.op("Mul", v, b.const(_SPLITTER, F64))
    hi = b.op("Sub", t, b.op("Sub", t, v))
    return hi, b.op("Sub", v, hi)


def _round_once(b: Builder, a: ir.Value, x: ir.Value, c: ir.Value) -> tuple[ir.Value, ir.Value]:
    """RN(a * x + c) where nothing overflows and the product's low half is exact (see the regimes above), and a
    value with the sign of what it misses.

    Dekker's TwoProduct a * x = uh + ul, then TwoSums: c + uh = th + tl, tl + ul = w + err, th + w = s2 + e2,
    so that a * x + c = s2 + e2 + err exactly. err != 0 needs tl != 0, so |th| >= |uh| / 2 and
    |w| <= 1.5 ulp(th): th + w and the midpoints around s2 are multiples of ulp(w) > 2 |err|. So s2, the rounding
    of th + w, is the rounding of the whole sum, except on a tie: th + w exactly halfway (e2 half the gap to
    s2's neighbour s2 + 2 e2), where err, when it has e2's sign, carries the sum past the midpoint."""
    ah, al = _split(b, a)
    xh, xl = _split(b, x)
    uh = b.op("Mul", a, x)
    ul = b.op("Add", b.op("Add", b.op("Add", b.op("Sub", b.op("Mul", ah, xh), uh), b.op("Mul", ah, xl)),
                             b.op("Mul", al, xh)), b.op("Mul", al, xl))
    th, tl = two_sum(b, c, uh)
    w, err = two_sum(b, tl, ul)
    s2, e2 = two_sum(b, th, w)
    twice = b.op("Add", e2, e2)
    neighbour = b.op("Add", s2, twice)
    # neighbour - s2 == 2 e2 only when s2 + 2 e2 is a double: the tie, or e2 == 0 (then err's sign is 0).
    tie = b.op("Equal", b.op("Sub", neighbour, s2), twice)
    same_side = b.op("Greater", b.op("Mul", b.op("Sign", err), b.op("Sign", e2)), b.const(0.0, F64))
    # s2 (possibly -0) in Where's second branch: ORT's Where turns a -0 from its first into +0.
    rounded = b.op("Where", b.op("And", tie, same_side), neighbour, s2)
    # The exact sum minus `rounded`, whose sign is exact: s2 - rounded is 0 or -2 e2, so adding e2 is exact.
    return rounded, b.op("Add", b.op("Add", b.op("Sub", s2, rounded), e2), err)


def _scale_back(b: Builder, rounded: ir.Value, direction: ir.Value, scale: ir.Value, small: ir.Value) -> ir.Value:
    """`rounded` (the sum's f64 rounding in the scaled domain, `direction` the sign of what it misses) times
    1/scale^2, in two exact steps and a last rounding. That last rounding is a second one where a result of the
    small regime lands among the subnormals (quantum 2^-1074, 2^126 in the scaled domain, where every midpoint
    of that grid is a double): corrected as in `_narrow`, a midpoint taking the neighbour on `direction`'s side."""
    unscale = b.op("Reciprocal", scale)
    # Exact but where the result is far below the subnormals (then it is +-0 either way, and `fix` False).
    halfway = b.op("Mul", rounded, unscale)
    result = b.op("Mul", halfway, unscale)
    back = b.op("Mul", result, scale)  # exact where the regime is small: a subnormal or normal result, scaled up
    other = b.op("Sub", b.op("Add", halfway, halfway), back)
    on_grid = b.op("Equal", b.op("Mul", b.op("Mul", other, unscale), scale), other)
    fix = b.op("And", small, b.op("And", on_grid, _away_from(b, other, back, direction)))
    return b.op("Where", fix, b.op("Mul", other, unscale), result)  # `other` is never 0; see _narrow


def _negative(b: Builder, v: ir.Value) -> ir.Value:
    """Whether v's sign bit is set, -0 and -inf included: v and 1/v have one sign, so their sum has it too."""
    return b.op("Less", b.op("Add", v, b.op("Reciprocal", v)), b.const(0.0, F64))


def _select_signed(b: Builder, condition: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
    """Where(condition, x, y) with the sign of a zero kept from either branch: ORT's Where turns a -0 from its
    first branch into +0, and both branches may be -0 here. Magnitude and sign are selected apart."""
    magnitude = b.op("Where", condition, b.op("Abs", x), b.op("Abs", y))
    negative = b.op("Or", b.op("And", condition, _negative(b, x)),
                    b.op("And", b.op("Not", condition), _negative(b, y)))  # (ORT has no bool Where)
    return b.op("Mul", magnitude, b.op("Where", negative, b.const(-1.0, F64), b.const(1.0, F64)))
