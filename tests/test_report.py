"""The conversion report (MnjitLowered.report(), hlo2onnx --report): what each StableHLO op kind became,
which fusions fired, node counts before and after, and the node metadata it is read from."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx

from harness import rand
from hlo2onnx.command import main
from hlo2onnx.provenance import SOURCE_LOC, SOURCE_OP
from mnjit import mnjit

x48, w83, b3 = rand((4, 8), seed=1), rand((8, 3), seed=2), rand((3,), seed=3)


def dense(x, w, b):
    return jax.nn.log_softmax(jnp.tanh(x @ w + b))


def _mapping_lines(text: str) -> dict[str, str]:
    return {line[2:].split(" x")[0]: line.split(" -> ")[1] for line in text.splitlines() if line.startswith("- ")}


def test_lowered_report():
    lowered = mnjit(dense).lower(x48, w83, b3)
    text = lowered.report()
    mapping = _mapping_lines(text)
    assert mapping["stablehlo.dot_general"] == "Gemm* x1"  # * marks a fused node
    assert mapping["stablehlo.tanh"] == "Tanh x1"
    assert "LogSoftmax*" in mapping["stablehlo.exponential"]
    assert "Fusions: " in text and "MatMulBias x1" in text and "LogSoftmax x1" in text
    report = lowered.conversion
    nodes_after = len(lowered.onnx_model.graph.node)
    assert f"-> {nodes_after} after clean-up and fusion" in text
    assert report.optimized.nodes_before > nodes_after
    assert "Target ort-cpu: every node fits" in text


def test_node_metadata_names_source_op_and_line():
    model = mnjit(dense).lower(x48, w83, b3).onnx_model
    tanh = next(n for n in model.graph.node if n.op_type == "Tanh")
    props = {p.key: p.value for p in tanh.metadata_props}
    assert props[SOURCE_OP] == "stablehlo.tanh"
    assert props[SOURCE_LOC].endswith(f"test_report.py:{dense.__code__.co_firstlineno + 1}")
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    assert {p.key: p.value for p in gemm.metadata_props}["hlo2onnx.rule"] == "MatMulBias"
    onnx.checker.check_model(model, full_check=True)  # the metadata is valid ONNX (IR 10)


def test_report_without_fusion_lists_no_fusions():
    import hlo2onnx

    report = hlo2onnx.translate_report(jax.jit(dense).lower(x48, w83, b3).compiler_ir("stablehlo"), fuse=False)
    text = str(report)
    assert "Fusions:" not in text
    assert "Expand" in _mapping_lines(text)["stablehlo.broadcast_in_dim"]


def test_loop_body_nodes_are_attributed():
    fun = lambda x: jax.lax.fori_loop(0, 3, lambda i, c: jnp.sin(c), x)  # noqa: E731
    mapping = _mapping_lines(mnjit(fun).lower(x48).report())
    assert "Loop" in mapping["stablehlo.while"] and "Sin" in mapping["stablehlo.sine"]


def test_cli_report(tmp_path, capsys):
    source = tmp_path / "dense.mlir"
    source.write_text(jax.jit(dense).lower(x48, w83, b3).as_text())
    assert main([str(source), "-o", str(tmp_path / "m.onnx"), "--report"]) == 0
    out = capsys.readouterr().out
    mapping = _mapping_lines(out)
    assert mapping["stablehlo.dot_general"] == "Gemm* x1"
    assert "Fusions: " in out and "MatMulBias x1" in out and "translated ->" in out


def test_cnn_report_shows_conv_fusions():
    fun = lambda x, w, b: jax.nn.relu(jax.lax.conv_general_dilated(  # noqa: E731
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) + b)
    args = (rand((1, 5, 5, 2), seed=4), rand((3, 3, 2, 4), seed=5), rand((4,), seed=6))
    text = mnjit(fun).lower(*args).report()
    assert "ConvBias x1" in text and "Relu x1" in text
    assert _mapping_lines(text)["stablehlo.convolution"].startswith(("Conv* x1", "Transpose"))
    np.testing.assert_allclose(np.asarray(mnjit(fun)(*args)), np.asarray(jax.jit(fun)(*args)), rtol=1e-5, atol=1e-5)
