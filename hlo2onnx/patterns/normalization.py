"""Softmax, LogSoftmax, LayerNormalization, RMSNormalization and inference BatchNormalization.

The patterns are written against the canonical form (cleanup.py): keepdims
reductions, scalars broadcast by the elementwise ops, means as ReduceSum / n.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from hlo2onnx.patterns.base import Fusion, is_close, numpy_dtype, reduced_count, scalar, trailing_axes
from hlo2onnx.patterns.cleanup import const_array, known_dims, static_shape


def _single_axis(result: MatchResult, x: ir.Value, *axes: ir.Value) -> int | None:
    arrays = [const_array(a) for a in axes]
    if any(a is None for a in arrays) or any(a.tolist() != arrays[0].tolist() for a in arrays):
        result.fail("the reductions are over different or non-constant axes", list(axes))
        return None
    if arrays[0].size != 1:
        result.fail(f"reduces over axes {arrays[0].tolist()}; the ONNX op takes one axis", axes[0])
        return None
    return int(arrays[0].reshape(-1)[0])


def _row_max(op, x, max_axes):
    """max(x) kept as a broadcastable row, with or without the translator's NaN guard.

    The guard (NaN if any element is NaN, as XLA's max) changes nothing inside a
    (log-)softmax: a NaN anywhere in a row already makes the whole row NaN.
    """
    # The guard's axes are a value of their own: two equal constants need not be one initializer.
    guarded = op.Where(op.Cast(op.ReduceMax(op.Cast(op.IsNaN(x)), pattern.Var("nan_axes"), keepdims=0)),
                       pattern.Var("nan_fill"), op.ReduceMax(x, max_axes, keepdims=0))
    # Under symbolic shapes the row is unsqueezed (Reshape cannot spell two symbolic dims).
    return pattern.OrValue([op.ReduceMax(x, max_axes, keepdims=1), op.Reshape(guarded, _ignored_shape()),
                            op.Unsqueeze(guarded, pattern.Var("row_axes"))], tag_var=None)


def _ignored_shape():
    return pattern.Var("row_shape")


class Softmax(Fusion):
    """exp(x - max(x)) / sum(exp(x - max(x))): jax.nn.softmax and the hand-written form alike."""

    op_type = "Softmax"

    def pattern(self, op, x, max_axes, sum_axes):
        e = op.Exp(op.Sub(x, _row_max(op, x, max_axes)))
        return op.Div(e, op.ReduceSum(e, sum_axes, keepdims=1))

    def check(self, context, x, max_axes, sum_axes, nan_axes=None, **_) -> MatchResult:
        result = self.available(x)
        if result:
            self._axis = _single_axis(result, x, max_axes, sum_axes, *([nan_axes] if nan_axes is not None else []))
        return result

    def rewrite(self, op, x, **_):
        return getattr(op, self.op_type)(x, axis=self._axis)


class LogSoftmax(Softmax):
    """(x - max) - log(sum(exp(x - max))): jax.nn.log_softmax and stax.LogSoftmax."""

    op_type = "LogSoftmax"

    def pattern(self, op, x, max_axes, sum_axes):
        shifted = op.Sub(x, _row_max(op, x, max_axes))
        return op.Sub(shifted, op.Log(op.ReduceSum(op.Exp(shifted), sum_axes, keepdims=1)))


def _mean(op, x, axes, n):
    return pattern.OrValue([op.Div(op.ReduceSum(x, axes, keepdims=1), n), op.ReduceMean(x, axes, keepdims=1)],
                           tag_var=None)


def _normalize(op, d, var_eps, rsqrt: bool | None = None):
    """d / sqrt(v) or d * rsqrt(v) (lax.rsqrt translates to Reciprocal(Sqrt)); both unless `rsqrt` picks.

    The pattern matcher cannot end a pattern on a choice, so rules ending here pick one."""
    std = op.Sqrt(var_eps)
    if rsqrt is None:
        return pattern.OrValue([op.Div(d, std), op.Mul(d, op.Reciprocal(std))])
    return op.Mul(d, op.Reciprocal(std)) if rsqrt else op.Div(d, std)


def _check_mean_and_eps(fusion: Fusion, x, axes_list, counts, epsilon) -> MatchResult:
    result = fusion.available(x)
    if not result:
        return result
    first = [trailing_axes(x, a) for a in axes_list]
    if first[0] is None or any(f != first[0] for f in first):
        return result.fail("the reductions are not over the same last axes", list(axes_list))
    n = reduced_count(x, first[0])
    for count in counts:
        if count is not None and not is_close(count, n):
            return result.fail(f"divides by {scalar(count)}, not the reduced size {n}", count)
    if scalar(epsilon) is None:
        return result.fail("epsilon is not a scalar constant", epsilon)
    fusion._axis, fusion._epsilon = first[0], float(scalar(epsilon))
    return result


def _ones(op, x: ir.Value, first_axis: int):
    """A scale of ones over the normalized axes, as a ConstantOfShape (never a dense initializer)."""
    shape = list(known_dims(x)[first_axis:])
    # ir.Tensor and the attributes built here, not left to ir.tensor and the builder: they tell an array and a
    # tensor from their other cases by isinstance checks against protocols, ~20 us each (this runs per layer).
    fill = ir.AttrTensor("value", ir.Tensor(np.ones(1, numpy_dtype(x))))
    dims = ir.AttrTensor("value", ir.Tensor(np.asarray(shape, np.int64)))
    return op.ConstantOfShape(op.Constant(value=dims), value=fill)


class LayerNorm(Fusion):
    """(x - mean) / sqrt(var + eps) over the last axes, with mean and var written out in jnp."""

    op_type = "LayerNormalization"
    min_opset = 17
    rsqrt = False

    def pattern(self, op, x, axes1, n1, axes2, n2, epsilon):
        d = op.Sub(x, _mean(op, x, axes1, n1))
        square = pattern.OrValue([op.Mul(d, d), op.Pow(d, 2)])
        return _normalize(op, d, op.Add(_mean(op, square, axes2, n2), epsilon), self.rsqrt)

    def check(self, context, x, axes1, n1, axes2, n2, epsilon, **_) -> MatchResult:
        return _check_mean_and_eps(self, x, [axes1, axes2], [n1, n2], epsilon)

    def rewrite(self, op, x, **_):
        stash = ir.DataType.DOUBLE if numpy_dtype(x) == np.float64 else ir.DataType.FLOAT
        return op.LayerNormalization(x, _ones(op, x, self._axis), axis=self._axis, epsilon=self._epsilon,
                                     stash_type=stash)


class RMSNorm(Fusion):
    """x / sqrt(mean(x * x) + eps) over the last axes (ONNX has the op from opset 23)."""

    op_type = "RMSNormalization"
    min_opset = 23
    rsqrt = False

    def pattern(self, op, x, axes, n, epsilon):
        square = pattern.OrValue([op.Mul(x, x), op.Pow(x, 2)])
        return _normalize(op, x, op.Add(_mean(op, square, axes, n), epsilon), self.rsqrt)

    def check(self, context, x, axes, n, epsilon, **_) -> MatchResult:
        return _check_mean_and_eps(self, x, [axes], [n], epsilon)

    def rewrite(self, op, x, **_):
        stash = ir.DataType.DOUBLE if numpy_dtype(x) == np.float64 else ir.DataType.FLOAT
        return op.RMSNormalization(x, _ones(op, x, self._axis), axis=self._axis, epsilon=self._epsilon,
                                   stash_type=stash)


class LayerNormRsqrt(LayerNorm):
    rsqrt = True


class LayerNormClampedVar(LayerNorm):
    """equinox's LayerNorm: the variance clamped at 0 (max(0, var)) before eps, then rsqrt."""

    rsqrt = True

    def pattern(self, op, x, axes1, n1, axes2, n2, zero, epsilon):
        d = op.Sub(x, _mean(op, x, axes1, n1))
        square = pattern.OrValue([op.Mul(d, d), op.Pow(d, 2)])
        var = _mean(op, square, axes2, n2)
        clamped = pattern.OrValue([op.Max(zero, var), op.Relu(var)])
        return _normalize(op, d, op.Add(clamped, epsilon), self.rsqrt)

    def check(self, context, x, axes1, n1, axes2, n2, epsilon, zero=None, **_) -> MatchResult:
        # A variance is never negative, so the clamp changes nothing the fused op would compute.
        if zero is not None and scalar(zero) != 0:
            return MatchResult().fail(f"clamps the variance at {scalar(zero)}, not 0", zero)
        return super().check(context, x, axes1, n1, axes2, n2, epsilon)


class RMSNormRsqrt(RMSNorm):
    rsqrt = True


def _rows(op, stat, target, name: str):
    """A statistic (reduced without keepdims) given back its reduced axes as ones: a Reshape (its target a
    constant, or computed in the graph under symbolic dims) or, under symbolic dims, an Unsqueeze."""
    return pattern.OrValue([op.Reshape(stat, target), op.Unsqueeze(stat, target)], name=f"{name}_rows",
                           tag_var=f"{name}_form", tag_values=["Reshape", "Unsqueeze"])


def _not_rows(x: ir.Value, axis: int, rows: ir.Value, form: str, target: ir.Value) -> str | None:
    """Why `rows` (a statistic of x over its axes from `axis` on, reshaped) is not x's rows (x's leading dims,
    then ones), or None when it is."""
    x_dims, wanted = known_dims(x), const_array(target)
    rank = len(x_dims)
    if form == "Unsqueeze":
        if wanted is None or sorted(int(a) % rank for a in wanted.reshape(-1)) != list(range(axis, rank)):
            return f"unsqueezed at {None if wanted is None else wanted.tolist()}"
        return None
    if wanted is not None:
        kept = [d if i < axis else 1 for i, d in enumerate(x_dims)]
        return None if wanted.tolist() == kept else f"a target {wanted.tolist()}, not {kept}"
    # A target computed in the graph (symbolic dims). The Reshape's type gives x's rank, ones over the
    # normalized axes and the leading dims it knows; the others are x's: the Reshape keeps the statistic's
    # element count (the product of x's leading dims), and the translator broadcasts the result against x
    # (where jax spelled out a broadcast to x's shape), so each leading dim is 1 or x's, and a product of
    # such dims equal to the product of x's is x's own.
    dims = known_dims(rows)
    if static_shape(x) is not None or dims is None or len(dims) != rank:
        return f"a computed target to {dims}"
    if any(d != 1 for d in dims[axis:]) or any(d is not None and d != x_d for d, x_d in zip(dims[:axis], x_dims)):
        return f"a computed target to {dims}, not x's rows"
    return None


class LayerNormFastVariance(LayerNorm):
    """flax's LayerNorm: var = max(0, mean(x*x) - mean(x)^2) from reductions without keepdims (a Reshape makes
    the rows), and the scale multiplied into rsqrt(var + eps) before it meets x - mean. Becomes
    LayerNormalization(x) * g, which NormScale folds."""

    def pattern(self, op, x, axes1, n1, axes2, n2, zero, epsilon, g, mean_shape, var_shape):
        mean = op.Div(op.ReduceSum(x, axes1, keepdims=0), n1)
        mean_square = op.Div(op.ReduceSum(op.Mul(x, x), axes2, keepdims=0), n2)
        var = op.Sub(mean_square, op.Mul(mean, mean))
        var = pattern.OrValue([op.Max(zero, var), op.Relu(var)])
        inv = op.Reciprocal(op.Sqrt(op.Add(_rows(op, var, var_shape, "var"), epsilon)))
        return op.Mul(op.Sub(x, _rows(op, mean, mean_shape, "mean")), op.Mul(inv, g))

    def check(self, context, x, axes1, n1, axes2, n2, epsilon, g, mean_shape, var_shape, zero=None,
              **bound) -> MatchResult:
        result = _check_mean_and_eps(self, x, [axes1, axes2], [n1, n2], epsilon)
        if not result:
            return result
        if zero is not None and scalar(zero) != 0:
            return result.fail(f"clamps the variance at {scalar(zero)}, not 0", zero)
        for name, shape in (("mean", mean_shape), ("var", var_shape)):
            why = _not_rows(x, self._axis, bound[f"{name}_rows"], bound[f"{name}_form"], shape)
            if why is not None:
                return result.fail(f"the {name} is not reshaped to the rows: {why}", shape)
        return result

    def rewrite(self, op, x, g, **_):
        return op.Mul(super().rewrite(op, x), g)


class RMSNormScaledInverse(RMSNorm):
    """flax's RMSNorm (linen and nnx): mean(x*x) reduced without keepdims and reshaped to the rows, and the scale
    multiplied into rsqrt(ms + eps) before it meets x. Becomes RMSNormalization(x) * g, which RMSNormScale folds."""

    def pattern(self, op, x, axes, n, epsilon, g, ms_shape):
        mean_square = op.Div(op.ReduceSum(op.Mul(x, x), axes, keepdims=0), n)
        inv = op.Reciprocal(op.Sqrt(op.Add(_rows(op, mean_square, ms_shape, "ms"), epsilon)))
        return op.Mul(x, op.Mul(inv, g))

    def check(self, context, x, axes, n, epsilon, ms_shape, **bound) -> MatchResult:
        result = _check_mean_and_eps(self, x, [axes], [n], epsilon)
        why = result and _not_rows(x, self._axis, bound["ms_rows"], bound["ms_form"], ms_shape)
        return result.fail(f"the mean square is not reshaped to the rows: {why}", ms_shape) if why else result

    def rewrite(self, op, x, g, **_):
        return op.Mul(super().rewrite(op, x), g)


class RMSNormInverseRows(RMSNorm):
    """equinox's RMSNorm: rsqrt(mean(x*x) + eps) over reductions without keepdims, reshaped to the rows after."""

    def pattern(self, op, x, axes, n, epsilon, inv_shape):
        inv = op.Reciprocal(op.Sqrt(op.Add(op.Div(op.ReduceSum(op.Mul(x, x), axes, keepdims=0), n), epsilon)))
        return op.Mul(_rows(op, inv, inv_shape, "inv"), x)

    def check(self, context, x, axes, n, epsilon, inv_shape, **bound) -> MatchResult:
        result = _check_mean_and_eps(self, x, [axes], [n], epsilon)
        why = result and _not_rows(x, self._axis, bound["inv_rows"], bound["inv_form"], inv_shape)
        return result.fail(f"the inverse is not reshaped to the rows: {why}", inv_shape) if why else result


def _normalized_shape_of(node: ir.Node) -> list[int] | None:
    x_shape = known_dims(node.inputs[0])
    axis = node.attributes["axis"].as_int()
    if x_shape is None or None in x_shape[axis % len(x_shape):]:
        return None
    return list(x_shape[axis % len(x_shape):])


def _is_ones(value: ir.Value) -> bool:
    producer = value.producer()
    if producer is None or producer.op_type != "ConstantOfShape":
        return False
    return bool((producer.attributes["value"].as_tensor().numpy() == 1).all())


def _fits(param: ir.Value, shape: list[int]) -> bool:
    """`param` broadcasts over the normalized axes only: it has their shape, up to leading ones."""
    param_shape = static_shape(param)
    if param_shape is None or len(param_shape) > len(shape) + 8:
        return False
    stripped = list(param_shape)
    while stripped and stripped[0] == 1 and len(stripped) > len(shape):
        stripped.pop(0)
    return stripped == shape


class NormScale(Fusion):
    """LayerNormalization(x) * g, or RMSNormalization: g becomes the op's scale."""

    op_type = "LayerNormalization"
    min_opset = 17

    def pattern(self, op, x, ones, g):
        return op.Mul(op.LayerNormalization(x, ones, _outputs=["normed"]), g)

    def check(self, context, x, ones, g, normed, **_) -> MatchResult:
        result = MatchResult()
        self._shape = _normalized_shape_of(normed.producer())
        if not _is_ones(ones) or len(normed.producer().inputs) > 2:
            return result.fail("the normalization already has a scale or a bias", ones)
        if self._shape is None or not _fits(g, self._shape):
            return result.fail(f"the factor's shape {static_shape(g)} is not the normalized {self._shape}", g)
        return result

    def rewrite(self, op, x, ones, g, normed, **_):
        node = normed.producer()
        if static_shape(g) != tuple(self._shape):
            g = op.Reshape(g, op.Constant(value=ir.tensor(np.asarray(self._shape, np.int64))))
        return getattr(op, self.op_type)(x, g, **node.attributes)


class NormBias(NormScale):
    """LayerNormalization(x, g) + b: b becomes the op's bias."""

    def pattern(self, op, x, g, b):
        return op.Add(op.LayerNormalization(x, g, _outputs=["normed"]), b)

    def check(self, context, x, g, b, normed, **_) -> MatchResult:
        result = MatchResult()
        self._shape = _normalized_shape_of(normed.producer())
        if self._shape is None or not _fits(b, self._shape):
            return result.fail(f"the bias's shape {static_shape(b)} is not the normalized {self._shape}", b)
        return result

    def rewrite(self, op, x, g, b, normed, **_):
        node = normed.producer()
        if static_shape(b) != tuple(self._shape):
            b = op.Reshape(b, op.Constant(value=ir.tensor(np.asarray(self._shape, np.int64))))
        return op.LayerNormalization(x, g, b, **node.attributes)


class RMSNormScale(NormScale):
    op_type = "RMSNormalization"
    min_opset = 23

    def pattern(self, op, x, ones, g):
        return op.Mul(op.RMSNormalization(x, ones, _outputs=["normed"]), g)


class BatchNorm(Fusion):
    """(x - mean) / sqrt(var + eps) * g + b with per-channel (axis 1) statistics: inference BatchNormalization."""

    op_type = "BatchNormalization"

    def pattern(self, op, x, mean, var, epsilon, g, b):
        return op.Add(op.Mul(_normalize(op, op.Sub(x, mean), op.Add(var, epsilon)), g), b)

    def check(self, context, x, mean, var, epsilon, g, b, **_) -> MatchResult:
        result = self.available(x)
        shape = known_dims(x)  # a symbolic batch is fine; the channels must be static
        if not result or shape is None or len(shape) < 2 or shape[1] is None:
            return result if not result else result.fail("needs a static input of rank 2 or more", x)
        self._channels = shape[1]
        per_channel = [shape[1]] + [1] * (len(shape) - 2)
        for param in (mean, var, g, b):
            if not _fits(param, per_channel):
                return result.fail(f"shape {static_shape(param)} is not per channel {per_channel}", param)
        if scalar(epsilon) is None:
            return result.fail("epsilon is not a scalar constant", epsilon)
        self._epsilon = float(scalar(epsilon))
        return result

    def rewrite(self, op, x, mean, var, g, b, **_):
        channels = op.Constant(value=ir.tensor(np.asarray([self._channels], np.int64)))
        flat = [v if static_shape(v) == (self._channels,) else op.Reshape(v, channels) for v in (g, b, mean, var)]
        return op.BatchNormalization(x, *flat, epsilon=self._epsilon)


def rules(opset: int, target) -> list:
    return [rule
            for cls in (Softmax, LogSoftmax, LayerNorm, LayerNormRsqrt, LayerNormClampedVar, LayerNormFastVariance,
                        NormScale, NormBias, RMSNorm, RMSNormRsqrt, RMSNormScaledInverse, RMSNormInverseRows,
                        RMSNormScale, BatchNorm)
            if opset >= cls.min_opset
            for rule in cls.rule(opset, target).commute()]
