"""Closed-over constants that jax passes as arguments of main (`jax.const = true`) become weights.

jax 0.12.1 makes it the default (jax_use_simplified_jaxpr_constants): arrays over
jax_embedded_constants_max_bytes are hoisted out of the module, their values held by the Lowered. The cases
turn the flag on; jax 0.10.2 has the flag but still embeds such constants, so there the cases check the same
promises (one input, jax.jit's values) on embedded constants. Expected values come from jax.jit.
"""
from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import hlo2onnx
from harness import assert_same, rand
from mnjit import mnjit

W = np.linspace(0.5, 1.5, 100_000, dtype=np.float32)


@pytest.fixture(autouse=True)
def hoisted_constants():
    previous = jax.config.jax_use_simplified_jaxpr_constants
    jax.config.update("jax_use_simplified_jaxpr_constants", True)
    yield
    jax.config.update("jax_use_simplified_jaxpr_constants", previous)


def weighted_sum(x):  # the closed-over array is the module's %arg0, marked jax.const
    return (jnp.asarray(W) * x).sum()


def hoists() -> bool:
    return "jax.const = true" in jax.jit(weighted_sum).lower(np.float32(1.1)).as_text()


def test_lowering_passes_the_constant_as_an_argument():
    # What the rest of this file relies on from 0.12.1 on: otherwise its cases test embedded constants only.
    if jax.__version_info__ < (0, 12, 1):
        pytest.skip(f"jax {jax.__version__} embeds closed-over constants in the module")
    assert hoists()


def test_mnjit_call_has_one_input_and_matches_jax_jit():
    fun = mnjit(weighted_sum)
    x = np.float32(1.1)
    assert_same(fun(x), jax.jit(weighted_sum)(x), tol=(1e-5, 1e-5))
    model = fun.lower(x).model
    assert [v.name for v in model.graph.inputs] == ["x"]


@pytest.mark.parametrize("front", ["convert", "translate"])
def test_converting_a_lowered_gives_one_input(front):
    x = np.float32(1.1)
    lowered = jax.jit(weighted_sum).lower(x)
    model = hlo2onnx.convert(lowered).model if front == "convert" else hlo2onnx.translate(lowered)
    assert [v.name for v in model.graph.inputs] == ["x"]
    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": np.asarray(x)})[0], jax.jit(weighted_sum)(x), rtol=1e-5)


# (constant, function of the constant and x, x): dtypes that take other paths (complex as (re, im) pairs, bf16,
# bool, 8-bit ints that wrap), and a constant read inside a loop body.
CASES = {
    "f32_matmul": (rand((256, 128), seed=1), lambda c, x: x @ c, rand((4, 256), seed=2)),
    "bf16": (rand((4096,), seed=3).astype(ml_dtypes.bfloat16), lambda c, x: c * x, rand((4096,), seed=4)
             .astype(ml_dtypes.bfloat16)),
    "complex64": ((rand((2048,), seed=5) + 1j * rand((2048,), seed=6)).astype(np.complex64),
                  lambda c, x: jnp.abs(c * x), np.float32(0.5)),
    "int8_wraps": (np.arange(4096).astype(np.int8), lambda c, x: c * x, np.int8(3)),
    "bool": (np.arange(4096) % 3 == 0, lambda c, x: jnp.where(c, x, -x), rand((4096,), seed=7)),
    "in_scan": (rand((64, 64), seed=8) / 64, lambda c, x: jax.lax.scan(lambda h, _: (jnp.tanh(c @ h), None), x,
                                                                    None, length=5)[0], rand((64,), seed=9)),
    "two_constants": (rand((1024,), seed=10), lambda c, x: (c * x + jnp.asarray(W[:1024] * 2)).sum(),
                      np.float32(2.0)),
}


@pytest.mark.parametrize("name", CASES)
def test_case(name):
    constant, body, x = CASES[name]
    fun = lambda x: body(jnp.asarray(constant), x)  # noqa: E731
    expected = jax.jit(fun)(x)
    assert_same(mnjit(fun)(x), expected, tol=(1e-5, 1e-5) if expected.dtype != ml_dtypes.bfloat16 else (1e-2, 1e-2))
    model = hlo2onnx.convert(jax.jit(fun).lower(x)).model
    assert len(model.graph.inputs) == 1


@pytest.mark.parametrize("options", [{"fallback": True}, {"target": "auto"}], ids=["fallback", "auto"])
def test_other_front_ends(options):
    fun = mnjit(weighted_sum, **options)
    x = np.float32(0.25)
    assert_same(fun(x), jax.jit(weighted_sum)(x), tol=(1e-5, 1e-5))


def test_host_callback_model():
    def fun(x):
        jax.debug.callback(lambda v: None, x)
        return weighted_sum(x)

    x = np.float32(0.75)
    assert_same(mnjit(fun)(x), jax.jit(fun)(x), tol=(1e-5, 1e-5))


def test_saved_model_runs_without_mnjit(tmp_path):
    x = np.float32(3.0)
    mnjit(weighted_sum).lower(x).save(tmp_path / "m.onnx", external_data="m.weights")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x"]
    np.testing.assert_allclose(session.run(None, {"x": np.asarray(x)})[0], jax.jit(weighted_sum)(x), rtol=1e-5)


def test_closures_over_different_arrays_are_different_functions():
    # Two functions in jax (each its own jaxpr); each mnjit function keeps its own weights.
    def make(scale):
        array = W * scale
        return mnjit(lambda x: (jnp.asarray(array) * x).sum())

    x = np.float32(1.0)
    one, two = make(1.0), make(2.0)
    assert_same(two(x), 2 * one(x), tol=(1e-5, 1e-5))


# What jax 0.12.1's Lowered.as_text() gives for weighted_sum with a smaller constant: its value is not there.
HOISTED_TEXT = """
func.func public @main(%arg0: tensor<1000xf32> {jax.const = true}, %arg1: tensor<f32> loc("x")) -> tensor<f32> {
  %0 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<f32>) -> tensor<1000xf32>
  %1 = stablehlo.multiply %arg0, %0 : tensor<1000xf32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %2 = stablehlo.reduce(%1 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<1000xf32>, tensor<f32>) -> tensor<f32>
  return %2 : tensor<f32>
}
"""


def test_text_without_the_values_is_refused_by_the_command(tmp_path):
    source = tmp_path / "m.mlir"
    source.write_text(HOISTED_TEXT)
    output = tmp_path / "m.onnx"
    output.write_bytes(b"an existing file")
    run = subprocess.run([sys.executable, "-m", "hlo2onnx", str(source), "-o", str(output)], capture_output=True,
                         text=True)
    assert run.returncode != 0
    assert "%arg0 is a constant" in run.stderr and "jax.export" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert output.read_bytes() == b"an existing file"


def test_export_keeps_the_constant_in_the_module():
    exported = jax.export.export(jax.jit(weighted_sum))(np.float32(1.0))
    model = hlo2onnx.convert(exported).model
    assert [v.name for v in model.graph.inputs] == ["x"]


def test_the_weight_views_the_constant():
    # No copy at translation (the sizes are measured in test_runtime.py, the 2 GB one under make stress).
    if not hoists():
        pytest.skip(f"jax {jax.__version__} embeds closed-over constants in the module")
    lowered = jax.jit(weighted_sum).lower(np.float32(1.0))
    constant = np.asarray(hlo2onnx.compat.const_args(lowered)[0])
    model = hlo2onnx.translate(lowered)
    weights = [v.const_value.numpy() for v in model.graph.initializers.values() if v.const_value.size == W.size]
    assert len(weights) == 1 and np.shares_memory(weights[0], constant)



def test_a_uniform_constant_is_a_splat():
    # np.ones closed over: embedded, jax writes a splat; passed as an argument, the translator finds it uniform.
    fun = lambda x: (jnp.asarray(np.ones(100_000, np.float32)) * x).sum()  # noqa: E731
    x = np.float32(1.1)
    model = hlo2onnx.convert(jax.jit(fun).lower(x)).model
    assert [v.name for v in model.graph.inputs] == ["x"]
    assert max(v.const_value.size for v in model.graph.initializers.values()) < 100
    assert_same(mnjit(fun)(x), jax.jit(fun)(x), tol=(2e-6, 2e-6))
