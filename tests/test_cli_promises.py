"""What the `hlo2onnx` command promises (README): crash containment, exit codes, atomic output, external data.

The crash, Ctrl-C and broken-pipe tests run the real command in a subprocess (what they guard against kills
or interrupts a process); the rest run it in-process. Model outputs are compared with jax.jit.
"""
from __future__ import annotations

import os
import platform
import signal
import stat
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
from jax import export
import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hlo2onnx import files
from hlo2onnx.command import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable  # the leg's own interpreter: each CI leg has its own jax
OLD = b"the user's previous model"


def model(x, w):
    return jnp.tanh(x @ w).sum(axis=0)


X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
W = np.linspace(0.5, -0.5, 6, dtype=np.float32).reshape(3, 2)


def lowered():
    return jax.jit(model).lower(X, W)


def command(*args, stdout=subprocess.PIPE, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "hlo2onnx", *map(str, args)], cwd=ROOT, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def run_in_process(argv, capsys) -> tuple[int, str, str]:
    try:
        status = main([str(a) for a in argv])
    except SystemExit as e:
        status = e.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_one_error_line(code: int, err: str, expected: str) -> None:
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith("hlo2onnx: error: "), err
    assert expected in err, err
    assert "Traceback" not in err and "internal error" not in err


def leftovers(folder) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(files.TEMP_PREFIX)]


# -- crash containment -----------------------------------------------------------------------------------
def _bytecode_with_bad_op_name() -> bytes:
    """MLIR bytecode whose op name `tanh` carries a non-UTF-8 byte: jaxlib's reader aborts on it."""
    import io

    buffer = io.BytesIO()
    lowered().compiler_ir("stablehlo").operation.write_bytecode(buffer)
    data = bytearray(buffer.getvalue())
    i = data.find(b"tanh")
    data[i + 1] = 0xFF
    return bytes(data)


def _hlo(body: str) -> bytes:
    return f"HloModule m\n\nENTRY main {{\n{body}\n}}\n".encode()


NESTING = 20000
CRASHING_INPUTS = {  # each one kills an unguarded process with SIGABRT or SIGSEGV (docs/formats.md)
    "bytecode-op-name": ("m.mlirbc", _bytecode_with_bad_op_name),
    "hlo-parameter-index": ("m.hlo", lambda: _hlo("  p = f32[2]{0} parameter(5)\n  ROOT r = f32[2]{0} add(p, p)")),
    "hlo-tuple-index": ("m.hlo", lambda: _hlo("  p = f32[2]{0} parameter(0)\n  t = (f32[2]{0}, f32[2]{0}) "
                                              "tuple(p, p)\n  ROOT g = f32[2]{0} get-tuple-element(t), index=7")),
    "hlo-token-array": ("m.hlo", lambda: _hlo("  p = f32[2]{0} parameter(0)\n  t = token[2] after-all()\n"
                                              "  ROOT r = f32[2]{0} add(p, p)")),
    "hlo-deep-tuple": ("m.hlo", lambda: _hlo(f"  p = {'(' * NESTING}f32[]{')' * NESTING} parameter(0)\n"
                                             "  ROOT r = f32[] constant(0)")),
    "mlir-deep-array-attribute": ("m.mlir", lambda: (
        f"func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> attributes {{x = {'[' * NESTING}1{']' * NESTING}}} "
        "{\n  return %a : tensor<2xf32>\n}\n").encode()),
}


@pytest.mark.parametrize("case", list(CRASHING_INPUTS))
def test_a_parser_crash_is_one_error_line(case, tmp_path):
    name, make = CRASHING_INPUTS[case]
    source = tmp_path / name
    source.write_bytes(make())
    output = tmp_path / "model.onnx"
    output.write_bytes(OLD)
    done = command(source, "-o", output)
    assert_one_error_line(done.returncode, done.stderr, f"{source}: the parser crashed (signal")
    assert output.read_bytes() == OLD
    assert not leftovers(tmp_path)


# -- Ctrl-C and closed pipes ------------------------------------------------------------------------------
@pytest.mark.parametrize("delay", [0.3, 1.0])
def test_ctrl_c_during_start_up_is_one_line_and_130(delay, tmp_path):
    source = tmp_path / "m.mlir"
    source.write_text(lowered().as_text())
    process = subprocess.Popen([PYTHON, "-m", "hlo2onnx", str(source), "--check"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)  # jax is still importing: start-up takes over a second
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    if process.returncode == 0:
        pytest.skip("the conversion finished before the interrupt")  # a fast machine; nothing to test
    assert process.returncode == 130, err
    assert err.count("\n") <= 1 and "Traceback" not in err, err


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _reading_stdin(pid: int) -> bool:
    """Whether the process is blocked in read(0, ...) (the syscall number and first argument in /proc)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            return f.read().split()[:2] == [_READ[platform.machine()], "0x0"]
    except (FileNotFoundError, PermissionError):
        return False


_READ = {"x86_64": "0", "aarch64": "63"}  # read's syscall number


@pytest.mark.skipif(not os.path.exists("/proc/self/syscall") or platform.machine() not in _READ,
                    reason="reads Linux's /proc")
def test_the_converter_dies_with_the_command(tmp_path):
    """A command killed outright (SIGKILL: a CI timeout) takes its converter process with it. Here it is
    blocked reading stdin, as on an input that hangs jaxlib's bytecode reader: it kept running before (a
    converter that writes anything dies of the broken pipe, but one stuck in a parser writes nothing)."""
    process = subprocess.Popen([PYTHON, "-m", "hlo2onnx", "-", "-o", str(tmp_path / "m.onnx")], cwd=ROOT,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (children := _children(process.pid)) or not _reading_stdin(children[0]):
            assert time.monotonic() < deadline, "the converter never read stdin"
            time.sleep(0.05)
        process.kill()
        process.wait(timeout=60)
        deadline = time.monotonic() + 30
        while _alive(children[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(children[0]), "the converter outlived the command"
    finally:
        process.kill()
        process.wait(timeout=60)
        process.stdin.close()
        for pid in filter(_alive, children):  # an orphan left by a failure
            os.kill(pid, signal.SIGKILL)


def test_stdout_closed_early_ends_quietly(tmp_path):
    """`hlo2onnx m.mlir --report | head -1`: the reader is gone; no 'internal error', no traceback."""
    source = tmp_path / "m.mlir"
    source.write_text(lowered().as_text())
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout now fails with EPIPE
    try:
        done = command(source, "-o", tmp_path / "m.onnx", "--report", stdout=write_end)
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


# -- atomic output ---------------------------------------------------------------------------------------
def test_a_failed_check_leaves_the_output_untouched(tmp_path, capsys):
    source = tmp_path / "m.mlir"
    source.write_text(lowered().as_text())
    output = tmp_path / "m.onnx"
    output.write_bytes(OLD)
    np.savez(tmp_path / "wrong.npz", np.ones((2, 2), np.float32), W)  # x has the wrong shape
    status, _, err = run_in_process([source, "-o", output, "--inputs", tmp_path / "wrong.npz"], capsys)
    assert_one_error_line(status, err, "must be float32[4,3]")
    assert output.read_bytes() == OLD
    assert not leftovers(tmp_path)


def test_a_failed_save_leaves_the_output_untouched(tmp_path, monkeypatch):
    import onnx_ir as ir

    import hlo2onnx

    output = tmp_path / "m.onnx"
    output.write_bytes(OLD)
    conversion = hlo2onnx.convert(lowered().as_text().encode())

    def broken_save(*args, **kwargs):
        with open(args[1], "wb") as f:
            f.write(b"half a mod")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ir, "save", broken_save)
    with pytest.raises(hlo2onnx.Hlo2OnnxError, match="No space left"):
        conversion.save(output)
    assert output.read_bytes() == OLD
    assert not leftovers(tmp_path)


def test_truncated_npz_is_a_clear_error(tmp_path, capsys):
    source = tmp_path / "m.mlir"
    source.write_text(lowered().as_text())
    np.savez(tmp_path / "in.npz", X, W)
    data = (tmp_path / "in.npz").read_bytes()
    (tmp_path / "in.npz").write_bytes(data[:len(data) // 2])
    status, _, err = run_in_process([source, "-o", tmp_path / "m.onnx", "--inputs", tmp_path / "in.npz"], capsys)
    assert_one_error_line(status, err, f"cannot read --inputs {tmp_path / 'in.npz'}")


# -- external data ---------------------------------------------------------------------------------------
def _run_onnx(path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, [X])))[0]


# A closure constant becomes an initializer, what external data is for; onnx_ir keeps tensors under 1 KiB
# inline, so this one is larger.
W_BIG = np.linspace(-1, 1, 3 * 400, dtype=np.float32).reshape(3, 400)


def _weights_model_source(tmp_path):
    # A jax.export artifact holds its closed-over weights; Lowered.as_text() lacks them from jax 0.12.1 on (they
    # are jax.const arguments, refused by name: tests/test_const_args.py).
    source = tmp_path / "m.bin"
    source.write_bytes(export.export(jax.jit(lambda x: model(x, W_BIG)))(X).serialize())
    return source


def test_external_data_option(tmp_path, capsys):
    output = tmp_path / "m.onnx"
    status, _, err = run_in_process([_weights_model_source(tmp_path), "-o", output, "--external-data",
                                     "weights.bin"], capsys)
    assert status == 0, err
    assert (tmp_path / "weights.bin").stat().st_size >= W_BIG.nbytes
    np.testing.assert_allclose(_run_onnx(output), jax.jit(model)(X, W_BIG), rtol=1e-6, atol=1e-6)


def test_models_past_the_protobuf_limit_get_external_data(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(files, "PROTOBUF_LIMIT", 16)  # stands for 2 GB; the real size is in `make stress`
    output = tmp_path / "m.onnx"
    status, _, err = run_in_process([_weights_model_source(tmp_path), "-o", output], capsys)
    assert status == 0, err
    assert "note:" in err and "m.onnx.data" in err
    assert (tmp_path / "m.onnx.data").stat().st_size >= W_BIG.nbytes
    np.testing.assert_allclose(_run_onnx(output), jax.jit(model)(X, W_BIG), rtol=1e-6, atol=1e-6)
    status, _, err = run_in_process([_weights_model_source(tmp_path), "-o", "-"], capsys)
    assert_one_error_line(status, err, "needs external data")


@pytest.mark.stress
def test_a_model_over_2gb_converts(tmp_path):
    w = np.ones(2**29 + 2**20, np.float32)  # 2.004 GiB
    source = tmp_path / "big.bin"  # an export holds the weights (as_text() lacks them from jax 0.12.1 on)
    source.write_bytes(export.export(jax.jit(lambda v: (jnp.asarray(w) * v[0]).sum()))(np.ones(1, np.float32))
                       .serialize())
    done = command(source, "-o", tmp_path / "big.onnx", timeout=1800)
    assert done.returncode == 0, done.stderr
    assert "note:" in done.stderr and (tmp_path / "big.onnx.data").stat().st_size >= w.nbytes
    session = ort.InferenceSession(str(tmp_path / "big.onnx"), providers=["CPUExecutionProvider"])
    assert float(session.run(None, {session.get_inputs()[0].name: np.ones(1, np.float32)})[0]) == \
        pytest.approx(w.size, rel=1e-3)


# -- --check on bfloat16 ---------------------------------------------------------------------------------
def test_check_feeds_bfloat16_inputs(tmp_path, capsys):
    source = tmp_path / "m.mlir"
    bf16 = ml_dtypes.bfloat16
    source.write_text(jax.jit(lambda x, y: (x * y + 1).astype(bf16) * 2)
                      .lower(np.ones(5, bf16), np.ones(5, bf16)).as_text())
    status, out, err = run_in_process([source, "-o", tmp_path / "m.onnx", "--check"], capsys)
    assert status == 0, err
    assert out.startswith("check: ") and out.rstrip().endswith(": ok"), out


# -- one pipeline ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("opset", [13, 27])
def test_every_entry_refuses_unsupported_opsets(opset):
    """The opset check lives in the pipeline: translate_report refused nothing before, and ORT rejected the model."""
    import hlo2onnx

    module = lowered().compiler_ir("stablehlo")
    with pytest.raises(ValueError, match=f"opset {opset} is not supported"):
        hlo2onnx.translate_report(module, opset=opset)
    with pytest.raises(hlo2onnx.Hlo2OnnxError, match=f"opset {opset} is not supported"):
        hlo2onnx.convert(module, opset=opset)


def test_the_entry_point_imports_nothing_heavy():
    """Ctrl-C at start-up is one line only if the command's own process never imports jax or onnx."""
    code = "import sys, hlo2onnx.cli; print(sorted(m for m in ('jax', 'onnx', 'onnx_ir', 'numpy') if m in sys.modules))"
    done = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("module", ["hlo2onnx", "hlo2onnx.cli"])
def test_python_dash_m_converts(module, tmp_path):
    """`python -m hlo2onnx.cli` ran the module without calling main: no model, no message, exit status 0."""
    source, target = tmp_path / "m.mlir", tmp_path / "m.onnx"
    source.write_text(lowered().as_text())
    done = subprocess.run([PYTHON, "-m", module, str(source), "-o", str(target)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    feeds = dict(zip((i.name for i in session.get_inputs()), (X, W)))
    np.testing.assert_allclose(session.run(None, feeds)[0], jax.jit(model)(X, W), rtol=1e-6)


def _full_device(tmp_path):
    """A character device like /dev/full (writes fail with ENOSPC), made in tmp_path so a regression that
    renamed over it could not replace the machine's own."""
    path = tmp_path / "full"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return path


def test_a_full_device_is_an_error_and_stays_a_device(tmp_path):
    source, device = tmp_path / "m.mlir", _full_device(tmp_path)
    source.write_text(lowered().as_text())
    result = command(source, "-o", device)
    assert_one_error_line(result.returncode, result.stderr, f"cannot write {device}: No space left on device")
    assert stat.S_ISCHR(os.stat(device).st_mode)  # written through, never renamed over
    assert leftovers(tmp_path) == []
    with open(device, "wb") as full:  # the model on stdout, or a report, to a full device
        for args in (["-o", "-"], ["--report"]):
            result = command(source, *args, stdout=full)
            assert_one_error_line(result.returncode, result.stderr, "cannot write the output: No space left")


def test_a_fifo_receives_the_model(tmp_path):
    source, fifo = tmp_path / "m.mlir", tmp_path / "model.fifo"
    source.write_text(lowered().as_text())
    os.mkfifo(fifo)
    received = []
    # A daemon: if the FIFO were renamed over, nothing would ever write to the one it waits on.
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = command(source, "-o", fifo)
    reader.join(timeout=60)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and received
    session = ort.InferenceSession(received[0], providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, dict(zip([i.name for i in session.get_inputs()], (X, W))))[0],
                               np.asarray(jax.jit(model)(X, W)), rtol=2e-6, atol=2e-6)


def test_a_symbolic_link_keeps_pointing_at_the_written_model(tmp_path, capsys):
    source, target, link = tmp_path / "m.mlir", tmp_path / "v3.onnx", tmp_path / "current.onnx"
    source.write_text(lowered().as_text())
    target.write_bytes(OLD)
    link.symlink_to(target.name)
    code, _, err = run_in_process([source, "-o", link], capsys)
    assert code == 0, err
    assert link.is_symlink() and onnx.load(str(target)).graph.node


def test_an_endless_stream_is_an_error_not_an_oom(tmp_path):
    """/dev/zero, a pipe that never ends: read up to a bound (half the memory by default), then refused."""
    from hlo2onnx.errors import InvalidInputError
    from hlo2onnx.loading import read_source

    fifo = str(tmp_path / "stream")
    os.mkfifo(fifo)
    text = jax.jit(model).lower(X, W).as_text().encode()

    def write(count: int) -> None:
        try:
            with open(fifo, "wb") as f:
                for _ in range(count):
                    f.write(text)
        except BrokenPipeError:  # the reader stopped at its bound
            pass

    for count, bound in ((1, len(text)), (3, 2 * len(text))):
        writer = threading.Thread(target=write, args=(count,))
        writer.start()
        try:
            if count == 1:
                assert read_source(fifo, stream_bytes=bound) == text
            else:
                with pytest.raises(InvalidInputError, match="without ending"):
                    read_source(fifo, stream_bytes=bound)
        finally:
            writer.join()


def _npz_bytes() -> bytes:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, X, W)
    return buffer.getvalue()


# Streams named by path: the shell's process substitution (<(...), >(...): /dev/fd/63) and a FIFO. The
# converter child did not inherit /dev/fd/N ("No such file or directory"); an output /dev/fd/N was resolved to
# its real path, "pipe:[1234]" ("cannot write"); --inputs opened its file twice (a FIFO waited for a second
# writer forever, a pipe was empty the second time).
STREAMED = {"model-from-fd": ("input", "fd"), "model-to-fd": ("output", "fd"),
            "inputs-from-fd": ("inputs", "fd"), "inputs-from-fifo": ("inputs", "fifo")}


@pytest.mark.parametrize("case", list(STREAMED))
def test_streams_named_by_path(case, tmp_path):
    role, kind = STREAMED[case]
    source, output = tmp_path / "m.mlir", tmp_path / "m.onnx"
    source.write_text(lowered().as_text())
    payload = {"input": source.read_bytes(), "inputs": _npz_bytes(), "output": None}[role]
    received, fds = [], []
    if kind == "fifo":
        path = str(tmp_path / "stream")
        os.mkfifo(path)
        def pump():
            with open(path, "wb") as f:
                f.write(payload)
        pump = threading.Thread(target=pump, daemon=True)
    else:
        read_end, write_end = os.pipe()
        fds = [write_end if role == "output" else read_end]
        path = f"/dev/fd/{fds[0]}"
        ours = read_end if role == "output" else write_end

        def pump():
            with open(ours, "rb" if role == "output" else "wb") as f:
                if role == "output":
                    received.append(f.read())
                else:
                    f.write(payload)
        pump = threading.Thread(target=pump, daemon=True)
    pump.start()
    argv = {"input": [path, "-o", output], "output": [source, "-o", path],
            "inputs": [source, "-o", output, "--inputs", path]}[role]
    try:
        result = subprocess.run([PYTHON, "-m", "hlo2onnx", *map(str, argv)], cwd=ROOT, capture_output=True,
                                text=True, timeout=90, pass_fds=fds)
    finally:
        for fd in fds:
            os.close(fd)
    pump.join(timeout=30)
    assert result.returncode == 0, result.stderr
    model_bytes = received[0] if role == "output" else output.read_bytes()
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, dict(zip([i.name for i in session.get_inputs()], (X, W))))[0],
                               np.asarray(jax.jit(model)(X, W)), rtol=2e-6, atol=2e-6)
    if role == "inputs":
        assert result.stdout.rstrip().endswith(": ok"), result.stdout
