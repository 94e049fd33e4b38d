"""The ApproxTopK custom call (`lax.approx_max_k`, `lax.approx_min_k`).

Its operands are N arrays and N scalar initial values; its comparator is a
private function named in `called_computations`. On CPU (and wherever the
call carries `is_fallback = true`) XLA computes it exactly: a sort of the N
arrays along `reduction_dim` by that comparator, then the first `top_k`. That
is what is emitted here, with the sort's key-by-key stable TopKs; the initial
values only pad a TPU's partial reduction and are not read. The approximate
(non-fallback) form is refused: its result depends on the TPU's bucketing.
"""
from __future__ import annotations

from jax.extend.mlir import ir as mlir

from hlo2onnx.ops.sort.sort import comparator_keys, keys_permutation
from hlo2onnx.registry import register_custom_call
from hlo2onnx.translator import RuleContext


@register_custom_call("ApproxTopK")
def approx_top_k(ctx: RuleContext, *inputs, top_k: int, reduction_dim: int, is_fallback: bool = False,
                 aggregate_to_topk: bool = True, **_config):
    if not is_fallback or not aggregate_to_topk:
        raise NotImplementedError("custom call @ApproxTopK without is_fallback (a TPU's approximate top-k, "
                                  "whose result depends on its bucketing) has no exact ONNX translation")
    n_arrays = len(inputs) // 2
    arrays = inputs[:n_arrays]
    in_types = ctx.in_types[:n_arrays]
    axis = reduction_dim % len(in_types[0].shape)
    callee = mlir.FlatSymbolRefAttr(mlir.ArrayAttr(ctx.hlo_op.attributes["called_computations"])[0]).value
    function = ctx.translator.functions[callee]
    keys = comparator_keys(function.regions[0].blocks[0])
    if keys is None:
        raise NotImplementedError("custom call @ApproxTopK with a comparator that is not a lexicographic compare")
    n = in_types[0].shape[axis]
    k = min(top_k, n)
    perm = keys_permutation(ctx.b, arrays, [t.dtype for t in in_types], keys, n, axis, k)
    return [ctx.b.op("GatherElements", x, perm, axis=axis) for x in arrays]
