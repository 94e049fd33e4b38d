"""Elementwise arithmetic, comparison, logical, select, convert and clamp."""
from __future__ import annotations

from functools import partial

import ml_dtypes
import numpy as np
import onnx_ir as ir

from hlo2onnx.ops.core.order import total_order_compare
from hlo2onnx.ops.elementwise.fmod import fmod
from hlo2onnx.ops.elementwise.special import in_compute_dtype
from hlo2onnx.patterns.cleanup import const_array, splat_of
from hlo2onnx.registry import register
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import is_bool, is_float, is_unsigned


def _same(onnx_op: str, ctx: RuleContext, *xs: ir.Value) -> ir.Value:
    """Ops whose ONNX form has the same meaning and broadcasting as StableHLO's."""
    return ctx.b.typed(onnx_op, *xs, dtype=ctx.out_type.dtype)


for _hlo, _onnx in {
    "add": "Add", "subtract": "Sub", "multiply": "Mul",
    "maximum": "Max", "minimum": "Min", "negate": "Neg", "abs": "Abs",
    "exponential": "Exp", "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh",
    "floor": "Floor", "ceil": "Ceil", "round_nearest_even": "Round", "logistic": "Sigmoid",
}.items():
    register(f"stablehlo.{_hlo}")(partial(_same, _onnx))


def _bitwise(bool_op: str, int_op: str, ctx: RuleContext, *xs: ir.Value) -> ir.Value:
    dtype = ctx.out_type.dtype
    return ctx.b.op(bool_op, *xs) if is_bool(dtype) else ctx.b.typed(int_op, *xs, dtype=dtype)


register("stablehlo.and")(partial(_bitwise, "And", "BitwiseAnd"))
register("stablehlo.or")(partial(_bitwise, "Or", "BitwiseOr"))
register("stablehlo.xor")(partial(_bitwise, "Xor", "BitwiseXor"))
register("stablehlo.not")(partial(_bitwise, "Not", "BitwiseNot"))


def _int_division(ctx: RuleContext, x: ir.Value, y: ir.Value, *, remainder: bool) -> ir.Value:
    """XLA's integer division: x/0 is -1 (all ones), x%0 is x, and MIN/-1 is MIN (remainder 0).

    ORT's kernels trap on a zero divisor, so the divisor is made safe first.
    """
    b, dtype = ctx.b, ctx.out_type.dtype
    zero = b.const(0, dtype)
    y_is_zero = b.op("Equal", y, zero)
    safe_y = b.typed("Where", y_is_zero, b.const(1, dtype), y, dtype=dtype, cast=(1, 2))
    if not is_unsigned(dtype):
        # MIN / -1 overflows in C; with divisor 1 instead the quotient is MIN, the remainder 0.
        overflow = b.op("And", b.op("Equal", x, b.const(np.iinfo(dtype).min, dtype)),
                        b.op("Equal", y, b.const(-1, dtype)))
        safe_y = b.typed("Where", overflow, b.const(1, dtype), safe_y, dtype=dtype, cast=(1, 2))
    if remainder:
        # Not Mod(fmod=1): ORT computes it through double, wrong for 64-bit values past 2^53.
        quotient = b.typed("Div", x, safe_y, dtype=dtype)  # truncates, like C
        result = b.typed("Sub", x, b.typed("Mul", quotient, safe_y, dtype=dtype), dtype=dtype)
        if not is_unsigned(dtype):
            result = b.typed("Where", overflow, zero, result, dtype=dtype, cast=(1, 2))
        return b.typed("Where", y_is_zero, x, result, dtype=dtype, cast=(1, 2))
    result = b.typed("Div", x, safe_y, dtype=dtype)
    return b.typed("Where", y_is_zero, b.const(-1 if not is_unsigned(dtype) else np.iinfo(dtype).max, dtype),
                   result, dtype=dtype, cast=(1, 2))


@register("stablehlo.divide")
def divide(ctx: RuleContext, x, y):
    if is_float(ctx.out_type.dtype):
        return ctx.b.typed("Div", x, y, dtype=ctx.out_type.dtype)
    return _int_division(ctx, x, y, remainder=False)


@register("stablehlo.remainder")
def remainder(ctx: RuleContext, x, y):
    dtype = ctx.out_type.dtype
    if is_float(dtype):  # C fmod: the sign follows the dividend
        try:
            ctx.b.target.compute_dtype("Mod", dtype)
        except NotImplementedError:  # the target's Mod is wrong (IREE's): computed exactly from arithmetic
            return fmod(ctx.b, x, y, ctx.out_type)
        return ctx.b.typed("Mod", x, y, dtype=dtype, fmod=1)
    return _int_division(ctx, x, y, remainder=True)


@register("stablehlo.power")
def power(ctx: RuleContext, x, y):
    """x ** y. A constant exponent of 0, 1, 2 or -1 is simplified as XLA's algebraic simplifier does (1, x,
    x * x, 1 / x: each one rounding, like a correctly rounded pow), which also spares targets whose Pow is
    wrong (IREE's) a refusal: jax-md's soft-sphere energy raises to the float power 2.0."""
    b, dtype = ctx.b, ctx.out_type.dtype
    exponent = _uniform(y) if is_float(dtype) else None
    if exponent is not None and float(exponent) in (0.0, 1.0, 2.0, -1.0):
        if exponent == 0:  # 1 everywhere, NaN included
            shape = ctx.out_type.shape
            return b.splat(1, dtype, shape) if all(d >= 0 for d in shape) \
                else b.op("Expand", b.const(np.ones((), dtype)), b.op("Shape", x))
        if exponent == 1:
            return x
        if exponent == 2:
            return b.typed("Mul", x, x, dtype=dtype)
        return b.typed("Div", b.const(1, dtype), x, dtype=dtype)
    return b.typed("Pow", x, y, dtype=dtype)


# Scalar constant arithmetic an exponent may still hold when its rule runs (ORT's folding comes later): jax-md
# writes alpha - 1 for the gradient of x ** alpha, converted from f32.
_FOLDABLE = {"Cast": None, "Identity": None, "Expand": None, "Reshape": None, "Neg": np.negative,
             "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


def _uniform(value: ir.Value, depth: int = 8):
    """The one value an operand holds everywhere when it is computed from constants alone (a scalar the rules
    broadcast, a splat, their sums and conversions), else None."""
    found = splat_of(value)
    if found is not None:
        return found
    array = const_array(value)
    if array is not None:
        return array.reshape(-1)[0] if array.size == 1 else None
    producer = value.producer()
    if depth == 0 or producer is None or producer.domain != "" or producer.op_type not in _FOLDABLE:
        return None
    fn = _FOLDABLE[producer.op_type]
    operands = producer.inputs[:1] if fn is None or producer.op_type == "Neg" else producer.inputs
    values = [_uniform(v, depth - 1) if v is not None else None for v in operands]
    if any(v is None for v in values):
        return None
    return values[0] if fn is None else fn(*values)


@register("stablehlo.rsqrt")
def rsqrt(ctx: RuleContext, x):
    dtype = ctx.out_type.dtype
    return ctx.b.typed("Reciprocal", ctx.b.typed("Sqrt", x, dtype=dtype), dtype=dtype)


# _PASS_THROUGH: rules that return x itself for some inputs (±0, NaN) put x in Where's *second*
# branch, selected by a condition that is no Not: ORT's Where turns a -0 taken from its first
# branch into +0, and ORT rewrites Where(Not(c), a, b) into Where(c, b, a).


@register("stablehlo.sign")
def sign(ctx: RuleContext, x):
    dtype = ctx.out_type.dtype
    if not is_float(dtype):
        return ctx.b.typed("Sign", x, dtype=dtype)
    return in_compute_dtype(ctx.b, dtype, _float_sign, x)


def _float_sign(b, dtype, x):
    """XLA's sign returns x itself for ±0 and NaN, where ORT's Sign gives +0. Scaling by 2^(2 emax) takes
    every nonzero x (subnormals too) to |x| >= 1 or inf, and keeps ±0 and NaN; clamping to [-1, 1] with
    NaN-propagating Max/Min finishes. Four fast passes: a select would be one slow one (ORT's Where).
    A runtime that folds the two scalings into one (x * inf) gets the select instead."""
    if b.target.folds_constant_products:
        nonzero_number = b.op("Less", b.const(0, dtype), b.op("Abs", x))  # false for ±0 and NaN
        return b.typed("Where", nonzero_number, b.op("Sign", x), x, dtype=dtype, cast=(1, 2))
    big = b.const(np.ldexp(1.0, np.finfo(dtype).maxexp - 1).astype(dtype))
    scaled = b.op("Mul", b.op("Mul", x, big), big)
    return b.op("Min", b.op("Max", scaled, b.const(-1, dtype)), b.const(1, dtype))


def _cbrt(b, dtype, x):
    """|x|^(1/3) refined by one Newton step: 1/3 rounded to `dtype` alone costs up to 15 ulp on f32."""
    t = partial(b.typed, dtype=dtype)
    magnitude = t("Abs", x)
    root = t("Pow", magnitude, b.const(1 / 3, dtype))
    step = t("Div", t("Sub", root, t("Div", magnitude, t("Mul", root, root))), b.const(3, dtype))
    signed = t("Mul", t("Sign", x), t("Sub", root, step))
    # ±0 and ±inf are their own roots (0/0 and inf/inf would make them NaN); see _PASS_THROUGH.
    finite_nonzero = b.op("And", t("Greater", magnitude, b.const(0, dtype), result_dtype=bool),
                          t("Less", magnitude, b.const(np.inf, dtype), result_dtype=bool))
    return t("Where", finite_nonzero, signed, x, cast=(1, 2))


@register("stablehlo.cbrt")
def cbrt(ctx: RuleContext, x):
    return in_compute_dtype(ctx.b, ctx.out_type.dtype, _cbrt, x)


@register("stablehlo.exponential_minus_one")
def expm1(ctx: RuleContext, x):
    return in_compute_dtype(ctx.b, ctx.out_type.dtype, _expm1, x)


def _expm1(b, dtype, x):
    """Kahan's accurate expm1: (u - 1) * x / log(u) with u = exp(x), exact near 0."""
    t = partial(b.typed, dtype=dtype)
    one = b.const(1, dtype)
    u = t("Exp", x)
    um1 = t("Sub", u, one)
    scaled = t("Div", t("Mul", um1, x), t("Log", u))
    # For large x, log(u) is inf and the formula gives nan; u - 1 is exact enough there.
    big = t("Greater", t("Abs", x), b.const(0.5, dtype), result_dtype=bool)
    moved = t("Greater", t("Abs", um1), b.const(0, dtype), result_dtype=bool)  # u != 1; see _PASS_THROUGH
    return t("Where", moved, t("Where", big, um1, scaled, cast=(1, 2)), x, cast=(1, 2))


@register("stablehlo.log_plus_one")
def log1p(ctx: RuleContext, x):
    """Goldberg's accurate log1p: log(u) * (x / (u - 1)) with u = 1 + x.

    x / (u - 1) first: log(u) * x overflows for x near the dtype's max.
    """
    b, dtype = ctx.b, ctx.out_type.dtype
    t = partial(b.typed, dtype=dtype)
    one = b.const(1, dtype)
    u = t("Add", x, one)
    log_u = t("Log", u)
    um1 = t("Sub", u, one)
    corrected = t("Mul", log_u, t("Div", x, um1))
    moved = t("Greater", t("Abs", um1), b.const(0, dtype), result_dtype=bool)  # u != 1; see _PASS_THROUGH
    infinite = t("IsInf", u, result_dtype=bool)
    return t("Where", moved, t("Where", infinite, log_u, corrected, cast=(1, 2)), x, cast=(1, 2))


@register("stablehlo.round_nearest_afz")
def round_half_away(ctx: RuleContext, x):
    b, dtype = ctx.b, ctx.out_type.dtype
    t = partial(b.typed, dtype=dtype)
    magnitude = t("Abs", x)
    floor = t("Floor", magnitude)
    # magnitude - floor is exact, so the tie test is exact too.
    up = t("GreaterOrEqual", t("Sub", magnitude, floor), b.const(0.5, dtype), result_dtype=bool)
    rounded = t("Add", floor, b.cast(up, dtype))
    # The sign by a multiply by ±1 (Sign(-0) is 0; Where loses -0, see _PASS_THROUGH); 1/-0 is -inf.
    zero = b.const(0, dtype)
    negative = b.op("Or", t("Less", x, zero, result_dtype=bool),
                    t("Less", t("Div", b.const(1, dtype), x), zero, result_dtype=bool))
    return t("Mul", rounded, t("Where", negative, b.const(-1, dtype), b.const(1, dtype), cast=(1, 2)))


@register("stablehlo.is_finite")
def is_finite(ctx: RuleContext, x):
    b, dtype = ctx.b, ctx.in_types[0].dtype
    inf = b.typed("IsInf", x, dtype=dtype, result_dtype=bool)
    nan = b.typed("IsNaN", x, dtype=dtype, result_dtype=bool)
    return b.op("Not", b.op("Or", inf, nan))


_COMPARE = {"EQ": "Equal", "LT": "Less", "LE": "LessOrEqual", "GT": "Greater", "GE": "GreaterOrEqual"}


@register("stablehlo.compare")
def compare(ctx: RuleContext, x, y, *, comparison_direction: str, compare_type: str | None = None):
    dtype = ctx.in_types[0].dtype
    if compare_type == "TOTALORDER":
        return total_order_compare(ctx.b, x, y, comparison_direction, dtype)
    if comparison_direction == "NE":
        return ctx.b.op("Not", ctx.b.typed("Equal", x, y, dtype=dtype, result_dtype=bool))
    return ctx.b.typed(_COMPARE[comparison_direction], x, y, dtype=dtype, result_dtype=bool)


@register("stablehlo.select")
def select(ctx: RuleContext, pred, on_true, on_false):
    return ctx.b.typed("Where", pred, on_true, on_false, dtype=ctx.out_type.dtype, cast=(1, 2))


@register("stablehlo.clamp")
def clamp(ctx: RuleContext, low, x, high):
    dtype = ctx.out_type.dtype
    return ctx.b.typed("Min", ctx.b.typed("Max", x, low, dtype=dtype), high, dtype=dtype)


@register("stablehlo.convert")
def convert(ctx: RuleContext, x):
    source, target = ctx.in_types[0].dtype, ctx.out_type.dtype
    if source == target:
        return ctx.b.op("Identity", x)
    if np.dtype(target) == np.float32 and (wide := ctx.b.unrounded(x)) is not None:
        return ctx.b.op("Identity", wide)  # bf16 arithmetic converted back: XLA keeps the float32 value
    if is_float(source) and not is_float(target) and not is_bool(target):
        if np.dtype(source).itemsize == 1:  # float8: ORT has no float8 compares; float32 holds each value
            x, source = ctx.b.cast(x, np.float32), np.dtype(np.float32)
        return _saturate_for_int(ctx, x, source, target)
    if is_float(target) and np.dtype(target).itemsize == 1:
        return _to_float8(ctx, x, source, target)
    return ctx.b.op("Cast", x, to=ir.DataType.from_numpy(np.dtype(target)))


def _to_float8(ctx: RuleContext, x, source, target):
    """ONNX's Cast saturates to float8's largest finite value by default; XLA's gives inf (e5m2), NaN (e4m3fn).
    With saturate=0 ORT gives NaN, not inf, to the e5m2 values that round up past its largest (61440 up to
    65536): those become ±inf first."""
    to = ir.DataType.from_numpy(np.dtype(target))
    if is_float(source) and np.dtype(target) == np.dtype(ml_dtypes.float8_e5m2) \
            and float(ml_dtypes.finfo(source).max) > 61440:
        t = partial(ctx.b.typed, dtype=source)
        past = t("GreaterOrEqual", t("Abs", x), ctx.b.const(61440, source), result_dtype=bool)
        x = t("Where", past, t("Mul", x, ctx.b.const(np.inf, source)), x, cast=(1, 2))
    return ctx.b.op("Cast", x, to=to, saturate=0)


def _saturate_for_int(ctx: RuleContext, x, source, target):
    """XLA converts float->int saturating, with NaN -> 0; a bare Cast is undefined there."""
    b = ctx.b
    info = np.iinfo(target)
    # The floats of `source` nearest the bounds that still fit `target`.
    high, low = _inside(info.max, source), _inside(info.min, source)
    t = partial(b.typed, dtype=source)
    clipped = t("Min", t("Max", x, b.const(low, source)), b.const(high, source))
    nan = t("IsNaN", x, result_dtype=bool)
    saturated = b.op("Cast", clipped, to=ir.DataType.from_numpy(np.dtype(target)))
    is_high = t("Greater", x, b.const(high, source), result_dtype=bool)
    saturated = b.typed("Where", is_high, b.const(info.max, target), saturated, dtype=target, cast=(1, 2))
    if int(low) != info.min:  # float16 -> int32/int64: -2**31 is -inf there, and the clip stops at -65504
        is_low = t("Less", x, b.const(low, source), result_dtype=bool)
        saturated = b.typed("Where", is_low, b.const(info.min, target), saturated, dtype=target, cast=(1, 2))
    return b.typed("Where", nan, b.const(0, target), saturated, dtype=target, cast=(1, 2))


def _inside(bound: int, source) -> np.ndarray:
    """An integer type's bound as the `source` float nearest it on zero's side. Rounding to the nearest float
    may carry it past the bound (2**31 - 1 is 2**31 in float32, 2**63 - 1 is 2**63 in float64) or to infinity
    (float16), where a Cast is undefined. The check is in Python ints: numpy compares a float32 with an int as
    float32, which hides the carry."""
    with np.errstate(over="ignore"):
        value = np.asarray(float(bound), dtype=source)  # (ml_dtypes reads no int past int64)
    if not np.isfinite(value) or abs(int(value)) > abs(bound):
        value = np.nextafter(value, np.asarray(0, dtype=source))
    return value
