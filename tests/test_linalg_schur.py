"""The Schur decomposition (hlo2onnx/ops/linalg/schur.py): jax.scipy.linalg.schur and jax.lax.linalg.schur (LAPACK
gees), real and complex, with and without vectors, in both x64 modes, against jax.jit.

A = Z T Z^H is unique only up to the order of the eigenvalues on T's diagonal and the signs (phases) of Z's
columns, so most rows compare as decompositions: the same shapes and dtypes as jax.jit's, Z orthogonal
(unitary), Z T Z^H = A, T upper triangular (real: quasi-triangular, its 2 x 2 blocks in LAPACK's standard form
with equal diagonal entries and off-diagonal ones of opposite signs) and T's eigenvalues those of jax.jit's T.
Where the decomposition is unique (1 x 1, triangular input, a NaN) the results are compared directly."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import jax
import jax.scipy.linalg as jsl
import numpy as np
import pytest
from jax import lax

from harness import Case, assert_same, check_model, rand
from mnjit import mnjit


@dataclass
class Row:
    name: str
    a: np.ndarray  # float64 / complex128; cast to the case's dtype
    output: str = "real"  # jsl.schur's output
    vectors: bool = True
    direct: bool = False  # unique: compare T and Z with jax.jit's as they are

    def __repr__(self) -> str:
        return self.name


def crand(shape, seed=0):
    return rand(shape, np.float64, seed) + 1j * rand(shape, np.float64, seed + 100)


def _orthogonal(n, seed):
    return np.linalg.qr(rand((n, n), np.float64, seed))[0]


def _similar(d, seed):
    """A nonsymmetric matrix with the eigenvalues of the (block) diagonal d: S d S^-1 for a well-conditioned S."""
    s = np.eye(len(d)) + 0.2 * rand(d.shape, np.float64, seed, -1, 1)
    return s @ d @ np.linalg.inv(s)


def _rotations(*pairs):
    """Block diagonal with 2 x 2 blocks [[re, -im], [im, re]]: the eigenvalues re +- i im."""
    d = np.zeros((2 * len(pairs), 2 * len(pairs)))
    for k, (re, im) in enumerate(pairs):
        d[2 * k:2 * k + 2, 2 * k:2 * k + 2] = [[re, -im], [im, re]]
    return d


SYMMETRIC = rand((6, 6), np.float64, 3)
HERMITIAN = crand((5, 5), 4)
NAN = rand((4, 4), np.float64, 5)
NAN[1, 2] = np.nan

ROWS = [
    *(Row(f"real_{n}", rand((n, n), np.float64, n)) for n in (1, 2, 3, 5, 8)),
    Row("real_batched", rand((2, 3, 5, 5), np.float64, 9)),
    Row("real_complex_pairs", _similar(_rotations((1, 2), (-0.5, 1), (2, 0.5)), 10)),
    Row("real_complex_pairs_and_real", _similar(np.block([[_rotations((0.3, 1.5)), np.zeros((2, 3))],
                                                          [np.zeros((3, 2)), np.diag([2.0, -1.0, 0.5])]]), 11)),
    Row("real_repeated", _similar(np.diag([2.0, 2.0, 2.0, -1.0, -1.0]), 12)),
    Row("real_repeated_pairs", _similar(_rotations((1, 1), (1, 1)), 13)),
    Row("real_triangular", np.triu(rand((5, 5), np.float64, 14)), direct=True),
    Row("real_triangular_repeated", np.diag([2.0, 2.0, 2.0, 1.0, 1.0]) + np.triu(np.ones((5, 5)), 1), direct=True),
    Row("real_symmetric", SYMMETRIC + SYMMETRIC.T),
    Row("real_cyclic_permutation", np.roll(np.eye(6), 1, axis=0)),  # |eigenvalues| all 1: exceptional shifts
    Row("real_orthogonal", _orthogonal(5, 15)),
    Row("real_zero", np.zeros((4, 4)), direct=True),
    Row("real_1x1", np.array([[-2.5]]), direct=True),
    Row("real_2x2_complex", np.array([[1.0, -3.0], [2.0, 0.5]])),
    Row("real_2x2_real", np.array([[1.0, 3.0], [2.0, 0.5]])),
    Row("real_without_vectors", rand((5, 5), np.float64, 16), vectors=False),
    Row("real_batched_without_vectors", rand((3, 4, 4), np.float64, 17), vectors=False),
    Row("real_nan", NAN, direct=True),
    Row("real_empty_batch", np.zeros((0, 3, 3)), direct=True),
    *(Row(f"complex_{n}", crand((n, n), n)) for n in (1, 2, 3, 5, 8)),
    Row("complex_batched", crand((2, 2, 4, 4), 20)),
    Row("complex_of_real", rand((5, 5), np.float64, 21), output="complex"),
    Row("complex_of_real_pairs", _similar(_rotations((1, 2), (-0.5, 1)), 22), output="complex"),
    Row("complex_repeated", _similar(np.diag([1 + 1j, 1 + 1j, 1 + 1j, -2.0, -2.0]), 23)),
    Row("complex_triangular", np.triu(crand((4, 4), 24)), direct=True),
    Row("complex_hermitian", HERMITIAN + HERMITIAN.conj().T),
    Row("complex_without_vectors", crand((5, 5), 25), vectors=False),
    Row("complex_nan", NAN + 0j, direct=True),
]

def schur(row: Row):
    if not row.vectors:
        return lambda a: lax.linalg.schur(a, compute_schur_vectors=False)[0]
    return lambda a: jsl.schur(a, output=row.output)


def eigenvalues(t: np.ndarray) -> np.ndarray:
    """The eigenvalues of quasi-triangular (..., n, n) T, flattened."""
    return np.concatenate([np.linalg.eigvals(m) for m in t.reshape(-1, *t.shape[-2:]).astype(np.complex128)]) \
        if t.size else np.zeros(0)


def assert_same_eigenvalues(actual: np.ndarray, expected: np.ndarray, tol: float) -> None:
    """Equal as multisets, each matched to its nearest (a repeated eigenvalue of a diagonalizable matrix moves by
    about eps, so nearest matching is unambiguous here)."""
    assert actual.shape == expected.shape
    remaining = list(expected)
    for value in actual:
        k = int(np.argmin(np.abs(np.asarray(remaining) - value)))
        assert abs(remaining[k] - value) <= tol, (value, remaining)
        remaining.pop(k)


def assert_quasi_triangular(t: np.ndarray, real: bool) -> None:
    """Exact zeros below the subdiagonal (below the diagonal when complex); real: 2 x 2 blocks apart from each
    other, each with equal diagonal entries and off-diagonal ones of opposite signs (LAPACK's standard form)."""
    n = t.shape[-1]
    assert not np.tril(t, -2 if real else -1).any()
    if not real or n < 2:
        return
    sub = np.diagonal(t, -1, -2, -1)
    assert not (sub[..., 1:] != 0)[sub[..., :-1] != 0].any(), "two 2 x 2 blocks overlap"
    blocks = np.nonzero(sub)
    d, sup = np.diagonal(t, 0, -2, -1), np.diagonal(t, 1, -2, -1)
    j = blocks[-1]
    assert (d[(*blocks[:-1], j)] == d[(*blocks[:-1], j + 1)]).all()
    assert (sup[blocks] * sub[blocks] < 0).all()


def _case(row: Row, x64: bool) -> Case:
    """float32 / complex64 without x64, float64 / complex128 with."""
    dtype = (np.complex128 if x64 else np.complex64) if np.iscomplexobj(row.a) else \
        (np.float64 if x64 else np.float32)
    return Case(f"{row.name}_{64 if x64 else 32}", schur(row), [np.asarray(row.a, dtype)], x64=x64)


# harness Cases (also what the rule coverage test and the support matrix read), each with its row
CASES = [_case(row, x64) for row in ROWS for x64 in (False, True)]
ROW_OF = {case.name: row for case, row in zip(CASES, (row for row in ROWS for _ in range(2)))}


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_schur(case: Case):
    row, (a,) = ROW_OF[case.name], case.args
    with jax.enable_x64(True) if case.x64 else contextlib.nullcontext():
        expected = jax.jit(case.fun)(a)
        compiled = mnjit(case.fun)
        actual = compiled(a)
        check_model(compiled.lower(a).onnx_model)
    if row.direct:
        assert_same(actual, expected, (0, 0) if "triangular" in row.name or "zero" in row.name else None, row.name)
        return
    kinds = lambda tree: jax.tree.map(lambda x: (type(x), x.shape, x.dtype, x.weak_type), tree)
    assert kinds(actual) == kinds(expected)
    t, t_expected = (np.asarray(x[0] if row.vectors else x) for x in (actual, expected))
    eps = np.finfo(a.dtype).eps
    n = a.shape[-1]
    scale = max(1.0, float(np.abs(a).max()))
    tol = 20 * n * eps * scale
    assert_quasi_triangular(t, real=not np.iscomplexobj(t))
    assert_same_eigenvalues(eigenvalues(t), eigenvalues(t_expected), 50 * tol if "repeated" in row.name else tol)
    if row.vectors:
        z = np.asarray(actual[1])
        zh = np.conj(np.swapaxes(z, -1, -2))
        np.testing.assert_allclose(zh @ z, np.broadcast_to(np.eye(n), z.shape), atol=tol)
        np.testing.assert_allclose(z @ t @ zh, a, atol=tol)


def test_schur_without_vectors_is_the_same_t():
    """compute_schur_vectors=False drops Z only: T is the one the full decomposition has."""
    a = rand((6, 6), np.float32, 30)
    t = mnjit(lambda a: lax.linalg.schur(a, compute_schur_vectors=False)[0])(a)
    np.testing.assert_array_equal(np.asarray(t), np.asarray(mnjit(jsl.schur)(a)[0]))


def test_schur_is_one_loop_nest():
    """Hessenberg reduction, then QR steps whose bulge chase is a Loop inside the Loop: no unrolling in n."""
    model = mnjit(jsl.schur).lower(rand((8, 8), np.float32, 31)).onnx_model
    top = [node.op_type for node in model.graph.node]
    assert top.count("Loop") == 2, top  # gehrd, then the QR iteration
    qr = next(node for node in model.graph.node if node.op_type == "Loop" and any(
        n.op_type == "Loop" for attr in node.attribute for n in attr.g.node))
    assert [n.op_type for attr in qr.attribute for n in attr.g.node].count("Loop") == 1
