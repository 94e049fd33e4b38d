"""Convolution, batch-norm, attention and layout fusions: each fires on a tiny case (the model still matches
jax.jit), explains a miss, and shows up in the benchmark models written in plain jnp."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from onnxscript.rewriter import pattern

import hlo2onnx
from harness import Case, rand, run_case
from hlo2onnx.patterns import attention, convolution, optimize_report
from hlo2onnx.targets import ORT_CPU
from mnjit import mnjit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_models  # noqa: E402

F32 = np.float32
TOL = (1e-5, 1e-5)


def op_types(fun, *args, opset: int = hlo2onnx.DEFAULT_OPSET) -> Counter:
    return Counter(node.op_type for node in mnjit(fun, opset=opset).lower(*args).onnx_model.graph.node)


def conv_nhwc(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def conv_nchw(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))


x_nhwc, w_hwio, c4 = rand((2, 6, 6, 3), seed=1), rand((3, 3, 3, 4), seed=2), rand((4,), seed=3)
x_nchw, w_oihw = rand((2, 3, 6, 6), seed=4), rand((4, 3, 3, 3), seed=5)
mean4, var4 = rand((4,), seed=6), rand((4,), seed=7, low=0.5, high=1.5)
g4, b4 = rand((4,), seed=8, low=0.5, high=1.5), rand((4,), seed=9)


def bn_nhwc(y, mean, var, g, b, eps=1e-5):
    return (y - mean) * (g / jnp.sqrt(var + eps)) + b


def bn_nchw(y, mean, var, g, b, eps=1e-5):
    c = lambda v: v.reshape(1, -1, 1, 1)  # noqa: E731
    return (y - c(mean)) * c(g / jnp.sqrt(var + eps)) + c(b)


def pool_nhwc(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def two_convs(x, w1, b1, w2):
    return conv_nhwc(jax.nn.relu(conv_nhwc(x, w1) + b1), w2)


def baked_conv_bn(x):
    """Weights and statistics closed over: they are constants in the module."""
    return bn_nchw(conv_nchw(x, w_oihw) + c4.reshape(1, -1, 1, 1), mean4, var4, g4, b4)


# (case, op that must appear, ops that must be gone)
FUSIONS = [
    (Case("conv_bias_nchw", lambda x, w, b: conv_nchw(x, w) + b.reshape(1, -1, 1, 1), (x_nchw, w_oihw, c4), tol=TOL),
     {"Conv": 1}, ("Add",)),
    (Case("conv_bias_nhwc", lambda x, w, b: conv_nhwc(x, w) + b, (x_nhwc, w_hwio, c4), tol=TOL),
     {"Conv": 1}, ("Add",)),
    (Case("scale_shift_bn_nchw", lambda x, w, m, v, g, b: bn_nchw(conv_nchw(x, w), m, v, g, b),
          (x_nchw, w_oihw, mean4, var4, g4, b4), tol=TOL), {"BatchNormalization": 1}, ("Sub", "Mul", "Sqrt", "Div")),
    (Case("scale_shift_bn_nhwc", lambda x, w, m, v, g, b: bn_nhwc(conv_nhwc(x, w), m, v, g, b),
          (x_nhwc, w_hwio, mean4, var4, g4, b4), tol=TOL), {"BatchNormalization": 1}, ("Sub", "Mul")),
    (Case("bn_folded_into_conv", baked_conv_bn, (x_nchw,), tol=TOL), {"Conv": 1}, ("BatchNormalization", "Add")),
    (Case("transposes_cancel", two_convs, (x_nhwc, w_hwio, c4, rand((3, 3, 4, 2), seed=10)), tol=TOL),
     {"Conv": 2, "Relu": 1}, ("Add",)),
    (Case("transposes_cancel_pool", lambda x, w1, w2: conv_nhwc(pool_nhwc(jax.nn.relu(conv_nhwc(x, w1))), w2),
          (x_nhwc, w_hwio, rand((3, 3, 4, 2), seed=11)), tol=TOL), {"Conv": 2}, ()),
]


@pytest.mark.parametrize("case,fused,gone", FUSIONS, ids=[c.name for c, _, _ in FUSIONS])
def test_fusion(case, fused, gone):
    run_case(case)
    ops = op_types(case.fun, *case.args)
    for op, n in fused.items():
        assert ops[op] == n, dict(ops)
    assert not any(ops[op] for op in gone), dict(ops)


def test_transposes_cancel_between_convs():
    """conv.py wraps each NHWC conv in Transposes; between two convs only the inputs' Transposes stay."""
    args = (x_nhwc, w_hwio, c4, rand((3, 3, 4, 2), seed=10))
    ops = op_types(two_convs, *args)
    # x and both kernels are transposed once each, and the result back to NHWC: 4, not 6.
    assert ops["Transpose"] == 4, dict(ops)


def test_global_pool_keeps_no_transpose():
    """A mean over H and W leaves [N, C] in either layout: the Transpose after the conv goes."""
    fun = lambda x, w: conv_nhwc(x, w).mean(axis=(1, 2))  # noqa: E731
    run_case(Case("conv_global_mean", fun, (x_nhwc, w_hwio), tol=TOL))
    assert op_types(fun, x_nhwc, w_hwio)["Transpose"] == 2  # x and w only


def _attention(q, k, v):
    return jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]).astype(F32), axis=-1) @ v


qkv = tuple(rand((2, 3, 5, 4), seed=s) for s in (20, 21, 22))


def test_attention_at_opset_23():
    run_case(Case("attention", _attention, qkv, tol=TOL))
    assert op_types(_attention, *qkv, opset=23)["Attention"] == 1
    ops = mnjit(_attention, opset=23)
    np.testing.assert_allclose(np.asarray(ops(*qkv)), np.asarray(jax.jit(_attention)(*qkv)), rtol=1e-5, atol=1e-6)


def test_attention_scaled_by_multiplying():
    fun = lambda q, k, v: jax.nn.softmax((q @ k.transpose(0, 1, 3, 2)) * F32(0.5), axis=-1) @ v  # noqa: E731
    assert op_types(fun, *qkv, opset=23)["Attention"] == 1
    np.testing.assert_allclose(np.asarray(mnjit(fun, opset=23)(*qkv)), np.asarray(jax.jit(fun)(*qkv)),
                               rtol=1e-5, atol=1e-6)


def test_no_attention_before_opset_23():
    ops = op_types(_attention, *qkv, opset=21)
    assert not ops["Attention"] and ops["Softmax"] == 1


# -- misses explain themselves ---------------------------------------------------------------------------------
def _miss_reason(rule_cls, fun, *args, opset=21, root="Add") -> str:
    """Translates with fusion, then tries `rule_cls` at each `root` node and returns why it failed."""
    model = hlo2onnx.translate(jax.jit(fun).lower(*args).compiler_ir("stablehlo"), opset=opset)
    reasons = []
    for rule in rule_cls.rule(opset, ORT_CPU).commute():
        for node in [n for n in model.graph if n.op_type == root]:
            tracer = pattern.MatchingTracer()
            assert rule.try_rewrite(model, model.graph, node, tracer=tracer) is None
            reasons += [r.match_result.reason for rs in tracer.best_matches_map.values() for r in rs]
    return " | ".join(r for r in reasons if r)


def test_conv_bias_miss_explained():
    """A bias over the width axis is not per channel."""
    fun = lambda x, w, b: conv_nchw(x, w) + b  # noqa: E731  b: [W] broadcasts over the last axis
    run_case(Case("conv_plus_row", fun, (x_nchw, w_oihw, rand((6,), seed=12)), tol=TOL))
    assert "Add" in op_types(fun, x_nchw, w_oihw, rand((6,), seed=12))
    assert "not per channel" in _miss_reason(convolution.ConvBias, fun, x_nchw, w_oihw, rand((6,), seed=12))


def test_conv_bn_fold_miss_explained():
    """With the statistics as inputs the fold cannot bake them: BatchNormalization stays, and says why."""
    fun = lambda x, m, v, g, b: bn_nchw(conv_nchw(x, w_oihw), m, v, g, b)  # noqa: E731
    args = (x_nchw, mean4, var4, g4, b4)
    assert op_types(fun, *args)["BatchNormalization"] == 1
    assert "not a constant" in _miss_reason(convolution.ConvBatchNorm, fun, *args, root="BatchNormalization")


def test_attention_miss_explained():
    """Softmax over the query axis is not attention."""
    fun = lambda q, k, v: jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / F32(2), axis=-2) @ v  # noqa: E731
    assert not op_types(fun, *qkv, opset=23)["Attention"]
    assert "not the keys' axis" in _miss_reason(attention.Attention, fun, *qkv, opset=23, root="MatMul")


def test_no_einsum_is_emitted():
    """The translator lowers dot_general to MatMul/Transpose itself: no Einsum reaches the fusions to rewrite."""
    fun = lambda a, b: jnp.einsum("bij,bjk->bik", a, b)  # noqa: E731
    assert not op_types(fun, rand((2, 3, 4), seed=1), rand((2, 4, 5), seed=2))["Einsum"]


# -- the benchmark models (plain jnp) -----------------------------------------------------------------------------
def test_cnn_benchmark_model():
    model = bench_models.cnn(batch=2)
    run_case(Case("cnn_bn", model.fun, model.args, tol=(1e-4, 1e-5)))
    ops = op_types(model.fun, *model.args)
    assert ops["Conv"] == 3 and ops["BatchNormalization"] == 3 and ops["Relu"] == 3, dict(ops)
    assert ops["Transpose"] == 4 and not ops["Add"] and not ops["Sub"], dict(ops)  # x and the 3 kernels only


def test_transformer_benchmark_model():
    model = bench_models.transformer(batch=2, seq=8, d=32, f=64)
    run_case(Case("transformer_block", model.fun, model.args, tol=(2e-5, 2e-5)))
    ops = op_types(model.fun, *model.args, opset=23)
    assert ops["Attention"] == 1 and ops["LayerNormalization"] == 2 and ops["Gelu"] == 1, dict(ops)
    assert not ops["Softmax"] and not ops["Div"], dict(ops)


def test_mlp_and_mnist_benchmark_models():
    mlp = bench_models.mlp(batch=4)
    assert op_types(mlp.fun, *mlp.args) == Counter({"Gemm": 3, "Relu": 2, "LogSoftmax": 1})
    step = bench_models.mnist_step(batch=4)
    ops = op_types(step.fun, *step.args)
    assert ops["Gemm"] == 8 and ops["Relu"] == 2 and not ops["MatMul"], dict(ops)


def test_mnist_step_fusions_unchanged():
    """The new rules find nothing to do on a model without convolutions or attention."""
    step = bench_models.mnist_step(batch=8)
    module = jax.jit(step.fun).lower(*step.args).compiler_ir("stablehlo")
    report = optimize_report(hlo2onnx.translate(module, fuse=False), ORT_CPU)
    assert set(report.fusions) <= {"Relu", "MatMulBias", "MatMulTranspose", "LogSoftmax", "GemmAccumulate"}, \
        report.fusions
