"""Targets: where a model is meant to run, each one place under one name.

    mnjit(f, target="openvino-cpu")      hlo2onnx model.mlir --target iree-cpu
    hlo2onnx f.bin --target mypkg.npu:NPU   mnjit(f, target=mypkg.npu.NPU)

A target (targets/profile.py) holds the ONNX ops and dtypes its consumer accepts, what its runtime
computes wrongly or refuses, the exact rewrites it needs, and where mnjit runs it. The translation
pipeline (hlo2onnx/pipeline.py) applies all of it, so the CLI, `convert`, `translate`, mnjit's
`lower().save()`, Triton repositories and mnjit's runners get the same model. The built-in ones:

- `ort-cpu`, `ort-cuda`, `core`: targets/ort.py;
- `openvino-cpu`: targets/openvino.py, rewrites in targets/openvino_rewrite.py;
- `iree-cpu`, `iree-cuda`: targets/iree.py, rewrites in targets/iree_rewrite.py.

Every target: NaN guards and the record of what a model assumes of its consumer (targets/portable.py); the
check of a finished model against the profile: targets/validation.py. A user's own target: `declare`, and
`register` to name it (docs/extending.md).
"""
from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Callable, Iterable, Mapping

from hlo2onnx.errors import Hlo2OnnxError
from hlo2onnx.opsets import DEFAULT_OPSET, OpsetError, check_opset
from hlo2onnx.target_table import TargetTable
from hlo2onnx.targets.iree import IREE_CPU, IREE_CUDA
from hlo2onnx.targets.openvino import OPENVINO_CPU
from hlo2onnx.targets.ort import CORE, F16_VIA_F32, ORT_CPU, ORT_CPU_MISSING, ORT_CUDA
from hlo2onnx.targets.profile import BF16, DTYPES, WIDER, Rewrite, Target, parse_dtypes
from hlo2onnx.targets.validation import TargetError, Violation, enforce, legalize, validate

__all__ = ["BF16", "CORE", "DTYPES", "F16_VIA_F32", "IREE_CPU", "IREE_CUDA", "OPENVINO_CPU", "ORT_CPU",
           "ORT_CPU_MISSING", "ORT_CUDA", "TARGETS", "WIDER", "Rewrite", "Target", "TargetError", "Violation",
           "declare", "enforce", "get", "legalize", "register", "resolve_opset", "validate"]

# The targets known by name: the built-in ones, then those a user registers.
TARGETS: dict[str, Target] = TargetTable({t.name: t for t in (ORT_CPU, ORT_CUDA, CORE, OPENVINO_CPU, IREE_CPU,
                                                                 IREE_CUDA)})


def get(target: str | Target) -> Target:
    """`target` itself, the target registered under that name, or a Target named by its import path
    ("package.module:NAME", the module imported here)."""
    if isinstance(target, Target):
        return target
    if not isinstance(target, str):
        raise TypeError(f"a target is a name or a hlo2onnx.targets.Target, got {type(target).__name__}")
    if target in TARGETS:
        return TARGETS[target]
    if ":" in target:
        return _imported(target)
    raise Hlo2OnnxError(f"unknown target {target!r} (choose from {', '.join(TARGETS)}, or name a Target in your "
                        f"own code as package.module:NAME)")


def resolve_opset(target: Target, opset: int | None) -> int:
    """The opset to write for `target`: `opset`, or the target's own, or DEFAULT_OPSET; one the target does not
    read is refused."""
    if opset is None:
        opset = DEFAULT_OPSET if target.opset is None else target.opset
    check_opset(opset)
    if target.opset is not None and opset != target.opset:
        raise OpsetError(f"target {target.name} reads opset {target.opset}, not {opset}")
    return opset


def _imported(path: str) -> Target:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise Hlo2OnnxError(f"target {path!r}: cannot import {module_name}: {e}") from None
    value = getattr(module, attr, None)
    if not isinstance(value, Target):
        found = "nothing" if value is None else f"a {type(value).__name__}"
        raise Hlo2OnnxError(f"target {path!r}: {module_name}.{attr} is {found}, not a hlo2onnx.targets.Target")
    return value


def register(target: Target, *, replace: bool = False) -> Target:
    """Makes `target` known by its name (`--target NAME`, `target="NAME"`), and returns it. A name already
    registered (a built-in one included) is refused unless `replace=True`, which replaces it for the rest of
    the process."""
    if not isinstance(target, Target):
        raise TypeError(f"register takes a hlo2onnx.targets.Target, got {type(target).__name__}")
    if target.name in TARGETS and not replace and TARGETS[target.name] is not target:
        raise ValueError(f"a target named {target.name!r} exists already (pass replace=True to replace it)")
    TARGETS[target.name] = target
    return target


def declare(name: str, *, ops: Iterable[str] | None = None, dtypes: Iterable[str] | None = None,
            opset: int | None = None, rewrites: Iterable[Rewrite] = (), propagates_nan: bool = False,
            based_on: str | Target = "ort-cpu", runner: Callable | None = None,
            providers: Iterable[str] | None = None,
            provider_options: Iterable[Mapping[str, str]] = (), fusions: Iterable = (),
            custom_ops: Mapping[str, Iterable[str]] | None = None, functions: Iterable = (),
            static_shapes: bool = False, missing: Mapping[str, Iterable[str]] | None = None,
            metadata: Mapping[str, str] | None = None, description: str = "") -> Target:
    """A target for a consumer of your own (docs/extending.md), not registered (see `register`).

    `ops`: the ONNX ops it accepts (None: any); `dtypes`: the element types it accepts, by numpy name
    (None: any); a model with anything else is refused, naming the StableHLO op and line behind each node.
    `opset`: the opset it reads. `rewrites`: exact rewrites of the finished model (in place on the
    onnx.ModelProto, returning whether they changed it), applied in order after `based_on`'s own and the NaN
    guards, which it gets
    unless `propagates_nan` (its Max, Min, Clip and Relu return NaN for a NaN operand, as XLA's). `based_on`:
    the target whose runtime, rewrites and measured faults (`wrong`, `refused`, `narrowed`) it starts from. mnjit
    runs it with `runner(model_bytes, in_avals, out_avals).run(leaves)` when given, else on `based_on`'s
    runtime; for ONNX Runtime, `providers` and `provider_options` (one mapping per provider) choose the
    execution providers. `fusions`: onnxscript rewrite rules (onnxscript.rewriter.pattern) for the consumer's
    own fused ops, applied after the built-in fusions; `custom_ops`: those ops by domain, which the check
    accepts; `functions`: ONNX functions (onnx.FunctionProto) defining any of them, added to each model that
    calls one. `static_shapes`: a model with a symbolic dim at an input or output is refused. `missing`: ops
    (by name) and the dtypes the consumer has no kernel for, which rules compute in a wider dtype where there
    is one (default: none where `ops` is given, else `based_on`'s gaps). `metadata`: entries every model for
    the target carries in its metadata_props (what its consumer must be told), added to `based_on`'s.
    """
    base = get(based_on)
    if opset is not None:
        check_opset(opset)
    accepted_ops = None if ops is None else frozenset(ops)
    accepted = None if dtypes is None else parse_dtypes(" ".join(dtypes))
    providers = base.providers if providers is None else tuple(providers)
    options = tuple(dict(o) for o in provider_options)
    if options and len(options) != len(providers):
        raise ValueError(f"target {name}: {len(options)} provider_options for {len(providers)} providers")
    if missing is not None:
        gaps = {op: parse_dtypes(" ".join(names)) for op, names in missing.items()}
    else:
        gaps = dict(base.missing) if accepted_ops is None else {}
    return replace(base, name=name, missing=gaps, ops=accepted_ops, dtypes=accepted, opset=opset, rewrites=base.rewrites + tuple(rewrites),
                   propagates_nan=propagates_nan, runner=runner, providers=providers, provider_options=options,
                   fusions=tuple(fusions), functions=tuple(functions), static_shapes=static_shapes,
                   custom_ops={domain: frozenset(names) for domain, names in (custom_ops or {}).items()},
                   metadata={**base.metadata, **(metadata or {})},
                   description=description or f"declared target {name}", fallback=None, fallback_chain=(),
                   expanded=frozenset({"IsNaN", "IsInf"}) - accepted_ops if accepted_ops is not None else frozenset())
