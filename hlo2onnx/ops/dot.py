"""dot_general as (batched) MatMul, with transposes and reshapes only where needed."""
from __future__ import annotations

from hlo2onnx.ops.shape import merged, reshape_to, transpose_to
from hlo2onnx.registry import register
from hlo2onnx.translator import RuleContext


@register("stablehlo.dot_general")
def dot_general(ctx: RuleContext, lhs, rhs, *, dot_dimension_numbers):
    b = ctx.b
    dims = dot_dimension_numbers
    lhs_batch, rhs_batch = list(dims.lhs_batching_dimensions), list(dims.rhs_batching_dimensions)
    lhs_contract, rhs_contract = list(dims.lhs_contracting_dimensions), list(dims.rhs_contracting_dimensions)
    lhs_shape, rhs_shape = ctx.in_types[0].shape, ctx.in_types[1].shape
    dtype = ctx.out_type.dtype
    lhs_free = [d for d in range(len(lhs_shape)) if d not in lhs_batch and d not in lhs_contract]
    rhs_free = [d for d in range(len(rhs_shape)) if d not in rhs_batch and d not in rhs_contract]

    lhs, rhs = b.cast(lhs, dtype) if ctx.in_types[0].dtype != dtype else lhs, \
        b.cast(rhs, dtype) if ctx.in_types[1].dtype != dtype else rhs
    batch = [lhs_shape[d] for d in lhs_batch]
    m_dims = [lhs_shape[d] for d in lhs_free]
    n_dims = [rhs_shape[d] for d in rhs_free]
    k = merged([lhs_shape[d] for d in lhs_contract])

    lhs = transpose_to(b, lhs, lhs_batch + lhs_free + lhs_contract)
    if len(m_dims) != 1 or len(lhs_contract) != 1:
        lhs = reshape_to(b, lhs, batch + [merged(m_dims), k])
    rhs = transpose_to(b, rhs, rhs_batch + rhs_contract + rhs_free)
    if len(n_dims) != 1 or len(rhs_contract) != 1:
        rhs = reshape_to(b, rhs, batch + [k, merged(n_dims)])
    result = b.typed("MatMul", lhs, rhs, dtype=dtype)
    if len(m_dims) != 1 or len(n_dims) != 1:
        result = reshape_to(b, result, list(ctx.out_type.shape))
    return result
