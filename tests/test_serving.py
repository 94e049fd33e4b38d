"""Triton model repositories (hlo2onnx.write_triton_repo, `hlo2onnx --triton-repo`): the config parses with the
schema Triton publishes (tritonclient's model_config_pb2), and the model in the repository matches jax.jit at
several batch sizes."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from jax import export
from tritonclient.grpc import model_config_pb2

import hlo2onnx
from hlo2onnx.errors import Hlo2OnnxError
from hlo2onnx.files import TEMP_PREFIX
from harness import TOLERANCE, rand
from mnjit import mnjit
from test_cli import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(0)
PARAMS = {"w1": RNG.normal(size=(16, 32)), "b1": RNG.normal(size=32), "gain": RNG.normal(size=32),
          "w2": RNG.normal(size=(32, 10)), "b2": RNG.normal(size=10)}


def classifier(x, label):
    """Dense layers, layer norm and softmax; the probabilities and, per row, that of the given label."""
    p = jax.tree.map(lambda a: jnp.asarray(a, x.dtype), PARAMS)
    h = jax.nn.gelu(x @ p["w1"] + p["b1"])
    h = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5) * p["gain"]
    probs = jax.nn.softmax(h @ p["w2"] + p["b2"])
    return probs, (probs * jax.nn.one_hot(label, 10, dtype=x.dtype)).sum(-1)


def dtypes(x64: bool):
    return (np.float64, np.int64) if x64 else (np.float32, np.int32)


def exported(x64: bool, batch: str = "b") -> export.Exported:
    f, i = dtypes(x64)
    b, = export.symbolic_shape(batch)
    return export.export(jax.jit(classifier))(jax.ShapeDtypeStruct((b, 16), f), jax.ShapeDtypeStruct((b,), i))


def inputs(batch: int, x64: bool) -> tuple[np.ndarray, np.ndarray]:
    f, i = dtypes(x64)
    return rand((batch, 16), f, seed=batch), np.random.default_rng(batch).integers(0, 10, batch).astype(i)


def parse_config(model_dir) -> model_config_pb2.ModelConfig:
    with open(os.path.join(model_dir, "config.pbtxt"), encoding="utf-8") as f:
        return text_format.Parse(f.read(), model_config_pb2.ModelConfig())


def run_repo_model(model_dir, feeds: dict) -> list[np.ndarray]:
    path = os.path.join(model_dir, "1", "model.onnx")
    if os.path.isdir(path):  # Triton's layout for a model with external data: the folder holds model.onnx
        path = os.path.join(path, "model.onnx")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_matches_jit(model_dir, batch: int, x64: bool) -> None:
    x, label = inputs(batch, x64)
    actual = run_repo_model(model_dir, {"x": x, "label": label})
    with jax.enable_x64(x64):
        expected = jax.jit(classifier)(x, label)
    tol = TOLERANCE[np.dtype(dtypes(x64)[0])]
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        np.testing.assert_allclose(a, np.asarray(e), rtol=tol[0] * 10, atol=tol[1] * 10)


def walk(directory) -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, name), directory)
                  for root, dirs, files in os.walk(directory) for name in dirs + files)


# -- the repository --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
def test_repository_config_parses_and_model_matches_jit(tmp_path, x64):
    with jax.enable_x64(x64):
        conversion = hlo2onnx.convert(exported(x64), dynamic=True)
    model_dir = hlo2onnx.write_triton_repo(conversion, tmp_path, max_batch_size=32)
    assert model_dir == str(tmp_path / "classifier")
    assert walk(tmp_path) == ["classifier", "classifier/1", "classifier/1/model.onnx", "classifier/config.pbtxt"]
    config = parse_config(model_dir)
    fp, integer = ("TYPE_FP64", "TYPE_INT64") if x64 else ("TYPE_FP32", "TYPE_INT32")
    assert config.name == "classifier" and config.backend == "onnxruntime" and config.max_batch_size == 32
    assert config.HasField("dynamic_batching")
    described = [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims), t.HasField("reshape"),
                  list(t.reshape.shape)) for t in [*config.input, *config.output]]
    assert described == [("x", fp, [16], False, []), ("label", integer, [1], True, []),  # [b]: Triton's reshape
                         ("out0", fp, [10], False, []), ("out1", fp, [1], True, [])]
    # The names in the config are the model's own: Triton feeds the model by them.
    model = onnx.load(os.path.join(model_dir, "1", "model.onnx"))
    assert [i.name for i in config.input] == [i.name for i in model.graph.input]
    assert [o.name for o in config.output] == [o.name for o in model.graph.output]
    for batch in (1, 7, 32):
        assert_matches_jit(model_dir, batch, x64)


def test_external_data_makes_model_onnx_a_folder(tmp_path):
    conversion = hlo2onnx.convert(exported(False), dynamic=True)
    model_dir = hlo2onnx.write_triton_repo(conversion, tmp_path, name="with-data", external_data=True)
    assert walk(model_dir) == ["1", "1/model.onnx", "1/model.onnx/model.onnx", "1/model.onnx/model.onnx.data",
                               "config.pbtxt"]
    folder = os.path.join(model_dir, "1", "model.onnx")
    graph = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    external = [t.name for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and os.path.getsize(os.path.join(folder, "model.onnx.data")) >= 16 * 32 * 4
    assert all(e.value == "model.onnx.data" for t in graph.graph.initializer for e in t.external_data
               if e.key == "location")
    assert parse_config(model_dir).name == "with-data"
    for batch in (1, 7, 32):
        assert_matches_jit(model_dir, batch, False)


def test_max_batch_size_zero_writes_full_shapes(tmp_path):
    """A model without a symbolic batch (mnjit at fixed shapes) is served unbatched; symbolic dims become -1."""
    x, label = inputs(5, False)
    lowered = mnjit(classifier).lower(x, label)
    model_dir = hlo2onnx.write_triton_repo(lowered, tmp_path, name="fixed", max_batch_size=0)
    config = parse_config(model_dir)
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in [*config.input, *config.output]] == [[5, 16], [5], [5, 10], [5]]
    assert_matches_jit(model_dir, 5, False)
    dynamic = hlo2onnx.write_triton_repo(hlo2onnx.convert(exported(False), dynamic=True), tmp_path, name="any",
                                         max_batch_size=0)
    assert [list(t.dims) for t in parse_config(dynamic).input] == [[-1, 16], [-1]]


def test_names_with_quotes_round_trip(tmp_path):
    """Dict keys name inputs (`w`); where two would clash jax's paths do (`params['w']`): the config's strings
    are escaped, and parse back the same."""
    def f(x, params, other):
        return x @ params["w"] @ other["w"]

    b, = export.symbolic_shape("b")
    exp = export.export(jax.jit(f))(jax.ShapeDtypeStruct((b, 3), np.float32),
                                    {"w": jax.ShapeDtypeStruct((3, 2), np.float32)},
                                    {"w": jax.ShapeDtypeStruct((2, 2), np.float32)})
    model_dir = hlo2onnx.write_triton_repo(hlo2onnx.convert(exp, dynamic=True), tmp_path, max_batch_size=0)
    assert [t.name for t in parse_config(model_dir).input] == ["x", "params['w']", "other['w']"]
    assert os.path.basename(model_dir) == "f"


def test_from_an_onnx_file_with_external_data(tmp_path):
    """An .onnx file already written (its weights beside it) goes into the repository as it is."""
    conversion = hlo2onnx.convert(exported(False), dynamic=True)
    conversion.save(tmp_path / "saved.onnx", "saved.data")
    model_dir = hlo2onnx.write_triton_repo(tmp_path / "saved.onnx", tmp_path / "models")
    assert walk(model_dir) == ["1", "1/model.onnx", "config.pbtxt"]  # small weights: back in one file
    assert parse_config(model_dir).name == "classifier"
    assert_matches_jit(model_dir, 7, False)
    with pytest.raises(Hlo2OnnxError, match="cannot read the ONNX model"):
        hlo2onnx.write_triton_repo(tmp_path / "missing.onnx", tmp_path / "models")


def test_default_name_of_a_lambda_is_a_folder_name(tmp_path):
    b, = export.symbolic_shape("b")
    exp = export.export(jax.jit(lambda x: x * 2))(jax.ShapeDtypeStruct((b, 3), np.float32))
    model_dir = hlo2onnx.write_triton_repo(hlo2onnx.convert(exp, dynamic=True), tmp_path)
    assert os.path.basename(model_dir) == "lambda" and parse_config(model_dir).name == "lambda"


# -- refusals ---------------------------------------------------------------------------------------------------
def test_refuses_a_fixed_batch_naming_the_input(tmp_path):
    x, label = inputs(5, False)
    with pytest.raises(Hlo2OnnxError, match=r"input 'x' has a fixed first dim \(5\).*max_batch_size 0"):
        hlo2onnx.write_triton_repo(mnjit(classifier).lower(x, label), tmp_path)
    assert os.listdir(tmp_path) == []


def test_refuses_different_symbolic_first_dims(tmp_path):
    b, c = export.symbolic_shape("b, c")
    exp = export.export(jax.jit(lambda x, y: (x * 2, y * 3)))(jax.ShapeDtypeStruct((b, 3), np.float32),
                                                              jax.ShapeDtypeStruct((c, 3), np.float32))
    with pytest.raises(Hlo2OnnxError, match=r"input 'y' has first dim 'c' but 'x' has 'b'"):
        hlo2onnx.write_triton_repo(hlo2onnx.convert(exp, dynamic=True), tmp_path)


def test_refuses_an_output_without_the_batch(tmp_path):
    b, = export.symbolic_shape("b")
    exp = export.export(jax.jit(lambda x: (x * 2, x.sum())))(jax.ShapeDtypeStruct((b, 3), np.float32))
    with pytest.raises(Hlo2OnnxError, match=r"output 'out1' is a scalar"):
        hlo2onnx.write_triton_repo(hlo2onnx.convert(exp, dynamic=True), tmp_path)


def test_refuses_a_type_the_onnxruntime_backend_lacks(tmp_path):
    b, = export.symbolic_shape("b")
    exp = export.export(jax.jit(lambda x: x * 2))(jax.ShapeDtypeStruct((b, 3), ml_dtypes.bfloat16))
    with pytest.raises(Hlo2OnnxError, match=r"input 'x' is BFLOAT16: Triton's onnxruntime backend takes BOOL"):
        hlo2onnx.write_triton_repo(hlo2onnx.convert(exp, dynamic=True), tmp_path)


@pytest.mark.parametrize("name", ["../up", "a/b", ".hidden", "", "with space"])
def test_refuses_a_name_that_is_no_folder_name(tmp_path, name):
    with pytest.raises(Hlo2OnnxError, match="Triton model name"):
        hlo2onnx.write_triton_repo(hlo2onnx.convert(exported(False), dynamic=True), tmp_path, name=name)


# ModelConfig.max_batch_size is an int32: 2**31 was written into a config.pbtxt Triton could not parse.
@pytest.mark.parametrize("size", [-1, 2**31, 2**40, 1.5, True], ids=["negative", "int32-max-plus-1", "huge", "float",
                                                                     "bool"])
def test_refuses_a_max_batch_size_triton_cannot_read(tmp_path, size):
    with pytest.raises(Hlo2OnnxError, match="max_batch_size must be an integer from 0 to 2147483647"):
        hlo2onnx.write_triton_repo(hlo2onnx.convert(exported(False), dynamic=True), tmp_path, max_batch_size=size)
    assert list(tmp_path.iterdir()) == []


def test_the_largest_max_batch_size_parses(tmp_path):
    path = hlo2onnx.write_triton_repo(hlo2onnx.convert(exported(False), dynamic=True), tmp_path,
                                      max_batch_size=2**31 - 1)
    assert parse_config(path).max_batch_size == 2**31 - 1


# -- an existing repository -------------------------------------------------------------------------------------
def test_a_failed_write_leaves_the_repository_as_it_was(tmp_path, monkeypatch):
    conversion = hlo2onnx.convert(exported(False), dynamic=True)
    model_dir = hlo2onnx.write_triton_repo(conversion, tmp_path, name="m")
    (tmp_path / "other").mkdir()  # another model of the repository
    before = {path: (tmp_path / path).read_bytes() for path in walk(tmp_path) if (tmp_path / path).is_file()}

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hlo2onnx.serving, "save_model", full_disk)
    with pytest.raises(Hlo2OnnxError, match="No space left on device"):
        hlo2onnx.write_triton_repo(conversion, tmp_path, name="m", external_data=True)
    monkeypatch.undo()
    with pytest.raises(Hlo2OnnxError):  # refused before anything is written
        hlo2onnx.write_triton_repo(mnjit(classifier).lower(*inputs(5, False)), tmp_path, name="m")
    after = {path: (tmp_path / path).read_bytes() for path in walk(tmp_path) if (tmp_path / path).is_file()}
    assert after == before and sorted(os.listdir(tmp_path)) == ["m", "other"]
    assert_matches_jit(model_dir, 7, False)


def test_a_second_write_replaces_the_model(tmp_path):
    conversion = hlo2onnx.convert(exported(False), dynamic=True)
    hlo2onnx.write_triton_repo(conversion, tmp_path, name="m", external_data=True)
    model_dir = hlo2onnx.write_triton_repo(conversion, tmp_path, name="m", max_batch_size=8)
    assert walk(tmp_path) == ["m", "m/1", "m/1/model.onnx", "m/config.pbtxt"]  # no leftovers, hidden or not
    assert parse_config(model_dir).max_batch_size == 8
    assert_matches_jit(model_dir, 7, False)
    assert not any(name.startswith(TEMP_PREFIX) for name in os.listdir(tmp_path))


# -- the command ------------------------------------------------------------------------------------------------
def test_command_writes_the_repository(tmp_path, capsys):
    source = tmp_path / "classifier.jaxexport"
    source.write_bytes(bytes(exported(False).serialize()))
    repo = tmp_path / "models"
    status, out, err = run_cli([source, "--dynamic", "--name", "clf", "--triton-repo", repo, "--max-batch-size",
                                "16", "--check"], capsys)
    assert status == 0, err
    assert "ok" in out
    assert not (tmp_path / "classifier.onnx").exists()  # only the repository, unless -o asks for the file too
    config = parse_config(repo / "clf")
    assert config.name == "clf" and config.max_batch_size == 16
    for batch in (1, 7, 32):
        assert_matches_jit(repo / "clf", batch, False)


def test_command_refuses_a_fixed_batch_in_one_line(tmp_path, capsys):
    source = tmp_path / "classifier.jaxexport"
    x, label = inputs(5, False)
    source.write_bytes(bytes(export.export(jax.jit(classifier))(x, label).serialize()))
    status, out, err = run_cli([source, "--triton-repo", tmp_path / "models", "-o", tmp_path / "m.onnx"], capsys)
    assert status == 1 and err.count("\n") == 1, err
    assert err.startswith("hlo2onnx: error: input 'x' has a fixed first dim (5)") and "--dynamic" in err
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "models").exists()
    status, out, err = run_cli([source, "--max-batch-size", "4"], capsys)
    assert status == 1 and "--max-batch-size is for --triton-repo" in err


def test_command_crash_leaves_the_repository_as_it_was(tmp_path):
    """A parser crash in the command's child (hlo2onnx.cli): the repository keeps its model, nothing is added."""
    repo = tmp_path / "models"
    hlo2onnx.write_triton_repo(hlo2onnx.convert(exported(False), dynamic=True), repo, name="m")
    before = {path: (repo / path).read_bytes() for path in walk(repo) if (repo / path).is_file()}
    source = tmp_path / "m.hlo"  # jaxlib's HLO parser aborts on it (tests/test_cli_promises.py)
    source.write_text("HloModule m\n\nENTRY main {\n  p = f32[2]{0} parameter(5)\n  ROOT r = f32[2]{0} add(p, p)\n}\n")
    done = subprocess.run([sys.executable, "-m", "hlo2onnx", str(source), "--triton-repo", str(repo), "--name", "m"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "the parser crashed" in done.stderr, done.stderr
    assert {path: (repo / path).read_bytes() for path in walk(repo) if (repo / path).is_file()} == before
    assert sorted(os.listdir(repo)) == ["m"]
