"""Errors raised by hlo2onnx. Each names the StableHLO op and the user's source line."""
from __future__ import annotations

import functools
import importlib.util
import os
import re

_FILE_LINE = re.compile(r'"([^"]+)":(\d+)(?::(\d+))?')


def _package_dirs() -> tuple[str, ...]:
    """The folders of jax, jaxlib, mnjit, hlo2onnx and the ONNX libraries hlo2onnx calls (its fusions run inside
    onnxscript's rewriter, and may trace jax code there): frames there are never the user's line."""
    dirs = []
    for name in ("jax", "jaxlib", "mnjit", "hlo2onnx", "onnxscript", "onnx_ir", "onnx"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(os.path.join(os.path.realpath(d), "") for d in spec.submodule_search_locations)
    return tuple(dirs)


_LIBRARY_DIRS = _package_dirs()


@functools.lru_cache(maxsize=4096)
def _is_library(path: str) -> bool:
    return os.path.isabs(path) and os.path.realpath(path).startswith(_LIBRARY_DIRS)


def source_frames(location: object) -> list[str]:
    """Every `file:line` of an MLIR location's traceback (innermost first) outside jax, jaxlib, mnjit and
    hlo2onnx; library code the user calls (flax, optax, ...) counts as the user's."""
    return list(_frames(str(location)))


@functools.lru_cache(maxsize=4096)  # a model's ops share few locations; the translator asks for each op
def _frames(location: str) -> tuple[str, ...]:
    frames = []
    for match in _FILE_LINE.finditer(location):
        path = match.group(1)
        if _is_library(path):
            continue
        frame = f"{path}:{match.group(2)}"
        if frame not in frames:
            frames.append(frame)
    return tuple(frames)


def source_line(location: object) -> str | None:
    """The innermost frame of an MLIR location outside jax and mnjit (see `source_frames`)."""
    frames = source_frames(location)
    return frames[0] if frames else None


class Hlo2OnnxError(Exception):
    """Base class for every error hlo2onnx raises on purpose."""


class InvalidInputError(Hlo2OnnxError):
    """The input could not be read as StableHLO / HLO / jax.export."""


class UnsupportedOpError(Hlo2OnnxError):
    """A StableHLO op (or a form of one) that has no ONNX translation."""

    def __init__(self, op_name: str, where: str | None, detail: str = ""):
        self.op_name = op_name
        self.where = where
        message = f"unsupported op {op_name}"
        if detail:
            message += f": {detail}"
        if where:
            message += f" (at {where})"
        super().__init__(message)
