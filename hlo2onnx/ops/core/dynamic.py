"""Symbolic dims (jax.export shape polymorphism) and jax.export's shape assertions.

Dynamic dims reach ONNX as dim_params; sizes known only at run time come
from `get_dimension_size` and travel as shape tensors. Only ops marked with
`allow_dynamic` (here and beside their rules) may see a dynamic dim; the others
are refused by name. Helpers for sizes computed in the graph are in dims.py.
"""
from __future__ import annotations

import re

import numpy as np
from jax.extend.mlir import ir as mlir

from hlo2onnx.ops.core.dims import known_entries
from hlo2onnx.ops.core.shape import interior_pad, iota_line, transpose_to, unsqueeze_missing
from hlo2onnx.registry import allow_dynamic, register, register_custom_call
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, set_type

_ELEMENTWISE = (
    "add subtract multiply divide remainder power maximum minimum negate abs sign exponential log sqrt rsqrt "
    "cbrt tanh sine cosine tan floor ceil round_nearest_even round_nearest_afz logistic exponential_minus_one "
    "log_plus_one is_finite and or xor not compare select clamp convert atan2 shift_left shift_right_logical "
    "shift_right_arithmetic popcnt count_leading_zeros bitcast_convert reduce_precision"
)
allow_dynamic(*(f"stablehlo.{op}" for op in _ELEMENTWISE.split()))
# These rules take their sizes from their operands, or handle -1 dims themselves.
allow_dynamic("func.call", "stablehlo.composite", "stablehlo.custom_call", "stablehlo.optimization_barrier",
              "stablehlo.transpose", "stablehlo.concatenate", "stablehlo.get_dimension_size", "stablehlo.dot_general",
              "stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.reduce",
              "stablehlo.dynamic_broadcast_in_dim", "stablehlo.dynamic_reshape", "stablehlo.dynamic_iota",
              "stablehlo.slice", "stablehlo.pad", "stablehlo.reverse", "stablehlo.real_dynamic_slice",
              "stablehlo.dynamic_pad")


@register("stablehlo.real_dynamic_slice")
def real_dynamic_slice(ctx: RuleContext, x, start, limit, strides):
    # StableHLO requires 0 <= start <= limit <= dim, which is ONNX Slice's meaning of in-range bounds.
    b = ctx.b
    rank = ctx.in_types[0].rank
    return b.op("Slice", x, b.cast(start, np.int64), b.cast(limit, np.int64), b.shape_const(list(range(rank))),
                b.cast(strides, np.int64))


@register("stablehlo.dynamic_pad")
def dynamic_pad(ctx: RuleContext, x, value, low, high, interior):
    b = ctx.b
    dtype = ctx.out_type.dtype
    spread = known_entries(interior, ctx.in_types[0].rank)
    if None in spread:
        raise NotImplementedError("interior padding computed at run time")
    # Interior padding the graph holds as constants (the gradient of a strided pooling over symbolic sizes).
    x = interior_pad(b, x, value, list(ctx.in_types[0].shape), spread, dtype)
    pads = b.op("Concat", b.cast(low, np.int64), b.cast(high, np.int64), axis=0)
    return b.typed("Pad", x, pads, value, dtype=dtype, cast=(0, 2), mode="constant")


@register("stablehlo.dynamic_iota")
def dynamic_iota(ctx: RuleContext, output_shape, *, iota_dimension):
    b = ctx.b
    shape = ctx.out_type.shape
    full = b.cast(output_shape, np.int64)
    n = None if shape[iota_dimension] >= 0 else b.op("Gather", full, b.shape_const([iota_dimension]), axis=0)
    return iota_line(b, shape, ctx.out_type.dtype, iota_dimension, n, full)


# Binary elementwise ops whose rules broadcast as ONNX does (Add, Where, Less, ...); StableHLO gives all
# their operands the result's shape.
_BROADCASTING = frozenset(f"stablehlo.{op}" for op in (
    "add subtract multiply divide remainder power maximum minimum and or xor compare select atan2").split())


def _only_broadcast_into_peers(op) -> bool:
    """Whether every user of `op`'s result is a broadcasting elementwise op whose operands of the result's type
    give ONNX's broadcast the full shape by themselves (_covers), or a dynamic_broadcast_in_dim of which that
    holds."""
    result = op.results[0]
    users = [use.owner for use in result.uses]
    for user in users:
        if user.operation.name == "stablehlo.dynamic_broadcast_in_dim" and user.operands[0] == result:
            if not _only_broadcast_into_peers(user):
                return False
            continue
        if user.operation.name not in _BROADCASTING or not _covers(user, result.type):
            return False
    return bool(users)


def _is_broadcast(value) -> bool:
    """Whether a dynamic_broadcast_in_dim computes `value` (its owner: an op's view, or a block for an argument)."""
    owner = value.owner
    return isinstance(owner, (mlir.Operation, mlir.OpView)) and owner.name == "stablehlo.dynamic_broadcast_in_dim"


def _covers(user, full) -> bool:
    """Whether `user`'s operands of type `full` make its full shape under ONNX broadcasting with every broadcast
    among them elided: one that is no broadcast does; else each dim of the result must come from some broadcast's
    operand (a dim that is not 1, or symbolic: jax types it so only where it is the result's). Elided broadcasts of
    scalars alone (1.0 * 4.0, a cotangent) would leave a scalar where the full shape is typed."""
    shape = mlir.RankedTensorType(full).shape
    covered = [d == 1 for d in shape]
    for v in user.operands:
        if v.type != full:
            continue
        if not _is_broadcast(v):
            return True
        source = v.owner.operands[0]
        if _is_broadcast(source):  # elided in turn, it may hold fewer dims than its type shows
            continue
        dims = mlir.DenseI64ArrayAttr(v.owner.attributes["broadcast_dimensions"])
        for size, d in zip(mlir.RankedTensorType(source.type).shape, dims):
            covered[d] = covered[d] or size != 1
    return all(covered)


@register("stablehlo.dynamic_broadcast_in_dim")
def dynamic_broadcast_in_dim(ctx: RuleContext, x, output_dimensions, *, broadcast_dimensions, **_hints):
    b = ctx.b
    dims = list(broadcast_dimensions)
    if _only_broadcast_into_peers(ctx.hlo_op):
        # jax spells every broadcast out under shape polymorphism (x * 0.5 broadcasts 0.5 to x's shape);
        # ONNX broadcasting does it implicitly, and the fusions (Gelu, Softmax, ...) look for the scalar.
        if ctx.in_types[0].rank == 0 or (x.shape is not None and x.shape.rank() == 0):
            return x
        # The sizes x really has (an elided broadcast before this one left unit axes its type does not show).
        have = [d if isinstance(d, int) else -1 for d in x.shape] \
            if x.shape is not None and x.shape.rank() == len(dims) else list(ctx.in_types[0].shape)
        x = transpose_to(b, x, sorted(range(len(dims)), key=dims.__getitem__))
        x = unsqueeze_missing(b, x, dims, ctx.out_type.rank)
        aligned = [1] * ctx.out_type.rank
        for i, d in enumerate(dims):
            aligned[d] = have[i]
        set_type(x, TensorType(tuple(aligned), ctx.out_type.dtype))
        return x
    x = transpose_to(b, x, sorted(range(len(dims)), key=dims.__getitem__))
    x = unsqueeze_missing(b, x, dims, ctx.out_type.rank)
    if _expands_nothing(ctx.in_types[0].shape, ctx.out_type.shape, dims):
        return x
    # Expand broadcasts both ways; the operand's dims are 1 or the output's, as StableHLO requires.
    return b.op("Expand", x, b.cast(output_dimensions, np.int64))


def _expands_nothing(have: tuple[int, ...], want: tuple[int, ...], dims: list[int]) -> bool:
    """Whether a broadcast only inserts unit axes: each operand dim lands on an equal static dim or, symbolic, on
    a symbolic one, and the other output dims are 1. jax types a symbolic operand dim of a broadcast only where
    it is the output's (its shape rule asks each operand dim to be definitely 1 or definitely the output's), so
    such a broadcast (log_softmax's keepdims sum, expand_dims over a symbolic batch) is an Unsqueeze, as the
    static translation's Reshape is."""
    mapped = dict(zip(dims, have))
    return all(w == 1 if d not in mapped else (mapped[d] < 0) == (w < 0) and (w < 0 or mapped[d] == w)
               for d, w in enumerate(want))


@register("stablehlo.dynamic_reshape")
def dynamic_reshape(ctx: RuleContext, x, output_shape):
    # allowzero: a run-time 0 is a size, never "copy the input dim".
    return ctx.b.op("Reshape", x, ctx.b.cast(output_shape, np.int64), allowzero=1)


# Metadata key of the shape assertions: one per line, as jax states them ("value >= 1 for dimension variable 'b'").
SHAPE_ASSERTIONS = "jax.shape_assertions"
# jax's assertion messages, and the condition each states.
_STATED = [
    (re.compile(r"symbolic shape constraint (.+?)\. Expected"), "{0}"),
    (re.compile(r"Expected (value >= -?\d+ for dimension variable '[^']+')"), "{0}"),
    (re.compile(r"Division had remainder \{0\} when computing the value of '([^']+)'"),
     "no remainder when computing the value of '{0}'"),
    (re.compile(r"inconsistency between dimension size (\S+) \(= \{0\}\) and the specification '([^']+)'"),
     "{0} == {1}"),
]


def _stated(message: str) -> str:
    for pattern, form in _STATED:
        found = pattern.search(message)
        if found:
            return form.format(*found.groups())
    return message.split(" Using the following")[0]


@register_custom_call("shape_assertion", dynamic=True)
def shape_assertion(ctx: RuleContext, *_inputs):
    # jax.export's shape assertions guard the symbolic dims when XLA runs the module. ONNX has no assert
    # op: they are recorded in the model's metadata, for the deployment to check or show.
    if ctx.out_types:
        raise NotImplementedError("custom call @shape_assertion with results")
    message = mlir.StringAttr(ctx.hlo_op.attributes["error_message"]).value
    stated = _stated(message)
    known = ctx.translator.metadata.get(SHAPE_ASSERTIONS, "")
    if stated not in known.split("\n"):
        ctx.translator.metadata[SHAPE_ASSERTIONS] = f"{known}\n{stated}" if known else stated
    return []
