"""The pair representation of complex values: a complex tensor is held as a float tensor with a trailing axis of
2 (real, imag); arithmetic works on its (real, imag) planes, `Z`, each of shape S + (1,)."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, real_dtype


class Z(NamedTuple):
    """A complex value as two planes of shape S + (1,): they broadcast against each other and join by Concat."""

    re: ir.Value
    im: ir.Value


def as_pairs(ctx: RuleContext):
    """`ctx` as a rule sees it when it runs on the pair tensors: the storage types."""
    return dataclasses.replace(ctx, in_types=[t.storage for t in ctx.in_types],
                               out_types=[t.storage for t in ctx.out_types])


def split(b, x: ir.Value) -> Z:
    re, im = b.ops("Split", x, b.shape_const([1, 1]), num_outputs=2, axis=-1)
    return Z(re, im)


def join(b, z: Z) -> ir.Value:
    return b.op("Concat", z.re, z.im, axis=-1)


def part(b, x: ir.Value, index: int) -> ir.Value:
    """The real (0) or imaginary (1) part of a pair tensor, without the pair axis."""
    return b.op("Gather", x, b.const(np.int64(index)), axis=-1)


def from_real(b, x: ir.Value, ttype: TensorType, dtype: np.dtype) -> ir.Value:
    """The pair tensor of real `x` (of type `ttype`) as complex `dtype`: a zero imaginary part, even for NaN."""
    x = b.op("Unsqueeze", b.cast(x, real_dtype(dtype)), b.shape_const([-1]))
    return b.op("Concat", x, b.splat(0, real_dtype(dtype), ttype.shape + (1,)), axis=-1)


def real_type(t: TensorType) -> TensorType:
    """The type of one part of a complex `t`: its shape, the real dtype."""
    return TensorType(t.shape, real_dtype(t.dtype))
