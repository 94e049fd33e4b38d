"""Names a server can use: dict keys name ONNX inputs and outputs; input_names/output_names on convert, mnjit's
save(), write_triton_repo and the CLI; clear errors for clashes and invalid names; NCHW inputs and outputs at the
boundary of an NHWC model, matching jax.jit after transposing."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from jax import lax

import hlo2onnx
from hlo2onnx.command import main
from mnjit import mnjit
from harness import rand


def classifier(inputs, scale):
    logits = inputs["image"].reshape(inputs["image"].shape[0], -1) @ inputs["extra"]["w"] * scale
    return {"probs": jax.nn.softmax(logits), "logits": logits}


ARGS = ({"image": rand((2, 3, 4), seed=1), "extra": {"w": rand((12, 5), seed=2)}}, np.float32(2.0))


def io_names(path) -> tuple[list[str], list[str]]:
    graph = onnx.load(str(path)).graph
    return [v.name for v in graph.input], [v.name for v in graph.output]


def run_ort(path, feeds: dict) -> dict:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def expected() -> dict:
    return jax.jit(classifier)(*ARGS)


@pytest.mark.parametrize("source", ["lowered", "exported"])
def test_dict_keys_name_inputs_and_outputs_of_convert(source, tmp_path):
    fn = jax.jit(classifier)
    artifact = fn.lower(*ARGS) if source == "lowered" else jax.export.export(fn)(*ARGS)
    hlo2onnx.convert(artifact, tmp_path / "m.onnx")
    assert io_names(tmp_path / "m.onnx") == (["extra.w", "image", "scale"], ["logits", "probs"])
    got = run_ort(tmp_path / "m.onnx", {"image": ARGS[0]["image"], "extra.w": ARGS[0]["extra"]["w"],
                                        "scale": np.asarray(ARGS[1])})
    for key, value in expected().items():
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6)


def test_names_through_mnjit_save_and_triton_config(tmp_path):
    from google.protobuf import text_format
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")

    step = mnjit(classifier)
    lowered = step.lower(*ARGS)
    lowered.save(tmp_path / "m.onnx")
    assert io_names(tmp_path / "m.onnx") == (["extra.w", "image", "scale"], ["logits", "probs"])
    lowered.save(tmp_path / "renamed.onnx", input_names=["w", "pixels", "temperature"], output_names="scores,p")
    assert io_names(tmp_path / "renamed.onnx") == (["w", "pixels", "temperature"], ["scores", "p"])
    got = run_ort(tmp_path / "renamed.onnx", {"pixels": ARGS[0]["image"], "w": ARGS[0]["extra"]["w"],
                                              "temperature": np.asarray(ARGS[1])})
    np.testing.assert_allclose(got["p"], expected()["probs"], rtol=1e-5, atol=1e-6)
    # The lowering's own model is untouched: mnjit still runs it.
    np.testing.assert_allclose(step(*ARGS)["probs"], expected()["probs"], rtol=1e-5, atol=1e-6)
    assert [v.name for v in lowered.model.graph.outputs] == ["logits", "probs"]

    for kwargs, inputs, outputs in (({}, ["extra.w", "image", "scale"], ["logits", "probs"]),
                                    ({"output_names": ["scores", "p"]}, ["extra.w", "image", "scale"],
                                     ["scores", "p"])):
        repo = hlo2onnx.write_triton_repo(lowered, tmp_path / "repo", name="clf", max_batch_size=0, **kwargs)
        with open(f"{repo}/config.pbtxt") as f:
            config = text_format.Parse(f.read(), model_config_pb2.ModelConfig())
        assert [t.name for t in config.input] == inputs and [t.name for t in config.output] == outputs
        assert io_names(f"{repo}/1/model.onnx") == (inputs, outputs)


def test_names_clash_or_invalid_names_are_refused():
    lowered = jax.jit(classifier).lower(*ARGS)
    with pytest.raises(hlo2onnx.Hlo2OnnxError, match="'x' is given to two"):
        hlo2onnx.convert(lowered, input_names=["x", "x", "s"])
    with pytest.raises(hlo2onnx.Hlo2OnnxError, match="'scale' is given to two"):
        hlo2onnx.convert(lowered, output_names=["scale", "p"])  # an input keeps the name 'scale'
    with pytest.raises(hlo2onnx.Hlo2OnnxError, match="invalid input name 'my image'"):
        hlo2onnx.convert(lowered, input_names=["w", "my image", "s"])
    with pytest.raises(hlo2onnx.Hlo2OnnxError, match=r"2 input name\(s\) given for the model's 3 inputs "
                                                      r"\(extra.w, image, scale\)"):
        hlo2onnx.convert(lowered, input_names="a,b")
    with pytest.raises(hlo2onnx.Hlo2OnnxError, match="no input 'nope'"):
        hlo2onnx.convert(lowered, inputs_as_nchw=["nope"])
    with pytest.raises(hlo2onnx.Hlo2OnnxError, match="'scale' has rank 0"):
        hlo2onnx.convert(lowered, inputs_as_nchw=["scale"])


def test_a_name_held_inside_the_graph_is_moved_aside():
    # ONNX names are unique in a graph: an internal value already called like the new name is renamed.
    lowered = jax.jit(classifier).lower(*ARGS)
    inner = {v.name for node in hlo2onnx.convert(lowered).model.graph for v in node.outputs}
    taken = sorted(n for n in inner if n)[0]
    model = hlo2onnx.convert(lowered, output_names=[taken, "p"]).model
    onnx.checker.check_model(ir_proto := hlo2onnx.convert(lowered, output_names=[taken, "p"]).to_proto())
    assert ir_proto.graph.output[0].name == taken
    assert [v.name for v in model.graph.outputs] == [taken, "p"]


def conv_net(x, kernel, bias):
    y = lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(y + bias)
    y = lax.conv_general_dilated(y, kernel[:, :, :, :].transpose(0, 1, 3, 2)[:, :, :4, :4], (1, 1), "SAME",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y


X, K, B = rand((2, 8, 8, 4), seed=3), rand((3, 3, 4, 4), seed=4), rand((4,), seed=5)


def transposes(model) -> int:
    return sum(node.op_type == "Transpose" for node in model.graph)


def test_nchw_boundary_matches_jax_jit_and_folds_transposes(tmp_path):
    lowered = jax.jit(conv_net).lower(X, K, B)
    plain = hlo2onnx.convert(lowered)
    conversion = hlo2onnx.convert(lowered, tmp_path / "nchw.onnx", inputs_as_nchw=["x"], outputs_as_nchw="out0")
    model = onnx.load(str(tmp_path / "nchw.onnx"))
    dims = [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in (model.graph.input[0], model.graph.output[0])]
    assert dims == [[2, 4, 8, 8], [2, 4, 8, 8]]
    got = run_ort(tmp_path / "nchw.onnx", {"x": X.transpose(0, 3, 1, 2), "kernel": K, "bias": B})["out0"]
    np.testing.assert_allclose(got, np.asarray(jax.jit(conv_net)(X, K, B)).transpose(0, 3, 1, 2),
                               rtol=1e-5, atol=1e-5)
    # The boundary's Transposes cancel the convolutions' own: no more than the NHWC model has, here fewer.
    assert transposes(conversion.model) < transposes(plain.model)
    assert conversion.check().ok  # the check feeds JAX NHWC and compares NCHW outputs


def test_cli_names_and_nchw(tmp_path, capsys):
    path = tmp_path / "conv.mlir"
    path.write_text(jax.jit(conv_net).lower(X, K, B).as_text())
    status = main([str(path), "-o", str(tmp_path / "conv.onnx"), "--input-names", "pixels,k,b",
                   "--output-names", "features", "--inputs-as-nchw", "pixels", "--outputs-as-nchw", "features",
                   "--check"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "tolerance float32 rtol=0.0001 atol=1e-05: ok" in out
    assert io_names(tmp_path / "conv.onnx") == (["pixels", "k", "b"], ["features"])
    got = run_ort(tmp_path / "conv.onnx", {"pixels": X.transpose(0, 3, 1, 2), "k": K, "b": B})["features"]
    np.testing.assert_allclose(got, np.asarray(jax.jit(conv_net)(X, K, B)).transpose(0, 3, 1, 2),
                               rtol=1e-5, atol=1e-5)
    assert main([str(path), "-o", str(tmp_path / "bad.onnx"), "--output-names", "a,b"]) == 1
    assert "1 output" in capsys.readouterr().err
