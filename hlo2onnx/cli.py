"""The `hlo2onnx` command: convert a saved JAX model to ONNX without its Python source.

    hlo2onnx model.mlir -o model.onnx --check --report

This process only supervises: the work (hlo2onnx.command) runs in a child
process, because jaxlib's MLIR and XLA parsers abort or segfault on some
malformed inputs (docs/formats.md) and nothing in Python can catch that. A
child killed by a signal becomes one `hlo2onnx: error:` line naming the input,
and its temporary files are removed. This module imports nothing heavy, so a
Ctrl-C at any point of start-up ends with exit status 130 and one line.

Exit status: 0 done, 1 error, 2 bad usage, 3 --check found a mismatch,
130 interrupted.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Sequence

from hlo2onnx.command import (CHILD_ENV, EXIT_ERROR, EXIT_USAGE, PROGRESS_MIN_OPS,  # noqa: F401  (light: argparse)
                              QUICK_OPTIONS, build_parser)
from hlo2onnx.files import TEMP_PREFIX

__all__ = ["main", "EXIT_ERROR", "PROGRESS_MIN_OPS"]


def main(argv: Sequence[str] | None = None) -> int:
    """The installed `hlo2onnx` entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if QUICK_OPTIONS.intersection(argv[:argv.index("--")] if "--" in argv else argv):
        # --help, --version, --list-targets: no child, and no jax (a child's start-up imports it).
        try:
            build_parser().parse_args(argv)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else EXIT_USAGE if e.code else 0
    try:
        return _supervise(argv)
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except OSError as e:  # no pipes or processes left, or the interpreter is gone
        _fail(f"cannot start the converter process: {e}")
        return EXIT_ERROR


def _supervise(argv: list[str]) -> int:
    status_read, status_write = os.pipe()
    user_stderr = _dup_stderr()
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env[CHILD_ENV] = f"{status_write},{user_stderr}"
    # The child imports this same hlo2onnx, wherever the parent found it (first on its path, before the cwd).
    bootstrap = (f"import sys; sys.path.insert(0, {package_root!r}); "
                 "from hlo2onnx.command import child_main; sys.exit(child_main())")
    try:
        child = subprocess.Popen([sys.executable, "-c", bootstrap, *argv], stderr=subprocess.PIPE,
                                 pass_fds=(status_write, user_stderr, *_named_fds(argv)), env=env,
                                 preexec_fn=_child_setup())
    finally:
        os.close(status_write)
        os.close(user_stderr)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        try:
            _, noise = child.communicate()
        except BaseException:  # Ctrl-C or SIGTERM: the child ignores SIGINT, so this process ends it
            child.kill()
            child.wait()
            _remove_temporaries(_read_status(status_read), child.pid)
            raise
        status = _read_status(status_read)
    finally:
        signal.signal(signal.SIGTERM, previous)
        os.close(status_read)
    code = child.returncode
    if code < 0 and status.get("reported", "").isdigit():
        # The outcome was reported (and the output written) before the crash: jaxlib at interpreter exit.
        return int(status["reported"])
    if code < 0:  # killed by a signal: jaxlib aborted (SIGABRT) or overflowed its stack (SIGSEGV)
        _remove_temporaries(status, child.pid)
        stage = status.get("stage")
        if stage is None and -code == signal.SIGALRM and "parse_limit" in status:
            _fail(f"{_input_name(status)}: the parser did not finish within {status['parse_limit']} s (jaxlib's "
                  "MLIR reader loops forever on some malformed inputs)")
        elif stage is None:
            _fail(f"{_input_name(status)}: the parser crashed ({_signal_name(-code)}); the input is malformed "
                  "or nested deeper than jaxlib's parsers handle")
        else:  # converted; ONNX Runtime or JAX died running it, or the write did
            _fail(f"{_input_name(status)}: the converter crashed during {stage} ({_signal_name(-code)})")
        return EXIT_ERROR
    if "reported" not in status:  # died in Python start-up or exited without a word
        last = next((line for line in reversed(noise.decode(errors="replace").splitlines()) if line.strip()), "")
        _fail(f"{_input_name(status)}: the converter exited with status {code}" + (f": {last}" if last else ""))
        return code or EXIT_ERROR
    if code == 0 and noise:
        sys.stderr.buffer.write(noise)  # warnings of a good run, as the converter printed them
        sys.stderr.flush()
    return code


def _named_fds(argv: list[str]) -> list[int]:
    """The open descriptors the arguments name as files: a shell's process substitution (`hlo2onnx <(gunzip -c
    m.mlir.gz) -o m.onnx`) passes /dev/fd/63, which the child must inherit to open (it got "No such file")."""
    named = {int(n) for arg in argv for n in re.findall(r"/(?:dev|proc/self)/fd/(\d+)", arg)}
    fds = []
    for fd in sorted(named - {0, 1, 2}):
        try:
            os.fstat(fd)
        except OSError:  # not open here: the child's own error names the path
            continue
        fds.append(fd)
    return fds


def _dup_stderr() -> int:
    """A copy of the user's stderr for the child; /dev/null when stderr is closed (`2>&-`)."""
    try:
        return os.dup(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return os.open(os.devnull, os.O_WRONLY)


def _terminated(signum, frame) -> None:
    raise KeyboardInterrupt  # ends the child and removes its files, as Ctrl-C does


def _child_setup():
    """What the child runs before exec: Ctrl-C goes to this process only (which ends the child), and on Linux
    the child is killed when this process dies. A supervisor killed outright (SIGKILL, a CI job's timeout, a
    closed terminal's SIGHUP) left its child converting, on an input that hangs jaxlib's bytecode reader
    forever (docs/formats.md)."""
    parent = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # light: a stdlib C module, loaded here only

            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None

    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the parent died before the request: nobody would signal
                os._exit(EXIT_ERROR)
    return setup


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _read_status(fd: int) -> dict[str, str]:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    status = {}
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        status[key] = value
    return status


def _input_name(status: dict[str, str]) -> str:
    name = status.get("input")
    return "stdin" if name == "-" else name or "the input"


def _signal_name(number: int) -> str:
    try:
        return f"signal {number}, {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"


def _remove_temporaries(status: dict[str, str], pid: int) -> None:
    """The child's half-written files: temporaries carry its process id (hlo2onnx.files), and so do the
    half-built model folders of --triton-repo (hlo2onnx.serving)."""
    source, output, repo = status.get("input", ""), status.get("output", ""), status.get("repo", "")
    if repo:
        _remove_prefixed(repo, pid)
    if not output:
        if repo or not source or source == "-":
            return
        output = os.path.splitext(source)[0] + ".onnx"
    if output == "-":
        return
    _remove_prefixed(os.path.dirname(os.path.abspath(output)), pid)


def _remove_prefixed(folder: str, pid: int) -> None:
    prefix = f"{TEMP_PREFIX}{pid}-"
    try:
        names = [name for name in os.listdir(folder) if name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            continue
        try:
            os.unlink(path)
        except OSError:
            pass


def _fail(message: str) -> None:
    try:
        sys.stderr.write(f"hlo2onnx: error: {' '.join(message.split())}\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # stderr closed: the exit status still tells
        pass


if __name__ == "__main__":  # `python -m hlo2onnx.cli` as well as `python -m hlo2onnx`: not a silent no-op
    sys.exit(main())
