"""Symmetric / Hermitian eigendecomposition and SVD: the LAPACK custom calls syevd and heevd (jnp.linalg.eigh /
eigvalsh) and gesdd / gesvd (jnp.linalg.svd and what is built on it: pinv, lstsq, matrix_rank, norm(ord=2 /
'nuc'), cond).

LAPACK reduces to tridiagonal / bidiagonal form first; ONNX has nothing like it, and a Jacobi method fits its
tensor ops better: every rotation of a sweep's round touches a disjoint pair of indices, so one round is a
handful of whole-tensor Gathers, and a Loop runs the rounds. The round-robin ("parallel") ordering pairs every
index with every other once per sweep of n - 1 rounds (n rounds when n is odd: one index sits out each round).
The Loop stops after a sweep without a rotation, or after _MAX_SWEEPS. Rotations are applied in Rutishauser's
form (see _rotate_rows): results agree with LAPACK's to its own accuracy (a few eps times the norm).

- eigh: two-sided Jacobi on the symmetric matrix built from LAPACK's `uplo` triangle; a pair is rotated while
  |a_pq| > eps sqrt(|a_pp a_qq|) (the relative test of Demmel and Veselic, with an absolute floor), and the
  rotated a_pq is set to the zero it is in exact arithmetic, so the off-diagonal part reaches the test's floor.
  Complex Hermitian matrices (heevd) are held as (real, imag) planes; each rotation first turns a_pq real.
- gesdd / gesvd: one-sided (Hestenes) Jacobi on the rows of A^T (conj(A) when wide): pairs are rotated until
  they are orthogonal to eps sqrt(rows); the row norms are the singular values. U's columns for zero singular
  values, and the extra ones of full_matrices, complete the others to an orthonormal basis by Householder QR.

Eigenvectors and singular vectors are unique only up to sign (a unit phase for complex ones; within repeated
values up to rotation), and LAPACK fixes none: results agree with jax.jit up to a sign per vector (per U column
/ Vt row pair). Complex matrices (c/z routines) are held as (real, imag) planes (`Planes`). Jacobi has no
failure mode: info is 0 unless the input holds a NaN or infinity (see kit.nonfinite_info).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable, Sequence

import numpy as np
import onnx_ir as ir

from hlo2onnx.builder import Builder, graph_input
from hlo2onnx.ops.control.loops import loop, loop_step
from hlo2onnx.ops.core.shape import reshape_to
from hlo2onnx.ops.linalg.kit import (Planes, adjoint, compute_dtype, conj, diagonal, empty_results, eye, flat, iota,
                                     join, matmul, nonfinite_info, planes, reflector, sum_squares, transposed, unflat)
from hlo2onnx.registry import register_custom_call
from hlo2onnx.types import TensorType, set_type

_I64 = TensorType((), np.dtype(np.int64))
from hlo2onnx.translator import RuleContext
_BOOL = TensorType((), np.dtype(np.bool_))
# Cyclic Jacobi converges quadratically once off-diagonal entries are small; 6-10 sweeps are typical.
_MAX_SWEEPS = 20


@dataclass
class _Round:
    """One round of the schedule, inside the loop: index tensors of its pairs (p, q) and idle index."""
    p: ir.Value  # (h,)
    q: ir.Value  # (h,)
    idle: ir.Value | None  # (1,) when n is odd
    inverse: ir.Value  # (n,): position of each index in concat(p, q, idle)
    p_cols: ir.Value  # (B, h, 1): p as a GatherElements index along the last axis
    q_cols: ir.Value


# (loop builder, round, carried values) -> (new carried values, (B, h, 1) mask of the rotated pairs)
Rotation = Callable[[Builder, _Round, list[ir.Value]], tuple[list[ir.Value], ir.Value]]


def _schedule(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """Round-robin pairs (the circle method): p (rounds, h), q (rounds, h), idle (rounds, 1) or None, inverse."""
    m = n + n % 2  # index n, when n is odd, is a dummy: its partner sits the round out
    ps, qs, idles, inverses = [], [], [], []
    for r in range(m - 1):
        players = [0, *np.roll(np.arange(1, m), r)]
        pairs = [(min(players[i], players[m - 1 - i]), max(players[i], players[m - 1 - i])) for i in range(m // 2)]
        idle = [p for p, q in pairs if q == n]
        pairs = [pair for pair in pairs if pair[1] != n]
        p, q = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
        ps.append(p), qs.append(q), idles.append(idle), inverses.append(np.argsort(p + q + idle))
    as_i64 = lambda rows: np.asarray(rows, np.int64)
    return as_i64(ps), as_i64(qs), (as_i64(idles) if n % 2 else None), as_i64(inverses)


def _jacobi(b: Builder, name: str, n: int, batch: int, inits: Sequence[ir.Value], types: Sequence[TensorType],
            rotate: Rotation) -> list[ir.Value]:
    """Runs round-robin rounds over n indices until a whole sweep rotates no pair (or _MAX_SWEEPS)."""
    ps, qs, idles, inverses = _schedule(n)
    rounds, h = ps.shape
    sb = b.subgraph(name)
    step, cond, was_active = graph_input(_I64), graph_input(_BOOL), graph_input(_BOOL)
    carried = [graph_input(t) for t in types]
    r = sb.op("Mod", step, sb.const(np.int64(rounds)))
    p, q = sb.op("Gather", b.const(ps), r, axis=0), sb.op("Gather", b.const(qs), r, axis=0)
    cols = lambda index: sb.op("Expand", reshape_to(sb, index, [1, h, 1]), sb.shape_const([batch, h, 1]))
    rnd = _Round(p, q, None if idles is None else sb.op("Gather", b.const(idles), r, axis=0),
                 sb.op("Gather", b.const(inverses), r, axis=0), cols(p), cols(q))
    outs, rotated = rotate(sb, rnd, carried)
    # `active`: a pair was rotated in this sweep so far; the loop goes on to the sweep's end, and past it if so.
    any_rotated = sb.op("Greater", sb.op("ReduceMax", sb.cast(rotated, np.int32), keepdims=0),
                        sb.const(np.int32(0)))
    first, last = (sb.op("Equal", r, sb.const(np.int64(i))) for i in (0, rounds - 1))
    active = sb.op("Or", any_rotated, sb.op("And", was_active, sb.op("Not", first)))
    go_on = sb.op("Or", active, sb.op("Not", last))
    graph = sb.finish_subgraph([step, cond, was_active, *carried], [go_on, active, *outs],
                             [_BOOL, _BOOL, *types])
    results = b.ops("Loop", b.const(np.int64(_MAX_SWEEPS * rounds)), b.const(np.bool_(True)),
                    b.const(np.bool_(False)), *inits, body=graph, num_outputs=1 + len(types))
    for value, ttype in zip(results[1:], types):
        set_type(value, ttype)
    set_type(results[0], _BOOL)
    return list(results[1:])


def _rotate_rows(b: Builder, xp: ir.Value, xq: ir.Value, s: ir.Value, tau: ir.Value, yp: ir.Value | None = None,
                 yq: ir.Value | None = None) -> tuple[ir.Value, ir.Value]:
    """Rows p and q of J^T x: (c p - s q, s p + c q) for the round's rotations (s, tau: (B, h, 1)), in
    Rutishauser's form p - s (q + tau p), q + s (p - tau q), tau = s / (1 + c): late rotations are tiny, and
    this rounds only their small corrections, not every entry (which costs digits over the sweeps). In the
    corrections, `yp` and `yq` (phase-shifted rows, for heevd) replace p and q."""
    yp, yq = xp if yp is None else yp, xq if yq is None else yq
    return (b.op("Sub", xp, b.op("Mul", s, b.op("Add", yq, b.op("Mul", tau, xp)))),
            b.op("Add", xq, b.op("Mul", s, b.op("Sub", yp, b.op("Mul", tau, xq)))))


def _rotate_rows_complex(b: Builder, rows: list[tuple[ir.Value, ir.Value]], s: ir.Value, tau: ir.Value,
                         e: tuple[ir.Value, ir.Value]) -> list[tuple[ir.Value, ir.Value]]:
    """Rows p and q of U^H x for U = [[c, s e], [-s conj(e), c]]: (c p - s e q, s conj(e) p + c q), from and to
    [(re_p, re_q), (im_p, im_q)]; e: (re, im) planes of unit phases. The phases enter the corrections only."""
    (re_p, re_q), (im_p, im_q) = rows
    e_q = (b.op("Sub", b.op("Mul", e[0], re_q), b.op("Mul", e[1], im_q)),
           b.op("Add", b.op("Mul", e[0], im_q), b.op("Mul", e[1], re_q)))
    conj_e_p = (b.op("Add", b.op("Mul", e[0], re_p), b.op("Mul", e[1], im_p)),
                b.op("Sub", b.op("Mul", e[0], im_p), b.op("Mul", e[1], re_p)))
    return [_rotate_rows(b, re_p, re_q, s, tau, conj_e_p[0], e_q[0]),
            _rotate_rows(b, im_p, im_q, s, tau, conj_e_p[1], e_q[1])]


def _pair_rows(b: Builder, x: ir.Value, rnd: _Round) -> tuple[ir.Value, ir.Value]:
    return b.op("Gather", x, rnd.p, axis=1), b.op("Gather", x, rnd.q, axis=1)


def _put_back(b: Builder, x: ir.Value, rnd: _Round, new_p: ir.Value, new_q: ir.Value) -> ir.Value:
    """x with rows p and q replaced: one Gather of the concatenated rows rather than two scatters."""
    parts = [new_p, new_q] + ([] if rnd.idle is None else [b.op("Gather", x, rnd.idle, axis=1)])
    return b.op("Gather", b.op("Concat", *parts, axis=1), rnd.inverse, axis=1)


def _rotation(b: Builder, app: ir.Value, aqq: ir.Value, apq: ir.Value, rotate: ir.Value,
              dtype: np.dtype) -> tuple[ir.Value, ir.Value]:
    """(s, tau) of the Jacobi rotation (c, s) that zeroes apq of [[app, apq], [apq, aqq]], tau = s / (1 + c)
    (Rutishauser's formulas); (0, 0), the identity, where `rotate` is false."""
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    theta = b.op("Div", b.op("Sub", aqq, app), b.op("Mul", b.const(np.asarray(2, dtype)),
                                                     b.op("Where", rotate, apq, one)))
    sign = b.op("Where", b.op("Less", theta, zero), b.op("Neg", one), one)  # sign(0) is 1: a 45 degree turn
    root = b.op("Sqrt", b.op("Add", b.op("Mul", theta, theta), one))
    t = b.op("Where", rotate, b.op("Div", sign, b.op("Add", b.op("Abs", theta), root)), zero)
    c = b.op("Reciprocal", b.op("Sqrt", b.op("Add", b.op("Mul", t, t), one)))
    s = b.op("Mul", t, c)
    return s, b.op("Div", s, b.op("Add", one, c))


def _rotate_test(b: Builder, size: ir.Value, app: ir.Value, aqq: ir.Value, eps: ir.Value, floor: ir.Value
                 ) -> ir.Value:
    """Whether pairs with |a_pq| = size are rotated: above eps sqrt(|a_pp a_qq|) and the absolute floor."""
    scale = b.op("Mul", b.op("Sqrt", b.op("Abs", app)), b.op("Sqrt", b.op("Abs", aqq)))
    return b.op("And", b.op("Greater", size, b.op("Mul", eps, scale)), b.op("Greater", size, floor))


def _zero_rotated(b: Builder, rows: tuple[ir.Value, ir.Value], rnd: _Round, rotated: ir.Value,
                  zero: ir.Value) -> tuple[ir.Value, ir.Value]:
    """New rows p and q with a_pq and a_qp set to zero where rotated: they are in exact arithmetic, and what
    rounding leaves would be rotated again and again."""
    def zeroed(x, cols):
        return b.op("ScatterElements", x, cols,
                    b.op("Where", rotated, zero, b.op("GatherElements", x, cols, axis=2)), axis=2)
    return zeroed(rows[0], rnd.q_cols), zeroed(rows[1], rnd.p_cols)


def _sort_rows(b: Builder, keys: ir.Value, rows: Sequence[ir.Value], k: int, largest: bool
               ) -> tuple[ir.Value, list[ir.Value]]:
    """keys (B, k) sorted, and the (B, k, cols) `rows` in the same order."""
    values, order = b.ops("TopK", keys, b.shape_const([k]), axis=1, largest=int(largest), sorted=1, num_outputs=2)
    order = b.op("Unsqueeze", order, b.shape_const([2]))
    return values, [b.op("GatherElements", x, b.op("Expand", order, b.op("Shape", x)), axis=1) for x in rows]


def _stored_triangle(b: Builder, n: int, uplo: int) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Row and column indices, and the mask of the triangle LAPACK reads (`uplo` 'L' or 'U')."""
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    return row, col, b.op("GreaterOrEqual" if uplo == ord("L") else "LessOrEqual", row, col)


# -- eigh ------------------------------------------------------------------------------------------------
@register_custom_call("lapack_ssyevd_ffi", "lapack_dsyevd_ffi")
def syevd(ctx: RuleContext, a, *, mode: int = ord("V"), uplo: int = ord("L")):
    """Eigenvalues ascending, eigenvectors as columns; only the `uplo` triangle is read. Mode 'N' computes the
    vectors too (LAPACK leaves garbage there)."""
    b, (t_vectors, t_values, t_info) = ctx.b, ctx.out_types
    dtype = compute_dtype(t_values.dtype)
    n, batch = t_vectors.shape[-1], prod(t_vectors.shape[:-2])
    if batch * n == 0:
        return empty_results(b, ctx.out_types)
    x = flat(b, a, ctx.in_types[0], 2, dtype)
    _, _, triangle = _stored_triangle(b, n, uplo)
    x = b.op("Where", triangle, x, transposed(b, x))
    w = eye(b, batch, n, dtype)  # rows: the eigenvectors
    info = nonfinite_info(b, [x], dtype, t_info)
    if n > 1:
        x, w = _jacobi_eigh(b, x, w, batch, n, dtype)
    values, (w,) = _sort_rows(b, diagonal(b, x, n, n, dtype), [w], n, largest=False)
    return unflat(b, transposed(b, w), t_vectors), unflat(b, values, t_values), info


def _jacobi_eigh(b: Builder, a: ir.Value, w: ir.Value, batch: int, n: int, dtype: np.dtype):
    """Two-sided Jacobi: a -> J^T a J, w -> J^T w each round, until a is diagonal to working precision."""
    eps = b.const(np.asarray(np.finfo(dtype).eps, dtype))
    zero = b.const(np.zeros((), dtype))
    # An absolute floor under the relative test (eps^2 ||a||_F): no rotations of underflowing noise.
    floor = b.op("Mul", b.op("Mul", eps, eps),
                 b.op("Sqrt", b.op("ReduceSumSquare", a, b.shape_const([1, 2]), keepdims=1)))

    def rotate(sb: Builder, rnd: _Round, carried: list[ir.Value]):
        a, w = carried
        ap, aq = _pair_rows(sb, a, rnd)
        app, apq = (sb.op("GatherElements", ap, i, axis=2) for i in (rnd.p_cols, rnd.q_cols))
        aqq = sb.op("GatherElements", aq, rnd.q_cols, axis=2)
        rotated = _rotate_test(sb, sb.op("Abs", apq), app, aqq, eps, floor)
        s, tau = _rotation(sb, app, aqq, apq, rotated, dtype)
        # x = J^T a (row rotations), then J^T x^T = J^T a J (a is symmetric).
        x = transposed(sb, _put_back(sb, a, rnd, *_rotate_rows(sb, ap, aq, s, tau)))
        new_p, new_q = _zero_rotated(sb, _rotate_rows(sb, *_pair_rows(sb, x, rnd), s, tau), rnd, rotated, zero)
        a = _put_back(sb, x, rnd, new_p, new_q)
        w = _put_back(sb, w, rnd, *_rotate_rows(sb, *_pair_rows(sb, w, rnd), s, tau))
        return [a, w], rotated

    full = TensorType((batch, n, n), dtype)
    return _jacobi(b, "syevd", n, batch, [a, w], [full, full], rotate)


@register_custom_call("lapack_cheevd_ffi", "lapack_zheevd_ffi")
def heevd(ctx: RuleContext, a, *, mode: int = ord("V"), uplo: int = ord("L")):
    """Hermitian eigh on the (real, imag) planes: like syevd, each rotation first turning a_pq real by a phase."""
    b, (t_vectors, t_values, t_info) = ctx.b, ctx.out_types
    dtype = compute_dtype(t_values.dtype)
    n, batch = t_vectors.shape[-1], prod(t_vectors.shape[:-2])
    if batch * n == 0:
        return empty_results(b, ctx.out_types)
    re, im = planes(b, a, ctx.in_types[0], 2, dtype)
    row, col, triangle = _stored_triangle(b, n, uplo)
    zero = b.const(np.zeros((), dtype))
    # The Hermitian matrix of the triangle; LAPACK takes the diagonal as real.
    re = b.op("Where", triangle, re, transposed(b, re))
    im = b.op("Where", b.op("Equal", row, col), zero, b.op("Where", triangle, im, b.op("Neg", transposed(b, im))))
    w_re, w_im = eye(b, batch, n, dtype), b.splat(0, dtype, (batch, n, n))  # rows: conjugated eigenvectors
    info = nonfinite_info(b, [re, im], dtype, t_info)
    if n > 1:
        re, im, w_re, w_im = _jacobi_heevd(b, [re, im, w_re, w_im], batch, n, dtype)
    values, (w_re, w_im) = _sort_rows(b, diagonal(b, re, n, n, dtype), [w_re, w_im], n, largest=False)
    return join(b, adjoint(b, [w_re, w_im]), t_vectors), unflat(b, values, t_values), info  # V = W^H


def _jacobi_heevd(b: Builder, inits: list[ir.Value], batch: int, n: int, dtype: np.dtype) -> list[ir.Value]:
    """Two-sided Jacobi with the unitary U = D R D^H per pair: D = diag(1, conj(e)), e = a_pq / |a_pq|, makes
    the pair's block real, R is the real rotation of [[a_pp, |a_pq|], [|a_pq|, a_qq]]; U^H a U zeroes a_pq."""
    eps = b.const(np.asarray(np.finfo(dtype).eps, dtype))
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    size2 = b.op("Add", *(b.op("ReduceSumSquare", x, b.shape_const([1, 2]), keepdims=1) for x in inits[:2]))
    floor = b.op("Mul", b.op("Mul", eps, eps), b.op("Sqrt", size2))

    def rotate(sb: Builder, rnd: _Round, carried: list[ir.Value]):
        re, im, w_re, w_im = carried
        rows = [_pair_rows(sb, x, rnd) for x in (re, im)]
        app = sb.op("GatherElements", rows[0][0], rnd.p_cols, axis=2)
        aqq = sb.op("GatherElements", rows[0][1], rnd.q_cols, axis=2)
        b_re, b_im = (sb.op("GatherElements", r[0], rnd.q_cols, axis=2) for r in rows)
        size = sb.op("Sqrt", sb.op("Add", sb.op("Mul", b_re, b_re), sb.op("Mul", b_im, b_im)))
        rotated = _rotate_test(sb, size, app, aqq, eps, floor)
        safe = sb.op("Where", rotated, size, one)
        e = (sb.op("Where", rotated, sb.op("Div", b_re, safe), one),
             sb.op("Where", rotated, sb.op("Div", b_im, safe), zero))
        s, tau = _rotation(sb, app, aqq, size, rotated, dtype)
        # x = U^H a; then U^H x^H = U^H a U (a is Hermitian).
        (p_re, q_re), (p_im, q_im) = _rotate_rows_complex(sb, rows, s, tau, e)
        x = [transposed(sb, _put_back(sb, re, rnd, p_re, q_re)),
             sb.op("Neg", transposed(sb, _put_back(sb, im, rnd, p_im, q_im)))]
        (p_re, q_re), (p_im, q_im) = _rotate_rows_complex(sb, [_pair_rows(sb, v, rnd) for v in x], s, tau, e)
        (p_re, q_re), (p_im, q_im) = (_zero_rotated(sb, pair, rnd, rotated, zero) for pair in
                                      ((p_re, q_re), (p_im, q_im)))
        new = [_put_back(sb, x[0], rnd, p_re, q_re), _put_back(sb, x[1], rnd, p_im, q_im)]
        (p_re, q_re), (p_im, q_im) = _rotate_rows_complex(sb, [_pair_rows(sb, v, rnd) for v in (w_re, w_im)], s, tau, e)
        new += [_put_back(sb, w_re, rnd, p_re, q_re), _put_back(sb, w_im, rnd, p_im, q_im)]
        return new, rotated

    full = TensorType((batch, n, n), dtype)
    return _jacobi(b, "heevd", n, batch, inits, [full] * 4, rotate)


# -- SVD -------------------------------------------------------------------------------------------------
@register_custom_call(*(f"lapack_{t}{r}_ffi" for r in ("gesdd", "gesvd") for t in "sdcz"))
def gesdd(ctx: RuleContext, a, *, mode: int):
    """Singular values descending; mode 'A': full U and Vt, 'S': min(m, n) of them, 'N': none (zeros).
    Complex matrices are held as (real, imag) planes."""
    b, (_, t_s, t_u, t_vt, t_info) = ctx.b, ctx.out_types
    if mode not in (ord("A"), ord("S"), ord("N")):
        raise NotImplementedError(f"@lapack_?gesdd_ffi with mode {chr(mode)!r} is not translated")
    dtype = compute_dtype(t_s.dtype)
    in_type = ctx.in_types[0]
    *_, m, n = in_type.shape
    batch, k, l = prod(in_type.shape[:-2]), min(m, n), max(m, n)
    x = planes(b, a, in_type, 2, dtype)
    info = nonfinite_info(b, x, dtype, t_info)
    # The rows of A^T (of conj(A), when wide) are orthogonalized: A^T = conj(V) S U^T (A^H = V S U^H).
    rows = [transposed(b, v) for v in x] if m >= n else conj(b, x)
    vectors = mode != ord("N")
    sigma, u_rows, w, good = _one_sided_jacobi(b, rows, batch, k, l, dtype, vectors)
    if not vectors:  # LAPACK leaves U and Vt as they were
        zeros = [b.splat(0, t.storage.dtype, t.storage.shape) for t in (t_u, t_vt)]
        return a, unflat(b, sigma, t_s), *zeros, info
    u_rows = _complete(b, u_rows, good, batch, k, l, l if mode == ord("A") else k, dtype)
    if m >= n:  # A = (rows^T) S (W^T)^H
        u, vt = [transposed(b, v) for v in u_rows], conj(b, w)
    else:  # A = W^T S conj(rows)
        u, vt = [transposed(b, v) for v in w], conj(b, u_rows)
    return a, unflat(b, sigma, t_s), join(b, u, t_u), join(b, vt, t_vt), info


def _one_sided_jacobi(b: Builder, x: Planes, batch: int, k: int, l: int, dtype: np.dtype, vectors: bool):
    """Hestenes' Jacobi on the (B, k, l) rows x, k <= l: -> singular values (B, k) descending, the unit rows of
    their x (zero where the value is zero or subnormal), the rows of the accumulated rotation (B, k, k) and the
    (B, k) mask of the values above zero (or, without vectors, the values only and Nones). Rows p and q turn
    into those of U^T x, U = [[c, s e], [-s conj(e), c]] (see _jacobi_heevd; e = 1 for real x), which makes
    them orthogonal: U^H [[|p|^2, g], [conj(g), |q|^2]] U is diagonal for g = <p, q> = sum conj(p) q."""
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    identity = [eye(b, batch, k, dtype), b.splat(0, dtype, (batch, k, k))]
    z = [b.op("Concat", v, identity[i], axis=2) for i, v in enumerate(x)] if vectors else x
    width = l + k if vectors else l
    if k > 1:
        tol = b.const(np.asarray(np.finfo(dtype).eps * np.sqrt(l), dtype))
        cols, axis = b.shape_const([l]), b.shape_const([2])

        def rotate(sb: Builder, rnd: _Round, carried: list[ir.Value]):
            pairs = [_pair_rows(sb, v, rnd) for v in carried]
            xs = [[sb.op("Slice", v, sb.shape_const([0]), cols, axis) if vectors else v for v in pair]
                  for pair in pairs]  # [(re_p, re_q), (im_p, im_q)]
            dot = lambda u, v: sb.op("ReduceSum", sb.op("Mul", u, v), axis, keepdims=1)
            alpha, beta = (sum_squares(sb, [pair[j] for pair in xs], [2]) for j in (0, 1))
            g_re = dot(*xs[0]) if len(xs) == 1 else sb.op("Add", dot(*xs[0]), dot(*xs[1]))
            size = sb.op("Abs", g_re)
            if len(xs) > 1:  # g = sum conj(p) q
                g_im = sb.op("Sub", dot(xs[0][0], xs[1][1]), dot(xs[1][0], xs[0][1]))
                size = sb.op("Sqrt", sb.op("Add", sb.op("Mul", g_re, g_re), sb.op("Mul", g_im, g_im)))
            scale = sb.op("Mul", tol, sb.op("Mul", sb.op("Sqrt", alpha), sb.op("Sqrt", beta)))
            rotated = sb.op("Greater", size, scale)
            if len(xs) == 1:
                # The rotation that diagonalizes the pair's Gram matrix [[alpha, g], [g, beta]].
                s, tau = _rotation(sb, alpha, beta, g_re, rotated, dtype)
                new = [_rotate_rows(sb, *pairs[0], s, tau)]
            else:
                s, tau = _rotation(sb, alpha, beta, size, rotated, dtype)
                safe = sb.op("Where", rotated, size, one)
                # U^T's rows are those of U^H with conj(e).
                conj_e = (sb.op("Where", rotated, sb.op("Div", g_re, safe), one),
                          sb.op("Where", rotated, sb.op("Neg", sb.op("Div", g_im, safe)), zero))
                new = _rotate_rows_complex(sb, pairs, s, tau, conj_e)
            return [_put_back(sb, v, rnd, *rows) for v, rows in zip(carried, new)], rotated

        z = _jacobi(b, "gesdd", k, batch, z, [TensorType((batch, k, width), dtype)] * len(z), rotate)
    x = [b.op("Slice", v, b.shape_const([0]), b.shape_const([l]), b.shape_const([2])) for v in z] if vectors else z
    norms = b.op("Sqrt", sum_squares(b, x, [2], keepdims=0))
    if not vectors:
        return _sort_rows(b, norms, [], k, largest=True)[0], None, None, None
    w = [b.op("Slice", v, b.shape_const([l]), b.shape_const([l + k]), b.shape_const([2])) for v in z]
    sigma, rows = _sort_rows(b, norms, [*x, *w], k, largest=True)
    x, w = rows[:len(x)], rows[len(x):]
    good = b.op("Greater", sigma, b.const(np.asarray(np.finfo(dtype).tiny, dtype)))
    # A row of x with a zero norm is zero: it divides by 1 instead.
    divisor = b.op("Unsqueeze", b.op("Where", good, sigma, one), b.shape_const([2]))
    keep = b.op("Unsqueeze", good, b.shape_const([2]))
    return sigma, [b.op("Where", keep, b.op("Div", v, divisor), zero) for v in x], w, good


def _complete(b: Builder, rows: Planes, good: ir.Value, batch: int, k: int, l: int, count: int,
              dtype: np.dtype) -> Planes:
    """`count` orthonormal rows of length l: the (B, k, l) `rows` where `good` (the first ones), then rows
    orthogonal to them, from the Householder QR of rows^T: its Q's columns past the good ones (Q^T's rows)."""
    row = iota(b, l, (l, 1))
    zero = b.const(np.zeros((), dtype))
    planes = len(rows)

    def body(sb: Builder, j: ir.Value, carried: list[ir.Value]):
        r, q = carried[:planes], carried[planes:]
        x = [sb.op("Where", sb.op("GreaterOrEqual", row, j), sb.op("Gather", v, loop_step(sb, j), axis=2), zero)
             for v in r]
        # A zero column (a zero singular value) leaves H = I.
        v, scale = reflector(sb, x, row, j, dtype)
        sv = [sb.op("Mul", scale, p) for p in v]
        r = [sb.op("Sub", p, u) for p, u in zip(r, matmul(sb, sv, matmul(sb, adjoint(sb, v), r)))]
        q = [sb.op("Sub", p, u) for p, u in zip(q, matmul(sb, matmul(sb, q, v), adjoint(sb, sv)))]
        return [*r, *q], []

    identity = [eye(b, batch, l, dtype), b.splat(0, dtype, (batch, l, l))][:planes]
    q = loop(b, "svd_complete", k, [*(transposed(b, v) for v in rows), *identity],
              [TensorType((batch, l, k), dtype)] * planes + [TensorType((batch, l, l), dtype)] * planes,
              body)[planes:]
    keep = good
    if count > k:
        rows = [b.op("Concat", v, b.splat(0, dtype, (batch, count - k, l)), axis=1) for v in rows]
        keep = b.op("Concat", good, b.splat(False, np.bool_, (batch, count - k)), axis=1)
    keep = b.op("Unsqueeze", keep, b.shape_const([2]))
    return [b.op("Where", keep, v, b.op("Slice", transposed(b, p), b.shape_const([0]), b.shape_const([count]),
                                        b.shape_const([1]))) for v, p in zip(rows, q)]
