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
from jax.extend.mlir import ir as mlir

from hlo2onnx.builder import Builder
from hlo2onnx.ops.constant import splat_scalar
from hlo2onnx.ops.linalg_kit import (compute_dtype, diagonal, flat, iota, larfg, loop, loop_step, pack_reflector,
                                      reversed_axes, transposed, unflat)
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
        h = pack_reflector(sb, h, k1, column, v, head, row, j, batch, n)
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
        s = pack_reflector(sb, s, k1, column, v, head, row, j, batch, n)
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


# -- geqp3: QR with column pivoting ----------------------------------------------------------------------------
@_real("geqp3")
def geqp3(ctx: RuleContext, a, jpvt):
    """LAPACK's laqp2: step k swaps in the first column of largest remaining norm, then runs geqr2's step. The
    norms are downdated as laqp2 does (and recomputed where cancellation took more than half the digits), so ties
    and near-ties go the way LAPACK's go. jpvt comes back 1-based."""
    b, (t_a, t_jpvt, t_taus) = ctx.b, ctx.out_types
    if not _zero_constant(ctx.hlo_op.operands[1]):
        raise NotImplementedError("geqp3 with columns fixed in front (jpvt not all zeros; jax.scipy.linalg.qr "
                                  "passes zeros) is not translated")
    *_, m, n = t_a.shape
    dtype = compute_dtype(t_a.dtype)
    batch, steps = prod(t_a.shape[:-2]), min(m, n)
    order = b.op("Expand", iota(b, n, (1, n)), b.shape_const([batch, n]))
    if batch * steps == 0:
        return a, unflat_index(b, order, t_jpvt), _zeros(b, t_taus)
    x = flat(b, a, ctx.in_types[0], 2, dtype)
    row, col = iota(b, m, (m, 1)), iota(b, n, (1, n))
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    tol3z = b.const(np.sqrt(np.asarray(np.finfo(dtype).eps / 2, dtype)))  # sqrt(dlamch('E'))
    norms = b.op("Sqrt", b.op("ReduceSumSquare", x, b.shape_const([1]), keepdims=0))  # (B, n)

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        x, vn1, vn2, perm = carried
        k1 = loop_step(sb, k)
        p = sb.op("ArgMax", sb.op("Where", sb.op("Less", col, k), sb.const(np.asarray(-1, dtype)), vn1), axis=1,
                  keepdims=1)  # (B, 1): the first largest
        x = _swap(sb, x, k1, p, [batch, m, 1], 2)
        vn1, vn2, perm = (_swap(sb, v, k1, p, [batch, 1], 1) for v in (vn1, vn2, perm))
        column = sb.op("Gather", x, k1, axis=2)
        (v,), (tau,), (head,) = larfg(sb, [column], row, k, dtype)
        w = sb.op("Where", sb.op("Greater", col, k), sb.op("MatMul", transposed(sb, v), x), zero)
        x = sb.op("Sub", x, sb.op("MatMul", v, sb.op("Mul", tau, w)))
        x = pack_reflector(sb, x, k1, column, v, head, row, k, batch, m)
        # laqp2's downdate of the norms of columns right of k, from their new entry in row k.
        live = sb.op("And", sb.op("Greater", col, k), sb.op("Not", sb.op("Equal", vn1, zero)))
        safe1, safe2 = (sb.op("Where", live, v, one) for v in (vn1, vn2))
        ratio = sb.op("Div", sb.op("Abs", reshape_to(sb, sb.op("Gather", x, k1, axis=1), [batch, n])), safe1)
        temp = sb.op("Max", sb.op("Sub", one, sb.op("Mul", ratio, ratio)), zero)
        quotient = sb.op("Div", safe1, safe2)
        recompute = sb.op("LessOrEqual", sb.op("Mul", temp, sb.op("Mul", quotient, quotient)), tol3z)
        below = sb.op("Where", sb.op("Greater", row, k), x, zero)
        tail = sb.op("Sqrt", sb.op("ReduceSumSquare", below, sb.shape_const([1]), keepdims=0))
        vn1 = sb.op("Where", live, sb.op("Where", recompute, tail, sb.op("Mul", vn1, sb.op("Sqrt", temp))), vn1)
        vn2 = sb.op("Where", live, sb.op("Where", recompute, tail, vn2), vn2)
        return [x, vn1, vn2, perm], [reshape_to(sb, tau, [batch])]

    vec = TensorType((batch, n), dtype)
    x, _, _, perm, taus = loop(b, "geqp3", steps, [x, norms, norms, order],
                               [TensorType((batch, m, n), dtype), vec, vec, TensorType((batch, n), np.dtype(np.int64))],
                               body, [TensorType((batch,), dtype)])
    return unflat(b, x, t_a), unflat_index(b, perm, t_jpvt), unflat(b, _rows(b, taus), t_taus)


def _zero_constant(value: mlir.Value) -> bool:
    """Whether a StableHLO operand is a splat constant of zeros, maybe broadcast, reshaped or converted."""
    op = value.owner
    name = op.operation.name if isinstance(op, (mlir.Operation, mlir.OpView)) else None
    if name == "stablehlo.constant":
        attr = op.attributes["value"]
        return attr.is_splat and splat_scalar(attr, np.dtype(np.int64)) == 0
    if name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert"):
        return _zero_constant(op.operands[0])
    return False


def _swap(b: Builder, x: ir.Value, k1: ir.Value, p: ir.Value, index_shape: list[int], axis: int) -> ir.Value:
    """Swaps entries k and p (B, 1) of x along `axis`: two gathers and one scatter (p = k writes equal values)."""
    p = reshape_to(b, p, [index_shape[0]] + [1] * (len(index_shape) - 1))
    at_k = b.op("Expand", k1, b.shape_const(index_shape))
    at_p = b.op("Expand", p, b.shape_const(index_shape))
    entry_k, entry_p = b.op("Gather", x, k1, axis=axis), b.op("GatherElements", x, at_p, axis=axis)
    return b.op("ScatterElements", x, b.op("Concat", at_k, at_p, axis=axis),
                b.op("Concat", entry_p, entry_k, axis=axis), axis=axis)


def unflat_index(b: Builder, order: ir.Value, ttype: TensorType) -> ir.Value:
    """(B, n) 0-based column indices -> LAPACK's 1-based ones, of type `ttype`."""
    return reshape_to(b, b.cast(b.op("Add", order, b.const(np.int64(1))), ttype.dtype), list(ttype.shape))
