"""Integer bit ops: shifts, popcnt, count_leading_zeros; bitcast_convert and reduce_precision.

ORT's BitShift runs on uint8/uint32/uint64 only, so shifts work on an
unsigned, zero-extended view of the operand (two's-complement casts wrap).
ORT has no BitCast kernel: a float's bit pattern is computed with exact float
arithmetic (sign, exponent from a log corrected against a table of powers of
two, mantissa by exact scaling), and back, in f32 for formats up to 32 bits and
in f64 for f64. That is exact for every
value except NaN payloads: every NaN reads as the quiet NaN of its format, and
NaN bit patterns decode to a NaN.
"""
from __future__ import annotations

from functools import partial

import ml_dtypes
import numpy as np
import onnx_ir as ir

from hlo2onnx.ops.core.shape import broadcast_of
from hlo2onnx.registry import register, register_complex
from hlo2onnx.types import is_bool, is_float

F64, I64, U64 = np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.uint64)
from hlo2onnx.translator import RuleContext
_UNSIGNED = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: U64}
# BitShift has kernels for these (ORT 1.31, measured: none for uint16).
_SHIFTABLE = {1: np.dtype(np.uint8), 2: np.dtype(np.uint32), 4: np.dtype(np.uint32), 8: U64}
# (exponent bits, mantissa bits) of the IEEE-style formats.
_FORMATS = {np.dtype(np.float16): (5, 10), np.dtype(ml_dtypes.bfloat16): (8, 7),
            np.dtype(np.float32): (8, 23), F64: (11, 52)}


def _bits(dtype: np.dtype) -> int:
    return np.dtype(dtype).itemsize * 8


def unsigned_view(b, x: ir.Value, dtype: np.dtype, wide: np.dtype | None = None) -> ir.Value:
    """x's bits as an unsigned integer, zero-extended to `wide` (default: the BitShift type for its width)."""
    size = np.dtype(dtype).itemsize
    return b.cast(b.cast(x, _UNSIGNED[size]), wide or _SHIFTABLE[size])


def from_unsigned(b, u: ir.Value, dtype: np.dtype) -> ir.Value:
    """The low bits of an unsigned integer as `dtype` (an integer type)."""
    return b.cast(b.cast(u, _UNSIGNED[np.dtype(dtype).itemsize]), dtype)


def _shr(b, x: ir.Value, amount: int, dtype=U64) -> ir.Value:
    return b.op("BitShift", x, b.const(amount, dtype), direction="RIGHT")


# -- shifts -----------------------------------------------------------------------
def _shift(kind: str, ctx: RuleContext, x: ir.Value, amount: ir.Value) -> ir.Value:
    """XLA's shifts: the amount is read as unsigned; amounts >= the width give 0 (or the sign, arithmetic)."""
    b, dtype = ctx.b, ctx.out_type.dtype
    width, wide = _bits(dtype), _SHIFTABLE[dtype.itemsize]
    # A broadcast amount (jax's rotations: one scalar per shift) is capped and tested before its Expand:
    # BitShift and the masks below broadcast it themselves.
    expand = broadcast_of(amount)
    if expand is not None:
        amount = expand.inputs[0]
    value, amount = unsigned_view(b, x, dtype), unsigned_view(b, amount, dtype)
    capped = b.op("Min", amount, b.const(width - 1, wide))
    if kind == "arithmetic":  # on ~x for negative x, then back: the vacated bits fill with the sign
        negative = b.op("Greater", value, b.const(2 ** (width - 1) - 1, wide))
        flip = _mask(b, negative, wide, width)
        result = b.op("BitwiseXor", b.op("BitShift", b.op("BitwiseXor", value, flip), capped, direction="RIGHT"),
                      flip)
    else:
        shifted = b.op("BitShift", value, capped, direction=kind)
        in_range = b.op("Less", amount, b.const(width, wide))
        result = b.op("BitwiseAnd", shifted, _mask(b, in_range, wide, width))
    return from_unsigned(b, result, dtype)


def _mask(b, condition: ir.Value, wide: np.dtype, width: int) -> ir.Value:
    """The low `width` bits set where `condition` holds, else 0, as unsigned `wide`. ORT's Where on integers runs
    on one thread without vector code (8.9 ms on 2^20 uint32, against 1.7 ms for this Cast and Mul, measured):
    the mask replaces it where the target multiplies `wide` natively (a product with 0 or 1 is exact)."""
    ones = b.const(2 ** width - 1, wide)
    if b.target.compute_dtype("Mul", wide) == wide:
        return b.op("Mul", b.cast(condition, wide), ones)
    return b.typed("Where", condition, ones, b.const(0, wide), dtype=wide, cast=(1, 2))


register("stablehlo.shift_left")(partial(_shift, "LEFT"))
register("stablehlo.shift_right_logical")(partial(_shift, "RIGHT"))
register("stablehlo.shift_right_arithmetic")(partial(_shift, "arithmetic"))


# -- counting bits ------------------------------------------------------------------
def _popcount64(b, v: ir.Value) -> ir.Value:
    """Bits set in a uint64 (SWAR: pairs, nibbles, bytes, then a multiply sums the bytes)."""
    mask = lambda pattern: b.const(np.uint64(pattern))  # noqa: E731
    v = b.op("Sub", v, b.op("BitwiseAnd", _shr(b, v, 1), mask(0x5555555555555555)))
    v = b.op("Add", b.op("BitwiseAnd", v, mask(0x3333333333333333)),
             b.op("BitwiseAnd", _shr(b, v, 2), mask(0x3333333333333333)))
    v = b.op("BitwiseAnd", b.op("Add", v, _shr(b, v, 4)), mask(0x0F0F0F0F0F0F0F0F))
    return _shr(b, b.op("Mul", v, mask(0x0101010101010101)), 56)


@register("stablehlo.popcnt")
def popcnt(ctx: RuleContext, x):
    dtype = ctx.out_type.dtype
    return ctx.b.cast(_popcount64(ctx.b, unsigned_view(ctx.b, x, dtype, U64)), dtype)


@register("stablehlo.count_leading_zeros")
def count_leading_zeros(ctx: RuleContext, x):
    """width - (bits set after smearing the highest set bit into every lower one)."""
    b, dtype = ctx.b, ctx.out_type.dtype
    width = _bits(dtype)
    v = unsigned_view(b, x, dtype, U64)
    step = 1
    while step < width:
        v = b.op("BitwiseOr", v, _shr(b, v, step))
        step *= 2
    count = b.op("Sub", b.const(np.uint64(width)), _popcount64(b, v))
    return b.cast(count, dtype)


# -- float bit patterns ---------------------------------------------------------------
def _compute_dtype(dtype: np.dtype) -> np.dtype:
    # Every value of a format up to 32 bits, and every power of two it uses, is an exact f32.
    return F64 if dtype == F64 else np.dtype(np.float32)


def _powers_of_two(b, dtype: np.dtype) -> tuple[ir.Value, int]:
    """Table t[k] = 2^(k - bias) for the biased exponents k of `dtype`'s format (the ends may be 0 or inf)."""
    exponent_bits, _ = _FORMATS[dtype]
    bias = 2 ** (exponent_bits - 1) - 1
    with np.errstate(over="ignore"):
        table = np.ldexp(1.0, np.arange(-bias, bias + 2)).astype(_compute_dtype(dtype))
    return b.const(table), bias


def float_to_bits(b, x: ir.Value, dtype: np.dtype) -> ir.Value:
    """The bit pattern of float `x` as int64: in [0, 2^w) for w < 64, the signed reading for f64."""
    dtype = np.dtype(dtype)
    exponent_bits, mantissa_bits = _FORMATS[dtype]
    table, bias = _powers_of_two(b, dtype)
    width, compute = _bits(dtype), _compute_dtype(dtype)
    x = b.cast(x, compute)  # exact
    f = lambda v: b.const(v, compute)  # noqa: E731
    i = lambda v: b.const(v, I64)  # noqa: E731
    a = b.op("Abs", x)
    negative = b.op("Or", b.op("Less", x, f(0)), b.op("Less", b.op("Reciprocal", x), f(0)))  # 1/-0 = -inf
    nan, inf = b.op("IsNaN", x), b.op("IsInf", x)
    min_normal = float(np.ldexp(1.0, 1 - bias))
    normal = b.op("And", b.op("GreaterOrEqual", a, f(min_normal)), b.op("Not", inf))
    safe = b.op("Where", normal, a, f(1.0))
    # floor(log2(a)), then corrected by one where the log rounded across a power of two.
    exponent = b.cast(b.op("Floor", b.op("Div", b.op("Log", safe), f(np.log(2.0)))), I64)
    power = lambda e: b.op("Gather", table, b.op("Add", e, i(bias)))  # noqa: E731
    exponent = b.op("Sub", exponent, b.cast(b.op("Greater", power(exponent), safe), I64))
    exponent = b.op("Add", exponent, b.cast(b.op("LessOrEqual", power(b.op("Add", exponent, i(1))), safe), I64))
    scale = f(float(2 ** mantissa_bits))
    normal_mantissa = b.cast(b.op("Mul", b.op("Sub", b.op("Div", safe, power(exponent)), f(1.0)), scale), I64)
    # Subnormals: a / 2^(1 - bias - mantissa_bits), in two exact steps (2^149 is beyond f32, 2^1074 beyond f64).
    tiny = b.op("Where", normal, f(0.0), b.op("Where", b.op("Or", nan, inf), f(0.0), a))
    half = float(np.ldexp(1.0, (bias - 1 + mantissa_bits) // 2))
    rest = float(np.ldexp(1.0, (bias - 1 + mantissa_bits) - (bias - 1 + mantissa_bits) // 2))
    subnormal_mantissa = b.cast(b.op("Mul", b.op("Mul", tiny, f(half)), f(rest)), I64)
    top = 2 ** exponent_bits - 1
    biased = b.op("Where", normal, b.op("Add", exponent, i(bias)), b.op("Where", b.op("Or", nan, inf), i(top), i(0)))
    mantissa = b.op("Where", normal, normal_mantissa,
                    b.op("Where", nan, i(2 ** (mantissa_bits - 1)), subnormal_mantissa))
    bits = b.op("Add", b.op("Mul", biased, i(2 ** mantissa_bits)), mantissa)
    sign = i(np.iinfo(np.int64).min if width == 64 else 2 ** (width - 1))
    return b.op("Add", bits, b.op("Where", b.op("And", negative, b.op("Not", nan)), sign, i(0)))


def bits_to_float(b, bits: ir.Value, dtype: np.dtype) -> ir.Value:
    """The float of `dtype` whose bit pattern `bits` (int64, as float_to_bits gives it) holds."""
    dtype = np.dtype(dtype)
    exponent_bits, mantissa_bits = _FORMATS[dtype]
    table, bias = _powers_of_two(b, dtype)
    width, compute = _bits(dtype), _compute_dtype(dtype)
    f = lambda v: b.const(v, compute)  # noqa: E731
    i = lambda v: b.const(v, I64)  # noqa: E731
    magnitude = b.op("BitwiseAnd", bits, i(2 ** (width - 1) - 1))
    negative = b.op("Not", b.op("Equal", magnitude, bits))
    biased = b.op("Div", magnitude, i(2 ** mantissa_bits))
    mantissa = b.cast(b.op("BitwiseAnd", magnitude, i(2 ** mantissa_bits - 1)), compute)  # exact: < 2^53
    fraction = b.op("Mul", mantissa, f(float(np.ldexp(1.0, -mantissa_bits))))
    normal = b.op("Mul", b.op("Add", fraction, f(1.0)), b.op("Gather", table, biased))
    subnormal = b.op("Mul", mantissa, f(float(np.ldexp(1.0, 1 - bias - mantissa_bits))))
    special = b.op("Where", b.op("Equal", mantissa, f(0.0)), f(np.inf), f(np.nan))
    value = b.op("Where", b.op("Equal", biased, i(0)), subnormal,
                 b.op("Where", b.op("Equal", biased, i(2 ** exponent_bits - 1)), special, normal))
    value = b.op("Where", negative, b.op("Neg", value), value)
    return b.cast(value, dtype)


def _to_u64(b, x: ir.Value, dtype: np.dtype) -> ir.Value:
    if is_float(dtype):
        return b.cast(float_to_bits(b, x, dtype), U64)
    return unsigned_view(b, x, dtype, U64)


def _from_u64(b, u: ir.Value, dtype: np.dtype) -> ir.Value:
    if is_float(dtype):
        return bits_to_float(b, b.cast(u, I64), dtype)
    return b.cast(u, dtype)  # wraps to the low bits


@register_complex("stablehlo.bitcast_convert")  # complex -> the same complex type only (identity)
@register("stablehlo.bitcast_convert")
def bitcast_convert(ctx: RuleContext, x):
    b = ctx.b
    source, target = ctx.in_types[0].dtype, ctx.out_type.dtype
    if source == target and (is_bool(source) or source.kind == "c"):
        return b.op("Identity", x)
    if is_bool(source) or is_bool(target) or source.kind == "c" or target.kind == "c":
        raise NotImplementedError(f"bitcast_convert {source} -> {target}")
    if source == target:
        return b.op("Identity", x)
    if not is_float(source) and not is_float(target) and source.itemsize == target.itemsize:
        return b.cast(x, target)  # integer casts of equal width wrap: the bits stay
    in_bits, out_bits = _bits(source), _bits(target)
    wide = _to_u64(b, x, source)
    if in_bits == out_bits:
        return _from_u64(b, wide, target)
    if in_bits > out_bits:  # one element -> a new minor dimension of parts, least significant first
        parts = []
        for k in range(in_bits // out_bits):
            part = b.op("BitwiseAnd", _shr(b, wide, k * out_bits), b.const(np.uint64(2 ** out_bits - 1)))
            parts.append(b.op("Unsqueeze", part, b.shape_const([-1])))
        return _from_u64(b, b.op("Concat", *parts, axis=-1), target)
    rank = len(ctx.in_types[0].shape)
    joined = None
    for k in range(out_bits // in_bits):
        part = b.op("Gather", wide, b.const(np.int64(k)), axis=rank - 1)
        part = b.op("BitShift", part, b.const(np.uint64(k * in_bits)), direction="LEFT")
        joined = part if joined is None else b.op("BitwiseOr", joined, part)
    return _from_u64(b, joined, target)


@register("stablehlo.reduce_precision")
def reduce_precision(ctx: RuleContext, x, *, exponent_bits: int, mantissa_bits: int):
    """XLA's bit-level rounding (to nearest even), then overflow to inf and underflow to zero."""
    b, dtype = ctx.b, ctx.out_type.dtype
    if dtype not in _FORMATS:
        raise NotImplementedError(f"reduce_precision on {dtype}")
    source_exponent, source_mantissa = _FORMATS[dtype]
    if exponent_bits >= source_exponent and mantissa_bits >= source_mantissa:
        return b.op("Identity", x)  # every value of the format is one of the reduced format
    if b.target.flushes_subnormals and exponent_bits >= source_exponent \
            and _FORMATS[_compute_dtype(dtype)][0] == source_exponent:
        # The bits are read by arithmetic, which sees the input's subnormals as zeros there, and they are kept.
        raise NotImplementedError(f"{b.target.name} flushes subnormal {dtype} values, which reduce_precision to "
                                  f"{exponent_bits} exponent bits keeps: no exact lowering for {dtype}")
    width = _bits(dtype)
    i = lambda v: b.const(v, I64)  # noqa: E731
    bits = float_to_bits(b, x, dtype)
    # The magnitude's bits: the rounding carry never reaches the sign.
    magnitude = b.op("BitwiseAnd", bits, i(2 ** (width - 1) - 1))
    sign = b.op("Sub", bits, magnitude)
    if mantissa_bits < source_mantissa:
        dropped = source_mantissa - mantissa_bits
        last_kept = b.op("Div", b.op("BitwiseAnd", magnitude, i(2 ** dropped)), i(2 ** dropped))
        rounded = b.op("Add", magnitude, b.op("Add", last_kept, i(2 ** (dropped - 1) - 1)))
        magnitude = b.op("BitwiseAnd", rounded, i(-(2 ** dropped)))
    if exponent_bits < source_exponent:
        exponent_mask = (2 ** source_exponent - 1) << source_mantissa
        bias, reduced_bias = 2 ** (source_exponent - 1) - 1, 2 ** (exponent_bits - 1) - 1
        exponent = b.op("BitwiseAnd", magnitude, i(exponent_mask))
        overflow = b.op("Greater", exponent, i((bias + reduced_bias) << source_mantissa))
        underflow = b.op("LessOrEqual", exponent, i((bias - reduced_bias) << source_mantissa))
        magnitude = b.op("Where", overflow, i(exponent_mask), b.op("Where", underflow, i(0), magnitude))
    result = bits_to_float(b, b.op("Add", sign, magnitude), dtype)
    nan = b.typed("IsNaN", x, dtype=dtype, result_dtype=bool)
    # A NaN stays itself. With no mantissa bits the StableHLO interpreter gives inf instead; XLA keeps the NaN.
    return b.typed("Where", nan, x, result, dtype=dtype, cast=(1, 2))
