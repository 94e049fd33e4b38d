"""The translator's speed-ups change nothing in what it writes.

Each shortcut is compared with the slow way it replaces: the same models are translated with the shortcuts
switched back to the direct computation (memoized folds and shape inference, the cached pattern pre-check,
the translator's type and source-line caches, the builder's attribute conversion), and the two models must
serialize to the same bytes, provenance included. benchmarks/convert_identity.py does the same over every
test case, against a recorded run of the code before a change.
"""
from __future__ import annotations

import gc
import threading

import jax
import jax.numpy as jnp
import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import pytest
from jax import lax

import hlo2onnx
from harness import rand
from hlo2onnx import builder, collector
from hlo2onnx.errors import source_line
from hlo2onnx.patterns import cleanup, engine, folding, passes
from hlo2onnx.translator import Translator
from hlo2onnx.types import set_type, tensor_type


def layer_norm(x, g, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * g + b


def transformer(params, x):
    """Two layers of what bench_convert.py times: every layer repeats the same folds, inferences and fusions."""
    for w1, w2, g, b in params:
        h = layer_norm(x, g, b)
        att = jax.nn.softmax(h @ h.T / 8.0, axis=-1)
        x = x + jax.nn.gelu((att @ h) @ w1) @ w2
    return x


def loop_and_cond(x, n):
    """Loop and If bodies: subgraphs for the clean-up, the subgraph walks and provenance."""
    def body(i, carry):
        y = lax.cond(carry.sum() > 0, lambda c: c * 0.5 + 1.0, lambda c: jnp.tanh(c) - 2.0, carry)
        return jnp.where(y > i, y, jnp.broadcast_to(jnp.float32(3), y.shape))
    return lax.fori_loop(0, n, body, x)


def reductions(x):
    return jnp.cumsum(x, axis=0), jnp.max(x, axis=1, keepdims=True), jnp.argmax(x, axis=1)


CONSTANT = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def constant_folds(x):
    """Folds of one constant under different attributes (a reused fold must tell them apart)."""
    a = jnp.transpose(CONSTANT, (2, 0, 1)).reshape(4, 6)
    b = jnp.transpose(CONSTANT, (1, 2, 0)).reshape(4, 6)
    c = jnp.transpose(CONSTANT, (2, 1, 0)).reshape(4, 6)
    return x @ (a + 2 * b - c).T


params = [tuple(rand(shape, seed=i + 10 * k) * 0.1 for i, shape in enumerate([(8, 16), (16, 8), (8,), (8,)]))
          for k in range(2)]
MODELS = {
    "transformer": (transformer, (params, rand((4, 8), seed=1))),
    "transformer_grad": (jax.grad(lambda p, x: transformer(p, x).sum()), (params, rand((4, 8), seed=2))),
    "loop_and_cond": (loop_and_cond, (rand((3, 4), seed=3), np.int32(5))),
    "reductions": (reductions, (rand((6, 5), seed=4),)),
    "constant_folds": (constant_folds, (rand((3, 6), seed=5),)),
}


def serialized(fun, args, target: str = "ort-cpu", fuse: bool = True) -> bytes | str:
    """The model's bytes, or the refusal (`core` refuses some of these models, and must go on doing so)."""
    module = jax.jit(fun).lower(*args).compiler_ir("stablehlo")
    try:
        model = hlo2onnx.translate(module, target=target, fuse=fuse)
    except hlo2onnx.Hlo2OnnxError as e:
        return f"{type(e).__name__}: {e}"
    return ir.to_proto(model).SerializeToString(deterministic=True)


def _direct_type(self, value, name, op=None):
    return tensor_type(value.type)


@pytest.fixture
def slow_way(monkeypatch):
    """Every speed-up switched back to the computation it replaces."""
    monkeypatch.setattr(engine, "_inference_key", lambda node, opsets: None)
    monkeypatch.setattr(folding, "_fold_key", lambda node, inputs: None)
    # The pattern pre-check computed afresh for every rule: all nodes of the root op type go to the matcher.
    monkeypatch.setattr(engine.CandidateIndex, "passing",
                        lambda self, signature: [(i, node) for i, node in enumerate(self.by_op.get(signature[0], ()))
                                                 if node.graph is self.graph])
    monkeypatch.setattr(Translator, "_source_line", lambda self, location: source_line(location))
    monkeypatch.setattr(Translator, "_type_of", _direct_type)
    monkeypatch.setattr(builder, "_attributes",
                        lambda attrs: [ir.convenience.convert_attribute(k, v) for k, v in attrs.items()])
    # onnx-ir's own CSE and dead-code passes, which patterns/passes.py re-does.
    monkeypatch.setattr(passes, "merge_common_subexpressions",
                        lambda model, nodes=None: common_passes.CommonSubexpressionEliminationPass()(model).modified)
    monkeypatch.setattr(passes, "remove_unused_nodes",
                        lambda model: common_passes.RemoveUnusedNodesPass()(model).modified)
    # The translator's per-type conversion of output types.
    monkeypatch.setattr(Translator, "_set_type", lambda self, value, ttype: set_type(value, ttype))


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("target, fuse", [("ort-cpu", True), ("ort-cpu", False), ("core", True)])
def test_same_model_as_the_slow_way(name, target, fuse, request):
    fun, args = MODELS[name]
    fast = serialized(fun, args, target, fuse)
    request.getfixturevalue("slow_way")
    assert serialized(fun, args, target, fuse) == fast


def test_candidate_index_recomputed_after_a_rewrite():
    """A kept pre-check answer would hide a node a rewrite made from every later rule with that signature."""
    x = ir.Value(name="x")
    relu = ir.Node("", "Relu", [x])
    neg = ir.Node("", "Neg", [relu.outputs[0]])
    graph = ir.Graph([x], [neg.outputs[0]], nodes=[relu, neg])
    index = engine.CandidateIndex(graph)
    signature = ("Neg", ("Abs",))
    assert index.passing(signature) == []
    abs_node = ir.Node("", "Abs", [x])
    graph.insert_before(neg, abs_node)
    neg.replace_input_with(0, abs_node.outputs[0])
    index.rewritten([abs_node])
    assert [node for _, node in index.passing(signature)] == [neg]


def _nested_model() -> ir.Model:
    fun, args = MODELS["loop_and_cond"]
    module = jax.jit(fun).lower(*args).compiler_ir("stablehlo")
    return hlo2onnx.translate(module, fuse=False)


def test_node_walks_match_onnx_ir():
    """all_nodes and all_graphs skip nodes that cannot hold a subgraph; they find what onnx-ir's walk finds,
    in its order."""
    model = _nested_model()
    assert [id(n) for n in cleanup.all_nodes(model.graph)] == [id(n) for n in model.graph.all_nodes()]
    graphs = cleanup.all_graphs(model.graph)
    assert len(graphs) >= 3  # the main graph, the Loop body and the If branches in it
    assert [id(g) for g in graphs] == [id(model.graph)] + [id(g) for g in model.graph.subgraphs()]


@pytest.mark.parametrize("value", [3, True, 2.5, "tanh", [1, 2], (0, -1), [1.0, 2.0], ["a", "b"], [],
                                   ir.Tensor(np.ones(2, np.float32)), np.int64(4)])
def test_attributes_as_onnx_ir_converts_them(value):
    b = builder.Builder(ir.Graph([], [], nodes=[]), hlo2onnx.targets.get("ort-cpu"))
    x = ir.Value(name="x")
    try:
        expected = ir.convenience.convert_attribute("a", value)
    except TypeError:
        with pytest.raises(TypeError):
            b.op("Identity", x, a=value)
        return
    attr = b.op("Identity", x, a=value).producer().attributes["a"]
    assert (attr.type, repr(attr.value)) == (expected.type, repr(expected.value))


def test_collector_restored():
    assert gc.isenabled()
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector.paused():
            pass
        assert not gc.isenabled()  # the caller's choice stays
    finally:
        gc.enable()


def test_collector_paused_across_threads():
    """Overlapping translations in two threads: the collector comes back when the last one ends."""
    inside, release = threading.Event(), threading.Event()

    def other():
        with collector.paused():
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(5)
    with collector.paused():
        pass
    assert not gc.isenabled()  # the other thread's translation still runs
    release.set()
    thread.join()
    assert gc.isenabled()


def test_translation_leaves_the_collector_on():
    fun, args = MODELS["reductions"]
    serialized(fun, args)
    assert gc.isenabled()
