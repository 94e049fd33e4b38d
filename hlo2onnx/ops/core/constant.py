"""stablehlo.constant: initializers, and splats that are never stored densely."""
from __future__ import annotations

import re

import numpy as np
from jax.extend.mlir import ir as mlir

from hlo2onnx.registry import register, register_complex
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import real_dtype


def dense_to_numpy(attr: mlir.DenseElementsAttr, dtype: np.dtype, shape) -> np.ndarray:
    """The attribute's values, read in place where the dtype matches: the read-only array views the
    attribute's storage (MLIR's context owns it; the array keeps the attribute, and so the context, alive),
    so a large constant is not copied at translation (docs/runtime.md, Weights)."""
    try:
        return np.asarray(attr).astype(dtype, copy=False).reshape(shape)
    except (TypeError, ValueError):  # bf16 and fp8 have no buffer protocol in the bindings: read the literal
        pass
    match = _LITERAL.search(str(attr))
    if match is None:
        raise NotImplementedError(f"dense constant of {dtype} in an unknown printed form")
    text = match.group(1).strip()
    if text.startswith('"0x'):
        values = np.frombuffer(bytes.fromhex(text[3:-1]), dtype=np.dtype(dtype).newbyteorder("<"))
    else:
        values = np.asarray([_float_token(t, np.dtype(dtype)) for t in re.split(r"[\s,\[\]]+", text) if t],
                            dtype=dtype)
    if values.size != int(np.prod(shape)):
        raise NotImplementedError(f"dense constant of {dtype} with {values.size} values for shape {shape}")
    return values.astype(dtype).reshape(shape)


def splat_scalar(attr: mlir.DenseElementsAttr, dtype: np.dtype) -> np.ndarray:
    # IntegerAttr.value is the signed reading; astype wraps it back for unsigned types.
    return np.asarray(attr.get_splat_value().value).astype(dtype)


@register("stablehlo.constant")
def constant(ctx: RuleContext):
    shape, dtype = ctx.out_type.shape, ctx.out_type.dtype
    attr = ctx.hlo_op.attributes["value"]
    if attr.is_splat:
        return ctx.b.splat(splat_scalar(attr, dtype), dtype, shape)
    return ctx.b.const(dense_to_numpy(attr, dtype, shape))


_LITERAL = re.compile(r'dense<(.*)>\s*:\s*tensor<', re.S)
_PAIR = re.compile(r"\(\s*([^,()\s]+)\s*,\s*([^,()\s]+)\s*\)")


@register_complex("stablehlo.constant")
def complex_constant(ctx: RuleContext):
    """A complex constant as its (real, imag) float pairs.

    Its attribute cannot be read through the bindings (reading raises, and
    can abort the process: docs/runtime.md), so the printed op is decoded.
    """
    shape, dtype = ctx.out_type.shape, ctx.out_type.dtype
    match = _LITERAL.search(str(ctx.hlo_op))
    if match is None:
        raise NotImplementedError("complex constant in an unknown printed form")
    values = _complex_literal(match.group(1).strip(), dtype)
    if values.size == 1:  # a splat: one pair, expanded
        pair = ctx.b.const(values.reshape(1).view(real_dtype(dtype)))
        return ctx.b.op("Expand", pair, ctx.b.shape_const(list(shape) + [2])) if shape else pair
    if values.size != int(np.prod(shape)):
        raise NotImplementedError(f"complex constant with {values.size} values for shape {shape}")
    return ctx.b.const(np.ascontiguousarray(values.reshape(shape + (1,))).view(real_dtype(dtype)))


def _complex_literal(text: str, dtype: np.dtype) -> np.ndarray:
    """The values of a printed dense literal: "0x..." raw bytes, or (re, im) pairs in row-major order."""
    if text.startswith('"0x'):
        return np.frombuffer(bytes.fromhex(text[3:-1]), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
    real = real_dtype(dtype)
    parts = [_float_token(t, real) for pair in _PAIR.findall(text) for t in pair]
    return np.asarray(parts, dtype=real).view(dtype)


def _float_token(token: str, dtype: np.dtype):
    # NaN and inf print as their bit patterns (0x7FC00000).
    if token.startswith("0x"):
        bits = np.dtype(f"<u{dtype.itemsize}")
        return np.asarray(int(token, 16), dtype=bits).view(dtype)
    return dtype.type(token)

