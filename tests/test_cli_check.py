"""The `hlo2onnx` command's --check on modules beyond the MLP of test_cli.py: typed PRNG keys, LAPACK calls and
complex values, each converted from saved text or a jax.export artifact and checked against JAX."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import onnxruntime as ort
import pytest
from jax import export, lax

import hlo2onnx
from harness import rand
from test_cli import run_cli


# jax.export artifacts whose arguments or results are typed PRNG keys (jax.random.key): the module holds their
# key data (uint32[..., 2] for threefry, [..., 4] for rbg), and jax writes a Shardy mesh op before the functions.
KEY_EXPORTS = {
    "normal": (lambda k: jax.random.normal(k, (3,)), lambda: (jax.random.key(0),)),
    "split_rbg": (lambda k, x: (jax.random.split(k), jax.random.uniform(k, (2,)) * x),
                  lambda: (jax.random.key(1, impl="rbg"), np.float32(2))),
    "batch_of_keys": (jax.vmap(lambda k: jax.random.bits(k, (2,))), lambda: (jax.random.split(jax.random.key(2), 4),)),
}


@pytest.mark.parametrize("case", list(KEY_EXPORTS))
def test_typed_key_artifacts_convert_and_check(case, tmp_path, capsys):
    fun, make_args = KEY_EXPORTS[case]
    args = make_args()
    source = tmp_path / "model.jaxexport"
    source.write_bytes(export.export(jax.jit(fun))(*args).serialize())
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--check"], capsys)
    assert status == 0, err
    assert out.rstrip().endswith(": ok"), out
    data = [np.asarray(jax.random.key_data(a) if jnp.issubdtype(jnp.result_type(a), jax.dtypes.prng_key) else a)
            for a in args]
    expected = [jax.random.key_data(e) if jnp.issubdtype(e.dtype, jax.dtypes.prng_key) else e
                for e in jax.tree_util.tree_leaves(jax.jit(fun)(*args))]
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    actual = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), data)})
    for a, e in zip(actual, expected):  # normal() goes through log: a few ulp (README)
        tol = 2e-6 if a.dtype.kind == "f" else 0
        np.testing.assert_allclose(a, np.asarray(e), rtol=tol, atol=tol)


def test_a_symbolic_batch_of_typed_keys_converts(tmp_path):
    """jax.random.split's sharding constraint (an Identity) holds the symbolic batch dim too."""
    fun = jax.vmap(lambda k: jax.random.uniform(k, (2,)))
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("b"), jax.random.key(0).dtype)
    hlo2onnx.convert(export.export(jax.jit(fun))(spec), tmp_path / "m.onnx", dynamic=True)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["b", 2]
    for n in (1, 5):
        keys = jax.random.split(jax.random.key(3), n)
        actual = session.run(None, {session.get_inputs()[0].name: np.asarray(jax.random.key_data(keys))})[0]
        np.testing.assert_array_equal(actual, np.asarray(jax.jit(fun)(keys)))


A3 = (rand((3, 3), seed=7) + 3 * np.eye(3)).astype(np.float32)
Z4 = (rand((4,), seed=8) + 1j * rand((4,), seed=9)).astype(np.complex64)
Z33 = (rand((3, 3), seed=10) + 1j * rand((3, 3), seed=11)).astype(np.complex64)
CHECKED = {
    # jax initializes its LAPACK kernels while lowering: a module compiled from saved text must do it itself.
    "eigvals": (jnp.linalg.eigvals, (A3,)),
    "cholesky": (lambda a: jnp.linalg.cholesky(a @ a.T), (A3,)),
    "qr": (lambda a: tuple(jnp.linalg.qr(a)), (A3,)),  # jax.export cannot serialize the namedtuple
    "svd": (lambda a: tuple(jnp.linalg.svd(a)), (A3,)),
    # complex inputs and outputs are (real, imag) pairs in the model, complex in JAX
    "complex-in-out": (lambda z, x: (z * x, jnp.abs(z)), (Z4, rand((4,), seed=1))),
    "fft": (jnp.fft.fft, (rand((8,), seed=2),)),
    # every linalg family: the reductions (real and complex) and the Schur form (gees)
    "hessenberg": (lax.linalg.hessenberg, (A3,)),
    "tridiagonal": (lambda a: lax.linalg.tridiagonal(a + a.T), (A3,)),
    "ormqr": (lambda a, c: lax.linalg.ormqr(a, a[0] * 0.3, c), (A3, A3)),
    "qr-pivoting": (lambda a: tuple(jsl.qr(a, pivoting=True)), (A3,)),
    "hessenberg-complex": (lax.linalg.hessenberg, (Z33,)),
    "tridiagonal-complex": (lambda a: lax.linalg.tridiagonal(a + a.conj().T), (Z33,)),
    "ormqr-complex": (lambda a, c: lax.linalg.ormqr(a, a[0] * 0.3, c), (Z33, Z33)),
    "qr-pivoting-complex": (lambda a: tuple(jsl.qr(a, pivoting=True)), (Z33,)),
    # The Schur form is unique for a triangular matrix (T = A, Z = I); for a general one its trace is.
    "schur": (lambda a: jsl.schur(jnp.triu(a)), (A3,)),
    "schur-complex": (lambda a: jsl.schur(jnp.triu(a)), (Z33,)),
    "schur-trace": (lambda a: jnp.trace(jsl.schur(a)[0]), (A3,)),
    "schur-complex-trace": (lambda a: jnp.trace(jsl.schur(a, output="complex")[0]), (A3,)),
    # XLA HLO text keeps erf and top_k as mhlo ops, gives multi-result custom calls one tuple, and leaves
    # layouts ({0,1}) on transposes
    "erf": (lax.erf, (rand((5,), seed=3),)),
    "top_k": (lambda x: lax.top_k(x, 3), (rand((9,), seed=4),)),
    "solve": (lambda a: jnp.linalg.solve(a, a[0]), (A3,)),
    "lu": (lambda a: tuple(jsl.lu(a)), (A3,)),
    "eigh": (lambda a: jnp.linalg.eigh(a + a.T)[0], (A3,)),
    "argmax": (lambda a: (jnp.argmax(a, 1), jnp.argmin(a, 0)), (A3,)),  # HLO text broadcasts a 1-d iota
}


# jax.export refuses to serialize these LAPACK calls (no compatibility guarantee): text only.
TEXT_ONLY = {"ormqr", "qr-pivoting", "ormqr-complex", "qr-pivoting-complex", "schur-complex", "schur-complex-trace"}


@pytest.mark.parametrize("case, fmt", [(case, fmt) for case in CHECKED for fmt in ("stablehlo-text", "jax-export", "hlo-text")
                                       if fmt != "jax-export" or case not in TEXT_ONLY])
def test_check_agrees_on_lapack_and_complex_modules(case, fmt, tmp_path, capsys):
    fun, args = CHECKED[case]
    source = tmp_path / "model.bin"
    if fmt == "stablehlo-text":
        source.write_text(jax.jit(fun).lower(*args).as_text())
    elif fmt == "hlo-text":
        source.write_text(jax.jit(fun).lower(*args).as_text(dialect="hlo"))
    else:
        source.write_bytes(bytes(export.export(jax.jit(fun))(*args).serialize()))
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--check"], capsys)
    assert status == 0, out + err
    assert ": ok" in out


# Valid modules --check cannot run on this machine: one error line, the old output kept (both were an "internal
# error": numpy's MemoryError making the random inputs, ONNX Runtime's allocation failure leaking out).
UNCHECKABLE = {
    "input-past-memory": ("func.func @main(%a: tensor<99999999999xf32>) -> tensor<99999999999xf32> {\n"
                          "  %0 = stablehlo.abs %a : tensor<99999999999xf32>\n  return %0 : tensor<99999999999xf32>\n}\n",
                          "not enough memory for random inputs of the model's shapes: in0 float32[99999999999]"),
    "result-past-memory": ("func.func @main(%a: tensor<f32>) -> tensor<100000x100000x1000xf32> {\n"
                           "  %0 = stablehlo.broadcast_in_dim %a, dims = [] : (tensor<f32>) -> "
                           "tensor<100000x100000x1000xf32>\n  return %0 : tensor<100000x100000x1000xf32>\n}\n",
                           "ONNX Runtime failed to run the model: "),
    # the model drops the order token; JAX's executable cannot be given one (was a ValueError, "Cannot cast")
    "token-argument": ("func.func @main(%t: !stablehlo.token, %a: tensor<2xf32>) -> (!stablehlo.token, "
                       "tensor<2xf32>) {\n  return %t, %a : !stablehlo.token, tensor<2xf32>\n}\n",
                       "--check runs modules whose @main takes and returns tensors only, not !stablehlo.token"),
}


@pytest.mark.parametrize("case", list(UNCHECKABLE))
def test_a_check_that_cannot_run_is_one_error_line(case, tmp_path, capsys):
    text, expected = UNCHECKABLE[case]
    source, output = tmp_path / "model.mlir", tmp_path / "m.onnx"
    source.write_text(text)
    output.write_bytes(b"old")
    status, out, err = run_cli([source, "-o", output, "--check"], capsys)
    assert status == 1 and err.count("\n") == 1 and err.startswith("hlo2onnx: error: "), err
    assert expected in err and "internal error" not in err, err
    assert output.read_bytes() == b"old"
