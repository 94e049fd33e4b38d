"""Every Case of the test tables, and what each one's StableHLO holds: the rule coverage test and the
support matrix (python tests/case_tables.py > docs/support-matrix.md) read the tables through here.
"""
from __future__ import annotations

import contextlib
import importlib
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Iterator

import jax
import numpy as np

import hlo2onnx
from harness import Case
from hlo2onnx.targets import TargetError

TESTS = Path(__file__).resolve().parent
_OP = re.compile(r"(?<![#!\w])((?:stablehlo|func|sdy|chlo)\.[a-z_0-9]+)\b")  # not attributes (#) or types (!)
_CUSTOM_CALL = re.compile(r"stablehlo\.custom_call @([\w.]+)")
_TENSOR = re.compile(r"tensor<(?:[0-9?]+x)*([a-z]+[0-9]*|complex<[a-z]+[0-9]+>)>")


def _found_in(value, depth: int = 0) -> Iterator[Case | str]:
    """Cases and StableHLO texts inside a table value: lists, tuples, pytest.param wrappers."""
    if isinstance(value, Case) or isinstance(value, str) and "stablehlo." in value:
        yield value
    elif depth < 3 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _found_in(item, depth + 1)
    elif depth < 3 and type(value).__name__ == "ParameterSet":
        yield from _found_in(tuple(value.values), depth + 1)


def cases() -> Iterator[Case | str]:
    """The Cases (and literal StableHLO modules) of every tests/test_*.py module: module-level tables and
    the argument lists of @pytest.mark.parametrize."""
    seen: set[int] = set()
    for path in sorted(TESTS.glob("test_*.py")):
        module = importlib.import_module(path.stem)
        tables = list(vars(module).values())
        for value in vars(module).values():
            for mark in getattr(value, "pytestmark", []) if callable(value) else []:
                if mark.name == "parametrize" and len(mark.args) > 1:
                    tables.append(mark.args[1])
        for item in (found for table in tables for found in _found_in(table)):
            if id(item) not in seen:
                seen.add(id(item))
                yield item


def lowered_text(case: Case | str) -> str | None:
    """The case's StableHLO, or None where jax cannot lower it as written (a deliberately bad input)."""
    if isinstance(case, str):
        return case
    scope = jax.enable_x64(True) if case.x64 else contextlib.nullcontext()
    with scope:
        args = [np.asarray(a) if isinstance(a, (list, tuple)) else a for a in case.args]
        try:
            return jax.jit(case.fun, static_argnums=case.static_argnums).lower(*args, **case.kwargs).as_text()
        except Exception:  # noqa: BLE001  a case that fails to lower covers nothing
            return None


def ops_in(text: str) -> set[str]:
    """StableHLO op names, custom calls as `custom_call @target`, and `complex <op>` for an op with a complex
    operand or result (read from the parsed module: a region op's types are not on its first line)."""
    ops = set(_OP.findall(text)) - {"func.func", "func.return", "stablehlo.return"}
    ops.update(f"custom_call @{target}" for target in _CUSTOM_CALL.findall(text))
    if "complex<" in text:
        try:
            module = hlo2onnx.parse_module(text)
        except hlo2onnx.Hlo2OnnxError:
            return ops
        with module.context:
            ops.update(f"complex {name}" for name in _complex_ops(module.body))
    return ops


def _complex_ops(block) -> Iterator[str]:
    for op in block.operations:
        types = [str(v.type) for v in [*op.operands, *op.results]]
        if any("complex<" in t for t in types):
            yield op.operation.name
        for region in op.regions:
            for inner in region.blocks:
                yield from _complex_ops(inner)


# The targets beside ort-cpu (which runs every op the tests cover), as columns of the matrix.
MATRIX_TARGETS = ("core", "openvino-cpu", "ort-cuda", "iree-cpu")


def fits(text: str, target: str) -> bool | None:
    """Whether `target` runs all of this module (ort-cuda: no node left to its CPU fallback); None for a
    module no target translates (a deliberately bad input)."""
    try:
        return not hlo2onnx.translate_report(hlo2onnx.parse_module(text), target=target).violations
    except TargetError:
        return False
    except hlo2onnx.Hlo2OnnxError:
        return None


def support_matrix() -> str:
    """A markdown table: each op, the element types its test cases give it, how many lines hold it, and per
    target which of those element types some whole test case holding the op shows the target running."""
    dtypes: dict[str, set[str]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    shown: dict[tuple[str, str], set[str]] = {}  # (op, target) -> element types of cases the target runs
    for case in cases():
        text = lowered_text(case)
        if text is None:
            continue
        seen: dict[str, set[str]] = defaultdict(set)
        for line in text.splitlines():
            for op in ops_in(line):
                seen[op].update(t.replace("complex<f32>", "c64").replace("complex<f64>", "c128")
                                for t in _TENSOR.findall(line))
                counts[op] += 1
        for op, types in seen.items():
            dtypes[op].update(types)
        for target in MATRIX_TARGETS:
            if fits(text, target):
                for op, types in seen.items():
                    shown.setdefault((op, target), set()).update(types)

    def cell(op: str, target: str) -> str:
        if (op, target) not in shown:
            return "no"
        missing = dtypes[op] - shown[op, target]
        return f"not {', '.join(sorted(missing))}" if missing else "yes"

    lines = ["# Support matrix", "",
             "Generated by `python tests/case_tables.py > docs/support-matrix.md` from the test tables: every",
             "StableHLO op the tests translate and compare with jax.jit, the element types it is tested with, and",
             "how many lines of the tests' StableHLO hold it. Every op runs on `ort-cpu`. A target column says",
             "`yes` when, for each of those element types, some test case holding the op translates for the target",
             "with nothing refused; `not ...` lists the element types no such case shows, and `no` means no case",
             "holding the op fits the target. A case is judged whole, so an op refused beside another counts as",
             "unshown: the column is what the tests prove, a lower bound. `core`, `openvino-cpu` and `iree-cpu`",
             "refuse with an error naming the op; `ort-cuda` runs the refused part on its CPU provider. The tables",
             "are in hlo2onnx/targets/. `iree-cpu` runs every case of the tables it takes, matched against jax.jit",
             "(tests/test_iree.py's stress run), but for the few IREE compile failures named in its COMPILE_ERRORS.",
             f"Generated with jax {jax.__version__} (newer jax lowers some chlo ops itself, which changes the rows).", "",
             "| op | element types tested | uses | " + " | ".join(MATRIX_TARGETS) + " |",
             "|---|---|---|" + "---|" * len(MATRIX_TARGETS)]
    for op in sorted(dtypes):
        cells = " | ".join(cell(op, target) for target in MATRIX_TARGETS)
        lines.append(f"| `{op}` | {', '.join(sorted(dtypes[op]))} | {counts[op]} | {cells} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    print(support_matrix(), end="")
