"""jnp.linalg.eigh / svd (LAPACK syevd and gesdd / gesvd on CPU) and the functions built on them, against jax.jit.

Values are compared within a tolerance relative to the matrix's largest one (Jacobi and LAPACK's reductions round
differently). Vectors are unique only up to sign, and LAPACK fixes none: each eigenvector (each U column with its
Vt row) is compared after taking jax.jit's sign, on spectra with well separated values; reconstruction and
orthonormality are checked too, also where the vectors are not unique (repeated or zero values, the completion
columns of full_matrices)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import Case, both, rand, run_case

# (values, vectors) tolerances, relative to the largest eigenvalue / singular value.
TOL = {np.float32: (1e-5, 5e-5), np.float64: (1e-12, 1e-11)}
F32_TOL, F64_TOL = (1e-4, 1e-5), (1e-10, 1e-12)  # for run_case rows: entries of pinv, lstsq, ...


def orthogonal(n, rng) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def symmetric(shape, seed=0, dtype=np.float32) -> np.ndarray:
    """Q diag(d) Q^T with eigenvalues at least 0.5 apart (of both signs): every eigenvector is well defined."""
    rng = np.random.default_rng(seed)
    batch, n = shape[:-2], shape[-1]
    out = np.empty(shape)
    for index in np.ndindex(*batch):
        d = np.arange(n) - n / 2 + rng.uniform(0, 0.5, n)
        q = orthogonal(n, rng)
        out[index] = (q * rng.permutation(d)) @ q.T
    return out.astype(dtype)


def spread(shape, seed=0, dtype=np.float32, rank=None) -> np.ndarray:
    """U diag(s) V^T with singular values in [1, k + 1], at least 0.5 apart (or only `rank` nonzero ones)."""
    rng = np.random.default_rng(seed)
    *batch, m, n = shape
    k = min(m, n)
    out = np.empty(shape)
    for index in np.ndindex(*batch):
        s = np.arange(k, 0, -1) + rng.uniform(0, 0.5, k)
        if rank is not None:
            s[rank:] = 0
        out[index] = (orthogonal(m, rng)[:, :k] * s) @ orthogonal(n, rng)[:, :k].T
    return out.astype(dtype)


def aligned(vectors, reference, axis):
    """`vectors` with each one's sign (a column for axis=-2) flipped to agree with `reference`, and the signs."""
    signs = np.where(np.sum(vectors * reference, axis=axis, keepdims=True) < 0, -1.0, 1.0)
    return vectors * signs, signs


def close(actual, expected, atol, what):
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol, err_msg=what)


DTYPES = [pytest.param(np.float32, id="f32"), pytest.param(np.float64, id="f64")]


# -- eigh --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (5, 5), (8, 8), (16, 16), (2, 3, 5, 5), (4, 4, 4)],
                         ids=str)
def test_eigh(shape, dtype):
    a = symmetric(shape, seed=sum(shape), dtype=dtype)
    (w, v), (w0, v0) = both(jnp.linalg.eigh, [a], dtype == np.float64)
    value_tol, vector_tol = TOL[dtype]
    norm = np.abs(w0).max()
    close(w, w0, value_tol * norm, "eigenvalues")
    close(aligned(v, v0, -2)[0], v0, vector_tol, "eigenvectors")
    close((v * w[..., None, :]) @ np.swapaxes(v, -1, -2), a, vector_tol * norm, "V diag(w) V^T")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_reads_one_triangle(uplo, dtype):
    """symmetrize_input=False hands LAPACK a matrix whose other triangle is garbage."""
    a = symmetric((6, 6), seed=3, dtype=dtype)
    garbage = rand((6, 6), dtype, seed=4, low=-50, high=50)
    a = np.where(np.tril(np.ones((6, 6), bool)) if uplo == "L" else np.triu(np.ones((6, 6), bool)), a, garbage)
    (w, v), (w0, v0) = both(lambda a: jnp.linalg.eigh(a, UPLO=uplo, symmetrize_input=False), [a],
                            dtype == np.float64)
    value_tol, vector_tol = TOL[dtype]
    close(w, w0, value_tol * np.abs(w0).max(), "eigenvalues")
    close(aligned(v, v0, -2)[0], v0, vector_tol, "eigenvectors")


@pytest.mark.parametrize("dtype", DTYPES)
def test_eigh_repeated_and_zero(dtype):
    """Repeated eigenvalues (vectors not unique: reconstruction and orthonormality only), a diagonal matrix and
    zero, in one batch."""
    rng = np.random.default_rng(5)
    q = orthogonal(6, rng)
    a = np.stack([(q * [1, 1, 1, -2, -2, 4]) @ q.T, np.diag([3.0, -1, 2, 0, 5, 1]), np.zeros((6, 6))]).astype(dtype)
    (w, v), (w0, _) = both(jnp.linalg.eigh, [a], dtype == np.float64)
    value_tol, vector_tol = TOL[dtype]
    close(w, w0, value_tol * 5, "eigenvalues")
    close(np.swapaxes(v, -1, -2) @ v, np.broadcast_to(np.eye(6), v.shape), vector_tol, "V^T V")
    close((v * w[..., None, :]) @ np.swapaxes(v, -1, -2), a, vector_tol * 5, "V diag(w) V^T")


# -- SVD ---------------------------------------------------------------------------------------------------
SVD_SHAPES = [(1, 1), (2, 2), (3, 3), (5, 5), (8, 8), (16, 16), (4, 6), (6, 4), (1, 5), (5, 1), (2, 4, 6), (3, 6, 4)]


def check_svd(a, u, s, vt, s0, u0, vt0, dtype, vectors=True):
    value_tol, vector_tol = TOL[dtype]
    norm = s0.max()
    close(s, s0, value_tol * norm, "singular values")
    k = s.shape[-1]
    if vectors:  # the first k columns of U; the others (full_matrices) complete them, not unique
        u_k, signs = aligned(u[..., :k], u0[..., :k], -2)
        close(u_k, u0[..., :k], vector_tol, "U")
        close(vt[..., :k, :] * np.swapaxes(signs, -1, -2), vt0[..., :k, :], vector_tol, "Vt")
    for x, what in ((u, "U^T U"), (np.swapaxes(vt, -1, -2), "Vt Vt^T")):
        close(np.swapaxes(x, -1, -2) @ x, np.broadcast_to(np.eye(x.shape[-1]), x.shape[:-2] + (x.shape[-1],) * 2),
              vector_tol, what)
    close((u[..., :k] * s[..., None, :]) @ vt[..., :k, :], a, vector_tol * norm, "U diag(s) Vt")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("full_matrices", [True, False], ids=["full", "reduced"])
@pytest.mark.parametrize("shape", SVD_SHAPES, ids=str)
def test_svd(shape, full_matrices, dtype):
    a = spread(shape, seed=sum(shape), dtype=dtype)
    (u, s, vt), (u0, s0, vt0) = both(lambda a: jnp.linalg.svd(a, full_matrices=full_matrices), [a],
                                     dtype == np.float64)
    check_svd(a, u, s, vt, s0, u0, vt0, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 5), (5, 6), (2, 4, 4)], ids=str)
def test_svd_rank_deficient(shape, dtype):
    """Zero singular values: U's columns for them complete the others to an orthonormal basis (not unique)."""
    a = spread(shape, seed=7, dtype=dtype, rank=2)
    (u, s, vt), (u0, s0, vt0) = both(jnp.linalg.svd, [a], dtype == np.float64)
    assert np.isfinite(u).all() and np.isfinite(vt).all()
    check_svd(a, u, s, vt, s0, u0, vt0, dtype, vectors=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_svd_qr_algorithm(dtype):
    """lax.linalg.svd(algorithm=QR) calls gesvd, with gesdd's operands and results."""
    a = spread((5, 7), seed=9, dtype=dtype)
    fun = lambda a: jax.lax.linalg.svd(a, full_matrices=False, algorithm=jax.lax.linalg.SvdAlgorithm.QR)
    (u, s, vt), (u0, s0, vt0) = both(fun, [a], dtype == np.float64)
    check_svd(a, u, s, vt, s0, u0, vt0, dtype)


def test_zero_matrix_svd():
    a = np.zeros((2, 4, 3), np.float32)
    (u, s, vt), (u0, s0, vt0) = both(jnp.linalg.svd, [a], False)
    assert not s.any()
    check_svd(a, u, s, vt, s0, u0, vt0, np.float32, vectors=False)


# -- what is built on them: compared with jax.jit directly -------------------------------------------------
def _cases(dtype, tol, x64):
    suffix = "_f64" if x64 else ""
    square, tall, wide = (spread(s, seed=i, dtype=dtype) for i, s in enumerate([(5, 5), (6, 4), (4, 6)]))
    batch, rank2 = spread((3, 4, 4), seed=4, dtype=dtype), spread((6, 5), seed=5, dtype=dtype, rank=2)
    rhs = rand((6, 2), dtype, seed=6)
    sym = symmetric((2, 8, 8), seed=7, dtype=dtype)
    rows = [
        ("eigvalsh", jnp.linalg.eigvalsh, [sym]),
        ("eigvalsh_1x1", jnp.linalg.eigvalsh, [sym[:, :1, :1]]),
        ("eigvalsh_upper", lambda a: jnp.linalg.eigvalsh(a, UPLO="U"), [sym[0]]),
        ("svdvals", lambda a: jnp.linalg.svd(a, compute_uv=False), [square]),
        ("svdvals_tall_batched", lambda a: jnp.linalg.svd(a, compute_uv=False), [np.stack([tall, 2 * tall])]),
        ("svdvals_wide", lambda a: jnp.linalg.svd(a, compute_uv=False), [wide]),
        ("svdvals_16", lambda a: jnp.linalg.svd(a, compute_uv=False), [spread((16, 16), seed=8, dtype=dtype)]),
        ("pinv", jnp.linalg.pinv, [square]),
        ("pinv_tall", jnp.linalg.pinv, [tall]),
        ("pinv_wide_batched", jnp.linalg.pinv, [np.stack([wide, wide[::-1]])]),
        ("pinv_rank_deficient", jnp.linalg.pinv, [rank2]),
        ("matrix_rank", jnp.linalg.matrix_rank, [square]),
        ("matrix_rank_deficient", jnp.linalg.matrix_rank, [rank2]),
        ("matrix_rank_batched", jnp.linalg.matrix_rank, [np.stack([rank2[:5], 0 * rank2[:5], square])]),
        ("norm_2", lambda a: jnp.linalg.norm(a, ord=2), [square]),
        ("norm_2_batched", lambda a: jnp.linalg.norm(a, ord=2, axis=(-2, -1)), [batch]),
        ("norm_nuc", lambda a: jnp.linalg.norm(a, ord="nuc"), [wide]),
        ("norm_minus_2", lambda a: jnp.linalg.norm(a, ord=-2), [tall]),
        ("cond", jnp.linalg.cond, [square]),
        ("cond_batched", jnp.linalg.cond, [batch]),
        ("lstsq_tall", lambda a, b: jnp.linalg.lstsq(a, b), [tall, rhs]),
        ("lstsq_wide", lambda a, b: jnp.linalg.lstsq(a, b), [wide, rhs[:4]]),
        ("lstsq_rank_deficient", lambda a, b: jnp.linalg.lstsq(a, b), [rank2, rhs]),
    ]
    return [Case(name + suffix, fun, args, tol=tol, x64=x64) for name, fun, args in rows]


BUILT = _cases(np.float32, F32_TOL, False) + _cases(np.float64, F64_TOL, True)


@pytest.mark.parametrize("case", BUILT, ids=repr)
def test_built_on_eigh_svd(case):
    run_case(case)


def _nan_off_diagonal() -> np.ndarray:
    a = np.diag([1.0, 2.0, 3.0]).astype(np.float32)
    a[0, 2] = a[2, 0] = np.nan
    return a


# LAPACK's NaN results are its implementation's: these are inputs on which it fails (a diagonal matrix with a NaN
# on it is returned as it is by syevd, with info 0; Jacobi reports NaN for any NaN in what it reads).
@pytest.mark.parametrize("case", [
    Case("eigh_nan", jnp.linalg.eigh, [_nan_off_diagonal()]),
    Case("svd_nan_off_diagonal", jnp.linalg.svd, [_nan_off_diagonal()]),
    Case("svd_nan", jnp.linalg.svd, [np.diag([1.0, 2.0, np.nan]).astype(np.float32)]),
    Case("svdvals_nan", lambda a: jnp.linalg.svd(a, compute_uv=False), [np.diag([1.0, 2.0, np.nan])], x64=True),
], ids=repr)
def test_nan_input_gives_nan(case):
    """LAPACK fails and JAX turns every result into NaN; Jacobi's info says the same."""
    run_case(case)


# -- complex Hermitian eigh (heevd) --------------------------------------------------------------------------
def hermitian(shape, seed=0, dtype=np.complex64) -> np.ndarray:
    """Q diag(d) Q^H with a random unitary Q and eigenvalues at least 0.5 apart."""
    rng = np.random.default_rng(seed)
    batch, n = shape[:-2], shape[-1]
    out = np.empty(shape, np.complex128)
    for index in np.ndindex(*batch):
        q, _ = np.linalg.qr(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
        out[index] = (q * rng.permutation(np.arange(n) - n / 2 + rng.uniform(0, 0.5, n))) @ q.conj().T
    return out.astype(dtype)


@pytest.mark.parametrize("dtype", [pytest.param(np.complex64, id="c64"), pytest.param(np.complex128, id="c128")])
@pytest.mark.parametrize("shape, uplo", [((1, 1), "L"), ((2, 2), "L"), ((3, 3), "U"), ((5, 5), "L"), ((8, 8), "U"),
                                         ((16, 16), "L"), ((2, 3, 4, 4), "L")], ids=str)
def test_eigh_hermitian(shape, uplo, dtype):
    """Complex eigenvectors are unique up to a unit phase: each is compared after taking jax.jit's."""
    a = hermitian(shape, seed=sum(shape), dtype=dtype)
    a = a + 1j * np.where(np.tril(np.ones(shape[-2:]), -1 if uplo == "U" else 0) == (uplo == "U"), 3, 0)
    x64 = dtype == np.complex128
    (w, v), (w0, v0) = both(lambda a: jnp.linalg.eigh(a, UPLO=uplo, symmetrize_input=False), [a], x64)
    value_tol, vector_tol = TOL[np.float64 if x64 else np.float32]
    norm = np.abs(w0).max()
    close(w, w0, value_tol * norm, "eigenvalues")
    phases = np.sum(np.conj(v) * v0, axis=-2, keepdims=True)
    close(v * phases / np.abs(phases), v0, vector_tol, "eigenvectors")
    h = a.copy()  # the Hermitian matrix of the `uplo` triangle: the other one holds garbage (+3i)
    h = np.where(np.tril(np.ones(shape[-2:], bool)) if uplo == "L" else np.triu(np.ones(shape[-2:], bool)), h,
                 np.conj(np.swapaxes(h, -1, -2)))
    close((v * w[..., None, :]) @ np.conj(np.swapaxes(v, -1, -2)), h, vector_tol * norm, "V diag(w) V^H")


def complex_spread(shape, seed=0, dtype=np.complex64, rank=None) -> np.ndarray:
    """U diag(s) V^H with random unitary U, V and spread() singular values."""
    rng = np.random.default_rng(seed)
    *batch, m, n = shape
    k = min(m, n)
    unitary = lambda n: np.linalg.qr(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))[0]
    out = np.empty(shape, np.complex128)
    for index in np.ndindex(*batch):
        s = np.arange(k, 0, -1) + rng.uniform(0, 0.5, k)
        if rank is not None:
            s[rank:] = 0
        out[index] = (unitary(m)[:, :k] * s) @ unitary(n)[:, :k].conj().T
    return out.astype(dtype)


@pytest.mark.parametrize("dtype", [pytest.param(np.complex64, id="c64"), pytest.param(np.complex128, id="c128")])
@pytest.mark.parametrize("full_matrices", [True, False], ids=["full", "reduced"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (5, 5), (16, 16), (4, 6), (6, 4), (2, 3, 5), (2, 5, 3)], ids=str)
def test_svd_complex(shape, full_matrices, dtype):
    """Complex singular vectors are unique up to a unit phase per U column and its Vt row."""
    a = complex_spread(shape, seed=sum(shape), dtype=dtype)
    x64 = dtype == np.complex128
    (u, s, vt), (u0, s0, vt0) = both(lambda a: jnp.linalg.svd(a, full_matrices=full_matrices), [a], x64)
    value_tol, vector_tol = TOL[np.float64 if x64 else np.float32]
    norm, k = s0.max(), s.shape[-1]
    close(s, s0, value_tol * norm, "singular values")
    phases = np.sum(np.conj(u[..., :k]) * u0[..., :k], axis=-2, keepdims=True)
    phases /= np.abs(phases)
    close(u[..., :k] * phases, u0[..., :k], vector_tol, "U")
    close(vt[..., :k, :] * np.conj(np.swapaxes(phases, -1, -2)), vt0[..., :k, :], vector_tol, "Vt")
    adjoint = lambda x: np.conj(np.swapaxes(x, -1, -2))
    for x, what in ((u, "U^H U"), (adjoint(vt), "Vt Vt^H")):
        close(adjoint(x) @ x, np.broadcast_to(np.eye(x.shape[-1]), x.shape[:-2] + (x.shape[-1],) * 2), vector_tol,
              what)
    close((u[..., :k] * s[..., None, :]) @ vt[..., :k, :], a, vector_tol * norm, "U diag(s) Vt")


@pytest.mark.parametrize("case", [
    Case("svdvals_c64", lambda a: jnp.linalg.svd(a, compute_uv=False), [complex_spread((2, 4, 6), seed=1)],
         tol=F32_TOL),
    Case("svd_c64_rank_deficient_svdvals", lambda a: jnp.linalg.svd(a, compute_uv=False),
         [complex_spread((6, 5), seed=2, rank=2)], tol=F32_TOL),
    Case("pinv_c64", jnp.linalg.pinv, [complex_spread((5, 3), seed=3)], tol=F32_TOL),
    Case("pinv_c64_rank_deficient", jnp.linalg.pinv, [complex_spread((4, 6), seed=4, rank=2)], tol=F32_TOL),
    Case("matrix_rank_c64", jnp.linalg.matrix_rank, [complex_spread((6, 5), seed=5, rank=3)]),
    Case("norm_2_c128", lambda a: jnp.linalg.norm(a, ord=2), [complex_spread((4, 4), seed=6, dtype=np.complex128)],
         tol=F64_TOL, x64=True),
    Case("lstsq_c128", lambda a, b: jnp.linalg.lstsq(a, b),
         [complex_spread((6, 4), seed=7, dtype=np.complex128), complex_spread((6, 2), seed=8, dtype=np.complex128)],
         tol=F64_TOL, x64=True),
    Case("svd_c64_nan", jnp.linalg.svd, [_nan_off_diagonal().astype(np.complex64)]),
], ids=repr)
def test_complex_built_on_gesdd(case):
    run_case(case)


@pytest.mark.parametrize("case", [
    Case("eigvalsh_c64", jnp.linalg.eigvalsh, [hermitian((2, 6, 6), seed=1)], tol=F32_TOL),
    Case("eigvalsh_c128", jnp.linalg.eigvalsh, [hermitian((6, 6), seed=2, dtype=np.complex128)], tol=F64_TOL,
         x64=True),
    Case("eigh_c64_nan", jnp.linalg.eigh, [_nan_off_diagonal().astype(np.complex64)]),
], ids=repr)
def test_hermitian_built_on_heevd(case):
    run_case(case)


@pytest.mark.parametrize("case", [
    Case("eigh_empty_batch", jnp.linalg.eigh, [np.zeros((0, 3, 3), np.float32)]),
    Case("eigh_0x0", jnp.linalg.eigh, [np.zeros((2, 0, 0), np.float32)]),
    Case("eigh_complex_empty_batch", jnp.linalg.eigh, [np.zeros((0, 3, 3), np.complex64)]),
    Case("svd_3x0", jnp.linalg.svd, [np.zeros((3, 0), np.float32)]),
    Case("svd_empty_batch", jnp.linalg.svd, [np.zeros((0, 3, 2), np.float32)]),
], ids=repr)
def test_empty(case):
    run_case(case)
