"""Dense linear algebra: the LAPACK custom calls jnp.linalg emits on CPU, and
stablehlo.triangular_solve / stablehlo.cholesky.

ONNX has no factorization ops, so each routine is its unblocked LAPACK
algorithm as one ONNX Loop over the columns. The body works on whole
(batch, rows, cols) tensors, so every batch element advances in the same
iteration: rank-1 updates are masked on their small factors (adding an exact
zero leaves an entry as it is) and rows or columns are written back with
ScatterElements, as full-size `Where`s cost several times more in ORT. The algorithms follow LAPACK's
conventions, since JAX reads their packed outputs: 1-based pivot rows,
Householder vectors with an implicit unit head and tau = (beta - alpha) / beta,
`info` > 0 naming the first failed step (JAX turns those results into NaN).

LU, QR and the tridiagonal solve are written on "planes" (one real matrix, or
a complex one's real and imaginary parts), so complex.py runs complex
LU and QR (c/z) through the same loops, and complex potrf/trsm through the
real ones; gtsv takes its complex variants itself.
LAPACK's layouts (column-major) are a memory matter and leave the logical
tensors as they are.
"""
from __future__ import annotations

from math import prod

import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.builder import Builder
from hlo2onnx.ops.complex.arithmetic import divide
from hlo2onnx.ops.complex.pairs import Z
from hlo2onnx.ops.control.loops import loop, loop_step
from hlo2onnx.ops.core import dims
from hlo2onnx.ops.core.shape import merged, reshape_to
from hlo2onnx.ops.linalg.kit import (Planes, adjoint, batch_shape, compute_dtype, diagonal, eye, first_failure, flat,
                                     iota, join, larfg, matmul, pack_reflector, planes, reversed_axes, set_column,
                                     times, transposed, unbatched, unflat)
from hlo2onnx.registry import register, register_custom_call
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, real_dtype


def _lapack(*routines: str, dynamic: bool = False):
    # dynamic: the rule takes symbolic batch dims (the matrices' own dims stay static: they set the loop's steps).
    return register_custom_call(*(f"lapack_{kind}{r}_ffi" for r in routines for kind in "sd"), dynamic=dynamic)


# -- triangular solve ------------------------------------------------------------------------------------
def solve_triangular(ctx: RuleContext, a: ir.Value, rhs: ir.Value, *, left: bool, lower: bool, transpose: bool,
                     unit: bool) -> ir.Value:
    """op(A) X = B (left) or X op(A) = B, reading only A's `lower` (or upper) triangle."""
    b, out = ctx.b, ctx.out_type
    dtype = compute_dtype(out.dtype)
    a = flat(b, a, ctx.in_types[0], 2, dtype)
    x = flat(b, rhs, ctx.in_types[1], 2, dtype)
    batch, rows, cols = merged(out.shape[:-2]), *out.shape[-2:]
    if not left:  # X op(A) = B  <=>  op(A)^T X^T = B^T
        x, transpose, rows, cols = transposed(b, x), not transpose, cols, rows
    if transpose:
        a, lower = transposed(b, a), not lower
    if not lower:  # reversing rows and columns turns an upper triangle into a lower one
        a, x = reversed_axes(b, a, [1, 2]), reversed_axes(b, x, [1])
    x = _forward_substitution(b, a, x, batch, rows, cols, unit, dtype)
    if not lower:
        x = reversed_axes(b, x, [1])
    if not left:
        x = transposed(b, x)
    return unflat(b, x, out, rhs)


def _forward_substitution(b: Builder, a: ir.Value, rhs: ir.Value, batch: int, n: int, r: int, unit: bool,
                          dtype: np.dtype) -> ir.Value:
    """Solves L X = B for (batch, n, n) L (lower triangle of `a`) one row of X per step."""
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    zero = b.const(np.zeros((), dtype))
    strict = b.op("Where", b.op("Greater", row, col), a, zero)
    pivots = None if unit else reshape_to(b, diagonal(b, a, n, n, dtype), [batch, n, 1])
    ttype = TensorType((batch, n, r), dtype)

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        x, = carried
        k1 = loop_step(sb, k)
        # x_k = (b_k - L[k, :k] x[:k]) / L[k, k]; the rows of x not solved yet are zero.
        xk = sb.op("Sub", sb.op("Gather", rhs, k1, axis=1),
                   sb.op("MatMul", sb.op("Gather", strict, k1, axis=1), x))
        if pivots is not None:
            xk = sb.op("Div", xk, sb.op("Gather", pivots, k1, axis=1))
        return [sb.op("ScatterElements", x, sb.op("Expand", k1, batch_shape(sb, x, batch, 1, r)), xk, axis=1)], []

    if batch >= 0:
        zeros = b.splat(0, dtype, (batch, n, r))
    else:  # a symbolic batch: the right-hand sides' own
        zeros = b.op("ConstantOfShape", batch_shape(b, rhs, batch, n, r), value=ir.tensor(np.zeros(1, dtype)))
    return loop(b, "trsm", n, [zeros], [ttype], body)[0]


@_lapack("trsm", dynamic=True)
def trsm(ctx: RuleContext, a, rhs, *, side: int, uplo: int, trans_x: int, diag: int):
    _static_matrices(ctx)
    return solve_triangular(ctx, a, rhs, left=side == ord("L"), lower=uplo == ord("L"),
                            transpose=trans_x != ord("N"), unit=diag == ord("U"))


@register("stablehlo.triangular_solve")
def triangular_solve(ctx: RuleContext, a, rhs, *, left_side: bool, lower: bool, unit_diagonal: bool, transpose_a):
    # ADJOINT is TRANSPOSE for the real matrices supported here.
    transpose = stablehlo.TransposeAttr(transpose_a).value != "NO_TRANSPOSE"
    return solve_triangular(ctx, a, rhs, left=left_side, lower=lower, transpose=transpose, unit=unit_diagonal)


# -- LU --------------------------------------------------------------------------------------------------
@_lapack("getrf", dynamic=True)
def getrf(ctx: RuleContext, a):
    b, (t_lu, t_pivots, t_info) = ctx.b, ctx.out_types
    _static_matrices(ctx)
    dtype = compute_dtype(t_lu.dtype)
    lu, pivots = lu_factor(b, [flat(b, a, ctx.in_types[0], 2, dtype)], t_lu.shape, dtype)
    zero = b.const(np.zeros((), dtype))
    info = first_failure(b, b.op("Equal", diagonal(b, lu[0], *t_lu.shape[-2:], dtype), zero), t_info, a)
    return unflat(b, lu[0], t_lu, a), unbatched(b, pivots, list(t_pivots.shape), a), info


def _static_matrices(ctx: RuleContext) -> None:
    """Symbolic batch dims are taken (the loops run on whole batches); the matrices' dims set the steps and the
    shapes inside them, and must be static."""
    target = mlir.StringAttr(ctx.hlo_op.attributes["call_target_name"]).value
    for i, ttype in enumerate(ctx.in_types):
        rank = len(ttype.shape)
        dims.refuse(ctx, [rank - 2, rank - 1], f"the matrix dimensions of @{target} must be static", operand=i)


def lu_factor(b: Builder, planes: Planes, shape: tuple[int, ...], dtype: np.dtype) -> tuple[Planes, ir.Value]:
    """LU with partial pivoting, right-looking, of (B, m, n) planes: the first largest |entry| pivots (for a
    complex one |re| + |im|, LAPACK's izamax). Returns the packed factors and the (B, steps) 1-based pivot rows."""
    *_, m, n = shape
    batch, steps = merged(shape[:-2]), min(m, n)
    row, col = iota(b, m, (m, 1)), iota(b, n, (1, n))
    zero, one, minus_one = (b.const(np.asarray(v, dtype)) for v in (0, 1, -1))

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        k1 = loop_step(sb, k)
        columns = [sb.op("Abs", sb.op("Gather", x, k1, axis=2)) for x in carried]
        size = columns[0] if len(columns) == 1 else sb.op("Add", *columns)
        pivot_row = sb.op("ArgMax", sb.op("Where", sb.op("Less", row, k), minus_one, size), axis=1, keepdims=1)
        # Swap rows k and p: a scatter of two rows (a full-size Where costs several times more).
        rows_shape = batch_shape(sb, carried[0], batch, 1, n)
        rows_kp = sb.op("Concat", sb.op("Expand", k1, rows_shape), sb.op("Expand", pivot_row, rows_shape), axis=1)
        lu, rows_p = [], []
        for x in carried:
            row_k = sb.op("Gather", x, k1, axis=1)
            row_p = sb.op("GatherElements", x, sb.op("Expand", pivot_row, rows_shape), axis=1)
            lu.append(sb.op("ScatterElements", x, rows_kp, sb.op("Concat", row_p, row_k, axis=1), axis=1))
            rows_p.append(row_p)
        pivot = [sb.op("Gather", row_p, k1, axis=2) for row_p in rows_p]
        # LAPACK scales by the reciprocal; a zero pivot (its column is zero below) scales nothing.
        is_zero = sb.op("Equal", pivot[0], zero)
        if len(pivot) == 1:
            scale = [sb.op("Reciprocal", sb.op("Where", is_zero, one, pivot[0]))]
        else:
            is_zero = sb.op("And", is_zero, sb.op("Equal", pivot[1], zero))
            safe = Z(sb.op("Where", is_zero, one, pivot[0]), pivot[1])
            scale = list(divide(sb, dtype, Z(one, zero), safe))
        below = sb.op("Greater", row, k)
        columns = [sb.op("Gather", x, k1, axis=2) for x in lu]
        multipliers = [sb.op("Where", below, v, zero) for v in times(sb, columns, scale, dtype)]
        # The rank-1 update, with zeros outside rows > k and columns > k: subtracting 0 leaves entries as they are.
        u = [sb.op("Where", sb.op("Greater", col, k), row_p, zero) for row_p in rows_p]
        lu = [sb.op("Sub", x, update) for x, update in zip(lu, times(sb, multipliers, u, dtype))]
        lu = [set_column(sb, x, k1, sb.op("Where", below, mult, column), batch, m)
              for x, mult, column in zip(lu, multipliers, columns)]
        return lu, [reshape_to(sb, pivot_row, [batch])]

    full = TensorType((batch, m, n), dtype)
    *lu, pivots = loop(b, "getrf", steps, planes, [full] * len(planes), body,
                       [TensorType((batch,), np.dtype(np.int64))])
    return lu, b.cast(b.op("Add", _transposed2d(b, pivots), b.const(np.int64(1))), np.int32)


def _transposed2d(b: Builder, x: ir.Value) -> ir.Value:
    return b.op("Transpose", x, perm=[1, 0])


# -- Cholesky --------------------------------------------------------------------------------------------
def cholesky_factor(ctx: RuleContext, a: ir.Value, lower: bool) -> tuple[ir.Value, ir.Value]:
    """Left-looking Cholesky of the `lower` (or upper) triangle; the other triangle is left as it was.

    Returns the (B, n, n) factor and the (B, n) values whose square roots became the diagonal (LAPACK fails
    at the first one that is not positive)."""
    b, ttype = ctx.b, ctx.in_types[0]
    dtype = compute_dtype(ttype.dtype)
    n, batch = ttype.shape[-1], merged(ttype.shape[:-2])
    x = flat(b, a, ttype, 2, dtype)
    if not lower:  # U^T U from the upper triangle is L L^T from the transpose's lower one
        x = transposed(b, x)
    row, col = iota(b, n, (n, 1)), iota(b, n, (1, n))
    zero = b.const(np.zeros((), dtype))

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        w, = carried
        k1 = loop_step(sb, k)
        # v = A[:, k] - L[:, :k] L[k, :k]^T; its entry k is the pivot's square. Only L's row k is masked: the
        # columns from k on hold finite entries of A, which the zeros of that row cancel exactly.
        row_k = sb.op("Where", sb.op("Less", col, k), sb.op("Gather", w, k1, axis=1), zero)
        column = sb.op("Gather", w, k1, axis=2)
        v = sb.op("Sub", column, sb.op("MatMul", w, transposed(sb, row_k)))
        square = sb.op("Gather", v, k1, axis=1)
        root = sb.op("Sqrt", square)
        new = sb.op("Where", sb.op("Equal", row, k), root, sb.op("Mul", v, sb.op("Reciprocal", root)))
        w = set_column(sb, w, k1, sb.op("Where", sb.op("Less", row, k), column, new), batch, n)
        return [w], [reshape_to(sb, square, [batch])]

    w, squares = loop(b, "potrf", n, [x], [TensorType((batch, n, n), dtype)], body,
                       [TensorType((batch,), dtype)])
    return (w if lower else transposed(b, w)), _transposed2d(b, squares)


@_lapack("potrf", dynamic=True)
def potrf(ctx: RuleContext, a, *, uplo: int):
    _static_matrices(ctx)
    factor, squares = cholesky_factor(ctx, a, lower=uplo == ord("L"))
    zero = ctx.b.const(np.zeros((), compute_dtype(ctx.in_types[0].dtype)))
    failed = ctx.b.op("Not", ctx.b.op("Greater", squares, zero))
    return unflat(ctx.b, factor, ctx.out_types[0], a), first_failure(ctx.b, failed, ctx.out_types[1], a)


@register("stablehlo.cholesky")
def cholesky(ctx: RuleContext, a, *, lower: bool = False):
    # The other triangle and the result for a matrix that is not positive definite are implementation-defined.
    return unflat(ctx.b, cholesky_factor(ctx, a, lower)[0], ctx.out_type)


# -- QR --------------------------------------------------------------------------------------------------
@_lapack("geqrf")
def geqrf(ctx: RuleContext, a):
    b, (t_qr, t_taus) = ctx.b, ctx.out_types
    dtype = compute_dtype(t_qr.dtype)
    (qr,), (taus,) = qr_factor(b, [flat(b, a, ctx.in_types[0], 2, dtype)], t_qr.shape, dtype)
    return unflat(b, qr, t_qr), unflat(b, taus, t_taus)


def qr_factor(b: Builder, planes: Planes, shape: tuple[int, ...], dtype: np.dtype) -> tuple[Planes, Planes]:
    """Householder QR (LAPACK's geqr2, zgeqr2 for complex planes) of (B, m, n) planes: R above the diagonal,
    the reflectors' tails below, and the (B, min(m, n)) taus."""
    *_, m, n = shape
    batch = prod(shape[:-2])
    row, col = iota(b, m, (m, 1)), iota(b, n, (1, n))
    zero = b.const(np.zeros((), dtype))

    def body(sb: Builder, k: ir.Value, carried: list[ir.Value]):
        k1 = loop_step(sb, k)
        columns = [sb.op("Gather", x, k1, axis=2) for x in carried]
        v, tau, heads = larfg(sb, columns, row, k, dtype)
        # H^H = I - conj(tau) v v^H on the columns right of k (LAPACK's larf: w = v^H C, C -= conj(tau) v w); v is
        # zero above row k and the update zero in columns up to k, so adding it leaves those entries as they are.
        w = [sb.op("Where", sb.op("Greater", col, k), x, zero) for x in matmul(sb, adjoint(sb, v), carried)]
        minus_conj_tau = [sb.op("Neg", tau[0]), *tau[1:]]
        qr = [sb.op("Add", x, u) for x, u in zip(carried, times(sb, v, times(sb, minus_conj_tau, w, dtype), dtype))]
        qr = [pack_reflector(sb, x, k1, c, vp, head, row, k, batch, m) for x, head, vp, c in zip(qr, heads, v, columns)]
        return qr, [reshape_to(sb, t, [batch]) for t in tau]

    full, row_type = TensorType((batch, m, n), dtype), TensorType((batch,), dtype)
    results = loop(b, "geqrf", min(m, n), planes, [full] * len(planes), body, [row_type] * len(planes))
    return results[:len(planes)], [_transposed2d(b, t) for t in results[len(planes):]]


@_lapack("orgqr")
def orgqr(ctx: RuleContext, a, taus):
    b, out = ctx.b, ctx.out_type
    dtype = compute_dtype(out.dtype)
    reflectors, taus = flat(b, a, ctx.in_types[0], 2, dtype), flat(b, taus, ctx.in_types[1], 1, dtype)
    return unflat(b, householder_q(b, [reflectors], [taus], out.shape, ctx.in_types[1].shape[-1], dtype)[0], out)


def householder_q(b: Builder, reflectors: Planes, taus: Planes, shape: tuple[int, ...], k: int,
                  dtype: np.dtype) -> Planes:
    """Q = H_0 ... H_{k-1} applied to the first columns of the identity, last reflector first (LAPACK's org2r,
    ung2r): `reflectors` (B, m, k') planes, `taus` (B, k) planes, Q of `shape` (batch..., m, n)."""
    *_, m, n = shape
    batch = prod(shape[:-2])
    taus = [reshape_to(b, t, [batch, k, 1]) for t in taus]
    row = iota(b, m, (m, 1))
    zero, one = b.const(np.zeros((), dtype)), b.const(np.ones((), dtype))
    heads = [one, zero][:len(reflectors)]

    def body(sb: Builder, step: ir.Value, carried: list[ir.Value]):
        i = sb.op("Sub", sb.const(np.int64(k - 1)), step)
        i1 = loop_step(sb, i)
        at = sb.op("Equal", row, i)
        v = [sb.op("Where", sb.op("Greater", row, i), sb.op("Gather", x, i1, axis=2),
                   sb.op("Where", at, head, zero)) for x, head in zip(reflectors, heads)]
        # Columns left of i are zero from row i down: the update leaves them exactly as they are.
        w = matmul(sb, adjoint(sb, v), carried)
        minus_tau = [sb.op("Neg", sb.op("Gather", t, i1, axis=1)) for t in taus]
        return [sb.op("Add", q, u) for q, u in zip(carried, times(sb, v, times(sb, minus_tau, w, dtype), dtype))], []

    planes = [eye(b, batch, m, dtype, n), b.op("Expand", zero, b.shape_const([batch, m, n]))][:len(reflectors)]
    return loop(b, "orgqr", k, planes, [TensorType((batch, m, n), dtype)] * len(planes), body)


# -- tridiagonal solve -----------------------------------------------------------------------------------
@_lapack("gtsv")
@register_custom_call("lapack_cgtsv_ffi", "lapack_zgtsv_ffi")
def gtsv(ctx: RuleContext, dl, d, du, rhs):
    """LAPACK's gtsv (zgtsv for complex planes): Gaussian elimination with row swaps when the sub-diagonal is
    larger than the diagonal (for complex entries in |re| + |im|, zgtsv's cabs1), then back substitution with
    U's three diagonals. JAX's dl[0] and du[-1] lie outside the matrix and are not read."""
    b = ctx.b
    if any(list(ctx.hlo_op.results[i].uses) for i in range(3)):
        raise NotImplementedError("the factored diagonals @lapack_?gtsv_ffi returns are not translated")
    t_rhs, t_info = ctx.in_types[3], ctx.out_types[4]
    dtype = compute_dtype(real_dtype(t_rhs.dtype))
    *_, n, r = t_rhs.shape
    batch = prod(t_rhs.shape[:-2])
    zero = b.const(np.zeros((), dtype))
    lower, diag, upper = (planes(b, v, t, 1, dtype) for v, t in zip((dl, d, du), ctx.in_types))
    past_end = b.op("Equal", iota(b, n, (1, n)), b.const(np.int64(n - 1)))
    upper = [b.op("Where", past_end, zero, v) for v in upper]
    x = planes(b, rhs, t_rhs, 2, dtype)
    count = len(x)
    vec, mat = [TensorType((batch, 1), dtype)] * count, [TensorType((batch, r), dtype)] * count

    def size(sb: Builder, v: Planes) -> ir.Value:
        return sb.op("Add", *(sb.op("Abs", p) for p in v)) if count > 1 else sb.op("Abs", v[0])

    def div(sb: Builder, v: Planes, w: Planes) -> Planes:
        # LAPACK's division: a zero divisor gives NaN, and then info > 0 makes JAX's result NaN anyway.
        return [sb.op("Div", *v, *w)] if count == 1 else list(divide(sb, dtype, Z(*v), Z(*w), xla_zero_divisor=False))

    def minus(sb: Builder, v: Planes, w: Planes) -> Planes:
        return [sb.op("Sub", p, q) for p, q in zip(v, w)]

    def eliminate(sb: Builder, i: ir.Value, carried: list[ir.Value]):
        """Row i (carried, already updated) against the original row i + 1; yields U's row i."""
        d_i, du_i, b_i = carried[:count], carried[count:2 * count], carried[2 * count:]
        j = sb.op("Add", i, sb.const(np.int64(1)))
        j1 = loop_step(sb, j)
        dl_j, d_j, du_j = ([sb.op("Gather", p, j1, axis=1) for p in v] for v in (lower, diag, upper))
        b_j = [sb.op("Gather", p, j, axis=1) for p in x]
        keep = sb.op("GreaterOrEqual", size(sb, d_i), size(sb, dl_j))

        def pick(v: Planes, w: Planes) -> Planes:
            return [sb.op("Where", keep, p, q) for p, q in zip(v, w)]

        fact = pick(div(sb, dl_j, d_i), div(sb, d_i, dl_j))
        u = [*pick(d_i, dl_j), *pick(du_i, d_j), *pick([zero] * count, du_j), *pick(b_i, b_j)]
        next_row = [*pick(minus(sb, d_j, times(sb, fact, du_i, dtype)), minus(sb, du_i, times(sb, fact, d_j, dtype))),
                    *pick(du_j, [sb.op("Neg", p) for p in times(sb, fact, du_j, dtype)]),
                    *pick(minus(sb, b_j, times(sb, fact, b_i, dtype)), minus(sb, b_i, times(sb, fact, b_j, dtype)))]
        return next_row, u

    first = b.const(np.asarray([0], np.int64))
    start = [*(b.op("Gather", p, first, axis=1) for p in (*diag, *upper)),
             *(b.op("Gather", p, b.const(np.int64(0)), axis=1) for p in x)]
    results = loop(b, "gtsv_eliminate", n - 1, start, [*vec, *vec, *mat], eliminate, [*vec, *vec, *vec, *mat])
    last_d, last_b = results[:count], results[2 * count:3 * count]
    # U's last row: its diagonal only.
    tails = [*last_d, *[b.splat(0, dtype, (batch, 1))] * (2 * count), *last_b]
    u = [b.op("Concat", rows, b.op("Unsqueeze", tail, b.shape_const([0])), axis=0)
         for rows, tail in zip(results[3 * count:], tails)]
    u0, u1, u2, y = (u[k * count:(k + 1) * count] for k in range(4))

    def substitute(sb: Builder, step: ir.Value, carried: list[ir.Value]):
        x1, x2 = carried[:count], carried[count:]  # x[i + 1], x[i + 2]
        i = sb.op("Sub", sb.const(np.int64(n - 1)), step)
        c0, c1, c2, yi = ([sb.op("Gather", p, i, axis=0) for p in v] for v in (u0, u1, u2, y))
        xi = div(sb, minus(sb, minus(sb, yi, times(sb, c1, x1, dtype)), times(sb, c2, x2, dtype)), c0)
        return [*xi, *x1], xi

    solution = loop(b, "gtsv_substitute", n, [b.splat(0, dtype, (batch, r))] * (2 * count), mat * 2, substitute,
                    mat)[2 * count:]
    solution = [b.op("Transpose", reversed_axes(b, p, [0]), perm=[1, 0, 2]) for p in solution]
    singular = b.op("And", *(b.op("Equal", p, zero) for p in u0)) if count > 1 else b.op("Equal", u0[0], zero)
    info = first_failure(b, _transposed2d(b, reshape_to(b, singular, [n, batch])), t_info)
    # The factored diagonals are unused (checked above): the operands stand in for them.
    return dl, d, du, join(b, solution, ctx.out_types[3]), info
