"""Integer bit ops on every width, bitcast_convert, reduce_precision, iota of every dtype."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from harness import Case, rand, run_case

F16, F32, F64 = np.float16, np.float32, np.float64
BF16 = ml_dtypes.bfloat16
NARROW_INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32]
WIDE_INTS = [np.int64, np.uint64]  # need x64


def full_range(dtype, n=24, seed=0) -> np.ndarray:
    """Values across the whole range of an integer type, extremes included."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    return np.concatenate([np.array([info.min, info.max, 0, 1, info.max // 2, info.max // 2 + 1], dtype), raw])


def amounts(dtype, n=30) -> np.ndarray:
    """Shift amounts 0..width+1, and (for signed types) negative ones: both out of range."""
    width = np.dtype(dtype).itemsize * 8
    values = np.resize(np.arange(0, width + 2), n)
    if np.dtype(dtype).kind == "i":
        values[-3:] = [-1, -width, np.iinfo(dtype).min]
    return values.astype(dtype)


def shifts(a, n):
    return lax.shift_left(a, n), lax.shift_right_logical(a, n), lax.shift_right_arithmetic(a, n)


def bitwise(a, c):
    return a & c, a | c, a ^ c, ~a


def wraparound(a, c):
    return a + c, a - c, a * c, -a


def counts(a):
    return lax.population_count(a), lax.clz(a)


def bit_reductions(a):
    """xor/and/or reductions (no ONNX Reduce op does them), from their identity and from another init."""
    m = a.reshape(5, 6)
    zero, five = np.zeros((), m.dtype), np.asarray(5, m.dtype)
    return (lax.reduce(m, zero, lax.bitwise_xor, (0,)), lax.reduce(m, ~zero, lax.bitwise_and, (1,)),
            lax.reduce(m, zero, lax.bitwise_or, (0, 1)), lax.reduce(m, five, lax.bitwise_xor, (1,)),
            lax.reduce(m, five, lax.bitwise_and, (0,)), lax.reduce(m, five, lax.bitwise_or, (1,)))


def float_specials(dtype) -> np.ndarray:
    info = np.finfo(dtype)
    values = [0.0, -0.0, 1.0, -1.0, 1.5, -2.75, float(info.max), -float(info.max), float(info.tiny),
              -float(info.tiny), float(info.tiny) * 3.5, float(info.smallest_subnormal), float(info.eps),
              np.inf, -np.inf, np.nan, 1 / 3, -1e-3, 2.0 ** 10 + 1, 0.1]
    return np.array(values, dtype=dtype)


def _int_cases(dtypes, x64=False):
    cases = []
    for d in dtypes:
        name = np.dtype(d).name
        a, c = full_range(d, 24, 0), full_range(d, 24, 1)
        cases += [
            Case(f"shifts_{name}", shifts, (full_range(d, 24), amounts(d)), x64=x64),
            Case(f"bitwise_{name}", bitwise, (a, c), x64=x64),
            Case(f"wrap_arith_{name}", wraparound, (a, c), x64=x64),
            Case(f"popcnt_clz_{name}", counts, (a,), x64=x64),
            Case(f"bit_reductions_{name}", bit_reductions, (a,), x64=x64),
        ]
    return cases


def bitcast(dtype):
    return lambda a: lax.bitcast_convert_type(a, dtype)


def roundtrip(via):
    return lambda a: (lax.bitcast_convert_type(a, via), lax.bitcast_convert_type(lax.bitcast_convert_type(a, via),
                                                                                  a.dtype))


def random_floats(bits_dtype, dtype, n=50_000) -> np.ndarray:
    """Floats from uniformly random bit patterns: every exponent, subnormals; NaNs dropped."""
    info = np.iinfo(bits_dtype)
    values = np.random.default_rng(5).integers(0, info.max, n, dtype=bits_dtype, endpoint=True).view(dtype)
    return values[~np.isnan(values)]


ALL_F16 = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(F16)
ALL_F16 = ALL_F16[~np.isnan(ALL_F16)]
# NaN payloads are not kept (module docstring): bit patterns of NaN are left out of the bits -> float cases.
NAN_FREE = {d: float_specials(d)[~np.isnan(float_specials(d))] for d in (F16, F32, F64)}

CASES = [
    *_int_cases(NARROW_INTS),
    *_int_cases(WIDE_INTS, x64=True),
    Case("shift_left_scalar_amount_i32", lambda a: a << 3, (full_range(np.int32),)),
    Case("shift_right_i8_by_i8_array", lambda a: a >> jnp.int8(9), (full_range(np.int8),)),
    Case("right_shift_u16", jnp.right_shift, (full_range(np.uint16), amounts(np.uint16))),
    Case("left_shift_jnp_i64", jnp.left_shift, (full_range(np.int64), amounts(np.int64)), x64=True),
    # One amount for the whole array, known only at run time (jax's threefry rotations on CPU): the rule caps and
    # tests it before its broadcast. In range, at the width and past it, and negative (read as unsigned).
    *[Case(f"shifts_broadcast_amount_{np.dtype(d).name}_{n}", lambda a, n: shifts(a, jnp.broadcast_to(n, a.shape)),
           (full_range(d, 24), np.asarray(n).astype(d)), x64=np.dtype(d).itemsize == 8)
      for d in (np.uint8, np.int16, np.uint16, np.uint32, np.int32, np.int64)
      for n in (5, 8 * np.dtype(d).itemsize, -1)],
    # 64-bit remainders past 2^53 (ORT's integer fmod goes through double)
    *[Case(f"div_rem_large_{np.dtype(d).name}", lambda a, c: (lax.div(a, c), lax.rem(a, c)),
           (full_range(d, 24), np.where(full_range(d, 24, 1) == 0, 3, full_range(d, 24, 1) >> 20).astype(d)), x64=True)
      for d in WIDE_INTS],
    Case("bitwise_bool", bitwise, (rand((3, 4), bool), rand((3, 4), bool, 1))),
    Case("reduce_xor_bool", lambda a: (lax.reduce(a, False, lax.bitwise_xor, (0,)),
                                       lax.reduce(a, True, lax.bitwise_xor, (0, 1))), (rand((5, 7), bool),)),
    # bitcast_convert, equal widths
    Case("bitcast_bool_bool", bitcast(np.bool_), (rand((2, 3), np.bool_),)),
    Case("bitcast_c64_c64", bitcast(np.complex64), (rand((2, 3), np.complex64),)),
    Case("bitcast_c128_c128", bitcast(np.complex128), (rand((2, 3), np.complex128),), x64=True),
    Case("bitcast_c64_c64_x64", bitcast(np.complex64), (rand((4,), np.complex64),), x64=True),
    Case("bitcast_f32_i32", bitcast(jnp.int32), (float_specials(F32),)),
    Case("bitcast_f32_u32", bitcast(jnp.uint32), (float_specials(F32),)),
    Case("bitcast_f16_i16", bitcast(jnp.int16), (float_specials(F16),)),
    Case("bitcast_f16_u16", bitcast(jnp.uint16), (float_specials(F16),)),
    Case("bitcast_f64_i64", bitcast(jnp.int64), (float_specials(F64),), x64=True),
    Case("bitcast_f64_u64", bitcast(jnp.uint64), (float_specials(F64),), x64=True),
    Case("bitcast_i32_f32", bitcast(jnp.float32), (np.array(NAN_FREE[F32]).view(np.int32),), tol=(0, 0)),
    Case("bitcast_u32_f32_all_exponents", bitcast(jnp.float32),
         ((np.arange(0, 255, dtype=np.uint32) << 23) | np.uint32(0x2A5A5A) | (np.arange(255, dtype=np.uint32) % 2 << 31),),
         tol=(0, 0)),
    Case("bitcast_i16_f16", bitcast(jnp.float16), (np.array(NAN_FREE[F16]).view(np.int16),), tol=(0, 0)),
    Case("bitcast_u16_f16_all_exponents", bitcast(jnp.float16),
         ((np.arange(0, 31, dtype=np.uint16) << 10) | np.uint16(0x2A5),), tol=(0, 0)),
    Case("bitcast_i64_f64", bitcast(jnp.float64), (np.array(NAN_FREE[F64]).view(np.int64),), tol=(0, 0), x64=True),
    Case("bitcast_u64_f64_all_exponents", bitcast(jnp.float64),
         (((np.arange(0, 2047, 7, dtype=np.uint64) << np.uint64(52)) | np.uint64(0x5A5A5A5A5A5A5)),), tol=(0, 0),
         x64=True),
    Case("bitcast_nan_to_float", lambda a: jnp.isnan(lax.bitcast_convert_type(a, jnp.float32)),
         (np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0x7F800000], np.uint32),)),
    Case("bitcast_i32_u32", bitcast(jnp.uint32), (full_range(np.int32),)),
    Case("bitcast_u8_i8", bitcast(jnp.int8), (full_range(np.uint8),)),
    Case("bitcast_f16_bf16", lambda a: lax.bitcast_convert_type(a, BF16).astype(F32), (NAN_FREE[F16],), tol=(0, 0)),
    Case("bitcast_roundtrip_f32_i32", roundtrip(jnp.int32), (rand((4, 5), F32, low=-1e30, high=1e30),), tol=(0, 0)),
    Case("bitcast_f16_all_values", bitcast(jnp.uint16), (ALL_F16,)),
    Case("bitcast_all_f16_patterns", bitcast(jnp.float16), (ALL_F16.view(np.uint16),), tol=(0, 0)),
    Case("bitcast_f32_random_patterns", roundtrip(jnp.uint32), (random_floats(np.uint32, F32),), tol=(0, 0)),
    Case("bitcast_f64_random_patterns", roundtrip(jnp.int64), (random_floats(np.uint64, F64),), tol=(0, 0),
         x64=True),
    # bitcast_convert between widths: a minor dimension appears or goes
    Case("bitcast_f32_to_u8x4", bitcast(jnp.uint8), (float_specials(F32).reshape(4, 5),)),
    Case("bitcast_f32_to_i16x2", bitcast(jnp.int16), (float_specials(F32),)),
    Case("bitcast_u8x4_to_f32", bitcast(jnp.float32), (NAN_FREE[F32].view(np.uint8).reshape(-1, 4),), tol=(0, 0)),
    Case("bitcast_i8x2_to_f16", bitcast(jnp.float16), (NAN_FREE[F16].view(np.int8).reshape(-1, 2),), tol=(0, 0)),
    Case("bitcast_u8x2_to_u16", bitcast(jnp.uint16), (full_range(np.uint8, 22).reshape(-1, 2),)),
    Case("bitcast_f64_to_f32x2", bitcast(jnp.float32), (NAN_FREE[F64][np.abs(NAN_FREE[F64]) != np.finfo(F64).max],),
         tol=(0, 0), x64=True),
    Case("bitcast_u32x2_to_f64", bitcast(jnp.float64), (NAN_FREE[F64].view(np.uint32).reshape(-1, 2),), tol=(0, 0),
         x64=True),
    Case("bitcast_i64_to_u8x8", bitcast(jnp.uint8), (full_range(np.int64, 10),), x64=True),
    # reduce_precision (XLA's rounding, overflow to inf, underflow to zero)
    *[Case(f"reduce_precision_f32_e{e}m{m}", lambda a, e=e, m=m: lax.reduce_precision(a, e, m),
           (np.concatenate([float_specials(F32), rand((20,), F32, low=-7e4, high=7e4),
                            rand((20,), F32, 3, low=-1e-4, high=1e-4)]),), tol=(0, 0))
      for e, m in ((5, 10), (8, 7), (4, 3), (5, 2), (8, 23), (6, 0), (3, 1))],
    Case("reduce_precision_f64_to_f32", lambda a: lax.reduce_precision(a, 8, 23),
         (np.concatenate([float_specials(F64), rand((20,), F64, low=-1e40, high=1e40)]),), tol=(0, 0), x64=True),
    Case("reduce_precision_f64_e5m10", lambda a: lax.reduce_precision(a, 5, 10),
         (np.concatenate([float_specials(F64), rand((20,), F64, low=-7e4, high=7e4)]),), tol=(0, 0), x64=True),
    Case("reduce_precision_f16_e4m3", lambda a: lax.reduce_precision(a, 4, 3), (float_specials(F16),), tol=(0, 0)),
    # iota of every dtype
    *[Case(f"iota_{np.dtype(d).name}", lambda d=d: lax.broadcasted_iota(d, (3, 70), 1), ())
      for d in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, F16, F32)],
    Case("iota_bf16", lambda: lax.iota(BF16, 256).astype(F32), ()),
    *[Case(f"iota_{np.dtype(d).name}", lambda d=d: lax.broadcasted_iota(d, (4, 3), 0), (), x64=True)
      for d in (np.int64, np.uint64, F64)],
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_bits(case: Case) -> None:
    run_case(case)


# -- jax.random (default threefry2x32): bit-identical to jax.jit --------------------------
KEY = np.asarray(jax.random.key_data(jax.random.PRNGKey(1234)))
LOGITS = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25], [0.02, 0.97, 0.01]], np.float32))


def typed(fn):
    """Runs `fn` on a typed key made from raw key data; typed keys cannot be a jit argument or result here."""
    return lambda k, *args: fn(jax.random.wrap_key_data(k), *args)


SEEDING = [
    Case("prng_key", lambda s: jax.random.key_data(jax.random.key(s)), (np.int32(42),), tol=(0, 0)),
    Case("prng_PRNGKey", jax.random.PRNGKey, (np.int32(-7),), tol=(0, 0)),
    Case("prng_PRNGKey_x64", jax.random.PRNGKey, (np.int64(2**40 + 3),), tol=(0, 0), x64=True),
]
DRAWS = [
    Case("prng_split", typed(lambda k: jax.random.key_data(jax.random.split(k, 3))), (KEY,), tol=(0, 0)),
    Case("prng_split_raw", lambda k: jax.random.split(k, 4), (KEY,), tol=(0, 0)),
    Case("prng_fold_in", typed(lambda k, d: jax.random.key_data(jax.random.fold_in(k, d))), (KEY, np.int32(7)),
         tol=(0, 0)),
    Case("prng_uniform", typed(lambda k: jax.random.uniform(k, (5, 3))), (KEY,), tol=(0, 0)),
    # f16 arithmetic rounds per op in ORT on CPUs with avx512_fp16, once per fusion in XLA: one ulp (of 2..4).
    Case("prng_uniform_f16_bounds", typed(lambda k: jax.random.uniform(k, (9,), jnp.float16, -2, 3)), (KEY,),
         tol=(0, 2**-9)),
    Case("prng_uniform_f64", typed(lambda k: jax.random.uniform(k, (6,), jnp.float64)), (KEY,), tol=(0, 0), x64=True),
    # normal goes through erf_inv's polynomial, where XLA's float rounding may differ by an ulp from ORT's
    Case("prng_normal", typed(lambda k: jax.random.normal(k, (5, 3))), (KEY,)),
    Case("prng_randint", typed(lambda k: jax.random.randint(k, (7,), -5, 100)), (KEY,), tol=(0, 0)),
    Case("prng_randint_u8", typed(lambda k: jax.random.randint(k, (7,), 3, 250, jnp.uint8)), (KEY,), tol=(0, 0)),
    Case("prng_randint_i64", typed(lambda k: jax.random.randint(k, (5,), -2**40, 2**50, jnp.int64)), (KEY,),
         tol=(0, 0), x64=True),
    Case("prng_bits_u64", typed(lambda k: jax.random.bits(k, (4,), jnp.uint64)), (KEY,), tol=(0, 0), x64=True),
    Case("prng_bernoulli", typed(lambda k: jax.random.bernoulli(k, 0.3, (9,))), (KEY,), tol=(0, 0)),
    Case("prng_categorical", typed(jax.random.categorical), (KEY, LOGITS), tol=(0, 0)),
    Case("prng_permutation", typed(lambda k: jax.random.permutation(k, 10)), (KEY,), tol=(0, 0)),
    Case("prng_permutation_array", typed(jax.random.permutation), (KEY, np.arange(12.0, dtype=np.float32)),
         tol=(0, 0)),
    Case("prng_shuffle_rows", typed(lambda k, x: jax.random.permutation(k, x, axis=0, independent=True)),
         (KEY, np.arange(20, dtype=np.int32).reshape(4, 5)), tol=(0, 0)),
    Case("prng_choice", typed(lambda k: jax.random.choice(k, 10, (4,), replace=False)), (KEY,), tol=(0, 0)),
]


@pytest.mark.parametrize("case", SEEDING, ids=repr)
def test_prng_seeding(case: Case) -> None:
    run_case(case)


@pytest.mark.parametrize("case", DRAWS, ids=repr)
def test_prng_draws(case: Case) -> None:
    run_case(case)
