"""Linear algebra: jnp.linalg / jax.scipy.linalg (LAPACK custom calls on CPU), stablehlo.triangular_solve and
stablehlo.cholesky, each compared with jax.jit. Inputs are well conditioned: factorizations in f32 agree with
LAPACK's blocked algorithms to about 1e-5 relative, not to the last bit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from jax import export, lax

import hlo2onnx
from harness import Case, assert_same, check_model, rand, run_case
from hlo2onnx import UnsupportedOpError
from mnjit import mnjit

F32_TOL = (1e-4, 1e-5)
F64_TOL = (1e-10, 1e-12)


def general(shape, seed=0, dtype=np.float32):
    """Random and diagonally weighted: well conditioned, and partial pivoting still swaps rows."""
    a = rand(shape, np.float64, seed)
    n = min(shape[-2:])
    a[..., :n, :n] += 2 * np.eye(n)
    return a.astype(dtype)


def spd(shape, seed=0, dtype=np.float32):
    a = rand(shape, np.float64, seed)
    return (a @ np.swapaxes(a, -1, -2) / shape[-1] + np.eye(shape[-1])).astype(dtype)


def triangular(shape, lower, seed=0, dtype=np.float32):
    """A triangle with a dominant diagonal; the other triangle holds garbage the solve must not read."""
    a = rand(shape, np.float64, seed, low=-1, high=1)
    n = shape[-1]
    a += np.diag(np.where(np.arange(n) % 2, 1.0, -1.0) * (n + 1))
    garbage = rand(shape, np.float64, seed + 7, low=-100, high=100)
    keep = np.tril(np.ones((n, n), bool)) if lower else np.triu(np.ones((n, n), bool))
    return np.where(keep, a, garbage).astype(dtype)


def tridiagonal(batch, n, seed=0, dtype=np.float32, pivots=False):
    dl, d, du = (rand((*batch, n), np.float64, seed + i) for i in range(3))
    # Dominant diagonals never swap rows; small ones make gtsv swap most of them.
    d = d * 0.1 if pivots else d + np.sign(d) * 4
    return [v.astype(dtype) for v in (dl, d, du)] + [rand((*batch, n, 3), dtype, seed + 3)]


def complex_tridiagonal(batch, n, seed=0, pivots=False):
    """Complex diagonals and right-hand sides, as `tridiagonal` (zgtsv compares |re| + |im| to swap rows)."""
    parts = zip(tridiagonal(batch, n, seed, np.float64, pivots), tridiagonal(batch, n, seed + 10, np.float64, pivots))
    return [re + 1j * im for re, im in parts]


def lu_solve(a, b, trans=0):
    return jsl.lu_solve(jsl.lu_factor(a), b, trans=trans)


def cho_solve(a, b, lower=True):
    return jsl.cho_solve(jsl.cho_factor(a, lower=lower), b)


def _f32(name, fun, *args, tol=F32_TOL):
    return Case(f"{name}_f32", fun, args, tol)


def _f64(name, fun, *args, tol=F64_TOL):
    return Case(f"{name}_f64", fun, [np.asarray(a, np.float64) for a in args], tol, x64=True)


A5, B5, B53 = general((5, 5)), rand((5,), seed=1), rand((5, 3), seed=2)
A_BATCH, B_BATCH = general((2, 3, 4, 4), seed=3), rand((2, 3, 4, 2), seed=4)
S5, S_BATCH = spd((5, 5)), spd((3, 6, 6), seed=5)
L5, U5 = triangular((5, 5), True), triangular((5, 5), False, seed=1)
SINGULAR = np.array([[1, 2, 3], [2, 4, 6], [1, 0, 1]], np.float32)  # an exact zero pivot
# Complex: general, Hermitian positive definite, triangles with a complex diagonal (and garbage in the other one).
_C = rand((3, 5, 5), np.float64, 20) + 1j * rand((3, 5, 5), np.float64, 21)
HPD_BATCH = _C @ np.conj(np.swapaxes(_C, -1, -2)) / 5 + np.eye(5)
HPD5 = HPD_BATCH[0] + 1j * np.diag(rand((5,), np.float64, 22))  # LAPACK ignores the diagonal's imaginary part
CL5 = triangular((5, 5), True, seed=23).astype(np.float64) + 1j * triangular((5, 5), True, seed=24)
CU5 = triangular((5, 5), False, seed=25).astype(np.float64) + 1j * triangular((5, 5), False, seed=26)
CB53 = rand((5, 3), np.float64, 27) + 1j * rand((5, 3), np.float64, 28)
CA5, CA_BATCH = general((5, 5), 29, np.float64) + 1j * general((5, 5), 30, np.float64), _C + 2 * np.eye(5)
CSINGULAR = SINGULAR * np.array([1, 1j, 1 - 1j])  # an exact zero pivot

CASES = [
    # solve / inv / det: getrf + trsm
    _f32("solve_vec", jnp.linalg.solve, A5, B5),
    _f32("solve_mat", jnp.linalg.solve, A5, B53),
    _f32("solve_batched", jnp.linalg.solve, A_BATCH, B_BATCH),
    _f32("solve_big", jnp.linalg.solve, general((40, 40), seed=9), rand((40, 2), seed=10), tol=(1e-3, 1e-4)),
    _f32("inv", jnp.linalg.inv, A5),
    _f32("inv_batched", jnp.linalg.inv, A_BATCH),
    _f32("det", jnp.linalg.det, A5),
    _f32("det_batched", jnp.linalg.det, A_BATCH),
    _f32("det_singular", jnp.linalg.det, SINGULAR),
    _f32("slogdet", lambda a: tuple(jnp.linalg.slogdet(a)), A5),
    _f32("slogdet_batched", lambda a: tuple(jnp.linalg.slogdet(a)), A_BATCH),
    _f32("slogdet_singular", lambda a: tuple(jnp.linalg.slogdet(a)), SINGULAR),
    _f64("solve_batched", jnp.linalg.solve, A_BATCH, B_BATCH),
    _f64("inv", jnp.linalg.inv, A5),
    _f64("det", jnp.linalg.det, A5),
    # LU: getrf alone (pivots, permutation)
    _f32("lu", jsl.lu, A5),
    _f32("lu_tall", jsl.lu, general((6, 4), seed=6)),
    _f32("lu_wide", jsl.lu, general((3, 5), seed=7)),
    _f32("lu_batched", lambda a: tuple(lax.linalg.lu(a)), A_BATCH),
    _f32("lu_factor", jsl.lu_factor, A5),
    _f32("lu_factor_singular", jsl.lu_factor, SINGULAR),
    _f32("lu_solve", lu_solve, A5, B53),
    _f32("lu_solve_trans", lambda a, b: lu_solve(a, b, trans=1), A5, B53),
    _f64("lu", jsl.lu, A5),
    _f64("lu_solve_trans", lambda a, b: lu_solve(a, b, trans=2), A5, B53),
    # Cholesky: potrf
    _f32("cholesky", jnp.linalg.cholesky, S5),
    _f32("cholesky_batched", jnp.linalg.cholesky, S_BATCH),
    _f32("cholesky_upper", lambda a: jsl.cholesky(a, lower=False), S5),
    _f32("cholesky_not_pd", jnp.linalg.cholesky, A5 - 3 * np.eye(5, dtype=np.float32)),  # NaN, as jit gives
    _f32("cho_solve", cho_solve, S5, B53),
    _f32("cho_solve_upper", lambda a, b: cho_solve(a, b, lower=False), S5, B53),
    _f64("cholesky_batched", jnp.linalg.cholesky, S_BATCH),
    _f64("cho_solve", cho_solve, S5, B53),
    # triangular solves: trsm, every side / triangle / transpose / diagonal
    *[_f32(f"solve_triangular_{'lower' if lower else 'upper'}_t{trans}{'_unit' if unit else ''}",
           lambda a, b, lower=lower, trans=trans, unit=unit: jsl.solve_triangular(
               a, b, lower=lower, trans=trans, unit_diagonal=unit), L5 if lower else U5, B53)
      for lower in (True, False) for trans in (0, 1) for unit in (False, True)],
    _f32("solve_triangular_vec", lambda a, b: jsl.solve_triangular(a, b, lower=True), L5, B5),
    _f32("solve_triangular_batched", lambda a, b: jsl.solve_triangular(a, b, lower=False),
         triangular((2, 3, 4, 4), False, seed=2), B_BATCH),
    *[_f32(f"triangular_solve_right_{'lower' if lower else 'upper'}_t{int(trans)}",
           lambda a, b, lower=lower, trans=trans: lax.linalg.triangular_solve(
               a, b, left_side=False, lower=lower, transpose_a=trans), L5 if lower else U5, B53.T)
      for lower in (True, False) for trans in (False, True)],
    _f64("solve_triangular_upper_t1", lambda a, b: jsl.solve_triangular(a, b, lower=False, trans=1), U5, B53),
    # float16 has no LAPACK kernel: JAX emits stablehlo.triangular_solve
    Case("triangular_solve_f16", lambda a, b: lax.linalg.triangular_solve(a, b, left_side=True, lower=True),
         (L5.astype(np.float16), B53.astype(np.float16)), tol=(2e-3, 2e-3)),
    Case("triangular_solve_f16_right_upper",
         lambda a, b: lax.linalg.triangular_solve(a, b, left_side=False, lower=False, transpose_a=True),
         (U5.astype(np.float16), B53.T.astype(np.float16)), tol=(2e-3, 2e-3)),
    Case("triangular_solve_bf16", lambda a, b: lax.linalg.triangular_solve(a, b, left_side=True, lower=False),
         (U5.astype(ml_dtypes.bfloat16), B53.astype(ml_dtypes.bfloat16)), tol=(3e-2, 3e-2)),
    Case("triangular_solve_bf16_unit_x64", lambda a, b: lax.linalg.triangular_solve(a, b, left_side=True, lower=True,
                                                                                  unit_diagonal=True),
         (L5.astype(ml_dtypes.bfloat16), B53.astype(ml_dtypes.bfloat16)), tol=(3e-2, 3e-2), x64=True),
    # complex Cholesky and triangular solves: c/z potrf and trsm (through the real embedding)
    *[Case(f"complex_{name}_{np.dtype(dtype).name}", fun, [a.astype(dtype) for a in args], tol,
           x64=dtype == np.complex128)
      for dtype, tol in ((np.complex64, F32_TOL), (np.complex128, F64_TOL))
      for name, fun, args in (
          ("lu", jsl.lu, (CA5,)),
          ("lu_factor_batched", jsl.lu_factor, (CA_BATCH,)),
          ("lu_wide", jsl.lu, (CA5[:3],)),
          ("lu_tall", jsl.lu, (CA5[:, :3],)),
          ("lu_singular", jsl.lu_factor, (CSINGULAR,)),
          ("solve", jnp.linalg.solve, (CA5, CB53)),
          ("inv_det", lambda a: (jnp.linalg.inv(a), jnp.linalg.det(a)), (CA_BATCH,)),
          # a zero pivot: LAPACK's division gives NaN where XLA's complex division would give inf
          ("solve_singular", jnp.linalg.solve, (np.zeros((3, 3)), CB53[:3])),
          ("solve_triangular_zero_pivot", lambda a, b: jsl.solve_triangular(a, b, lower=False),
           (np.triu(CA5) * (1 - np.eye(5)[2]), CB53)),
          *[(f"qr_{mode}_{shape}", lambda a, mode=mode: jnp.linalg.qr(a, mode=mode), (a,))
            for mode in ("reduced", "complete", "r")
            for shape, a in {"square": CA5, "tall": CA5[:, :3], "wide": CA5[:3], "batched": CA_BATCH}.items()],
          ("qr_zero_tail", jnp.linalg.qr, (np.eye(4, 3) * 1j,)),  # nothing to annihilate: tau = 0
          ("householder_product", lax.linalg.householder_product, (CB53, CB53[:2, 0])),
          ("cholesky", jnp.linalg.cholesky, (HPD5,)),
          ("cholesky_upper_batched", lambda a: jsl.cholesky(a, lower=False), (HPD_BATCH,)),
          ("cholesky_not_pd", jnp.linalg.cholesky, (HPD5 - 9 * np.eye(5),)),
          ("cho_solve", cho_solve, (HPD5, CB53)),
          *[(f"solve_triangular_{'lower' if lower else 'upper'}_t{trans}{'_unit' if unit else ''}",
             lambda a, b, lower=lower, trans=trans, unit=unit: jsl.solve_triangular(
                 a, b, lower=lower, trans=trans, unit_diagonal=unit), (CL5 if lower else CU5, CB53))
            for lower in (True, False) for trans in (0, 1, 2) for unit in (False, True)],
          *[(f"triangular_solve_right_{'lower' if lower else 'upper'}_conj{int(conj)}",
             lambda a, b, lower=lower, conj=conj: lax.linalg.triangular_solve(
                 a, b, left_side=False, lower=lower, transpose_a=True, conjugate_a=conj), (CL5 if lower else CU5,
                                                                                          CB53.T))
            for lower in (True, False) for conj in (False, True)],
          # tridiagonal solve: c/z gtsv
          ("tridiagonal_solve", lax.linalg.tridiagonal_solve, complex_tridiagonal((), 6, seed=40)),
          ("tridiagonal_solve_pivoting", lax.linalg.tridiagonal_solve, complex_tridiagonal((), 7, 41, pivots=True)),
          ("tridiagonal_solve_pivoting_big", lax.linalg.tridiagonal_solve,
           complex_tridiagonal((), 12, 42, pivots=True)),
          ("tridiagonal_solve_batched", lax.linalg.tridiagonal_solve,
           complex_tridiagonal((2, 3), 5, 43, pivots=True)),
          ("tridiagonal_solve_n1", lax.linalg.tridiagonal_solve, complex_tridiagonal((2,), 1, seed=44)),
          ("tridiagonal_solve_n2_one_rhs", lax.linalg.tridiagonal_solve,
           [*complex_tridiagonal((), 2, 45, pivots=True)[:3], CB53[:2, :1]]),
          # row 2 is zero: info = 2 and JAX's result is NaN
          ("tridiagonal_solve_singular", lax.linalg.tridiagonal_solve,
           (np.zeros(4), np.array([1j, 0, 1 + 1j, 1]), np.array([1, 0, 1j, 0]), CB53[:4])),
      )],
    # QR: geqrf + orgqr
    *[_f32(f"qr_{mode}_{name}", lambda a, mode=mode: jnp.linalg.qr(a, mode=mode), a)
      for mode in ("reduced", "complete", "r")
      for name, a in {"square": A5, "tall": rand((6, 4), seed=11), "wide": rand((3, 5), seed=12)}.items()],
    _f32("qr_batched", lambda a: tuple(jnp.linalg.qr(a)), rand((2, 3, 5, 4), seed=13)),
    _f32("householder_product", lambda a, t: lax.linalg.householder_product(a, t), rand((5, 3), seed=14),
         rand((2,), seed=15, low=0, high=2)),
    _f64("qr_complete_tall", lambda a: tuple(jnp.linalg.qr(a, mode="complete")), rand((6, 4), seed=11)),
    _f64("qr_batched", lambda a: tuple(jnp.linalg.qr(a)), rand((3, 4, 4), seed=13)),
    # tridiagonal solve: gtsv
    _f32("tridiagonal_solve", lax.linalg.tridiagonal_solve, *tridiagonal((), 6)),
    _f32("tridiagonal_solve_pivoting", lax.linalg.tridiagonal_solve, *tridiagonal((), 7, seed=1, pivots=True),
         tol=(1e-3, 1e-4)),
    _f32("tridiagonal_solve_batched", lax.linalg.tridiagonal_solve, *tridiagonal((2, 3), 5, seed=2, pivots=True),
         tol=(1e-3, 1e-4)),
    _f32("tridiagonal_solve_n1", lax.linalg.tridiagonal_solve, *tridiagonal((2,), 1, seed=3)),
    _f32("tridiagonal_solve_singular", lax.linalg.tridiagonal_solve,
         np.zeros(4, np.float32), np.array([1, 0, 1, 1], np.float32), np.array([1, 0, 1, 0], np.float32),
         np.ones((4, 1), np.float32)),
    _f64("tridiagonal_solve_pivoting", lax.linalg.tridiagonal_solve, *tridiagonal((2,), 6, seed=4, pivots=True)),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_linalg(case):
    run_case(case)


# -- stablehlo.cholesky / stablehlo.triangular_solve: what JAX emits for TPU -----------------------------
def run_exported_for_tpu(fun, *args, tol):
    """Converts `fun` exported for TPU (which lowers to the StableHLO ops, not to LAPACK) and runs it on
    ONNX Runtime; the expected values come from jax.jit on CPU."""
    conversion = hlo2onnx.convert(export.export(jax.jit(fun), platforms=["tpu"])(*args))
    proto = conversion.to_proto()
    check_model(proto)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    actual = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), args)})
    expected = jax.jit(fun)(*args)
    assert_same([jnp.asarray(a) for a in actual], [expected], tol)
    return conversion.op_counts


TPU_CASES = {
    "cholesky": (lambda a: lax.linalg.cholesky(a, symmetrize_input=False), (S5,), "stablehlo.cholesky"),
    "cholesky_batched": (lambda a: lax.linalg.cholesky(a, symmetrize_input=False), (S_BATCH,),
                         "stablehlo.cholesky"),
    "triangular_solve_left_lower": (lambda a, b: lax.linalg.triangular_solve(a, b, left_side=True, lower=True),
                                    (L5, B53), "stablehlo.triangular_solve"),
    "triangular_solve_right_upper_t": (lambda a, b: lax.linalg.triangular_solve(
        a, b, left_side=False, lower=False, transpose_a=True, unit_diagonal=True), (U5, B53.T),
        "stablehlo.triangular_solve"),
}


@pytest.mark.parametrize("name", list(TPU_CASES))
def test_stablehlo_linalg_ops(name):
    fun, args, op = TPU_CASES[name]
    counts = run_exported_for_tpu(fun, *args, tol=F32_TOL)
    assert counts.get(op, 0) >= 1, counts


# -- what is refused, and how --------------------------------------------------------------------------------
# Every LAPACK routine jax emits is translated: eigh and svd (test_linalg_eig.py), eig (test_linalg_geev.py),
# hessenberg, tridiagonal, ormqr and pivoted QR (test_linalg_reductions.py), schur (test_linalg_schur.py), the rest
# here. jaxlib's perturbed tridiagonal solve is not.
def test_perturbed_tridiagonal_solve_is_refused():
    """tridiagonal_solve(perturb_singular=True) is refused by name, with what emitted it and the user's line."""
    z = (rand((4,)) + 4).astype(np.float32)
    with pytest.raises(UnsupportedOpError, match="tridiagonal_solve_perturbed_ffi has no ONNX translation; "
                                                 r"lax.linalg.tridiagonal_solve\(..., perturb_singular=True\)") as info:
        mnjit(lambda dl, d, du, b: lax.linalg.tridiagonal_solve(dl, d, du, b, perturb_singular=True))(
            z, z * 4, z, z[:, None])
    assert "jax.jit outside the converted function" in str(info.value)
    assert "test_linalg.py:" in str(info.value), str(info.value)


def test_untranslated_complex_lapack_has_a_hint():
    """A complex LAPACK routine jax does not emit (banded gbsv) is refused with the complex routines that are."""
    text = """func.func @main(%a: tensor<3x3xcomplex<f32>>) -> tensor<3x3xcomplex<f32>> {
      %0 = stablehlo.custom_call @lapack_cgbsv_ffi(%a) : (tensor<3x3xcomplex<f32>>) -> tensor<3x3xcomplex<f32>>
      return %0 : tensor<3x3xcomplex<f32>>
    }"""
    with pytest.raises(UnsupportedOpError, match=r"@lapack_cgbsv_ffi has no ONNX translation; this complex LAPACK "
                                                 r"routine is not translated \(complex gees, geev, .*gtsv.*\); run "
                                                 "that part with jax.jit"):
        hlo2onnx.convert(text.encode())


def test_gees_sorting_is_refused():
    """jax refuses sort_eig_vals itself; a hand-written gees that asks to sort is refused by name."""
    text = """func.func @main(%a: tensor<3x3xf32>) -> tensor<3x3xf32> {
      %0:6 = stablehlo.custom_call @lapack_sgees_ffi(%a) {mhlo.backend_config = {mode = 86 : ui8, sort = 83 : ui8}}
        : (tensor<3x3xf32>) -> (tensor<3x3xf32>, tensor<3x3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<i32>,
           tensor<i32>)
      return %0#0 : tensor<3x3xf32>
    }"""
    with pytest.raises(UnsupportedOpError, match="stablehlo.custom_call: gees with sorted eigenvalues"):
        hlo2onnx.convert(text.encode())


def test_unknown_custom_call_has_a_hint():
    text = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
      %0 = stablehlo.custom_call @my_kernel(%a) : (tensor<2xf32>) -> tensor<2xf32>
      return %0 : tensor<2xf32>
    }"""
    with pytest.raises(UnsupportedOpError, match="@my_kernel has no ONNX translation; run that part with jax.jit"):
        hlo2onnx.convert(text.encode())


def test_symbolic_batch_is_refused():
    """The routines whose Loops are built for static shapes refuse a symbolic batch by name, never baking it in
    as -1 (LU, Cholesky and the triangular solves take one: tests/test_dynamic_batch.py)."""
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("b, 3, 3"), np.float32)
    with pytest.raises(UnsupportedOpError, match="lapack_sgeqrf_ffi: dynamic dimensions are not supported"):
        hlo2onnx.convert(export.export(jax.jit(jnp.linalg.qr))(spec), dynamic=True)
