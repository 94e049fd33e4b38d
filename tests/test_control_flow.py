"""Control flow (while -> Loop, case/if -> If), each compared with jax.jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from jax import lax

from harness import Case, rand, run_case
from mnjit import mnjit

# -- cases ----------------------------------------------------------------------------------------------------
F32 = np.float32
x3, x4 = rand((3,)), rand((4,), seed=1)
xs53 = rand((5, 3), seed=2)
xs6_23 = rand((6, 2, 3), seed=3)
W33 = rand((3, 3), seed=4, low=-0.5, high=0.5)


def collatz_steps(n):
    def body(c):
        v, steps = c
        return jnp.where(v % 2 == 0, v // 2, 3 * v + 1), steps + 1
    return lax.while_loop(lambda c: c[0] > 1, body, (n, 0))


def scan_pytree(carry, xs):
    def step(c, x):
        new = {"sum": c["sum"] + x, "prod": c["prod"] * jnp.tanh(x)}
        return new, (new["sum"].sum(), x * c["prod"])
    return lax.scan(step, carry, xs)


def nested_scan(c0, xs):
    def outer(c, row):
        def inner(d, v):
            return d * 0.5 + v, d + v
        d, ys = lax.scan(inner, c, row)
        return d, (ys, d.sum())
    return lax.scan(outer, c0, xs)


def while_in_scan(xs):
    def step(c, x):
        v, k = lax.while_loop(lambda s: s[0] < 4.0, lambda s: (s[0] * 1.5 + 0.1, s[1] + 1), (jnp.abs(x) + c, 0))
        return c + 0.25, (v, k)
    return lax.scan(step, 0.0, xs)


def scan_in_while(x, n):
    def body(s):
        i, v = s
        v, ys = lax.scan(lambda c, y: (jnp.sin(c) + y, c * y), v, jnp.stack([v, v * 2, v * 3]))
        return i + 1, v + ys.sum(0)
    return lax.while_loop(lambda s: s[0] < n, body, (0, x))


def cond_in_scan(xs):
    def step(c, x):
        c = lax.cond(x.sum() > 0, lambda a: a + x, lambda a: a * 0.5 - x, c)
        return c, lax.switch(jnp.int32(jnp.abs(x[0]) * 2), [jnp.sin, jnp.cos, jnp.tanh], c)
    return lax.scan(step, jnp.zeros(3, F32), xs)


CASES = [
    # while_loop
    Case("while_traced_bound", lambda x, n: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 1.1),
                                                           (0, x)), (x3, np.int32(7))),
    Case("while_data_dependent_f32", lambda x: lax.while_loop(lambda c: c[0] < 100, lambda c: (c[0] * 2 + 1, c[1] + 1),
                                                               (jnp.abs(x[0]) + 1, 0)), (x3,)),
    Case("while_collatz_i32", collatz_steps, (np.int32(27),)),
    Case("while_zero_trips", lambda x: lax.while_loop(lambda c: c.sum() > 1e9, lambda c: c * 2, x), (x3,)),
    Case("while_bool_carry", lambda x: lax.while_loop(lambda c: c[1], lambda c: (c[0] * 0.5, c[0].max() > 0.1),
                                                       (x, True)), (jnp.abs(x3) + 1,)),
    Case("while_x64", lambda x, n: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 1.0001 + c[0]),
                                                  (jnp.int64(0), x)),
         (x3.astype(np.float64), np.int64(50)), x64=True),
    Case("while_swap", lambda a, b, n: lax.while_loop(lambda c: c[2] < n, lambda c: (c[1], c[0] + 1, c[2] + 1),
                                                      (a, b, 0)), (x3, x3 * 2, np.int32(5))),
    Case("jvp_while", lambda x, n: jax.jvp(lambda x: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1,
                                                                                                   jnp.sin(c[1])),
                                                                    (0, x))[1], (x,), (jnp.ones_like(x),)),
         (x3, np.int32(4))),
    # fori_loop
    Case("fori_static_f32", lambda x: lax.fori_loop(0, 5, lambda i, c: c * 2 + i, x), (x3,)),
    Case("fori_static_offset", lambda x: lax.fori_loop(3, 9, lambda i, c: c * 0.5 + i, x), (x3,)),
    Case("fori_static_zero_trips", lambda x: lax.fori_loop(4, 4, lambda i, c: c * 2 + i, x), (x3,)),
    Case("fori_traced_f32", lambda x, n: lax.fori_loop(0, n, lambda i, c: c * 2 + i, x), (x3, np.int32(4))),
    Case("fori_traced_bounds", lambda x, lo, hi: lax.fori_loop(lo, hi, lambda i, c: c + jnp.sin(c * i), x),
         (x3, np.int32(2), np.int32(7))),
    Case("fori_traced_bounds_empty", lambda x, lo, hi: lax.fori_loop(lo, hi, lambda i, c: c + jnp.sin(c * i), x),
         (x3, np.int32(9), np.int32(3))),
    Case("fori_traced_bounds_x64", lambda x, lo, hi: lax.fori_loop(lo, hi, lambda i, c: c * 0.5 + i, x),
         (x3.astype(np.float64), np.int64(-2), np.int64(5)), x64=True),
    Case("fori_traced_zero_trips", lambda x, n: lax.fori_loop(0, n, lambda i, c: c * 2 + i, x), (x3, np.int32(-3))),
    Case("fori_int_carry", lambda a: lax.fori_loop(0, 6, lambda i, c: (c * 3 + i) % 1000, a),
         (rand((4,), np.int32),)),
    Case("fori_x64", lambda x, n: lax.fori_loop(0, n, lambda i, c: (c[0] * 1.5 + i, c[1] + i * i), (x, jnp.int64(0))),
         (x3.astype(np.float64), np.int64(9)), x64=True),
    Case("fori_closure_const", lambda x: lax.fori_loop(0, 4, lambda i, c: jnp.tanh(W33 @ c + i), x), (x3,),
         tol=(1e-5, 1e-6)),
    Case("fori_closure_arg", lambda x, w: lax.fori_loop(0, 4, lambda i, c: jnp.tanh(w @ c) + x, x), (x3, W33),
         tol=(1e-5, 1e-6)),
    Case("fori_nested", lambda x: lax.fori_loop(0, 3, lambda i, c: lax.fori_loop(0, i + 2, lambda j, d: d * 0.9 + j,
                                                                                 c), x), (x3,)),
    # scan
    Case("scan_forward", lambda c, xs: lax.scan(lambda c, x: (c + x, c * x), c, xs), (x3, xs53)),
    Case("scan_reverse", lambda c, xs: lax.scan(lambda c, x: (c * 0.5 + x, c - x), c, xs, reverse=True),
         (x3, xs53)),
    Case("scan_pytree", scan_pytree, ({"sum": x3, "prod": x3 + 1}, xs53)),
    Case("scan_no_xs", lambda c: lax.scan(lambda c, _: (c * 1.5, (c, c.sum())), c, None, length=4), (x3,)),
    Case("scan_const_ys", lambda c, xs: lax.scan(lambda c, x: (c + x, jnp.float32(1)), c, xs), (x3, xs53)),
    Case("scan_ys_is_carry", lambda c, xs: lax.scan(lambda c, x: (c + x, c), c, xs), (x3, xs53)),
    Case("scan_rank3", lambda c, xs: lax.scan(lambda c, x: (c + x.sum(0), x * c), c, xs), (x3, xs6_23)),
    Case("scan_empty", lambda c, xs: lax.scan(lambda c, x: (c + x, c * x), c, xs), (x3, xs53[:0])),
    Case("scan_length1", lambda c, xs: lax.scan(lambda c, x: (c + x, c * x), c, xs), (x3, xs53[:1])),
    Case("scan_unroll2", lambda c, xs: lax.scan(lambda c, x: (c * 0.9 + x, c), c, xs, unroll=2), (x3, xs53)),
    Case("scan_int_ys", lambda c, xs: lax.scan(lambda c, x: (c + x, c * x), c, xs),
         (rand((3,), np.int32), rand((5, 3), np.int32, seed=1))),
    Case("scan_x64", lambda c, xs: lax.scan(lambda c, x: (c * x + 1, (c, jnp.int64(1) + x.astype(jnp.int64))), c, xs),
         (x3.astype(np.float64), xs53.astype(np.float64)), x64=True),
    Case("map", lambda xs: lax.map(lambda x: jnp.sin(x) * x.sum(), xs), (xs53,)),
    Case("scan_nested", nested_scan, (x3, rand((4, 5, 3), seed=6))),
    Case("while_in_scan", while_in_scan, (rand((5,), seed=7),)),
    Case("scan_in_while", scan_in_while, (x3, np.int32(3)), tol=(1e-5, 1e-6)),
    # row writes the scan pattern must leave alone (or may take, for the last two)
    Case("fori_traced_row_writes", lambda b, n: lax.fori_loop(
        1, n, lambda i, b: lax.dynamic_update_index_in_dim(b, b[i - 1] * 2 + i, i, 0), b), (xs53, np.int32(4))),
    Case("fori_partial_rows", lambda b: lax.fori_loop(
        0, 3, lambda i, b: lax.dynamic_update_index_in_dim(b, jnp.full(3, i, F32), i, 0), b), (xs53,)),
    Case("fori_strided_rows", lambda b: lax.fori_loop(
        0, 2, lambda i, b: lax.dynamic_update_index_in_dim(b, jnp.full(3, i, F32), 2 * i, 0), b), (xs53[:4],)),
    Case("fori_read_and_write", lambda b: lax.fori_loop(
        0, 5, lambda i, b: lax.dynamic_update_index_in_dim(b, b.sum(0) * 0.1 + i, i, 0), b), (xs53,)),
    Case("fori_all_rows", lambda b: lax.fori_loop(
        0, 5, lambda i, b: lax.dynamic_update_index_in_dim(b, jnp.full(3, i * i, F32), i, 0), b), (xs53,)),
    Case("fori_all_rows_reversed", lambda b: lax.fori_loop(
        0, 5, lambda i, b: lax.dynamic_update_index_in_dim(b, jnp.full(3, i * i, F32), 4 - i, 0), b), (xs53,)),
    # narrow float carries
    Case("scan_f16", lambda c, xs: lax.scan(lambda c, x: (c * x + 1, c), c, xs),
         (x3.astype(np.float16), xs53.astype(np.float16))),
    # (bf16 crosses in and out as f32: mnjit's runtime cannot feed bf16 arrays to ORT yet)
    Case("fori_bf16_carry", lambda x: lax.fori_loop(0, 3, lambda i, c: c * c - c, x.astype(jnp.bfloat16))
         .astype(F32), (x3 * 0.5,), tol=(1.6e-2, 1.6e-2)),
    # grad through loops
    Case("grad_scan", jax.grad(lambda c, xs: lax.scan(lambda c, x: (jnp.sin(c * x), c * x), c, xs)[1].sum()),
         (x3, xs53), tol=(1e-5, 1e-6)),
    Case("grad_scan_reverse", jax.grad(lambda c, xs: lax.scan(lambda c, x: (jnp.tanh(c + x), c * c), c, xs,
                                                              reverse=True)[0].sum(), argnums=(0, 1)),
         (x3, xs53), tol=(1e-5, 1e-6)),
    Case("grad_fori", jax.grad(lambda x: lax.fori_loop(0, 4, lambda i, c: jnp.sin(c) * 1.5 + i, x).sum()), (x3,),
         tol=(1e-5, 1e-6)),
    Case("grad_scan_x64", jax.grad(lambda c, xs: lax.scan(lambda c, x: (jnp.cos(c) * x, c), c, xs)[0].sum()),
         (x3.astype(np.float64), xs53.astype(np.float64)), x64=True),
    # cond / switch
    Case("cond_bool", lambda x: lax.cond(x[0] > 0, lambda y: y * 3, lambda y: y - 1, x), (x3,)),
    Case("cond_false", lambda x: lax.cond(x[0] > 100, lambda y: y * 3, lambda y: y - 1, x), (x3,)),
    Case("cond_pytree", lambda p, a, b: lax.cond(p, lambda a, b: (a + b, {"k": a.sum()}),
                                                 lambda a, b: (a - b, {"k": b.max()}), a, b), (True, x3, x3 * 2)),
    Case("cond_int_pred", lambda i, x: lax.cond(i, lambda y: y, lambda y: -y, x), (np.int32(5), x3)),
    *[Case(f"switch3_{i}", lambda i, x: lax.switch(i, [lambda y: y, lambda y: y * 2, lambda y: jnp.sin(y)], x),
           (np.int32(i), x3)) for i in (-4, 0, 1, 2, 9)],
    *[Case(f"switch5_{i}", lambda i, x: lax.switch(i, [lambda y, k=k: y * k for k in range(5)], x),
           (np.int32(i), x3)) for i in (0, 2, 3, 4)],
    Case("cond_in_scan", cond_in_scan, (xs53,)),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_control_flow(case: Case) -> None:
    run_case(case)


def _loops(graph: onnx.GraphProto):
    for node in graph.node:
        if node.op_type == "Loop":
            yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _loops(attr.g)


def test_scan_becomes_loop_with_scan_outputs() -> None:
    """lax.scan's stacked ys leave the loop as scan outputs: no buffer is carried through the iterations."""
    fun = lambda c, xs: lax.scan(lambda c, x: (c + x, (c * x, c.sum())), c, xs)  # noqa: E731
    model = mnjit(fun).lower(x3, xs53).onnx_model
    (loop,) = _loops(model.graph)
    body = next(a.g for a in loop.attribute if a.name == "body")
    carried = len(loop.input) - 2
    assert len(loop.output) == carried + 2  # two scan outputs
    # Only the counter and the carry travel: xs is read from the outer scope, ys are scan outputs.
    assert [tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in body.input[2:]] == [(), (3,)]
    assert loop.input[0]  # static trip count


# -- ops JAX does not emit itself: hand-written StableHLO, checked against the jax.jit of the same semantics --
_IF_MODULE = """
func.func public @main(%p: tensor<i1>, %x: tensor<3xf32>) -> tensor<3xf32> {
  %0 = "stablehlo.if"(%p) ({
    %1 = stablehlo.multiply %x, %x : tensor<3xf32>
    stablehlo.return %1 : tensor<3xf32>
  }, {
    %1 = stablehlo.negate %x : tensor<3xf32>
    stablehlo.return %1 : tensor<3xf32>
  }) : (tensor<i1>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}
"""
# stablehlo.case on an unclamped index: out-of-range indices take the last branch.
_CASE_MODULE = """
func.func public @main(%i: tensor<i32>, %x: tensor<3xf32>) -> tensor<3xf32> {
  %0 = "stablehlo.case"(%i) ({
    stablehlo.return %x : tensor<3xf32>
  }, {
    %1 = stablehlo.add %x, %x : tensor<3xf32>
    stablehlo.return %1 : tensor<3xf32>
  }, {
    %1 = stablehlo.sine %x : tensor<3xf32>
    stablehlo.return %1 : tensor<3xf32>
  }) : (tensor<i32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}
"""
_BRANCHES = [lambda y: y, lambda y: y + y, jnp.sin]
HANDWRITTEN = [
    *[(f"if_{p}", _IF_MODULE, lambda p, x: lax.cond(p, lambda y: y * y, lambda y: -y, x), (np.bool_(p), x3))
      for p in (True, False)],
    *[(f"case_unclamped_{i}", _CASE_MODULE, lambda i, x: lax.switch(jnp.where((i < 0) | (i > 2), 2, i), _BRANCHES, x),
       (np.int32(i), x3)) for i in (-1, 0, 1, 2, 3, 100)],
]


@pytest.mark.parametrize("name,text,reference,args", HANDWRITTEN, ids=[h[0] for h in HANDWRITTEN])
def test_handwritten_stablehlo(name, text, reference, args) -> None:
    import onnx_ir as ir
    import onnxruntime as ort

    import hlo2onnx
    from harness import check_model

    model = ir.to_proto(hlo2onnx.translate(hlo2onnx.parse_module(text)))
    check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.asarray(a) for i, a in zip(session.get_inputs(), args)}
    (actual,) = session.run(None, feeds)
    np.testing.assert_allclose(actual, np.asarray(jax.jit(reference)(*args)), rtol=2e-6, atol=2e-6)


def _loop_signature(fun, *args) -> list[tuple[bool, bool, int, int]]:
    """(has trip count, has initial cond, carried, scan outputs) of every Loop in the model."""
    model = mnjit(fun).lower(*args).onnx_model
    return [(bool(loop.input[0]), bool(loop.input[1]), len(loop.input) - 2, len(loop.output) - len(loop.input) + 2)
            for loop in _loops(model.graph)]


@pytest.mark.parametrize("name,expected", [
    ("scan_reverse", [(True, False, 2, 1)]),  # counter and carry; ys leave as a scan output
    ("fori_traced_f32", [(True, False, 2, 0)]),  # trip count n - 0 computed before the loop, no cond
    ("fori_traced_bounds", [(True, False, 2, 0)]),
    ("while_data_dependent_f32", [(False, True, 2, 0)]),  # a real condition: evaluated every iteration
    ("fori_partial_rows", [(True, False, 3, 0)]),  # 3 of 5 rows written: the buffer stays carried
    ("fori_read_and_write", [(True, False, 3, 0)]),  # the body reads the buffer: stays carried
    ("fori_all_rows_reversed", [(True, False, 2, 1)]),  # user-written row stores, negative-index wrap included
    ("scan_nested", [(True, False, 2, 2), (True, False, 2, 1)]),
])
def test_loop_structure(name: str, expected) -> None:
    case = next(c for c in CASES if c.name == name)
    assert _loop_signature(case.fun, *case.args) == expected


ONE_OR_NO_STEP = [  # a static trip count of 1 or 0: no Loop, as XLA's while-loop simplifier does
    Case("fori_one_step", lambda x: lax.fori_loop(0, 1, lambda i, v: jnp.sin(v) * (i + 2), x), (x3,)),
    Case("fori_no_step", lambda x: lax.fori_loop(3, 3, lambda i, v: v * 2 + i, x), (x3,)),
    Case("scan_length_one", lambda c, xs: lax.scan(lambda c, x: (c * x, (c + x, c.sum())), c, xs),
         (x3, xs53[:1])),
    Case("scan_length_zero", lambda c, xs: lax.scan(lambda c, x: (c * x, c + x), c, xs), (x3, xs53[:0])),
    Case("fori_one_step_nested", lambda x: lax.fori_loop(0, 1, lambda i, v: lax.fori_loop(
        0, 3, lambda j, w: w * 0.5 + j, v), x), (x3,)),
]


@pytest.mark.parametrize("case", ONE_OR_NO_STEP, ids=repr)
def test_one_or_no_step_is_inlined(case: Case) -> None:
    run_case(case)
    loops = list(_loops(mnjit(case.fun).lower(*case.args).onnx_model.graph))
    assert len(loops) == (1 if case.name == "fori_one_step_nested" else 0)
