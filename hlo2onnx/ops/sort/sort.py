"""stablehlo.sort and the top_k custom call (the float total order their keys use: core/order.py).

JAX's comparators are lexicographic over `num_keys` operands, each key compared
with LT (GT for top_k), floats under TOTALORDER after mapping -0 to 0 and every
NaN to one NaN. Such a comparator is read into a list of keys and the sort is
built from ONNX TopK, which ties equal values by index and so is stable: one
TopK per key, least significant first (an LSD radix sort over keys). top_k
arrives as such a sort followed by slices of the first k: then the last TopK
takes only k. Any other comparator is evaluated on all pairs of elements
(O(n^2), small sizes only).

ORT's TopK orders NaNs arbitrarily, so float keys are first mapped to keys
whose ordinary order is the total order. A NaN's sign can only be read by a
bit cast, which ONNX has from opset 26 on (BitCast): there -NaN sorts below
-inf as in XLA. Below opset 26 every NaN counts as +NaN, which JAX's own
canonicalization does anyway; only a raw TOTALORDER compare (lax.top_k, a
total-order compare) of a NaN whose sign bit is set then differs from XLA
(it sorts first instead of last, from the top). A key that is Neg(y) sorts by y
reversed, so that y's NaNs count as +NaN, not the Neg's (jnp.partition's top_k(-x)).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx import attrs as attr_codec
from hlo2onnx.ops.core import dims
from hlo2onnx.ops.core.order import flip_top_bit, total_order_keys
from hlo2onnx.ops.core.shape import transpose_to
from hlo2onnx.registry import RULES, allow_dynamic, register, register_custom_call
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, is_float, set_type, tensor_type

# Largest pair matrix (elements) the generic comparator path builds.
_PAIRWISE_LIMIT = 1 << 24


# -- reading the comparator ---------------------------------------------------------
@dataclass(frozen=True)
class SortKey:
    operand: int
    descending: bool
    kind: str  # "int": plain order; "canonical": floats with -0 == 0, NaNs last; "total": IEEE totalOrder


class _Unmatched(Exception):
    pass


def _producer(value: mlir.Value, name: str | None = None):
    if isinstance(value, mlir.BlockArgument):
        return None
    op = value.owner
    return op if name is None or op.operation.name == name else None


def _compare_attrs(op) -> tuple[str, str | None]:
    attributes = op.operation.attributes
    direction = stablehlo.ComparisonDirectionAttr(attributes["comparison_direction"]).value
    kind = stablehlo.ComparisonTypeAttr(attributes["compare_type"]).value if "compare_type" in attributes else None
    return direction, kind


def _splat(value: mlir.Value) -> float | None:
    """The scalar a splat constant holds (read as a float attribute: bf16 has no numpy reading)."""
    op = _producer(value, "stablehlo.constant")
    if op is None or not op.operation.attributes["value"].is_splat:
        return None
    scalar = op.operation.attributes["value"].get_splat_value()
    return scalar.value if isinstance(scalar, mlir.FloatAttr) else None


def _view(value: mlir.Value) -> tuple[int, bool]:
    """(block argument number, canonicalized) for an argument or JAX's `_canonicalize_float_for_sort` of one.

    That is select(x != x, NaN, select(x == 0, 0, x)).
    """
    if isinstance(value, mlir.BlockArgument):
        return value.arg_number, False
    outer = _producer(value, "stablehlo.select")
    if outer is not None:
        is_nan, nan, inner = outer.operands
        inner_op, is_nan_op = _producer(inner, "stablehlo.select"), _producer(is_nan, "stablehlo.compare")
        if inner_op is not None and is_nan_op is not None:
            is_zero, zero, arg = inner_op.operands
            is_zero_op = _producer(is_zero, "stablehlo.compare")
            nan_c, zero_c = _splat(nan), _splat(zero)
            if (isinstance(arg, mlir.BlockArgument) and is_zero_op is not None
                    and _compare_attrs(is_nan_op)[0] == "NE" and list(is_nan_op.operands) == [arg, arg]
                    and _compare_attrs(is_zero_op)[0] == "EQ" and is_zero_op.operands[0] == arg
                    and _splat(is_zero_op.operands[1]) == 0 and nan_c is not None and np.isnan(nan_c)
                    and zero_c == 0 and not np.signbit(zero_c)):
                return arg.arg_number, True
    raise _Unmatched


def _key_of(op, directions: tuple[str, ...]) -> tuple[SortKey, str]:
    """The key a `compare` orders by, and its compare type."""
    if op is None:
        raise _Unmatched
    direction, compare_type = _compare_attrs(op)
    if direction not in directions:
        raise _Unmatched
    (lhs, lhs_canon), (rhs, rhs_canon) = _view(op.operands[0]), _view(op.operands[1])
    if lhs_canon != rhs_canon or lhs // 2 != rhs // 2 or lhs == rhs:
        raise _Unmatched
    if lhs % 2:  # compare(y, x): the same key, the other way round
        direction = {"LT": "GT", "GT": "LT", "EQ": "EQ"}[direction]
    if compare_type in ("SIGNED", "UNSIGNED"):
        kind = "int"
    elif compare_type == "TOTALORDER" and not lhs_canon:
        kind = "total"
    else:  # FLOAT compares leave NaNs unordered; XLA's order for them is unspecified
        kind = "canonical"
    return SortKey(lhs // 2, direction == "GT", kind), compare_type


def _lexicographic(value: mlir.Value) -> list[SortKey]:
    """or(k0 < k0', and(k0 == k0', rest)), as `lax.sort(num_keys=n)` builds it, or one compare."""
    op = _producer(value)
    if op is None:
        raise _Unmatched
    name = op.operation.name
    if name == "stablehlo.compare":
        return [_key_of(op, ("LT", "GT"))[0]]
    if name != "stablehlo.or":
        raise _Unmatched
    for first, rest in (op.operands, reversed(list(op.operands))):
        try:
            key, compare_type = _key_of(_producer(first, "stablehlo.compare"), ("LT", "GT"))
        except _Unmatched:
            continue
        both = _producer(rest, "stablehlo.and")
        if both is None:
            continue
        for eq, tail in (both.operands, reversed(list(both.operands))):
            try:
                eq_key, eq_type = _key_of(_producer(eq, "stablehlo.compare"), ("EQ",))
            except _Unmatched:
                continue
            if eq_key.operand == key.operand and eq_key.kind == key.kind and eq_type == compare_type:
                return [key, *_lexicographic(tail)]
    raise _Unmatched


def comparator_keys(block: mlir.Block) -> list[SortKey] | None:
    """The lexicographic keys a comparator orders by, or None when it is not of that form."""
    ret = list(block.operations)[-1]
    try:
        keys = _lexicographic(ret.operands[0])
    except _Unmatched:
        return None
    return keys if len({k.operand for k in keys}) == len(keys) else None


def _topk_indices(b, key: ir.Value, dtype: np.dtype, n: dims.Dim, axis: int, descending: bool) -> ir.Value:
    if dtype == np.uint64:
        key, dtype = flip_top_bit(b, key), np.dtype(np.int64)
    key = b.cast(key, b.target.compute_dtype("TopK", dtype))
    k = b.shape_const([n]) if isinstance(n, int) else n  # a symbolic axis: its size read from the graph
    _, indices = b.ops("TopK", key, k, num_outputs=2, axis=axis, largest=int(descending), sorted=1)
    return indices


def _order_keys(b, x: ir.Value, dtype: np.dtype, kind: str) -> list[tuple[ir.Value, np.dtype]]:
    if kind == "int" or not is_float(dtype):
        return [(x, dtype)]
    return total_order_keys(b, x, dtype, kind == "canonical")


def _key_source(x: ir.Value, dtype: np.dtype, key: SortKey) -> tuple[ir.Value, bool]:
    """(value, descending) to sort by. A total order on Neg(y) is y's reversed, NaNs included: y's NaNs, which
    count as +NaN where their sign cannot be read, are -NaN after the Neg and so last from the top, as in XLA
    (jnp.partition and argpartition take the k smallest as top_k(-x): x's NaNs came first, before x's values)."""
    if key.kind == "total" and is_float(dtype) and (y := _negated(x)) is not None:
        return y, not key.descending
    return x, key.descending


def _negated(x: ir.Value) -> ir.Value | None:
    """y where x is Neg(y), or Cast(Neg(Cast(y))) (a Neg run in a wider type)."""
    node = x.producer()
    if node is None or node.domain != "" or node.op_type not in ("Neg", "Cast"):
        return None
    if node.op_type == "Neg":
        return node.inputs[0]
    inner = node.inputs[0].producer()
    if inner is None or inner.domain != "" or inner.op_type != "Neg":
        return None
    widen = inner.inputs[0].producer()
    if widen is None or widen.domain != "" or widen.op_type != "Cast" or widen.inputs[0].dtype != x.dtype:
        return None
    return widen.inputs[0]


def keys_permutation(b, operands, dtypes, keys: list[SortKey], n: dims.Dim, axis: int, first: dims.Dim) -> ir.Value:
    """Indices of the first `first` elements in `keys` order along `axis`: stable TopKs, least significant first."""
    passes = [(part, dtype, descending) for key in keys
              for source, descending in [_key_source(operands[key.operand], dtypes[key.operand], key)]
              for part, dtype in _order_keys(b, source, dtypes[key.operand], key.kind)]
    perm = None
    for i, (part, dtype, descending) in enumerate(reversed(passes)):
        current = part if perm is None else b.op("GatherElements", part, perm, axis=axis)
        indices = _topk_indices(b, current, dtype, first if i == len(passes) - 1 else n, axis, descending)
        perm = indices if perm is None else b.op("GatherElements", perm, indices, axis=axis)
    return perm


def _prefix_used(op, axis: int, n: int) -> int:
    """k when every use of the sort's results is a slice of the first k along `axis` (top_k's form), else n."""
    first = 0
    for result in op.results:
        for use in result.uses:
            user = use.owner
            if user.operation.name != "stablehlo.slice":
                return n
            decoded = attr_codec.decode_all(user)
            full = list(tensor_type(result.type).shape)
            limits = list(decoded["limit_indices"])
            if any(decoded["start_indices"]) or any(s != 1 for s in decoded["strides"]) or \
                    limits[:axis] + limits[axis + 1:] != full[:axis] + full[axis + 1:]:
                return n
            first = max(first, limits[axis])
    return first or n


def _pairwise_permutation(ctx: RuleContext, operands, n: int, axis: int) -> ir.Value:
    """Sorts by evaluating the comparator on every pair (i, j); stable by index."""
    b = ctx.b
    shape = list(ctx.in_types[0].shape)
    rank = len(shape)
    moved = [d for d in range(rank) if d != axis] + [axis]
    pair_shape = [shape[d] for d in moved] + [n]
    if int(np.prod(pair_shape)) > _PAIRWISE_LIMIT:
        raise NotImplementedError(f"sort with a non-lexicographic comparator over {n} elements")
    args = []
    for x in operands:
        moved_x = transpose_to(b, x, moved)
        for axes in ([rank], [rank - 1]):  # lhs[..., i, j] = x_i, rhs[..., i, j] = x_j
            args.append(b.op("Expand", b.op("Unsqueeze", moved_x, b.shape_const(axes)), b.shape_const(pair_shape)))
    less = _emit_pairwise(ctx, ctx.hlo_op.regions[0].blocks[0], args, pair_shape)
    return permutation_from_less(b, less, n, rank, moved)


def permutation_from_less(b, less: ir.Value, n: int, rank: int, moved: list[int]) -> ir.Value:
    """The stable sort permutation from less[..., i, j] = comp(x_i, x_j) over the sorted axis moved last."""
    swap = list(range(rank - 1)) + [rank, rank - 1]
    greater = b.op("Transpose", less, perm=swap)  # greater[i, j] = comp(x_j, x_i): j goes before i
    line = b.op("Range", b.const(0, np.int64), b.const(n, np.int64), b.const(1, np.int64))
    j_before_i = b.op("Less", b.op("Unsqueeze", line, b.shape_const([0])), b.op("Unsqueeze", line, b.shape_const([1])))
    # j goes before i if comp(x_j, x_i), or if they tie and j comes first.
    before = b.op("Or", greater, b.op("And", j_before_i, b.op("Not", less)))
    # Counts below n, summed in a float type that holds them exactly (integer ReduceSum is a `wrong` kernel:
    # ORT sums through float64 and saturates); TopK orders the distinct counts as they are.
    count_dtype = np.float32 if n < 2 ** 24 else np.float64
    position = b.op("ReduceSum", b.cast(before, count_dtype), b.shape_const([rank]), keepdims=0)
    _, perm = b.ops("TopK", position, b.shape_const([n]), num_outputs=2, axis=-1, largest=0, sorted=1)
    return transpose_to(b, perm, [moved.index(d) for d in range(rank)])


def _emit_pairwise(ctx: RuleContext, block: mlir.Block, args: list[ir.Value], shape: list[int]) -> ir.Value:
    """Translates a scalar comparator on pair matrices: each op's rule sees the matrix shape."""

    env = dict(zip(block.arguments, args))
    for op in block.operations:
        name = op.operation.name
        if name == "stablehlo.return":
            return env[op.operands[0]]
        rule = RULES.get(name)
        if rule is None:
            raise NotImplementedError(f"sort comparator containing {name}")
        widen = lambda v: TensorType(tuple(shape), tensor_type(v.type).dtype)  # noqa: E731
        sub = RuleContext(ctx.b, op.operation, [widen(v) for v in op.operands], [widen(r) for r in op.results],
                          ctx.translator)
        attributes = attr_codec.decode_all(op)
        if attr_codec.unknown(rule, attributes):
            raise NotImplementedError(f"sort comparator's {name} with unknown attribute(s) "
                                      f"{', '.join(attr_codec.unknown(rule, attributes))}")
        outputs = rule(sub, *[env[v] for v in op.operands], **attributes)
        outputs = [outputs] if isinstance(outputs, ir.Value) else list(outputs)
        for result, value, ttype in zip(op.results, outputs, sub.out_types):
            if value.type is None:
                set_type(value, ttype)
            env[result] = value
    raise NotImplementedError("sort comparator without a return")


def _gather(ctx: RuleContext, index: int, x: ir.Value, perm: ir.Value, axis: int) -> ir.Value:
    """x reordered by perm; an iota along the axis (argsort's, top_k's indices) is perm itself."""
    source = _producer(ctx.hlo_op.operands[index], "stablehlo.iota") or \
        _producer(ctx.hlo_op.operands[index], "stablehlo.dynamic_iota")
    if source is not None and source.operation.attributes["iota_dimension"].value == axis:
        return ctx.b.cast(perm, ctx.in_types[index].dtype)
    return ctx.b.op("GatherElements", x, perm, axis=axis)


allow_dynamic("stablehlo.sort")


@register("stablehlo.sort")
def sort(ctx: RuleContext, *operands, dimension: int, is_stable: bool = False):
    b = ctx.b
    shape = ctx.in_types[0].shape
    axis = dimension % len(shape)
    n = shape[axis]
    if 0 <= n <= 1:
        return [b.op("Identity", x) for x in operands]
    dtypes = [t.dtype for t in ctx.in_types]
    keys = comparator_keys(ctx.hlo_op.regions[0].blocks[0])
    # Stable either way: an unstable sort may order ties any way it likes.
    if keys is not None and n < 0:  # TopK over all of a symbolic axis, its length read at run time
        size = dims.dim(b, operands[0], axis, n)
        perm = keys_permutation(b, operands, dtypes, keys, size, axis, size)
        return [_gather(ctx, i, x, perm, axis) for i, x in enumerate(operands)]
    if keys is None:
        dims.refuse(ctx, range(len(shape)), "a sort whose comparator is not lexicographic keys")
        perm = _pairwise_permutation(ctx, operands, n, axis)
        return [b.op("GatherElements", x, perm, axis=axis) for x in operands]
    # top_k arrives as a sort whose results are only sliced to the first k: sort only those. The
    # results are then shorter than the sort's type says, which the slices (all their users) accept.
    first = _prefix_used(ctx.hlo_op, axis, n)
    perm = keys_permutation(b, operands, dtypes, keys, n, axis, first)
    results = [_gather(ctx, i, x, perm, axis) for i, x in enumerate(operands)]
    for value, ttype in zip(results, ctx.out_types):
        set_type(value, ttype._replace(shape=ttype.shape[:axis] + (first,) + ttype.shape[axis + 1:]))
    return results


@register_custom_call("stablehlo.dynamic_top_k", dynamic=True)
def dynamic_top_k(ctx: RuleContext, x, k):
    """lax.top_k with k computed from symbolic dims (jnp.partition along a symbolic axis): chlo.top_k's stable
    sort along the last axis, descending in IEEE totalOrder, with TopK's k taken at run time."""
    b = ctx.b
    shape, dtype = ctx.in_types[0].shape, ctx.in_types[0].dtype
    axis = len(shape) - 1
    key = SortKey(0, True, "total" if is_float(dtype) else "int")
    first = b.op("Reshape", b.cast(k, np.int64), b.shape_const([1]))
    perm = keys_permutation(b, [x], [dtype], [key], dims.dim(b, x, axis, shape[axis]), axis, first)
    return [b.op("GatherElements", x, perm, axis=axis), b.cast(perm, ctx.out_types[1].dtype)]
