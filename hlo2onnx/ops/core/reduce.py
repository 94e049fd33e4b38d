"""stablehlo.reduce: single reducers, and the variadic argmax/argmin form."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.ops.core.order import flip_top_bit
from hlo2onnx.ops.core.shape import transpose_to
from hlo2onnx.registry import register
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import is_bool, is_float, onnx_dtype

_REDUCERS = {
    "stablehlo.add": ("ReduceSum", "Add"),
    "stablehlo.multiply": ("ReduceProd", "Mul"),
    "stablehlo.maximum": ("ReduceMax", "Max"),
    "stablehlo.minimum": ("ReduceMin", "Min"),
    "stablehlo.and": ("ReduceMin", "And"),  # on bool; integer and/or go through _BITWISE
    "stablehlo.or": ("ReduceMax", "Or"),
}
# ONNX has no bitwise reductions: integer and/or/xor and bool xor combine pairwise (exact_reduce).
_BITWISE = {"stablehlo.and": "BitwiseAnd", "stablehlo.or": "BitwiseOr", "stablehlo.xor": "BitwiseXor"}


def _identity(reducer: str, dtype: np.dtype):
    if reducer in ("stablehlo.add", "stablehlo.or", "stablehlo.xor"):
        return 0
    if reducer == "stablehlo.and" and not is_bool(dtype):
        return np.invert(np.zeros((), dtype))  # every bit set
    if reducer in ("stablehlo.multiply", "stablehlo.and"):
        return 1
    high = np.inf if is_float(dtype) else (True if is_bool(dtype) else np.iinfo(dtype).max)
    low = -np.inf if is_float(dtype) else (False if is_bool(dtype) else np.iinfo(dtype).min)
    return low if reducer == "stablehlo.maximum" else high


def single_reducer(body) -> str | None:
    """The name of the binary op a one-op reduction body applies to its two arguments, if that is all it does."""
    ops = list(body.operations)
    if len(ops) != 2:
        return None
    op, ret = ops
    args = list(body.arguments)
    if list(op.operands) != args or list(ret.operands) != list(op.results):
        return None
    return op.operation.name


def is_constant(value, scalar) -> bool:
    tensor = value.const_value
    if tensor is None:
        return False
    array = tensor.numpy()
    return array.size == 1 and bool(array.reshape(()) == np.asarray(scalar, dtype=array.dtype))


@register("stablehlo.reduce")
def reduce(ctx: RuleContext, *operands, dimensions):
    count = len(operands) // 2
    if any(ctx.in_types[0].shape[d] == 0 for d in dimensions):
        # Nothing to combine: XLA gives `init` everywhere (ORT refuses some empty reductions, bool ReduceMin).
        out_shape = ctx.b.shape_const(ctx.out_type.shape)
        return [ctx.b.typed("Expand", init, out_shape, dtype=t.dtype, cast=(0,))
                for init, t in zip(operands[count:], ctx.out_types)]
    body = ctx.hlo_op.regions[0].blocks[0]
    reducers = separable_reducers(body, count)
    if reducers is None and count == 2:
        return _arg_reduce(ctx, *operands, dimensions=dimensions, body=body)
    if reducers is None and count == 1:
        raise NotImplementedError(f"reduce with body {[op.operation.name for op in body.operations]}")
    if reducers is None:
        raise NotImplementedError(f"variadic reduce over {count} operands whose results depend on each other")
    return [_reduce_one(ctx, x, init, reducer, list(ctx.in_types[i].shape), ctx.out_types[i].shape,
                        ctx.out_types[i].dtype, dimensions)
            for i, (x, init, reducer) in enumerate(zip(operands[:count], operands[count:], reducers))]


def separable_reducers(body, count: int) -> list[str] | None:
    """For a body that combines each (accumulator i, element i) pair on its own with one binary op (a tuple of
    independent reductions, as `lax.reduce` over several operands writes it), those ops' names; else None."""
    args = list(body.arguments)
    ops = list(body.operations)
    if len(ops) != count + 1 or len(args) != 2 * count:
        return None
    ret = ops[-1]
    reducers = []
    for i, value in enumerate(ret.operands):
        op = value.owner
        if isinstance(op, mlir.Block) or op.operation.name not in _COMMUTATIVE or len(op.operands) != 2:
            return None
        operands = list(op.operands)
        if operands != [args[i], args[count + i]] and (
                operands != [args[count + i], args[i]] or op.operation.name not in _COMMUTATIVE):
            return None
        reducers.append(op.operation.name)
    return reducers


_COMMUTATIVE = set(_REDUCERS) | set(_BITWISE)  # add, multiply, maximum, minimum, and, or, xor


def _reduce_one(ctx: RuleContext, x, init, reducer, in_shape, out_shape, dtype, dimensions):
    """One reduction of `x` over `dimensions` by `reducer` (a stablehlo op name), starting from `init`."""
    if is_bool(dtype):  # on pred, max is or and min is and
        reducer = {"stablehlo.maximum": "stablehlo.or", "stablehlo.minimum": "stablehlo.and"}.get(reducer, reducer)
    if reducer in _BITWISE and (reducer == "stablehlo.xor" or not is_bool(dtype)):
        return _reduce_bitwise(ctx.b, x, init, reducer, in_shape, dimensions, dtype)
    if reducer not in _REDUCERS:
        raise NotImplementedError(f"reduce with body {reducer}")
    reduce_op, combine_op = _REDUCERS[reducer]
    if is_bool(dtype) and reduce_op in ("ReduceSum", "ReduceProd"):  # XLA's add/mul on pred are or/and
        reduce_op, combine_op = ("ReduceMax", "Or") if reduce_op == "ReduceSum" else ("ReduceMin", "And")
    b = ctx.b
    # Only Max/Min are variadic in ONNX; bool or/and (And, Or) take two inputs.
    pieces = _single_slices(x, dimensions) if combine_op in ("Max", "Min") else None
    if not dimensions:
        result = b.op("Identity", x)
    elif reduce_op in ("ReduceSum", "ReduceProd") and not is_float(dtype):
        result = exact_reduce(b, x, combine_op, in_shape, dimensions, dtype)
    elif pieces:
        # max/min over a few concatenated slices (jnp.min(jnp.array([a, b]))): ONNX's variadic Max/Min
        # propagate NaN as XLA does, so no NaN check is needed.
        shape = b.shape_const(out_shape)
        result = b.typed(combine_op, *(b.op("Reshape", piece, shape) for piece in pieces), dtype=dtype)
    else:
        result = b.typed(reduce_op, x, b.shape_const(dimensions), dtype=dtype, cast=(0,), keepdims=0)
        if reduce_op in ("ReduceMax", "ReduceMin") and is_float(dtype):
            result = _propagate_nan(b, x, result, dimensions, dtype)
    if is_constant(init, _identity(reducer, dtype)):
        return result
    if is_bool(dtype):
        return b.op(combine_op, result, init)
    return b.typed(combine_op, result, init, dtype=dtype)


def _reduce_bitwise(b, x, init, reducer: str, in_shape, dimensions, dtype: np.dtype) -> ir.Value:
    combine_op = "Xor" if is_bool(dtype) else _BITWISE[reducer]
    result = exact_reduce(b, x, combine_op, in_shape, dimensions, dtype) if dimensions else b.op("Identity", x)
    if is_constant(init, _identity(reducer, dtype)):
        return result
    return b.op(combine_op, result, init)


def exact_reduce(b, x: ir.Value, combine_op: str, shape: list[int], axes, dtype: np.dtype) -> ir.Value:
    """Integer sum or product (or bitwise reduction) over `axes` (none of size 0) with ops that wrap like
    XLA, in any order.

    ORT's integer ReduceSum/ReduceProd go through float64 and saturate (hlo2onnx/targets/ort.py). A static
    axis halves in place, Add/Mul of its two halves, log2(n) times; a dynamic one sums by a MatMul with ones.
    """
    for axis in axes:
        n = shape[axis]
        if n < 0:
            if combine_op != "Add":
                what = "product" if combine_op == "Mul" else f"reduction by {combine_op}"
                raise NotImplementedError(f"integer {what} over a dynamic axis (no ONNX Reduce op computes it "
                                          "exactly: ORT's ReduceProd saturates)")
            x = _sum_by_matmul(b, x, len(shape), axis, dtype)
            continue
        while n > 1:
            half = n // 2
            y = b.typed(combine_op, _axis_slice(b, x, axis, 0, half), _axis_slice(b, x, axis, half, 2 * half),
                        dtype=dtype)
            if n % 2:
                y = b.op("Concat", y, _axis_slice(b, x, axis, 2 * half, n), axis=axis)
            x, n = y, half + n % 2
    return b.op("Squeeze", x, b.shape_const(sorted(axes)))


def _sum_by_matmul(b, x: ir.Value, rank: int, axis: int, dtype: np.dtype) -> ir.Value:
    """x summed over `axis`, kept as size 1: x @ ones(n, 1) along that axis (ORT's integer MatMul wraps)."""
    perm = [d for d in range(rank) if d != axis] + [axis]
    moved = transpose_to(b, x, perm)
    n = b.op("Shape", x, start=axis, end=axis + 1)
    ones = b.op("ConstantOfShape", b.op("Concat", n, b.shape_const([1]), axis=0),
                value=ir.tensor(np.ones(1, dtype)))
    total = b.typed("MatMul", moved, ones, dtype=dtype)
    return transpose_to(b, total, [int(i) for i in np.argsort(perm)])


def _axis_slice(b, x: ir.Value, axis: int, start: int, stop: int) -> ir.Value:
    return b.op("Slice", x, b.shape_const([start]), b.shape_const([stop]), b.shape_const([axis]))


_MAX_PIECES = 8


def _single_slices(x, dimensions) -> list | None:
    """The inputs of the Concat that made `x`, when it joined slices of size 1 along the one reduced dim."""
    concat = x.producer()
    if len(dimensions) != 1 or concat is None or concat.op_type != "Concat" or len(concat.inputs) > _MAX_PIECES:
        return None
    rank = len(x.shape)
    if concat.attributes["axis"].as_int() % rank != dimensions[0]:
        return None
    if any(piece.shape is None or piece.shape[dimensions[0]] != 1 for piece in concat.inputs):
        return None
    return list(concat.inputs)


def _propagate_nan(b, x, result, dimensions, dtype):
    """XLA's max/min reductions return NaN if any input is NaN; ORT's skip NaNs after the first element."""
    nan = b.cast(b.typed("IsNaN", x, dtype=dtype, result_dtype=bool), np.uint8)
    any_nan = b.cast(b.op("ReduceMax", nan, b.shape_const(dimensions), keepdims=0), np.bool_)
    return b.typed("Where", any_nan, b.const(np.nan, dtype), result, dtype=dtype, cast=(1, 2))


def _arg_reduce(ctx: RuleContext, x, indices, x_init, index_init, *, dimensions, body):
    """JAX's argmax/argmin: (values, iota) reduced with a compare-select body.

    The first extreme wins ties; for floats the first NaN wins, as in JAX.
    """
    direction = _first_compare_direction(body)
    if len(dimensions) != 1 or direction not in ("GT", "LT") or _iota_dimension(ctx.hlo_op.operands[1]) != dimensions[0]:
        raise NotImplementedError("variadic reduce that is not JAX's argmax/argmin")
    b = ctx.b
    axis = dimensions[0]
    dtype = ctx.in_types[0].dtype
    unsigned64 = dtype == np.uint64
    if unsigned64:  # ORT runs these in int64: flip the top bit so that int64 order is uint64 order
        x, dtype = flip_top_bit(b, x), np.dtype(np.int64)
    arg_op, value_op = ("ArgMax", "ReduceMax") if direction == "GT" else ("ArgMin", "ReduceMin")
    index = b.typed(arg_op, x, dtype=dtype, result_dtype=np.int64, axis=axis, keepdims=0, select_last_index=0)
    values = b.typed(value_op, x, b.shape_const([axis]), dtype=dtype, cast=(0,), keepdims=0)
    if is_float(dtype):
        nan = b.cast(b.typed("IsNaN", x, dtype=dtype, result_dtype=bool), np.int32)
        first_nan = b.op("ArgMax", nan, axis=axis, keepdims=0, select_last_index=0)
        any_nan = b.op("Cast", b.op("ReduceMax", nan, b.shape_const([axis]), keepdims=0), to=onnx_dtype(np.bool_))
        index = b.op("Where", any_nan, first_nan, index)
        values = b.typed("Where", any_nan, b.const(np.nan, dtype), values, dtype=dtype, cast=(1, 2))
    if unsigned64:
        values = flip_top_bit(b, values, back=True)
    return values, b.cast(index, ctx.out_types[1].dtype)


def _iota_dimension(value: mlir.Value) -> int | None:
    """The dimension along which `value` counts 0, 1, 2...: an iota's, or (in XLA HLO text, whose argmax
    broadcasts a 1-d iota) the dimension a broadcast_in_dim puts a 1-d iota's on."""
    op = value.owner
    if isinstance(op, mlir.Block):
        return None
    if op.name in ("stablehlo.iota", "stablehlo.dynamic_iota"):
        return op.attributes["iota_dimension"].value
    if op.name == "stablehlo.broadcast_in_dim" and _iota_dimension(op.operands[0]) == 0 \
            and len(op.operands[0].type.shape) == 1:
        dimension = op.attributes["broadcast_dimensions"][0]
        # a size-1 iota spread along the dimension is zeros there, not a count
        return dimension if op.operands[0].type.shape[0] == op.result.type.shape[dimension] else None
    return None


def _first_compare_direction(body) -> str | None:
    value_lhs, value_rhs = body.arguments[0], body.arguments[2]
    for op in body.operations:
        if op.operation.name == "stablehlo.compare" and list(op.operands) == [value_lhs, value_rhs]:
            return stablehlo.ComparisonDirectionAttr(op.attributes["comparison_direction"]).value
    return None
