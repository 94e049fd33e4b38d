"""Ops jax's CPU lowering never emits, but other producers of StableHLO do (hand-written modules, other
platforms' exports, jax.export with symbolic shapes): each translated and compared with jax.jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export, lax

import hlo2onnx
from harness import Case, assert_same, rand, run_case
from mnjit.runtime import OrtRunner

C64 = np.complex64
Z4 = (rand((4,)) + 1j * rand((4,), seed=1)).astype(C64)


def _unary(op: str, dtype: str) -> str:
    return f"""func.func @main(%x: tensor<4x{dtype}>) -> tensor<4x{dtype}> {{
      %0 = stablehlo.{op} %x : tensor<4x{dtype}>
      return %0 : tensor<4x{dtype}>
    }}"""


def _complex_abs(real: str) -> str:
    return f"""func.func @main(%x: tensor<4xcomplex<{real}>>) -> tensor<4x{real}> {{
      %0 = stablehlo.abs %x : (tensor<4xcomplex<{real}>>) -> tensor<4x{real}>
      return %0 : tensor<4x{real}>
    }}"""


# Extremes that a naive sqrt(re^2 + im^2) over- or underflows.
Z_EXTREME = np.array([3e37 + 4e37j, 3e-30 - 4e-30j, 0j, -5 + 0j], C64)
HANDWRITTEN = [
    # jax 0.12 lowers jnp.abs of complex itself (no complex stablehlo.abs): other producers still emit it.
    ("abs_c64", _complex_abs("f32"), jnp.abs, (Z4,)),
    ("abs_c64_extremes", _complex_abs("f32"), jnp.abs, (Z_EXTREME,)),
    ("abs_c128", _complex_abs("f64"), jnp.abs, (Z4.astype(np.complex128) * 1e200,)),
    ("logistic_f32", _unary("logistic", "f32"), jax.nn.sigmoid, (rand((4,), low=-30, high=30),)),
    ("logistic_f64", _unary("logistic", "f64"), jax.nn.sigmoid, (rand((4,), np.float64, low=-700, high=700),)),
    ("sine_c64", _unary("sine", "complex<f32>"), jnp.sin, (Z4,)),
    ("cosine_c64", _unary("cosine", "complex<f32>"), jnp.cos, (Z4,)),
    ("if_c64", """func.func @main(%p: tensor<i1>, %x: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {
      %0 = "stablehlo.if"(%p) ({
        %1 = stablehlo.multiply %x, %x : tensor<4xcomplex<f32>>
        stablehlo.return %1 : tensor<4xcomplex<f32>>
      }, {
        %1 = stablehlo.negate %x : tensor<4xcomplex<f32>>
        stablehlo.return %1 : tensor<4xcomplex<f32>>
      }) : (tensor<i1>) -> tensor<4xcomplex<f32>>
      return %0 : tensor<4xcomplex<f32>>
    }""", lambda p, x: lax.cond(p, lambda y: y * y, lambda y: -y, x), (np.bool_(True), Z4)),
    # Discardable attributes (dialect-prefixed hints: TF's device, torch-xla's or a user's own) change no value;
    # all but mhlo.* and jax.* reached the rules as keyword arguments (a TypeError, "internal error").
    ("hints_on_ops", """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.sine %x {tf.device = "/cpu:0", my.hint = 7 : i32} : tensor<4xf32>
      %1 = stablehlo.add %0, %x {xla.note = "a", mhlo.sharding = "{replicated}"} : tensor<4xf32>
      %2 = stablehlo.slice %1 [1:4] {torch.stack = [1, 2]} : (tensor<4xf32>) -> tensor<3xf32>
      %3 = stablehlo.concatenate %2, %x, dim = 0 {sdy.note = unit} : (tensor<3xf32>, tensor<4xf32>) -> tensor<7xf32>
      %4 = stablehlo.slice %3 [0:4] : (tensor<7xf32>) -> tensor<4xf32>
      return %4 : tensor<4xf32>
    }""", lambda x: jnp.concatenate([(jnp.sin(x) + x)[1:], x])[:4], (rand((4,)),)),
]


@pytest.mark.parametrize("name,text,reference,args", HANDWRITTEN, ids=[h[0] for h in HANDWRITTEN])
def test_handwritten(name, text, reference, args):
    with jax.enable_x64(any(np.asarray(a).dtype in (np.float64, np.complex128) for a in args)):
        model = hlo2onnx.translate(hlo2onnx.parse_module(text))
        avals = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
        expected = jax.jit(reference)(*args)
        (actual,) = OrtRunner(model, avals, [jax.ShapeDtypeStruct(expected.shape, expected.dtype)]).run(list(args))
        assert_same(actual, expected, tol=(1e-6, 1e-6) if expected.dtype != np.float64 else None)


SVD = jax.lax.linalg.SvdAlgorithm.QR  # LAPACK's gesvd (the default is gesdd)
A43 = rand((4, 3), seed=5)
CASES = [
    Case("optimization_barrier", lambda x, y: lax.optimization_barrier((x * 2, y)), (rand((3,)), Z4)),
    *[Case(f"svd_qr_{np.dtype(d).name}", lambda a: jax.lax.linalg.svd(a, full_matrices=False, algorithm=SVD),
           ((A43 + (1j * A43[::-1] if np.dtype(d).kind == "c" else 0)).astype(d),),
           tol=(2e-4, 2e-4) if np.dtype(d).itemsize <= 8 and d != np.float64 else (1e-10, 1e-10),
           x64=np.dtype(d) in (np.float64, np.complex128))
      for d in (np.float32, np.float64, np.complex64, np.complex128)],
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cases(case):
    if case.name.startswith("svd"):
        # Singular vectors are unique up to a sign (a phase for complex): compare the reconstruction.
        fun = case.fun
        case = Case(case.name, lambda a: (lambda u, s, vh: ((u * s[..., None, :]) @ vh, s))(*fun(a)),
                    case.args, tol=case.tol, x64=case.x64)
    run_case(case)


def test_symbolic_shapes():
    """jax.export with a symbolic batch: get_dimension_size, dynamic_reshape / dynamic_broadcast_in_dim and
    shape assertions, run for two batch sizes."""
    def fun(x):
        return jnp.reshape(x * 2, (-1,)) + jnp.ones_like(x).sum()

    batch = export.symbolic_shape("b, 3")
    exported = export.export(jax.jit(fun))(jax.ShapeDtypeStruct(batch, np.float32))
    text = exported.mlir_module()
    for op in ("stablehlo.get_dimension_size", "stablehlo.dynamic_reshape", "stablehlo.dynamic_broadcast_in_dim",
               "@shape_assertion"):
        assert op in text, op
    conversion = hlo2onnx.convert(exported, dynamic=True)
    import onnxruntime as ort

    session = ort.InferenceSession(conversion.to_proto().SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (2, 5):
        x = rand((n, 3), seed=n)
        (actual,) = session.run(None, {session.get_inputs()[0].name: x})
        np.testing.assert_allclose(actual, np.asarray(jax.jit(fun)(x)), rtol=1e-6)



# An undotted attribute the op's rule has no parameter for (a hand-written module): an UnsupportedOpError naming
# it, never the TypeError of calling the rule with it.
UNKNOWN_ATTRIBUTE = {
    "op": ("""func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.abs %x {mystery = 7 : i32} : tensor<4xf32>
      return %0 : tensor<4xf32>
    }""", "stablehlo.abs: unknown attribute.* mystery"),
    "sort-comparator": ("""func.func @main(%x: tensor<5xf32>) -> tensor<5xf32> {
      %0 = "stablehlo.sort"(%x) <{dimension = 0 : i64, is_stable = true}> ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %n = stablehlo.negate %a {mystery = 1 : i32} : tensor<f32>
        %m = stablehlo.negate %b : tensor<f32>
        %c = stablehlo.compare LT, %n, %m, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
      }) : (tensor<5xf32>) -> tensor<5xf32>
      return %0 : tensor<5xf32>
    }""", "stablehlo.sort: .*stablehlo.negate with unknown attribute.* mystery"),
}


@pytest.mark.parametrize("case", list(UNKNOWN_ATTRIBUTE))
def test_an_attribute_no_rule_knows_is_refused_by_name(case):
    text, message = UNKNOWN_ATTRIBUTE[case]
    with pytest.raises(hlo2onnx.UnsupportedOpError, match=message):
        hlo2onnx.translate(hlo2onnx.parse_module(text))
