"""The ORT CPU support table must match what ONNX Runtime can actually run, entry by entry."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

import onnxruntime as ort
import pytest
from onnx import helper

from hlo2onnx.targets import F16_VIA_F32, ORT_CPU_MISSING, BF16, ORT_CPU
from hlo2onnx.types import onnx_dtype

# Unary/binary ops whose missing entries are probed with a one-node model.
_ARITY = {"Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Max": 2, "Min": 2, "Neg": 1, "Abs": 1, "Sign": 1,
          "BitwiseAnd": 2, "BitwiseOr": 2, "BitwiseXor": 2, "BitwiseNot": 1, "Exp": 1, "Log": 1, "Sqrt": 1,
          "Tanh": 1, "Sin": 1, "Cos": 1, "Floor": 1, "Ceil": 1, "Round": 1, "Sigmoid": 1, "Tan": 1, "Erf": 1,
          "Atan": 1, "Relu": 1, "Pow": 2, "MatMul": 2}


def _one_node_model(op: str, dtype: np.dtype) -> onnx.ModelProto:
    """`op` on [2, 2] inputs of `dtype`."""
    elem = int(onnx_dtype(dtype))
    inputs = [helper.make_tensor_value_info(f"x{i}", elem, [2, 2]) for i in range(_ARITY[op])]
    graph = helper.make_graph([helper.make_node(op, [i.name for i in inputs], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _runs(op: str, dtype: np.dtype) -> bool:
    try:
        session = ort.InferenceSession(_one_node_model(op, dtype).SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        session.run(None, {f"x{i}": np.ones([2, 2], dtype) for i in range(_ARITY[op])})
        return True
    except Exception:  # noqa: BLE001 - ORT raises several types for a missing kernel
        return False


def _schema_allows(op: str, dtype: np.dtype) -> bool:
    """Only dtypes the ONNX schema itself accepts say anything about ORT's kernels."""
    constraint = onnx.defs.get_schema(op, 21).type_constraints[0]
    name = onnx.helper.tensor_dtype_to_string(int(onnx_dtype(dtype))).replace("TensorProto.", "").lower()
    aliases = {"float": "float32", "double": "float64"}
    allowed = {t[len("tensor("):-1] for t in constraint.allowed_type_strs}
    return any(aliases.get(a, a) == aliases.get(name, name) for a in allowed)


_PROBED = [(op, dtype) for op, dtypes in ORT_CPU_MISSING.items() if op in _ARITY
           for dtype in map(np.dtype, ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                       "uint64", "float16", "float32", "float64"))
           if _schema_allows(op, dtype) and not (op in F16_VIA_F32 and dtype == np.float16)]


@pytest.mark.parametrize("op,dtype", _PROBED, ids=[f"{o}-{d}" for o, d in _PROBED])
def test_table_matches_ort(op, dtype):
    assert ORT_CPU.supports(op, dtype) == _runs(op, dtype), \
        f"support table says {op}/{dtype} is {'supported' if ORT_CPU.supports(op, dtype) else 'missing'}"


def test_compute_dtype_widens_and_bf16_goes_to_f32():
    assert ORT_CPU.compute_dtype("Add", np.dtype("int8")) == np.dtype("int8")
    assert ORT_CPU.compute_dtype("Max", np.dtype("int16")) == np.dtype("int32")
    assert ORT_CPU.compute_dtype("Exp", np.dtype("float16")) == np.dtype("float32")
    assert ORT_CPU.compute_dtype("Max", np.dtype("float16")) == np.dtype("float16")
    assert ORT_CPU.compute_dtype("Add", BF16) == np.dtype("float32")
    assert ORT_CPU.compute_dtype("Reshape", BF16) == BF16
    with pytest.raises(NotImplementedError, match="Erf"):
        ORT_CPU.compute_dtype("Erf", np.dtype("float64"))


def test_f16_chains_lose_rounding_in_ort():
    """Why the table sends f16 arithmetic to f32: ORT runs (x - s) * c + d on f16 rounded once, not per op.

    If a new ORT release rounds each node, this fails, and F16_VIA_F32 can go."""
    x = np.linspace(-1, 1, 2001).astype(np.float16)
    nodes = [helper.make_node("Sub", ["x", "s"], ["a"]), helper.make_node("Mul", ["a", "c"], ["b"]),
             helper.make_node("Add", ["b", "d"], ["y"])]
    consts = [helper.make_tensor(n, onnx.TensorProto.FLOAT16, [], [v]) for n, v in (("s", 0.3), ("c", 5.0), ("d", -2.0))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT16, [2001])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT16, [2001])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    s, c, d = (np.float16(v) for v in (0.3, 5.0, -2.0))
    per_op = (x - s) * c + d  # numpy rounds each f16 op, as XLA does
    assert (y != per_op).any()


def _casts_to_f32(op: str, directory: Path) -> bool:
    """Whether ORT runs a one-node f16 `op` by inserting Casts (no f16 kernel)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(directory / f"{op}.onnx")
    ort.InferenceSession(_one_node_model(op, np.dtype(np.float16)).SerializeToString(), options,
                         providers=["CPUExecutionProvider"])
    return any(node.op_type == "Cast" for node in onnx.load(options.optimized_model_filepath).graph.node)


_F16_PROBED = [op for op in _ARITY if _schema_allows(op, np.dtype(np.float16))]


@pytest.mark.parametrize("op", _F16_PROBED)
def test_f16_table_matches_ort(op, tmp_path):
    assert (op in F16_VIA_F32) == _casts_to_f32(op, tmp_path), f"{op}: f16 via f32 in the table, not in ORT (or back)"
