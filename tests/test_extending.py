"""A target and a custom-call rule declared outside the package (docs/extending.md): through the command
(`--target package.module:NAME`), `convert` and mnjit, checked against jax.jit; the override rules of
`register_custom_call` and `targets.register`; and samples/vendor_target.py end to end.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from jax import export

import hlo2onnx
from hlo2onnx import registry, targets
from mnjit import mnjit

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
# Subprocesses import this checkout (an installed copy elsewhere must not answer for it).
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SAMPLES)])}

X = np.array([[1.5, -2.0, 0.25], [3.0, -0.5, 4.0]], np.float32)


def test_vendor_sample_runs_and_matches_jax() -> None:
    result = subprocess.run([sys.executable, str(SAMPLES / "vendor_target.py"), "--check"], capture_output=True,
                            text=True, timeout=600, env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK: matches jax.jit" in result.stdout
    assert "com.example.npu.DenseRelu" in result.stdout
    for refused in ("a sine refused: unsupported op stablehlo.sine", "float32 refused", "a symbolic batch refused"):
        assert refused in result.stdout


def test_command_takes_a_target_by_import_path(tmp_path) -> None:
    x = np.ones((4, 8), np.float16)
    w, b = np.full((8, 16), 0.5, np.float16), np.full(16, -1, np.float16)
    source, model = tmp_path / "layer.bin", tmp_path / "layer.onnx"
    source.write_bytes(export.export(jax.jit(lambda x, w, b: jax.nn.relu(x @ w + b)))(x, w, b).serialize())
    subprocess.run([sys.executable, "-m", "hlo2onnx", str(source), "--target", "vendor_target:NPU", "-o",
                    str(model)], check=True, capture_output=True, env=ENV, cwd=tmp_path)
    proto = onnx.load(str(model))
    assert "DenseRelu" in [n.op_type for n in proto.graph.node]
    got = ort.InferenceSession(str(model)).run(None, dict(zip([i.name for i in proto.graph.input], (x, w, b))))[0]
    np.testing.assert_array_equal(got, np.asarray(jax.jit(lambda x, w, b: jax.nn.relu(x @ w + b))(x, w, b)))


def test_command_refuses_a_path_to_something_else(tmp_path) -> None:
    source = tmp_path / "f.bin"
    source.write_bytes(export.export(jax.jit(jnp.sin))(X).serialize())
    result = subprocess.run([sys.executable, "-m", "hlo2onnx", str(source), "--target", "os:path"],
                            capture_output=True, text=True, env=ENV)
    assert result.returncode == 1
    assert "not a hlo2onnx.targets.Target" in result.stderr


def _rewrite_neg_as_sub(proto: onnx.ModelProto) -> bool:
    """An exact rewrite a consumer might need: Neg(x) as Sub(0, x) (float: -0.0 aside, checked below)."""
    changed = False
    for node in proto.graph.node:
        if node.op_type == "Neg":
            zero = f"{node.output[0]}_zero"
            proto.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((), np.float32), zero))
            node.op_type, node.input[:] = "Sub", [zero, node.input[0]]
            changed = True
    return changed


NO_NEG = targets.declare("no-neg", ops="Neg Sub Mul Add Max Min Where Equal Not Expand Reshape".split(),
                         dtypes=["float32", "bool", "int64"], rewrites=[_rewrite_neg_as_sub])


def test_declared_target_in_convert_translate_and_mnjit() -> None:
    def f(x):
        return jnp.maximum(-x * 2, 1.0)

    x = np.array([1.0, np.nan, -3.0, 0.5], np.float32)
    for model in (hlo2onnx.convert(jax.jit(f).lower(x), target=NO_NEG).model,
                  hlo2onnx.translate(jax.jit(f).lower(x), target=NO_NEG)):
        ops = [n.op_type for n in model.graph]
        assert "Neg" not in ops and "Sub" in ops and "IsNaN" not in ops  # IsNaN expanded: not in its ops
        assert "Where" in ops  # the NaN guard: the target does not say it propagates NaN
    want = np.asarray(jax.jit(f)(x))
    np.testing.assert_array_equal(np.asarray(mnjit(f, target=NO_NEG)(x)), want)


def test_register_target_by_name_and_its_overrides() -> None:
    target = targets.declare("test-registered", ops=["Mul", "Add", "Expand"], dtypes=["float32", "int64"])
    try:
        targets.register(target)
        assert hlo2onnx.targets.get("test-registered") is target
        np.testing.assert_array_equal(mnjit(lambda x: x * 3 + 1, target="test-registered")(X), X * 3 + 1)
        with pytest.raises(ValueError, match="exists already"):
            targets.register(targets.declare("test-registered"))
        with pytest.raises(ValueError, match="exists already"):
            targets.register(targets.declare("ort-cpu"))
        replaced = targets.register(targets.declare("test-registered", ops=["Mul"]), replace=True)
        assert hlo2onnx.targets.get("test-registered") is replaced
    finally:
        targets.TARGETS.pop("test-registered", None)


def test_declared_opset_is_the_default_and_others_are_refused() -> None:
    old = targets.declare("opset-18", opset=18)
    assert hlo2onnx.translate(jax.jit(jnp.abs).lower(X), target=old).opset_imports[""] == 18
    with pytest.raises(ValueError, match="reads opset 18"):
        hlo2onnx.translate(jax.jit(jnp.abs).lower(X), target=old, opset=21)


def test_custom_call_rule_and_its_override() -> None:
    def call(x):
        return jax.ffi.ffi_call("test_twice", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    lowered = jax.jit(call).lower(X)
    with pytest.raises(hlo2onnx.UnsupportedOpError, match="test_twice"):
        hlo2onnx.translate(lowered)
    try:
        @hlo2onnx.register_custom_call("test_twice")
        def twice(ctx, x, **_):
            return ctx.b.op("Add", x, x)

        with pytest.raises(ValueError, match="has a rule already"):
            hlo2onnx.register_custom_call("test_twice")(twice)
        with pytest.raises(ValueError, match="has a rule already"):  # a built-in rule alike
            hlo2onnx.register_custom_call("lapack_sgeev_ffi")(twice)
        model = hlo2onnx.translate(lowered)
        np.testing.assert_array_equal(_run(model, X), X * 2)

        @hlo2onnx.register_custom_call("test_twice", replace=True)
        def thrice(ctx, x, **_):
            return ctx.b.op("Mul", x, ctx.b.const(3, np.float32))

        np.testing.assert_array_equal(_run(hlo2onnx.translate(lowered), X), X * 3)
    finally:
        registry.CUSTOM_CALLS.pop("test_twice", None)


def _run(model, *args):
    proto = ir.to_proto(model)
    session = ort.InferenceSession(proto.SerializeToString())
    return session.run(None, dict(zip([i.name for i in proto.graph.input], args)))[0]


def test_declared_providers_with_options_run_in_ort() -> None:
    """A target naming ORT providers with options: mnjit runs it in an ORT session with them (not its own
    CPU session, which takes none)."""
    from mnjit import device

    target = targets.declare("ort-options", providers=["CPUExecutionProvider"],
                             provider_options=[{"arena_extend_strategy": "kSameAsRequested"}])
    assert not device.own_ort_cpu(target)
    np.testing.assert_array_equal(np.asarray(mnjit(lambda x: x * 2 - 1, target=target)(X)), X * 2 - 1)
    with pytest.raises(ValueError, match="provider_options"):
        targets.declare("bad", providers=["CPUExecutionProvider"], provider_options=[{}, {}])


def test_declared_metadata_reaches_every_model() -> None:
    """`metadata` entries (what a consumer must be told) are added to `based_on`'s, in every front end's model."""
    told = targets.declare("told", based_on="iree-cpu", metadata={"vendor.compile-flags": "--fast=no"})
    lowered = jax.jit(lambda x: x * 2).lower(X)
    for model in (hlo2onnx.convert(lowered, target=told).model, hlo2onnx.translate(lowered, target=told)):
        assert model.metadata_props["vendor.compile-flags"] == "--fast=no"
        assert "demote-f64-to-f32=false" in model.metadata_props["hlo2onnx.iree-compile-flags"]
    assert "hlo2onnx.iree-compile-flags" not in hlo2onnx.translate(lowered).metadata_props  # ort-cpu's own
