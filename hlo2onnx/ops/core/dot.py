"""dot_general as (batched) MatMul, with transposes and reshapes only where needed."""
from __future__ import annotations

from hlo2onnx.ops.core import dims as symbolic
from hlo2onnx.ops.core.shape import merged, reshape_to, transpose_to
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

    # Symbolic sizes are read from the transposed operands, and only where a reshape has two or more of them.
    nb, nm, nk = len(batch), len(m_dims), len(rhs_batch) + len(rhs_contract)
    lhs = transpose_to(b, lhs, lhs_batch + lhs_free + lhs_contract)
    lt = lhs
    lhs_dims = lambda: symbolic.dims(b, lt, batch + m_dims + [lhs_shape[d] for d in lhs_contract])  # noqa: E731
    if len(m_dims) != 1 or len(lhs_contract) != 1:
        lhs = _reshape(b, lhs, batch + [merged(m_dims), k], lambda: (lambda d: d[:nb] + [
            symbolic.product(b, d[nb:nb + nm]), symbolic.product(b, d[nb + nm:])])(lhs_dims()))
    rhs = transpose_to(b, rhs, rhs_batch + rhs_contract + rhs_free)
    rt = rhs
    rhs_dims = lambda: symbolic.dims(b, rt, [rhs_shape[d] for d in rhs_batch + rhs_contract] + n_dims)  # noqa: E731
    if len(n_dims) != 1 or len(rhs_contract) != 1:
        rhs = _reshape(b, rhs, batch + [k, merged(n_dims)], lambda: (lambda d: d[:nb] + [
            symbolic.product(b, d[nb:nk]), symbolic.product(b, d[nk:])])(rhs_dims()))
    result = b.typed("MatMul", lhs, rhs, dtype=dtype)
    if len(m_dims) != 1 or len(n_dims) != 1:
        result = _reshape(b, result, list(ctx.out_type.shape), lambda: lhs_dims()[:nb + nm] + rhs_dims()[nk:])
    return result


def _reshape(b, x, shape, parts):
    """reshape_to `shape`, or to `parts()` (sizes read in the graph) where two or more dims are symbolic."""
    if sum(d < 0 for d in shape) <= 1:
        return reshape_to(b, x, shape)
    return symbolic.reshape(b, x, parts())
