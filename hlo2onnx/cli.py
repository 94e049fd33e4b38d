"""The `hlo2onnx` command: convert a saved JAX model to ONNX without its Python source.

    hlo2onnx model.mlir -o model.onnx --check --report

Every failure is one line on stderr and a non-zero exit status (a Python
traceback only with --debug). Exit status: 0 done, 1 error, 2 bad usage,
3 --check found a mismatch.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence, TextIO

EXIT_ERROR, EXIT_USAGE, EXIT_MISMATCH = 1, 2, 3
# Below this many ops the progress display is not worth a line (unless --progress).
PROGRESS_MIN_OPS = 1000


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _opset(text: str) -> int:
    from hlo2onnx.conversion import MAX_OPSET, MIN_OPSET

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not MIN_OPSET <= value <= MAX_OPSET:
        raise argparse.ArgumentTypeError(f"{value} is outside {MIN_OPSET}..{MAX_OPSET}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from hlo2onnx.conversion import DEFAULT_OPSET
    from hlo2onnx.targets import TARGETS

    parser = _Parser(prog="hlo2onnx", description="Convert StableHLO (text or bytecode), a jax.export "
                     "artifact or XLA HLO text to an ONNX model. The format is recognized from the content.",
                     epilog="exit status: 0 done, 1 error, 2 bad usage, 3 --check found a mismatch")
    parser.add_argument("input", help="the model file; - reads stdin")
    parser.add_argument("-o", "--output", help="the ONNX file to write (default: the input's name with .onnx; "
                        "- writes stdout)")
    parser.add_argument("--opset", type=_opset, default=DEFAULT_OPSET, help=f"ONNX opset (default {DEFAULT_OPSET})")
    parser.add_argument("--target", choices=sorted(TARGETS), default="ort-cpu",
                        help="the backend whose ops and dtypes the model may use (default ort-cpu): "
                        + "; ".join(f"{t.name}: {t.description}" for t in TARGETS.values()))
    parser.add_argument("--name", help="the ONNX graph's name (default: the module's)")
    parser.add_argument("--dynamic", action="store_true",
                        help="keep symbolic dims (jax.export shape polymorphism) as ONNX dim_params")
    parser.add_argument("--check", action="store_true", help="run the model in ONNX Runtime and the module in "
                        "JAX on the same inputs and print the largest difference")
    parser.add_argument("--inputs", metavar="NPZ", help="inputs for --check (implies it): arrays named like the "
                        "ONNX inputs, or arr_0, arr_1 ... in order; default: random, from the signature")
    parser.add_argument("--report", action="store_true", help="print the op mapping: StableHLO ops by kind, "
                        "ONNX nodes by type, what each kind became, the fusions that fired, node counts before "
                        "and after, and the nodes the target runs on a fallback")
    parser.add_argument("--verbose", "-v", action="store_true", help="print the input format and time per stage")
    parser.add_argument("--progress", action="store_true", help="show translation progress on stderr even when "
                        f"it is not a terminal or the module is small (default: on a terminal, {PROGRESS_MIN_OPS}+ "
                        "ops)")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except Exception as e:
        if args.debug:
            raise
        from hlo2onnx.errors import Hlo2OnnxError

        if isinstance(e, Hlo2OnnxError):
            _fail(str(e))
        else:
            _fail(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)")
        return EXIT_ERROR


def _fail(message: str) -> None:
    sys.stderr.write(f"hlo2onnx: error: {' '.join(message.split())}\n")


def _run(args: argparse.Namespace) -> int:
    import numpy as np

    from hlo2onnx.conversion import convert
    from hlo2onnx.errors import Hlo2OnnxError

    output = _output_path(args.input, args.output)
    inputs = None
    if args.inputs:
        try:
            with np.load(args.inputs) as npz:
                inputs = {name: npz[name] for name in npz.files}
        except (OSError, ValueError) as e:  # missing file, not an npz, pickled objects
            raise Hlo2OnnxError(f"cannot read --inputs {args.inputs}: {e}") from None
    progress = _ProgressLine(sys.stderr, forced=args.progress) if args.progress or sys.stderr.isatty() else None
    conversion = convert(args.input, None if output == "-" else output, target=args.target, opset=args.opset,
                         name=args.name, dynamic=args.dynamic, progress=progress)
    if output == "-":
        sys.stdout.buffer.write(conversion.to_proto().SerializeToString())
        sys.stdout.flush()
    # Results go to stdout, unless the model itself does.
    results = sys.stderr if output == "-" else sys.stdout
    if args.verbose:
        _print_verbose(conversion, output)
    if args.report:
        print(conversion.report(), file=results)
    status = 0
    if args.check or inputs is not None:
        start = time.perf_counter()
        result = conversion.check(inputs)
        conversion.timings["check"] = time.perf_counter() - start
        print(result.summary(), file=results)
        if args.verbose:
            print(f"  check      {_ms(conversion.timings['check'])}", file=sys.stderr)
        status = 0 if result.ok else EXIT_MISMATCH
    return status


def _output_path(source: str, output: str | None) -> str:
    from hlo2onnx.errors import Hlo2OnnxError

    if output is not None:
        return output
    if source == "-":
        raise Hlo2OnnxError("reading stdin needs -o/--output")
    root, ext = os.path.splitext(source)
    if ext == ".onnx":
        raise Hlo2OnnxError(f"{source} would be overwritten; give -o/--output")
    return root + ".onnx"


def _print_verbose(conversion, output: str) -> None:
    from hlo2onnx.conversion import FORMATS

    nodes = sum(1 for _ in conversion.model.graph.all_nodes())
    print(f"hlo2onnx: {FORMATS.get(conversion.format, conversion.format)}: {sum(conversion.op_counts.values())} "
          f"StableHLO ops -> {nodes} ONNX nodes, wrote {'stdout' if output == '-' else output}", file=sys.stderr)
    for stage, seconds in conversion.timings.items():
        print(f"  {stage:<10} {_ms(seconds)}", file=sys.stderr)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f} ms"


class _ProgressLine:
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
