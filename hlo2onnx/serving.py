"""Serving artifacts: a Triton model repository for an ONNX model, which KServe's ONNX runtime serves as well.

    conversion = hlo2onnx.convert(exported, dynamic=True)        # a symbolic batch: jax.export's "b"
    hlo2onnx.write_triton_repo(conversion, "models", max_batch_size=32)

writes `models/<name>/config.pbtxt` (backend "onnxruntime", the inputs and outputs with their Triton types and
dims, dynamic batching) and `models/<name>/1/model.onnx`. Weights past protobuf's 2 GB limit make
`1/model.onnx` a folder holding `model.onnx` and its data file, the layout Triton documents for ONNX models
made of several files. Only the files are written here: Triton, KServe or Ray Serve do the serving
(docs/deploy.md).
"""
from __future__ import annotations

import os
import re
import shutil
from typing import Protocol, Sequence, Union

import onnx
import onnx_ir as ir
from google.protobuf import text_encoding
from google.protobuf.message import DecodeError

from hlo2onnx import host_calls, names
from hlo2onnx.errors import Hlo2OnnxError
from hlo2onnx.files import PROTOBUF_LIMIT, make_temporary, save_model, weight_bytes

__all__ = ["write_triton_repo", "triton_config", "TRITON_TYPES", "DEFAULT_MAX_BATCH_SIZE", "MODEL_FILE",
           "DATA_FILE"]

# The largest batch Triton's dynamic batcher forms, and clients may send, unless told otherwise.
from hlo2onnx.defaults import DEFAULT_MAX_BATCH_SIZE  # noqa: E402  (light: the command's --help reads it)
# Triton's onnxruntime backend reads `<version>/model.onnx`, a file or a folder holding a file of that name.
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"

# ONNX element type -> the ModelConfig DataType name, for the types Triton's onnxruntime backend takes (Triton's
# "Datatypes" table: no bfloat16, float8 or int4 there). Written out because tritonclient, which has the
# enum, is not a dependency: the tests parse what is written here with its model_config_pb2.
TRITON_TYPES = {
    ir.DataType.BOOL: "TYPE_BOOL",
    ir.DataType.UINT8: "TYPE_UINT8", ir.DataType.UINT16: "TYPE_UINT16",
    ir.DataType.UINT32: "TYPE_UINT32", ir.DataType.UINT64: "TYPE_UINT64",
    ir.DataType.INT8: "TYPE_INT8", ir.DataType.INT16: "TYPE_INT16",
    ir.DataType.INT32: "TYPE_INT32", ir.DataType.INT64: "TYPE_INT64",
    ir.DataType.FLOAT16: "TYPE_FP16", ir.DataType.FLOAT: "TYPE_FP32", ir.DataType.DOUBLE: "TYPE_FP64",
    ir.DataType.STRING: "TYPE_STRING",
}
# A model name is a folder of the repository and part of every request's URL (/v2/models/<name>/infer).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class HasModel(Protocol):
    """What `hlo2onnx.convert` and `mnjit(f).lower(...)` return: they hold the ONNX model."""

    model: ir.Model


Source = Union[HasModel, ir.Model, onnx.ModelProto, str, os.PathLike]


def write_triton_repo(source: Source, directory: str | os.PathLike, *, name: str | None = None,
                      max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, version: int = 1,
                      external_data: bool = False, input_names: Sequence[str] | str | None = None,
                      output_names: Sequence[str] | str | None = None, inputs_as_nchw: Sequence[str] | str = (),
                      outputs_as_nchw: Sequence[str] | str = ()) -> str:
    """Writes `directory/<name>/` as a Triton model: config.pbtxt and `<version>/model.onnx`; returns its path.

    `source` is a `hlo2onnx.convert` result, a `mnjit(f).lower(...)` result, an onnx_ir or onnx model, or the
    path of an .onnx file. `name` defaults to the model's graph name (for jax.export models, the function's),
    made a valid folder name. With `max_batch_size` > 0 Triton batches requests along axis 0: every input
    and output must have the same symbolic first dim (a jax.export symbolic batch, converted with
    dynamic=True), and the config's dims leave it out. `max_batch_size=0` writes full shapes and no batching.
    Symbolic dims are -1. `external_data` puts the weights in a data file beside the model (done anyway past
    protobuf's 2 GB limit); `<version>/model.onnx` is then a folder. `input_names`, `output_names`,
    `inputs_as_nchw` and `outputs_as_nchw` are hlo2onnx.convert's, applied to the written model only.

    A model directory of that name is replaced whole (its other versions too), and only once everything is
    written: a failure leaves the repository as it was.
    """
    model = _as_model(source)
    if names.wanted(input_names, output_names, inputs_as_nchw, outputs_as_nchw):
        if not isinstance(source, (str, os.PathLike, onnx.ModelProto)):  # the caller's model stays as it was
            model = names.copy(model)
        names.apply(model, input_names=input_names, output_names=output_names, inputs_as_nchw=inputs_as_nchw,
                    outputs_as_nchw=outputs_as_nchw)
    name = _model_name(model, name)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise Hlo2OnnxError(f"the model version must be a positive integer, got {version!r}")
    config = triton_config(model, name, max_batch_size)
    directory = os.fspath(directory)
    target = os.path.join(directory, name)
    if os.path.lexists(target) and not os.path.isdir(target):
        # Only a model folder is replaced: a file of that name (the input itself, say) is the user's.
        raise Hlo2OnnxError(f"cannot write the Triton model {target}: it exists and is not a folder")
    try:
        os.makedirs(directory, exist_ok=True)
        return _write_atomically(model, target, config, str(version), external_data)
    except OSError as e:
        raise Hlo2OnnxError(f"cannot write the Triton repository {directory}: {e.strerror or e}") from None


def triton_config(model: ir.Model, name: str, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> str:
    """The text of config.pbtxt (protobuf text format of Triton's ModelConfig) for `model`.

    Raises Hlo2OnnxError, naming the input or output, for what Triton cannot serve as asked.
    """
    # ModelConfig.max_batch_size is an int32: a larger one made a config.pbtxt Triton cannot parse
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or not 0 <= max_batch_size < 2**31:
        raise Hlo2OnnxError(f"max_batch_size must be an integer from 0 to {2**31 - 1}, got {max_batch_size!r}")
    calls = host_calls.host_calls(model)
    if calls:
        raise Hlo2OnnxError(f"the model calls Python on the host ({len(calls)} mnjit.HostCallback node(s)): only "
                            "mnjit can run it, not Triton. Move the callbacks (jax.debug.print, pure_callback, "
                            "io_callback, equinox checks) out of the function to serve it")
    batched = max_batch_size > 0
    if batched:
        _check_batch_axis(model)
    lines = [f"name: {_quote(name)}", 'backend: "onnxruntime"', f"max_batch_size: {max_batch_size}"]
    for field, values in (("input", model.graph.inputs), ("output", model.graph.outputs)):
        entries = [_tensor_entry(value, field, batched) for value in values]
        lines.append(f"{field} [\n" + ",\n".join(entries) + "\n]")
    if batched:  # Triton refuses a batcher for a model that does not batch
        lines.append("dynamic_batching { }")
    return "\n".join(lines) + "\n"


def _as_model(source: Source) -> ir.Model:
    if isinstance(source, ir.Model):
        return source
    if isinstance(source, onnx.ModelProto):
        return ir.serde.deserialize_model(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            # Weights in memory: written as they are, they would still point at the data file beside `source`.
            return ir.external_data.load_to_model(ir.load(source))
        except (OSError, DecodeError) as e:
            raise Hlo2OnnxError(f"cannot read the ONNX model {os.fspath(source)}: {e}") from None
    model = getattr(source, "model", None)  # a Conversion, or mnjit's lowered function (hlo2onnx cannot import it)
    if isinstance(model, ir.Model):
        return model
    raise TypeError(f"expected a conversion, a lowered mnjit function, an ONNX model or a path, got "
                    f"{type(source).__name__}")


def _model_name(model: ir.Model, name: str | None) -> str:
    if name is not None:
        if not _NAME.fullmatch(name):
            raise Hlo2OnnxError(f"the Triton model name {name!r} must be letters, digits, '_', '-' or '.', not "
                                "starting with '_', '-' or '.': it is a folder name and part of request URLs")
        return name
    # The graph's name, made one: jax names a lambda's module "<lambda>", which becomes "lambda".
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", model.graph.name or "").strip("_.-")
    return cleaned or "model"


def _check_batch_axis(model: ir.Model) -> None:
    """Triton splits and joins requests along axis 0 of every input and output: that axis must be one
    symbolic dim, the same everywhere."""
    batch: tuple[str, str] | None = None  # (the dim's name, the tensor that first had it)
    for kind, values in (("input", model.graph.inputs), ("output", model.graph.outputs)):
        for value in values:
            shape = value.shape
            if shape is None or len(shape) == 0 or isinstance(shape[0], int):
                what = "has no known shape" if shape is None else "is a scalar" if len(shape) == 0 else \
                    f"has a fixed first dim ({shape[0]})"
                raise Hlo2OnnxError(
                    f"{kind} {value.name!r} {what}: Triton batches along axis 0, which must be a symbolic dim on "
                    "every input and output (export with a symbolic batch, e.g. jax.export.symbolic_shape('b'), "
                    "and convert with dynamic=True / --dynamic), or write the repository with max_batch_size 0 "
                    "for a model that does not batch")
            label = shape[0].value
            if label is None:
                continue  # an unnamed dynamic dim: nothing to compare
            if batch is None:
                batch = (label, value.name)
            elif label != batch[0]:
                raise Hlo2OnnxError(
                    f"{kind} {value.name!r} has first dim {label!r} but {batch[1]!r} has {batch[0]!r}: Triton "
                    "batches all inputs and outputs along axis 0 together, so it must be the same dim; write "
                    "the repository with max_batch_size 0 instead")


def _tensor_entry(value: ir.Value, field: str, batched: bool) -> str:
    dtype = value.dtype
    if dtype not in TRITON_TYPES:
        raise Hlo2OnnxError(f"{field} {value.name!r} is {dtype.name if dtype is not None else 'untyped'}: "
                            "Triton's onnxruntime backend takes " + ", ".join(t.name for t in TRITON_TYPES))
    if value.shape is None:
        raise Hlo2OnnxError(f"{field} {value.name!r} has no known shape: Triton needs every input's and output's "
                            "rank")
    dims = [d if isinstance(d, int) else -1 for d in value.shape][1 if batched else 0:]
    fields = [f"name: {_quote(value.name)}", f"data_type: {TRITON_TYPES[dtype]}"]
    if dims:
        fields.append(f"dims: [ {', '.join(map(str, dims))} ]")
    else:  # Triton wants rank >= 1: a scalar (per request) travels as [1] and is reshaped (Triton's "Reshape")
        fields += ["dims: [ 1 ]", "reshape: { shape: [ ] }"]
    return "  {\n" + "".join(f"    {f}\n" for f in fields) + "  }"


def _quote(text: str) -> str:
    return '"' + text_encoding.CEscape(text, as_utf8=True) + '"'


def _write_atomically(model: ir.Model, target: str, config: str, version: str, external_data: bool) -> str:
    """Builds the model's folder under a temporary name beside `target`, then swaps it in."""
    parent = os.path.dirname(os.path.abspath(target))
    staging = make_temporary(parent, directory=True)
    old = None
    try:
        with open(os.path.join(staging, "config.pbtxt"), "w", encoding="utf-8") as f:
            f.write(config)
        folder = os.path.join(staging, version)
        os.mkdir(folder)
        if external_data or weight_bytes(model) >= PROTOBUF_LIMIT:
            folder = os.path.join(folder, MODEL_FILE)
            os.mkdir(folder)
            save_model(model, os.path.join(folder, MODEL_FILE), DATA_FILE)
        else:
            save_model(model, os.path.join(folder, MODEL_FILE))
        if os.path.lexists(target):
            # Two renames, not one: a folder cannot replace a non-empty one. In between, `target` is absent for
            # an instant; the old folder comes back if the second rename fails. Its holder is named so that the
            # command's clean-up after a crashed child (hlo2onnx.cli) leaves it: killed right there, the
            # previous model is still on disk.
            old = make_temporary(parent, directory=True, tag="previous-")
            os.rename(target, os.path.join(old, "previous"))
            try:
                os.rename(staging, target)
            except OSError:
                os.rename(os.path.join(old, "previous"), target)
                raise
        else:
            os.rename(staging, target)
        return target
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)
        if old is not None and os.path.lexists(target):  # else the previous model is in there: keep it
            shutil.rmtree(old, ignore_errors=True)
