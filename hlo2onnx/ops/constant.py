"""stablehlo.constant: initializers, and splats that are never stored densely."""
from __future__ import annotations

import numpy as np
from jax.extend.mlir import ir as mlir

from hlo2onnx.registry import register


def dense_to_numpy(attr: mlir.DenseElementsAttr, dtype: np.dtype, shape) -> np.ndarray:
    try:
        return np.array(attr, copy=True).astype(dtype, copy=False).reshape(shape)
    except (TypeError, ValueError) as e:  # bf16, fp8, complex: issue-tracked, see ops docs
        raise NotImplementedError(f"dense constant of {dtype}: {e}") from None


def splat_scalar(attr: mlir.DenseElementsAttr, dtype: np.dtype) -> np.ndarray:
    # IntegerAttr.value is the signed reading; astype wraps it back for unsigned types.
    return np.asarray(attr.get_splat_value().value).astype(dtype)


@register("stablehlo.constant")
def constant(ctx):
    shape, dtype = ctx.out_type.shape, ctx.out_type.dtype
    if dtype.kind == "c":
        raise NotImplementedError("complex constants")
    attr = ctx.hlo_op.attributes["value"]
    if attr.is_splat:
        return ctx.b.splat(splat_scalar(attr, dtype), dtype, shape)
    return ctx.b.const(dense_to_numpy(attr, dtype, shape))
