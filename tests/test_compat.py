"""hlo2onnx/compat.py: the version guard and each private API it wraps, on whichever jax/ORT this leg runs."""
import configparser
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime
import pytest

from hlo2onnx import compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


RANGES = {"jax": (compat.SUPPORTED_JAX, r"jax 0\.10 to 0\.12; found jax .*pip install 'jax>=0\.10,<0\.13'"),
          "onnxruntime": (compat.SUPPORTED_ONNXRUNTIME,
                          r"onnxruntime 1\.31 to 1\.32; .*'onnxruntime>=1\.31,<1\.33'")}


@pytest.mark.parametrize("package, version, ok", [
    ("jax", "0.9.2", False), ("jax", "0.10.0", True), ("jax", "0.10.2", True), ("jax", "0.11.2", True),
    ("jax", "0.12.0.1", True), ("jax", "0.13.0", False), ("jax", "1.0.0", False), ("jax", "0.12.0.dev20261101", True),
    ("onnxruntime", "1.30.0", False), ("onnxruntime", "1.31.1", True), ("onnxruntime", "1.32.0", True),
    ("onnxruntime", "1.33.0", False)])
def test_supported_ranges(package, version, ok):
    supported, refusal = RANGES[package]
    if ok:
        compat.require(package, version, supported)
    else:
        with pytest.raises(ImportError, match=refusal):
            compat.require(package, version, supported)


def test_installed_versions_are_supported():
    compat.require("jax", jax.__version__, compat.SUPPORTED_JAX)
    compat.require("onnxruntime", onnxruntime.__version__, compat.SUPPORTED_ONNXRUNTIME)


def test_setup_cfg_pins_match_the_guard():
    """The pins pip installs and the range the import refuses outside of are the same range."""
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    requires = config["options"]["install_requires"]
    for package, ((a, b), (c, d)) in [("jax", compat.SUPPORTED_JAX), ("jaxlib", compat.SUPPORTED_JAX),
                                      ("onnxruntime", compat.SUPPORTED_ONNXRUNTIME)]:
        assert f"\n{package}>={a}.{b},<{c}.{d}\n" in f"\n{requires}\n", package


@pytest.mark.parametrize("module", ["mnjit", "hlo2onnx.conversion"])
def test_import_refuses_unsupported_jax(module):
    code = f"import jax; jax.__version__ = '0.13.0'\nimport {module}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode != 0
    assert "ImportError: mnjit and hlo2onnx support jax 0.10 to 0.12; found jax 0.13.0" in result.stderr
    assert "Python >= 3.12" in result.stderr


def test_import_refuses_unsupported_onnxruntime():
    code = "import onnxruntime; onnxruntime.__version__ = '1.30.0'\nimport mnjit"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode != 0
    assert "support onnxruntime 1.31 to 1.32; found onnxruntime 1.30.0" in result.stderr


def test_dlpack_import():
    host = np.arange(64, dtype=np.float32)
    value = compat.dlpack_to_buffer(host.__dlpack__(), jax.devices("cpu")[0], None, None, compat.KDL_CPU)
    np.testing.assert_array_equal(np.asarray(value), host)
    if host.ctypes.data % 64 == 0:  # jax imports 64-byte aligned buffers in place and copies others
        assert value.unsafe_buffer_pointer() == host.ctypes.data


def test_trace_state_clean_sees_transformations():
    seen = []

    def f(x):
        seen.append(compat.trace_state_clean())
        return x * 2

    f(1.0)
    jax.jit(f)(1.0)
    jax.grad(f)(1.0)
    assert seen == [True, False, False]


def test_mark_weak():
    strong = jnp.asarray(1.0, jnp.float32)
    weak = compat.mark_weak(strong)
    assert weak.weak_type and not strong.weak_type
    assert (weak + np.float16(1)).dtype == np.float16  # a weak float takes the other operand's width


def test_mlir_context_and_hlo_text():
    from hlo2onnx.loading import load

    lowered = jax.jit(lambda x: jnp.tanh(x) + 1).lower(jnp.ones(3))
    assert load(lowered.as_text(dialect="hlo")).format == "hlo-text"
    with compat.make_ir_context():
        from jax.extend.mlir import ir

        module = ir.Module.parse(lowered.as_text())  # stablehlo and func ops need registered dialects
    assert "stablehlo.tanh" in str(module)


def test_ort_capi_iobinding():
    import onnx
    from onnx import helper

    capi = compat.ort_capi()
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    binding = capi.SessionIOBinding(compat.c_session(session))
    x = np.arange(3, dtype=np.float32)
    binding.bind_ortvalue_input("x", capi.OrtValue.ortvalue_from_numpy(x, capi.OrtDevice(
        capi.OrtDevice.cpu(), capi.OrtDevice.default_memory(), 0)))
    binding.bind_output("y", capi.OrtDevice(capi.OrtDevice.cpu(), capi.OrtDevice.default_memory(), 0))
    compat.c_session(session).run_with_iobinding(binding, capi.RunOptions())
    (capsule,) = binding.get_outputs().to_dlpacks(None)
    y = compat.dlpack_to_buffer(capsule, jax.devices("cpu")[0], None, None, compat.KDL_CPU)
    np.testing.assert_array_equal(np.asarray(y), -x)


@pytest.mark.parametrize("version, warns", [
    ("0.10.2", False), ("0.12.0.1", False), ("0.12.1", False), ("0.12.1.dev20261201", False),
    ("0.12.2", True), ("0.12.1.1", True)])
def test_untested_jax_warning(version, warns):
    message = compat.untested_warning(version)
    assert (message is not None) == warns
    if warns:
        assert f"jax {version} is newer" in message and ", ".join(compat.TESTED_JAX) in message


def test_installed_jax_is_a_tested_release():
    # The leg's own jax is one the suite passed on: a newer one must be added to TESTED_JAX once it passes.
    assert compat.untested_warning(jax.__version__) is None, "add this jax to compat.TESTED_JAX once it passes"


def test_import_warns_once_for_an_untested_jax():
    code = ("import warnings; warnings.simplefilter('default')\nimport jax; jax.__version__ = '0.12.9'\n"
            "import mnjit, hlo2onnx, hlo2onnx.conversion")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("UntestedJaxWarning") == 1, result.stderr
    assert "jax 0.12.9 is newer and untested" in result.stderr


def test_readme_lists_the_tested_releases():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    for version in compat.TESTED_JAX:
        assert version in readme, f"README's version table lacks jax {version}"
