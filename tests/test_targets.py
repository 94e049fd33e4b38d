"""Target profiles: the translator lowers within a profile, and a model outside it is refused (or, for ORT CUDA,
its CPU-fallback nodes listed) by name and source line before it is used."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo2onnx
from harness import Case, assert_same, rand, run_case
from hlo2onnx.command import main
from hlo2onnx.targets import ORT_CPU
from hlo2onnx.targets import CORE, ORT_CUDA, TARGETS, TargetError, validate
from mnjit import mnjit
from mnjit.device import TargetUnavailableError

F32 = np.float32
x48 = rand((4, 8), seed=1)
w83 = rand((8, 3), seed=2)


def mlp(x, w):
    return jax.nn.log_softmax(jnp.tanh(x @ w))


def looped(x):
    return jax.lax.fori_loop(0, 3, lambda i, c: c * 2.0 + 1.0, x)


def test_profiles_are_registered():
    assert set(TARGETS) == {"ort-cpu", "ort-cuda", "core", "openvino-cpu", "iree-cpu", "iree-cuda"}
    assert all(t.description for t in TARGETS.values())


def test_core_runs_a_model_inside_it():
    run_case(Case("core_mlp", mnjit(mlp, target="core"), (x48, w83), tol=(1e-5, 1e-5)))
    model = mnjit(mlp, target="core").lower(x48, w83).model
    assert validate(model, CORE) == []


def test_core_refuses_loops_by_source_line():
    with pytest.raises(TargetError) as info:
        mnjit(looped, target="core").lower(x48)
    message = str(info.value)
    assert "Loop (no kernel) from stablehlo.while" in message and "test_targets.py:" in message
    assert info.value.violations[0].source_op == "stablehlo.while"


def test_core_refuses_float64():
    """No wider dtype exists, so the first rule that needs a float64 kernel refuses, naming op and line."""
    with jax.enable_x64(True):
        x = np.ones(3, np.float64)
        with pytest.raises(hlo2onnx.Hlo2OnnxError, match=r"float64.*test_targets.py:\d+"):
            mnjit(lambda a: a * 2.0, target="core").lower(x)


def test_core_widens_narrow_integers():
    """int8 arithmetic runs in int32 on core (Builder.typed); only the boundary Casts carry int8."""
    fun = lambda a, b: a * b + a  # noqa: E731
    args = (np.arange(6, dtype=np.int8), np.arange(6, dtype=np.int8))
    with pytest.raises(TargetError) as info:  # int8 inputs are outside core: the casts on them are named
        mnjit(fun, target="core").lower(*args)
    assert all(v.reason == "dtype int8 not accepted" for v in info.value.violations)
    assert {v.op_type for v in info.value.violations} == {"Cast"}


def test_core_expands_isnan():
    """max keeps XLA's NaN rule through an IsNaN guard; core lacks IsNaN and gets x != x instead."""
    fun = lambda x: jnp.max(x, axis=1)  # noqa: E731
    x = rand((4, 8), seed=3)
    model = hlo2onnx.translate(jax.jit(fun).lower(x).compiler_ir("stablehlo"), target="ort-cpu")
    assert "IsNaN" in {n.op_type for n in model.graph}
    with pytest.raises(TargetError, match="uint8"):  # the guard's flag is reduced in uint8: named, not hidden
        mnjit(fun, target="core").lower(x)


@pytest.mark.parametrize("fun", [jnp.isnan, jnp.isinf, lambda x: (jnp.isnan(x), jnp.isnan(x) | (x > 0)),
                                 lambda x: (jnp.isinf(x), jnp.isinf(x * 2))], ids=["isnan", "isinf", "shared", "two"])
def test_core_expands_an_output(fun):
    """An expanded IsNaN/IsInf may be a graph output: the expansion takes its place and its name."""
    x = np.array([0.0, np.nan, np.inf, -np.inf, -1.5], np.float32)
    assert_same(mnjit(fun, target="core")(x), jax.jit(fun)(x), (0, 0), "core")


def test_core_chooses_no_fusion_outside_it():
    """Gelu is not in the core list: the erf form stays decomposed there, and fuses on ORT CPU."""
    fun = lambda x: jax.nn.gelu(x, approximate=True)  # noqa: E731
    cpu = {n.op_type for n in mnjit(fun).lower(x48).model.graph}
    core = {n.op_type for n in mnjit(fun, target="core").lower(x48).model.graph}
    assert "Gelu" in cpu and "Gelu" not in core and "Tanh" in core
    np.testing.assert_allclose(np.asarray(mnjit(fun, target="core")(x48)), np.asarray(jax.jit(fun)(x48)),
                               rtol=1e-5, atol=1e-6)


def test_cuda_table_is_data():
    """Checked against ORT's kernel table for the CUDA provider (no GPU here)."""
    assert ORT_CUDA.supports("MatMul", np.dtype("float16"))
    assert not ORT_CUDA.supports("MatMul", np.dtype("int32"))
    assert not ORT_CUDA.supports("BitwiseAnd", np.dtype("int32"))  # no CUDA kernel at all
    assert ORT_CUDA.supports("Relu", hlo2onnx.targets.BF16)
    # No wider dtype has a CUDA kernel: ORT CPU's rules decide (it runs int32 MatMul).
    assert ORT_CUDA.compute_dtype("MatMul", np.dtype("int32")) == np.dtype("int32")
    assert ORT_CUDA.compute_dtype("Max", np.dtype("int16")) == np.dtype("int32")  # widened within CUDA


def test_cuda_lists_cpu_fallbacks():
    fun = lambda a, b: jnp.bitwise_and(a, b) + 1  # noqa: E731
    args = (np.arange(6, dtype=np.int32), np.arange(6, dtype=np.int32))
    module = jax.jit(fun).lower(*args).compiler_ir("stablehlo")
    conversion = hlo2onnx.translate_report(module, target="ort-cuda")  # not refused: ORT runs it on CPU
    assert [v.op_type for v in conversion.violations] == ["BitwiseAnd"]
    assert "run on the fallback" in str(conversion)


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU")
def test_gpu_target_without_gpu_is_refused():
    with pytest.raises(TargetUnavailableError, match="ort-cuda") as info:
        mnjit(lambda x: x + 1, target="ort-cuda")
    message = str(info.value)
    assert "CUDAExecutionProvider" in message or "GPU" in message
    assert "pip install" in message or "none on this machine" in message


def test_ort_cpu_has_no_violations_on_its_own_lowerings():
    step = jax.jit(lambda x, w: jnp.sort(jnp.cumsum(x @ w, axis=0), axis=1))
    model = mnjit(step).lower(x48, w83).model
    assert validate(model, ORT_CPU) == []


def test_cli_target(tmp_path, capsys):
    source = tmp_path / "loop.mlir"
    source.write_text(jax.jit(looped).lower(x48).as_text())
    assert main([str(source), "-o", str(tmp_path / "m.onnx"), "--target", "core"]) == 1
    err = capsys.readouterr().err
    assert "target core cannot run" in err and "stablehlo.while" in err
    assert not (tmp_path / "m.onnx").exists()  # refused before anything is written
    assert main([str(source), "-o", str(tmp_path / "m.onnx"), "--target", "ort-cuda"]) == 0
