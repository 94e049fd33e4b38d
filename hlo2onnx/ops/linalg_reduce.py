"""Householder reductions and products, real (s/d): the LAPACK custom calls of jax.scipy.linalg.hessenberg (gehrd),
jax.lax.linalg.tridiagonal (sytrd), jax.lax.linalg.ormqr / jax.scipy.linalg.qr_multiply (ormqr) and
jax.scipy.linalg.qr(pivoting=True) (geqp3).

Each is LAPACK's unblocked routine (gehd2, sytd2, orm2r, laqp2) as one ONNX Loop whose body works on whole
(batch, rows, cols) tensors, with the reflectors of linalg_kit.larfg. LAPACK runs the same algorithms blocked only
for matrices larger than its crossover points (32 to 128 columns), where results agree to rounding.
"""
from __future__ import annotations

from math import prod

import numpy as np
import onnx_ir as ir

from hlo2onnx.builder import Builder
from hlo2onnx.ops.linalg_kit import (compute_dtype, diagonal, flat, iota, larfg, loop, loop_step, reversed_axes,
                                      set_column, transposed, unflat)
from hlo2onnx.ops.shape import reshape_to
from hlo2onnx.registry import register_custom_call
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType


def _real(routine: str):
    return register_custom_call(*(f"lapack_{kind}{routine}_ffi" for kind in "sd"))


def _rows(b: Builder, scanned: ir.Value) -> ir.Value:
    """A Loop's (steps, B) scan output -> (B, steps)."""
    return b.op("Transpose", scanned, perm=[1, 0])


def _zeros(b: Builder, ttype: TensorType) -> ir.Value:
    return b.splat(0, ttype.dtype, ttype.shape)


def _index(b: Builder, k: ir.Value, offset: int) -> ir.Value:
    return b.op("Add", k, b.const(np.int64(offset)))


# -- gehrd: reduction to upper Hessenberg form ---------------------------------------------------------------
@_real("gehrd")
def gehrd(ctx: RuleContext, a, *, low: int, high: int):
    """LAPACK's gehd2: H(k) = I - tau v v^T annihilates column k below row k + 1; A := H(k) A H(k)."""
    b, (t_a, t_taus, t_info) = ctx.b, ctx.out_types
    *_, n = t_a.shape
    if (low, high) != (1, n):
        raise NotImplementedError(f"gehrd with ilo={low}, ihi={high} (jax passes 1 and n)")
    dtype = compute_dtype(t_a.dtype)
    batch = prod(t_a.shape[:-2])
    if batch * (n - 1) <= 0:  # nothing to annihilate: A as it is, no taus
        return a, _zeros(b, t_taus), _zeros(b, t_info)
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    zero = b.const(np.zeros((), dtype))

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        h, = carried
        k1, j = loop_step(sb, k), _index(sb, k, 1)
        column = sb.op("Gather", h, k1, axis=2)
        (v,), (tau,), (head,) = larfg(sb, [column], row, j, dtype)
        # A := A H on all rows (larf 'R': w = A v, A -= w (tau v^T)); v is zero up to row k, so columns up to k stay.
        h = sb.op("Sub", h, sb.op("MatMul", sb.op("MatMul", h, v), sb.op("Mul", tau, transposed(sb, v))))
        # A := H A on the columns right of k (larf 'L': w = v^T A, A -= v (tau w)).
        w = sb.op("Where", sb.op("Greater", col, k), sb.op("MatMul", transposed(sb, v), h), zero)
        h = sb.op("Sub", h, sb.op("MatMul", v, sb.op("Mul", tau, w)))
        h = set_column(sb, h, k1, sb.op("Where", sb.op("Equal", row, j), head,
                                        sb.op("Where", sb.op("Greater", row, j), v, column)), batch, n)
        return [h], [reshape_to(sb, tau, [batch])]

    h, taus = loop(b, "gehrd", n - 1, [flat(b, a, ctx.in_types[0], 2, dtype)], [TensorType((batch, n, n), dtype)],
                   body, [TensorType((batch,), dtype)])
    return unflat(b, h, t_a), unflat(b, _rows(b, taus), t_taus), _zeros(b, t_info)


# -- sytrd: reduction of a symmetric matrix to tridiagonal form ----------------------------------------------
@_real("sytrd")
def sytrd(ctx: RuleContext, a, *, uplo: int):
    """LAPACK's sytd2 on the `uplo` triangle; the other triangle comes back as it was. Upper is lower on the matrix
    with reversed rows and columns (sytd2 'U' runs from the last column back), with d, e and taus reversed."""
    b, (t_a, t_d, t_e, t_taus, t_info) = ctx.b, ctx.out_types
    *_, n = t_a.shape
    dtype = compute_dtype(t_a.dtype)
    batch = prod(t_a.shape[:-2])
    lower = uplo == ord("L")
    x = flat(b, a, ctx.in_types[0], 2, dtype)
    if not lower:
        x = reversed_axes(b, x, [1, 2])
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    if batch == 0 or n == 1:  # no reflector
        packed, e, taus = x, _zeros(b, TensorType((batch, n - 1), dtype)), _zeros(b, TensorType((batch, n - 1), dtype))
    else:
        packed, e, taus = _sytd2_lower(b, x, batch, n, dtype)
    d = diagonal(b, packed, n, n, dtype)
    packed = b.op("Where", b.op("GreaterOrEqual", row, col), packed, x)  # the other triangle as it was
    if not lower:
        packed, d, e, taus = reversed_axes(b, packed, [1, 2]), *(reversed_axes(b, v, [1]) for v in (d, e, taus))
    return (unflat(b, packed, t_a), unflat(b, d, t_d), unflat(b, e, t_e), unflat(b, taus, t_taus),
            _zeros(b, t_info))


def _sytd2_lower(b: Builder, x: ir.Value, batch: int, n: int, dtype: np.dtype) -> tuple[ir.Value, ...]:
    """sytd2 'L' on the lower triangle of (B, n, n) x: the packed lower triangle (d, e, reflectors' tails), e and
    taus (B, n - 1). The body keeps the trailing block whole (symmetric), where LAPACK updates one triangle."""
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    s = b.op("Where", b.op("GreaterOrEqual", row, col), x, transposed(b, x))
    zero, half = b.const(np.zeros((), dtype)), b.const(np.asarray(0.5, dtype))

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        s, = carried
        k1, j = loop_step(sb, k), _index(sb, k, 1)
        column = sb.op("Gather", s, k1, axis=2)
        (v,), (tau,), (head,) = larfg(sb, [column], row, j, dtype)
        # symv on the trailing block: y = tau A v; w = y - (tau / 2) (y^T v) v; A -= v w^T + w v^T (syr2).
        y = sb.op("Where", sb.op("Greater", row, k), sb.op("Mul", tau, sb.op("MatMul", s, v)), zero)
        dot = sb.op("ReduceSum", sb.op("Mul", y, v), sb.shape_const([1]), keepdims=1)
        w = sb.op("Add", y, sb.op("Mul", sb.op("Neg", sb.op("Mul", sb.op("Mul", half, tau), dot)), v))
        s = sb.op("Sub", s, sb.op("Add", sb.op("MatMul", v, transposed(sb, w)), sb.op("MatMul", w, transposed(sb, v))))
        s = set_column(sb, s, k1, sb.op("Where", sb.op("Equal", row, j), head,
                                        sb.op("Where", sb.op("Greater", row, j), v, column)), batch, n)
        return [s], [reshape_to(sb, head, [batch]), reshape_to(sb, tau, [batch])]

    scan = TensorType((batch,), dtype)
    s, e, taus = loop(b, "sytrd", n - 1, [s], [TensorType((batch, n, n), dtype)], body, [scan, scan])
    return s, _rows(b, e), _rows(b, taus)


# -- ormqr: multiplying by Q without forming it --------------------------------------------------------------
@_real("ormqr")
def ormqr(ctx: RuleContext, a, taus, c, *, left: bool, transpose: bool):
    """LAPACK's orm2r: Q C, Q^T C, C Q or C Q^T for Q = H(0) ... H(k-1) (reflectors as geqrf packs them). C Q is
    (Q^T C^T)^T, so every case is a left product, its reflectors applied last first for Q C."""
    b, out = ctx.b, ctx.out_type
    t_a, t_taus, t_c = ctx.in_types
    dtype = compute_dtype(out.dtype)
    k, batch = t_taus.shape[-1], prod(t_c.shape[:-2])
    if k * prod(t_c.shape) == 0:  # H = I, or nothing to multiply
        return c
    x = flat(b, c, t_c, 2, dtype)
    if not left:
        x, transpose = transposed(b, x), not transpose
    reflectors, taus = flat(b, a, t_a, 2, dtype), flat(b, taus, t_taus, 1, dtype)
    m, cols = t_a.shape[-2], t_c.shape[-1] if left else t_c.shape[-2]
    taus = reshape_to(b, taus, [batch, k, 1])
    row = iota(b, m, (m, 1))
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))

    def body(sb: Builder, step: ir.Value, carried: list[ir.Value]):
        x, = carried
        i = step if transpose else sb.op("Sub", sb.const(np.int64(k - 1)), step)
        i1 = loop_step(sb, i)
        v = sb.op("Where", sb.op("Greater", row, i), sb.op("Gather", reflectors, i1, axis=2),
                  sb.op("Where", sb.op("Equal", row, i), one, zero))
        # larf 'L': w = v^T C, C -= v (tau w)
        w = sb.op("MatMul", transposed(sb, v), x)
        return [sb.op("Sub", x, sb.op("MatMul", v, sb.op("Mul", sb.op("Gather", taus, i1, axis=1), w)))], []

    x, = loop(b, "ormqr", k, [x], [TensorType((batch, m, cols), dtype)], body)
    return unflat(b, transposed(b, x) if not left else x, out)
