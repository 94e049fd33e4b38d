"""The fusion rules in the order they are tried, and the MatMul family (Gemm)."""
from __future__ import annotations

from typing import ContextManager

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult

from hlo2onnx.patterns import activations, engine, noderules, normalization, templates
from hlo2onnx.patterns.base import Fusion
from hlo2onnx.patterns.cleanup import all_graphs, remove_unused, static_shape
from hlo2onnx.targets import Target


def _untransposed(value: ir.Value) -> tuple[ir.Value, int]:
    """(input, 1) when `value` is a 2-D transpose used only here, to fold into Gemm's trans flags."""
    producer = value.producer()
    if (producer is not None and producer.op_type == "Transpose" and len(value.consumers()) == 1
            and list(producer.attributes["perm"].as_ints()) == [1, 0]):
        return producer.inputs[0], 1
    return value, 0


def _check_2d(result: MatchResult, a: ir.Value, w: ir.Value) -> MatchResult:
    if static_shape(a) is None or static_shape(w) is None or len(a.shape) != 2 or len(w.shape) != 2:
        return result.fail("Gemm needs 2-D operands", [a, w])
    return result


class MatMulBias(Fusion):
    """a @ w + c -> Gemm(a, w, c), with 2-D transposes folded into transA/transB."""

    op_type = "Gemm"

    def pattern(self, op, a, w, c):
        return op.Add(op.MatMul(a, w), c)

    def check(self, context, a, w, c, **_) -> MatchResult:
        result = self.available(a)
        if not result or not _check_2d(result, a, w):
            return result
        m, n = static_shape(a)[0], static_shape(w)[1]
        c_shape = static_shape(c)
        if c_shape is None or len(c_shape) > 2 or any(d not in (1, full) for d, full in
                                                      zip(c_shape[::-1], (n, m))):
            return result.fail(f"bias of shape {c_shape} does not broadcast to {[m, n]}", c)
        return result

    def rewrite(self, op, a, w, c, **_):
        (a, trans_a), (w, trans_b) = _untransposed(a), _untransposed(w)
        return op.Gemm(a, w, c, transA=trans_a, transB=trans_b)


class MatMulTranspose(Fusion):
    """a @ w.T (the backward pass's form) -> Gemm(a, w, transB=1), and likewise for a.T."""

    op_type = "Gemm"

    def pattern(self, op, a, w):
        return op.MatMul(a, w)

    def check(self, context, a, w, **_) -> MatchResult:
        result = self.available(a)
        if not result or not _check_2d(result, a, w):
            return result
        if _untransposed(a)[1] == 0 and _untransposed(w)[1] == 0:
            return result.fail("no operand is a transpose used only here", [a, w])
        return result

    def rewrite(self, op, a, w, **_):
        (a, trans_a), (w, trans_b) = _untransposed(a), _untransposed(w)
        return op.Gemm(a, w, transA=trans_a, transB=trans_b)


def _beta(mul: ir.Node | None, dtype: ir.DataType) -> tuple[ir.Value, float] | None:
    """(v, s) when `mul` is s * v with s a scalar Gemm's beta can take: nonzero and finite (ORT's Gemm does
    not read C when beta is 0, where 0 * inf is NaN), of v's dtype, and held exactly by float32 (beta's type)."""
    if mul is None or not noderules.only_use(mul.outputs[0]):
        return None
    for v, s in (mul.inputs, mul.inputs[::-1]):
        factor = noderules.scalar_array(s)
        if (factor is not None and factor.dtype == np.dtype(dtype.numpy()) and factor != 0 and np.isfinite(factor)
                and np.float32(factor) == factor and static_shape(v) == static_shape(mul.outputs[0])):
            return v, float(factor)
    return None


def _gemm_attrs(gemm: ir.Node, beta: float) -> tuple:
    return (*(a for a in gemm.attributes.values() if a.name != "beta"), ir.AttrFloat32("beta", beta))


def _add_scaled(node: ir.Node, emit: noderules.Emitter) -> ir.Value | None:
    """Gemm(a, b) + s * v -> Gemm(a, b, v, beta=s) (the form jax's weight gradients reach after algebra's
    transpose rule)."""
    for product, scaled in (node.inputs, node.inputs[::-1]):
        gemm = noderules.producer_of(product, "Gemm")
        found = _beta(noderules.producer_of(scaled, "Mul"), node.outputs[0].dtype)
        if gemm is None or found is None or len(gemm.inputs) != 2 or not noderules.only_use(product):
            continue
        if static_shape(found[0]) != static_shape(product) or not emit.allows("Gemm", product):
            continue
        return emit("Gemm", *gemm.inputs, found[0], like=node.outputs[0], attrs=_gemm_attrs(gemm, found[1]))
    return None


def _scaled_c(node: ir.Node, emit: noderules.Emitter) -> ir.Value | None:
    """Gemm(a, b, s * v) -> Gemm(a, b, v, beta=s) (MatMulBias's Gemm of a momentum update)."""
    if len(node.inputs) != 3 or node.inputs[2] is None or node.attributes.get("beta") is not None:
        return None
    found = _beta(noderules.producer_of(node.inputs[2], "Mul"), node.outputs[0].dtype)
    if found is None:
        return None
    return emit("Gemm", *node.inputs[:2], found[0], like=node.outputs[0], attrs=_gemm_attrs(node, found[1]))


def accumulate_into_gemms(model: ir.Model) -> int:
    """s * v + a @ b -> Gemm(a, b, v, beta=s) over every graph: an optimizer's momentum update (v' = mass v +
    grad, the gradient a Gemm) in one kernel instead of three passes over the weights (MNIST's step: a Mul
    and an Add over 1.9 M floats each). Not bit-exact, like MatMulBias: Gemm adds beta v into its
    accumulator instead of rounding the product first, a difference of the order of the product's own
    summation order. Returns how many nodes it replaced."""
    count = 0
    for graph in all_graphs(model.graph):
        replaced = noderules.rewrite(graph, {"Add": _add_scaled, "Gemm": _scaled_c})
        if replaced:
            remove_unused(graph)  # the Gemm and Mul the new Gemm took over
        count += replaced
    return count


def _template_dtypes(graph: ir.Graph) -> list[str]:
    """Dtypes to look for chlo's erf expansions in: only in graphs that can hold one (they cost a lowering)."""
    ops = {node.op_type for node in graph}
    if len(graph) < templates.MIN_NODES or not ({"Abs", "Min"} & ops):
        return []
    dtypes = {np.dtype(v.dtype.numpy()).name for node in graph for v in node.outputs
              if v.dtype is not None and v.dtype.is_floating_point()}
    return sorted(dtypes & {"float16", "float32", "float64"})


def _build_fusion_rules(opset: int, target: Target, dtypes: tuple[str, ...]) -> list:
    return [
        *activations.rules(opset, target, list(dtypes)),
        *normalization.rules(opset, target),
        *MatMulBias.rule(opset, target).commute(),
        MatMulTranspose.rule(opset, target),
    ]


# Building a rule traces its pattern (and its commuted copies): done once per opset, target and dtypes, in
# as many copies as translations ran at once (rules keep per-match state: see engine.RulePool).
_FUSION_RULES = engine.RulePool(_build_fusion_rules)


def fusion_rules(model: ir.Model, opset: int, target: Target) -> ContextManager[list]:
    """Every fusion, in the order it is tried (each rule is applied on its own, so the report counts it),
    lent to the caller until its `with` block ends."""
    dtypes = tuple(_template_dtypes(model.graph))
    return _FUSION_RULES.borrow((opset, target.name, dtypes), opset, target, dtypes)
