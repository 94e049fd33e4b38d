"""Exact algebraic rewrites that take passes over large tensors out of the graph.

ONNX Runtime runs every elementwise node as its own pass over memory (it fuses
none, where XLA fuses whole chains), and its Where makes three passes and two
temporaries. So each node removed from a chain over a large tensor is time won
back against jax.jit. JAX's autodiff and its `jnp.where`/`nan_to_num`/`remainder`
helpers leave many such nodes: selects on the same mask nested through arithmetic,
the two halves of a select's gradient added back together, `x ** 1`.

Every rewrite gives the same values as the original, the sign of a zero aside
(ORT's own Where already returns +0 for a selected -0; see cleanup's neutral rule).
They run after the fusions, whose patterns expect the translator's forms.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hlo2onnx.patterns.base import numpy_dtype
from hlo2onnx.patterns.cleanup import all_graphs, const_array, remove_unused, splat_of, static_shape
from hlo2onnx.patterns.noderules import Emitter, NodeRule, only_use, producer_of, rewrite, same_value, scalar_array
from hlo2onnx.patterns.selects import drop_dominated_selects
from hlo2onnx.targets import Target

def _is_zero(value: ir.Value) -> bool:
    x = scalar_array(value)
    return x is not None and x.dtype.kind in "fiu" and x == 0



# Node rules (noderules.py): (node, emit) -> the value that replaces the node's output, or None.
def _pow_one(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """x ** 1 -> x (jax's gradient of x ** 2 is 2 * x ** 1; ORT runs std::pow on it)."""
    exponent = scalar_array(node.inputs[1])
    return node.inputs[0] if exponent is not None and exponent == 1 else None


def _bool_equal(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """b == True -> b, b == False -> not b (jax's `ne(x < 0, divisor < 0)` with a constant divisor)."""
    for x, c in (node.inputs, node.inputs[::-1]):
        constant = scalar_array(c)
        if x.dtype == ir.DataType.BOOL and constant is not None and constant.dtype == np.bool_:
            return x if constant else emit("Not", x, like=node.outputs[0])
    return None


def _equal(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """abs(x) == inf -> isinf(x) (jnp.isinf), and _bool_equal."""
    for a, c in (node.inputs, node.inputs[::-1]):
        magnitude, constant = producer_of(a, "Abs"), scalar_array(c)
        if (magnitude is not None and constant is not None and constant.dtype.kind == "f" and constant == np.inf
                and emit.allows("IsInf", magnitude.inputs[0])):
            return emit("IsInf", magnitude.inputs[0], like=node.outputs[0])
    return _bool_equal(node, emit)


def _not(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """not not x -> x; not (x == x) -> isnan(x), one node instead of two."""
    inner = node.inputs[0].producer()
    if inner is None or inner.domain != "":
        return None
    if inner.op_type == "Not":
        return inner.inputs[0]
    x = inner.inputs[0] if inner.op_type == "Equal" else None
    if x is not None and inner.inputs[1] is x and x.dtype is not None and x.dtype.is_floating_point():
        return emit("IsNaN", x, like=node.outputs[0])
    return None


def _and(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """(x < c) and not (x == c) -> x < c: a strict comparison already implies x != c (jnp.remainder's fix-up)."""
    for strict, other in (node.inputs, node.inputs[::-1]):
        compare, negated = strict.producer(), producer_of(other, "Not")
        equal = producer_of(negated.inputs[0], "Equal") if negated is not None else None
        if compare is None or compare.domain != "" or compare.op_type not in ("Less", "Greater") or equal is None:
            continue
        x, c = compare.inputs
        if ((equal.inputs[0] is x and same_value(equal.inputs[1], c))
                or (equal.inputs[1] is x and same_value(equal.inputs[0], c))):
            return strict
    return None


def _where(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """where(m, x, x) -> x; nested selects of one fill value -> one select on the combined mask:
    where(a, z, where(b, z, x)) -> where(a or b, z, x) and where(a, where(b, x, z), z) -> where(a and b, x, z)
    (jnp.nan_to_num's gradient nests three)."""
    m, x, y = node.inputs
    if x is y:
        return x
    for branch, fill, combine in ((y, x, "Or"), (x, y, "And")):
        inner = producer_of(branch, "Where")
        if inner is None or not only_use(branch):
            continue
        b, ix, iy = inner.inputs
        if combine == "Or" and same_value(ix, fill):
            return emit("Where", emit.bool_like("Or", m, b), fill, iy, like=node.outputs[0])
        if combine == "And" and same_value(iy, fill):
            return emit("Where", emit.bool_like("And", m, b), ix, fill, like=node.outputs[0])
    return None


def _add(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """a + (-b) -> a - b (exact), and _add_selects."""
    for a, b in (node.inputs, node.inputs[::-1]):
        negated = producer_of(b, "Neg")
        if negated is not None:
            return emit("Sub", a, negated.inputs[0], like=node.outputs[0])
    return _add_selects(node, emit)


def _add_selects(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """where(m, a, 0) + where(m, 0, d) -> where(m, a, d): the gradient of a select, summed back."""
    left, right = (producer_of(v, "Where") for v in node.inputs)
    if left is None or right is None or left.inputs[0] is not right.inputs[0]:
        return None
    if not all(only_use(v) for v in node.inputs):
        return None
    m = left.inputs[0]
    for first, second in ((left, right), (right, left)):
        if _is_zero(first.inputs[2]) and _is_zero(second.inputs[1]):
            return emit("Where", m, first.inputs[1], second.inputs[2], like=node.outputs[0])
    return None


def _reduce_of_broadcast(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """sum(broadcast(v)) -> v * count for a one-element float v: XLA's own simplification (v times the count
    rounded to the dtype), so the values are jax.jit's. ORT would materialize the broadcast first (600 MB for the
    sum of a closed-over 600 MB np.ones times x: jax lowers the constant as a splat) and sum it less accurately."""
    expand, out = producer_of(node.inputs[0], "Expand"), static_shape(node.outputs[0])
    noop = node.attributes.get("noop_with_empty_axes")
    if expand is None or (noop is not None and noop.as_int()) or int(np.prod(out)) == 0:
        return None
    v, dtype = expand.inputs[0], numpy_dtype(node.outputs[0])
    shape, wide = static_shape(v), static_shape(node.inputs[0])
    if shape is None or int(np.prod(shape)) != 1 or dtype not in (np.float32, np.float64):
        return None
    count = np.full(shape, int(np.prod(wide)) // int(np.prod(out)), dtype)
    scale = emit("Constant", like=v, attrs=(ir.AttrTensor("value", ir.tensor(count)),))
    v = emit("Mul", v, scale, like=v)
    if len(shape) > len(out):
        v = emit("Reshape", v, emit.graph_shape((1,) * len(out)), like=node.outputs[0])
        v.shape = ir.Shape((1,) * len(out))
    return v if static_shape(v) == out else emit("Expand", v, emit.graph_shape(out), like=node.outputs[0])


def _reduce_sum(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """sum(-x) -> -sum(x): negation is exact, so the sum is the same; the Neg runs on the small result.
    sum(x * x) -> ReduceSumSquare(x): one pass instead of two (the same sum, up to its order).
    And _reduce_of_broadcast."""
    broadcast = _reduce_of_broadcast(node, emit)
    if broadcast is not None:
        return broadcast
    attrs, x = tuple(node.attributes.values()), node.inputs[0]
    negated, square = producer_of(x, "Neg"), producer_of(x, "Mul")
    if negated is not None and only_use(x):
        total = emit("ReduceSum", negated.inputs[0], *node.inputs[1:], like=node.outputs[0], attrs=attrs)
        return emit("Neg", total, like=node.outputs[0])
    if (square is not None and square.inputs[0] is square.inputs[1] and only_use(x)
            and emit.allows("ReduceSumSquare", x)):
        return emit("ReduceSumSquare", square.inputs[0], *node.inputs[1:], like=node.outputs[0], attrs=attrs)
    return _merge_reduces(node, emit)


def _merge_reduces(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """reduce(reduce(x, axes, keepdims=1), axes) -> reduce(x, axes): the outer one only drops size-1 dims."""
    inner = producer_of(node.inputs[0], node.op_type)
    if inner is None or len(inner.inputs) < 2 or len(node.inputs) < 2 or not only_use(node.inputs[0]):
        return None
    keep = inner.attributes.get("keepdims")
    axes, inner_axes = const_array(node.inputs[1]), const_array(inner.inputs[1])
    rank = len(static_shape(inner.inputs[0]))
    if (keep is not None and keep.as_int() != 1) or axes is None or inner_axes is None:
        return None
    if {int(a) % rank for a in axes.reshape(-1)} != {int(a) % rank for a in inner_axes.reshape(-1)}:
        return None
    return emit(node.op_type, inner.inputs[0], inner.inputs[1], like=node.outputs[0],
                attrs=tuple(node.attributes.values()))


def _sqrt(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """sqrt(ReduceSumSquare(x)) -> ReduceL2(x) (jnp.linalg.norm)."""
    total = producer_of(node.inputs[0], "ReduceSumSquare")
    if total is None or not only_use(node.inputs[0]) or not emit.allows("ReduceL2", node.outputs[0]):
        return None
    return emit("ReduceL2", *total.inputs, like=node.outputs[0], attrs=tuple(total.attributes.values()))


def _or(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """(x == inf) or (x == -inf) -> isinf(x) (jnp.isinf, and isfinite through nan_to_num)."""
    equals = [producer_of(v, "Equal") for v in node.inputs]
    if None in equals:
        return None
    found = []
    for equal in equals:
        for x, c in (equal.inputs, equal.inputs[::-1]):
            constant = scalar_array(c)
            if constant is not None and constant.dtype.kind == "f" and np.isinf(constant):
                found.append((x, float(constant)))
                break
    if (len(found) != 2 or found[0][0] is not found[1][0] or found[0][1] == found[1][1]
            or not emit.allows("IsInf", found[0][0])):
        return None
    return emit("IsInf", found[0][0], like=node.outputs[0])


# ORT's broadcasting loop calls its kernel once per contiguous run that both operands share:
# x[N,1,2] - y[1,N,2] makes N*N calls of 2 elements (measured 22 ms for N=1000, f64, one thread).
# Expanding x first (a block copy) leaves y broadcast in runs of N*2: 5 ms with the Expand.
_WIDEN_MIN_ELEMENTS = 1 << 16
_WIDEN_MAX_RUN = 16


def _widen_broadcast(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """Materializes the operand that broadcasts just before a short last axis, so the kernel runs long."""
    out = static_shape(node.outputs[0])
    if len(out) < 2 or out[-1] > _WIDEN_MAX_RUN or int(np.prod(out)) < _WIDEN_MIN_ELEMENTS or len(node.inputs) != 2:
        return None
    shapes = [static_shape(v) for v in node.inputs]
    if any(len(s) != len(out) for s in shapes):
        return None
    for i, (x, y) in enumerate((shapes, shapes[::-1])):
        if x[-1] == y[-1] == out[-1] and x[-2] == 1 < out[-2] == y[-2]:
            wide = emit("Expand", node.inputs[i], emit.graph_shape(out), like=node.outputs[0])
            operands = [wide, node.inputs[1]] if i == 0 else [node.inputs[0], wide]
            return emit(node.op_type, *operands, like=node.outputs[0])
    return None


def _conditional_shift(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """where(m, x + k, x) -> x + float(m) * k for a finite constant k (jnp.mod's fix-up of a negative fmod).

    ORT's Where costs about 10 ns an element (measured on 2M f64: 20 ms against 1.4 ms for an Add); Cast, Mul
    and Add are three fast passes. Same values, the sign of a zero aside: x + 0 turns an unselected -0 into +0."""
    m, shifted, x = node.inputs
    add, out = producer_of(shifted, "Add"), static_shape(node.outputs[0])
    if add is None or int(np.prod(out)) < _WIDEN_MIN_ELEMENTS or static_shape(m) != out:
        return None
    if not node.outputs[0].dtype.is_floating_point():
        return None
    for a, k in (add.inputs, add.inputs[::-1]):
        shift = scalar_array(k)
        if a is x and shift is not None and np.isfinite(shift):
            mask = emit("Cast", m, like=node.outputs[0], attrs=(ir.AttrInt64("to", node.outputs[0].dtype.value),))
            return emit("Add", x, emit("Mul", mask, k, like=node.outputs[0]), like=node.outputs[0])
    return None


def _gemm(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """Gemm(a, b, reshape(c, [1, n])) -> Gemm(a, b, c): Gemm's C broadcasts from [n] itself (Dense's bias)."""
    if len(node.inputs) != 3 or node.inputs[2] is None:
        return None
    reshape, out = producer_of(node.inputs[2], "Reshape"), static_shape(node.outputs[0])
    bias = reshape.inputs[0] if reshape is not None else None
    if bias is None or static_shape(bias) != out[1:] or static_shape(node.inputs[2]) != (1, out[1]):
        return None
    return emit("Gemm", *node.inputs[:2], bias, like=node.outputs[0], attrs=tuple(node.attributes.values()))


def _transpose(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """Gemm(x, y)^T -> Gemm(y, x) with the transposes swapped: (op(x) op(y))^T = op(y)^T op(x)^T.
    jax's gradient of a dense layer's weight comes out as dot(g^T, h) then a transpose."""
    gemm, perm = producer_of(node.inputs[0], "Gemm"), node.attributes.get("perm")
    if gemm is None or len(gemm.inputs) != 2 or perm is None or list(perm.as_ints()) != [1, 0]:
        return None
    if not only_use(node.inputs[0]):
        return None
    flags = {name: gemm.attributes[name].as_int() if name in gemm.attributes else 0 for name in ("transA", "transB")}
    extra = tuple(a for a in gemm.attributes.values() if a.name not in flags)
    swapped = (ir.AttrInt64("transA", 1 - flags["transB"]), ir.AttrInt64("transB", 1 - flags["transA"]))
    return emit("Gemm", gemm.inputs[1], gemm.inputs[0], like=node.outputs[0], attrs=swapped + extra)


# Ops whose every output element is one of their data inputs' elements: a value exactly representable in
# a narrower float stays so through them. op -> which inputs are data (None: all).
_PASS_VALUES = {"Where": (1, 2), "Neg": None, "Abs": None, "Max": None, "Min": None, "ReduceMax": (0,),
                "ReduceMin": (0,), "Concat": None, "Reshape": (0,), "Squeeze": (0,), "Unsqueeze": (0,),
                "Expand": (0,), "Transpose": (0,), "Slice": (0,), "Gather": (0,), "Identity": None, "Relu": None}


def _fits_in(value: ir.Value, narrow: ir.DataType, memo: dict) -> bool:
    """Whether every element of `value` is exactly representable in the float type `narrow`."""
    if value in memo:
        return memo[value]
    memo[value] = False  # also what a cycle would give (graphs have none)
    array, node = const_array(value), value.producer()
    if array is not None:
        back = array.astype(narrow.numpy()).astype(array.dtype)
        fits = bool(np.all((back == array) | np.isnan(array)))
    elif node is None or node.domain != "":
        fits = False
    elif node.op_type == "Cast":
        fits = node.inputs[0].dtype == narrow
    elif node.op_type in _PASS_VALUES:
        positions = _PASS_VALUES[node.op_type] or range(len(node.inputs))
        fits = all(node.inputs[i] is not None and _fits_in(node.inputs[i], narrow, memo) for i in positions)
    else:
        fits = False
    memo[value] = fits
    return fits


def _iota(value: ir.Value) -> tuple[int, int] | None:
    """(axis, offset) when a 2-D `value` counts along one axis from `offset`: reshape(range(s, l, 1)) + splat."""
    node, shape = value.producer(), static_shape(value)
    if node is None or node.domain != "" or shape is None or len(shape) != 2:
        return None
    if node.op_type == "Add":
        for a, c in (node.inputs, node.inputs[::-1]):
            found, splat = _iota(a), splat_of(c)
            if found is not None and splat is not None and splat.dtype.kind in "iu":
                return found[0], found[1] + int(splat)
        return None
    counting = producer_of(node.inputs[0], "Range") if node.op_type == "Reshape" else None
    start, delta = (scalar_array(counting.inputs[i]) for i in (0, 2)) if counting is not None else (None, None)
    if start is None or delta is None or delta != 1 or shape.count(1) != 1:
        return None
    return 1 - shape.index(1), int(start)


def _eye(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """Cast(i + k == j) -> EyeLike(k): jnp.eye too large to fold, seven nodes at run time (jax-md's pair mask)."""
    equal, out = producer_of(node.inputs[0], "Equal"), static_shape(node.outputs[0])
    if equal is None or len(out) != 2 or not emit.allows("EyeLike", node.outputs[0]):
        return None
    found = [_iota(v) for v in equal.inputs]
    if None in found or {axis for axis, _ in found} != {0, 1}:
        return None
    (_, row), (_, col) = sorted(found)
    zeros = emit("ConstantOfShape", emit.graph_shape(out), like=node.outputs[0])
    zeros.type = ir.TensorType(ir.DataType.FLOAT)
    return emit("EyeLike", zeros, like=node.outputs[0],
                attrs=(ir.AttrInt64("dtype", node.outputs[0].dtype.value), ir.AttrInt64("k", row - col)))


def _cast(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """Cast(Cast(x, f16), f32) -> x when x holds f16 values already: the rounding the f16 results of ops
    run in f32 get (targets.py) is needed after arithmetic, not after a select or a max of such values."""
    if node.inputs[0].dtype == ir.DataType.BOOL:
        return _eye(node, emit)
    inner = producer_of(node.inputs[0], "Cast")
    x = inner.inputs[0] if inner is not None else None
    narrow = node.inputs[0].dtype
    if x is None or narrow not in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16) or x.dtype != node.outputs[0].dtype:
        return None
    return x if _fits_in(x, narrow, {}) else None


RULES: dict[str, NodeRule] = {
    "Pow": _pow_one, "Equal": _equal, "Not": _not, "And": _and, "Where": _where, "Add": _add,
    "ReduceSum": _reduce_sum, "ReduceMax": _merge_reduces, "ReduceMin": _merge_reduces, "Sqrt": _sqrt, "Or": _or,
    "Gemm": _gemm, "Transpose": _transpose, "Cast": _cast,
}
_WIDEN = {**dict.fromkeys(("Add", "Sub", "Mul", "Div"), _widen_broadcast), "Where": _conditional_shift}


def widen_broadcasts(model: ir.Model) -> int:
    """The last step of `optimize`: clean-up would take these Expands out again."""
    return sum(rewrite(graph, _WIDEN) for graph in all_graphs(model.graph))


def simplify(model: ir.Model, target: Target | None = None, rules: dict[str, NodeRule] | None = None) -> int:
    """Applies the node rules (RULES unless given) to every graph of `model` until none applies; returns how
    many nodes went."""
    total, opset, rules = 0, model.opset_imports.get("", 0), RULES if rules is None else rules
    for _ in range(8):
        # Dominated selects first: merging nested selects changes the masks they are recognized by.
        changed = sum(drop_dominated_selects(graph) for graph in all_graphs(model.graph))
        changed = changed or sum(rewrite(graph, rules, target, opset) for graph in all_graphs(model.graph))
        if not changed:
            break
        for graph in all_graphs(model.graph):
            remove_unused(graph)
        total += changed
    return total
