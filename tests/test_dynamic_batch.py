"""Models with a symbolic batch (and sequence) that used to lose something the static export has: the library
normalizations' fusions, and max pooling's gradient.

Each row is a test_dynamic_export.DynCase, compared with jax.jit at several sizes in both x64 modes; the
fusion rows must also come out with the same op types as the same model exported with static shapes.
"""
from __future__ import annotations

from collections import Counter

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax import export, lax

import hlo2onnx
from test_dynamic_export import CONV_TOL, Arg, DynCase, check_symbolic, concrete

D = 16  # the normalized (static) axis


def linen_layer_norm(x, g, b):
    """flax.linen's LayerNorm (its fast variance: mean(x*x) - mean(x)^2, clamped, the scale folded into rsqrt)."""
    return nn.LayerNorm().apply({"params": {"scale": g, "bias": b}}, x)


def nnx_layer_norm(x, g, b):
    """flax.nnx's LayerNorm: the statistics' rows are a Reshape to a shape computed from the symbolic dims."""
    model = nnx.LayerNorm(D, rngs=nnx.Rngs(0))
    model.scale[...], model.bias[...] = g, b
    return model(x)


def equinox_layer_norm(x, g, b):
    """equinox's LayerNorm, on one row, vmapped over the leading axes (its variance clamped at 0)."""
    norm = eqx.tree_at(lambda m: (m.weight, m.bias), eqx.nn.LayerNorm(D), (g, b))
    for _ in range(x.ndim - 1):
        norm = jax.vmap(norm)
    return norm(x)


def var_layer_norm(x, g, b):
    """jnp.var (its where(n > ddof, var, nan) guard, folded to a constant over a static axis)."""
    return (x - x.mean(-1, keepdims=True)) * lax.rsqrt(x.var(-1, keepdims=True) + 1e-5) * g + b


def rms_norm(x, g):
    return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g


def transformer_block(x, g1, b1, w1, w2, g2, b2):
    """Pre-norm MLP block with a residual, then a final norm, over (batch, sequence, features)."""
    h = linen_layer_norm(x, g1, b1)
    x = x + jax.nn.gelu(h @ w1, approximate=False) @ w2
    return equinox_layer_norm(x, g2, b2)


def _norm_args(spec: str) -> list[Arg]:
    return [Arg(spec), Arg(f"{D}", low=1), Arg(f"{D}")]


LN = ["LayerNormalization"]
FUSIONS = [
    DynCase("linen_layer_norm", linen_layer_norm, _norm_args(f"b, {D}"), CONV_TOL, LN),
    DynCase("linen_layer_norm_seq", linen_layer_norm, _norm_args(f"b, s, {D}"), CONV_TOL, LN),
    DynCase("nnx_layer_norm", nnx_layer_norm, _norm_args(f"b, {D}"), CONV_TOL, LN),
    DynCase("nnx_layer_norm_seq", nnx_layer_norm, _norm_args(f"b, s, {D}"), CONV_TOL, LN),
    DynCase("equinox_layer_norm", equinox_layer_norm, _norm_args(f"b, {D}"), CONV_TOL, LN),
    DynCase("equinox_layer_norm_seq", equinox_layer_norm, _norm_args(f"b, s, {D}"), CONV_TOL, LN),
    DynCase("var_layer_norm_seq", var_layer_norm, _norm_args(f"b, s, {D}"), CONV_TOL, LN),
    DynCase("log_softmax_seq", lambda x: jax.nn.log_softmax(x, axis=-1), [Arg(f"b, s, {D}")], CONV_TOL,
            ["LogSoftmax"]),
    DynCase("softmax_seq", lambda x: jax.nn.softmax(x, axis=-1), [Arg(f"b, s, {D}")], CONV_TOL, ["Softmax"]),
    DynCase("rms_norm_seq", rms_norm, [Arg(f"b, s, {D}"), Arg(f"{D}")], CONV_TOL, ["RMSNormalization"], opset=23),
    DynCase("transformer_block", transformer_block,
            _norm_args(f"b, s, {D}") + [Arg(f"{D}, 32"), Arg(f"32, {D}")] + _norm_args(f"{D}")[1:], (1e-4, 1e-4),
            LN + ["Gelu"]),
]


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("case", FUSIONS, ids=repr)
def test_fusions_under_symbolic_batch(case: DynCase, x64: bool):
    check_symbolic(case, x64)


def _op_types(case: DynCase, symbolic: bool) -> Counter:
    if symbolic:
        scope = export.SymbolicScope()
        args = [jax.ShapeDtypeStruct(export.symbolic_shape(a.spec, scope=scope), a.dtype) for a in case.args]
    else:
        args = [jax.ShapeDtypeStruct(concrete(a, case.sizes[1], 0).shape, a.dtype) for a in case.args]
    proto = hlo2onnx.convert(export.export(jax.jit(case.fun))(*args), dynamic=symbolic, opset=case.opset).to_proto()
    # Sizes read from the graph (a MatMul's rows restored over two symbolic dims) are what a symbolic model has
    # more; the ops that compute are compared.
    return Counter(node.op_type for node in proto.graph.node if node.op_type not in ("Shape", "Concat"))


# Over (b, D) the static export folds the scale and bias, broadcast to the batch, into constants that the
# symbolic one cannot have; over (b, s, D) the graphs are alike.
@pytest.mark.parametrize("case", [c for c in FUSIONS if "s" in c.args[0].spec.split(", ")], ids=repr)
def test_fusions_as_static(case: DynCase):
    assert _op_types(case, True) == _op_types(case, False)
