"""Reading a saved model: the input format is recognized from the content, never the file name.

Inputs: StableHLO text (`Lowered.as_text()`), MLIR bytecode (portable
artifacts included), `jax.export` serialized artifacts and pre-optimization
XLA HLO text (`Lowered.as_text(dialect="hlo")`). jaxlib's parsers can abort
the process on malformed binary input; the `hlo2onnx` command therefore runs
them in a child process (docs/formats.md).
"""
from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np
import onnx_ir as ir
from jax import export
from jax.extend import mlir as jax_mlir
from jax.extend.mlir import ir as mlir
from jax.extend.mlir import passmanager
from jax.extend.mlir.dialects import chlo, stablehlo

from hlo2onnx import compat, names
from hlo2onnx.errors import Hlo2OnnxError, InvalidInputError, UnsupportedOpError
from hlo2onnx.mlir_io import make_context, parse_module
from hlo2onnx.translator import arg_name, unique_name
from hlo2onnx.types import TensorType, is_typed_key

FORMATS = {
    "stablehlo-text": "StableHLO text",
    "mlir-bytecode": "MLIR bytecode",
    "portable-artifact": "StableHLO portable artifact",
    "jax-export": "jax.export artifact",
    "hlo-text": "XLA HLO text",
    "module": "in-memory MLIR module",
}
MLIR_MAGIC = b"ML\xefR"


@dataclass
class Loaded:
    """A module as read from its source, before translation."""

    format: str
    module: mlir.Module
    name: str
    exported: export.Exported | None = None
    constants: list | None = None  # a Lowered's jax.const argument values (compat.const_args)


def read_source(source: str | os.PathLike, stream_bytes: int | None = None, *, name: str | None = None) -> bytes:
    """The bytes of a file; `-` reads stdin. A stream (stdin, a pipe, a device) may give at most `stream_bytes`
    (default: half the machine's memory): a regular file's size is known before reading, but a stream like
    /dev/zero would otherwise be read until the process is killed. `name`: the file in messages (its path)."""
    if str(source) == "-":
        return _read_stream(sys.stdin.buffer, name or "stdin", stream_bytes)
    name = name or os.fspath(source)
    try:
        with open(source, "rb") as f:
            if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return f.read()
            return _read_stream(f, name, stream_bytes)
    except OSError as e:
        raise InvalidInputError(f"cannot read {name}: {e.strerror or e}") from None


_CHUNK = 1 << 26


def _read_stream(stream, name: str, limit: int | None) -> bytes:
    if limit is None:
        limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    chunks, size = [], 0
    while chunk := stream.read(min(_CHUNK, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise InvalidInputError(f"{name} gave more than {limit / 2**20:,.0f} MiB without ending; save the "
                                    "model to a file and convert that")
    return b"".join(chunks)


def load(data: bytes | str, context: mlir.Context | None = None) -> Loaded:
    """Recognizes `data` by its content and reads it into a StableHLO module."""
    data = data.encode() if isinstance(data, str) else bytes(data)
    if not data.strip():
        raise InvalidInputError("the input is empty")
    context = context or quiet_context()
    if data.startswith(MLIR_MAGIC):
        portable = b"StableHLO_v" in data[:64]  # the bytecode's producer string
        module = _read_bytecode(data, context)
        return Loaded("portable-artifact" if portable else "mlir-bytecode", module, module_name(module))
    try:
        # A byte order mark (Windows editors save text with one) is no MLIR or HLO: "unexpected character".
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        return _load_exported(data, context)
    if text.lstrip().startswith("HloModule"):
        return _load_hlo_text(text, context)
    module = parse_module(text, context)
    return Loaded("stablehlo-text", module, module_name(module))


def quiet_context() -> mlir.Context:
    """A context whose diagnostics become exceptions, never stderr output."""
    # MLIR prints diagnostics to stderr unless a handler takes them; errors
    # reach the user as exceptions instead.
    context = make_context()
    context.attach_diagnostic_handler(lambda diagnostic: True)
    return context


def _read_bytecode(data: bytes, context: mlir.Context) -> mlir.Module:
    # MLIR's own bytecode reader validates the bytes first: jaxlib 0.11 and 0.12 segfault in
    # deserialize_portable_artifact on truncated bytecode (0.10 raised), and the reader says why it fails.
    module = parse_module(data, context)
    if _is_vhlo(module):
        try:  # a portable artifact (VHLO) is upgraded to this jaxlib's StableHLO
            with context:
                module = jax_mlir.deserialize_portable_artifact(data)
        except Exception:  # jaxlib's runtime error says only "failed"
            raise InvalidInputError("cannot upgrade the portable artifact to this jaxlib's StableHLO") from None
    _check_symbol_names(module)
    return module


def _check_symbol_names(module: mlir.Module) -> None:
    """Text is UTF-8 by construction; bytecode can name a function with any bytes, which MLIR's Python
    bindings cannot turn into a str (a RuntimeError from nanobind wherever the name is read)."""
    named = [module.operation, *module.body.operations]
    for op in named:
        if "sym_name" in op.attributes:
            raw = mlir.StringAttr(op.attributes["sym_name"]).value_bytes
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInputError(f"the symbol name {raw!r} is not valid UTF-8") from None


def _is_vhlo(module: mlir.Module) -> bool:
    """Whether the module holds VHLO functions. Not only the first op: an artifact with a mesh (Shardy's
    `sdy.mesh`, which jax.export writes for typed PRNG key arguments) starts with that."""
    return any(op.operation.name.startswith("vhlo.") for op in module.body.operations)


def _load_exported(data: bytes, context: mlir.Context) -> Loaded:
    try:
        exported = export.deserialize(bytearray(data))
    except Exception:  # flatbuffers fails with struct/index errors on anything else
        raise InvalidInputError("unrecognized input: not MLIR text or bytecode, XLA HLO text, "
                                "nor a jax.export artifact") from None
    return from_exported(exported, context)


def from_exported(exported: export.Exported, context: mlir.Context) -> Loaded:
    """The StableHLO module inside a `jax.export.Exported`, its platform index bound to CPU's."""
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
        block = function(module, "main").regions[0].blocks[0]
        arg = block.arguments[0]
        with mlir.InsertionPoint.at_block_begin(block):
            constant = stablehlo.ConstantOp(mlir.DenseElementsAttr.get(np.asarray(index, np.int32), type=arg.type))
        arg.replace_all_uses_with(constant.result)
        passmanager.PassManager.parse("builtin.module(canonicalize)").run(module.operation)


def _load_hlo_text(text: str, context: mlir.Context) -> Loaded:
    try:
        bytecode = jax_mlir.hlo_to_stablehlo(compat.hlo_text_to_proto(text))
    except Exception as e:  # XLA's status errors: the line with "error:" says where
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        detail = next((line for line in lines if "error:" in line), lines[0] if lines else type(e).__name__)
        raise InvalidInputError(f"cannot parse HLO text: {detail}") from None
    module = parse_module(bytecode, context)
    _mhlo_as_chlo(module)
    _untuple_custom_calls(module)
    with module.context:  # the importer leaves the tuples of flattened while loops behind, unread
        for op in _ops_named(module, ("stablehlo.tuple",)):
            if not any(True for _ in op.results[0].uses):
                op.erase()
    name = text.lstrip().split(None, 2)[1].rstrip(",")
    return Loaded("hlo-text", module, name)


_MHLO_AS_CHLO = ("mhlo.erf", "mhlo.topk")


def _ops_named(module: mlir.Module, names: tuple[str, ...]) -> list[mlir.Operation]:
    """Every op of `module` named one of `names`, nested regions included."""
    found = []

    def visit(op: mlir.Operation) -> None:
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.operation.name in names:
                        found.append(inner.operation)
                    visit(inner.operation)

    visit(module.operation)
    return found


def _untuple_custom_calls(module: mlir.Module) -> None:
    """HLO's custom calls with several results (LAPACK's getrf, syevd, gesdd...) return one tuple, read by
    get_tuple_element; jax's StableHLO gives them as many results, which is what the rules read. Each becomes
    the same call with the tuple's elements as results (its output aliasing, a memory hint, dropped)."""
    with module.context:
        for op in _ops_named(module, ("stablehlo.custom_call",)):
            if len(op.results) != 1 or not isinstance(op.results[0].type, mlir.TupleType):
                continue
            readers = [use.owner for use in op.results[0].uses]
            if any(reader.name != "stablehlo.get_tuple_element" for reader in readers):
                continue  # a tuple passed on whole: left for the rule to refuse by name
            tuple_type = op.results[0].type
            attributes = {name: op.attributes[name] for name in op.attributes if name != "output_operand_aliases"}
            with mlir.InsertionPoint(op), op.location:
                new = mlir.Operation.create("stablehlo.custom_call", results=[tuple_type.get_type(i) for i in
                                                                             range(tuple_type.num_types)],
                                            operands=list(op.operands), attributes=attributes)
            for reader in readers:
                index = mlir.IntegerAttr(reader.attributes["index"]).value
                reader.results[0].replace_all_uses_with(new.results[index])
                reader.erase()
            op.erase()


def _mhlo_as_chlo(module: mlir.Module) -> None:
    """XLA's HLO importer keeps HLO's erf and top-k as mhlo ops, which StableHLO has as chlo.erf and
    chlo.top_k (what jax lowers them to): the same semantics, so they become those, legalized with the rest."""
    with module.context:
        for op in _ops_named(module, _MHLO_AS_CHLO):
            types = [result.type for result in op.results]
            with mlir.InsertionPoint(op), op.location:
                if op.name == "mhlo.erf":
                    new = chlo.ErfOp(op.operands[0], results=types).operation
                elif "largest" in op.attributes and not mlir.BoolAttr(op.attributes["largest"]).value:
                    raise UnsupportedOpError("mhlo.topk", None, "the smallest k (largest = false)")
                else:
                    new = chlo.TopKOp(op.operands[0], mlir.IntegerAttr(op.attributes["k"]).value, results=types).operation
            for old, result in zip(op.results, new.results):
                old.replace_all_uses_with(result)
            op.erase()


def module_name(module: mlir.Module) -> str:
    """The module's sym_name, or `main`."""
    attributes = module.operation.attributes
    return mlir.StringAttr(attributes["sym_name"]).value if "sym_name" in attributes else "main"


def function(module: mlir.Module | mlir.Operation, name: str) -> mlir.Operation:
    """The func.func named `name`, or InvalidInputError."""
    body = module.body if isinstance(module, mlir.Module) else module.regions[0].blocks[0]
    for op in body.operations:
        if op.operation.name == "func.func" and mlir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise InvalidInputError(f"the module has no function @{name}")


def check_signature(loaded: Loaded, dynamic: bool) -> None:
    """Refuses what would become an invalid model: no results, or symbolic dims without `dynamic`."""
    with loaded.module.context:
        main = function(loaded.module, "main")
        function_type = mlir.FunctionType(mlir.TypeAttr(main.attributes["function_type"]).value)
        if not function_type.results:
            # An ONNX graph without outputs is invalid: ORT refuses to load it.
            raise InvalidInputError("the module's @main has no results; an ONNX model needs at least one output")
        if dynamic:
            return
        types = list(function_type.inputs) + list(function_type.results)
        dynamic_types = [str(t) for t in types if isinstance(t, mlir.RankedTensorType) and not t.has_static_shape]
    if dynamic_types:
        avals = loaded.exported.in_avals if loaded.exported is not None else ()
        shown = ", ".join(str(a) for a in avals if not all(isinstance(d, int) for d in a.shape)) \
            or dynamic_types[0]
        raise Hlo2OnnxError(f"the model has dynamic dimensions ({shown}); convert with --dynamic "
                            "(dynamic=True) to keep them as ONNX dim_params")



def match_exported_signature(model: ir.Model, exported: export.Exported, wrapped_names: list[str]) -> None:
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
    leaf_names = _leaf_names(exported.in_tree, len(exported.in_avals))
    # A dict's keys name its leaves (hlo2onnx.names), as the translator names main's arguments.
    short = names.short_names([source_names.get(i) or leaf_names[i] for i in range(len(exported.in_avals))])
    new_inputs = []
    for i, aval in enumerate(exported.in_avals):
        stored = _stored(aval)
        value = kept.get(i) or ir.Value(type=ir.TensorType(ir.DataType.from_numpy(stored.dtype)))
        if value.name is None or (value.name.startswith("in") and value.name[2:].isdigit()):
            value.name = unique_name(short[i], used)
        value.shape = _onnx_shape(stored.shape)
        new_inputs.append(value)
    graph.inputs.clear()
    graph.inputs.extend(new_inputs)
    for value, aval in zip(graph.outputs, exported.out_avals):
        value.shape = _onnx_shape(_stored(aval).shape)


def exported_adjuster(loaded: Loaded) -> Callable[[ir.Model], None] | None:
    """For a jax.export artifact, the step that gives the model the artifact's signature (else None)."""
    exported = loaded.exported
    if exported is None:
        return None
    names = _wrapped_arg_names(loaded.module)
    return lambda model: match_exported_signature(model, exported, names)


def _wrapped_arg_names(module: mlir.Module) -> list[str]:
    """The source names of a shape-polymorphic export's arguments.

    jax.export then wraps the function in `_wrapped_jax_export_main`, which
    keeps the names main loses, after the dimension variables it receives.
    """
    try:
        wrapped = function(module, "_wrapped_jax_export_main")
    except InvalidInputError:
        return []
    with module.context:
        arg_attrs = list(wrapped.attributes["arg_attrs"]) if "arg_attrs" in wrapped.attributes else []
        dim_vars = sum(1 for attrs in arg_attrs if "jax.global_constant" in mlir.DictAttr(attrs))
        args = list(wrapped.regions[0].blocks[0].arguments)[dim_vars:]
        names = [arg_name(arg, i) for i, arg in enumerate(args)]
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


def _stored(aval) -> TensorType:
    """How the graph holds an argument or result: complex as (real, imag) pairs (TensorType.storage), and a
    typed PRNG key (jax.random.key) as its key data, which is what the module holds (uint32[..., 2] for
    threefry)."""
    if is_typed_key(aval.dtype):
        aval = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(aval.shape, aval.dtype))
    return TensorType(tuple(aval.shape), np.dtype(aval.dtype)).storage


def _onnx_shape(shape) -> ir.Shape:
    return ir.Shape([d if isinstance(d, int) else str(d) for d in shape])
