"""One small unit test per fusion rule (every base.Fusion subclass in hlo2onnx.patterns).

Each row gives a function the rule must fuse and a near miss it must refuse. The first is translated:
the rule must be among the fusions that fired, its op in the graph, and the model must still match jax.jit.
The second is translated too: the rule must not have fired, and trying it at every node of the result
must fail with its own fail() message (read through onnxscript's MatchingTracer), so a refusal says why.
"""
from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from jax import lax
from onnxscript.rewriter import pattern

import hlo2onnx
import hlo2onnx.patterns
from harness import assert_same, rand
from hlo2onnx import targets
from hlo2onnx.patterns import activations, attention, convolution, folding, fusions, normalization
from hlo2onnx.patterns.base import Fusion
from mnjit import mnjit

F32, F64 = np.float32, np.float64
TOL = (1e-5, 1e-5)
x48 = rand((4, 8), seed=3)
x48_64 = rand((4, 8), F64, seed=3)
x3d = rand((2, 5, 8), seed=4)
g8, b8 = rand((8,), seed=5, low=0.5, high=1.5), rand((8,), seed=6)
g58 = rand((5, 8), seed=7)
x_nchw, w_oihw = rand((2, 3, 6, 6), seed=8), rand((4, 3, 3, 3), seed=9)
c4, mean4 = rand((4,), seed=10), rand((4,), seed=11)
var4, g4 = rand((4,), seed=12, low=0.5, high=1.5), rand((4,), seed=13, low=0.5, high=1.5)
qkv = tuple(rand((2, 3, 5, 4), seed=s) for s in (20, 21, 22))


def per_channel(v):
    return v.reshape(1, -1, 1, 1)


def conv(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))


def mean_norm(x, n=None, rsqrt=False, clamp=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) over the last axis; `n` replaces the variance's divisor, `clamp` is
    max(clamp, var), `rsqrt` multiplies by lax.rsqrt."""
    d = x - x.mean(-1, keepdims=True)
    var = (d * d).sum(-1, keepdims=True) / (x.shape[-1] if n is None else n)
    var = var if clamp is None else jnp.maximum(clamp, var)
    return d * lax.rsqrt(var + eps) if rsqrt else d / jnp.sqrt(var + eps)


def rms(x, n=None, rsqrt=False, eps=1e-6):
    ms = (x * x).sum(-1, keepdims=True) / (x.shape[-1] if n is None else n)
    return x * lax.rsqrt(ms + eps) if rsqrt else x / jnp.sqrt(ms + eps)


def fast_variance_norm(x, g, clamp=0.0, eps=1e-6):
    """flax's LayerNorm: statistics without keepdims, var = max(0, E[x^2] - E[x]^2), scale in the rsqrt."""
    mean, mean2 = x.mean(-1), (x * x).mean(-1)
    var = jnp.maximum(clamp, mean2 - mean * mean)
    return (x - mean[..., None]) * (lax.rsqrt(var[..., None] + eps) * g)


def scaled_inverse_rms(x, g, n=None, eps=1e-6):
    """flax's RMSNorm: the mean square without keepdims, the scale in the rsqrt."""
    ms = (x * x).sum(-1) / (x.shape[-1] if n is None else n)
    return x * (lax.rsqrt(ms[..., None] + eps) * g)


def inverse_rows_rms(x, n=None, eps=1e-6):
    """equinox's RMSNorm: rsqrt of the mean square without keepdims, given its rows after."""
    ms = (x * x).sum(-1) / (x.shape[-1] if n is None else n)
    return lax.rsqrt(ms + eps)[..., None] * x


def batch_norm(x, mean, var, g, b, eps=1e-3):
    return (x - mean) / jnp.sqrt(var + eps) * g + b


def softmax_over(axes):
    def fun(x):
        e = jnp.exp(x - x.max(axes, keepdims=True))
        return e / e.sum(axes, keepdims=True)
    return fun


def log_softmax_over(axes):
    def fun(x):
        shifted = x - x.max(axes, keepdims=True)
        return shifted - jnp.log(jnp.exp(shifted).sum(axes, keepdims=True))
    return fun


def gelu_tanh(k):
    def fun(x):
        return x * (0.5 * (1.0 + jnp.tanh(F32(math.sqrt(2 / math.pi)) * (x + F32(k) * x ** 3))))
    return fun


def attend(scale="div", axis=-1):
    def fun(q, k, v):
        scores = q @ k.transpose(0, 1, 3, 2)
        scores = scores / F32(2) if scale == "div" else scores * F32(0.5) if scale == "mul" else scores
        return jax.nn.softmax(scores, axis=axis) @ v
    return fun


def baked_conv_bn(bias: bool, baked: bool = True):
    """BatchNormalization after a Conv; `baked`: weights and statistics closed over (constants)."""
    def fun(x, *stats):
        m, v, g, b = (mean4, var4, g4, c4) if baked else stats
        y = conv(x, w_oihw) + (per_channel(c4) if bias else 0)
        return (y - per_channel(m)) * per_channel(g / jnp.sqrt(v + 1e-5)) + per_channel(b)
    return fun


def hard_sigmoid_other_slope() -> ir.Model:
    """x * HardSigmoid(x, alpha=0.2): no jnp function makes it (HardSigmoid fuses with alpha 1/6 only)."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("HardSigmoid", ["x"], ["hs"], alpha=0.2, beta=0.5),
         onnx.helper.make_node("Mul", ["x", "hs"], ["y"])], "near_miss",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 8])])
    proto = onnx.shape_inference.infer_shapes(onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", hlo2onnx.DEFAULT_OPSET)]))
    return ir.serde.deserialize_model(proto)


def matmul_rank3_bias() -> ir.Model:
    """MatMul(a, w) + c with c of shape [2, 4, 6]: jnp would broadcast the product first, so build it by hand."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["a", "w"], ["p"]), onnx.helper.make_node("Add", ["p", "c"], ["y"])],
        "near_miss",
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)
         for name, shape in (("a", [4, 8]), ("w", [8, 6]), ("c", [2, 4, 6]))],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4, 6])])
    proto = onnx.shape_inference.infer_shapes(onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", hlo2onnx.DEFAULT_OPSET)]))
    return ir.serde.deserialize_model(proto)


@dataclass
class Row:
    rule: type[Fusion]
    fire: Callable  # the rule must fuse this...
    fire_args: tuple
    fused: str  # ...into a graph holding this op
    miss: Callable | None  # a near miss it must refuse (None: `miss_model` builds the graph)
    miss_args: tuple
    reason: str  # in the fail() message the near miss gets
    opset: int = hlo2onnx.DEFAULT_OPSET
    x64: bool = False  # the near miss runs in float64
    miss_target: str = "ort-cpu"
    miss_model: Callable[[], ir.Model] | None = None

    def __repr__(self) -> str:
        return self.rule.__name__

    def rules(self, target, args) -> list[pattern.RewriteRule]:
        """The rule as `optimize` builds it, with its commuted copies; templated rules for `args`' dtype."""
        extra = (np.dtype(args[0].dtype).name,) if self.rule in (activations.Erf, activations.Gelu) else ()
        if self.rule in (activations.Erf, activations.Gelu, activations.GeluTanh, activations.Softplus):
            return [self.rule.rule(self.opset, target, *extra)]  # long patterns are not commuted (see rules())
        return self.rule.rule(self.opset, target, *extra).commute()


def _t(*shape, seed=0):
    return rand(shape, seed=seed)


ROWS = [
    # activations.py
    Row(activations.Erf, lax.erf, (x48,), "Erf", lax.erf, (x48_64,), "has no Erf kernel for float64", x64=True),
    Row(activations.Gelu, lambda x: jax.nn.gelu(x, approximate=False), (x48,), "Gelu",
        lambda x: jax.nn.gelu(x, approximate=False), (x48_64,), "has no Gelu kernel for float64", x64=True),
    Row(activations.GeluFromErf, lambda x: 0.5 * x * (1 + lax.erf(x * F32(math.sqrt(0.5)))), (x48,), "Gelu",
        lambda x: 0.5 * x * (1 + lax.erf(x * F32(0.6))), (x48,), "scale is 0.6"),
    Row(activations.GeluFromErfDiv, lambda x: 0.5 * x * (1 + lax.erf(x / F32(math.sqrt(2)))), (x48,), "Gelu",
        lambda x: 0.5 * x * (1 + lax.erf(x / F32(1.5))), (x48,), "scale is 1.5"),
    Row(activations.GeluTanh, lambda x: jax.nn.gelu(x, approximate=True), (x48,), "Gelu",
        gelu_tanh(0.05), (x48,), "k is 0.05"),
    Row(activations.Softplus, jax.nn.softplus, (x48,), "Softplus",
        jax.nn.softplus, (x48_64,), "has no Softplus kernel for float64", x64=True),
    Row(activations.HardSigmoid, jax.nn.hard_sigmoid, (x48,), "HardSigmoid",
        lambda x: jnp.minimum(jnp.maximum(x + 3.0, 0.0), 6.0) / 5.0, (x48,), "six2 is 5"),
    Row(activations.HardSwish, jax.nn.hard_swish, (x48,), "HardSwish",
        None, (), "other alpha and beta", miss_model=hard_sigmoid_other_slope),
    Row(activations.Clip, lambda x: jnp.clip(x, -1.0, 2.0), (x48,), "Clip",
        lambda x, lo: jnp.minimum(jnp.maximum(x, lo), 2.0), (x48, _t(4, 8, seed=1)), "bounds are not scalar"),
    Row(activations.Relu, jax.nn.relu, (x48,), "Relu",
        lambda x: jnp.maximum(x, jnp.zeros((3, 4, 8), F32)), (x48,), "max broadcasts x"),
    Row(activations.LeakyRelu, lambda x: jax.nn.leaky_relu(x, 0.2), (x48,), "LeakyRelu",
        lambda x, a: jnp.where(x >= 0, x, a * x), (x48, _t(4, 8, seed=1)), "slope is not a scalar constant"),
    Row(activations.Sigmoid, jax.nn.sigmoid, (x48,), "Sigmoid",
        lambda x: 1 / (2 + jnp.exp(-x)), (x48,), "is 2.0, not 1"),
    Row(activations.Swish, jax.nn.silu, (x48,), "Swish",
        jax.nn.silu, (x48,), "core has no Swish kernel", opset=24, miss_target="core"),
    # normalization.py
    Row(normalization.Softmax, jax.nn.softmax, (x48,), "Softmax",
        softmax_over((1, 2)), (x3d,), "the ONNX op takes one axis"),
    Row(normalization.LogSoftmax, jax.nn.log_softmax, (x48,), "LogSoftmax",
        log_softmax_over((1, 2)), (x3d,), "the ONNX op takes one axis"),
    Row(normalization.LayerNorm, mean_norm, (x3d,), "LayerNormalization",
        lambda x: mean_norm(x, n=3.0), (x3d,), "divides by 3.0, not the reduced size 8"),
    Row(normalization.LayerNormRsqrt, lambda x: mean_norm(x, rsqrt=True), (x3d,), "LayerNormalization",
        lambda x: mean_norm(x, n=3.0, rsqrt=True), (x3d,), "divides by 3.0, not the reduced size 8"),
    Row(normalization.LayerNormClampedVar, lambda x: mean_norm(x, rsqrt=True, clamp=0.0), (x3d,),
        "LayerNormalization", lambda x: mean_norm(x, rsqrt=True, clamp=0.5), (x3d,), "clamps the variance at 0.5"),
    Row(normalization.LayerNormFastVariance, fast_variance_norm, (x3d, g8), "LayerNormalization",
        lambda x, g: fast_variance_norm(x, g, clamp=0.5), (x3d, g8), "clamps the variance at 0.5"),
    Row(normalization.NormScale, lambda x, g: mean_norm(x) * g, (x3d, g8), "LayerNormalization",
        lambda x, g: mean_norm(x) * g, (x3d, g58), "is not the normalized [8]"),
    Row(normalization.NormBias, lambda x, g, b: mean_norm(x) * g + b, (x3d, g8, b8), "LayerNormalization",
        lambda x, g, b: mean_norm(x) * g + b, (x3d, g8, g58), "the bias's shape (1, 5, 8)"),
    Row(normalization.RMSNorm, rms, (x3d,), "RMSNormalization",
        lambda x: rms(x, n=3.0), (x3d,), "divides by 3.0, not the reduced size 8", opset=23),
    Row(normalization.RMSNormRsqrt, lambda x: rms(x, rsqrt=True), (x3d,), "RMSNormalization",
        lambda x: rms(x, n=3.0, rsqrt=True), (x3d,), "divides by 3.0, not the reduced size 8", opset=23),
    Row(normalization.RMSNormScaledInverse, scaled_inverse_rms, (x3d, g8), "RMSNormalization",
        lambda x, g: scaled_inverse_rms(x, g, n=3.0), (x3d, g8), "divides by 3.0, not the reduced size 8", opset=23),
    Row(normalization.RMSNormInverseRows, inverse_rows_rms, (x3d,), "RMSNormalization",
        lambda x: inverse_rows_rms(x, n=3.0), (x3d,), "divides by 3.0, not the reduced size 8", opset=23),
    Row(normalization.RMSNormScale, lambda x, g: rms(x, rsqrt=True) * g, (x3d, g8), "RMSNormalization",
        lambda x, g: rms(x, rsqrt=True) * g, (x3d, g58), "is not the normalized [8]", opset=23),
    Row(normalization.BatchNorm,
        lambda x, m, v, g, b: batch_norm(x, *map(per_channel, (m, v, g, b))),
        (_t(2, 3, 4, 5, seed=1), _t(3, seed=2), rand((3,), seed=3, low=0.5, high=2), _t(3, seed=4), _t(3, seed=5)),
        "BatchNormalization",
        lambda x, m, v, g, b: batch_norm(x, m, *map(per_channel, (v, g, b))),
        (_t(2, 3, 4, 5, seed=1), _t(1, 3, 1, 5, seed=2), rand((3,), seed=3, low=0.5, high=2), _t(3, seed=4),
         _t(3, seed=5)), "(1, 3, 1, 5) is not per channel"),
    # fusions.py
    Row(fusions.MatMulBias, lambda x, w, b: x @ w + b, (x48, _t(8, 6, seed=1), _t(6, seed=2)), "Gemm",
        None, (), "does not broadcast to [4, 6]", miss_model=matmul_rank3_bias),
    Row(fusions.MatMulTranspose, lambda x, w: x @ w.T, (x48, _t(6, 8, seed=1)), "Gemm",
        lambda x, w: x @ w, (x48, _t(8, 6, seed=1)), "no operand is a transpose"),
    # attention.py
    Row(attention.Attention, attend("div"), qkv, "Attention", attend("div", axis=-2), qkv, "not the keys' axis",
        opset=23),
    Row(attention.AttentionMul, attend("mul"), qkv, "Attention", attend("mul", axis=-2), qkv,
        "not the keys' axis", opset=23),
    Row(attention.AttentionUnscaled, attend(None), qkv, "Attention", attend(None, axis=-2), qkv,
        "not the keys' axis", opset=23),
    # convolution.py
    Row(convolution.ConvBias, lambda x, w, b: conv(x, w) + per_channel(b), (x_nchw, w_oihw, c4), "Conv",
        lambda x, w, b: conv(x, w) + b, (x_nchw, w_oihw, _t(6, seed=1)), "is not per channel"),
    Row(convolution.ScaleShift, lambda x, m, s, b: (x - per_channel(m)) * per_channel(s) + per_channel(b),
        (x_nchw, _t(3, seed=1), _t(3, seed=2), _t(3, seed=3)), "BatchNormalization",
        lambda x, m, s, b: (x - m) * s + b, (x48, _t(8, seed=1), _t(8, seed=2), _t(8, seed=3)),
        "a rank-2 input is a plain affine map"),
    Row(convolution.BatchNormStats,
        lambda x, m, v, g, b: (x - per_channel(m)) * per_channel(g / jnp.sqrt(v + 1e-5)) + per_channel(b),
        (x_nchw, _t(3, seed=1), rand((3,), seed=2, low=0.5, high=2), _t(3, seed=3), _t(3, seed=4)),
        "BatchNormalization",
        lambda x, m, v, e, g, b: (x - per_channel(m)) * per_channel(g / jnp.sqrt(v + e)) + per_channel(b),
        (x_nchw, _t(3, seed=1), rand((3,), seed=2, low=0.5, high=2), rand((), seed=5, low=0.1, high=0.2),
         _t(3, seed=3), _t(3, seed=4)), "epsilon is not a scalar constant"),
    Row(convolution.ConvBatchNorm, baked_conv_bn(bias=False), (x_nchw,), "Conv",
        baked_conv_bn(bias=False, baked=False), (x_nchw, mean4, var4, g4, c4), "is not a constant"),
    Row(convolution.ConvBiasBatchNorm, baked_conv_bn(bias=True), (x_nchw,), "Conv",
        baked_conv_bn(bias=True, baked=False), (x_nchw, mean4, var4, g4, c4), "is not a constant"),
]


def _scope(x64: bool):
    return jax.enable_x64(True) if x64 else contextlib.nullcontext()


def _translate(fun, args, opset, target="ort-cpu", fuse=True) -> hlo2onnx.ConversionReport:
    return hlo2onnx.translate_report(jax.jit(fun).lower(*args).compiler_ir("stablehlo"), opset=opset, target=target,
                                     fuse=fuse)


def test_every_fusion_has_a_row():
    """A new Fusion subclass needs its row here."""
    def subclasses(cls):
        return {cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))}
    defined = {cls for cls in subclasses(Fusion) - {Fusion} if cls.__module__.startswith("hlo2onnx.patterns.")}
    assert defined == {row.rule for row in ROWS}


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_fires(row: Row):
    report = _translate(row.fire, row.fire_args, row.opset)
    ops = Counter(node.op_type for node in report.model.graph.all_nodes())
    name = row.rules(targets.ORT_CPU, row.fire_args)[0].name
    assert report.optimized.fusions.get(name, 0) >= 1, report.optimized.fusions
    assert ops[row.fused] >= 1, dict(ops)
    actual = mnjit(row.fire, opset=row.opset)(*row.fire_args)
    assert_same(actual, jax.jit(row.fire)(*row.fire_args), TOL, row.rule.__name__)


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_near_miss_says_why(row: Row):
    target = targets.get(row.miss_target)
    with _scope(row.x64):  # a float64 template must be lowered with x64 on (and is cached per dtype)
        rules = row.rules(target, row.miss_args)
        if row.miss_model is not None:
            models = [row.miss_model()]
        else:
            report = _translate(row.miss, row.miss_args, row.opset, row.miss_target)
            assert rules[0].name not in report.optimized.fusions, report.optimized.fusions
            # The rule meets the graph either after the other rewrites or in canonical form before them
            # (which of the two depends on the rule's place in the order): its reason must show in one.
            canonical = _translate(row.miss, row.miss_args, row.opset, row.miss_target, fuse=False).model
            folding.canonicalize(canonical)
            models = [report.model, canonical]
    reasons = []
    for model in models:
        for rule in rules:
            for node in list(model.graph):
                tracer = pattern.MatchingTracer()
                assert rule.try_rewrite(model, model.graph, node, tracer=tracer) is None, f"{rule.name} fired"
                reasons += [info.match_result.reason for infos in tracer.best_matches_map.values()
                            for info in infos]
    assert any(row.reason in reason for reason in reasons if reason), reasons


def test_scale_shift_of_a_square_is_left_alone():
    """(x - m) * (x - m) + b with per-channel shapes matches ScaleShift's pattern with scale = x - m, a value
    the fusion would remove while its replacement still reads it."""
    fun = lambda x, m, b: (x - m) * (x - m) + b
    args = (_t(1, 3, 1, 1), _t(1, 3, 1, 1, seed=1), _t(1, 3, 1, 1, seed=2))
    assert "ScaleShift" not in _translate(fun, args, 21).optimized.fusions
    assert_same(mnjit(fun)(*args), jax.jit(fun)(*args), TOL, "square")
