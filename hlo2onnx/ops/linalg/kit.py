"""The kit the linear-algebra rules share (every module of linalg/): batched
(B, rows, cols) views, matrices as planes (one real matrix, or a complex one's real and imaginary parts), index
constants, Householder reflectors and LAPACK's info (their ONNX Loops: control/loops.py)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx_ir as ir

from hlo2onnx.builder import Builder
from hlo2onnx.ops.complex.arithmetic import divide, multiply
from hlo2onnx.ops.complex.pairs import Z
from hlo2onnx.ops.control.loops import loop_step
from hlo2onnx.ops.core import dims
from hlo2onnx.ops.core.shape import merged, reshape_to
from hlo2onnx.types import TensorType, is_float

_INT64_MIN = np.iinfo(np.int64).min
_TRANSPOSED = [0, 2, 1]


def compute_dtype(dtype: np.dtype) -> np.dtype:
    if not is_float(dtype):  # bfloat16 is a float whose numpy kind is "V"
        raise NotImplementedError(f"{np.dtype(dtype)} matrices are not supported")
    # f16/bf16 (only stablehlo.triangular_solve sees them) are solved in f32 and rounded once.
    return np.dtype(dtype) if np.dtype(dtype).itemsize >= 4 else np.dtype(np.float32)


def flat(b: Builder, x: ir.Value, ttype: TensorType, core: int, dtype: np.dtype) -> ir.Value:
    """(batch..., *core dims) -> (B, *core dims) in the compute dtype (B is -1 where a batch dim is symbolic)."""
    shape = ttype.shape
    return reshape_to(b, b.cast(x, dtype), [merged(shape[:len(shape) - core]), *shape[len(shape) - core:]])


def unflat(b: Builder, x: ir.Value, ttype: TensorType, like: ir.Value | None = None) -> ir.Value:
    """The inverse of flat, for a result of type `ttype`; several symbolic batch dims are read from `like`, a
    value with the same leading batch dims (the operand)."""
    x = unbatched(b, x, list(ttype.shape), like)
    return x if compute_dtype(ttype.dtype) == ttype.dtype else b.cast(x, ttype.dtype)


def unbatched(b: Builder, x: ir.Value, shape: list[int], like: ir.Value | None) -> ir.Value:
    """Reshapes x to `shape`, whose -1s (symbolic batch dims) are `like`'s leading dims where there are several
    (a Reshape spells one -1 itself)."""
    if sum(d < 0 for d in shape) <= 1:
        return reshape_to(b, x, shape)
    if like is None:
        raise NotImplementedError("a result with several symbolic batch dimensions")
    return dims.reshape(b, x, dims.dims(b, like, shape))


def batch_shape(b: Builder, like: ir.Value, batch: int, *rest: int) -> ir.Value:
    """The shape (batch, *rest) as a tensor: a constant, or with a symbolic batch (-1) `like`'s first dim read at
    run time (`like`: a (B, ...) value, such as a Loop's carried matrices)."""
    if batch >= 0:
        return b.shape_const([batch, *rest])
    return dims.shape_value(b, [b.op("Shape", like, start=0, end=1), *rest])


Planes = list  # a real matrix as [x], a complex one as [real, imag]


def planes(b: Builder, x: ir.Value, ttype: TensorType, core: int, dtype: np.dtype) -> Planes:
    """`flat` for each plane of an input: [x] if real, [real, imag] if complex (held as pairs)."""
    if ttype.storage.shape == ttype.shape:
        return [flat(b, x, ttype, core, dtype)]
    plane_type = TensorType(ttype.shape, dtype)
    return [flat(b, b.op("Gather", x, b.const(np.int64(i)), axis=-1), plane_type, core, dtype) for i in (0, 1)]


def join(b: Builder, x: Planes, ttype: TensorType) -> ir.Value:
    """Planes -> a result of type `ttype` (complex ones as (real, imag) pairs)."""
    if len(x) == 1:
        return unflat(b, x[0], ttype)
    pairs = b.op("Concat", *(b.op("Unsqueeze", v, b.shape_const([-1])) for v in x), axis=-1)
    return reshape_to(b, pairs, list(ttype.storage.shape))


def conj(b: Builder, x: Planes) -> Planes:
    return x if len(x) == 1 else [x[0], b.op("Neg", x[1])]


def adjoint(b: Builder, x: Planes) -> Planes:
    return conj(b, [transposed(b, v) for v in x])


def matmul(b: Builder, x: Planes, y: Planes) -> Planes:
    if len(x) == 1:
        return [b.op("MatMul", x[0], y[0])]
    (xr, xi), (yr, yi) = x, y
    return [b.op("Sub", b.op("MatMul", xr, yr), b.op("MatMul", xi, yi)),
            b.op("Add", b.op("MatMul", xr, yi), b.op("MatMul", xi, yr))]


def sum_squares(b: Builder, x: Planes, axes: list[int], keepdims: int = 1) -> ir.Value:
    """Sum of |x|^2 over `axes`, both planes of a complex x."""
    sums = [b.op("ReduceSumSquare", v, b.shape_const(axes), keepdims=keepdims) for v in x]
    return sums[0] if len(sums) == 1 else b.op("Add", *sums)


def reflector(b: Builder, x: Planes, row: ir.Value, j: ir.Value, dtype: np.dtype) -> tuple[Planes, ir.Value]:
    """The Householder reflector I - scale v v^H that maps the (B, m, 1) column x, zero above row j, to
    beta e_j: v and scale = 2 / v^H v, 0 (the identity) for a zero x. beta = -phase(x_j) ||x|| (phase(0) = 1), so
    v = x - beta e_j has no cancellation at j. `row`: iota (m, 1); j: the scalar row index."""
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    alpha = [b.op("Gather", v, loop_step(b, j), axis=1) for v in x]
    norm = b.op("Sqrt", sum_squares(b, x, [1]))
    size = b.op("Sqrt", b.op("Add", *(b.op("Mul", v, v) for v in alpha))) if len(x) > 1 else b.op("Abs", alpha[0])
    nonzero = b.op("Greater", size, zero)
    phase = [b.op("Where", nonzero, b.op("Div", alpha[0], b.op("Where", nonzero, size, one)), one)]
    if len(x) > 1:
        phase.append(b.op("Where", nonzero, b.op("Div", alpha[1], b.op("Where", nonzero, size, one)), zero))
    v = [b.op("Where", b.op("Equal", row, j), b.op("Add", a, b.op("Mul", ph, norm)), xv)
         for a, ph, xv in zip(alpha, phase, x)]
    vv = sum_squares(b, v, [1])
    two = b.const(np.asarray(2, dtype))
    empty = b.op("Equal", vv, zero)
    return v, b.op("Where", empty, zero, b.op("Div", two, b.op("Where", empty, two, vv)))


def times(b: Builder, x: Planes, y: Planes, dtype: np.dtype) -> Planes:
    """The elementwise product of planes."""
    return [b.op("Mul", x[0], y[0])] if len(x) == 1 else list(multiply(b, dtype, Z(*x), Z(*y)))


def larfg(b: Builder, columns: Planes, row: ir.Value, j: ir.Value, dtype: np.dtype) -> tuple[Planes, Planes, Planes]:
    """LAPACK's larfg (zlarfg for complex planes) on the entries from row j down of the (B, m, 1) columns (those
    above are ignored): H = I - tau v v^H with H^H x = beta e_j, beta = -sign(re alpha) ||x||. Returns v (zero above
    j, a unit head at j, the tail scaled by 1 / (alpha - beta)), tau = (beta - alpha) / beta, and the new head:
    beta, or alpha where nothing is left to annihilate (tau = 0, H = I). `row`: iota (m, 1); j: a scalar index."""
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    alpha = [b.op("Gather", c, loop_step(b, j), axis=1) for c in columns]
    below, at = b.op("Greater", row, j), b.op("Equal", row, j)
    tails = [b.op("Where", below, c, zero) for c in columns]
    tail_norm2 = sum_squares(b, tails, [1])
    alpha_norm2 = [b.op("Mul", x, x) for x in alpha]
    alpha_norm2 = alpha_norm2[0] if len(alpha) == 1 else b.op("Add", *alpha_norm2)
    norm = b.op("Sqrt", b.op("Add", alpha_norm2, tail_norm2))
    beta = b.op("Where", b.op("Less", alpha[0], zero), norm, b.op("Neg", norm))
    identity = b.op("Equal", tail_norm2, zero)
    if len(alpha) == 2:
        identity = b.op("And", identity, b.op("Equal", alpha[1], zero))
    tau = [b.op("Div", b.op("Sub", beta, alpha[0]), beta), *[b.op("Div", b.op("Neg", x), beta) for x in alpha[1:]]]
    tau = [b.op("Where", identity, zero, t) for t in tau]
    denominator = [b.op("Where", identity, one, b.op("Sub", alpha[0], beta)),
                   *[b.op("Where", identity, zero, x) for x in alpha[1:]]]
    scale = ([b.op("Reciprocal", denominator[0])] if len(alpha) == 1 else
             list(divide(b, dtype, Z(one, zero), Z(*denominator))))
    v = [b.op("Where", at, unit, x) for unit, x in zip([one, zero], times(b, tails, scale, dtype))]
    heads = [b.op("Where", identity, alpha[0], beta), *[b.op("Where", identity, x, zero) for x in alpha[1:]]]
    return v, tau, heads


def pack_reflector(b: Builder, x: ir.Value, k1: ir.Value, column: ir.Value, v: ir.Value, head: ir.Value,
                   row: ir.Value, j: ir.Value, batch: int, m: int) -> ir.Value:
    """Column k of (B, m, n) x as LAPACK leaves it after larfg at row j: the column above j, the new head at j,
    the reflector's tail below (`column` is the column before, `k1` the (1,) index of k)."""
    packed = b.op("Where", b.op("Equal", row, j), head, b.op("Where", b.op("Greater", row, j), v, column))
    return set_column(b, x, k1, packed, batch, m)


def nonfinite_info(b: Builder, x: Sequence[ir.Value], dtype: np.dtype, ttype: TensorType) -> ir.Value:
    """LAPACK's info for routines that cannot fail otherwise: 0, or 1 for a (B, r, c) input, given as its planes
    (one real, or re and im), with a NaN or infinity (x - x is NaN there), on which JAX reports all-NaN results."""
    infos = []
    for plane in x:
        bad = b.op("Not", b.op("Equal", b.op("Sub", plane, plane), b.const(np.zeros((), dtype))))
        infos.append(reshape_to(b, b.op("ReduceMax", b.cast(bad, np.int32), b.shape_const([1, 2]), keepdims=0),
                                list(ttype.shape)))
    return b.op("Max", *infos) if len(infos) > 1 else infos[0]


def empty_results(b: Builder, types: Sequence[TensorType]) -> list[ir.Value]:
    """The results for an empty batch or 0 x 0 matrices: empty, and info 0 where there is a batch."""
    return [b.splat(0, t.storage.dtype, t.storage.shape) for t in types]


def eye(b: Builder, batch: int, n: int, dtype: np.dtype, cols: int | None = None) -> ir.Value:
    """(B, n, cols) identity matrices (square by default)."""
    cols = n if cols is None else cols
    return b.op("Expand", b.const(np.eye(n, cols, dtype=dtype)), b.shape_const([batch, n, cols]))


def iota(b: Builder, n: int, shape: Sequence[int]) -> ir.Value:
    return b.const(np.arange(n, dtype=np.int64).reshape(shape))


def transposed(b: Builder, x: ir.Value) -> ir.Value:
    return b.op("Transpose", x, perm=_TRANSPOSED)


def reversed_axes(b: Builder, x: ir.Value, axes: Sequence[int]) -> ir.Value:
    count = len(axes)
    return b.op("Slice", x, b.shape_const([-1] * count), b.shape_const([_INT64_MIN] * count),
                b.shape_const(list(axes)), b.shape_const([-1] * count))


def set_column(b: Builder, x: ir.Value, k1: ir.Value, column: ir.Value, batch: int, m: int) -> ir.Value:
    """x[:, :, k] = column (B, m, 1): a scatter, cheaper than a full-size Where."""
    return b.op("ScatterElements", x, b.op("Expand", k1, batch_shape(b, x, batch, m, 1)), column, axis=2)


def diagonal(b: Builder, x: ir.Value, m: int, n: int, dtype: np.dtype) -> ir.Value:
    """(B, m, n) -> (B, min(m, n)); exact: every other entry of a row is replaced by zero."""
    on_diag = b.op("Equal", iota(b, m, (m, 1)), iota(b, n, (1, n)))
    zero = b.const(np.zeros((), dtype))
    rows = b.op("ReduceSum", b.op("Where", on_diag, x, zero), b.shape_const([2]), keepdims=0)
    return rows if m <= n else b.op("Slice", rows, b.shape_const([0]), b.shape_const([n]), b.shape_const([1]))


def first_failure(b: Builder, failed: ir.Value, ttype: TensorType, like: ir.Value | None = None) -> ir.Value:
    """LAPACK's info from a (B, k) mask of failed steps: the first one, 1-based, or 0 (`like`: as unflat's)."""
    flags = b.cast(failed, np.int32)
    first = b.cast(b.op("ArgMax", flags, axis=1, keepdims=0), np.int32)  # the first maximum
    info = b.op("Mul", b.op("Add", first, b.const(np.int32(1))),
                b.op("ReduceMax", flags, b.shape_const([1]), keepdims=0))
    return unbatched(b, info, list(ttype.shape), like)


