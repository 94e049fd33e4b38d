"""Householder reductions and products, real (s/d) and complex (c/z): the LAPACK custom calls of
jax.scipy.linalg.hessenberg (gehrd), jax.lax.linalg.tridiagonal (sytrd, hetrd), jax.lax.linalg.ormqr /
jax.scipy.linalg.qr_multiply (ormqr, unmqr) and jax.scipy.linalg.qr(pivoting=True) (geqp3).

Each is LAPACK's unblocked routine (gehd2, sytd2/hetd2, orm2r/unm2r, laqp2) as one ONNX Loop whose body works on
whole (batch, rows, cols) planes (a real matrix, or a complex one's real and imaginary parts), with the reflectors
of kit.larfg. LAPACK runs the same algorithms blocked only for matrices larger than its crossover points
(32 to 128 columns), where results agree to rounding.
"""
from __future__ import annotations

from math import prod

import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir

from hlo2onnx.builder import Builder
from hlo2onnx.ops.control.loops import loop, loop_step
from hlo2onnx.ops.core.constant import splat_scalar
from hlo2onnx.ops.core.shape import reshape_to
from hlo2onnx.ops.linalg.kit import (Planes, adjoint, compute_dtype, conj, diagonal, eye, iota, join, larfg, matmul,
                                     pack_reflector, planes, reversed_axes, sum_squares, times, unflat)
from hlo2onnx.registry import register_custom_call
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, real_dtype


def _routine(real: str, complex_: str | None = None):
    """The rule of LAPACK's s/d `real` and c/z `complex_` (the same name by default) routines."""
    return register_custom_call(*(f"lapack_{kind}{real}_ffi" for kind in "sd"),
                                *(f"lapack_{kind}{complex_ or real}_ffi" for kind in "cz"))


def _dtype(ttype: TensorType) -> np.dtype:
    return compute_dtype(real_dtype(ttype.dtype))


def _rows(b: Builder, scanned: ir.Value) -> ir.Value:
    """A Loop's (steps, B) scan output -> (B, steps)."""
    return b.op("Transpose", scanned, perm=[1, 0])


def _zeros(b: Builder, ttype: TensorType) -> ir.Value:
    return b.splat(0, ttype.storage.dtype, ttype.storage.shape)


def _index(b: Builder, k: ir.Value, offset: int) -> ir.Value:
    return b.op("Add", k, b.const(np.int64(offset)))


def _minus(b: Builder, x: Planes, y: Planes) -> Planes:
    return [b.op("Sub", p, q) for p, q in zip(x, y)]


# -- gehrd: reduction to upper Hessenberg form ---------------------------------------------------------------
@_routine("gehrd")
def gehrd(ctx: RuleContext, a, *, low: int, high: int):
    b, (t_a, t_taus, t_info) = ctx.b, ctx.out_types
    *_, n = t_a.shape
    if (low, high) != (1, n):
        raise NotImplementedError(f"gehrd with ilo={low}, ihi={high} (jax passes 1 and n)")
    dtype = _dtype(t_a)
    batch = prod(t_a.shape[:-2])
    if batch * (n - 1) <= 0:  # nothing to annihilate: A as it is, no taus
        return a, _zeros(b, t_taus), _zeros(b, t_info)
    h, taus, _ = hessenberg_reduce(b, planes(b, a, ctx.in_types[0], 2, dtype), batch, n, dtype)
    return join(b, h, t_a), join(b, taus, t_taus), _zeros(b, t_info)


def hessenberg_reduce(b: Builder, x: Planes, batch: int, n: int, dtype: np.dtype, with_q: bool = False
                      ) -> tuple[Planes, Planes, Planes]:
    """LAPACK's gehd2 (zgehd2 for complex planes) on (B, n, n) planes, n >= 2: H(k) = I - tau v v^H annihilates
    column k below row k + 1 and A := H(k)^H A H(k). Returns the packed result (H on and above the subdiagonal,
    the reflectors' tails below), the (B, n - 1) taus and, `with_q`, Q = H(0) ... H(n - 2) (orghr's: A = Q H Q^H;
    else []). The last step annihilates nothing but makes a complex subdiagonal entry real, as zgehd2 does."""
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    zero = b.const(np.zeros((), dtype))
    count = len(x)

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        h, q = carried[:count], carried[count:]
        k1, j = loop_step(sb, k), _index(sb, k, 1)
        column = [sb.op("Gather", p, k1, axis=2) for p in h]
        v, tau, head = larfg(sb, column, row, j, dtype)
        tau_vh = times(sb, tau, adjoint(sb, v), dtype)
        # A := A H on all rows (larf 'R': A -= (A v)(tau v^H)); v is zero up to row k, so columns up to k stay.
        h = _minus(sb, h, times(sb, matmul(sb, h, v), tau_vh, dtype))
        # A := H^H A on the columns right of k (larf 'L' with conj(tau): w = v^H A, A -= v (conj(tau) w)).
        w = [sb.op("Where", sb.op("Greater", col, k), p, zero) for p in matmul(sb, adjoint(sb, v), h)]
        h = _minus(sb, h, times(sb, v, times(sb, conj(sb, tau), w, dtype), dtype))
        h = [pack_reflector(sb, p, k1, c, vp, hp, row, j, batch, n) for p, c, vp, hp in zip(h, column, v, head)]
        if with_q:
            q = _minus(sb, q, times(sb, matmul(sb, q, v), tau_vh, dtype))
        return [*h, *q], [reshape_to(sb, t, [batch]) for t in tau]

    full = TensorType((batch, n, n), dtype)
    q = [eye(b, batch, n, dtype), b.splat(0, dtype, (batch, n, n))][:count] if with_q else []
    out = loop(b, "gehrd", n - 1, [*x, *q], [full] * (count + len(q)), body, [TensorType((batch,), dtype)] * count)
    return out[:count], [_rows(b, t) for t in out[count + len(q):]], out[count:count + len(q)]


# -- sytrd / hetrd: reduction of a symmetric or Hermitian matrix to tridiagonal form ----------------------------
@_routine("sytrd", "hetrd")
def sytrd(ctx: RuleContext, a, *, uplo: int):
    """LAPACK's sytd2 (hetd2) on the `uplo` triangle; the other triangle comes back as it was. Upper is lower on
    the matrix with reversed rows and columns (sytd2 'U' runs from the last column back), with d, e and taus
    reversed. Complex: d, e and the packed diagonal are real (hetd2 drops the diagonal's imaginary part)."""
    b, (t_a, t_d, t_e, t_taus, t_info) = ctx.b, ctx.out_types
    *_, n = t_a.shape
    dtype = _dtype(t_a)
    batch = prod(t_a.shape[:-2])
    lower = uplo == ord("L")
    x = planes(b, a, ctx.in_types[0], 2, dtype)
    if not lower:
        x = [reversed_axes(b, p, [1, 2]) for p in x]
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    if batch == 0 or n == 1:  # no reflector
        zeros = b.splat(0, dtype, (batch, n - 1))
        packed, e, taus = x, zeros, [zeros] * len(x)
    else:
        packed, e, taus = _hetd2_lower(b, x, batch, n, dtype)
    on_diagonal = b.op("Equal", row, col)
    packed = [b.op("Where", b.op("GreaterOrEqual", row, col), p, q) for p, q in zip(packed, x)]  # the rest as it was
    packed = [packed[0], *(b.op("Where", on_diagonal, b.const(np.zeros((), dtype)), p) for p in packed[1:])]
    d = diagonal(b, packed[0], n, n, dtype)
    if not lower:
        packed = [reversed_axes(b, p, [1, 2]) for p in packed]
        d, e = reversed_axes(b, d, [1]), reversed_axes(b, e, [1])
        taus = [reversed_axes(b, t, [1]) for t in taus]
    return (join(b, packed, t_a), unflat(b, d, t_d), unflat(b, e, t_e), join(b, taus, t_taus), _zeros(b, t_info))


def _hetd2_lower(b: Builder, x: Planes, batch: int, n: int, dtype: np.dtype) -> tuple[Planes, ir.Value, Planes]:
    """sytd2 / hetd2 'L' on the lower triangle of (B, n, n) planes: the packed lower triangle (d, e, reflectors'
    tails), e (B, n - 1) and the taus. The body keeps the trailing block whole (Hermitian), where LAPACK updates
    one triangle."""
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    zero, minus_half = b.const(np.zeros((), dtype)), b.const(np.asarray(-0.5, dtype))
    s = [b.op("Where", b.op("GreaterOrEqual", row, col), p, q) for p, q in zip(x, adjoint(b, x))]
    s = [s[0], *(b.op("Where", b.op("Equal", row, col), zero, p) for p in s[1:])]  # hemv reads a real diagonal
    count = len(x)

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        k1, j = loop_step(sb, k), _index(sb, k, 1)
        column = [sb.op("Gather", p, k1, axis=2) for p in carried]
        v, tau, head = larfg(sb, column, row, j, dtype)
        # hemv on the trailing block: y = tau A v; w = y - (tau / 2) (y^H v) v; A -= v w^H + w v^H (her2).
        y = [sb.op("Where", sb.op("Greater", row, k), p, zero) for p in times(sb, tau, matmul(sb, carried, v), dtype)]
        dot = [sb.op("ReduceSum", p, sb.shape_const([1]), keepdims=1) for p in times(sb, conj(sb, y), v, dtype)]
        alpha = [sb.op("Mul", minus_half, p) for p in times(sb, tau, dot, dtype)]
        w = [sb.op("Add", p, q) for p, q in zip(y, times(sb, alpha, v, dtype))]
        update = [sb.op("Add", p, q) for p, q in zip(times(sb, v, adjoint(sb, w), dtype),
                                                      times(sb, w, adjoint(sb, v), dtype))]
        s = _minus(sb, carried, update)
        s = [pack_reflector(sb, p, k1, c, vp, hp, row, j, batch, n) for p, c, vp, hp in zip(s, column, v, head)]
        return s, [reshape_to(sb, head[0], [batch]), *(reshape_to(sb, t, [batch]) for t in tau)]

    scan = TensorType((batch,), dtype)
    out = loop(b, "sytrd", n - 1, s, [TensorType((batch, n, n), dtype)] * count, body, [scan] * (1 + count))
    return out[:count], _rows(b, out[count]), [_rows(b, t) for t in out[count + 1:]]


# -- ormqr / unmqr: multiplying by Q without forming it -------------------------------------------------------
@_routine("ormqr", "unmqr")
def ormqr(ctx: RuleContext, a, taus, c, *, left: bool, transpose: bool):
    """LAPACK's orm2r (unm2r): Q C, Q^H C, C Q or C Q^H for Q = H(0) ... H(k-1) (reflectors as geqrf packs them;
    `transpose` is the conjugate transpose for complex). C Q is (Q^H C^H)^H, so every case is a left product, its
    reflectors applied last first for Q C, and with conj(tau) for Q^H."""
    b, out = ctx.b, ctx.out_type
    t_a, t_taus, t_c = ctx.in_types
    dtype = _dtype(out)
    k, batch = t_taus.shape[-1], prod(t_c.shape[:-2])
    if k * prod(t_c.shape) == 0:  # H = I, or nothing to multiply
        return c
    x = planes(b, c, t_c, 2, dtype)
    if not left:
        x, transpose = adjoint(b, x), not transpose
    reflectors = planes(b, a, t_a, 2, dtype)
    taus = [reshape_to(b, t, [batch, k, 1]) for t in planes(b, taus, t_taus, 1, dtype)]
    m, cols = t_a.shape[-2], t_c.shape[-1] if left else t_c.shape[-2]
    row = iota(b, m, (m, 1))
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))

    def body(sb: Builder, step: ir.Value, carried: list[ir.Value]):
        i = step if transpose else sb.op("Sub", sb.const(np.int64(k - 1)), step)
        i1 = loop_step(sb, i)
        v = [sb.op("Where", sb.op("Greater", row, i), sb.op("Gather", r, i1, axis=2),
                   sb.op("Where", sb.op("Equal", row, i), head, zero)) for r, head in zip(reflectors, (one, zero))]
        tau = [sb.op("Gather", t, i1, axis=1) for t in taus]
        # larf 'L': w = v^H C, C -= v (tau w), with conj(tau) for H^H
        w = matmul(sb, adjoint(sb, v), carried)
        return _minus(sb, carried, times(sb, v, times(sb, conj(sb, tau) if transpose else tau, w, dtype), dtype)), []

    x = loop(b, "ormqr", k, x, [TensorType((batch, m, cols), dtype)] * len(x), body)
    return join(b, x if left else adjoint(b, x), out)


# -- geqp3: QR with column pivoting ----------------------------------------------------------------------------
@_routine("geqp3")
def geqp3(ctx: RuleContext, a, jpvt):
    """LAPACK's laqp2 (zlaqp2): step k swaps in the first column of largest remaining norm, then runs geqr2's
    step. The norms are downdated as laqp2 does (and recomputed where cancellation took more than half the
    digits), so ties and near-ties go the way LAPACK's go. jpvt comes back 1-based."""
    b, (t_a, t_jpvt, t_taus) = ctx.b, ctx.out_types
    if not _zero_constant(ctx.hlo_op.operands[1]):
        raise NotImplementedError("geqp3 with columns fixed in front (jpvt not all zeros; jax.scipy.linalg.qr "
                                  "passes zeros) is not translated")
    *_, m, n = t_a.shape
    dtype = _dtype(t_a)
    batch, steps = prod(t_a.shape[:-2]), min(m, n)
    order = b.op("Expand", iota(b, n, (1, n)), b.shape_const([batch, n]))
    if batch * steps == 0:
        return a, unflat_index(b, order, t_jpvt), _zeros(b, t_taus)
    x = planes(b, a, ctx.in_types[0], 2, dtype)
    count = len(x)
    row, col = iota(b, m, (m, 1)), iota(b, n, (1, n))
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    tol3z = b.const(np.sqrt(np.asarray(np.finfo(dtype).eps / 2, dtype)))  # sqrt(dlamch('E'))
    norms = b.op("Sqrt", sum_squares(b, x, [1], keepdims=0))  # (B, n)

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        x, (vn1, vn2, perm) = carried[:count], carried[count:]
        k1 = loop_step(sb, k)
        p = sb.op("ArgMax", sb.op("Where", sb.op("Less", col, k), sb.const(np.asarray(-1, dtype)), vn1), axis=1,
                  keepdims=1)  # (B, 1): the first largest
        x = [_swap(sb, v, k1, p, [batch, m, 1], 2) for v in x]
        vn1, vn2, perm = (_swap(sb, v, k1, p, [batch, 1], 1) for v in (vn1, vn2, perm))
        column = [sb.op("Gather", v, k1, axis=2) for v in x]
        v, tau, head = larfg(sb, column, row, k, dtype)
        # H^H = I - conj(tau) v v^H on the columns right of k
        w = [sb.op("Where", sb.op("Greater", col, k), u, zero) for u in matmul(sb, adjoint(sb, v), x)]
        x = _minus(sb, x, times(sb, v, times(sb, conj(sb, tau), w, dtype), dtype))
        x = [pack_reflector(sb, u, k1, c, vp, hp, row, k, batch, m) for u, c, vp, hp in zip(x, column, v, head)]
        # laqp2's downdate of the norms of columns right of k, from their new entry in row k.
        live = sb.op("And", sb.op("Greater", col, k), sb.op("Not", sb.op("Equal", vn1, zero)))
        safe1, safe2 = (sb.op("Where", live, u, one) for u in (vn1, vn2))
        entries = [reshape_to(sb, sb.op("Gather", u, k1, axis=1), [batch, n]) for u in x]  # row k
        size = sb.op("Abs", entries[0]) if count == 1 else \
            sb.op("Sqrt", sb.op("Add", *(sb.op("Mul", u, u) for u in entries)))
        ratio = sb.op("Div", size, safe1)
        temp = sb.op("Max", sb.op("Sub", one, sb.op("Mul", ratio, ratio)), zero)
        quotient = sb.op("Div", safe1, safe2)
        recompute = sb.op("LessOrEqual", sb.op("Mul", temp, sb.op("Mul", quotient, quotient)), tol3z)
        tail = sb.op("Sqrt", sum_squares(sb, [sb.op("Where", sb.op("Greater", row, k), u, zero) for u in x], [1],
                                         keepdims=0))
        vn1 = sb.op("Where", live, sb.op("Where", recompute, tail, sb.op("Mul", vn1, sb.op("Sqrt", temp))), vn1)
        vn2 = sb.op("Where", live, sb.op("Where", recompute, tail, vn2), vn2)
        return [*x, vn1, vn2, perm], [reshape_to(sb, t, [batch]) for t in tau]

    vec = TensorType((batch, n), dtype)
    out = loop(b, "geqp3", steps, [*x, norms, norms, order],
               [*[TensorType((batch, m, n), dtype)] * count, vec, vec, TensorType((batch, n), np.dtype(np.int64))],
               body, [TensorType((batch,), dtype)] * count)
    x, perm, taus = out[:count], out[count + 2], out[count + 3:]
    return join(b, x, t_a), unflat_index(b, perm, t_jpvt), join(b, [_rows(b, t) for t in taus], t_taus)


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
