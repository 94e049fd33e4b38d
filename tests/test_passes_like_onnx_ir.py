"""patterns/passes.py makes the decisions of onnx-ir's CSE and dead-code passes, on the cases those handle
specially: merges into graph outputs and inputs, attributes of every kind, tensors above the size limit,
random ops, subgraphs, unused optional outputs, BatchNormalization's training mode and trailing empty inputs.

Each model is built twice, passed once through onnx-ir's pass and once through ours, and both must serialize
to the same bytes and report the same change.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import pytest

from hlo2onnx.patterns import passes

F32 = ir.TensorType(ir.DataType.FLOAT)


def _value(name: str, shape=(2, 3)) -> ir.Value:
    return ir.Value(name=name, type=F32, shape=ir.Shape(shape))


def _model(nodes_and_outputs: Callable[[list[ir.Value]], tuple[list[ir.Node], list[ir.Value]]],
           opset: int = 21) -> ir.Model:
    x, y = _value("x"), _value("y")
    nodes, outputs = nodes_and_outputs([x, y])
    graph = ir.Graph([x, y], outputs, nodes=nodes, opset_imports={"": opset}, name="g")
    return ir.Model(graph, ir_version=10)


def _node(op: str, inputs, attrs=(), outputs: int = 1, graph_attrs=()) -> ir.Node:
    return ir.Node("", op, inputs, [*attrs, *graph_attrs], num_outputs=outputs)


def _cse_models():
    def duplicates(ins):
        x, y = ins
        a, b = _node("Add", [x, y]), _node("Add", [x, y])
        c, d = _node("Transpose", [a.outputs[0]], [ir.AttrInt64s("perm", [1, 0])]), \
            _node("Transpose", [b.outputs[0]], [ir.AttrInt64s("perm", [1, 0])])
        e = _node("Transpose", [b.outputs[0]], [ir.AttrInt64s("perm", [0, 1])])
        return [a, b, c, d, e], [_node_out(c), _node_out(d), _node_out(e)]

    def output_into_output(ins):  # both merged values are graph outputs: an Identity keeps the second name
        x, y = ins
        a, b = _node("Mul", [x, y]), _node("Mul", [x, y])
        return [a, b], [a.outputs[0], b.outputs[0]]

    def output_into_inner(ins):  # the merged node's output is a graph output, the kept one is not
        x, y = ins
        a, b = _node("Sub", [x, y]), _node("Sub", [x, y])
        n = _node("Neg", [a.outputs[0]])
        return [a, b, n], [n.outputs[0], b.outputs[0]]

    def attribute_kinds(ins):
        x, _ = ins
        small = ir.Tensor(np.ones(3, np.float32))
        large = ir.Tensor(np.ones(20, np.float32))
        made = []
        for attrs in ([ir.AttrFloat32("alpha", 0.5)], [ir.AttrFloat32("alpha", -0.0)], [ir.AttrFloat32("alpha", 0.0)],
                      [ir.AttrString("mode", "a")], [ir.AttrStrings("modes", ["a", "b"])],
                      [ir.AttrFloat32s("fs", [1.0, 2.0])], [ir.AttrTensor("t", small)], [ir.AttrTensor("t", large)],
                      [ir.AttrInt64("k", 1), ir.AttrInt64("axis", 0)], [ir.AttrInt64("axis", 0), ir.AttrInt64("k", 1)]):
            made += [_node("Custom", [x], attrs), _node("Custom", [x], attrs)]
        made += [_node("RandomUniformLike", [x]), _node("RandomUniformLike", [x])]
        body = ir.Graph([], [], nodes=[], name="body")
        made += [_node("If", [x], graph_attrs=[ir.AttrGraph("then_branch", body)]),
                 _node("If", [x], graph_attrs=[ir.AttrGraph("then_branch", body)])]
        return made, [n.outputs[0] for n in made]

    return {"duplicates": duplicates, "output_into_output": output_into_output,
            "output_into_inner": output_into_inner, "attribute_kinds": attribute_kinds}


def _node_out(node: ir.Node) -> ir.Value:
    return node.outputs[0]


def _dce_models():
    def dead_chain(ins):
        x, y = ins
        a = _node("Add", [x, y])
        dead = _node("Relu", [a.outputs[0]])
        dead2 = _node("Exp", [dead.outputs[0]])
        kept = _node("Neg", [a.outputs[0]])
        return [a, dead, dead2, kept], [kept.outputs[0]]

    def optional_outputs(ins):
        x, _ = ins
        dropout = _node("Dropout", [x, None, None], outputs=2)  # mask unused: its name goes, the node keeps 1
        maxpool = _node("MaxPool", [x], [ir.AttrInt64s("kernel_shape", [1])], outputs=2)
        split = _node("Split", [x], [ir.AttrInt64("num_outputs", 2)], outputs=2)  # variadic: left alone
        return [dropout, maxpool, split], [dropout.outputs[0], maxpool.outputs[0], split.outputs[0]]

    def batch_norm(ins):
        x, y = ins
        made = []
        for mode in (None, 0, 1):
            attrs = [] if mode is None else [ir.AttrInt64("training_mode", mode)]
            made.append(_node("BatchNormalization", [x, y, y, y, y], attrs, outputs=3))
        return made, [n.outputs[0] for n in made]

    def subgraph(ins):
        x, _ = ins
        inner_dead = _node("Relu", [x])
        inner = _node("Neg", [x])
        body = ir.Graph([], [inner.outputs[0]], nodes=[inner_dead, inner], name="then")
        passed = _node("Identity", [x])
        other = ir.Graph([], [passed.outputs[0]], nodes=[passed], name="else")
        cond = _node("If", [x], graph_attrs=[ir.AttrGraph("then_branch", body), ir.AttrGraph("else_branch", other)])
        return [cond], [cond.outputs[0]]

    return {"dead_chain": dead_chain, "optional_outputs": optional_outputs, "batch_norm": batch_norm,
            "subgraph": subgraph}


def _bytes(model: ir.Model) -> bytes:
    return ir.to_proto(model).SerializeToString(deterministic=True)


@pytest.mark.parametrize("name", list(_cse_models()))
def test_merges_what_onnx_ir_merges(name):
    build = _cse_models()[name]
    theirs, ours = _model(build), _model(build)
    modified = common_passes.CommonSubexpressionEliminationPass()(theirs).modified
    assert bool(passes.merge_common_subexpressions(ours)) == modified
    assert _bytes(ours) == _bytes(theirs)


@pytest.mark.parametrize("name", list(_dce_models()))
@pytest.mark.parametrize("opset", [13, 21])
def test_removes_what_onnx_ir_removes(name, opset):
    build = _dce_models()[name]
    theirs, ours = _model(build, opset), _model(build, opset)
    for model in (theirs, ours):  # an unused initializer, and a trailing empty input
        unused = ir.Value(name="unused", type=F32, shape=ir.Shape([1]), const_value=ir.Tensor(np.ones(1, np.float32)))
        model.graph.register_initializer(unused)
        tail = _node("Clip", [model.graph.inputs[0], None, None])
        model.graph.append(tail)
        model.graph.outputs.append(tail.outputs[0])
    modified = common_passes.RemoveUnusedNodesPass()(theirs).modified
    assert passes.remove_unused_nodes(ours) == modified
    assert _bytes(ours) == _bytes(theirs)
