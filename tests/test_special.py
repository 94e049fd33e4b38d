"""Special functions, trigonometry and jax.nn activations against jax.jit, edge values included.

Edge inputs avoid the subnormal range: XLA's CPU backend flushes subnormals to zero and ORT does
not (tests/test_precision.py pins that difference down). Signed zeros are checked as well as values.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import hlo2onnx
from harness import Case, assert_same, rand, run_case
from mnjit import mnjit
from mnjit.runtime import OrtRunner

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


def edges(dtype, low: float = -1e4, high: float = 1e4) -> np.ndarray:
    """0, -0, ±inf, NaN, ±1, large and small (normal) values, then random ones in [low, high]."""
    big = min(1e30, float(np.finfo(dtype).max) / 4)
    small = max(1e-30, float(np.finfo(dtype).tiny) * 1e3)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -3.7, 10.0, -20.0, 100.0, big, -big,
               small, -small, 1e-3, -1e-3, np.pi / 2, -np.pi, 3 * np.pi / 2, 1e5, -1e5]
    values = np.concatenate([special, np.random.default_rng(3).uniform(low, high, 40),
                             np.random.default_rng(4).uniform(-4, 4, 40)])
    return values.astype(dtype)


def unit(dtype) -> np.ndarray:
    """The domain of asin/acos/atanh/erf_inv, its ends and just outside."""
    values = [-1.0, -0.999, -0.5, -0.0, 0.0, 1e-6, 0.3, 0.9, 0.99, 1.0, 1.5, -1.5, np.nan, np.inf, -np.inf]
    return np.concatenate([values, np.random.default_rng(5).uniform(-1, 1, 40)]).astype(dtype)


def positive(dtype) -> np.ndarray:
    values = [0.0, -0.0, 1e-6, 0.1, 0.5, 1.0, 1.5, 2.0, 3.3, 10.0, 50.0, 1e4, np.inf, np.nan, -1.0]
    return np.concatenate([values, np.random.default_rng(6).uniform(0, 30, 40)]).astype(dtype)


def run_signed(case: Case) -> None:
    """run_case, then also the sign of every zero both sides return (values only for SIGN_LOST)."""
    run_case(case)
    if case.name in SIGN_LOST:
        return
    with jax.enable_x64(case.x64):
        expected = jax.tree_util.tree_leaves(jax.jit(case.fun)(*case.args))
        actual = jax.tree_util.tree_leaves(mnjit(case.fun)(*case.args))
    for i, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), np.asarray(e)
        if a.dtype.kind == "f":
            zeros = (a == 0) & (e == 0)
            np.testing.assert_array_equal(np.signbit(a[zeros]), np.signbit(e[zeros]),
                                          err_msg=f"{case.name}[{i}]: signs of zeros, inputs {case.args[0][zeros]}")


# ORT's Where returns +0 where its first value input is -0 (measured, onnxruntime 1.31, every float
# dtype), and stablehlo.select becomes Where: -0 through a select's true branch comes out +0.
# chlo's sinh (and erf on f64) expansions pass -0 that way. Values are still compared.
SIGN_LOST = {"sinh_float32", "sinh_float64", "sinh_float16", "erf_float64"}
if jax.__version_info__ >= (0, 12, 1):
    # jax 0.12.1 writes erf_inv and i1e itself (its polynomials lower to stablehlo.fma): the last select's true
    # branch is x * p(x), -0 at x = -0.
    SIGN_LOST |= {f"{name}_{d}" for name in ("erf_inv", "bessel_i1e") for d in ("float32", "float64", "float16")}
UNARY = {
    # chlo expansions (polynomials in StableHLO arithmetic)
    "erf": (jss.erf, edges), "erfc": (jss.erfc, edges), "erf_inv": (jss.erfinv, unit),
    "lgamma": (jss.gammaln, edges), "digamma": (jss.digamma, edges),
    "bessel_i0e": (jss.i0e, edges), "bessel_i1e": (jss.i1e, edges),
    "asin": (jnp.arcsin, unit), "acos": (jnp.arccos, unit), "atan": (jnp.arctan, edges),
    "sinh": (jnp.sinh, edges), "cosh": (jnp.cosh, edges), "asinh": (jnp.arcsinh, edges),
    "acosh": (jnp.arccosh, positive), "atanh": (jnp.arctanh, unit),
    # StableHLO ops with their own rules
    "sin": (jnp.sin, edges), "cos": (jnp.cos, edges), "tan": (jnp.tan, edges), "tanh": (jnp.tanh, edges),
    "cbrt": (jnp.cbrt, edges), "expm1": (jnp.expm1, edges), "log1p": (jnp.log1p, positive),
    "logistic": (lax.logistic, edges), "is_finite": (jnp.isfinite, edges), "sign": (jnp.sign, edges),
    "round_afz": (lambda a: lax.round(a, lax.RoundingMethod.AWAY_FROM_ZERO), edges),
    "round_even": (jnp.round, edges), "floor": (jnp.floor, edges), "ceil": (jnp.ceil, edges),
    "exp": (jnp.exp, edges), "log": (jnp.log, positive), "sqrt": (jnp.sqrt, positive),
    "rsqrt": (lax.rsqrt, positive),
}
# (rtol, atol) where a function is ill-conditioned at the random inputs and both sides are a few ulp off the
# true value in different directions: lgamma and digamma near their zeros, erf_inv near ±1.
LOOSER = {("lgamma", F32): (2e-5, 2e-6), ("digamma", F32): (2e-5, 2e-6), ("erf_inv", F32): (1e-5, 2e-6),
          ("lgamma", F64): (1e-12, 1e-13), ("digamma", F64): (1e-12, 1e-13)}
UNARY_CASES = [Case(f"{name}_{d.name}", fn, (inputs(d),), tol=LOOSER.get((name, d)), x64=d == F64)
               for d in (F32, F64, F16) for name, (fn, inputs) in UNARY.items()]


@pytest.mark.parametrize("case", UNARY_CASES, ids=repr)
def test_unary(case: Case) -> None:
    run_signed(case)


def grid(dtype) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of signed zeros, infinities, NaN and finite values of both signs (atan2's octants)."""
    values = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 3.0, 1e-3, -1e4, np.inf, -np.inf, np.nan], dtype)
    y, x = np.meshgrid(values, values)
    return y.ravel(), x.ravel()


def octants(dtype, n=400) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    scale = np.exp(rng.uniform(-8, 8, (2, n)))
    return tuple((rng.normal(size=(2, n)) * scale).astype(dtype))


a_pos, b_pos = positive(F32)[:13], np.array([0.5, 1.0, 2.0, 0.1, 3.0, 1.0, 0.0, 5.0, 10.0, 1.0, 2.0, 1.0, 4.0], F32)
BINARY_CASES = [
    *[Case(f"atan2_grid_{d.name}", jnp.arctan2, grid(d), x64=d == F64) for d in (F32, F64, F16)],
    *[Case(f"atan2_random_{d.name}", jnp.arctan2, octants(d), x64=d == F64) for d in (F32, F64, F16)],
    *[Case(f"hypot_{d.name}", jnp.hypot, grid(d), x64=d == F64) for d in (F32, F64)],
    *[Case(f"nextafter_{d.name}", jnp.nextafter, grid(d), x64=d == F64) for d in (F32, F64)],
    Case("igamma_f32", jss.gammainc, (a_pos, b_pos)), Case("igammac_f32", jss.gammaincc, (a_pos, b_pos)),
    Case("igamma_f64", jss.gammainc, (a_pos.astype(F64), b_pos.astype(F64)), x64=True),
    Case("igammac_f64", jss.gammaincc, (a_pos.astype(F64), b_pos.astype(F64)), x64=True),
    Case("betainc_f32", jss.betainc, (a_pos[1:10], b_pos[1:10], np.linspace(0.05, 0.95, 9, dtype=F32))),
    Case("betainc_f64", jss.betainc, (a_pos[1:10].astype(F64), b_pos[1:10].astype(F64), np.linspace(0.05, 0.95, 9)),
         x64=True),
    Case("pow_edges_f32", jnp.power, grid(F32)),
    Case("rem_edges_f32", lax.rem, grid(F32)),
]


@pytest.mark.parametrize("case", BINARY_CASES, ids=repr)
def test_binary(case: Case) -> None:
    run_signed(case)


# jax 0.12.1 lowers lgamma and digamma on CPU to jaxlib kernels (custom_call @cpu_lgamma_ffi, @cpu_digamma_ffi;
# hlo2onnx/ops/elementwise/special_calls.py), where older jax emitted chlo ops: the rows above reach one or the
# other. These reach the calls on every jax: through mnjit in the shapes and dtypes the tables above lack (batched,
# a broadcast operand, bf16), and written out as jax 0.12.1 writes them, against jax.jit of the function.
x34 = rand((3, 4), seed=8, low=-4, high=8)
BF16 = np.dtype(ml_dtypes.bfloat16)
GAMMA_CASES = [
    Case("lgamma_vmap_f32", jax.vmap(lax.lgamma), (x34,), tol=LOOSER["lgamma", F32]),
    Case("digamma_vmap_f32", jax.vmap(jax.vmap(lax.digamma)), (x34,), tol=LOOSER["digamma", F32]),
    Case("lgamma_broadcast_f32", lambda a, c: lax.lgamma(a + c), (x34, x34[0]), tol=LOOSER["lgamma", F32]),
    Case("digamma_vmap_f64", jax.vmap(lax.digamma), (x34.astype(F64),), x64=True, tol=LOOSER["digamma", F64]),
    *[Case(f"{name}_bfloat16", fn, (edges(BF16, -30, 30),)) for name, fn in (("lgamma", lax.lgamma),
                                                                             ("digamma", lax.digamma))],
]


@pytest.mark.parametrize("case", GAMMA_CASES, ids=repr)
def test_gamma_functions(case: Case) -> None:
    run_signed(case)


def _kernel_call(target: str, ttype: str) -> str:
    return f"""func.func @main(%x: {ttype}) -> {ttype} {{
      %0 = stablehlo.custom_call @{target}(%x) {{backend_config = "", mhlo.backend_config = {{}},
          mhlo.frontend_attributes = {{num_batch_dims = "2"}}}} : ({ttype}) -> {ttype}
      return %0 : {ttype}
    }}"""


KERNEL_CALLS = [(f"{name}_{d.name}", _kernel_call(f"cpu_{name}_ffi", f"tensor<3x4x{mlir}>"), fn, d)
                for name, fn in (("lgamma", lax.lgamma), ("digamma", lax.digamma))
                for d, mlir in ((F32, "f32"), (F64, "f64"), (F16, "f16"), (BF16, "bf16"))]


@pytest.mark.parametrize("name,text,fn,dtype", KERNEL_CALLS, ids=[k[0] for k in KERNEL_CALLS])
def test_kernel_calls(name: str, text: str, fn, dtype) -> None:
    x = x34.astype(dtype)
    with jax.enable_x64(dtype == F64):
        model = hlo2onnx.translate(hlo2onnx.parse_module(text))
        expected = jax.jit(fn)(x)
        aval = jax.ShapeDtypeStruct(x.shape, x.dtype)
        (actual,) = OrtRunner(model, [aval], [aval]).run([x])
    assert_same(actual, expected, LOOSER.get((name.split("_")[0], dtype)), name)


def test_unknown_kernel_call_is_refused() -> None:
    with pytest.raises(hlo2onnx.UnsupportedOpError, match=r"custom call @cpu_zeta_ffi has no ONNX translation"):
        hlo2onnx.translate(hlo2onnx.parse_module(_kernel_call("cpu_zeta_ffi", "tensor<3x4xf32>")))


x48 = rand((4, 8), seed=3, low=-6, high=6)
ACTIVATIONS = {
    "relu": jax.nn.relu, "relu6": jax.nn.relu6, "sigmoid": jax.nn.sigmoid, "log_sigmoid": jax.nn.log_sigmoid,
    "softplus": jax.nn.softplus, "silu": jax.nn.silu, "gelu_tanh": jax.nn.gelu,
    "gelu_erf": lambda a: jax.nn.gelu(a, approximate=False), "elu": jax.nn.elu, "selu": jax.nn.selu,
    "celu": jax.nn.celu, "leaky_relu": jax.nn.leaky_relu, "hard_tanh": jax.nn.hard_tanh,
    "hard_sigmoid": jax.nn.hard_sigmoid, "hard_swish": jax.nn.hard_swish, "mish": jax.nn.mish,
    "sparse_plus": jax.nn.sparse_plus, "squareplus": jax.nn.squareplus, "soft_sign": jax.nn.soft_sign,
    "softmax": jax.nn.softmax, "log_softmax": jax.nn.log_softmax, "glu": jax.nn.glu,
    "logsumexp": jax.nn.logsumexp, "standardize": jax.nn.standardize,
}
ACTIVATION_CASES = [
    *[Case(f"{name}_f32", fn, (x48,)) for name, fn in ACTIVATIONS.items()],
    *[Case(f"{name}_f64", fn, (x48.astype(F64),), x64=True) for name, fn in ACTIVATIONS.items()],
    *[Case(f"{name}_f16", fn, (x48.astype(F16),)) for name, fn in ACTIVATIONS.items()],
    Case("activations_edges_f32", lambda a: [f(a) for f in ACTIVATIONS.values() if f is not jax.nn.glu],
         (edges(F32, -30, 30)[None],)),
]


@pytest.mark.parametrize("case", ACTIVATION_CASES, ids=repr)
def test_activation(case: Case) -> None:
    run_case(case)


def test_f64_trig_keeps_relative_precision_near_zeros() -> None:
    """sin/cos/tan near multiples of pi/2: ORT's own f64 Sin/Cos are 1e-12 (tan 1e-10) off there, relatively."""
    k = np.arange(1, 200, dtype=F64)
    x = np.concatenate([k * np.pi, k * np.pi / 2, k * np.pi / 2 + 1e-9, [1e5 * np.pi, 3e5 * np.pi / 2]])
    funs = (jnp.sin, jnp.cos, jnp.tan)
    with jax.enable_x64(True):
        for f in funs:
            expected, actual = np.asarray(jax.jit(f)(x)), np.asarray(mnjit(f)(x))
            np.testing.assert_allclose(actual, expected, rtol=4e-15, atol=0, err_msg=f.__name__)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_sign_keeps_signed_zero_and_nan(dtype):
    """XLA's sign returns ±0 and NaN as they are; the value comparison alone would not see a -0 turned +0."""
    x = np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, 1e-30, -1e-30, 3.0, -2.5], dtype)
    with jax.enable_x64(dtype == np.float64):
        got, want = (np.asarray(f(jnp.sign)(x)).astype(np.float64) for f in (mnjit, jax.jit))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
