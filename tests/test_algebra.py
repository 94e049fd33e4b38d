"""Exact algebraic rewrites (hlo2onnx/patterns/algebra.py) and the clean-up of loop bodies.

Each case must still match jax.jit (values, NaN/inf positions included), and the
nodes the rewrite exists to remove must be gone from the graph.
"""
from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from harness import Case, rand, run_case
from mnjit import mnjit

F32 = np.float32
x64_ = rand((16, 8), seed=1)
# Zeros, signed zeros, infinities and NaNs where a select's masked-out branch would misbehave.
special = np.array([[0.0, -0.0, 1.5, -2.5, np.inf, -np.inf, np.nan, 3.0]] * 4, F32)
ints = np.array([[7, -7, 0, 3, -1, 5, 0, 2]] * 3, np.int32)


def all_ops(fun, *args) -> Counter:
    """Op counts over the main graph and every Loop/If body."""
    graph = mnjit(fun).lower(*args).onnx_model.graph
    counts: Counter = Counter()

    def walk(g):
        for node in g.node:
            counts[node.op_type] += 1
            for attr in node.attribute:
                if attr.g.node:
                    walk(attr.g)
                for sub in attr.graphs:
                    walk(sub)
    walk(graph)
    return counts


def safe_sqrt(x):
    """jax-md's safe_mask: the select is repeated around the sqrt."""
    mask = x > 0
    return jnp.where(mask, jnp.sqrt(jnp.where(mask, x, 0.0)), 0.0)


def select_grad(x):
    """Both branches read x: its cotangent is where(m, g, 0) + where(m, 0, g) (jnp.remainder's fix-up)."""
    return jax.grad(lambda x: jnp.sum(jnp.sin(jnp.where(x > 0, x, x + 1.0))))(x)


# (case, op -> the most of it allowed after the rewrites)
CASES = [
    (Case("pow_one", lambda x: jnp.power(x, F32(1.0)) * 3.0, (special,)), {"Pow": 0}),
    (Case("pow_one_grad", jax.grad(lambda x: jnp.sum(jnp.power(1.0 - x, F32(2.0)))), (x64_,)), {"Pow": 0}),
    (Case("remainder", lambda x: jnp.remainder(x, 2.5), (np.concatenate([special, x64_[:4] * 4]),)),
     {"Equal": 0, "Not": 0, "And": 0}),
    (Case("remainder_f64", lambda x: jnp.remainder(x, 35.3), (rand((6, 5), np.float64, seed=2, low=-80, high=80),),
          x64=True), {"Equal": 0, "Not": 0, "And": 0}),
    (Case("safe_sqrt", safe_sqrt, (special,)), {"Where": 1}),
    (Case("safe_sqrt_grad", jax.grad(lambda x: jnp.sum(safe_sqrt(x))), (special,)), {"Where": 1}),
    (Case("select_grad", select_grad, (special,)), {"Where": 1}),
    (Case("nan_to_num", lambda x: jnp.nan_to_num(x * 2.0), (special,)), {}),
    (Case("nan_to_num_grad", jax.grad(lambda x: jnp.sum(jnp.nan_to_num(x * x))), (special,)), {"Where": 1}),
    (Case("nested_or", lambda a, b, x: jnp.where(a, 0.0, jnp.where(b, 0.0, x)),
          (x64_ > 0, x64_ > 1, x64_)), {"Where": 1}),
    (Case("nested_and", lambda a, b, x: jnp.where(a, jnp.where(b, x, 2.0), 2.0),
          (x64_ > 0, x64_ > 1, x64_)), {"Where": 1}),
    (Case("nested_other_fill", lambda a, b, x: jnp.where(a, 0.0, jnp.where(b, 1.0, x)),
          (x64_ > 0, x64_ > 1, x64_)), {"Where": 2}),
    (Case("reduce_neg", lambda x: jnp.sum(-jnp.exp(x), axis=0), (x64_,)), {}),
    (Case("same_branches", lambda m, x: jnp.where(m, x, x) * 2.0, (x64_ > 0, x64_)), {"Where": 0}),
    (Case("bool_eq", lambda a, b: (a == True) & ((b == False) | a), (x64_ > 0, x64_ > 1)), {"Equal": 0}),  # noqa: E712
    (Case("isnan_ne", lambda x: jnp.where(x != x, 1.0, x), (special,)), {"Equal": 0, "Not": 0}),
    # An integer division made safe by a select stays safe: ORT fails on a zero divisor.
    (Case("int_safe_div", lambda x, y: jnp.where(y == 0, 0, x // jnp.where(y == 0, 1, y)), (ints, ints[::-1])), {}),
    (Case("int_rem_by_zero", lambda x, y: lax.rem(x, y), (ints, ints[:, ::-1])), {}),
    (Case("add_neg", lambda x, y: x + (-jnp.exp(y)), (x64_, x64_[::-1])), {"Neg": 0, "Add": 0}),
    (Case("sum_squares", lambda x: jnp.sum(x * x, axis=1), (x64_,)), {"Mul": 0, "ReduceSum": 0}),
    (Case("norm", lambda x: jnp.linalg.norm(x, axis=-1), (x64_,)), {"Sqrt": 0, "ReduceL2": 1}),
    (Case("norm_f64", lambda x: jnp.sqrt(jnp.sum(x * x, axis=0)), (x64_.astype(np.float64),), x64=True),
     {"Sqrt": 0, "ReduceL2": 1}),
    (Case("isinf", lambda x: jnp.where(jnp.isinf(x), 0.0, x), (special,)), {"Equal": 0, "Or": 0}),
    # A sum of a broadcast one-element value is that value times the count, as XLA simplifies it (the
    # closed-over np.ones is a splat constant): the broadcast is never materialized.
    (Case("sum_of_splat_constant", lambda x: (jnp.asarray(np.ones(100_000, F32)) * x).sum(), (F32(1.1),)),
     {"ReduceSum": 0, "Expand": 0}),
    (Case("sum_of_broadcast_axes", lambda x: jnp.broadcast_to(x, (3, 5, 7)).sum(axis=(0, 2)), (F32(-2.3),)),
     {"ReduceSum": 0}),
    (Case("sum_of_broadcast_special", lambda x: jnp.stack([jnp.broadcast_to(v, (999,)).sum() for v in x]),
          (special[0],)), {"ReduceSum": 0}),
    (Case("sum_of_broadcast_f64", lambda x: jnp.broadcast_to(x, (4, 9)).sum(axis=1, keepdims=True),
          (np.float64(0.1),), x64=True), {"ReduceSum": 0}),
    (Case("nested_sums", lambda x: jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=1), (x64_,)), {"ReduceSum": 1}),
    (Case("dense_bias", lambda x, w, b: jnp.dot(x, w) + b, (x64_, rand((8, 5), seed=3), rand((5,), seed=4))),
     {"Reshape": 0, "Gemm": 1}),
    (Case("big_eye", lambda x: x * (1.0 - jnp.eye(1100, 1000, -2)), (np.ones((1100, 1000), F32),)),
     {"Range": 0, "Equal": 0, "EyeLike": 1}),
    (Case("min_of_stack", lambda a, b: jnp.min(jnp.array([a * F32(1.1), b])), (F32(np.nan), F32(2.0))),
     {"ReduceMin": 0, "IsNaN": 0, "Min": 1}),
    (Case("max_of_stack", lambda a, b: jnp.max(jnp.stack([a, b, a * b]), axis=0), (x64_, x64_[::-1])),
     {"ReduceMax": 0, "Max": 1}),
    # f16 arithmetic runs in f32 and rounds after each op (targets.py); selects of rounded values need no rounding.
    (Case("f16_select_chain", lambda m, a, b: jnp.where(m, jnp.where(~m, a * b, a), b + a) * a,
          (x64_ > 0, x64_.astype(np.float16), x64_[::-1].astype(np.float16))), {"Cast": 7}),
    # Data movement composed (patterns/movement.py): one copy instead of two.
    (Case("slice_slice", lambda x: x[2:14, 1:][1:5, ::1], (x64_,)), {"Slice": 1}),
    (Case("slice_pad", lambda x: jnp.pad(x, 2, constant_values=7.0)[1:-1, 3:], (x64_,)), {"Slice": 0, "Pad": 1}),
    (Case("slice_concat", lambda a, x: jnp.concatenate([a, x, a])[1:-1] * 2.0, (x64_[:1], x64_)),
     {"Slice": 0, "Concat": 0}),
    (Case("slice_concat_pieces", lambda a, x: jnp.concatenate([a, x, a, a])[1:17] + 1.0, (x64_[:1], x64_)),
     {"Slice": 0, "Concat": 1}),
    (Case("pad_pad", lambda x: jnp.pad(jnp.pad(x, 1) * 1.0, ((2, 0), (0, 3))), (x64_,)), {"Pad": 1}),
    (Case("pad_slice", lambda x: jnp.pad(x[1:, :-2], ((0, 1), (2, 0)), constant_values=-1.0), (x64_,)),
     {"Slice": 0, "Pad": 1}),
    (Case("pad_slice_same_side", lambda x: jnp.pad(x[:-1], ((0, 1), (0, 0))), (x64_,)), {}),
    # jnp.mod's fix-up on a large array: a shift by the divisor where fmod went negative, without ORT's slow Where.
    (Case("big_remainder", lambda x: jnp.remainder(x, 2.5),
          (np.concatenate([special.ravel(), rand((70000,), seed=5, low=-9, high=9)]),)), {"Where": 0}),
    (Case("pad_wrap", lambda x: jnp.pad(x, ((2, 1), (0, 0)), mode="wrap") * 2.0, (x64_,)),
     {"Slice": 0, "Concat": 0, "Pad": 1}),
    (Case("pad_wrap_one_side", lambda x: jnp.pad(x, ((0, 0), (0, 3)), mode="wrap") + 1.0, (x64_,)),
     {"Slice": 0, "Concat": 0, "Pad": 1}),
    (Case("reverse_size_one", lambda x: x[:, 3:4][:, ::-1] + 1.0, (x64_,)), {"Slice": 1}),
    # tanh' = 1 - tanh^2 cancels near saturation and the gradient sums 16 products of |x| <= 3, so its
    # absolute error is about 16 * 3 * eps: jax.jit's own results on jaxlib 0.10 and 0.12 differ by 3.2e-6.
    (Case("dense_weight_grad", jax.grad(lambda w, x: jnp.sum(jnp.tanh(jnp.dot(x, w)))),
          (rand((8, 5), seed=3), x64_), tol=(2e-6, 1e-5)), {"Transpose": 0}),
]


@pytest.mark.parametrize("case,limits", CASES, ids=[c.name for c, _ in CASES])
def test_rewrite(case, limits):
    run_case(case)
    with jax.enable_x64(case.x64):
        ops = all_ops(case.fun, *case.args)
    over = {op: ops[op] for op, most in limits.items() if ops[op] > most}
    assert not over, f"{over} over {limits} in {dict(ops)}"


def test_reduce_of_negation_negates_the_small_result():
    graph = mnjit(lambda x: jnp.sum(-jnp.exp(x), axis=0)).lower(x64_).onnx_model.graph
    order = [node.op_type for node in graph.node]
    assert order.index("Neg") > order.index("ReduceSum"), order


def test_dominated_select_keeps_masked_nan():
    """where(m, log(where(m, x, 1)), 0): outside m the inner log never sees the raw x."""
    def fun(x):
        m = x > 0
        return jnp.where(m, jnp.log(jnp.where(m, x, 1.0)), 0.0), jnp.where(m, x, 1.0)
    run_case(Case("dominated_shared", fun, (special,)))  # the inner select is also an output: it stays


def test_loop_body_is_cleaned():
    """Broadcast constants, x * 1 and x + 0 inside a fori_loop body go, as they do in the main graph."""
    def fun(x):
        def body(i, x):
            ones, zeros = jnp.ones_like(x), jnp.zeros_like(x)
            return jnp.sin(x * ones + zeros) + jnp.full_like(x, 0.5) + jnp.sin(x * ones + zeros)
        return lax.fori_loop(0, 4, body, x)
    run_case(Case("loop_clean", fun, (x64_,)))
    ops = all_ops(fun, x64_)
    assert ops["Loop"] == 1 and not ops["Expand"] and not ops["Mul"] and ops["Sin"] == 1, dict(ops)


def test_short_broadcast_runs_are_widened():
    """x[:, None] - x[None] on [N, 2] points: the operand broadcast before the short last axis is expanded."""
    points = rand((300, 2), seed=7)
    fun = lambda x: jnp.sum((x[:, None, :] - x[None, :, :]) ** 2, axis=-1)  # noqa: E731
    run_case(Case("pairwise", fun, (points,)))
    assert all_ops(fun, points)["Expand"] == 1
    small = rand((20, 2), seed=7)  # below the size where it pays: left to ORT's broadcasting
    assert all_ops(fun, small)["Expand"] == 0
