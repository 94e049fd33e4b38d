"""Models with a symbolic batch (and sequence) that used to lose something the static export has: the library
normalizations' fusions, max pooling's gradient (stablehlo.select_and_scatter), and batched LU and Cholesky
(LAPACK's getrf and potrf, and the triangular solves after them).

Each row is a test_dynamic_export.DynCase, compared with jax.jit at several sizes in both x64 modes; the
fusion rows must also come out with the same op types as the same model exported with static shapes.
"""
from __future__ import annotations

from collections import Counter

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
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


def linen_rms_norm(x, g):
    """flax.linen's RMSNorm (nnx's is the same code): the mean square's rows a Reshape, the scale in rsqrt."""
    return nn.RMSNorm().apply({"params": {"scale": g}}, x)


def equinox_rms_norm(x, g, b):
    """equinox's RMSNorm, vmapped over the leading axes: rsqrt before the rows' Reshape, a weight and a bias."""
    norm = eqx.tree_at(lambda m: (m.weight, m.bias), eqx.nn.RMSNorm(D, use_weight=True, use_bias=True), (g, b))
    for _ in range(x.ndim - 1):
        norm = jax.vmap(norm)
    return norm(x)


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
    DynCase("linen_rms_norm_seq", linen_rms_norm, [Arg(f"b, s, {D}"), Arg(f"{D}")], CONV_TOL, ["RMSNormalization"],
            opset=23),
    DynCase("equinox_rms_norm_seq", equinox_rms_norm, _norm_args(f"b, s, {D}"), CONV_TOL, ["RMSNormalization"],
            opset=23),
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


def max_pool_loss(window, strides, padding):
    """sum(sin(max pool)): its gradient is jax's select_and_scatter of the pool's cotangent."""
    def loss(x):
        return jnp.sum(jnp.sin(lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding)))
    return loss


def cnn_loss(w, x):
    """conv -> relu -> 2x2 max pool -> mean square: its gradient for the images, over a symbolic batch."""
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = nn.max_pool(jax.nn.relu(y), (2, 2), strides=(2, 2))
    return jnp.mean(y ** 2)


GRADIENTS = [
    DynCase("max_pool_grad_nhwc", jax.grad(max_pool_loss((1, 2, 2, 1), (1, 2, 2, 1), "VALID")),
            [Arg("b, 8, 8, 3")], CONV_TOL),
    DynCase("max_pool_grad_flax_same", jax.grad(lambda x: jnp.sum(jnp.sin(
        nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")))), [Arg("b, 9, 9, 2")], CONV_TOL),
    DynCase("max_pool_grad_nchw_padded", jax.grad(max_pool_loss((1, 1, 3, 3), (1, 1, 2, 2),
                                                                ((0, 0), (0, 0), (1, 1), (1, 1)))),
            [Arg("b, 2, 7, 7")], CONV_TOL),
    DynCase("max_pool_grad_batch_and_seq", jax.grad(max_pool_loss((1, 1, 3), (1, 1, 2), "VALID")),
            [Arg("b, s, 7")], CONV_TOL),
    # The symbolic dim behind the windowed one: moved in front of it and back.
    DynCase("max_pool_grad_symbolic_last", jax.grad(max_pool_loss((2, 1), (2, 1), "VALID")), [Arg("6, b")],
            CONV_TOL),
    # Rounded values (their gradient passed straight through) tie within windows: the first pick wins.
    DynCase("min_pool_grad_ties", jax.grad(lambda x: jnp.sum(lax.reduce_window(
        x + lax.stop_gradient(jnp.round(x) - x), jnp.inf, lax.min, (1, 2, 2), (1, 1, 1), "SAME") * x.shape[1])),
            [Arg("b, 4, 5")], CONV_TOL),
    DynCase("cnn_input_grad", jax.grad(cnn_loss, argnums=1), [Arg("3, 3, 2, 4"), Arg("b, 6, 6, 2")], (1e-4, 1e-4)),
]


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("case", GRADIENTS, ids=repr)
def test_pooling_gradients_under_symbolic_batch(case: DynCase, x64: bool):
    proto = check_symbolic(case, x64)
    assert "ScatterElements" in {node.op_type for node in proto.graph.node}


def test_window_along_symbolic_dim_refused():
    """A window that spans the symbolic dim itself picks across rows the graph cannot enumerate: refused, with
    the op, the dim and the user's line."""
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("b, 3", constraints=["b >= 2"]), jnp.float32)
    exported = export.export(jax.jit(jax.grad(max_pool_loss((2, 1), (1, 1), "VALID"))))(spec)
    with pytest.raises(hlo2onnx.UnsupportedOpError,
                       match="stablehlo.select_and_scatter: symbolic dimension 0 .*a window along a symbolic dim"):
        hlo2onnx.convert(exported, dynamic=True)


def spd(a):
    """A symmetric positive definite matrix from any square one."""
    return a @ jnp.swapaxes(a, -1, -2) + a.shape[-1] * jnp.eye(a.shape[-1], dtype=a.dtype)


LINALG_TOL = (1e-4, 1e-4)
LINALG = [
    DynCase("lu_factor", jsl.lu_factor, [Arg("b, 4, 4")], LINALG_TOL),
    DynCase("lu_rectangular", lax.linalg.lu, [Arg("b, 5, 3")], LINALG_TOL),  # with the permutation
    DynCase("lu_two_batch_dims", jsl.lu_factor, [Arg("b, s, 3, 3")], LINALG_TOL),
    DynCase("cholesky", lambda a: jnp.linalg.cholesky(spd(a)), [Arg("b, 4, 4")], LINALG_TOL),
    DynCase("cholesky_upper_two_batch_dims", lambda a: jsl.cholesky(spd(a), lower=False), [Arg("b, s, 3, 3")],
            LINALG_TOL),
    DynCase("cholesky_not_positive", jnp.linalg.cholesky, [Arg("b, 3, 3")], LINALG_TOL),  # NaN where info > 0
    DynCase("solve", jnp.linalg.solve, [Arg("b, 4, 4"), Arg("b, 4, 2")], LINALG_TOL),
    DynCase("inv", jnp.linalg.inv, [Arg("b, 3, 3")], LINALG_TOL),
    # Kept away from singular: a log-determinant near one is ill-conditioned in f32 whoever computes it.
    DynCase("slogdet", lambda a: jnp.linalg.slogdet(a + 3 * jnp.eye(5, dtype=a.dtype)), [Arg("b, 5, 5")], LINALG_TOL),
    DynCase("cho_solve", lambda a, r: jsl.cho_solve(jsl.cho_factor(spd(a)), r), [Arg("b, 4, 4"), Arg("b, 4, 2")],
            LINALG_TOL),
]


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("case", LINALG, ids=repr)
def test_factorizations_under_symbolic_batch(case: DynCase, x64: bool):
    proto = check_symbolic(case, x64)
    assert "Loop" in {node.op_type for node in proto.graph.node}  # the factorization, not a refusal's fallback


def test_symbolic_matrix_dims_refused():
    """The matrices' own dims set the loop's steps: symbolic ones are refused by name."""
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("b, n, n"), jnp.float32)
    exported = export.export(jax.jit(jsl.lu_factor))(spec)
    with pytest.raises(hlo2onnx.UnsupportedOpError, match=r"symbolic dimension 1 of operand 0 \(shape \?x\?x\?\): "
                                                          "the matrix dimensions of @lapack_sgetrf_ffi must be static"):
        hlo2onnx.convert(exported, dynamic=True)
