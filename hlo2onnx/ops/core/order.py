"""Orders that several families compare by: IEEE totalOrder on floats (stablehlo.compare TOTALORDER, sort's and
top_k's keys) and uint64 read as int64 keeping its order (where ONNX has no uint64 kernel: TopK, ArgMax).

A NaN's sign can only be read by a bit cast, which ONNX has from opset 26 on (BitCast): below it every NaN
counts as +NaN in the total order."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hlo2onnx.types import onnx_dtype

F64 = np.dtype(np.float64)
# Above every finite f32/f16/bf16 value and below f64's infinity: where those formats' infinities go.
_BEYOND_F32 = 1e300
# Between -0 and the smallest negative f32/f16/bf16 subnormal.
_NEG_ZERO_F32 = -1e-300
# ONNX's BitCast, the only op that reads a NaN's sign bit.
BITCAST_OPSET = 26


def _is_negative_zero(b, x: ir.Value, dtype: np.dtype) -> ir.Value:
    zero = b.typed("Equal", x, b.const(0, dtype), dtype=dtype, result_dtype=bool)
    # 1 / -0 is -inf: the one arithmetic test that sees the sign of a zero.
    reciprocal = b.typed("Reciprocal", x, dtype=dtype)
    return b.op("And", zero, b.typed("Less", reciprocal, b.const(0, dtype), dtype=dtype, result_dtype=bool))


def _negative_nan(b, x: ir.Value, nan: ir.Value, dtype: np.dtype) -> ir.Value | None:
    """The NaNs (`nan`: IsNaN(x)) whose sign bit is set, where the opset and target have BitCast (else None)."""
    if b.opset < BITCAST_OPSET or not b.target.supports("BitCast", dtype):
        return None
    signed = np.dtype(f"i{dtype.itemsize}")
    bits = b.op("BitCast", x, to=onnx_dtype(signed))
    return b.op("And", nan, b.op("Less", bits, b.const(0, signed)))


def total_order_keys(b, x: ir.Value, dtype: np.dtype, canonical: bool) -> list[tuple[ir.Value, np.dtype]]:
    """(key, dtype) pairs, most significant first, whose lexicographic order is IEEE totalOrder on `x`.

    With `canonical`, -0 and 0 tie and all NaNs tie (JAX's sort canonicalization).
    Floats narrower than f64 fit one f64 key; f64 needs a second, small key.
    """
    dtype = np.dtype(dtype)
    nan = b.typed("IsNaN", x, dtype=dtype, result_dtype=bool)
    negative_nan = None if canonical else _negative_nan(b, x, nan, dtype)
    inf = b.const(np.inf, F64)
    if dtype.itemsize < 8:
        wide = b.op("Clip", b.cast(x, F64), b.const(-_BEYOND_F32, F64), b.const(_BEYOND_F32, F64))
        if not canonical:
            wide = b.op("Where", _is_negative_zero(b, x, dtype), b.const(_NEG_ZERO_F32, F64), wide)
        key = b.op("Where", nan, inf, wide)
        if negative_nan is not None:  # below -inf, which the clip put at -_BEYOND_F32
            key = b.op("Where", negative_nan, b.const(-np.inf, F64), key)
        return [(key, F64)]
    primary = b.op("Where", nan, inf, x)
    secondary = b.cast(nan, np.int32)
    if not canonical:
        secondary = b.op("Sub", secondary, b.cast(_is_negative_zero(b, x, dtype), np.int32))
    if negative_nan is not None:  # -NaN: (-inf, -1), below -inf's (-inf, 0)
        primary = b.op("Where", negative_nan, b.const(-np.inf, F64), primary)
        secondary = b.op("Sub", secondary, b.op("Mul", b.cast(negative_nan, np.int32), b.const(np.int32(2))))
    return [(primary, F64), (secondary, np.dtype(np.int32))]


def total_order_compare(b, x: ir.Value, y: ir.Value, direction: str, dtype: np.dtype) -> ir.Value:
    """`compare direction, x, y, TOTALORDER` on floats."""
    if direction in ("GT", "GE"):
        x, y, direction = y, x, {"GT": "LT", "GE": "LE"}[direction]
    xs = [k for k, _ in total_order_keys(b, x, dtype, False)]
    ys = [k for k, _ in total_order_keys(b, y, dtype, False)]
    equal = [b.op("Equal", a, c) for a, c in zip(xs, ys)]
    all_equal = equal[0] if len(equal) == 1 else b.op("And", *equal)
    if direction == "EQ":
        return all_equal
    if direction == "NE":
        return b.op("Not", all_equal)
    less = b.op("Less", xs[-1], ys[-1])
    for a, c, eq in zip(xs[-2::-1], ys[-2::-1], equal[-2::-1]):
        less = b.op("Or", b.op("Less", a, c), b.op("And", eq, less))
    return less if direction == "LT" else b.op("Or", less, all_equal)


# -- the sort -----------------------------------------------------------------------
def flip_top_bit(b, x: ir.Value, back: bool = False) -> ir.Value:
    """uint64 <-> int64 keeping the order (no wider type holds uint64): x ^ 2^63, read as the other type."""
    if back:
        return b.op("BitwiseXor", b.cast(x, np.uint64), b.const(np.uint64(1 << 63)))
    return b.cast(b.op("BitwiseXor", x, b.const(np.uint64(1 << 63))), np.int64)
