"""The Schur decomposition A = Z T Z^H: the LAPACK custom call gees of jax.scipy.linalg.schur and
jax.lax.linalg.schur, real (s/d) and complex (c/z).

Complex matrices go through geev.py's complex Schur form (Hessenberg reduction, single-shift QR): T upper
triangular. Real ones follow LAPACK's dgees (gehd2 + orghr, then dlahqr, the small-matrix path of dhseqr):
1. Hessenberg reduction H = Q^T A Q (householder.hessenberg_reduce), Z = Q.
2. Francis double-shift QR steps on the lowest unreduced block of three or more rows of each batch element:
   dlahqr's shifts (the trailing 2 x 2's eigenvalues, exceptional ones after 10 and 20 steps without a
   deflation), its search for a lower starting row, its 3-element reflectors chasing the bulge down the block,
   and its deflation test (Ahues and Tisseur's). The Loop stops when only 1 x 1 and 2 x 2 blocks are left, or
   after 30 max(10, n) steps in all with info > 0 (JAX then reports NaN).
3. Every 2 x 2 block goes to LAPACK's standard form (dlanv2): equal diagonal entries and off-diagonal ones of
   opposite signs for a complex pair, upper triangular for real eigenvalues. The blocks are disjoint, so their
   rotations make one block-diagonal orthogonal G: T = G^T H G, Z = Z G.
LAPACK balances first (dgebal 'P', which only permutes to isolate eigenvalues; not done here) and so may order the
eigenvalues differently. T and Z are unique only up to that order and the signs of Z's columns: results agree
with jax.jit as decompositions (Z orthogonal, Z T Z^T = A, T quasi-triangular, the same eigenvalues).
jax refuses sort_eig_vals itself ("not implemented"), so gees always comes with sort 'N' and sdim 0.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hlo2onnx.builder import Builder
from hlo2onnx.ops.control.loops import loop, loop_step, loop_until
from hlo2onnx.ops.core.shape import reshape_to
from hlo2onnx.ops.linalg.geev import complex_schur, read_square, safe_scale
from hlo2onnx.ops.linalg.householder import hessenberg_reduce
from hlo2onnx.ops.linalg.kit import (diagonal, empty_results, eye, iota, join, larfg, set_column, sum_squares,
                                     transposed, unflat)
from hlo2onnx.registry import register_custom_call
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType

_KEXSH = 10  # dlahqr: steps without a deflation before an exceptional shift
_DAT1, _DAT2 = 0.75, -0.4375  # the exceptional shift's 2 x 2


@register_custom_call(*(f"lapack_{kind}gees_ffi" for kind in "sdcz"))
def gees(ctx: RuleContext, a, *, mode: int = ord("V"), sort: int = ord("N")):
    """Real routines return (T, Z, wr, wi, sdim, info), complex ones (T, Z, w, sdim, info); Z is zero unless
    mode is 'V' (LAPACK leaves it unset, JAX drops it)."""
    if sort != ord("N"):
        raise NotImplementedError(f"gees with sorted eigenvalues (sort={chr(sort)!r}; jax refuses sort_eig_vals "
                                  "itself)")
    b = ctx.b
    t_t, t_z, *value_types, t_sdim, t_info = ctx.out_types
    square = read_square(ctx, a, t_info)
    if square is None:
        return empty_results(b, ctx.out_types)
    dtype, n, batch, x, info = square
    scale = safe_scale(b, x, dtype)  # (B, 1, 1), as dgees scales A into the safe range
    x = [b.op("Div", v, scale) for v in x]
    if len(x) == 1:
        t, z, failed = real_schur(b, x[0], batch, n, dtype)
        t = [b.op("Mul", t[0], scale)]
        values = [unflat(b, v, ty) for v, ty in zip(real_eigenvalues(b, t[0], n, dtype), value_types)]
    else:
        t, z, failed = complex_schur(b, x, b.op("Sqrt", sum_squares(b, x, [1, 2])), batch, n, dtype)
        upper = b.op("LessOrEqual", iota(b, n, (n, 1)), iota(b, n, (1, n)))
        t = [b.op("Mul", b.op("Where", upper, v, b.const(np.zeros((), dtype))), scale) for v in t]
        values = [join(b, [diagonal(b, v, n, n, dtype) for v in t], value_types[0])]
    info = b.op("Max", info, reshape_to(b, failed, list(t_info.shape)))
    z = join(b, z, t_z) if mode == ord("V") else b.splat(0, t_z.storage.dtype, t_z.storage.shape)
    return join(b, t, t_t), z, *values, b.splat(0, t_sdim.dtype, t_sdim.shape), info


def real_schur(b: Builder, x: ir.Value, batch: int, n: int, dtype: np.dtype
               ) -> tuple[list[ir.Value], list[ir.Value], ir.Value]:
    """A = Z T Z^T for (B, n, n) x: T quasi-triangular in LAPACK's standard form, Z orthogonal, and the (B,)
    int32 row (1-based) of the lowest block left unreduced where the steps ran out, else 0."""
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    z = eye(b, batch, n, dtype)
    if n > 2:
        (packed,), _, (z,) = hessenberg_reduce(b, [x], batch, n, dtype, with_q=True)
        x = b.op("Where", b.op("LessOrEqual", row, b.op("Add", col, b.const(np.int64(1)))), packed,
                 b.const(np.zeros((), dtype)))
    h = _deflate(b, x, n, dtype)
    failed = b.splat(0, np.int32, (batch,))
    if n > 2:
        full, index = TensorType((batch, n, n), dtype), TensorType((batch, 1), np.dtype(np.int64))

        def body(sb: Builder, _, carried: list[ir.Value]):
            h, z, kdefl, previous = carried
            last, first = _active_block(sb, h, n, dtype)
            # dlahqr counts the steps since the block's bottom last moved.
            kdefl = sb.op("Where", sb.op("Equal", last, previous), sb.op("Add", kdefl, sb.const(np.int64(1))),
                          sb.const(np.int64(1)))
            h, z = _sweep(sb, h, z, last, first, kdefl, batch, n, dtype)
            h = _deflate(sb, h, n, dtype)
            return [h, z, kdefl, last], _any(sb, _lowest(sb, _big(sb, h, n, dtype), n))

        go_on = _any(b, _lowest(b, _big(b, h, n, dtype), n))
        zeros = b.splat(0, np.int64, (batch, 1))
        # dlahqr allows 30 max(10, n) steps per deflated block; this is the limit for all of them together,
        # several times the steps a matrix that converges needs.
        h, z, _, _ = loop_until(b, "gees_qr", 30 * max(10, n), go_on, [h, z, zeros, zeros],
                                [full, full, index, index], body)
        last = _lowest(b, _big(b, h, n, dtype), n)
        failed = b.cast(reshape_to(b, b.op("Where", b.op("Greater", last, b.const(np.int64(0))),
                                           b.op("Add", last, b.const(np.int64(1))), last), [batch]), np.int32)
    t, z = _standardize(b, h, z, batch, n, dtype)
    return [t], [z], failed


def _any(b: Builder, last: ir.Value) -> ir.Value:
    return b.op("Greater", b.op("ReduceMax", last, keepdims=0), b.const(np.int64(0)))


def _lowest(b: Builder, mask: ir.Value, n: int) -> ir.Value:
    """(B, 1): the largest j where the (B, n) mask holds, else 0."""
    return b.op("ReduceMax", b.op("Where", mask, iota(b, n, (1, n)), b.const(np.int64(0))), b.shape_const([1]),
                keepdims=1)


def _bands(b: Builder, h: ir.Value, n: int, dtype: np.dtype) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(B, n) each: the diagonal d[j] = h[j, j], sub[j] = h[j, j - 1] and sup[j] = h[j - 1, j] (0 at j = 0);
    exact, like the kit's diagonal."""
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    zero, one = b.const(np.zeros((), dtype)), b.const(np.int64(1))
    sub = b.op("ReduceSum", b.op("Where", b.op("Equal", row, b.op("Add", col, one)), h, zero), b.shape_const([2]),
               keepdims=0)
    sup = b.op("ReduceSum", b.op("Where", b.op("Equal", col, b.op("Add", row, one)), h, zero), b.shape_const([1]),
               keepdims=0)
    return diagonal(b, h, n, n, dtype), sub, sup


def _shift_right(b: Builder, x: ir.Value, n: int, fill: ir.Value) -> ir.Value:
    """(B, n): entry j is x[j - 1], `fill` at 0."""
    head = b.op("Expand", fill, b.op("Concat", b.op("Slice", b.op("Shape", x), b.shape_const([0]),
                                                   b.shape_const([1])), b.shape_const([1]), axis=0))
    return b.op("Concat", head, b.op("Slice", x, b.shape_const([0]), b.shape_const([n - 1]), b.shape_const([1])),
                axis=1)


def _shift_left(b: Builder, x: ir.Value, n: int, fill: ir.Value) -> ir.Value:
    """(B, n): entry j is x[j + 1], `fill` at n - 1."""
    tail = b.op("Expand", fill, b.op("Concat", b.op("Slice", b.op("Shape", x), b.shape_const([0]),
                                                   b.shape_const([1])), b.shape_const([1]), axis=0))
    return b.op("Concat", b.op("Slice", x, b.shape_const([1]), b.shape_const([n]), b.shape_const([1])), tail, axis=1)


def _deflate(b: Builder, h: ir.Value, n: int, dtype: np.dtype) -> ir.Value:
    """h with the subdiagonal entries dlahqr finds negligible set to zero: below safmin n / ulp, or small next
    to their diagonal neighbours by Ahues and Tisseur's test. A NaN counts as negligible: the input held one,
    and info says so."""
    info = np.finfo(dtype)
    const = lambda v: b.const(np.asarray(v, dtype))
    ulp, smlnum, zero = const(info.eps), const(info.tiny * (n / info.eps)), const(0)
    d, sub, sup = _bands(b, h, n, dtype)
    d_above = _shift_right(b, d, n, zero)  # d[j - 1]
    s, u, dd, da = (b.op("Abs", v) for v in (sub, sup, d, d_above))
    tst = b.op("Add", da, dd)
    # tst = 0: the neighbours |h[j - 1, j - 2]| and |h[j + 1, j]| stand in
    neighbours = b.op("Add", _shift_right(b, s, n, zero), _shift_left(b, s, n, zero))
    tst = b.op("Where", b.op("Equal", tst, zero), neighbours, tst)
    ab, ba = b.op("Max", s, u), b.op("Min", s, u)
    gap = b.op("Abs", b.op("Sub", d_above, d))
    aa, bb = b.op("Max", dd, gap), b.op("Min", dd, gap)
    total = b.op("Add", aa, ab)
    total = b.op("Where", b.op("Equal", total, zero), const(1), total)
    fine = b.op("LessOrEqual", b.op("Mul", ba, b.op("Div", ab, total)),
                b.op("Max", smlnum, b.op("Mul", ulp, b.op("Mul", bb, b.op("Div", aa, total)))))
    negligible = b.op("Or", b.op("LessOrEqual", s, smlnum),
                      b.op("And", b.op("LessOrEqual", s, b.op("Mul", ulp, tst)), fine))
    negligible = b.op("Or", negligible, b.op("IsNaN", sub))
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    on_band = b.op("Equal", row, b.op("Add", col, b.const(np.int64(1))))
    dropped = b.op("And", on_band, b.op("Unsqueeze", negligible, b.shape_const([2])))
    return b.op("Where", dropped, zero, h)


def _big(b: Builder, h: ir.Value, n: int, dtype: np.dtype) -> ir.Value:
    """(B, n): whether rows j - 2, j - 1 and j lie in one unreduced block (both subdiagonal entries nonzero)."""
    _, sub, _ = _bands(b, h, n, dtype)
    kept = b.op("Not", b.op("Equal", sub, b.const(np.zeros((), dtype))))
    return b.op("And", kept, _shift_right(b, kept, n, b.const(np.zeros((1, 1), np.bool_))))


def _active_block(b: Builder, h: ir.Value, n: int, dtype: np.dtype) -> tuple[ir.Value, ir.Value]:
    """(B, 1) each: the last and first rows of the lowest unreduced block of three rows or more (last 0 if none).
    Its last row is the largest j where _big holds (were the block longer, _big would hold at j + 1)."""
    last = _lowest(b, _big(b, h, n, dtype), n)
    _, sub, _ = _bands(b, h, n, dtype)
    split = b.op("And", b.op("Equal", sub, b.const(np.zeros((), dtype))),
                 b.op("LessOrEqual", iota(b, n, (1, n)), last))
    return last, _lowest(b, split, n)


def _entry(b: Builder, h: ir.Value, r: ir.Value, c: ir.Value, n: int) -> ir.Value:
    """(B, 1): h[r, c] for (B, 1) indices."""
    flat = reshape_to(b, h, [-1, n * n])
    return b.op("GatherElements", flat, b.op("Add", b.op("Mul", r, b.const(np.int64(n))), c), axis=1)


def _shifts(b: Builder, h11: ir.Value, h12: ir.Value, h21: ir.Value, h22: ir.Value, dtype: np.dtype
            ) -> tuple[ir.Value, ir.Value]:
    """dlahqr's double shift from a 2 x 2: its eigenvalues (re, +-im) when complex, else twice the one nearer
    h22. Returns (re, im)."""
    zero, half = b.const(np.zeros((), dtype)), b.const(np.asarray(0.5, dtype))
    s = b.op("Add", b.op("Add", b.op("Abs", h11), b.op("Abs", h12)), b.op("Add", b.op("Abs", h21), b.op("Abs", h22)))
    safe = b.op("Where", b.op("Equal", s, zero), b.const(np.ones((), dtype)), s)
    h11, h12, h21, h22 = (b.op("Div", v, safe) for v in (h11, h12, h21, h22))
    tr = b.op("Mul", b.op("Add", h11, h22), half)
    det = b.op("Sub", b.op("Mul", b.op("Sub", h11, tr), b.op("Sub", h22, tr)), b.op("Mul", h12, h21))
    rtdisc = b.op("Sqrt", b.op("Abs", det))
    pair = b.op("GreaterOrEqual", det, zero)
    r1, r2 = b.op("Add", tr, rtdisc), b.op("Sub", tr, rtdisc)
    near = b.op("LessOrEqual", b.op("Abs", b.op("Sub", r1, h22)), b.op("Abs", b.op("Sub", r2, h22)))
    re = b.op("Mul", b.op("Where", pair, tr, b.op("Where", near, r1, r2)), s)
    return re, b.op("Where", pair, b.op("Mul", rtdisc, s), zero)


def _sweep(b: Builder, h: ir.Value, z: ir.Value, last: ir.Value, first: ir.Value, kdefl: ir.Value, batch: int,
           n: int, dtype: np.dtype) -> tuple[ir.Value, ir.Value]:
    """One Francis double-shift step (dlahqr's) on rows first..last of each batch element: H <- P H P and
    Z <- Z P for the reflectors P_k, k = m .. last - 1. A finished element (last 0) gets identities."""
    const = lambda v: b.const(np.asarray(v, dtype))
    index = lambda x, k: b.op("Add", x, b.const(np.int64(k)))
    zero, one = const(0), const(1)
    i = b.op("Max", last, b.const(np.int64(2)))  # in range where last is 0: those elements' steps are identities
    l = b.op("Min", first, b.const(np.int64(n - 3)))
    at = lambda r, c: _entry(b, h, r, c, n)
    h_sub, h_ii, h_l1l = at(i, index(i, -1)), at(i, i), at(index(l, 1), l)
    h_i1i2, h_l2l1 = at(index(i, -1), index(i, -2)), at(index(l, 2), index(l, 1))
    bottom = b.op("Equal", b.op("Mod", kdefl, b.const(np.int64(2 * _KEXSH))), b.const(np.int64(0)))
    top = b.op("And", b.op("Not", bottom),
               b.op("Equal", b.op("Mod", kdefl, b.const(np.int64(_KEXSH))), b.const(np.int64(0))))
    exceptional = b.op("Or", bottom, top)
    size = b.op("Where", bottom, b.op("Add", b.op("Abs", h_sub), b.op("Abs", h_i1i2)),
                b.op("Add", b.op("Abs", h_l1l), b.op("Abs", h_l2l1)))
    base = b.op("Add", b.op("Mul", const(_DAT1), size), b.op("Where", bottom, h_ii, at(l, l)))
    h11 = b.op("Where", exceptional, base, at(index(i, -1), index(i, -1)))
    h12 = b.op("Where", exceptional, b.op("Mul", const(_DAT2), size), at(index(i, -1), i))
    h21 = b.op("Where", exceptional, size, h_sub)
    h22 = b.op("Where", exceptional, base, h_ii)
    re, im = _shifts(b, h11, h12, h21, h22, dtype)
    # The first column of (H - s1)(H - s2) from row m, for every m at once (dlahqr's loop 50), |v|_1 = 1.
    d, sub, sup = _bands(b, h, n, dtype)
    window = lambda x, lo: b.op("Slice", x, b.shape_const([lo]), b.shape_const([lo + n - 2]), b.shape_const([1]))
    hmm, h21m, hmm1, hm1m1, h21m1 = window(d, 0), window(sub, 1), window(sup, 1), window(d, 1), window(sub, 2)
    s = b.op("Add", b.op("Add", b.op("Abs", b.op("Sub", hmm, re)), b.op("Abs", im)), b.op("Abs", h21m))
    s = b.op("Where", b.op("Equal", s, zero), one, s)
    h21s = b.op("Div", h21m, s)
    v1 = b.op("Add", b.op("Add", b.op("Mul", h21s, hmm1),
                          b.op("Mul", b.op("Sub", hmm, re), b.op("Div", b.op("Sub", hmm, re), s))),
              b.op("Mul", im, b.op("Div", im, s)))
    v2 = b.op("Mul", h21s, b.op("Sub", b.op("Add", hmm, hm1m1), b.op("Add", re, re)))
    v3 = b.op("Mul", h21s, h21m1)
    total = b.op("Add", b.op("Add", b.op("Abs", v1), b.op("Abs", v2)), b.op("Abs", v3))
    total = b.op("Where", b.op("Equal", total, zero), one, total)
    v1, v2, v3 = (b.op("Div", v, total) for v in (v1, v2, v3))
    h00 = b.op("Mul", b.op("Abs", window(sub, 0)), b.op("Add", b.op("Abs", v2), b.op("Abs", v3)))
    h01 = b.op("Mul", b.op("Abs", v1), b.op("Add", b.op("Add", b.op("Abs", window(_shift_right(b, d, n, zero), 0)),
                                                            b.op("Abs", hmm)), b.op("Abs", hm1m1)))
    m = iota(b, n - 2, (1, n - 2))
    lower = b.op("And", b.op("LessOrEqual", h00, b.op("Mul", const(np.finfo(dtype).eps), h01)),
                 b.op("And", b.op("Greater", m, first), b.op("LessOrEqual", m, index(last, -2))))
    m = b.op("Max", first, b.op("ReduceMax", b.op("Where", lower, m, b.const(np.int64(0))), b.shape_const([1]),
                                keepdims=1))
    start = [reshape_to(b, b.op("GatherElements", v, b.op("Min", m, b.const(np.int64(n - 3))), axis=1),
                        [batch, 1, 1]) for v in (v1, v2, v3)]
    m, last = reshape_to(b, m, [batch, 1, 1]), reshape_to(b, last, [batch, 1, 1])
    row = iota(b, n, (n, 1))

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        h, z = carried
        on = sb.op("And", sb.op("LessOrEqual", m, k), sb.op("Less", k, last))
        first_step = sb.op("Equal", m, k)
        previous = loop_step(sb, sb.op("Max", sb.op("Sub", k, sb.const(np.int64(1))), sb.const(np.int64(0))))
        column = sb.op("Gather", h, previous, axis=2)
        # the first step's column is dlahqr's v on rows m..m + 2, the others the bulge (rows k..k + 2 of the block)
        offset, start_column = sb.op("Sub", row, m), zero
        for i, v in enumerate(start):
            start_column = sb.op("Where", sb.op("Equal", offset, sb.const(np.int64(i))), v, start_column)
        bulge = sb.op("And", sb.op("And", sb.op("GreaterOrEqual", row, k), sb.op("LessOrEqual", row, last)),
                      sb.op("LessOrEqual", sb.op("Sub", row, k), sb.const(np.int64(2))))
        x = sb.op("Where", first_step, start_column, sb.op("Where", bulge, column, zero))
        (v,), (tau,), (beta,) = larfg(sb, [sb.op("Where", on, x, zero)], row, k, dtype)
        tau_v = sb.op("Mul", tau, transposed(sb, v))
        h = sb.op("Sub", h, sb.op("Mul", v, sb.op("Mul", tau, sb.op("MatMul", transposed(sb, v), h))))
        h = sb.op("Sub", h, sb.op("Mul", sb.op("MatMul", h, v), tau_v))
        z = sb.op("Sub", z, sb.op("Mul", sb.op("MatMul", z, v), tau_v))
        # Column k - 1 as dlahqr leaves it: beta at row k after the first step, zeros below (what P annihilated).
        column = sb.op("Gather", h, previous, axis=2)
        fixed = sb.op("Where", sb.op("Greater", row, k), zero,
                      sb.op("Where", sb.op("And", sb.op("Equal", row, k), sb.op("Not", first_step)), beta, column))
        fixed = sb.op("Where", sb.op("And", on, sb.op("Greater", k, sb.const(np.int64(0)))), fixed, column)
        return [set_column(sb, h, previous, fixed, batch, n), z], []

    full = TensorType((batch, n, n), dtype)
    return tuple(loop(b, "gees_sweep", n - 1, [h, z], [full, full], body))


def _lanv2(b: Builder, a: ir.Value, bq: ir.Value, c: ir.Value, d: ir.Value, dtype: np.dtype) -> list[ir.Value]:
    """LAPACK's dlanv2, elementwise: the standard form (a, b, c, d) of [[a, b], [c, d]] and its rotation (cs, sn).
    (dlanv2's rescaling of entries beyond 2^(+-484) (f64) is left out: gees scaled A into the safe range.)"""
    const = lambda v: b.const(np.asarray(v, dtype))
    zero, one, half = const(0), const(1), const(0.5)
    neg = lambda x: b.op("Neg", x)
    mul, add, sub, div = (lambda x, y, op=op: b.op(op, x, y) for op in ("Mul", "Add", "Sub", "Div"))
    sign = lambda x: b.op("Where", b.op("Less", x, zero), const(-1), one)
    copysign = lambda x, y: b.op("Where", b.op("Less", y, zero), neg(b.op("Abs", x)), b.op("Abs", x))
    safe = lambda x: b.op("Where", b.op("Equal", x, zero), one, x)
    hypot = lambda x, y: b.op("Sqrt", add(mul(x, x), mul(y, y)))
    temp = sub(a, d)
    p = mul(half, temp)
    bcmax = b.op("Max", b.op("Abs", bq), b.op("Abs", c))
    bcmis = mul(mul(b.op("Min", b.op("Abs", bq), b.op("Abs", c)), sign(bq)), sign(c))
    scale = safe(b.op("Max", b.op("Abs", p), bcmax))
    zz = add(mul(div(p, scale), p), mul(div(bcmax, scale), bcmis))
    real = b.op("GreaterOrEqual", zz, const(4 * np.finfo(dtype).eps))
    # real eigenvalues
    zr = safe(add(p, copysign(mul(b.op("Sqrt", scale), b.op("Sqrt", b.op("Abs", zz))), p)))
    tau = safe(hypot(c, zr))
    real_form = [add(d, zr), sub(bq, c), zero, sub(d, mul(div(bcmax, zr), bcmis)), div(zr, tau), div(c, tau)]
    # complex eigenvalues, or (almost) equal real ones: equal diagonal entries
    sigma = add(bq, c)
    tau = safe(hypot(sigma, temp))
    cs = b.op("Sqrt", mul(half, add(one, div(b.op("Abs", sigma), tau))))
    sn = mul(neg(div(p, mul(tau, cs))), sign(sigma))
    aa, bb = add(mul(a, cs), mul(bq, sn)), add(mul(neg(a), sn), mul(bq, cs))
    cc, dd = add(mul(c, cs), mul(d, sn)), add(mul(neg(c), sn), mul(d, cs))
    b2, c2 = add(mul(bb, cs), mul(dd, sn)), add(mul(neg(aa), sn), mul(cc, cs))
    mid = mul(half, add(add(mul(aa, cs), mul(cc, sn)), add(mul(neg(bb), sn), mul(dd, cs))))
    c_on, b_on = b.op("Not", b.op("Equal", c2, zero)), b.op("Not", b.op("Equal", b2, zero))
    split = b.op("And", b.op("And", c_on, b_on), b.op("Equal", sign(b2), sign(c2)))  # real after all: triangular
    sab, sac = b.op("Sqrt", b.op("Abs", b2)), b.op("Sqrt", b.op("Abs", c2))
    pp = copysign(mul(sab, sac), c2)
    tau = div(one, b.op("Sqrt", safe(b.op("Abs", add(b2, c2)))))
    cs1, sn1 = mul(sab, tau), mul(sac, tau)
    swap = b.op("And", c_on, b.op("Not", b_on))  # b2 = 0: swap rows and columns
    pick = lambda when_split, when_swap, otherwise: b.op("Where", split, when_split,
                                                          b.op("Where", swap, when_swap, otherwise))
    complex_form = [pick(add(mid, pp), mid, mid), pick(sub(b2, c2), neg(c2), b2), pick(zero, zero, c2),
                    pick(sub(mid, pp), mid, mid), pick(sub(mul(cs, cs1), mul(sn, sn1)), neg(sn), cs),
                    pick(add(mul(cs, sn1), mul(sn, cs1)), cs, sn)]
    c_zero, b_zero = b.op("Equal", c, zero), b.op("Equal", bq, zero)
    equal = b.op("And", b.op("Equal", temp, zero), b.op("Not", b.op("Equal", sign(bq), sign(c))))
    keep = b.op("Or", c_zero, equal)  # already standard
    kept, swapped = [a, bq, c, d, one, zero], [d, neg(c), zero, a, zero, one]
    return [b.op("Where", keep, k, b.op("Where", b_zero, s, b.op("Where", real, r, x)))
            for k, s, r, x in zip(kept, swapped, real_form, complex_form)]


def _standardize(b: Builder, h: ir.Value, z: ir.Value, batch: int, n: int, dtype: np.dtype
                 ) -> tuple[ir.Value, ir.Value]:
    """Every 2 x 2 block (a nonzero subdiagonal entry h[j, j - 1]) in dlanv2's standard form: T = G^T H G and
    Z G for the block-diagonal rotation G, the blocks set to what dlanv2 returns."""
    if n == 1:
        return h, z
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    d, sub, sup = _bands(b, h, n, dtype)
    block = b.op("Not", b.op("Equal", sub, zero))  # (B, n): a block on rows j - 1, j
    a2, b2, c2, d2, cs, sn = _lanv2(b, _shift_right(b, d, n, zero), sup, sub, d, dtype)
    cs, sn = b.op("Where", block, cs, one), b.op("Where", block, sn, zero)
    starts = _shift_left(b, block, n, b.const(np.zeros((1, 1), np.bool_)))  # a block on rows j, j + 1
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    diag, above = b.op("Equal", row, col), b.op("Equal", col, b.op("Add", row, b.const(np.int64(1))))
    below = b.op("Equal", row, b.op("Add", col, b.const(np.int64(1))))
    as_row, as_col = (lambda x: b.op("Unsqueeze", x, b.shape_const([2]))), \
        (lambda x: b.op("Unsqueeze", x, b.shape_const([1])))
    # G's blocks [[cs, -sn], [sn, cs]]
    g = b.op("Where", diag, as_row(b.op("Where", starts, _shift_left(b, cs, n, one), cs)),
             b.op("Where", above, as_col(b.op("Neg", sn)), b.op("Where", below, as_row(sn), zero)))
    t = b.op("MatMul", b.op("MatMul", transposed(b, g), h), g)
    new_diag = b.op("Where", starts, _shift_left(b, a2, n, zero), b.op("Where", block, d2, diagonal(b, t, n, n, dtype)))
    t = b.op("Where", diag, as_row(new_diag),
             b.op("Where", above, b.op("Where", as_col(block), as_col(b2), t),
                  b.op("Where", below, as_row(b.op("Where", block, c2, zero)),
                       b.op("Where", b.op("Greater", row, col), zero, t))))
    return t, b.op("MatMul", z, g)


def real_eigenvalues(b: Builder, t: ir.Value, n: int, dtype: np.dtype) -> tuple[ir.Value, ir.Value]:
    """(wr, wi) (B, n) of a standardized quasi-triangular T, as dgees returns them: a block's pair (a +- i
    sqrt(|b| |c|)) with the positive imaginary part first."""
    d, sub, sup = _bands(b, t, n, dtype)
    zero = b.const(np.zeros((), dtype))
    im = b.op("Mul", b.op("Sqrt", b.op("Abs", sub)), b.op("Sqrt", b.op("Abs", sup)))  # 0 off the blocks
    return d, b.op("Sub", _shift_left(b, im, n, zero), im)
