"""Symbolic-batch export, side by side with jax2onnx on the same models (tests/test_dynamic_export.py's table).

Each model is exported over symbolic dims ("b", "b, s", ...), converted by hlo2onnx (`convert(exported,
dynamic=True)`) and by jax2onnx (`to_onnx` on the same ShapeDtypeStructs), and each ONNX model is run in ONNX
Runtime at the table's sizes and compared with jax.jit at each. A model counts for a converter only when it
converts and matches at every size. jax2onnx is the `bench` extra (`pip install jax2onnx`).

    python benchmarks/dynamic_vs_jax2onnx.py [--first-14]
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "tests")]  # this checkout; the test table

import jax  # noqa: E402
import numpy as np  # noqa: E402
import onnx_ir as ir  # noqa: E402
import onnxruntime as ort  # noqa: E402
from jax import export  # noqa: E402

import hlo2onnx  # noqa: E402
from test_dynamic_export import CASES, concrete, specs  # noqa: E402

# The issue's list of 14 models, by their rows in the table.
ISSUE = ["cnn_nhwc_maxpool", "cnn_nchw_avgpool", "attention_fixed_seq", "attention_symbolic_seq", "take",
         "concat_reverse_pad", "scan_rnn", "cumsum", "sort", "dynamic_slice_in_dim", "at_add", "argmax",
         "arange", "layer_norm"]


def runs_like_jit(model_bytes: bytes, case) -> bool:
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    for k, sizes in enumerate(case.sizes):
        args = [concrete(a, sizes, seed=k * 10 + i) for i, a in enumerate(case.args)]
        expected = jax.tree_util.tree_leaves(jax.jit(case.fun)(*args))
        feeds = {inp.name: a for inp, a in zip(session.get_inputs(), args)}
        got = session.run(None, feeds)
        if len(got) != len(expected):
            return False
        for g, e in zip(got, expected):
            e = np.asarray(e)
            if g.shape != e.shape or not np.allclose(g.astype(np.float64), e.astype(np.float64), rtol=1e-4,
                                                     atol=1e-4, equal_nan=True):
                return False
    return True


def ours(case) -> bool:
    exported = export.export(jax.jit(case.fun))(*specs(case))
    model = hlo2onnx.convert(exported, dynamic=True, opset=case.opset).model
    return runs_like_jit(ir.to_proto(model).SerializeToString(), case)


def theirs(case) -> bool:
    from jax2onnx import to_onnx

    proto = to_onnx(case.fun, specs(case), opset=max(case.opset, 21))
    return runs_like_jit(proto.SerializeToString(), case)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first-14", action="store_true", help="only the issue's 14 models")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    cases = [c for c in CASES if not args.first_14 or c.name in ISSUE]
    totals = {"hlo2onnx": 0, "jax2onnx": 0}
    print(f"{'model':<36}{'hlo2onnx':>10}{'jax2onnx':>10}")
    for case in cases:
        row = []
        for name, convert in (("hlo2onnx", ours), ("jax2onnx", theirs)):
            try:
                ok = convert(case)
            except Exception:  # noqa: BLE001 (a refusal or a crash both count as not converted)
                ok = False
            totals[name] += ok
            row.append("ok" if ok else "-")
        print(f"{case.name:<36}{row[0]:>10}{row[1]:>10}")
    print(f"{'converted and matching':<36}{totals['hlo2onnx']:>10}{totals['jax2onnx']:>10}  of {len(cases)}")


if __name__ == "__main__":
    main()
