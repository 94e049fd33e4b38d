"""targets/rounding.py: f32 rounded to bf16 and f16 in f32 arithmetic is bit for bit the Cast (ml_dtypes'
round to nearest even), on ONNX Runtime and on OpenVINO (which drops the Cast itself inside a graph: the
reason the rounding exists), over random bit patterns and the edges: ties, subnormals, overflow, inf, NaN.
Zeros are compared by value: both runtimes gave +0.0 for a -0.0 through the select (the reference
implementation -0.0).
"""
from __future__ import annotations

import importlib.util

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hlo2onnx.targets.rounding import round_as

_rng = np.random.default_rng(0)
_EDGES = np.array([0.0, np.inf, np.nan, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -9, 1 + 2 ** -11, 65504, 65519.99,
                   65520, 65536, 1e38, 3.4028235e38, 2 ** -126, 2 ** -133, 2 ** -134, 3 * 2 ** -134, 2 ** -14,
                   2 ** -24, 2 ** -25, 3 * 2 ** -25, 2.179074], np.float32)
X = np.concatenate([_rng.integers(0, 2 ** 32, 50000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                    _EDGES, -_EDGES, (_rng.standard_normal(5000) * 100).astype(np.float32)])


def _model(narrow: int) -> bytes:
    nodes, out = round_as("x", narrow, "y", [0])
    graph = helper.make_graph([*nodes, helper.make_node("Identity", [out], ["y"])], "round",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def _run_ort(model: bytes) -> np.ndarray:
    return ort.InferenceSession(model).run(None, {"x": X})[0]


def _run_openvino(model: bytes) -> np.ndarray:
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(model, b""), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled.create_infer_request().infer({0: X})[compiled.outputs[0]]


@pytest.mark.parametrize("narrow,dtype", [(TensorProto.BFLOAT16, ml_dtypes.bfloat16),
                                          (TensorProto.FLOAT16, np.float16)], ids=["bf16", "f16"])
@pytest.mark.parametrize("run", [_run_ort, pytest.param(_run_openvino, marks=pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None, reason="openvino is not installed"))], ids=["ort", "openvino"])
def test_rounding_is_the_cast(narrow, dtype, run) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        want = X.astype(dtype).astype(np.float32)
    got = run(_model(narrow))
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want)) | (got == 0) & (want == 0)
    assert same.all(), f"{(~same).sum()} differ: {X[~same][:5]} gave {got[~same][:5]}, not {want[~same][:5]}"
