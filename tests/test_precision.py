"""x64, mixed precisions in one function, f16 rounding and subnormals, against jax.jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import Case, rand, run_case
from mnjit import mnjit

F16, F32, F64 = np.float16, np.float32, np.float64
BIG = np.array([2**53 + 1, -2**62 + 7, 2**40 - 3, -1, 0, 9_007_199_254_740_993], np.int64)
BIG2 = np.array([3, 2, -2**20, 7, 5, -1], np.int64)
E4M3, E5M2, BF16 = jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.bfloat16
F8_IN = np.array([0.1, -2.5, 300, 1e-3, np.nan, 448, 464, 500, -1e6, 0, -0.0, 57344, 61440, 1e-9, np.inf], F32)


def fire_step(position, velocity, force, dt, alpha, n_pos, mass):
    """jax-md's FIRE update mixes f16 positions, f32 forces, f64 scalars, a uint8 counter and int64 indices."""
    power = jnp.sum(force * velocity.astype(F32))
    v = (1 - alpha) * velocity.astype(F64) + alpha * force.astype(F64) * jnp.linalg.norm(velocity.astype(F64))
    dt_new = jnp.where(power > 0, jnp.minimum(dt * 1.1, 0.1), dt * 0.5)
    n_pos = jnp.where(power > 0, n_pos + jnp.uint8(1), jnp.uint8(0))
    idx = jnp.argsort(jnp.abs(force[:, 0])).astype(jnp.int64)
    position = (position + (dt_new * v / mass).astype(F16))[idx]
    return position, v.astype(F32), dt_new, n_pos, idx


pos16, vel32, force32 = rand((6, 3), F16, 1), rand((6, 3), F32, 2), rand((6, 3), F32, 3)
CASES = [
    # x64: f64 arithmetic and 64-bit integers past 2^53 (where a trip through f64 would round)
    Case("f64_chain", lambda a, b: (a * b + a / b - jnp.sqrt(jnp.abs(a)), jnp.sum(a * b)),
         (rand((5, 4), F64, 1), rand((5, 4), F64, 2, 0.5, 3)), x64=True),
    Case("i64_arith", lambda a, b: (a + b, a - b, a * b, a // b, a % b, -a, jnp.abs(a)), (BIG, BIG2), x64=True),
    Case("i64_compare_minmax", lambda a, b: (a < b, jnp.maximum(a, b), jnp.minimum(a, b)), (BIG, BIG2), x64=True),
    Case("i64_sum_prod", lambda a: (jnp.sum(a), jnp.prod(a[2:5]), jnp.cumsum(a)), (BIG,), x64=True),
    Case("i64_to_f64_to_i64", lambda a: (a.astype(F64), a.astype(F64).astype(jnp.int64), a.astype(F32)), (BIG,),
         x64=True),
    Case("u64_arith", lambda a, b: (a + b, a * b, a // b, a > b),
         (np.array([2**64 - 1, 2**63, 5], np.uint64), np.array([1, 3, 2**40], np.uint64)), x64=True),
    Case("f64_to_i64_saturating", lambda a: a.astype(jnp.int64),
         (np.array([1e300, -1e300, np.nan, 2.0**62, -2.0**63, 0.5], F64),), x64=True),
    Case("f64_weak_scalars", lambda a: (a * 2.5, a + 1, 3.0 ** a), (rand((4,), F64),), x64=True),
    Case("int_literals_x64", lambda a: (a + 2**40, a * 3), (BIG,), x64=True),
    # mixed dtypes in one function (jax-md's FIRE state)
    Case("fire_mixed_x64", fire_step, (pos16, vel32, force32, np.float64(0.05), np.float64(0.1), np.uint8(3),
                                      np.float64(1.5)), x64=True),
    Case("mixed_promotion", lambda h, s, d, u: (h + s, h * u, s * u, d + h, u + u, (u * 2).astype(F16)),
         (rand((4,), F16), rand((4,), F32, 1), rand((4,), F64, 2), np.array([0, 7, 200, 255], np.uint8)), x64=True),
    Case("convert_chain", lambda d: (d.astype(F32).astype(F16), d.astype(F16), d.astype(F16).astype(F64),
                                     d.astype(jnp.bfloat16).astype(F64)),
         (np.array([1 / 3, 65504.0, 65520.0, 1e-5, 6e-8, -2.5e-8, 1e308], F64),), x64=True),
    # float8 (storage types): conversions overflow to inf (e5m2) or NaN (e4m3fn) as in XLA, not to ONNX Cast's
    # default largest finite value; e5m2's 61440 rounds to inf; float8 to int saturates through float32;
    # arithmetic and compares run in float32 (ORT has no float8 kernels, the model was invalid).
    *[Case(f"float8_{name}", fun, (F8_IN,)) for name, fun in {
        "e4m3fn_round_trip": lambda a: (a.astype(E4M3).astype(F32), a.astype(F16).astype(E4M3).astype(F32)),
        "e5m2_round_trip": lambda a: (a.astype(E5M2), a.astype(jnp.bfloat16).astype(E5M2), a.astype(E5M2).astype(F16)),
        "to_int": lambda a: tuple(a.astype(f8).astype(t) for f8 in (E4M3, E5M2) for t in (jnp.int8, jnp.uint8, jnp.int32)),
        "arith_compare": lambda a: (a.astype(E5M2) + a.astype(E5M2), (a.astype(E4M3) * 2).astype(F32),
                                    a.astype(E5M2) > 1, a.astype(E4M3).astype(bool)),
    }.items()],
    # bf16 arithmetic converted back to f32: XLA's CPU loop fusions compute it in f32 and drop the rounding
    # (excess precision); an explicit f32 -> bf16 -> f32 and results kept as bf16 are rounded.
    *[Case(f"bf16_to_f32_{name}", lambda a, b, fun=fun: (fun(a.astype(BF16), b.astype(BF16)).astype(F32),
                                                        fun(a.astype(BF16), b.astype(BF16))),
           (rand((256,), F32, 1, -2, 2), rand((256,), F32, 2, 0.1, 2))) for name, fun in {
        "mul": jnp.multiply, "add": jnp.add, "div": jnp.divide, "exp": lambda a, b: jnp.exp(a),
        "tanh": lambda a, b: jnp.tanh(a), "chain": lambda a, b: a * b + a, "where": lambda a, b: jnp.where(a > 0, a * b, b),
        "gelu": lambda a, b: jax.nn.gelu(a), "log": lambda a, b: jnp.log(b),
    }.items()],
    Case("bf16_explicit_round_trip", lambda a: (a.astype(BF16).astype(F32), (a * 3).astype(BF16).astype(F32)),
         (rand((256,), F32, 3),)),
    Case("f16_overflow_to_inf", lambda a: (a * a, a + a, jnp.exp(a)), (np.array([300, 60000, -300, 11.5], F16),)),
    Case("f16_sum_mean", lambda a: (jnp.sum(a), jnp.mean(a), jnp.var(a)), (rand((64,), F16),)),
    Case("f16_matmul", lambda a, b: a @ b, (rand((8, 16), F16), rand((16, 4), F16, 1)), tol=(4e-3, 4e-3)),
    # a*b+c in f16: XLA fuses it in f32 and rounds once. ORT rounds a*b to f16 on CPUs with avx512_fp16
    # (native f16 Mul/Add kernels, measured on Sapphire Rapids) and not elsewhere (its f32 kernels between
    # casts that its session transformer removes), so allow a*b's rounding: half an ulp of products up to 9.
    Case("f16_fma_like", lambda a, b, c: a * b + c, tuple(rand((4096,), F16, s) for s in range(3)),
         tol=(0, 2**-7)),
    # Longer chains round at places that differ: XLA's fusion and ORT's cast removal decide differently.
    Case("f16_chain", lambda a, b, c: ((a * b) * c - a, a / b + c * c),
         tuple(rand((4096,), F16, s, 0.5, 3) for s in range(3))),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_precision(case: Case) -> None:
    run_case(case)


def test_subnormals_flush_in_xla_only() -> None:
    """Documents a known difference: XLA's CPU backend flushes f32/f64 subnormals to zero, both as
    inputs (x > 0 is False for x = 1e-39) and as results (3e-38 * 0.01 is 0), while ORT keeps IEEE
    gradual underflow. ORT's `session.set_denormal_as_zero` would match XLA but sets the flag on the
    calling thread, flushing numpy's arithmetic afterwards too, so mnjit does not use it.
    When this test fails, one side has changed: update this note and the tests' edge values."""
    x = np.array([1e-39, -1e-39, 3e-38, 1e-45], F32)
    y = np.array([1.0, 1.0, 0.01, 1.0], F32)

    def f(x, y):
        return x * y, x > 0

    (jit_product, jit_positive), (ort_product, ort_positive) = jax.jit(f)(x, y), mnjit(f)(x, y)
    np.testing.assert_array_equal(np.asarray(jit_product), np.zeros(4, F32))
    np.testing.assert_array_equal(np.asarray(jit_positive), [False, False, True, False])
    np.testing.assert_array_equal(np.asarray(ort_product), x * y)  # numpy's IEEE result
    np.testing.assert_array_equal(np.asarray(ort_positive), x > 0)


def test_normal_range_is_unaffected_by_flushing() -> None:
    """Just above the smallest normal both agree bit for bit."""
    tiny = np.finfo(F32).tiny
    x = np.array([tiny, 2 * tiny, -4 * tiny, 1.5 * tiny], F32)
    run_case(Case("tiny_normals", lambda a: (a * 2, a * 1.5, a > 0, jnp.abs(a)), (x,), tol=(0, 0)))
