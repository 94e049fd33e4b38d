"""The work of the `hlo2onnx` command, run in-process: parse arguments, convert, check, write.

`hlo2onnx.cli.main` (the installed command) runs this module in a child
process, so that jaxlib's parsers aborting on malformed input cannot take the
command down with them; `main` here is the same command without that guard.

Every failure is one line on stderr and a non-zero exit status (a Python
traceback only with --debug). Exit status: 0 done, 1 error, 2 bad usage,
3 --check found a mismatch, 130 interrupted.
"""
from __future__ import annotations

import argparse
import errno
import math
import os
import signal
import stat
import sys
import time
from typing import Callable, Sequence, TextIO

from hlo2onnx.errors import Hlo2OnnxError  # light: the package loads jax only on demand

EXIT_ERROR, EXIT_USAGE, EXIT_MISMATCH = 1, 2, 3
# Below this many ops the progress display is not worth a line (unless --progress).
PROGRESS_MIN_OPS = 1000
# How long hlo2onnx.cli's child may take to read and parse its input before translation starts: jaxlib's MLIR
# bytecode reader loops forever on some malformed inputs (docs/formats.md). Parsing took at most 0.3 s per MB
# (a 24k-op jax.export artifact; MLIR text 0.04 s per MB): the limit leaves 30x that, and 30 s for any input.
PARSE_SECONDS, PARSE_SECONDS_PER_MB = 30, 10


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _opset(text: str) -> int:
    from hlo2onnx.defaults import MAX_OPSET, MIN_OPSET

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not MIN_OPSET <= value <= MAX_OPSET:
        raise argparse.ArgumentTypeError(f"{value} is outside {MIN_OPSET}..{MAX_OPSET}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _path(text: str) -> str:
    # An empty path read as "not given": --inputs "" skipped the check, --triton-repo "" wrote model.onnx instead.
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    return text


def _target(text: str) -> str:
    from hlo2onnx.targets import TARGETS  # at parse time, not for --help

    if text not in TARGETS and ":" not in text:  # package.module:NAME is imported when the model is converted
        raise argparse.ArgumentTypeError(f"unknown target {text!r} (choose from {', '.join(sorted(TARGETS))}, "
                                         "or name one declared in your own code as package.module:NAME)")
    return text


class _ListTargets(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from hlo2onnx.targets import TARGETS

        print(TARGETS)
        parser.exit()


# The options answered without the converter: the parser imports nothing heavy (hlo2onnx.defaults), so
# hlo2onnx.cli answers them in its own process, in the time Python takes to start.
QUICK_OPTIONS = frozenset({"-h", "--help", "--version", "--list-targets"})


def build_parser() -> argparse.ArgumentParser:
    from hlo2onnx.defaults import DEFAULT_MAX_BATCH_SIZE, DEFAULT_OPSET, DEFAULT_TARGET, __version__

    parser = _Parser(prog="hlo2onnx", description="Convert StableHLO (text or bytecode), a jax.export "
                     "artifact or XLA HLO text to an ONNX model. The format is recognized from the content.",
                     epilog="exit status: 0 done, 1 error, 2 bad usage, 3 --check found a mismatch, 130 interrupted. "
                     "The output file is replaced only when everything (--check included) succeeded.")
    parser.add_argument("input", type=_path, help="the model file; - reads stdin")
    parser.add_argument("-o", "--output", type=_path, help="the ONNX file to write (default: the input's name with .onnx; "
                        "- writes stdout)")
    parser.add_argument("--external-data", metavar="NAME", help="write the weights to the file NAME beside the "
                        "model (ONNX external data); done anyway, as <output>.data, when the model passes "
                        "protobuf's 2 GB limit")
    parser.add_argument("--opset", type=_opset, help=f"ONNX opset (default: the target's own, else {DEFAULT_OPSET})")
    parser.add_argument("--target", type=_target, default=DEFAULT_TARGET, metavar="NAME",
                        help=f"the backend whose ops and dtypes the model may use (default {DEFAULT_TARGET}; "
                        "--list-targets lists them; or a target of your own as package.module:NAME, docs/extending.md)")
    parser.add_argument("--list-targets", action=_ListTargets, help="list the targets and exit")
    parser.add_argument("--version", action="version", version=f"hlo2onnx {__version__}")
    parser.add_argument("--name", help="the ONNX graph's name (default: the module's)")
    parser.add_argument("--dynamic", action="store_true",
                        help="keep symbolic dims (jax.export shape polymorphism) as ONNX dim_params")
    parser.add_argument("--triton-repo", metavar="DIR", type=_path, help="write a Triton model repository: DIR/<name>/config.pbtxt "
                        "and DIR/<name>/1/model.onnx, <name> being --name or the module's (KServe's ONNX runtime "
                        "serves it too; docs/deploy.md). The .onnx file is then written only with -o")
    parser.add_argument("--max-batch-size", metavar="N", type=_non_negative, help="for --triton-repo: the largest "
                        f"batch Triton forms along axis 0, which must be symbolic (--dynamic; default "
                        f"{DEFAULT_MAX_BATCH_SIZE}); 0: no batching, full shapes")
    parser.add_argument("--input-names", metavar="A,B", help="name the ONNX inputs, in order (default: dict keys "
                        "where the function takes dicts, else jax's argument names)")
    parser.add_argument("--output-names", metavar="Y,Z", help="name the ONNX outputs, in order (default: dict keys "
                        "where the function returns a dict, else out0, out1 ...)")
    parser.add_argument("--inputs-as-nchw", metavar="A,B", help="take these NHWC inputs (by their final names) as "
                        "NCHW: a Transpose at the boundary, folded into the convolutions where it can be")
    parser.add_argument("--outputs-as-nchw", metavar="Y,Z", help="give these NHWC outputs as NCHW")
    parser.add_argument("--check", action="store_true", help="run the model in ONNX Runtime and the module in "
                        "JAX on the same inputs and print the largest difference")
    parser.add_argument("--inputs", metavar="NPZ", type=_path, help="inputs for --check (implies it): arrays named like the "
                        "ONNX inputs, or arr_0, arr_1 ... in order (a .npy file: the first input; - reads stdin); "
                        "default: random, from the signature")
    parser.add_argument("--report", action="store_true", help="print the op mapping: StableHLO ops by kind, "
                        "ONNX nodes by type, what each kind became, the fusions that fired, node counts before "
                        "and after, and the nodes the target runs on a fallback")
    parser.add_argument("--verbose", "-v", action="store_true", help="print the input format and time per stage")
    parser.add_argument("--parse-limit", type=_non_negative, metavar="SECONDS",
                        help=f"give up reading and parsing the input file after this long (default {PARSE_SECONDS} s "
                             f"plus {PARSE_SECONDS_PER_MB} s per MB; 0: no limit): jaxlib's MLIR reader loops "
                             "forever on some malformed inputs")
    parser.add_argument("--progress", action="store_true", help="show translation progress on stderr even when "
                        f"it is not a terminal or the module is small (default: on a terminal, {PROGRESS_MIN_OPS}+ "
                        "ops)")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return parser


def main(argv: Sequence[str] | None = None, announce: Callable[[str, str], None] | None = None,
         limit_parse: bool = False) -> int:
    """Runs the command in this process; returns the exit status.

    `announce(key, value)` is told the input and output paths once known
    (the supervising parent names them if this process crashes). `limit_parse`:
    this process is hlo2onnx.cli's child, which a SIGALRM may end (_ParseDeadline).
    """
    args = build_parser().parse_args(argv)
    try:
        if announce is not None:
            announce("input", args.input)
            announce("output", args.output or "")
            if args.triton_repo:
                announce("repo", args.triton_repo)
        code = _run(args, announce or (lambda key, value: None), limit_parse)
        sys.stdout.flush()  # a closed stdout shows here, where it is handled, not at interpreter exit
        return code
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except BrokenPipeError:
        return _stdout_closed()
    except Exception as e:
        if args.debug:
            raise
        if isinstance(e, Hlo2OnnxError):
            _fail(str(e))
        elif isinstance(e, OSError) and e.errno in _WRITE_ERRORS:  # stdout on a full disk or /dev/full
            _fail(f"cannot write the output: {e.strerror}")
        else:
            _fail(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)")
        return EXIT_ERROR


_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def _stdout_closed() -> int:
    """The reader of stdout went away (`hlo2onnx ... --report | head -1`): what it wanted it has; end
    quietly. Later writes (the interpreter's final flush) go to /dev/null instead of raising again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


# Longer messages are cut: an error quoting a pathological input (a type nested 20000 deep) stays readable.
MAX_MESSAGE = 2000


def _fail(message: str) -> None:
    message = " ".join(message.split())
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + f" ... ({len(message) - MAX_MESSAGE} more characters)"
    sys.stderr.write(f"hlo2onnx: error: {message}\n")


def _run(args: argparse.Namespace, announce: Callable[[str, str], None], limit_parse: bool) -> int:
    from hlo2onnx.conversion import convert

    repo = args.triton_repo
    if args.max_batch_size is not None and not repo:
        raise Hlo2OnnxError("--max-batch-size is for --triton-repo")
    if repo and args.external_data and not args.output:
        raise Hlo2OnnxError("--external-data names the weights file of -o FILE; the Triton repository lays out "
                            "its files itself")
    output = _output_path(args.input, args.output) if args.output or not repo else None
    if output == "-" and args.external_data:
        raise Hlo2OnnxError("--external-data needs an output file (-o FILE), not stdout")
    if output not in (None, "-"):
        _refuse_overwriting_input(args.input, output, "-o/--output")
        if args.external_data:
            folder = os.path.dirname(os.path.realpath(output))
            _refuse_overwriting_input(args.input, os.path.join(folder, args.external_data), "--external-data")
    if args.input == "-" and args.inputs == "-":
        raise Hlo2OnnxError("stdin can give the model or --inputs, not both")
    inputs = _read_inputs(args.inputs) if args.inputs else None
    progress = ProgressLine(sys.stderr, forced=args.progress) if args.progress or sys.stderr.isatty() else None
    deadline = _ParseDeadline(args.input, args.parse_limit, progress, announce) if limit_parse else None
    if ":" in args.target and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # --target package.module:NAME finds a module of the working folder, as python -m
    try:
        conversion = convert(args.input, None, target=args.target, opset=args.opset, name=args.name,
                             dynamic=args.dynamic, progress=deadline or progress, input_names=args.input_names,
                             output_names=args.output_names, inputs_as_nchw=args.inputs_as_nchw or (),
                             outputs_as_nchw=args.outputs_as_nchw or ())
    finally:
        if deadline is not None:
            deadline.cancel()
    # Everything that can fail runs before the output is written: a failed run leaves the old file as it was.
    result = None
    if args.check or inputs is not None:
        announce("stage", "check")
        start = time.perf_counter()
        result = conversion.check(inputs)
        conversion.timings["check"] = time.perf_counter() - start
    announce("stage", "write")
    start = time.perf_counter()
    written = []
    if repo:  # first: it refuses models Triton cannot batch before any file is written
        from hlo2onnx.serving import DEFAULT_MAX_BATCH_SIZE, write_triton_repo

        batch = DEFAULT_MAX_BATCH_SIZE if args.max_batch_size is None else args.max_batch_size
        written.append(write_triton_repo(conversion, repo, max_batch_size=batch))
    if output == "-":
        _write_stdout(conversion)
        written.append("stdout")
    elif output is not None:
        _save(conversion, output, args.external_data)
        written.append(output)
    conversion.timings["save"] = time.perf_counter() - start
    # Results go to stdout, unless the model itself does.
    results = sys.stderr if output == "-" else sys.stdout
    if args.verbose:
        _print_verbose(conversion, ", ".join(written))
    if args.report:
        print(conversion.report(), file=results)
    if result is None:
        return 0
    print(result.summary(), file=results)
    return 0 if result.ok else EXIT_MISMATCH


def _read_inputs(path: str) -> dict:
    import io

    import numpy as np

    from hlo2onnx.loading import read_source

    # Read once, as the model is: a FIFO or pipe (<(...), /dev/stdin) opened a second time waited forever for a
    # writer, or was empty.
    data = read_source(path, name=f"--inputs {path}")
    try:
        if data.startswith(b"\x93NUMPY"):  # one array (numpy.save): the first input
            return {"arr_0": np.load(io.BytesIO(data))}
        if not data.startswith(b"PK"):  # else numpy would take it for a pickle and suggest loading it unsafely
            raise ValueError("not a .npz file (numpy.savez writes one)")
        with np.load(io.BytesIO(data)) as npz:
            return {name: npz[name] for name in npz.files}
    except Exception as e:  # not an npz, truncated (BadZipFile, EOFError, zlib), pickled objects
        detail = (e.strerror if isinstance(e, OSError) else None) or str(e) or type(e).__name__
        raise Hlo2OnnxError(f"cannot read --inputs {path}: {' '.join(detail.split())}") from None


def _save(conversion, output: str, external_data: str | None) -> None:
    from hlo2onnx.files import PROTOBUF_LIMIT, weight_bytes

    size = weight_bytes(conversion.model)
    written = conversion.save(output, external_data)
    if written and not external_data:
        sys.stderr.write(f"hlo2onnx: note: the weights ({size / 2**30:.2f} GiB) pass protobuf's "
                         f"{PROTOBUF_LIMIT / 2**30:.0f} GiB limit: wrote them to {written} beside {output}\n")


def _write_stdout(conversion) -> None:
    from hlo2onnx.files import PROTOBUF_LIMIT, weight_bytes

    if weight_bytes(conversion.model) >= PROTOBUF_LIMIT:
        raise Hlo2OnnxError("the model passes protobuf's 2 GB limit and needs external data: give -o FILE")
    data = conversion.to_proto().SerializeToString()
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_closed()
        raise Hlo2OnnxError("stdout was closed before the model was written") from None


def _output_path(source: str, output: str | None) -> str:
    if output is not None:
        return output
    if source == "-":
        raise Hlo2OnnxError("reading stdin needs -o/--output")
    root, ext = os.path.splitext(source)
    if ext == ".onnx":
        raise Hlo2OnnxError(f"{source} would be overwritten; give -o/--output")
    return root + ".onnx"


def _refuse_overwriting_input(source: str, target: str, option: str) -> None:
    """Writing `target` must not destroy the input it is converted from (the same file, by any path or link)."""
    if source == "-":
        return
    try:
        source_stat, target_stat = os.stat(source), os.stat(target)
    except OSError:  # no such target yet (or no input: reading it reports that)
        return
    if stat.S_ISREG(source_stat.st_mode) and os.path.samestat(source_stat, target_stat):
        raise Hlo2OnnxError(f"{option} {target} is the input file: writing it would destroy the input")


def _print_verbose(conversion, written: str) -> None:
    from hlo2onnx.loading import FORMATS

    nodes = sum(1 for _ in conversion.model.graph.all_nodes())
    print(f"hlo2onnx: {FORMATS.get(conversion.format, conversion.format)}: {sum(conversion.op_counts.values())} "
          f"StableHLO ops -> {nodes} ONNX nodes, wrote {written}", file=sys.stderr)
    for stage, seconds in conversion.timings.items():
        print(f"  {stage:<10} {_ms(seconds)}", file=sys.stderr)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f} ms"


class ProgressLine:
    """`translating: 1200/8500 ops (14%)`, rewritten in place on stderr."""

    def __init__(self, stream: TextIO, forced: bool):
        self._stream = stream
        self._forced = forced
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        if not self._forced and total < PROGRESS_MIN_OPS:
            return
        percent = 100 * done // max(total, 1)
        self._stream.write(f"\rtranslating: {done}/{total} ops ({percent}%)")
        self._shown = True
        if done >= total:
            self._stream.write("\n")
        self._stream.flush()


class _ParseDeadline:
    """Ends the process by SIGALRM if the input is not parsed within PARSE_SECONDS plus PARSE_SECONDS_PER_MB
    of it: the signal's default action ends it whatever C++ code holds the interpreter, which a Python
    handler could not. The alarm is off once translation starts (the translator's first progress call, which
    this forwards to the display), and the supervising parent names the limit in its error. Only for
    hlo2onnx.cli's child: the input is a file (stdin is not limited)."""

    def __init__(self, path: str, seconds: int | None, progress: Callable[[int, int], None] | None,
                 announce: Callable[[str, str], None]):
        self._progress = progress
        self._armed = path != "-" and os.path.isfile(path) and seconds != 0
        if self._armed:
            if seconds is None:
                seconds = PARSE_SECONDS + PARSE_SECONDS_PER_MB * math.ceil(os.path.getsize(path) / 2**20)
            announce("parse_limit", str(seconds))
            signal.alarm(seconds)

    def __call__(self, done: int, total: int) -> None:
        self.cancel()
        if self._progress is not None:
            self._progress(done, total)

    def cancel(self) -> None:
        if self._armed:
            signal.alarm(0)
            self._armed = False


# -- the child side of hlo2onnx.cli --------------------------------------------------------------------
CHILD_ENV = "HLO2ONNX_CHILD_FDS"  # "<status fd>,<stderr fd>", set by hlo2onnx.cli for its child


def child_main() -> int:
    """The command as hlo2onnx.cli's child runs it.

    fd 2 is a pipe the parent reads: what jaxlib's C++ code prints there when
    it aborts never reaches the user. Python's own messages (errors, progress,
    --debug tracebacks) go to the user's stderr, passed in as another fd.
    """
    status_fd, stderr_fd = (int(fd) for fd in os.environ.pop(CHILD_ENV).split(","))
    sys.stderr = open(stderr_fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=True)
    status = open(status_fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=True)

    def announce(key: str, value: str) -> None:
        status.write(f"{key} {' '.join(value.split())}\n")

    code = EXIT_ERROR
    try:
        code = main(sys.argv[1:], announce, limit_parse=True)
        return code
    except SystemExit as e:  # argparse's --help and usage errors, their message printed
        code = e.code if isinstance(e.code, int) else EXIT_USAGE if e.code else 0
        raise
    finally:  # the outcome, good or bad, is on the user's stderr already
        status.write(f"reported {code}\n")
