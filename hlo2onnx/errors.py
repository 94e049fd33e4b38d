"""Errors raised by hlo2onnx. Each names the StableHLO op and the user's source line."""
from __future__ import annotations

import re

_FILE_LINE = re.compile(r'"([^"]+)":(\d+)(?::(\d+))?')


def source_line(location: object) -> str | None:
    """The innermost `file:line` of an MLIR location (JAX already drops its own frames)."""
    match = _FILE_LINE.search(str(location))
    return f"{match.group(1)}:{match.group(2)}" if match else None


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
