"""The `hlo2onnx` command and `hlo2onnx.convert`: every input format, symbolic batches, malformed inputs.

Expected values come from jax.jit on the same inputs; the ONNX model runs in ONNX Runtime.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from jax import export, lax

import hlo2onnx
from hlo2onnx.command import PROGRESS_MIN_OPS, ProgressLine, main
from hlo2onnx.loading import FORMATS as FORMAT_NAMES
from harness import check_model, rand

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable  # the leg's own interpreter: each CI leg has its own jax


def mlp(x, params):
    h = jnp.maximum(x @ params["w1"] + params["b1"], 0.0)
    y = jnp.tanh(h @ params["w2"] + params["b2"])
    return {"logits": y, "total": y.sum(axis=1)}


PARAMS = {"w1": rand((4, 8), seed=1), "b1": rand((8,), seed=2), "w2": rand((8, 3), seed=3), "b2": rand((3,), seed=4)}
X = rand((5, 4), seed=5)


def lowered():
    return jax.jit(mlp).lower(X, PARAMS)


def _bytecode(module) -> bytes:
    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    return buf.getvalue()


# The source of each format, as a user would have saved it.
FORMATS = {
    "stablehlo-text": lambda: lowered().as_text().encode(),
    "mlir-bytecode": lambda: _bytecode(lowered().compiler_ir("stablehlo")),
    "portable-artifact": lambda: bytes(export.export(jax.jit(mlp))(X, PARAMS).mlir_module_serialized),
    "jax-export": lambda: bytes(export.export(jax.jit(mlp))(X, PARAMS).serialize()),
    "jax-export-multiplatform": lambda: bytes(export.export(jax.jit(mlp), platforms=("cpu", "cuda"))(X, PARAMS)
                                              .serialize()),
    "hlo-text": lambda: lowered().as_text(dialect="hlo").encode(),
    # as a Windows editor saves text: a byte order mark (refused as an "unexpected character"), CRLF line ends
    "stablehlo-text+bom": lambda: b"\xef\xbb\xbf" + FORMATS["stablehlo-text"](),
    "hlo-text+bom": lambda: b"\xef\xbb\xbf" + FORMATS["hlo-text"](),
    "stablehlo-text+crlf": lambda: FORMATS["stablehlo-text"]().replace(b"\n", b"\r\n"),
    "hlo-text+crlf": lambda: FORMATS["hlo-text"]().replace(b"\n", b"\r\n"),
}


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """In process: the exit status, stdout and stderr of `hlo2onnx argv`."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own exits
        status = e.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def run_ort(path, feeds) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def flat_inputs(x, params=PARAMS) -> list[np.ndarray]:
    return jax.tree_util.tree_leaves((x, params))


def assert_matches_jit(model_path, x) -> None:
    model = onnx.load(str(model_path))
    check_model(model)
    names = [i.name for i in model.graph.input]
    actual = run_ort(model_path, dict(zip(names, flat_inputs(x))))
    expected = jax.tree_util.tree_leaves(jax.jit(mlp)(x, PARAMS))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype
        np.testing.assert_allclose(a, np.asarray(e), rtol=2e-6, atol=2e-6)


# -- round trips --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_round_trip(fmt, tmp_path, capsys):
    source = tmp_path / "model.bin"  # no telling extension: the format comes from the content
    source.write_bytes(FORMATS[fmt]())
    status, out, err = run_cli([source, "-o", tmp_path / "model.onnx", "--verbose"], capsys)
    assert status == 0, err
    assert out == ""
    expected_format = "jax-export" if fmt.startswith("jax-export") else fmt.split("+")[0]
    assert err.startswith(f"hlo2onnx: {FORMAT_NAMES[expected_format]}: "), err
    for stage in ("read", "parse", "translate", "save"):
        assert f"  {stage}" in err
    assert_matches_jit(tmp_path / "model.onnx", X)


def test_check_prints_max_error(tmp_path, capsys):
    source = tmp_path / "model.mlir"
    source.write_text(lowered().as_text())
    status, out, err = run_cli([source, "--check"], capsys)
    assert status == 0, err
    assert out.startswith("check: max abs error ") and out.rstrip().endswith(": ok"), out
    assert (tmp_path / "model.onnx").exists()  # default output: the input's name with .onnx


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_])
def test_check_feeds_scalar_inputs_as_scalars(dtype, tmp_path, capsys):
    """A 0-d input (random or given) reaches ORT 0-d: ORT took a 1-d one and gave a 1-d result, a mismatch."""
    source = tmp_path / "model.jaxexport"
    x = np.ones((), dtype)
    source.write_bytes(export.export(jax.jit(lambda x, v: (x, v * 2)))(x, np.ones(3, np.float32)).serialize())
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--check"], capsys)
    assert status == 0 and out.rstrip().endswith(": ok"), out + err
    np.savez(tmp_path / "in.npz", x, np.ones(3, np.float32))
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--inputs", tmp_path / "in.npz"], capsys)
    assert status == 0 and out.rstrip().endswith(": ok"), out + err


def test_check_with_npz_inputs(tmp_path, capsys):
    source = tmp_path / "model.jaxexport"
    source.write_bytes(FORMATS["jax-export"]())
    np.savez(tmp_path / "in.npz", *flat_inputs(X))
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--inputs", tmp_path / "in.npz"], capsys)
    assert status == 0, err
    assert "check: max abs error" in out and out.rstrip().endswith("ok")
    np.savez(tmp_path / "bad.npz", np.zeros((2, 2), np.float64))
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--inputs", tmp_path / "bad.npz"], capsys)
    assert_one_line_error(status, err, "the inputs must be named x, b1")
    # One array too many, or a name the model does not take: refused, not checked on a prefix.
    np.savez(tmp_path / "more.npz", *flat_inputs(X), np.zeros(3))
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--inputs", tmp_path / "more.npz"], capsys)
    assert_one_line_error(status, err, "the model takes 5 inputs (x, b1, b2, w1, "
                                       "w2); also given: arr_5")
    named = dict(zip(["x", "b1", "b2", "w1", "w2"], flat_inputs(X)))
    np.savez(tmp_path / "named.npz", **named, y=np.zeros(3))
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--inputs", tmp_path / "named.npz"], capsys)
    assert_one_line_error(status, err, "also given: y")


def test_check_detects_a_wrong_model(tmp_path):
    """The check can fail: a model whose tanh became a sigmoid is reported."""
    conversion = hlo2onnx.convert(lowered().as_text().encode())
    assert conversion.check().ok
    for node in conversion.model.graph.all_nodes():
        if node.op_type == "Tanh":
            node.op_type = "Sigmoid"
    result = conversion.check()
    assert not result.ok and result.max_abs_error > 0.1
    assert "MISMATCH" in result.summary()


def test_stdin_and_stdout(monkeypatch, capsysbinary):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lowered().as_text().encode())))
    assert main(["-", "-o", "-", "--report"]) == 0
    captured = capsysbinary.readouterr()
    model = onnx.load_from_string(captured.out)
    onnx.checker.check_model(model, full_check=True)
    report = captured.err.decode()  # the report moves to stderr when the model takes stdout
    assert "stablehlo.dot_general" in report and ("MatMul" in report or "Gemm" in report)  # fused or not


def test_report_and_name(tmp_path, capsys):
    source = tmp_path / "model.mlir"
    source.write_text(lowered().as_text())
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--report", "--name", "mlp"], capsys)
    assert status == 0, err
    counts = dict(line.split() for line in out.splitlines() if line.startswith("  "))
    assert counts["stablehlo.dot_general"] == "2"
    assert int(counts.get("MatMul", 0)) + int(counts.get("Gemm", 0)) == 2  # Gemm once the bias add fuses
    assert onnx.load(str(tmp_path / "m.onnx")).graph.name == "mlp"


def test_api_convert(tmp_path):
    conversion = hlo2onnx.convert(export.export(jax.jit(mlp))(X, PARAMS), tmp_path / "m.onnx", opset=18)
    assert conversion.format == "jax-export"
    assert conversion.to_proto().opset_import[0].version == 18
    assert [i.name for i in onnx.load(str(tmp_path / "m.onnx")).graph.input] == \
        ["x", "b1", "b2", "w1", "w2"]
    assert_matches_jit(tmp_path / "m.onnx", X)


@pytest.mark.parametrize("source", ["text", "lowered"])
def test_api_convert_takes_text_and_lowered(source, tmp_path):
    """`convert(lowered.as_text())` is the module's text, not a file name (it failed with 'cannot read
    <the whole module>: File name too long'), and a jax.stages.Lowered converts as its StableHLO."""
    given = lowered().as_text() if source == "text" else lowered()
    conversion = hlo2onnx.convert(given, tmp_path / "m.onnx")
    assert conversion.check().ok
    assert_matches_jit(tmp_path / "m.onnx", X)


def test_unused_arguments_stay_inputs(tmp_path):
    """jax.export drops unused arguments from the module; the ONNX model still takes every leaf."""
    exported = export.export(jax.jit(lambda x, unused, y: x * y))(X, X, X)
    assert exported.module_kept_var_idx == (0, 2)
    conversion = hlo2onnx.convert(exported.serialize(), tmp_path / "m.onnx")
    assert [i.name for i in conversion.model.graph.inputs] == ["x", "arg1", "y"]
    (actual,) = run_ort(tmp_path / "m.onnx", {"x": X, "arg1": X, "y": 2 * X})
    np.testing.assert_allclose(actual, np.asarray(jax.jit(lambda x, y: x * y)(X, 2 * X)), rtol=1e-6)


def test_progress(tmp_path, capsys):
    def chain(x):
        for i in range(100):
            x = jnp.sin(x) * 0.5 + i
        return x

    source = tmp_path / "chain.mlir"
    source.write_text(jax.jit(chain).lower(np.ones(3, np.float32)).as_text())
    status, out, err = run_cli([source, "--progress"], capsys)  # forced: shown even for a small module
    assert status == 0, err
    assert "translating: " in err and err.rstrip().endswith("(100%)")
    status, out, err = run_cli([source], capsys)  # stderr is not a terminal: silent
    assert status == 0 and err == ""


def test_progress_only_for_big_modules_by_default():
    stream = io.StringIO()
    line = ProgressLine(stream, forced=False)
    line(10, PROGRESS_MIN_OPS - 1)
    assert stream.getvalue() == ""
    line(10, 8500)
    line(8500, 8500)
    assert stream.getvalue() == "\rtranslating: 10/8500 ops (0%)\rtranslating: 8500/8500 ops (100%)\n"


# -- symbolic dims ------------------------------------------------------------------------------------
def poly_artifact(fun=mlp) -> bytes:
    batch = export.symbolic_shape("batch")
    return bytes(export.export(jax.jit(fun))(jax.ShapeDtypeStruct((*batch, 4), np.float32), PARAMS).serialize())


def test_symbolic_batch(tmp_path, capsys):
    source = tmp_path / "poly.jaxexport"
    source.write_bytes(poly_artifact())
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--dynamic", "--check"], capsys)
    assert status == 0, err
    assert "over 2 runs (symbolic dims = 2, 5), tolerance float32 rtol=0.0001 atol=1e-05: ok" in out
    model = onnx.load(str(tmp_path / "m.onnx"))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert [i.name for i in model.graph.input] == ["x", "b1", "b2", "w1",
                                                   "w2"]
    assert all(o.type.tensor_type.shape.dim[0].dim_param == "batch" for o in model.graph.output)
    for batch in (1, 17):
        assert_matches_jit(tmp_path / "m.onnx", rand((batch, 4), seed=batch))


def test_symbolic_batch_needs_dynamic(tmp_path, capsys):
    source = tmp_path / "poly.jaxexport"
    source.write_bytes(poly_artifact())
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx"], capsys)
    assert status == 1 and err.count("\n") == 1
    assert "--dynamic" in err and "batch" in err


def test_dynamic_dims_on_unsupported_op(tmp_path, capsys):
    source = tmp_path / "poly.jaxexport"
    source.write_bytes(poly_artifact(lambda x, p: mlp(lax.cumlogsumexp(x, axis=0), p)))
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--dynamic"], capsys)
    assert status == 1 and err.count("\n") == 1
    assert "dynamic_reduce_window: a cumulative reduction by a body of several ops over a symbolic dimension" in err


# -- malformed inputs ---------------------------------------------------------------------------------
TOSA = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = tosa.abs %a : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""
CUSTOM_CALL = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.custom_call @my_kernel(%a) : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""


def _half(fmt):
    data = FORMATS[fmt]()
    return data[:len(data) // 2]


def _non_utf8_main(fmt):
    data = FORMATS[fmt]()
    name = b"\x00main\x00"  # the function's name in the bytecode's string table (paths hold "main" too)
    assert data.count(name) == 1
    return data.replace(name, b"\x00m\xffin\x00")


BAD_INPUTS = {
    "truncated-text": (lambda: _half("stablehlo-text"), "cannot parse MLIR"),
    "truncated-bytecode": (lambda: _half("mlir-bytecode"), "cannot parse MLIR"),
    "truncated-portable": (lambda: _half("portable-artifact"), "cannot parse MLIR"),
    "truncated-export": (lambda: _half("jax-export"), "unrecognized input"),
    "truncated-hlo": (lambda: _half("hlo-text"), "cannot parse HLO text"),
    # Bytecode may name a function with any bytes; MLIR's Python bindings cannot read such a name as a str.
    **{f"non-utf8-name-{fmt}": (lambda fmt=fmt: _non_utf8_main(fmt), "symbol name b'm\\xffin' is not valid UTF-8")
       for fmt in ("mlir-bytecode", "portable-artifact", "jax-export")},
    "garbage": (lambda: np.random.default_rng(0).bytes(700), "unrecognized input"),
    "text-garbage": (lambda: b"hello world\n", "cannot parse MLIR"),
    "tosa-dialect": (lambda: TOSA.encode(), "Dialect `tosa' not found"),
    "unknown-generic-op": (lambda: TOSA.replace("tosa.abs %a", '"foo.bar"(%a)').encode(), "unregistered dialect"),
    "custom-call": (lambda: CUSTOM_CALL.encode(), "custom call @my_kernel has no ONNX translation"),
    "empty": (lambda: b"", "the input is empty"),
    "whitespace": (lambda: b"  \n\n", "the input is empty"),
    "no-main": (lambda: b"func.func @other() {\n  return\n}\n", "no function @main"),
    # ORT refuses a graph without outputs: converting it must fail, not write an unloadable model.
    "no-results": (lambda: b"func.func @main(%a: tensor<2xf32>) {\n  return\n}\n", "@main has no results"),
}


def assert_one_line_error(status, err, expected, code=1):
    assert status == code, err
    assert err.count("\n") == 1 and err.startswith("hlo2onnx: error: "), err
    assert "Traceback" not in err
    assert expected in err, err


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_malformed_input(case, tmp_path, capsys):
    make, expected = BAD_INPUTS[case]
    source = tmp_path / "model.mlir"
    source.write_bytes(make())
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx"], capsys)
    assert_one_line_error(status, err, expected)
    assert not (tmp_path / "m.onnx").exists()


# Dims no machine could hold are still valid modules: converted without materializing anything (an i32 iota
# longer than int32's range was an internal error).
HUGE = {
    "iota-i32-past-int32": ("stablehlo.iota dim = 0 : tensor<3000000000xi32>", "tensor<3000000000xi32>"),
    "iota-f16": ("stablehlo.iota dim = 0 : tensor<3000000000xf16>", "tensor<3000000000xf16>"),
    "splat": ("stablehlo.constant dense<1.0> : tensor<100000000000xf32>", "tensor<100000000000xf32>"),
    "broadcast": ("stablehlo.broadcast_in_dim %a, dims = [] : (tensor<f32>) -> tensor<100000x100000x1000xf32>",
                  "tensor<100000x100000x1000xf32>"),
}


@pytest.mark.parametrize("case", list(HUGE))
def test_huge_dims_convert_lazily(case, tmp_path, capsys):
    op, result = HUGE[case]
    source = tmp_path / "model.mlir"
    source.write_text(f"func.func @main(%a: tensor<f32>) -> {result} {{\n  %0 = {op}\n  return %0 : {result}\n}}\n")
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx"], capsys)
    assert status == 0, err
    model = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(model)
    assert (tmp_path / "m.onnx").stat().st_size < 10_000
    dims = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [int(d) for d in result[len("tensor<"):].split("x")[:-1]]


@pytest.mark.parametrize("argv, expected, code", [
    (["{dir}"], "Is a directory", 1),
    (["{dir}/missing.mlir"], "No such file", 1),
    (["{src}", "--opset", "7"], "7 is outside", 2),
    (["{src}", "--opset", "seven"], "not an integer", 2),
    (["{src}", "--parse-limit", "-1"], "-1 is negative", 2),
    (["{src}", "--parse-limit", "2.5"], "not an integer: '2.5'", 2),
    (["{src}", "--target", "tpu"], "unknown target 'tpu' (choose from core", 2),
    (["{src}", "--frobnicate"], "unrecognized arguments", 2),
    (["-"], "reading stdin needs -o", 1),
    (["{src}", "--inputs", "{dir}/none.npz"], "cannot read --inputs", 1),
    (["{src}", "-o", "{dir}/no/such/dir/m.onnx"], "cannot write", 1),
    ([], "required", 2),
    (["{src}", "--inputs", "{src}"], "not a .npz file", 1),
    # Nothing written may destroy the input, whatever path names it.
    (["{src}", "-o", "{src}"], "is the input file", 1),
    (["{src}", "-o", "{dir}/link.mlir"], "is the input file", 1),
    (["{src}", "-o", "{dir}/m.onnx", "--external-data", "model.mlir"], "is the input file", 1),
    (["{src}", "-o", "{dir}/m.onnx", "--external-data", "m.onnx"], "not be the model's own file name", 1),
    # Names of the folder itself or of a folder in it: the weights' rename would fail on them.
    (["{src}", "-o", "{dir}/m.onnx", "--external-data", ""], "must be a file name beside the model, got ''", 1),
    (["{src}", "-o", "{dir}/m.onnx", "--external-data", ".."], "must be a file name beside the model", 1),
    (["{src}", "-o", "{dir}/m.onnx", "--external-data", "weights"], "'weights' is a folder beside the model", 1),
    (["{src}", "--triton-repo", "{dir}", "--max-batch-size", "0", "--name", "model.mlir"],
     "exists and is not a folder", 1),
    # An empty path was "not given": --inputs "" skipped the check (exit 0), --triton-repo "" wrote model.onnx.
    (["{src}", "--inputs", ""], "argument --inputs: an empty path", 2),
    (["{src}", "--triton-repo", ""], "argument --triton-repo: an empty path", 2),
    (["{src}", "-o", ""], "argument -o/--output: an empty path", 2),
    ([""], "argument input: an empty path", 2),
], ids=["directory", "missing", "opset-range", "opset-type", "parse-limit-negative", "parse-limit-type", "target",
        "unknown-flag", "stdin-no-output",
        "missing-npz", "unwritable-output", "no-input", "inputs-not-npz", "output-is-input", "output-links-to-input",
        "external-data-is-input", "external-data-is-model", "external-data-empty", "external-data-parent",
        "external-data-folder", "triton-model-is-input", "inputs-empty", "triton-repo-empty", "output-empty",
        "input-empty"])
def test_bad_invocation(argv, expected, code, tmp_path, capsys):
    source = tmp_path / "model.mlir"
    text = lowered().as_text()
    source.write_text(text)
    (tmp_path / "link.mlir").symlink_to(source)
    (tmp_path / "weights").mkdir()
    argv = [a.format(dir=tmp_path, src=source) for a in argv]
    status, out, err = run_cli(argv, capsys)
    assert_one_line_error(status, err, expected, code)
    assert source.read_text() == text
    assert not (tmp_path / "m.onnx").exists()


def test_check_with_npy_input(tmp_path, capsys):
    """A .npy file (numpy.save) is the first input."""
    source = tmp_path / "model.mlir"
    source.write_text(jax.jit(jnp.sin).lower(X).as_text())
    np.save(tmp_path / "x.npy", X)
    status, out, err = run_cli([source, "-o", tmp_path / "m.onnx", "--inputs", tmp_path / "x.npy"], capsys)
    assert status == 0, err
    assert out.rstrip().endswith(": ok"), out


def test_subprocess_errors_are_one_line(tmp_path):
    """The real command, as a user runs it: no traceback reaches stderr."""
    source = tmp_path / "model.mlir"
    source.write_bytes(_half("stablehlo-text"))
    command = [PYTHON, "-m", "hlo2onnx", str(source), "-o", str(tmp_path / "m.onnx")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_one_line_error(done.returncode, done.stderr, "cannot parse MLIR")


def test_debug_shows_the_exception(tmp_path):
    source = tmp_path / "model.mlir"
    source.write_bytes(_half("stablehlo-text"))
    with pytest.raises(hlo2onnx.InvalidInputError, match="cannot parse MLIR"):
        main([str(source), "-o", str(tmp_path / "m.onnx"), "--debug"])


def test_opset_23_fuses_attention(tmp_path):
    """The CLI's opset range reaches 23, where scaled dot-product attention becomes ONNX Attention."""
    def attend(q, k, v):
        return jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / np.float32(4.0), axis=-1) @ v
    qkv = [np.random.default_rng(i).standard_normal((2, 4, 8, 16), np.float32) for i in range(3)]
    conversion = hlo2onnx.convert(export.export(jax.jit(attend))(*qkv), tmp_path / "a.onnx", opset=23)
    assert [n.op_type for n in conversion.to_proto().graph.node].count("Attention") == 1


# -- --check on modules that call LAPACK or hold complex values -------------------------------------------
