"""Complex LU (c/z getrf), QR (geqrf, ungqr), Cholesky (potrf) and triangular solves (trsm) through the
routines of factorizations.py.

LU and QR run linalg's loops on (real, imag) planes. The other two run the real routines unchanged: a complex
n x n matrix A = X + iY acts on interleaved (re, im) coordinates as the real 2n x 2n matrix whose
(i, j) block is [[x, -y], [y, x]]. That embedding keeps products and (conjugate) transposes, so:
- the real Cholesky factor of the embedding of a Hermitian positive definite A is the embedding of A's
  complex factor (both are triangular with a positive diagonal, and the real factor is unique);
- a triangle with a unit diagonal embeds as a triangle with a unit diagonal, so L X = B is solved as
  L D^-1 (D X) = B: the column-scaled L has a unit diagonal, and one complex division per row of the result
  undoes D.
Each costs about eight real flops per complex one, in loops twice as long as the real routines': the price
of reusing the real algorithms (and their tests) unchanged.
"""
from __future__ import annotations

import dataclasses
from math import prod

import numpy as np
import onnx_ir as ir

from hlo2onnx.builder import Builder
from hlo2onnx.ops.complex.arithmetic import divide
from hlo2onnx.ops.complex.pairs import Z
from hlo2onnx.ops.core.shape import reshape_to
from hlo2onnx.ops.linalg.factorizations import cholesky_factor, householder_q, lu_factor, qr_factor, solve_triangular
from hlo2onnx.ops.linalg.kit import compute_dtype, conj, diagonal, first_failure, iota, join, planes, transposed
from hlo2onnx.registry import register_custom_call
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, real_dtype

def _embed(b: Builder, z: Z, batch: int, n: int, m: int) -> ir.Value:
    """(B, n, m) planes -> the (B, 2n, 2m) real matrix of [[re, -im], [im, re]] blocks."""
    top = b.op("Concat", *(b.op("Unsqueeze", v, b.shape_const([-1])) for v in (z.re, b.op("Neg", z.im))), axis=-1)
    bottom = b.op("Concat", *(b.op("Unsqueeze", v, b.shape_const([-1])) for v in (z.im, z.re)), axis=-1)
    blocks = b.op("Concat", b.op("Unsqueeze", top, b.shape_const([2])), b.op("Unsqueeze", bottom, b.shape_const([2])),
                  axis=2)  # (B, n, 2, m, 2): [.., i, p, j, q] = row p, column q of block (i, j)
    return reshape_to(b, blocks, [batch, 2 * n, 2 * m])


def _column_of_blocks(b: Builder, x: ir.Value, batch: int, n: int, m: int) -> Z:
    """The complex matrix a (B, 2n, 2m) embedding stands for: each block's first column (re, im)."""
    blocks = reshape_to(b, x, [batch, n, 2, m, 2])
    first = b.op("Gather", blocks, b.const(np.int64(0)), axis=4)  # (B, n, 2, m)
    re, im = (b.op("Gather", first, b.const(np.int64(p)), axis=2) for p in (0, 1))
    return Z(re, im)


def _real_diagonal(b: Builder, z: Z, n: int, dtype: np.dtype) -> Z:
    """LAPACK reads only the real part of a Hermitian matrix's diagonal."""
    eye = b.op("Equal", iota(b, n, (n, 1)), iota(b, n, (1, n)))
    return Z(z.re, b.op("Where", eye, b.const(np.zeros((), dtype)), z.im))


def _real_ctx(ctx: RuleContext, in_types: list[TensorType], out_types: list[TensorType]) -> RuleContext:
    return dataclasses.replace(ctx, in_types=in_types, out_types=out_types)


@register_custom_call("lapack_cpotrf_ffi", "lapack_zpotrf_ffi")
def potrf(ctx: RuleContext, a, *, uplo: int):
    b, ttype = ctx.b, ctx.in_types[0]
    dtype = compute_dtype(real_dtype(ttype.dtype))
    n, batch = ttype.shape[-1], prod(ttype.shape[:-2])
    embedded = _embed(b, _real_diagonal(b, Z(*planes(b, a, ttype, 2, dtype)), n, dtype), batch, n, n)
    real = TensorType((batch, 2 * n, 2 * n), dtype)
    factor, squares = cholesky_factor(_real_ctx(ctx, [real], [real]), embedded, lower=uplo == ord("L"))
    # The other triangle comes back as it was: its blocks' first columns are A's entries there.
    result = join(b, _column_of_blocks(b, factor, batch, n, n), ctx.out_types[0])
    failed = b.op("Not", b.op("Greater", squares, b.const(np.zeros((), dtype))))
    failed = b.op("ReduceMax", b.cast(reshape_to(b, failed, [batch, n, 2]), np.int32), b.shape_const([2]),
                  keepdims=0)  # complex step k failed if either of its two real steps did
    return result, first_failure(b, failed, ctx.out_types[1])


@register_custom_call("lapack_cgetrf_ffi", "lapack_zgetrf_ffi")
def getrf(ctx: RuleContext, a):
    b, (t_lu, t_pivots, t_info) = ctx.b, ctx.out_types
    dtype = compute_dtype(real_dtype(t_lu.dtype))
    lu, pivots = lu_factor(b, planes(b, a, ctx.in_types[0], 2, dtype), t_lu.shape, dtype)
    zero = b.const(np.zeros((), dtype))
    failed = b.op("And", *(b.op("Equal", diagonal(b, x, *t_lu.shape[-2:], dtype), zero) for x in lu))
    return (join(b, lu, t_lu), reshape_to(b, pivots, list(t_pivots.shape)),
            first_failure(b, failed, t_info))


@register_custom_call("lapack_cgeqrf_ffi", "lapack_zgeqrf_ffi")
def geqrf(ctx: RuleContext, a):
    b, (t_qr, t_taus) = ctx.b, ctx.out_types
    dtype = compute_dtype(real_dtype(t_qr.dtype))
    qr, taus = qr_factor(b, planes(b, a, ctx.in_types[0], 2, dtype), t_qr.shape, dtype)
    return join(b, qr, t_qr), join(b, taus, t_taus)


@register_custom_call("lapack_cungqr_ffi", "lapack_zungqr_ffi")
def ungqr(ctx: RuleContext, a, taus):
    b, out = ctx.b, ctx.out_type
    dtype = compute_dtype(real_dtype(out.dtype))
    reflectors, tau_planes = planes(b, a, ctx.in_types[0], 2, dtype), planes(b, taus, ctx.in_types[1], 1, dtype)
    return join(b, householder_q(b, reflectors, tau_planes, out.shape, ctx.in_types[1].shape[-1], dtype), out)


@register_custom_call("lapack_ctrsm_ffi", "lapack_ztrsm_ffi")
def trsm(ctx: RuleContext, a, rhs, *, side: int, uplo: int, trans_x: int, diag: int):
    """op(A) X = B (side L) or X op(A) = B, op = identity, transpose (T) or conjugate transpose (C)."""
    b, out = ctx.b, ctx.out_type
    dtype = compute_dtype(real_dtype(out.dtype))
    lower, unit = uplo == ord("L"), diag == ord("U")
    matrix, x = Z(*planes(b, a, ctx.in_types[0], 2, dtype)), Z(*planes(b, rhs, ctx.in_types[1], 2, dtype))
    if trans_x == ord("C"):
        matrix = Z(*conj(b, list(matrix)))
    transpose = trans_x != ord("N")
    if side != ord("L"):  # X op(A) = B  <=>  op(A)^T X^T = B^T (a plain transpose)
        x, transpose = _transposed(b, x), not transpose
    if transpose:
        matrix, lower = _transposed(b, matrix), not lower
    batch, n = prod(out.shape[:-2]), ctx.in_types[0].shape[-1]
    r = out.shape[-1] if side == ord("L") else out.shape[-2]  # right-hand sides, after the transpose
    eye = b.op("Equal", iota(b, n, (n, 1)), iota(b, n, (1, n)))
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    pivots = None
    if not unit:  # L = (L D^-1) D: scale the columns, solve with a unit diagonal, then divide rows by D
        pivots = Z(*(b.op("ReduceSum", b.op("Where", eye, v, zero), b.shape_const([1]), keepdims=1)
                     for v in matrix))  # (B, 1, n)
        matrix = divide(b, dtype, matrix, pivots, xla_zero_divisor=False)
    matrix = Z(b.op("Where", eye, one, matrix.re), b.op("Where", eye, zero, matrix.im))
    real_a, real_x = TensorType((batch, 2 * n, 2 * n), dtype), TensorType((batch, 2 * n, r), dtype)
    stacked = b.op("Concat", b.op("Unsqueeze", x.re, b.shape_const([2])), b.op("Unsqueeze", x.im, b.shape_const([2])),
                   axis=2)  # (B, n, 2, r): rows interleaved (re, im)
    solved = solve_triangular(_real_ctx(ctx, [real_a, real_x], [real_x]), _embed(b, matrix, batch, n, n),
                              reshape_to(b, stacked, [batch, 2 * n, r]), left=True, lower=lower, transpose=False,
                              unit=True)
    rows = reshape_to(b, solved, [batch, n, 2, r])
    y = Z(*(b.op("Gather", rows, b.const(np.int64(p)), axis=2) for p in (0, 1)))
    if pivots is not None:
        # LAPACK's division: a zero pivot gives NaN (XLA's own rule would give inf).
        y = divide(b, dtype, y, _transposed(b, pivots), xla_zero_divisor=False)
    if side != ord("L"):
        y = _transposed(b, y)
    return join(b, y, out)


def _transposed(b: Builder, z: Z) -> Z:
    return Z(*(transposed(b, v) for v in z))
