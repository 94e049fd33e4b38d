"""jnp.linalg.eig / eigvals and lax.linalg.eig (LAPACK geev on CPU), against jax.jit.

The eigenvalues come in the Schur form's order, which is not LAPACK's, and eigenvectors are unique only up to a
unit phase: eigenvalues are compared as multisets (each of jax.jit's with the nearest of ours), each eigenvector
with jax.jit's for the same eigenvalue after taking its phase, on matrices V diag(d) V^-1 whose eigenvalues are
well apart; A v = v w, u^H A = w u^H, unit norms and the real largest component are checked too, and where
vectors are not unique (repeated eigenvalues) only those."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import Case, both, run_case
from mnjit import mnjit

# Tolerances relative to the matrix's norm (values) or absolute (unit vectors).
TOL = {np.float32: 2e-5, np.float64: 1e-12}
REAL = {np.float32: np.float32, np.float64: np.float64, np.complex64: np.float32, np.complex128: np.float64}


def eig(left: bool, right: bool):
    return lambda a: jax.lax.linalg.eig(a, compute_left_eigenvectors=left, compute_right_eigenvectors=right)


def eigenmatrix(shape, dtype, seed: int = 0) -> np.ndarray:
    """V diag(d) V^-1 with random V and eigenvalues d with distinct real parts a unit apart (imaginary parts in
    [-2, 2]); for a real dtype a third of them are conjugate pairs a +- bi, b in [0.5, 2], each from a real
    block [[a, b], [-b, a]], so that the matrix is real."""
    rng = np.random.default_rng(seed)
    *batch, n, _ = shape
    complex_ = np.dtype(dtype).kind == "c"
    out = np.empty(shape, np.complex128 if complex_ else np.float64)
    for index in np.ndindex(*batch):
        if complex_:
            d = np.diag(rng.permutation(n) - n / 2 + 1j * rng.uniform(-2, 2, n))
            v = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
        else:
            pairs = (n + 1) // 3
            centers = iter(rng.permutation(n - pairs) - n / 2)
            d, i = np.zeros((n, n)), 0
            for block in rng.permutation([2] * pairs + [1] * (n - 2 * pairs)):
                d[i, i] = d[i + block - 1, i + block - 1] = next(centers)
                if block == 2:
                    d[i, i + 1] = rng.uniform(0.5, 2)
                    d[i + 1, i] = -d[i, i + 1]
                i += block
            v = rng.standard_normal((n, n))
        out[index] = v @ d @ np.linalg.inv(v)
    return out.astype(dtype)


def matched(w, w0):
    """w's entries reordered to stand beside w0's nearest ones (greedily, per matrix)."""
    flat, flat0 = w.reshape(-1, w.shape[-1]), w0.reshape(-1, w0.shape[-1])
    order = np.zeros(flat.shape, np.int64)
    for i in range(flat.shape[0]):
        free = np.ones(flat.shape[-1], bool)
        for j, value in enumerate(flat0[i]):
            k = np.argmin(np.where(free, np.abs(flat[i] - value), np.inf))
            order[i, j], free[k] = k, False
    return order.reshape(w.shape)


def adjoint(x):
    return np.conj(np.swapaxes(x, -1, -2))


def check_vectors(a, w, v, tol, what, left=False):
    """A v = v w (u^H A = w u^H), unit columns, the largest component of each real."""
    norm = max(1.0, np.abs(a).max()) * a.shape[-1]
    residual = adjoint(v) @ a - w[..., :, None] * adjoint(v) if left else a @ v - v * w[..., None, :]
    np.testing.assert_allclose(residual, 0, atol=tol * norm, err_msg=f"{what}: eigen-equation")
    np.testing.assert_allclose(np.linalg.norm(v, axis=-2), 1, atol=tol, err_msg=f"{what}: norms")
    largest = np.take_along_axis(v, np.argmax(np.abs(v), axis=-2)[..., None, :], -2)
    np.testing.assert_allclose(largest.imag, 0, atol=tol, err_msg=f"{what}: largest component real")


def check_eig(a, actual, expected, left: bool, right: bool, dtype, unique: bool = True):
    """actual against jax.jit's `expected` ([w, vl?, vr?]); vectors against jax.jit's only if `unique`."""
    tol = TOL[REAL[dtype]]
    w, w0 = actual[0], expected[0]
    order = matched(w, w0)
    np.testing.assert_allclose(np.take_along_axis(w, order, -1), w0, rtol=0,
                               atol=tol * max(1.0, np.abs(a).max()) * a.shape[-1], err_msg="eigenvalues")
    for v, v0, is_left in zip(actual[1:], expected[1:], [side for side in (True, False) if (left, right)[1 - side]]):
        what = "left" if is_left else "right"
        check_vectors(a, w, v, tol, what, is_left)
        if unique:
            v = np.take_along_axis(v, order[..., None, :], -1)
            phases = np.sum(np.conj(v) * v0, axis=-2, keepdims=True)
            np.testing.assert_allclose(v * phases / np.abs(phases), v0, atol=tol * 10, err_msg=f"{what} vectors")


DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
MODES = {"both": (True, True), "left": (True, False), "right": (False, True), "none": (False, False)}
X64 = (np.float64, np.complex128)


def _case(shape, dtype, mode, seed=0):
    name = f"eig_{mode}_{np.dtype(dtype).name}_{'x'.join(map(str, shape))}"
    return pytest.param(Case(name, eig(*MODES[mode]), [eigenmatrix(shape, dtype, seed + sum(shape))],
                             x64=dtype in X64), *MODES[mode], dtype, id=name)


SPECTRA = ([_case(shape, dtype, "both") for dtype in DTYPES for shape in [(1, 1), (2, 2), (3, 3), (8, 8), (2, 3, 5, 5)]]
           + [_case((2, 4, 4), dtype, mode) for dtype in DTYPES for mode in ("left", "right", "none")])


@pytest.mark.parametrize("case, left, right, dtype", SPECTRA)
def test_eig(case, left, right, dtype):
    actual, expected = both(case.fun, case.args, case.x64)
    check_eig(case.args[0], actual, expected, left, right, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_real_matrix_structure(dtype):
    """A real matrix's real eigenvalues are real, with real vectors; its pairs are exact conjugates, the one
    with positive imaginary part first and its partner right after it (LAPACK's layout), as their vectors."""
    a = eigenmatrix((3, 7, 7), dtype, seed=11)
    (w, vl, vr), _ = both(eig(True, True), [a], dtype == np.float64)
    for index in np.ndindex(3):
        values, k = w[index], 0
        while k < 7:
            if values[k].imag == 0:
                assert not vl[index][:, k].imag.any() and not vr[index][:, k].imag.any()
                k += 1
                continue
            assert values[k].imag > 0 and values[k + 1] == np.conj(values[k])
            for v in (vl[index], vr[index]):
                np.testing.assert_array_equal(v[:, k + 1], np.conj(v[:, k]))
            k += 2
        assert np.sum(values.imag == 0) == 7 - 2 * ((7 + 1) // 3)  # as many real ones as eigenmatrix made


@pytest.mark.parametrize("case, dtype", [
    pytest.param(Case("eig_all_real", eig(True, True), [np.array([[2.0, 1, 0], [1, 3, 1], [0, 1, 4]]) @
                                                        np.array([[1.0, 2, 0], [0, 1, 0], [0, 0, 1]])], x64=True),
                 np.float64, id="all_real"),
    pytest.param(Case("eig_rotation", eig(True, True), [np.array([[0.6, -0.8], [0.8, 0.6]], np.float32)]),
                 np.float32, id="rotation"),
    pytest.param(Case("eig_quarter_turn", eig(True, True), [np.array([[0.0, -1], [1, 0]], np.float32)]),
                 np.float32, id="pure_imaginary_pair"),
    pytest.param(Case("eig_cyclic", eig(True, True), [np.roll(np.eye(5, dtype=np.float32), 1, axis=0)]),
                 np.float32, id="cyclic_permutation"),
    pytest.param(Case("eig_triangular_c64", eig(True, True),
                      [np.triu(eigenmatrix((4, 4), np.complex64, seed=3)) + np.diag(np.arange(4.0) * 2)]),
                 np.complex64, id="triangular"),
], ids=repr)
def test_special_matrices(case, dtype):
    """Real spectra stay real; a rotation's eigenvalues are a pure imaginary pair at its angle; a cyclic
    permutation (the Wilkinson shift stalls on it: the exceptional shift gets it going) has the roots of unity;
    a triangular matrix is its own Schur form."""
    actual, expected = both(case.fun, case.args, case.x64)
    check_eig(case.args[0], actual, expected, True, True, dtype)
    w = actual[0]
    if np.asarray(case.args[0]).dtype.kind == "f" and np.allclose(expected[0].imag, 0):
        assert not w.imag.any()


def jordan(n, value):
    return np.diag(np.full(n, value)) + np.diag(np.ones(n - 1), 1)


@pytest.mark.parametrize("case, dtype, tol", [
    pytest.param(Case("eig_identity", eig(True, True), [np.eye(4, dtype=np.float32)]), np.float32, 1e-6,
                 id="identity"),
    pytest.param(Case("eig_zero", eig(True, True), [np.zeros((2, 3, 3), np.complex64)]), np.complex64, 1e-6,
                 id="zero"),
    pytest.param(Case("eig_repeated", eig(True, True), [np.kron(np.eye(2), eigenmatrix((3, 3), np.float64, 4))],
                      x64=True), np.float64, 1e-10, id="repeated"),
    # A Jordan block's eigenvalue is sensitive to eps^(1/n) perturbations; its eigenvectors are all parallel.
    pytest.param(Case("eig_jordan", eig(True, True), [jordan(3, 2.0)], x64=True), np.float64, 1e-5, id="jordan"),
    pytest.param(Case("eig_jordan_similar", eig(False, True), [(lambda v: v @ jordan(3, -1.0) @ np.linalg.inv(v))(
        np.random.default_rng(5).standard_normal((3, 3)))], x64=True), np.float64, 1e-4, id="jordan_similar"),
], ids=repr)
def test_repeated_eigenvalues(case, dtype, tol):
    """The vectors of a repeated eigenvalue are not unique: values and the eigen-equations only."""
    a = case.args[0]
    actual, expected = both(case.fun, case.args, case.x64)
    w, w0 = actual[0], expected[0]
    np.testing.assert_allclose(np.take_along_axis(w, matched(w, w0), -1), w0, atol=tol * max(1, np.abs(a).max()))
    assert np.isfinite(actual[-1]).all()
    check_vectors(a, w, actual[-1], tol, "right")
    if len(actual) == 3:
        check_vectors(a, w, actual[1], tol, "left", left=True)


@pytest.mark.parametrize("case", [
    Case("eigvals_f32", lambda a: [jnp.linalg.eigvals(a)], [eigenmatrix((2, 6, 6), np.float32, 7)]),
    Case("eigvals_c128", lambda a: [jnp.linalg.eigvals(a)], [eigenmatrix((6, 6), np.complex128, 8)], x64=True),
    Case("eig_f64", jnp.linalg.eig, [eigenmatrix((6, 6), np.float64, 9)], x64=True),
], ids=repr)
def test_jnp_linalg(case):
    """jnp.linalg.eig and eigvals call the same routine (eigvals asks for no vectors)."""
    actual, expected = both(case.fun, case.args, case.x64)
    dtype = np.asarray(case.args[0]).dtype.type
    check_eig(case.args[0], actual, expected, False, len(actual) > 1, dtype)


@pytest.mark.parametrize("dtype, scale", [(np.float32, 1e30), (np.float32, 1e-30), (np.complex64, 1e25),
                                          (np.float64, 1e200), (np.float64, 1e-200)], ids=str)
def test_extreme_scales(dtype, scale):
    """Outside LAPACK's safe range, [sqrt(tiny) / eps, its reciprocal], the matrix is scaled to 1 first (as geev
    does). numpy's eig is the reference: jax.jit's CPU eig (jax 0.10.2) returns eigenvalues off by a factor
    there (its largest entry above about 1e12 or below 1e-12 in float32, 1e138 or 1e-138 in float64)."""
    a = eigenmatrix((2, 5, 5), dtype, seed=6)
    big = a * np.asarray(scale, a.real.dtype)
    with jax.enable_x64(dtype == np.float64):
        w, v = (np.asarray(x) for x in mnjit(jnp.linalg.eig)(big))
    w0 = np.linalg.eigvals(big.astype(np.complex128)) / scale
    tol = TOL[REAL[dtype]]
    np.testing.assert_allclose(np.take_along_axis(w / scale, matched(w / scale, w0), -1), w0, atol=tol * 10)
    check_vectors(big / scale, w / scale, v, tol * 10, "right")


def _with(value, dtype=np.float32):
    a = eigenmatrix((3, 3), np.float64, 1)
    a[1, 2] = value
    return a.astype(dtype)


# LAPACK rejects a matrix with a NaN or infinity and JAX reports NaN everywhere; so does the rule (info = 1).
@pytest.mark.parametrize("case", [
    Case("eig_nan", jnp.linalg.eig, [_with(np.nan)]),
    Case("eig_inf_c64", jnp.linalg.eig, [_with(np.inf, np.complex64)]),
    Case("eig_empty_batch", jnp.linalg.eig, [np.zeros((0, 3, 3), np.float32)]),
    Case("eig_0x0", jnp.linalg.eig, [np.zeros((2, 0, 0), np.complex64)]),
], ids=repr)
def test_nan_and_empty(case):
    run_case(case)


def test_nan_in_one_matrix_of_a_batch():
    """info is per matrix: the others' results stand."""
    a = np.stack([_with(np.nan), _with(1.0), _with(-np.inf)])
    (w, v), (w0, v0) = both(jnp.linalg.eig, [a], False)
    assert np.isnan(w[::2]).all() and np.isnan(v[::2]).all() and not np.isnan(w[1]).any()
    check_eig(a[1], [w[1], v[1]], [w0[1], v0[1]], False, True, np.float32)
