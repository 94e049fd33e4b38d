"""What every fusion rule shares: the opset and target it fuses for, and the checks that explain a miss."""
from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from hlo2onnx.patterns.cleanup import const_array, known_dims
from hlo2onnx.targets import Target


class Fusion(pattern.RewriteRuleClassBase):
    """A rule that fuses a subgraph into `op_type`, from `min_opset` on, for float dtypes the target runs."""

    op_type: ClassVar[str]
    min_opset: ClassVar[int] = 1

    def __init__(self, opset: int, target: Target):
        super().__init__(type(self).__name__)
        self.opset, self.target = opset, target

    def available(self, x: ir.Value, op_type: str | None = None) -> MatchResult:
        result = MatchResult()
        op_type = op_type or self.op_type
        dtype = numpy_dtype(x)
        if dtype is None or dtype.kind != "f":
            return result.fail(f"{op_type} needs a float input, not {x.dtype}", x)
        if not self.target.supports(op_type, dtype):
            return result.fail(f"{self.target.name} has no {op_type} kernel for {dtype}", x)
        return result


def numpy_dtype(value: ir.Value) -> np.dtype | None:
    return None if value.dtype is None else np.dtype(value.dtype.numpy())


def scalar(value: ir.Value | None) -> float | None:
    """The value of a one-element constant."""
    array = const_array(value)
    return None if array is None or array.size != 1 else array.reshape(()).item()


def is_close(value: ir.Value | None, expected: float, rtol: float = 1e-6) -> bool:
    found = scalar(value)
    return found is not None and bool(np.isclose(found, expected, rtol=rtol, atol=0))


def trailing_axes(x: ir.Value, axes: ir.Value) -> int | None:
    """The first axis when `axes` (a constant) are exactly x's last axes, as the normalizations need; those
    must be static (leading axes may be symbolic)."""
    shape, array = known_dims(x), const_array(axes)
    if shape is None or array is None or array.ndim != 1 or array.size == 0:
        return None
    rank = len(shape)
    picked = sorted({int(a) % rank for a in array.tolist()})
    if picked != list(range(picked[0], rank)) or None in shape[picked[0]:]:
        return None
    return picked[0]


def reduced_count(x: ir.Value, first_axis: int) -> int:
    return int(np.prod(known_dims(x)[first_axis:]))
