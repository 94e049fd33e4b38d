"""Shape-polymorphic export: models exported with jax.export over symbolic dims ("b", and "b, s"), converted
with `hlo2onnx.convert(exported, dynamic=True)`, run in ONNX Runtime at several sizes and compared with
jax.jit at each size, in both x64 modes.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from jax import export, lax

import hlo2onnx
from harness import TOLERANCE, rand

F32, I32 = np.float32, np.int32
BATCHES = (1, 7, 32)
SEQS = (3, 5, 3)  # the sequence length beside each batch size
CONV_TOL = (1e-5, 1e-5)


@dataclass
class Arg:
    """One argument: a shape spec over the symbolic names ("b, 8, 3") and its dtype; ints drawn in [low, high)."""

    spec: str
    dtype: Any = F32
    low: int = -3
    high: int = 3


@dataclass
class DynCase:
    name: str
    fun: Callable
    args: Sequence[Arg]
    tol: tuple[float, float] | None = None
    fused: Sequence[str] = ()  # ONNX op types the graph must hold (fusions that must still fire)
    constraints: Sequence[str] = ()
    opset: int = hlo2onnx.DEFAULT_OPSET
    sizes: Sequence[dict[str, int]] = field(default_factory=lambda: [{"b": n, "s": s}
                                                                     for n, s in zip(BATCHES, SEQS)])

    def __repr__(self) -> str:
        return self.name


def specs(case: DynCase) -> list[jax.ShapeDtypeStruct]:
    scope = export.SymbolicScope(case.constraints)
    return [jax.ShapeDtypeStruct(export.symbolic_shape(a.spec, scope=scope), jnp.dtype(a.dtype)) for a in case.args]


def concrete(arg: Arg, sizes: dict[str, int], seed: int) -> np.ndarray:
    # Dims are numbers, names, or products of them ("2*b").
    shape = tuple(int(np.prod([int(f) if f.strip().isdigit() else sizes[f.strip()] for f in d.split("*")]))
                  for d in arg.spec.split(",") if d.strip())
    dtype = np.dtype(arg.dtype)
    if dtype.kind in "iu":
        return np.random.default_rng(seed).integers(arg.low, arg.high, shape).astype(dtype)
    return rand(shape, dtype, seed=seed)


def cnn(dn: str, strides, pool_op):
    """conv (stride) -> relu -> pooling -> dense, in NHWC or NCHW."""
    def fun(x, w):
        lhs = dn
        y = lax.conv_general_dilated(x, w, strides, "SAME", dimension_numbers=(lhs, "HWIO", lhs))
        y = jax.nn.relu(y)
        window = (1, 2, 2, 1) if lhs == "NHWC" else (1, 1, 2, 2)
        if pool_op == "max":
            y = lax.reduce_window(y, -jnp.inf, lax.max, window, window, "VALID")
        else:
            y = lax.reduce_window(y, 0.0, lax.add, window, window, "VALID") / 4
        return y.reshape(y.shape[0], -1).sum(-1)
    return fun


def fully_convolutional(x, w):
    """Images of any size: SAME conv (stride 1), VALID conv, 2x2 max pooling, a global average."""
    dn = ("NHWC", "HWIO", "NHWC")
    y = jax.nn.relu(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn))
    y = lax.conv_general_dilated(y, jnp.ones((2, 2, 4, 2), y.dtype), (1, 1), "VALID", dimension_numbers=dn)
    y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return y.mean((1, 2))


def attention(q, k, v):
    """Multi-head attention over a symbolic sequence: (b, s, 8) -> 2 heads of 4."""
    b, s, _ = q.shape
    split = lambda t: t.reshape(b, s, 2, 4).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 2.0
    out = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
    return out.transpose(0, 2, 1, 3).reshape(b, s, 8)


def layer_norm(x, g, beta):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * g + beta


def fast_variance_layer_norm(x):
    """flax's LayerNorm (use_fast_variance): var = max(0, E[x^2] - E[x]^2), its scale (a constant, as a model's
    weights are) multiplied into rsqrt."""
    mean = x.mean(-1)
    var = jnp.maximum(0.0, lax.square(x).mean(-1) - lax.square(mean))
    rows = (*mean.shape, 1)  # a Reshape over the symbolic dims, as flax's
    mul = lax.rsqrt(var.reshape(rows) + 1e-6) * np.linspace(0.5, 2.0, x.shape[-1], dtype=x.dtype)
    return (x - mean.reshape(rows)) * mul


def batch_norm(x, mean, var, g, beta):
    """Inference batch norm over NCHW channels."""
    c = lambda t: t[None, :, None, None]  # noqa: E731
    return (x - c(mean)) / jnp.sqrt(c(var) + 1e-5) * c(g) + c(beta)


def rnn(xs, h0, w):
    """lax.scan over time (axis 1 after a transpose), carrying a symbolic batch."""
    def step(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h.sum(-1)
    h, ys = lax.scan(step, h0, xs.transpose(1, 0, 2))
    return h, ys.T


def concat_reverse_pad(x):
    y = jnp.concatenate([x, x[:, ::-1]], axis=1)
    return jnp.pad(y, ((0, 0), (1, 2)))


def while_loop(x):
    return lax.while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] * 0.5 + jnp.sin(c[1])), (0, x))[1]


def cond(x):
    return lax.cond(x.sum() > 0, lambda t: t * 2, lambda t: -t, x)


CASES = [
    # -- the list -------------------------------------------------------------------------------------
    DynCase("cnn_nhwc_maxpool", cnn("NHWC", (2, 2), "max"), [Arg("b, 8, 8, 3"), Arg("3, 3, 3, 4")], CONV_TOL),
    DynCase("cnn_nchw_avgpool", cnn("NCHW", (2, 2), "avg"), [Arg("b, 3, 8, 8"), Arg("3, 3, 3, 4")], CONV_TOL),
    DynCase("cnn_nhwc_avgpool_stride1", cnn("NHWC", (1, 1), "avg"), [Arg("b, 6, 6, 3"), Arg("3, 3, 3, 4")],
            CONV_TOL),
    DynCase("fully_convolutional", fully_convolutional, [Arg("b, h, w, 3"), Arg("3, 3, 3, 4")], CONV_TOL,
            sizes=[{"b": 1, "h": 6, "w": 8}, {"b": 7, "h": 9, "w": 5}, {"b": 32, "h": 4, "w": 4}]),
    DynCase("conv_same_strided_any_size", lambda x, w: lax.conv_general_dilated(
        x, w, (2, 2), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")), [Arg("b, 3, h, w"), Arg("4, 3, 3, 3")],
            CONV_TOL, sizes=[{"b": 1, "h": 5, "w": 6}, {"b": 7, "h": 8, "w": 7}, {"b": 32, "h": 3, "w": 4}]),
    DynCase("attention_fixed_seq", attention, [Arg("b, 4, 8")] * 3, CONV_TOL, fused=["Softmax"]),
    DynCase("attention_symbolic_seq", attention, [Arg("b, s, 8")] * 3, CONV_TOL, fused=["Softmax"]),
    DynCase("attention_symbolic_seq_opset23", attention, [Arg("b, s, 8")] * 3, CONV_TOL, fused=["Attention"],
            opset=23),
    DynCase("take", lambda x, i: jnp.take(x, i, axis=0), [Arg("b, 5"), Arg("4", I32, 0, 1)]),
    DynCase("take_rows_by_batch_index", lambda x, i: jnp.take(x, i, axis=1), [Arg("b, 6"), Arg("b", I32, 0, 6)]),
    DynCase("concat_reverse_pad", concat_reverse_pad, [Arg("b, 4")]),
    DynCase("scan_rnn", rnn, [Arg("b, 5, 4"), Arg("b, 4"), Arg("4, 4")], CONV_TOL),
    DynCase("cumsum", lambda x: jnp.cumsum(x, axis=0), [Arg("b, 3")], CONV_TOL),
    DynCase("cumsum_last", lambda x: jnp.cumsum(x, axis=-1), [Arg("b, 3")], CONV_TOL),
    DynCase("sort", lambda x: jnp.sort(x, axis=0), [Arg("b, 3")]),
    DynCase("sort_last", jnp.sort, [Arg("b, 5")]),
    DynCase("dynamic_slice_in_dim", lambda x, i: lax.dynamic_slice_in_dim(x, i, 2, axis=1),
            [Arg("b, 6"), Arg("", I32, 0, 5)]),
    DynCase("index_row", lambda x, i: x[i], [Arg("b, 3"), Arg("", I32, -3, 9)]),
    DynCase("dynamic_slice_rows", lambda x, i: lax.dynamic_slice_in_dim(x, i, 1, axis=0), [Arg("b, s, 3"),
                                                                                        Arg("", I32, 0, 9)]),
    DynCase("dynamic_update_row", lambda x, u, i: lax.dynamic_update_slice_in_dim(x, u, i, axis=0),
            [Arg("b, 3"), Arg("1, 3"), Arg("", I32, -2, 9)]),
    DynCase("dynamic_update_column", lambda x, u, i: lax.dynamic_update_slice_in_dim(x, u, i, axis=2),
            [Arg("b, s, 4"), Arg("b, s, 1"), Arg("", I32, 0, 4)]),
    DynCase("at_add", lambda x, i, u: x.at[i].add(u), [Arg("b, 3"), Arg("4", I32, 0, 1), Arg("4, 3")]),
    DynCase("argmax", lambda x: jnp.argmax(x, axis=0), [Arg("b, 3")]),
    DynCase("argmax_last", lambda x: jnp.argmax(x, axis=-1), [Arg("b, 3")]),
    DynCase("arange", lambda x: x * jnp.arange(x.shape[0], dtype=x.dtype)[:, None], [Arg("b, 3")]),
    DynCase("layer_norm", layer_norm, [Arg("b, 8"), Arg("8"), Arg("8")], CONV_TOL, fused=["LayerNormalization"]),
    DynCase("layer_norm_symbolic_seq", layer_norm, [Arg("b, s, 8"), Arg("8"), Arg("8")], CONV_TOL,
            fused=["LayerNormalization"]),
    # The fusion reads the statistics' Reshape targets, computed (not constants) over a symbolic batch.
    DynCase("layer_norm_fast_variance", fast_variance_layer_norm, [Arg("b, s, 8")], (1e-4, 1e-4)),
    # -- beyond the list ----------------------------------------------------------------------------
    DynCase("top_k", lambda x: lax.top_k(x, 2), [Arg("b, 5")]),
    DynCase("top_k_batch_axis", lambda x: lax.top_k(x.T, 1), [Arg("b, 3")]),
    DynCase("while_loop", while_loop, [Arg("b, 3")], CONV_TOL),
    DynCase("cond", cond, [Arg("b, 3")]),
    DynCase("dot_two_symbolic", lambda x, y: x @ y, [Arg("b, s, 4"), Arg("b, 4, s")], CONV_TOL),
    DynCase("reshape_merge", lambda x: x.reshape(-1), [Arg("b, s, 2")]),
    DynCase("reshape_split", lambda x: x.reshape(x.shape[0] // 2, 2, 3), [Arg("2*b, 3")],
            sizes=[{"b": 1}, {"b": 4}, {"b": 16}]),
    DynCase("broadcast", lambda x, y: x[:, None, :] + y[None, :, :], [Arg("b, 3"), Arg("s, 3")]),
    DynCase("iota_2d", lambda x: x + lax.broadcasted_iota(x.dtype, x.shape, 1) * lax.broadcasted_iota(
        x.dtype, x.shape, 0), [Arg("b, s")]),
    DynCase("mean_over_batch", lambda x: x - x.mean(0), [Arg("b, 3")]),
    # Two broadcasts of scalars meet (a cotangent 1.0 * 4.0): one keeps its Expand, else the result is a scalar.
    DynCase("broadcast_scalars_only", lambda x: jnp.full_like(x, 1.0) * (x.shape[1] * 1.0), [Arg("b, 4")]),
    DynCase("softmax", lambda x: jax.nn.softmax(x, axis=-1), [Arg("b, 6")], fused=["Softmax"]),
    DynCase("layer_norm_fused", lambda x: jax.nn.standardize(x, axis=-1), [Arg("b, s, 8")], CONV_TOL),
    DynCase("batch_norm", batch_norm, [Arg("b, 3, 4, 4"), Arg("3"), Arg("3", low=1), Arg("3"), Arg("3")], CONV_TOL,
            fused=["BatchNormalization"]),
    DynCase("gelu", lambda x: jax.nn.gelu(x, approximate=False), [Arg("b, 6")], fused=["Gelu"]),
    DynCase("embedding", lambda table, ids: table[ids].sum(-1), [Arg("10, 4"), Arg("b, s", I32, 0, 10)]),
    DynCase("one_hot", lambda ids: jax.nn.one_hot(ids, 5), [Arg("b, s", I32, 0, 5)]),
    DynCase("concat_batch_axis", lambda x, y: jnp.concatenate([x, y, x], axis=0), [Arg("b, 3"), Arg("s, 3")]),
    DynCase("tile", lambda x: jnp.tile(x, (2, 3)), [Arg("b, 2")]),
    DynCase("roll", lambda x: jnp.roll(x, 2, axis=0), [Arg("b, 3")]),
    DynCase("logsumexp", lambda x: jax.nn.logsumexp(x, axis=1), [Arg("b, s")], CONV_TOL),
    DynCase("max_over_seq", lambda x: x.max(1) + x.mean(1), [Arg("b, s, 4")], CONV_TOL),
    DynCase("squeeze_expand", lambda x: jnp.expand_dims(x[:, 0], (0, 2)), [Arg("b, 3")]),
    DynCase("clip_where", lambda x: jnp.where(x > 0, jnp.clip(x, 0.5, 1.0), -x), [Arg("b, s")]),
    DynCase("dot_product_attention", lambda q, k, v: jax.nn.dot_product_attention(q, k, v), [Arg("b, s, 2, 4")] * 3,
            CONV_TOL),
    DynCase("causal_mask", lambda x: jnp.where(jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool)),
                                               x @ x.transpose(0, 2, 1), -1e9), [Arg("b, s, 4")], CONV_TOL),
    DynCase("einsum_ellipsis", lambda x, w: jnp.einsum("...i,ij->...j", x, w), [Arg("b, s, 4"), Arg("4, 2")],
            CONV_TOL),
    DynCase("vmap_matmul", lambda x, w: jax.vmap(lambda a: a @ w)(x), [Arg("b, s, 4"), Arg("4, 2")], CONV_TOL),
    DynCase("repeat", lambda x: jnp.repeat(x, 2, axis=0), [Arg("b, 3")]),
    DynCase("pad_reflect", lambda x: jnp.pad(x, ((2, 2), (1, 1)), mode="reflect"), [Arg("b, 4")],
            sizes=[{"b": 3}, {"b": 7}, {"b": 32}], constraints=["b >= 3"]),
    DynCase("pad_edge", lambda x: jnp.pad(x, ((1, 2), (0, 0)), mode="edge"), [Arg("b, 4")]),
    DynCase("conv_transpose", lambda x, w: lax.conv_transpose(x, w, (2, 2), "SAME",
                                                             dimension_numbers=("NHWC", "HWIO", "NHWC")),
            [Arg("b, 4, 4, 3"), Arg("3, 3, 3, 2")], CONV_TOL),
    DynCase("depthwise_conv", lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=3),
            [Arg("b, 5, 5, 3"), Arg("3, 3, 1, 6")], CONV_TOL),
    DynCase("resize_bilinear", lambda x: jax.image.resize(x, (x.shape[0], 8, 8, 3), "bilinear"),
            [Arg("b, 4, 4, 3")], CONV_TOL),
    DynCase("max_pool_same_strided_any_size", lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1),
                                                                          (1, 2, 2, 1), "SAME"),
            [Arg("b, h, w, 2")], sizes=[{"b": 1, "h": 5, "w": 6}, {"b": 7, "h": 8, "w": 8},
                                        {"b": 32, "h": 3, "w": 4}]),
    DynCase("fori_over_batch", lambda x: lax.fori_loop(0, x.shape[0], lambda i, c: c + x[i],
                                                       jnp.zeros(x.shape[1:], x.dtype)), [Arg("b, 3")], CONV_TOL),
    DynCase("searchsorted", lambda a, v: jnp.searchsorted(jnp.sort(a), v), [Arg("8"), Arg("b")]),
    DynCase("gather_2d", lambda x, i, j: x[i, j], [Arg("b, 5"), Arg("4", I32, 0, 1), Arg("4", I32, 0, 5)]),
    DynCase("set_slice", lambda x: x.at[:, 1:3].set(0.0), [Arg("b, 5")]),
    DynCase("triu_diagonal", lambda x: jnp.triu(x) + jnp.diagonal(x, axis1=1, axis2=2)[:, None, :],
            [Arg("b, s, s")]),
    DynCase("random_normal", lambda k, x: x + jax.random.normal(jax.random.wrap_key_data(k), x.shape),
            [Arg("2", np.uint32, 0, 100), Arg("b, 3")], CONV_TOL),
    DynCase("slice_stride", lambda x: x[1::2, ::2], [Arg("b, 6")]),
    DynCase("pad_interior", lambda x: lax.pad(x, F32(0), ((1, 0, 1), (0, 0, 0))), [Arg("b, 3")]),
    DynCase("pad_by_batch", lambda x: jnp.pad(x, ((x.shape[0], 1), (0, 0))), [Arg("b, 3")]),
    DynCase("reverse", lambda x: x[::-1], [Arg("b, 3")]),
    DynCase("cumsum_int", lambda x: jnp.cumsum(x, axis=0), [Arg("b, 3", I32)]),
    DynCase("cummax", lambda x: lax.cummax(x, axis=0), [Arg("b, 3")]),
    DynCase("cumsum_reverse", lambda x: lax.cumsum(x, axis=0, reverse=True), [Arg("b, 3")], CONV_TOL),
    DynCase("cumprod", lambda x: jnp.cumprod(x, axis=0), [Arg("b, 2")], (1e-5, 1e-5),
            sizes=[{"b": 1}, {"b": 7}, {"b": 12}]),
    DynCase("cummin_int_reverse", lambda x: lax.cummin(x, axis=0, reverse=True), [Arg("b, 3", I32)]),
    DynCase("argsort", lambda x: jnp.argsort(x, axis=0), [Arg("b, 3")]),
    DynCase("gather_batched", lambda x, i: jnp.take_along_axis(x, i, axis=1),
            [Arg("b, 5"), Arg("b, 2", I32, 0, 5)]),
    DynCase("scatter_set_batch", lambda x: x.at[:, 0].set(1.0), [Arg("b, 3")]),
    DynCase("at_set_dropped", lambda x, u: x.at[jnp.array([0, 2, 5, 9])].set(u), [Arg("b, 3"), Arg("4, 3")]),
    # A scatter batched over two symbolic dims (vmapped .at[i].set, as jax's LU pivots become a permutation).
    DynCase("at_set_vmapped_twice", jax.vmap(jax.vmap(lambda x, i: x.at[i].set(0.0))),
            [Arg("b, s, 5"), Arg("b, s", I32, -2, 7)]),
    DynCase("at_set_per_row", lambda x, i: x.at[jnp.arange(x.shape[0]), i].set(0.0), [Arg("b, 3"), Arg("b", I32, 0, 3)]),
    DynCase("at_max_runtime_rows", lambda x, i, u: x.at[i].max(u), [Arg("b, 3"), Arg("4", I32, -2, 9), Arg("4, 3")]),
    DynCase("segment_sum_into_batch", lambda x, i: jnp.zeros_like(x).at[i].add(1.0),
            [Arg("b, 3"), Arg("5", I32, 0, 1)]),
    DynCase("max_pool_1d_padded", lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 3), (1, 2), "SAME"),
            [Arg("b, 7")]),
    DynCase("pool_over_batch", lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 1), (1, 1), "VALID"),
            [Arg("b, 3")], sizes=[{"b": 2}, {"b": 7}, {"b": 32}], constraints=["b >= 2"]),
    DynCase("max_pool_over_batch_strided", lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (3, 1), (2, 1), "VALID"),
            [Arg("b, 3")], sizes=[{"b": 3}, {"b": 8}, {"b": 32}], constraints=["b >= 3"]),
]


def _scope(x64: bool):
    return jax.enable_x64(True) if x64 else contextlib.nullcontext()


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _convert(case: DynCase) -> tuple[export.Exported, onnx.ModelProto]:
    exported = export.export(jax.jit(case.fun))(*specs(case))
    return exported, hlo2onnx.convert(exported, dynamic=True, opset=case.opset).to_proto()


def _dim_names(values) -> list[list[str | int]]:
    return [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values]


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_symbolic_model(case: DynCase, x64: bool):
    check_symbolic(case, x64)


def check_symbolic(case: DynCase, x64: bool) -> onnx.ModelProto:
    """Converts `case` over its symbolic dims and compares the model with jax.jit at each of its sizes; returns
    the model."""
    with _scope(x64):
        exported, proto = _convert(case)
        # Inputs keep the user's dim names exactly where the spec had them; outputs are named by jax's
        # expressions over them ("b", "2*b").
        for spec, dims in zip(case.args, _dim_names(proto.graph.input)):
            wanted = [int(d) if d.strip().isdigit() else d.strip() for d in spec.spec.split(",") if d.strip()]
            assert dims == wanted, (spec.spec, dims)
        for aval, dims in zip(exported.out_avals, _dim_names(proto.graph.output)):
            assert dims == [d if isinstance(d, int) else str(d) for d in aval.shape], (aval, dims)
        # jax.export's shape assertions travel in the metadata (b >= 1 for every symbolic dim at least).
        assertions = {p.key: p.value for p in proto.metadata_props}["jax.shape_assertions"].split("\n")
        assert any(">= 1 for dimension variable 'b'" in a for a in assertions), assertions
        session = _session(proto)
        types = {node.op_type for node in proto.graph.node}
        for op_type in case.fused:
            assert op_type in types, (op_type, sorted(types))
        for seed, sizes in enumerate(case.sizes):
            args = [concrete(a, sizes, seed + i) for i, a in enumerate(case.args)]
            expected = [np.asarray(e) for e in jax.tree_util.tree_leaves(jax.jit(case.fun)(*args))]
            feeds = {i.name: a for i, a in zip(session.get_inputs(), args)}
            actual = session.run(None, feeds)
            assert len(actual) == len(expected)
            for a, e in zip(actual, expected):
                assert a.shape == e.shape and a.dtype == e.dtype, (sizes, a.shape, e.shape, a.dtype, e.dtype)
                rtol, atol = case.tol or TOLERANCE.get(e.dtype, (0, 0))
                np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"{case.name} at {sizes}")
    return proto


# Symbolic dims ONNX cannot take through these ops, refused with the op, the dim and the user's line.
REFUSED = [
    ("conv_symbolic_features", lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "VALID",
                                                                     dimension_numbers=("NHWC", "HWIO", "NHWC")),
     ["1, 5, 5, c", "3, 3, c, 4"], "stablehlo.convolution: symbolic dimension 3"),
    ("conv_input_dilated_symbolic_spatial", lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), ((0, 0), (0, 0)), lhs_dilation=(2, 2), dimension_numbers=("NHWC", "HWIO", "NHWC")),
     ["1, h, w, 3", "3, 3, 3, 4"], "stablehlo.convolution: symbolic dimension 1"),
    ("wide_window_over_batch", lambda x: lax.reduce_window(x, 0.0, lax.add, (9, 1), (1, 1), "VALID"),
     ["b, 3"], "stablehlo.reduce_window: symbolic dimension 0"),
    ("cumlogsumexp", lambda x: lax.cumlogsumexp(x, axis=0), ["b, 3"],
     "dynamic_reduce_window: a cumulative reduction by a body of several ops over a symbolic dimension"),
]


@pytest.mark.parametrize("name, fun, shapes, message", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused(name, fun, shapes, message):
    scope = export.SymbolicScope(["b >= 9"] if "b" in shapes[0] else ())
    args = [jax.ShapeDtypeStruct(export.symbolic_shape(s, scope=scope), jnp.float32) for s in shapes]
    exported = export.export(jax.jit(fun))(*args)
    with pytest.raises(hlo2onnx.UnsupportedOpError, match=message) as error:
        hlo2onnx.convert(exported, dynamic=True)
    assert f"{__file__}:" in str(error.value)  # the user's line


def test_static_graphs_read_no_shapes():
    """The same models with static shapes: no Shape node, no sizes computed in the graph (but where a static
    rule reads one: scatter-max's NaN mask is ConstantOfShape(Shape(data)))."""
    for case in CASES:
        if case.name == "at_max_runtime_rows":
            continue
        args = [jax.ShapeDtypeStruct(concrete(a, case.sizes[1], 0).shape, a.dtype) for a in case.args]
        proto = hlo2onnx.convert(export.export(jax.jit(case.fun))(*args)).to_proto()
        assert "Shape" not in {node.op_type for node in proto.graph.node}, case.name


def test_mnjit_lower_symbolic(tmp_path):
    """mnjit(f).lower() over symbolic ShapeDtypeStructs; save() writes the names as dim_params."""
    from mnjit import mnjit

    fun = CASES[0].fun
    scope = export.SymbolicScope()
    specs = [jax.ShapeDtypeStruct(export.symbolic_shape("batch, 8, 8, 3", scope=scope), jnp.float32),
             jax.ShapeDtypeStruct((3, 3, 3, 4), jnp.float32)]
    lowered = mnjit(fun).lower(*specs)
    assert "stablehlo.convolution" in lowered.as_text()
    lowered.save(tmp_path / "m.onnx")
    proto = onnx.load(str(tmp_path / "m.onnx"))
    assert _dim_names(proto.graph.input) == [["batch", 8, 8, 3], [3, 3, 3, 4]]
    assert _dim_names(proto.graph.output) == [["batch"]]
    session = _session(proto)
    for n in BATCHES:
        x, w = rand((n, 8, 8, 3), seed=n), rand((3, 3, 3, 4), seed=0)
        (actual,) = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), (x, w))})
        np.testing.assert_allclose(actual, np.asarray(jax.jit(fun)(x, w)), *CONV_TOL)
