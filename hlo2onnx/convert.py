"""Converting a saved model without its Python source: the API behind the `hlo2onnx` command.

    conversion = hlo2onnx.convert("model.mlir", "model.onnx")
    print(conversion.check().summary())

Inputs are recognized by their content: StableHLO text (`Lowered.as_text()`),
MLIR bytecode (portable artifacts included), `jax.export` serialized artifacts
and pre-optimization XLA HLO text (`Lowered.as_text(dialect="hlo")`).
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import numpy as np
import onnx
import onnx_ir as ir
from jax import export
from jax.extend import mlir as jax_mlir
from jax.extend.mlir import ir as mlir
from jax.extend.mlir import passmanager
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.errors import Hlo2OnnxError, InvalidInputError
from hlo2onnx.interrupts import InterruptGuard
from hlo2onnx.mlir_io import make_context, parse_module, prepare
from hlo2onnx.translator import _unique  # one de-duplicating namer for graph inputs and outputs
from hlo2onnx import targets
from hlo2onnx.patterns import Report, optimize_report
from hlo2onnx.report import ConversionReport
from hlo2onnx.support import Target
from hlo2onnx.targets import Violation
from hlo2onnx.translator import Translator, _arg_name

DEFAULT_OPSET = 21  # hlo2onnx.DEFAULT_OPSET
# Rules use the opset-18 Reduce* forms; IR version 10 (what the translator writes) ends at opset 22.
MIN_OPSET, MAX_OPSET = 18, 24  # 23 brings ONNX Attention and RMSNormalization, 24 Swish; ORT 1.32 runs up to 24
FORMATS = {
    "stablehlo-text": "StableHLO text",
    "mlir-bytecode": "MLIR bytecode",
    "portable-artifact": "StableHLO portable artifact",
    "jax-export": "jax.export artifact",
    "hlo-text": "XLA HLO text",
    "module": "in-memory MLIR module",
}
_MLIR_MAGIC = b"ML\xefR"
# Progress is reported at most this often (seconds).
_PROGRESS_PERIOD = 0.1

Progress = Callable[[int, int], None]


class CheckError(Hlo2OnnxError):
    """--check could not run the model (as opposed to finding a mismatch)."""


# -- reading ------------------------------------------------------------------------------------------
@dataclass
class Loaded:
    """A module as read from its source, before translation."""

    format: str
    module: mlir.Module
    name: str
    exported: export.Exported | None = None


def read_source(source: str | os.PathLike) -> bytes:
    """The bytes of a file; `-` reads stdin."""
    if str(source) == "-":
        return sys.stdin.buffer.read()
    try:
        with open(source, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidInputError(f"cannot read {os.fspath(source)}: {e.strerror or e}") from None


def load(data: bytes | str, context: mlir.Context | None = None) -> Loaded:
    """Recognizes `data` by its content and reads it into a StableHLO module."""
    data = data.encode() if isinstance(data, str) else bytes(data)
    if not data.strip():
        raise InvalidInputError("the input is empty")
    context = context or _quiet_context()
    if data.startswith(_MLIR_MAGIC):
        portable = b"StableHLO_v" in data[:64]  # the bytecode's producer string
        module = _read_bytecode(data, context)
        return Loaded("portable-artifact" if portable else "mlir-bytecode", module, _module_name(module))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _load_exported(data, context)
    if text.lstrip().startswith("HloModule"):
        return _load_hlo_text(text, context)
    module = parse_module(text, context)
    return Loaded("stablehlo-text", module, _module_name(module))


def _quiet_context() -> mlir.Context:
    # MLIR prints diagnostics to stderr unless a handler takes them; errors
    # reach the user as exceptions instead.
    context = make_context()
    context.attach_diagnostic_handler(lambda diagnostic: True)
    return context


def _read_bytecode(data: bytes, context: mlir.Context) -> mlir.Module:
    # Portable artifacts (VHLO) must be upgraded to StableHLO; plain bytecode goes through the same door.
    try:
        with context:
            return jax_mlir.deserialize_portable_artifact(data)
    except Exception:  # jaxlib's runtime error says only "failed"; the parser below says why
        pass
    module = parse_module(data, context)
    if _first_op(module).startswith("vhlo."):
        raise InvalidInputError("cannot upgrade the portable artifact to this jaxlib's StableHLO")
    return module


def _first_op(module: mlir.Module) -> str:
    ops = list(module.body.operations)
    return ops[0].operation.name if ops else "none"


def _load_exported(data: bytes, context: mlir.Context) -> Loaded:
    try:
        exported = export.deserialize(bytearray(data))
    except Exception:  # flatbuffers fails with struct/index errors on anything else
        raise InvalidInputError("unrecognized input: not MLIR text or bytecode, XLA HLO text, "
                                "nor a jax.export artifact") from None
    return _from_exported(exported, context)


def _from_exported(exported: export.Exported, context: mlir.Context) -> Loaded:
    if exported.ordered_effects:
        raise Hlo2OnnxError(f"jax.export artifact with ordered effects {exported.ordered_effects} "
                            "(tokens) is not supported")
    module = _read_bytecode(bytes(exported.mlir_module_serialized), context)
    if len(exported.platforms) > 1:
        platform = "cpu" if "cpu" in exported.platforms else exported.platforms[0]
        _bind_platform_index(module, exported.platforms.index(platform))
    return Loaded("jax-export", module, exported.fun_name, exported)


def _bind_platform_index(module: mlir.Module, index: int) -> None:
    """Multi-platform exports take the platform index as main's first argument: fix it, fold the cases."""
    with module.context, mlir.Location.unknown():
        block = _function(module, "main").regions[0].blocks[0]
        arg = block.arguments[0]
        with mlir.InsertionPoint.at_block_begin(block):
            constant = stablehlo.ConstantOp(mlir.DenseElementsAttr.get(np.asarray(index, np.int32), type=arg.type))
        arg.replace_all_uses_with(constant.result)
        passmanager.PassManager.parse("builtin.module(canonicalize)").run(module.operation)


def _load_hlo_text(text: str, context: mlir.Context) -> Loaded:
    from jaxlib import _hlo  # private, and the only HLO text parser jaxlib ships (findings.md)

    try:
        proto = _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
        bytecode = jax_mlir.hlo_to_stablehlo(proto)
    except Exception as e:  # XLA's status errors: the line with "error:" says where
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        detail = next((line for line in lines if "error:" in line), lines[0] if lines else type(e).__name__)
        raise InvalidInputError(f"cannot parse HLO text: {detail}") from None
    module = parse_module(bytecode, context)
    name = text.lstrip().split(None, 2)[1].rstrip(",")
    return Loaded("hlo-text", module, name)


def _module_name(module: mlir.Module) -> str:
    attributes = module.operation.attributes
    return mlir.StringAttr(attributes["sym_name"]).value if "sym_name" in attributes else "main"


def _function(module: mlir.Module | mlir.Operation, name: str) -> mlir.Operation:
    body = module.body if isinstance(module, mlir.Module) else module.regions[0].blocks[0]
    for op in body.operations:
        if op.operation.name == "func.func" and mlir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise InvalidInputError(f"the module has no function @{name}")


# -- translating --------------------------------------------------------------------------------------
@dataclass
class Conversion:
    """The result of `convert`: the ONNX model and what was learned on the way."""

    model: ir.Model
    loaded: Loaded
    op_counts: dict[str, int]
    timings: dict[str, float] = field(default_factory=dict)
    optimized: Report | None = None  # what clean-up and fusion did (None: fusion off)
    target: Target | None = None
    violations: list[Violation] = field(default_factory=list)  # nodes the target runs on its fallback

    @property
    def format(self) -> str:
        return self.loaded.format

    def to_proto(self) -> onnx.ModelProto:
        return ir.to_proto(self.model)

    def save(self, path: str | os.PathLike) -> None:
        try:
            ir.save(self.model, path)
        except OSError as e:
            raise Hlo2OnnxError(f"cannot write {os.fspath(path)}: {e.strerror or e}") from None

    def report(self) -> str:
        return str(ConversionReport(self.model, self.op_counts, self.optimized, self.target, self.violations))

    def check(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None, *,
              sizes: Sequence[int] = (2, 5), seed: int = 0) -> "CheckResult":
        return check(self, inputs, sizes=sizes, seed=seed)


def convert(source: str | os.PathLike | bytes | mlir.Module | export.Exported,
            output: str | os.PathLike | None = None, *, target: str | Target = "ort-cpu",
            opset: int = DEFAULT_OPSET, name: str | None = None, dynamic: bool = False, fuse: bool = True,
            progress: Progress | None = None) -> Conversion:
    """Converts a saved model to ONNX; writes it to `output` when given.

    `source` is a path (`-` for stdin), the file's bytes, an in-memory module
    or a `jax.export.Exported`. `dynamic` keeps symbolic dims (jax.export shape
    polymorphism) as ONNX dim_params; without it such inputs are rejected.
    `progress(done, total)` is called while ops are translated.
    """
    with InterruptGuard():  # Ctrl-C raised, not lost in a garbage-collector callback
        return _convert(source, output, target, opset, name, dynamic, fuse, progress)


def _convert(source, output, target, opset, name, dynamic, fuse, progress) -> Conversion:
    target = targets.get(target)
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise Hlo2OnnxError(f"opset {opset} is not supported (choose {MIN_OPSET} to {MAX_OPSET})")
    timings: dict[str, float] = {}
    with _timed(timings, "read"):
        data = source if isinstance(source, (bytes, bytearray, mlir.Module, export.Exported)) \
            else read_source(source)
    with _timed(timings, "parse"):
        if isinstance(data, mlir.Module):
            loaded = Loaded("module", data, _module_name(data))
        elif isinstance(data, export.Exported):
            loaded = _from_exported(data, _quiet_context())
        else:
            loaded = load(data)
    _check_static(loaded, dynamic)
    with _timed(timings, "prepare"):
        try:
            prepared = prepare(loaded.module)
        except mlir.MLIRError as e:
            raise InvalidInputError(f"cannot legalize the module: {' '.join(str(e).split())}") from None
    with _timed(timings, "translate"), loaded.module.context:
        translator = _ProgressTranslator(prepared, target, opset, progress)
        model = translator.translate(graph_name=name or loaded.name)
        if loaded.exported is not None:
            _match_exported_signature(model, loaded.exported, _wrapped_arg_names(loaded.module))
    optimized = None
    if fuse:
        with _timed(timings, "optimize"):
            optimized = optimize_report(model, target)
    violations = targets.check(model, target)  # before anything is written: a strict target refuses here
    conversion = Conversion(model, loaded, dict(translator.op_counts), timings, optimized, target, violations)
    if output is not None:
        with _timed(timings, "save"):
            conversion.save(output)
    return conversion


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - start


def _check_static(loaded: Loaded, dynamic: bool) -> None:
    if dynamic:
        return
    with loaded.module.context:
        main = _function(loaded.module, "main")
        function_type = mlir.FunctionType(mlir.TypeAttr(main.attributes["function_type"]).value)
        types = list(function_type.inputs) + list(function_type.results)
        dynamic_types = [str(t) for t in types if isinstance(t, mlir.RankedTensorType) and not t.has_static_shape]
    if dynamic_types:
        avals = loaded.exported.in_avals if loaded.exported is not None else ()
        shown = ", ".join(str(a) for a in avals if not all(isinstance(d, int) for d in a.shape)) \
            or dynamic_types[0]
        raise Hlo2OnnxError(f"the model has dynamic dimensions ({shown}); convert with --dynamic "
                            "(dynamic=True) to keep them as ONNX dim_params")


class _ProgressTranslator(Translator):
    """The translator, reporting how many ops it has emitted (for modules with thousands)."""

    def __init__(self, module: mlir.Operation, target: Target, opset: int, progress: Progress | None):
        super().__init__(module, target, opset)
        self._progress = progress
        self._done = 0
        self._last = 0.0
        self._total = _count_ops(self.functions, "main", {}) if progress else 0

    def emit_op(self, op, name, inputs, b):
        outputs = super().emit_op(op, name, inputs, b)
        if self._progress is not None:
            self._done += 1
            now = time.perf_counter()
            if now - self._last >= _PROGRESS_PERIOD:
                self._last = now
                self._progress(min(self._done, self._total), self._total)
        return outputs

    def translate(self, name: str = "main", graph_name: str = "main") -> ir.Model:
        model = super().translate(name, graph_name)
        if self._progress is not None:
            self._progress(self._total, self._total)
        return model


def _count_ops(functions: Mapping[str, mlir.Operation], name: str, memo: dict[str, int]) -> int:
    """Ops emitted for function `name`, counting each inlined call again (an estimate: bodies of
    reductions are counted though they are not emitted)."""
    if name not in memo:
        memo[name] = 0  # recursion guard
        memo[name] = _count_region_ops(functions[name].regions[0], functions, memo) if name in functions else 0
    return memo[name]


def _count_region_ops(region: mlir.Region, functions, memo) -> int:
    total = 0
    for block in region.blocks:
        for op in block.operations:
            total += 1
            if op.operation.name == "func.call":
                total += _count_ops(functions, mlir.FlatSymbolRefAttr(op.attributes["callee"]).value, memo)
            for inner in op.regions:
                total += _count_region_ops(inner, functions, memo)
    return total


def _match_exported_signature(model: ir.Model, exported: export.Exported, wrapped_names: list[str]) -> None:
    """Makes the ONNX inputs the artifact's flattened arguments, named as in the source or by tree path.

    Drops the platform index (bound at load time), adds the arguments jax
    left out of the module as unused inputs, and names symbolic dims.
    """
    graph = model.graph
    inputs = list(graph.inputs)
    if len(exported.platforms) > 1:
        inputs = inputs[1:]
    kept = dict(zip(exported.module_kept_var_idx, inputs))
    source_names = dict(zip(exported.module_kept_var_idx, wrapped_names))
    used = {v.name for v in inputs} | {v.name for v in graph.outputs}
    names = _leaf_names(exported.in_tree, len(exported.in_avals))
    new_inputs = []
    for i, aval in enumerate(exported.in_avals):
        value = kept.get(i) or ir.Value(type=ir.TensorType(ir.DataType.from_numpy(aval.dtype)))
        if value.name is None or (value.name.startswith("in") and value.name[2:].isdigit()):
            value.name = _unique(source_names.get(i) or names[i], used)
        value.shape = _onnx_shape(aval.shape)
        new_inputs.append(value)
    graph.inputs.clear()
    graph.inputs.extend(new_inputs)
    for value, aval in zip(graph.outputs, exported.out_avals):
        value.shape = _onnx_shape(aval.shape)


def _wrapped_arg_names(module: mlir.Module) -> list[str]:
    """The source names of a shape-polymorphic export's arguments.

    jax.export then wraps the function in `_wrapped_jax_export_main`, which
    keeps the names main loses, after the dimension variables it receives.
    """
    try:
        wrapped = _function(module, "_wrapped_jax_export_main")
    except InvalidInputError:
        return []
    with module.context:
        arg_attrs = list(wrapped.attributes["arg_attrs"]) if "arg_attrs" in wrapped.attributes else []
        dim_vars = sum(1 for attrs in arg_attrs if "jax.global_constant" in mlir.DictAttr(attrs))
        args = list(wrapped.regions[0].blocks[0].arguments)[dim_vars:]
        names = [_arg_name(arg, i) for i, arg in enumerate(args)]
    return [name if name != f"in{i}" else "" for i, name in enumerate(names)]


def _leaf_names(in_tree, count: int) -> list[str]:
    """`arg0`, `arg1['w']`, `kw['bias']` ... from the (args, kwargs) tree."""
    paths = jax.tree_util.tree_flatten_with_path(jax.tree_util.tree_unflatten(in_tree, [0] * count))[0]
    names = []
    for path, _ in paths:
        head, rest = path[0], path[1:]
        if head.idx == 0:  # positional: (SequenceKey(0), SequenceKey(i), ...)
            names.append(f"arg{rest[0].idx}{jax.tree_util.keystr(rest[1:])}")
        else:  # keyword: (SequenceKey(1), DictKey(name), ...)
            names.append(f"{rest[0].key}{jax.tree_util.keystr(rest[1:])}")
    return names


def _onnx_shape(shape) -> ir.Shape:
    return ir.Shape([d if isinstance(d, int) else str(d) for d in shape])


# -- checking -----------------------------------------------------------------------------------------
# (rtol, atol): ONNX Runtime and XLA may order float arithmetic differently.
_CHECK_TOLERANCE = {"float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2), "float32": (1e-4, 1e-5),
                    "float64": (1e-10, 1e-12)}


@dataclass
class CheckResult:
    """ONNX Runtime against JAX on the same inputs."""

    max_abs_error: float
    runs: int
    outputs: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        runs = f" over {self.runs} runs" if self.runs > 1 else ""
        verdict = "ok" if self.ok else "MISMATCH: " + "; ".join(self.problems)
        return f"check: max abs error {self.max_abs_error:.3g} on {self.outputs} output(s){runs}: {verdict}"


def check(conversion: Conversion, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None, *,
          sizes: Sequence[int] = (2, 5), seed: int = 0) -> CheckResult:
    """Runs the ONNX model in ONNX Runtime and the source module in JAX; compares the outputs.

    Without `inputs`, random ones are made from the signature; symbolic dims
    take each value of `sizes` in turn (one run per size).
    """
    import onnxruntime as ort

    specs = [(v.name, tuple(v.shape), v.dtype.numpy()) for v in conversion.model.graph.inputs]
    if inputs is not None:
        feeds = [_given_inputs(specs, inputs)]
    else:
        symbolic = {d.value for _, shape, _ in specs for d in shape if isinstance(d, ir.SymbolicDim)}
        if None in symbolic or any(not s.isidentifier() for s in symbolic if s is not None):
            raise CheckError("cannot make inputs for dynamic dims without plain names; give the inputs")
        rng = np.random.default_rng(seed)
        feeds = [[_random(rng, _concrete(shape, size), dtype) for _, shape, dtype in specs]
                 for size in (sizes if symbolic else sizes[:1])]
    try:
        session = ort.InferenceSession(conversion.to_proto().SerializeToString(),
                                       providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT's errors are one long line with a code prefix
        raise CheckError(f"ONNX Runtime rejected the model: {' '.join(str(e).split())}") from None
    reference = _reference(conversion.loaded)
    max_error, problems, outputs = 0.0, [], 0
    for arrays in feeds:
        actual = session.run(None, {name: a for (name, _, _), a in zip(specs, arrays)})
        expected = reference(arrays)
        outputs = len(expected)
        if len(actual) != len(expected):
            problems.append(f"{len(actual)} outputs, JAX gives {len(expected)}")
            continue
        for i, (a, e) in enumerate(zip(actual, expected)):
            error, problem = _compare(np.asarray(a), np.asarray(e))
            max_error = max(max_error, error)
            if problem:
                problems.append(f"output {i}: {problem}")
    return CheckResult(max_error, len(feeds), outputs, problems)


def _given_inputs(specs, inputs) -> list[np.ndarray]:
    if isinstance(inputs, Mapping):
        names = [name for name, _, _ in specs]
        if all(name in inputs for name in names):
            arrays = [inputs[name] for name in names]
        elif all(f"arr_{i}" in inputs for i in range(len(names))):  # np.savez(path, *arrays)
            arrays = [inputs[f"arr_{i}"] for i in range(len(names))]
        else:
            raise CheckError(f"the inputs must be named {', '.join(names)} (or arr_0 ... arr_{len(names) - 1})")
    else:
        arrays = list(inputs)
    if len(arrays) != len(specs):
        raise CheckError(f"the model takes {len(specs)} inputs, {len(arrays)} given")
    arrays = [np.asarray(a) for a in arrays]
    for (name, shape, dtype), a in zip(specs, arrays):
        fits = len(shape) == a.ndim and all(not isinstance(d, int) or d == n for d, n in zip(shape, a.shape))
        if a.dtype != dtype or not fits:
            want = f"{dtype}[{','.join(str(d) for d in shape)}]"
            raise CheckError(f"input {name} must be {want}, got {a.dtype}[{','.join(map(str, a.shape))}]")
    return arrays


def _concrete(shape, size: int) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else size for d in shape)


def _random(rng: np.random.Generator, shape, dtype: np.dtype) -> np.ndarray:
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 4, shape).astype(dtype)  # small: may be indices or shifts
    if dtype.kind == "c":
        return (rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)).astype(dtype)
    return rng.uniform(-1, 1, shape).astype(dtype)


def _reference(loaded: Loaded) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """A function running the source module in JAX, on the flat ONNX inputs."""
    exported = loaded.exported
    if exported is not None:
        def run_exported(arrays):
            args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, arrays)
            with jax.enable_x64(True):
                return [np.asarray(x) for x in jax.tree_util.tree_leaves(exported.call(*args, **kwargs))]
        return _reference_errors(run_exported)
    # A plain module: compiled by jax's own backend, as jax.jit would.
    import jax.extend.backend as jax_backend

    with loaded.module.context:
        if not all(mlir.RankedTensorType(a.type).has_static_shape
                   for a in _function(loaded.module, "main").regions[0].blocks[0].arguments):
            raise CheckError("--check on dynamic shapes needs a jax.export artifact (or give static inputs)")
        text = str(loaded.module)
    with jax.enable_x64(True):
        backend = jax_backend.get_backend("cpu")
        try:
            executable = backend.compile_and_load(text, backend.devices()[:1], jax_backend.get_compile_options(1, 1))
        except Exception as e:
            raise CheckError(f"JAX cannot compile the module: {' '.join(str(e).split())[:300]}") from None

    def run_module(arrays):
        with jax.enable_x64(True):
            device = backend.devices()[0]
            results = executable.execute_sharded([jax.device_put(a, device) for a in arrays])
            return [np.asarray(shards[0]) for shards in results.disassemble_into_single_device_arrays()]
    return _reference_errors(run_module)


def _reference_errors(run: Callable[[list[np.ndarray]], list[np.ndarray]]):
    def guarded(arrays):
        try:
            return run(arrays)
        except Exception as e:
            raise CheckError(f"JAX failed to run the module: {' '.join(str(e).split())[:300]}") from None
    return guarded


def _compare(actual: np.ndarray, expected: np.ndarray) -> tuple[float, str | None]:
    if actual.shape != expected.shape:
        return 0.0, f"shape {actual.shape}, JAX gives {expected.shape}"
    if actual.dtype != expected.dtype:
        return 0.0, f"dtype {actual.dtype}, JAX gives {expected.dtype}"
    if actual.size == 0:
        return 0.0, None
    if actual.dtype.kind in "biu":
        error = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64))))
        return error, None if error == 0 else f"{int(np.sum(actual != expected))} elements differ"
    a = actual.astype(np.complex128 if actual.dtype.kind == "c" else np.float64)
    e = expected.astype(a.dtype)
    both_nan = np.isnan(a) & np.isnan(e)
    diff = np.where(both_nan, 0, np.abs(a - e))
    error = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff)))
    rtol, atol = _CHECK_TOLERANCE.get(actual.dtype.name, (1e-4, 1e-5))
    bad = int(np.sum(~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)))
    return error, f"{bad} elements beyond rtol={rtol:g}, atol={atol:g}" if bad else None
