"""Writing ONNX files atomically, with external data for weights past protobuf's 2 GB limit."""
from __future__ import annotations

import os
import secrets
import stat

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # onnx_ir loads on use: hlo2onnx.cli imports this module and must start fast
    import onnx_ir as ir

# protobuf cannot serialize a message of 2 GiB or more; leave room for the graph itself.
PROTOBUF_LIMIT = 2**31 - 2**24
# Temporary files start with this (and the writing process's id, so a parent can clean up after a crashed child).
TEMP_PREFIX = ".hlo2onnx-"


def weight_bytes(model: ir.Model) -> int:
    """The bytes of the model's initializers: what decides whether it fits one protobuf message."""
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def save_model(model: ir.Model, path: str | os.PathLike, external_data: str | None = None) -> str | None:
    """Saves `model` to `path`; weights go to `external_data` (relative to path's folder) when given or needed.

    Both files are written under temporary names in the destination folder and renamed only once complete,
    so a failure never leaves a partial or changed file. Returns the weights file's name (None: no weights
    file). Raises ValueError for an external_data name that is not a plain file name.
    """
    too_large = weight_bytes(model) >= PROTOBUF_LIMIT
    if _special(path):
        # A device or FIFO (/dev/stdout, a pipe) is written directly: a rename would replace the node itself.
        # Checked before realpath: a shell's >(...) is /dev/fd/63, whose real path is no path ("pipe:[1234]").
        if external_data is not None or too_large:
            raise ValueError(f"{os.fspath(path)} is not a regular file: the model cannot have an external data "
                             "file there")
        _write_through(model, path)
        return None
    path = os.path.realpath(path)  # through a symbolic link: the link stays, its target is written
    if external_data is None and too_large:
        external_data = os.path.basename(path) + ".data"
    folder = os.path.dirname(os.path.abspath(path))
    temporaries: list[str] = []
    try:
        model_tmp = _temporary(folder, temporaries)
        import onnx_ir as ir

        if external_data is None:
            ir.save(model, model_tmp)
        else:
            # "", "." and ".." have no folder part but name the folder itself: the rename would fail on it.
            if os.path.isabs(external_data) or os.path.dirname(external_data) or external_data in ("", ".", ".."):
                raise ValueError(f"external_data must be a file name beside the model, got {external_data!r}")
            if os.path.isdir(os.path.join(folder, external_data)):
                raise ValueError(f"external_data {external_data!r} is a folder beside the model, not a file name")
            if external_data == os.path.basename(path):
                raise ValueError(f"external_data must not be the model's own file name, got {external_data!r}")
            # onnx_ir writes the weights next to the model under the name recorded in it; write them under
            # a temporary name first, then record the final one.
            data_tmp = _temporary(folder, temporaries)
            ir.save(model, model_tmp, external_data=os.path.basename(data_tmp))
            _rename_external(model_tmp, os.path.basename(data_tmp), external_data)
            os.replace(data_tmp, os.path.join(folder, external_data))
        os.replace(model_tmp, path)
        return external_data
    finally:
        for name in temporaries:
            if os.path.exists(name):
                os.unlink(name)


def _special(path: str) -> bool:
    """Whether `path` exists and is neither a regular file nor a folder (character device, FIFO, socket)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _write_through(model: ir.Model, path: str) -> None:
    import onnx_ir as ir

    data = ir.to_proto(model).SerializeToString()
    with open(path, "wb") as f:  # closing flushes: a full device (ENOSPC) raises there, not silently
        f.write(data)


def _temporary(folder: str, temporaries: list[str]) -> str:
    name = make_temporary(folder)
    temporaries.append(name)
    return name


def make_temporary(folder: str, directory: bool = False, tag: str = "") -> str:
    """Creates a file (or folder) in `folder` under a fresh temporary name: TEMP_PREFIX, `tag`, this process's id.

    Hand-made rather than tempfile.mkstemp/mkdtemp, whose fixed modes 0600/0700 the renamed result would keep:
    here the umask decides, as for any new file, so a model server running as another user can read it.
    """
    for _ in range(100):
        name = os.path.join(folder, f"{TEMP_PREFIX}{tag}{os.getpid()}-{secrets.token_hex(6)}"
                            + ("" if directory else ".tmp"))
        try:
            if directory:
                os.mkdir(name, 0o777)
            else:
                os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder}")


def _rename_external(model_path: str, old: str, new: str) -> None:
    """Points the saved model's external-data references from `old` to `new` (graph only, no weights loaded)."""
    import onnx

    proto = onnx.load(model_path, load_external_data=False)
    for tensor in _all_tensors(proto.graph):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    with open(model_path, "wb") as f:
        f.write(proto.SerializeToString())


def _all_tensors(graph):
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.t.external_data:
                yield attribute.t
            for subgraph in [attribute.g, *attribute.graphs]:
                yield from _all_tensors(subgraph)
