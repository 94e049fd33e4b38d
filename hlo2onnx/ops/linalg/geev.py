"""Nonsymmetric eigendecomposition: the LAPACK custom calls geev (jnp.linalg.eig / eigvals, lax.linalg.eig), real
(s/d) and complex (c/z).

Every matrix goes to complex Schur form A = Z T Z^H, real ones as planes with a zero imaginary part:
1. Householder reduction to upper Hessenberg form H = Q^H A Q.
2. Implicit single-shift QR steps on the lowest unreduced block of each batch element: a reflector from the
   block's shifted first column, then reflectors that chase its bulge down to the block's end. The shift is
   Wilkinson's (the eigenvalue of the trailing 2 x 2 nearer its last entry), an exceptional one after every
   _STALL steps without a deflation (it breaks cycles such as a permutation matrix's). A subdiagonal entry below
   eps (|h_kk| + |h_k+1,k+1|), or below eps ||A||_F, is set to zero: exact zeros keep blocks apart through later
   steps, every reflector outside the block being the identity. The Loop stops when no subdiagonal entry is
   left, or after LAPACK's 30 max(10, n) steps with info > 0 (JAX then reports NaN).
3. Eigenvectors of T by back substitution, for all eigenvalues at once (left ones from T^H), with LAPACK trevc's
   guard against a near-zero pivot (equal eigenvalues); v = Z x, normalized as geev does: unit norm, the
   largest component real.
For real input the eigenvalues nearest their own conjugate are made real, with real vectors, and mutually
nearest conjugates become exact conjugate pairs, the one with positive imaginary part first and its partner
beside it, as LAPACK orders them (jaxlib's geev kernel unpacks LAPACK's real pair columns into the complex
vectors it returns; so does this rule).

Eigenvalues come in the order of the Schur form, which is not LAPACK's (its multishift QR deflates elsewhere),
and vectors are unique only up to a phase (within repeated eigenvalues not at all): results agree with jax.jit
as sets of eigenpairs.
"""
from __future__ import annotations

from math import prod

import numpy as np
import onnx_ir as ir

from hlo2onnx.builder import Builder
from hlo2onnx.ops.complex.arithmetic import divide, multiply, sqrt
from hlo2onnx.ops.complex.pairs import Z
from hlo2onnx.ops.control.loops import loop, loop_step, loop_until
from hlo2onnx.ops.core.shape import reshape_to
from hlo2onnx.ops.linalg.kit import (Planes, adjoint, compute_dtype, diagonal, empty_results, eye, iota, join, matmul,
                                     nonfinite_info, planes, reflector, reversed_axes, set_column, sum_squares, unflat)
from hlo2onnx.registry import register_custom_call
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, real_dtype

_STALL = 10  # steps without a deflation before an exceptional shift (LAPACK's zlahqr: 10)
_EXCEPTIONAL = 0.75  # its size, in units of the last subdiagonal entry (zlahqr's DAT1)


@register_custom_call(*(f"lapack_{kind}geev_ffi" for kind in "sdcz"))
def geev(ctx: RuleContext, a, *, compute_left: int = ord("V"), compute_right: int = ord("V")):
    """Real routines return (wr, wi, vl, vr, info), complex ones (w, vl, vr, info); vl and vr are complex
    either way, zero when not asked for."""
    b = ctx.b
    *value_types, t_vl, t_vr, t_info = ctx.out_types
    real = len(value_types) == 2
    square = read_square(ctx, a, t_info)
    if square is None:
        return empty_results(b, ctx.out_types)
    dtype, n, batch, x, info = square
    if real:
        x = [x[0], b.splat(0, dtype, (batch, n, n))]
    scale = safe_scale(b, x, dtype)
    x = [b.op("Div", v, scale) for v in x]
    norm = b.op("Sqrt", sum_squares(b, x, [1, 2]))  # (B, 1, 1): similarities keep it
    t, z, failed = complex_schur(b, x, norm, batch, n, dtype)
    info = b.op("Max", info, reshape_to(b, failed, list(t_info.shape)))
    w = [reshape_to(b, diagonal(b, p, n, n, dtype), [batch, 1, n]) for p in t]  # of A / scale
    wanted = [side for side, job in (("left", compute_left), ("right", compute_right)) if job == ord("V")]
    vectors = [_eigenvectors(b, t, z, w, norm, batch, n, dtype, side == "left") for side in wanted]
    if real:
        w, vectors = _real_structure(b, w, vectors, batch, n, dtype)
    w = [b.op("Mul", v, reshape_to(b, scale, [batch, 1] if real else [batch, 1, 1])) for v in w]
    # LAPACK leaves the vectors not asked for as they were: zeros here.
    found = dict(zip(wanted, vectors))
    vl, vr = (join(b, found[side], t) if side in found else b.splat(0, t.storage.dtype, t.storage.shape)
              for side, t in (("left", t_vl), ("right", t_vr)))
    if real:
        values = [unflat(b, v, t) for v, t in zip(w, value_types)]
    else:
        values = [join(b, [reshape_to(b, v, [batch, n]) for v in w], value_types[0])]
    return *values, vl, vr, info


def _eigenvectors(b: Builder, t: Planes, z: Planes, w: Planes, norm: ir.Value, batch: int, n: int, dtype: np.dtype,
                  left: bool) -> Planes:
    """The unit eigenvectors of A = Z T Z^H, normalized as geev does: A v = v w, or for `left` u^H A = w u^H
    (u = Z y, T^H y = conj(w) y: reversing rows and columns makes T^H upper triangular)."""
    eps = b.const(np.asarray(np.finfo(dtype).eps, dtype))
    floor = b.op("Max", b.op("Mul", b.op("Mul", eps, eps), norm), b.const(np.asarray(np.finfo(dtype).tiny, dtype)))
    smin = b.op("Max", b.op("Mul", eps, _cabs1(b, w)), floor)  # (B, 1, n), trevc's
    if not left:
        return _normalized(b, matmul(b, z, _triangular_vectors(b, t, w, smin, batch, n, dtype)), dtype)
    flip = lambda planes: [reversed_axes(b, v, [1, 2]) for v in planes]
    w = [reversed_axes(b, w[0], [2]), b.op("Neg", reversed_axes(b, w[1], [2]))]
    y = flip(_triangular_vectors(b, flip(adjoint(b, t)), w, reversed_axes(b, smin, [2]), batch, n, dtype))
    return _normalized(b, matmul(b, z, y), dtype)


def read_square(ctx: RuleContext, a: ir.Value, t_info: TensorType):
    """What geev and gees read of their (batch of) square matrices: (compute dtype, n, batch, planes, LAPACK's
    info for non-finite input), or None when the input is empty."""
    in_type = ctx.in_types[0]
    dtype = compute_dtype(real_dtype(in_type.dtype))
    n, batch = in_type.shape[-1], prod(in_type.shape[:-2])
    if batch * n == 0:
        return None
    x = planes(ctx.b, a, in_type, 2, dtype)
    return dtype, n, batch, x, nonfinite_info(ctx.b, x, dtype, t_info)


def safe_scale(b: Builder, x: Planes, dtype: np.dtype) -> ir.Value:
    """(B, 1, 1): max |a_ij| where that lies outside LAPACK geev's safe range [sqrt(tiny) / eps, its
    reciprocal] (squares would over- or underflow), else 1 (exact)."""
    info = np.finfo(dtype)
    small = np.sqrt(info.tiny) / info.eps
    size = b.op("ReduceMax", b.op("Max", *(b.op("Abs", v) for v in x)), b.shape_const([1, 2]), keepdims=1)
    outside = b.op("Or", b.op("Less", size, b.const(np.asarray(small, dtype))),
                   b.op("Greater", size, b.const(np.asarray(1 / small, dtype))))
    outside = b.op("And", outside, b.op("Greater", size, b.const(np.zeros((), dtype))))
    return b.op("Where", outside, size, b.const(np.ones((), dtype)))


def _cabs1(b: Builder, x: Planes) -> ir.Value:
    """|re| + |im|, LAPACK's cheap modulus for tests."""
    return b.op("Add", b.op("Abs", x[0]), b.op("Abs", x[1]))


def _subdiagonal(b: Builder, h: Planes, n: int, dtype: np.dtype, above: bool = False) -> Planes:
    """(B, n): entry j is h[j, j - 1] (h[j - 1, j] if `above`), 0 at j = 0; exact, like the kit's diagonal."""
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    band = b.op("Equal", col, b.op("Add", row, b.const(np.int64(1)))) if above else \
        b.op("Equal", row, b.op("Add", col, b.const(np.int64(1))))
    zero = b.const(np.zeros((), dtype))
    return [b.op("ReduceSum", b.op("Where", band, p, zero), b.shape_const([1 if above else 2]), keepdims=0)
            for p in h]


def _deflate(b: Builder, h: Planes, norm: ir.Value, n: int, dtype: np.dtype) -> tuple[Planes, ir.Value]:
    """h with its negligible subdiagonal entries set to zero, and the (B, n) mask of the others. A NaN counts
    as negligible: the input held one, and info says so."""
    eps = b.const(np.asarray(np.finfo(dtype).eps, dtype))
    size = _cabs1(b, _subdiagonal(b, h, n, dtype))
    d = _cabs1(b, [diagonal(b, p, n, n, dtype) for p in h])
    # d[j - 1] at j (at j = 0, which has no entry, d[0])
    above = b.op("Concat", b.op("Slice", d, b.shape_const([0]), b.shape_const([1]), b.shape_const([1])),
                 b.op("Slice", d, b.shape_const([0]), b.shape_const([n - 1]), b.shape_const([1])), axis=1)
    tol = b.op("Max", b.op("Mul", eps, b.op("Add", above, d)), b.op("Mul", eps, reshape_to(b, norm, [-1, 1])))
    kept = b.op("Greater", size, tol)
    on_band = b.op("Equal", iota(b, n, (n, 1)), b.op("Add", iota(b, n, (1, n)), b.const(np.int64(1))))
    dropped = b.op("And", on_band, b.op("Not", b.op("Unsqueeze", kept, b.shape_const([2]))))
    zero = b.const(np.zeros((), dtype))
    return [b.op("Where", dropped, zero, p) for p in h], kept


def _any(b: Builder, mask: ir.Value) -> ir.Value:
    return b.op("Greater", b.op("ReduceMax", b.cast(mask, np.int32), keepdims=0), b.const(np.int32(0)))


def _lowest(b: Builder, mask: ir.Value, n: int) -> ir.Value:
    """(B, 1): the largest j where the (B, n) mask holds, else 0."""
    return b.op("ReduceMax", b.op("Where", mask, iota(b, n, (1, n)), b.const(np.int64(0))), b.shape_const([1]),
                keepdims=1)


def complex_schur(b: Builder, h: Planes, norm: ir.Value, batch: int, n: int, dtype: np.dtype
                  ) -> tuple[Planes, Planes, ir.Value]:
    """A = Z T Z^H: T upper triangular and Z unitary (B, n, n) planes, and the (B,) int32 index (1-based) of
    the lowest subdiagonal entry left where the steps ran out, else 0."""
    z = [eye(b, batch, n, dtype), b.splat(0, dtype, (batch, n, n))]
    if n > 2:
        h, z = _chase(b, h, z, batch, n, dtype)
    h, kept = _deflate(b, h, norm, n, dtype)
    if n > 1:
        full = TensorType((batch, n, n), dtype)
        types = [full] * 4 + [TensorType((batch, n), np.dtype(np.bool_)), TensorType((batch, 1), np.dtype(np.int64))]

        def body(sb: Builder, _, carried: list[ir.Value]):
            h, z, kept, stall = carried[:2], carried[2:4], carried[4], carried[5]
            last = _lowest(sb, kept, n)  # the lowest block's last row; 0 when done
            below = sb.op("LessOrEqual", iota(sb, n, (1, n)), last)
            first = _lowest(sb, sb.op("And", sb.op("Not", kept), below), n)
            first = sb.op("Where", sb.op("Greater", last, sb.const(np.int64(0))), first, sb.const(np.int64(n)))
            mu = _shift(sb, h, last, stall, n, dtype)
            h, z = _chase(sb, h, z, batch, n, dtype, ([reshape_to(sb, m, [batch, 1, 1]) for m in mu],
                                                          reshape_to(sb, first, [batch, 1, 1])))
            h, new_kept = _deflate(sb, h, norm, n, dtype)
            # An entry deflated (the zeros stay zero): progress.
            deflated = sb.cast(sb.op("And", kept, sb.op("Not", new_kept)), np.int32)
            progress = sb.op("Greater", sb.op("ReduceMax", deflated, sb.shape_const([1]), keepdims=1),
                             sb.const(np.int32(0)))
            stall = sb.op("Where", progress, sb.const(np.int64(0)), sb.op("Add", stall, sb.const(np.int64(1))))
            return [*h, *z, new_kept, stall], _any(sb, new_kept)

        inits = [*h, *z, kept, b.splat(0, np.int64, (batch, 1))]
        out = loop_until(b, "geev_qr", 30 * max(10, n), _any(b, kept), inits, types, body)  # LAPACK's limit
        h, z, kept = out[:2], out[2:4], out[4]
    return h, z, b.cast(reshape_to(b, _lowest(b, kept, n), [batch]), np.int32)


def _shift(b: Builder, h: Planes, last: ir.Value, stall: ir.Value, n: int, dtype: np.dtype) -> Z:
    """(B, 1) planes: the Wilkinson shift of the 2 x 2 block [[p, q], [r, s]] ending at row `last` (the root
    of its characteristic polynomial nearer s, s - q r / (t + sqrt(t^2 + q r)), t = (p - s) / 2, the root's
    sign that of t), or after every _STALL steps without a deflation the exceptional s + 0.75 |r|."""
    last = b.op("Max", last, b.const(np.int64(1)))
    before = b.op("Sub", last, b.const(np.int64(1)))
    at = lambda x, index: Z(*(b.op("GatherElements", v, index, axis=1) for v in x))
    d = [diagonal(b, v, n, n, dtype) for v in h]
    p, s = at(d, before), at(d, last)
    r, q = at(_subdiagonal(b, h, n, dtype), last), at(_subdiagonal(b, h, n, dtype, above=True), last)
    zero, half = b.const(np.zeros((), dtype)), b.const(np.asarray(0.5, dtype))
    t = Z(*(b.op("Mul", b.op("Sub", x, y), half) for x, y in zip(p, s)))
    qr = multiply(b, dtype, q, r)
    root = sqrt(b, dtype, Z(*(b.op("Add", x, y) for x, y in zip(multiply(b, dtype, t, t), qr))))
    flip = b.op("Less", b.op("Add", b.op("Mul", t.re, root.re), b.op("Mul", t.im, root.im)), zero)
    den = Z(*(b.op("Add", x, b.op("Where", flip, b.op("Neg", y), y)) for x, y in zip(t, root)))
    singular = b.op("And", b.op("Equal", den.re, zero), b.op("Equal", den.im, zero))  # t = q r = 0: p = s
    step = divide(b, dtype, qr, Z(b.op("Where", singular, b.const(np.ones((), dtype)), den.re), den.im),
                  xla_zero_divisor=False)
    mu = Z(*(b.op("Sub", x, b.op("Where", singular, zero, y)) for x, y in zip(s, step)))
    stalled = b.op("And", b.op("Greater", stall, b.const(np.int64(0))),
                   b.op("Equal", b.op("Mod", stall, b.const(np.int64(_STALL))), b.const(np.int64(0))))
    exceptional = b.op("Add", s.re, b.op("Mul", b.const(np.asarray(_EXCEPTIONAL, dtype)), _cabs1(b, list(r))))
    return Z(b.op("Where", stalled, exceptional, mu.re), b.op("Where", stalled, s.im, mu.im))


def _chase(b: Builder, h: Planes, z: Planes, batch: int, n: int, dtype: np.dtype,
           shift: tuple[Planes, ir.Value] | None = None) -> tuple[Planes, Planes]:
    """Reflectors P_k on rows and columns k.., k ascending, as h <- P h P and z <- z P. Without `shift`, those
    of the Hessenberg reduction (P_k zeroes column k - 1 below row k, k >= 1). With shift (mu, l), (B, 1, 1)
    each, one implicit QR step on the block from row l: P_l from the first column of h - mu I there, then the
    P_k that chase its bulge down the block. A reflector with nothing below row k (above l, or past the
    block's end) is the identity, so the other blocks stay as they are."""
    row = iota(b, n, (n, 1))
    zero = b.const(np.zeros((), dtype))
    start = 1 if shift is None else 0

    def body(sb: Builder, step: ir.Value, carried: list[ir.Value]):
        h, z = carried[:2], carried[2:]
        k = sb.op("Add", step, sb.const(np.int64(start)))
        previous = loop_step(sb, sb.op("Max", sb.op("Sub", k, sb.const(np.int64(1))), sb.const(np.int64(0))))
        column = [sb.op("Gather", p, previous, axis=2) for p in h]
        on = None
        if shift is not None:
            mu, l = shift
            own = [sb.op("Sub", sb.op("Gather", p, loop_step(sb, k), axis=2),
                         sb.op("Where", sb.op("Equal", row, k), m, zero)) for p, m in zip(h, mu)]
            first = sb.op("Equal", l, k)
            column = [sb.op("Where", first, o, c) for o, c in zip(own, column)]
            on = sb.op("LessOrEqual", l, k)
        x = [sb.op("Where", sb.op("GreaterOrEqual", row, k), c, zero) for c in column]
        v, scale = reflector(sb, x, row, k, dtype)
        tail = sb.op("Greater", sum_squares(sb, [sb.op("Where", sb.op("Greater", row, k), c, zero) for c in x], [1]),
                     zero)  # nothing below row k: the identity, not a reflection of row k
        scale = sb.op("Where", tail if on is None else sb.op("And", tail, on), scale, zero)
        sv = [sb.op("Mul", scale, p) for p in v]
        h = [sb.op("Sub", p, u) for p, u in zip(h, matmul(sb, sv, matmul(sb, adjoint(sb, v), h)))]
        h = [sb.op("Sub", p, u) for p, u in zip(h, matmul(sb, matmul(sb, h, v), adjoint(sb, sv)))]
        z = [sb.op("Sub", p, u) for p, u in zip(z, matmul(sb, matmul(sb, z, v), adjoint(sb, sv)))]
        # What P_k zeroes (column k - 1 below row k) is set to the zero it is in exact arithmetic.
        cleared = sb.op("And", sb.op("Greater", row, k), sb.op("Greater", k, sb.const(np.int64(0))))
        h = [set_column(sb, p, previous, sb.op("Where", cleared, zero, sb.op("Gather", p, previous, axis=2)), batch, n)
             for p in h]
        return [*h, *z], []

    full = TensorType((batch, n, n), dtype)
    out = loop(b, "geev_hessenberg" if shift is None else "geev_chase", n - 1 - start, [*h, *z], [full] * 4, body)
    return out[:2], out[2:]


def _triangular_vectors(b: Builder, t: Planes, w: Planes, smin: ir.Value, batch: int, n: int, dtype: np.dtype
                        ) -> Planes:
    """X with T x_k = w_k x_k for upper triangular T (B, n, n), w (B, 1, n) its diagonal: x_k[k] = 1, zero
    below, the rows above by back substitution (all k at once, one row per step). A pivot |t_ii - w_k| below
    smin_k (equal eigenvalues) becomes smin_k, as in LAPACK's trevc; a column past 1/eps is scaled down."""
    col = iota(b, n, (1, n))
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    big = b.const(np.asarray(1 / np.finfo(dtype).eps, dtype))

    def body(sb: Builder, step: ir.Value, carried: list[ir.Value]):
        i = sb.op("Sub", sb.const(np.int64(n - 1)), step)
        i1 = loop_step(sb, i)
        row = [sb.op("Gather", p, i1, axis=1) for p in t]  # (B, 1, n)
        rest = matmul(sb, row, carried)  # the rows of x not solved yet are zero
        pivot = [sb.op("Sub", sb.op("Gather", p, i1, axis=2), v) for p, v in zip(row, w)]
        small = sb.op("Less", _cabs1(sb, pivot), smin)
        pivot = Z(sb.op("Where", small, smin, pivot[0]), sb.op("Where", small, zero, pivot[1]))
        xi = divide(sb, dtype, Z(*(sb.op("Neg", v) for v in rest)), pivot, xla_zero_divisor=False)
        xi = [sb.op("Where", sb.op("Greater", col, i), v, sb.op("Where", sb.op("Equal", col, i), unit, zero))
              for v, unit in zip(xi, (one, zero))]
        index = sb.op("Expand", i1, sb.shape_const([batch, 1, n]))
        x = [sb.op("ScatterElements", p, index, v, axis=1) for p, v in zip(carried, xi)]
        size = sb.op("ReduceMax", _cabs1(sb, x), sb.shape_const([1]), keepdims=1)
        divisor = sb.op("Where", sb.op("Greater", size, big), size, one)
        return [sb.op("Div", p, divisor) for p in x], []

    zeros = b.splat(0, dtype, (batch, n, n))
    return loop(b, "geev_vectors", n, [zeros, zeros], [TensorType((batch, n, n), dtype)] * 2, body)


def _normalized(b: Builder, v: Planes, dtype: np.dtype) -> Planes:
    """Columns scaled as geev scales them: unit norm, the first largest component real and positive."""
    v = [b.op("Div", p, b.op("Sqrt", sum_squares(b, v, [1]))) for p in v]
    largest = b.op("ArgMax", b.op("Add", *(b.op("Mul", p, p) for p in v)), axis=1, keepdims=1)  # (B, 1, n)
    pivot = [b.op("GatherElements", p, largest, axis=1) for p in v]
    size = b.op("Sqrt", b.op("Add", *(b.op("Mul", p, p) for p in pivot)))
    size = b.op("Where", b.op("Equal", size, b.const(np.zeros((), dtype))), b.const(np.ones((), dtype)), size)
    v = list(multiply(b, dtype, Z(*v), Z(b.op("Div", pivot[0], size), b.op("Neg", b.op("Div", pivot[1], size)))))
    return [v[0], b.op("ScatterElements", v[1], largest, b.op("Mul", pivot[1], b.const(np.zeros((), dtype))),
                       axis=1)]


def _real_structure(b: Builder, w: Planes, vectors: list[Planes], batch: int, n: int, dtype: np.dtype
                    ) -> tuple[Planes, list[Planes]]:
    """For a real matrix: eigenvalue k is real if it is nearest its own conjugate (its vector's imaginary part
    goes too); k and j are a pair if each is the other's conjugate's nearest, and become exact conjugates, as
    their vectors, the one with positive imaginary part first and the other right after it. w: (B, 1, n)
    planes -> (B, n) planes."""
    re, im = (reshape_to(b, v, [batch, n]) for v in w)
    row = lambda x: b.op("Unsqueeze", x, b.shape_const([1]))
    column = lambda x: b.op("Unsqueeze", x, b.shape_const([2]))
    # distance[k, j] = |w_j - conj(w_k)|^2
    distance = b.op("Add", *(b.op("Mul", x, x) for x in (b.op("Sub", row(re), column(re)),
                                                          b.op("Add", row(im), column(im)))))
    own = diagonal(b, distance, n, n, dtype)
    real = b.op("LessOrEqual", own, b.op("ReduceMin", distance, b.shape_const([2]), keepdims=0))
    partner = b.op("ArgMin", distance, axis=2, keepdims=0)  # (B, n)
    index = iota(b, n, (1, n))
    paired = b.op("And", b.op("Not", real),
                  b.op("Equal", b.op("GatherElements", partner, partner, axis=1), index))
    second = b.op("And", paired, b.op("Less", im, b.const(np.zeros((), dtype))))
    half, zero = b.const(np.asarray(0.5, dtype)), b.const(np.zeros((), dtype))
    other = [b.op("GatherElements", v, partner, axis=1) for v in (re, im)]
    # Both members get the same sums (addition commutes): exact conjugates.
    re = b.op("Where", paired, b.op("Mul", b.op("Add", re, other[0]), half), re)
    im = b.op("Where", real, zero, b.op("Where", paired, b.op("Mul", b.op("Sub", im, other[1]), half), im))
    columns = b.op("Expand", row(partner), b.shape_const([batch, n, n]))
    real_col, second_col = row(real), row(second)
    fixed = []
    for v in vectors:
        mate = [b.op("GatherElements", p, columns, axis=2) for p in v]
        v_re = b.op("Where", second_col, mate[0], v[0])
        v_im = b.op("Where", real_col, zero, b.op("Where", second_col, b.op("Neg", mate[1]), v[1]))
        # A real eigenvalue's vector is real up to rounding (or, for a repeated one, a complex combination of
        # real vectors whose real part is one too): renormalized after dropping the imaginary part.
        norm = b.op("Sqrt", sum_squares(b, [v_re], [1]))
        fixed.append([b.op("Where", real_col, b.op("Div", v_re, norm), v_re), v_im])
    key = b.op("Where", second, b.op("Add", b.cast(partner, dtype), half), b.cast(index, dtype))
    _, order = b.ops("TopK", key, b.shape_const([n]), axis=1, largest=0, sorted=1, num_outputs=2)
    columns = b.op("Expand", row(order), b.shape_const([batch, n, n]))
    return ([b.op("GatherElements", v, order, axis=1) for v in (re, im)],
            [[b.op("GatherElements", p, columns, axis=2) for p in v] for v in fixed])
