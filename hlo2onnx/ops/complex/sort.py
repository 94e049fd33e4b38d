"""stablehlo.sort with complex operands (jnp.sort, argsort, lexsort of complex arrays).

JAX's comparator reads each complex key's real and imaginary parts
(canonicalized: -0 -> 0, every NaN one NaN) and compares them
lexicographically. Here the comparator runs on all pairs (i, j) of elements
through the ordinary complex rules (real, imag, select ...) on the (real, imag)
pair tensors, and the stable permutation is counted from that matrix as
sort.py's generic path does (O(n^2): small sizes only).
"""
from __future__ import annotations

import numpy as np

from hlo2onnx.ops.core.shape import transpose_to
from hlo2onnx.ops.sort.sort import permutation_from_less
from hlo2onnx.registry import register_complex
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import is_complex

# Largest pair matrix (elements) built.
_PAIRWISE_LIMIT = 1 << 22


@register_complex("stablehlo.sort")
def complex_sort(ctx: RuleContext, *operands, dimension: int, is_stable: bool = False):
    b = ctx.b
    shape = list(ctx.in_types[0].shape)
    rank = len(shape)
    axis = dimension % rank
    n = shape[axis]
    if n <= 1:
        return [b.op("Identity", x) for x in operands]
    moved = [d for d in range(rank) if d != axis] + [axis]
    pair_shape = [shape[d] for d in moved] + [n]
    if int(np.prod(pair_shape)) > _PAIRWISE_LIMIT:
        raise NotImplementedError(f"complex sort over {int(np.prod(shape))} elements (the comparator runs on "
                                  f"every pair; at most {_PAIRWISE_LIMIT} pairs)")
    args = []
    for x, t in zip(operands, ctx.in_types):
        pair = is_complex(t.dtype)
        moved_x = transpose_to(b, x, moved + [rank] if pair else moved)
        target = b.shape_const(pair_shape + [2] if pair else pair_shape)
        for axes in ([rank], [rank - 1]):  # lhs[..., i, j] = x_i, rhs[..., i, j] = x_j
            args.append(b.op("Expand", b.op("Unsqueeze", moved_x, b.shape_const(axes)), target))
    block = ctx.hlo_op.regions[0].blocks[0]
    first = b.graph.num_nodes()
    less = ctx.translator.emit_block(block, args, b)[0]
    for node in list(b.graph)[first:]:
        for value in node.outputs:  # the comparator is typed on scalars; here it runs on pair matrices
            value.type, value.shape = None, None
    perm = permutation_from_less(b, less, n, rank, moved)
    results = []
    for x, t in zip(operands, ctx.in_types):
        if is_complex(t.dtype):
            index = b.op("Expand", b.op("Unsqueeze", perm, b.shape_const([-1])), b.shape_const(shape + [2]))
            results.append(b.op("GatherElements", x, index, axis=axis))
        else:
            results.append(b.op("GatherElements", x, perm, axis=axis))
    return results
