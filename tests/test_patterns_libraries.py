"""The same ONNX whether a block is written in plain jnp, with flax, or with equinox.

flax's and equinox's LayerNorm compute the variance their own way (mean(x*x) - mean(x)^2, clamped at 0, with
the scale folded into rsqrt); the fusions must still find LayerNormalization, Gelu, Softmax and Gemm.
"""
from __future__ import annotations

from collections import Counter

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from harness import Case, run_case
from mnjit import mnjit

X = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
TOL = (2e-5, 2e-5)
FUSED = Counter({"Gemm": 2, "LayerNormalization": 1, "Gelu": 1, "Softmax": 1})


def op_types(fun, *args) -> Counter:
    return Counter(node.op_type for node in mnjit(fun).lower(*args).onnx_model.graph.node)


def hand_block(p, x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    h = (x - mean) / jnp.sqrt(var + 1e-6) * p["g"] + p["b"]
    return jax.nn.softmax(jax.nn.gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])


class FlaxBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.gelu(nn.Dense(32)(nn.LayerNorm()(x)))
        return nn.softmax(nn.Dense(10)(h))


def test_flax_block_is_the_hand_written_graph():
    params = FlaxBlock().init(jax.random.key(0), X)
    flax_fun = lambda params, x: FlaxBlock().apply(params, x)  # noqa: E731
    p = params["params"]
    hand_params = {"g": p["LayerNorm_0"]["scale"], "b": p["LayerNorm_0"]["bias"],
                   "w1": p["Dense_0"]["kernel"], "b1": p["Dense_0"]["bias"],
                   "w2": p["Dense_1"]["kernel"], "b2": p["Dense_1"]["bias"]}
    run_case(Case("flax_block", flax_fun, (params, X), tol=TOL))
    assert op_types(flax_fun, params, X) == op_types(hand_block, hand_params, X) == FUSED


def test_equinox_block_fuses():
    k1, k2 = jax.random.split(jax.random.key(1))
    model = (eqx.nn.LayerNorm(16), eqx.nn.Linear(16, 32, key=k1), eqx.nn.Linear(32, 10, key=k2))
    arrays, static = eqx.partition(model, eqx.is_array)
    arrays = {"model": arrays}  # run_case would turn a tuple argument into one array

    def fun(arrays, x):
        norm, first, second = eqx.combine(arrays["model"], static)
        return jax.vmap(lambda v: jax.nn.softmax(second(jax.nn.gelu(first(norm(v))))))(x)

    run_case(Case("equinox_block", fun, (arrays, X), tol=TOL))
    ops = op_types(fun, arrays, X)
    assert all(ops[op] == n for op, n in FUSED.items()), dict(ops)
    # vmap leaves the Linear layers' weight transposes and the bias reshapes, nothing that computes.
    assert set(ops) - set(FUSED) <= {"Transpose", "Reshape"}, dict(ops)


def _linen_rms(x, g):
    return nn.RMSNorm().apply({"params": {"scale": g}}, x)


def _nnx_rms(x, g):
    model = nnx.RMSNorm(16, rngs=nnx.Rngs(0))
    model.scale[...] = g
    return model(x)


def _equinox_rms(x, g, b):
    norm = eqx.tree_at(lambda m: (m.weight, m.bias), eqx.nn.RMSNorm(16, use_weight=True, use_bias=True), (g, b))
    return jax.vmap(jax.vmap(norm))(x)


G16 = 1 + 0.1 * np.random.default_rng(1).standard_normal(16).astype(np.float32)
RMS_CASES = [("linen", _linen_rms, (G16,), Counter({"RMSNormalization": 1})),
             ("nnx", _nnx_rms, (G16,), Counter({"RMSNormalization": 1})),
             # the bias stays an Add (RMSNormalization has none), its (16,) reshaped to (1, 1, 16)
             ("equinox", _equinox_rms, (G16, G16 - 1), Counter({"RMSNormalization": 1, "Add": 1, "Reshape": 1}))]


@pytest.mark.parametrize("name, fun, params, fused", RMS_CASES, ids=[c[0] for c in RMS_CASES])
def test_library_rms_norms_fuse_at_opset_23(name, fun, params, fused):
    x = np.random.default_rng(2).standard_normal((4, 8, 16)).astype(np.float32)
    for opset in (23, 21):
        compiled = mnjit(fun, opset=opset)
        np.testing.assert_allclose(np.asarray(compiled(x, *params)), np.asarray(jax.jit(fun)(x, *params)),
                                   rtol=TOL[0], atol=TOL[1])
        ops = Counter(node.op_type for node in compiled.lower(x, *params).onnx_model.graph.node)
        if opset == 23:
            assert ops == fused, dict(ops)
        else:  # before opset 23 ONNX has no RMSNormalization: the graph stays as written
            assert "RMSNormalization" not in ops and ops["Sqrt"] == 1, dict(ops)
