"""Convolutions whose weights are arguments, on ORT's NCHWc kernels (mnjit/nchwc.py), compared with jax.jit."""
from __future__ import annotations

import platform

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from jax import lax

from harness import Case, assert_same, rand
from mnjit import mnjit, nchwc

CONV_TOL = (1e-5, 1e-5)
needs_nchwc = pytest.mark.skipif(nchwc.block_size() is None, reason="ORT has no NCHWc kernels on this CPU")


def conv(strides=(1, 1), padding="SAME", dn=("NHWC", "HWIO", "NHWC"), bias=False, relu=False, **kw):
    def f(x, w, *b):
        y = lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=dn, **kw)
        y = y + b[0] if bias else y
        return jax.nn.relu(y) if relu else y
    return f


def nhwc(n, h, w, c_in, c_out, k=3, seed=0):
    return rand((n, h, w, c_in), seed=seed), rand((k, k, c_in, c_out), seed=seed + 1, low=-0.5, high=0.5)


def with_specials(x, w):
    """x with a NaN and an inf: XLA's results carry NaN (and ReLU keeps it) wherever a window meets them."""
    x = x.copy()
    x[0, 2, 2, 0], x[0, 4, 4, 1] = np.nan, np.inf
    return x, w


def bn_params(channels: int) -> tuple[np.ndarray, ...]:
    """gamma, beta, mean, var."""
    return (rand((channels,), seed=7, low=0.5, high=1.5), rand((channels,), seed=8), rand((channels,), seed=9),
            rand((channels,), seed=10, low=0.5, high=1.5))


def conv_bn_relu(x, w, b, gamma, beta, mean, var):
    y = conv()(x, w) + b
    return jax.nn.relu((y - mean) * (gamma / jnp.sqrt(var + 1e-5)) + beta)


def conv_batch_stats(x, w, gamma, beta):
    y = conv()(x, w)
    mean, var = y.mean(axis=(0, 1, 2)), y.var(axis=(0, 1, 2))
    return jax.nn.relu((y - mean) / jnp.sqrt(var + 1e-5) * gamma + beta)


# (case, how many of its Conv nodes move to the NCHWc kernels with a 16-wide block: -1 = any number)
CASES = [
    (Case("narrow input (3 channels, NCHW path)", conv(), nhwc(2, 9, 8, 3, 32)), 1),
    (Case("blocked input (32 channels)", conv(), nhwc(2, 9, 8, 32, 32)), 1),
    (Case("output channels padded to the block (32 -> 10)", conv(), nhwc(2, 7, 7, 32, 10)), 1),
    (Case("bias, padded", conv(bias=True), (*nhwc(1, 6, 6, 16, 20), rand((20,), seed=5))), 1),
    (Case("stride 2, VALID", conv(strides=(2, 2), padding="VALID"), nhwc(3, 11, 10, 16, 16)), 1),
    (Case("dilation 2", conv(rhs_dilation=(2, 2)), nhwc(1, 12, 12, 16, 32)), 1),
    (Case("5x1 kernel, asymmetric padding", conv(padding=((2, 1), (0, 3))),
          (rand((2, 8, 9, 16)), rand((5, 1, 16, 16), seed=1, low=-0.5, high=0.5))), 1),
    (Case("NCHW / OIHW layout", conv(dn=("NCHW", "OIHW", "NCHW")),
          (rand((2, 32, 6, 7)), rand((16, 32, 3, 3), seed=1, low=-0.5, high=0.5))), 1),
    (Case("ReLU after the conv", conv(relu=True), nhwc(2, 8, 8, 32, 32)), 1),
    (Case("batch norm and ReLU folded in (a CNN layer)", conv_bn_relu,
          (*nhwc(2, 8, 8, 16, 24), rand((24,), seed=6), *bn_params(24))), 1),
    (Case("batch norm over the batch (statistics from the conv: not folded)", conv_batch_stats,
          (*nhwc(4, 6, 6, 16, 16), *bn_params(16)[:2])), 1),
    (Case("NaN and inf in the input, ReLU folded in", conv(relu=True), with_specials(*nhwc(1, 6, 6, 16, 16))), 1),
    (Case("NaN and inf in the input, narrow, batch norm folded in", conv_bn_relu,
          (*with_specials(*nhwc(1, 6, 6, 3, 16)), rand((16,), seed=6), *bn_params(16))), 1),
    # Not taken: 20 input channels are neither under a block nor a multiple of it; grouped convs.
    (Case("20 input channels (kept)", conv(), nhwc(1, 6, 6, 20, 16)), 0),
    (Case("grouped (kept)", conv(feature_group_count=2),
          (rand((1, 6, 6, 32)), rand((3, 3, 16, 32), seed=1, low=-0.5, high=0.5))), 0),
    # Gradients: the weight gradient is a conv whose "filter" is an activation. Its entries sum 128 products
    # to magnitudes near 25: jax.jit's own float32 result is 4.8e-5 from float64's there (measured).
    (Case("weight and input gradient", jax.grad(lambda w, x: jnp.sum(jnp.sin(conv()(x, w))), argnums=(0, 1)),
          tuple(reversed(nhwc(2, 8, 8, 16, 32))), tol=(2e-4, 2e-4)), -1),
]


@needs_nchwc
@pytest.mark.parametrize("case,expected", CASES, ids=[c.name for c, _ in CASES])
def test_conv_on_nchwc_kernels_matches_jax(case: Case, expected: int, monkeypatch) -> None:
    rewritten = []
    original = nchwc.rewrite
    monkeypatch.setattr(nchwc, "rewrite", lambda proto: rewritten.append(original(proto)) or rewritten[-1])
    actual = mnjit(case.fun)(*case.args)
    assert_same(actual, jax.jit(case.fun)(*case.args), case.tol or CONV_TOL, case.name)
    if nchwc.block_size() == 16 and expected >= 0:
        assert sum(rewritten) == expected, rewritten
    elif expected == -1:
        assert sum(rewritten) >= 1, rewritten


@needs_nchwc
def test_rewritten_graph_holds_the_blocked_ops_and_saved_models_do_not(tmp_path) -> None:
    x, w = nhwc(2, 8, 8, 32, 32)
    lowered = mnjit(conv()).lower(x, w)
    proto = onnx.ModelProto()
    proto.CopyFrom(lowered.onnx_model)
    assert nchwc.rewrite(proto) == 1
    ops = [(n.domain, n.op_type) for n in proto.graph.node]
    assert (nchwc.NCHWC, "Conv") in ops and (nchwc.NCHWC, "ReorderInput") in ops
    assert ("", "Conv") not in ops
    lowered.save(tmp_path / "conv.onnx")
    saved = onnx.load(tmp_path / "conv.onnx")
    assert {n.domain for n in saved.graph.node} <= {"", "ai.onnx"}
    assert any(n.op_type == "Conv" for n in saved.graph.node)


@needs_nchwc
def test_batch_norm_and_relu_go_into_the_kernel() -> None:
    proto = onnx.ModelProto()
    proto.CopyFrom(mnjit(conv_bn_relu).lower(*nhwc(2, 8, 8, 16, 24), rand((24,), seed=6), *bn_params(24)).onnx_model)
    assert any(n.op_type == "BatchNormalization" for n in proto.graph.node)  # the fusion made one
    assert nchwc.rewrite(proto) == 1
    assert not any(n.op_type in ("BatchNormalization", "Relu") for n in proto.graph.node)
    [kernel] = [n for n in proto.graph.node if n.domain == nchwc.NCHWC and n.op_type == "Conv"]
    assert onnx.helper.get_attribute_value(next(a for a in kernel.attribute if a.name == "activation")) == b"Relu"


@needs_nchwc
def test_constant_filters_are_left_to_ort() -> None:
    w = rand((3, 3, 32, 32), seed=1)
    lowered = mnjit(lambda x: conv()(x, jnp.asarray(w))).lower(rand((1, 8, 8, 32)))
    proto = onnx.ModelProto()
    proto.CopyFrom(lowered.onnx_model)
    assert nchwc.rewrite(proto) == 0


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="ORT's NCHWc kernels are x86's here")
def test_block_size_is_found_on_x86() -> None:
    assert nchwc.block_size() in (8, 16)


def test_a_layout_ort_does_not_use_turns_the_rewrite_off(monkeypatch) -> None:
    """The probe must reject a reorder that differs from ORT's: the model then keeps its plain Conv."""
    def transposed_wrongly(filters, block, blocked_input):
        return filters.reshape(-1, block).T.reshape(filters.shape) if blocked_input else filters
    monkeypatch.setattr(nchwc, "reorder", transposed_wrongly)
    nchwc.block_size.cache_clear()
    try:
        assert nchwc.block_size() is None
        proto = onnx.ModelProto()
        proto.CopyFrom(mnjit(conv()).lower(*nhwc(1, 6, 6, 32, 32)).onnx_model)
        assert nchwc.rewrite(proto) == 0
    finally:
        nchwc.block_size.cache_clear()


def test_switched_off_by_environment(monkeypatch) -> None:
    monkeypatch.setenv("MNJIT_NCHWC", "0")
    nchwc.block_size.cache_clear()
    try:
        assert nchwc.block_size() is None
    finally:
        nchwc.block_size.cache_clear()


@needs_nchwc
def test_the_probe_runs_once_per_machine_and_a_bad_entry_is_measured_again(cache, monkeypatch) -> None:
    from mnjit import cache_key, disk_cache

    calls = []
    probe = nchwc._probe
    monkeypatch.setattr(nchwc, "_probe", lambda: calls.append(1) or probe())
    nchwc.block_size.cache_clear()
    try:
        first = nchwc.block_size()
        nchwc.block_size.cache_clear()  # a new process, as far as the answer goes
        assert nchwc.block_size() == first and len(calls) == 1
        assert len(list(cache.glob(f"{cache_key.FACT}/*.bin"))) == 1
        disk_cache.current().put(cache_key.FACT, cache_key.key(cache_key.FACT, "nchwc-block-size"), b"sixteen")
        nchwc.block_size.cache_clear()
        assert nchwc.block_size() == first and len(calls) == 2
    finally:
        nchwc.block_size.cache_clear()
