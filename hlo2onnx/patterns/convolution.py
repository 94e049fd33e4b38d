"""Convolution fusions: the bias add into Conv, per-channel scale-and-shift into BatchNormalization, and an
inference BatchNormalization with constant parameters folded into the Conv before it.

With mnjit the weights and statistics are usually inputs, not constants: then
`(x - mean) * scale + shift` over channels becomes one BatchNormalization (its
variance 1 and epsilon 0 make it exactly that affine map), and only a model
with baked-in parameters (closed-over constants) gets the BatchNormalization
folded into the convolution's weights.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult

from hlo2onnx.patterns.base import Fusion, numpy_dtype, scalar
from hlo2onnx.patterns.cleanup import const_array, static_shape


def _per_channel(value: ir.Value, channels: int, rank: int) -> bool:
    """`value` broadcasts along axis 1 of a rank-`rank` tensor only: [C, 1, ...] up to leading ones."""
    shape = static_shape(value)
    if shape is None or len(shape) > rank:
        return False
    full = (1,) * (rank - len(shape)) + shape
    return full[0] == 1 and full[1] == channels and all(d == 1 for d in full[2:])


def _vector(op, value: ir.Value, channels: int):
    """`value` as a [C] vector: the vector a Reshape made it from, or a new Reshape."""
    producer = value.producer()
    if producer is not None and producer.op_type == "Reshape" and static_shape(producer.inputs[0]) == (channels,):
        return producer.inputs[0]
    if static_shape(value) == (channels,):
        return value
    array = const_array(value)
    if array is not None:  # stays a constant, so a later fold can read it
        return op.Constant(value=ir.tensor(array.reshape(channels)))
    return op.Reshape(value, op.Constant(value=ir.tensor(np.asarray([channels], np.int64))))


def _channels(result: MatchResult, y: ir.Value, *params: ir.Value) -> int | None:
    """The channel count of `y` (axis 1) when every param is per channel; explains a miss in `result`."""
    shape = static_shape(y)
    if shape is None or len(shape) < 2:
        result.fail("needs a static shape of rank 2 or more", y)
        return None
    for param in params:
        if not _per_channel(param, shape[1], len(shape)):
            result.fail(f"shape {static_shape(param)} is not per channel (axis 1 of {list(shape)})", param)
            return None
    return shape[1]


class ConvBias(Fusion):
    """Conv(x, w) + b with b per output channel -> Conv(x, w, b)."""

    op_type = "Conv"

    def pattern(self, op, x, w, b):
        return op.Add(op.Conv(x, w, _outputs=["conv"]), b)

    def check(self, context, x, w, b, conv, **_) -> MatchResult:
        result = self.available(x)
        if result:
            self._channels = _channels(result, conv, b)
        return result

    def rewrite(self, op, x, w, b, conv, **_):
        return op.Conv(x, w, _vector(op, b, self._channels), **conv.producer().attributes)


class ScaleShift(Fusion):
    """(x - mean) * scale + shift with per-channel (axis 1) parameters -> BatchNormalization(var=1, epsilon=0)."""

    op_type = "BatchNormalization"

    def pattern(self, op, x, mean, scale, shift):
        return op.Add(op.Mul(op.Sub(x, mean, _outputs=["centered"]), scale), shift)

    def check(self, context, x, mean, scale, shift, centered, **_) -> MatchResult:
        result = self.available(x)
        if result and (scale is centered or shift is centered):  # (x - m)^2 + c: the Sub goes, its value stays
            return result.fail("x - mean is also the scale or the shift", centered)
        if result:
            self._channels = _channels(result, x, mean, scale, shift)
        if result and static_shape(x) and len(static_shape(x)) < 3:
            return result.fail("a rank-2 input is a plain affine map, left to Gemm-style fusions", x)
        return result

    def rewrite(self, op, x, mean, scale, shift, **_):
        c = self._channels
        ones = op.Constant(value=ir.tensor(np.ones(c, numpy_dtype(x))))
        return op.BatchNormalization(x, _vector(op, scale, c), _vector(op, shift, c), _vector(op, mean, c), ones,
                                     epsilon=0.0)


class BatchNormStats(Fusion):
    """BatchNormalization(x, g / sqrt(var + eps), shift, mean, 1, epsilon=0) -> BatchNormalization(x, g, shift,
    mean, var, epsilon=eps): the usual inference form, once ScaleShift has matched the scale computed apart."""

    op_type = "BatchNormalization"

    def pattern(self, op, x, g, var, eps, shift, mean, ones):
        scale = op.Div(g, op.Sqrt(op.Add(var, eps)))
        return op.BatchNormalization(x, scale, shift, mean, ones, _outputs=["normed"])

    def check(self, context, x, g, var, eps, shift, mean, ones, normed, **_) -> MatchResult:
        result = MatchResult()
        node = normed.producer()
        unit = const_array(ones)
        if unit is None or not (unit == 1).all() or node.attributes["epsilon"].as_float() != 0:
            return result.fail("the normalization already has a variance or an epsilon", ones)
        if scalar(eps) is None:
            return result.fail("epsilon is not a scalar constant", eps)
        if static_shape(g) != static_shape(ones) or static_shape(var) != static_shape(ones):
            return result.fail(f"g {static_shape(g)} and var {static_shape(var)} are not [C] vectors", [g, var])
        return result

    def rewrite(self, op, x, g, var, eps, shift, mean, **_):
        return op.BatchNormalization(x, g, shift, mean, var, epsilon=float(scalar(eps)))


class ConvBatchNorm(Fusion):
    """BatchNormalization(Conv(x, w)) with constant weights and statistics -> Conv(x, w', b')."""

    op_type = "Conv"

    def pattern(self, op, x, w, scale, shift, mean, var):
        return op.BatchNormalization(op.Conv(x, w, _outputs=["conv"]), scale, shift, mean, var, _outputs=["normed"])

    def check(self, context, x, w, scale, shift, mean, var, conv, normed, b=None, **_) -> MatchResult:
        result = self.available(x)
        if not result:
            return result
        inputs = {"w": w, "scale": scale, "shift": shift, "mean": mean, "var": var}
        if b is not None:
            inputs["the conv's bias"] = b
        for name, value in inputs.items():
            if const_array(value) is None:
                return result.fail(f"{name} is not a constant (an input): the fold needs every parameter baked in",
                                   value)
        if len(normed.producer().outputs) > 1:
            return result.fail("a training-mode BatchNormalization (it has running-statistics outputs)", normed)
        return result

    def rewrite(self, op, x, w, scale, shift, mean, var, conv, normed, b=None, **_):
        attr = normed.producer().attributes.get("epsilon")
        epsilon = attr.as_float() if attr is not None else 1e-5
        w_array = const_array(w)
        factor = const_array(scale) / np.sqrt(const_array(var).astype(np.float64) + epsilon)
        bias = const_array(b) if b is not None else np.zeros(w_array.shape[0])
        new_w = (w_array * factor.reshape((-1,) + (1,) * (w_array.ndim - 1))).astype(w_array.dtype)
        new_b = ((bias - const_array(mean)) * factor + const_array(shift)).astype(w_array.dtype)
        return op.Conv(x, op.Constant(value=ir.tensor(new_w)), op.Constant(value=ir.tensor(new_b)),
                       **conv.producer().attributes)


class ConvBiasBatchNorm(ConvBatchNorm):
    """The same with a Conv that already has a bias."""

    def pattern(self, op, x, w, b, scale, shift, mean, var):
        return op.BatchNormalization(op.Conv(x, w, b, _outputs=["conv"]), scale, shift, mean, var,
                                     _outputs=["normed"])


def rules(opset: int, target) -> list:
    return [rule for cls in (ConvBias, ScaleShift) for rule in cls.rule(opset, target).commute()]


def late_rules(opset: int, target) -> list:
    """Rules over the BatchNormalization nodes the first fusions make."""
    return [rule for cls in (BatchNormStats, ConvBatchNorm, ConvBiasBatchNorm)
            for rule in cls.rule(opset, target).commute()]
