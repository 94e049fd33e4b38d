"""stablehlo.rng_bit_generator compared bit for bit with jax.jit (XLA's CPU expansion).

Direct lax.rng_bit_generator calls over algorithm x dtype x shape, counters that wrap
around 2^64, jax.random's rbg and unsafe_rbg implementations, and u64[3] Philox states
and signed outputs (which JAX never emits) from StableHLO text run by JAX's CPU backend.
"""
from __future__ import annotations

import contextlib
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest

import hlo2onnx
from harness import Case, check_model, run_case
from hlo2onnx.check import reference_runner
from hlo2onnx.errors import UnsupportedOpError
from mnjit import mnjit

ALGORITHMS = {"three_fry": jax.lax.RandomAlgorithm.RNG_THREE_FRY, "philox": jax.lax.RandomAlgorithm.RNG_PHILOX,
              "default": jax.lax.RandomAlgorithm.RNG_DEFAULT}
DTYPES = {"u8": jnp.uint8, "u16": jnp.uint16, "u32": jnp.uint32, "u64": jnp.uint64}
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (5, 1, 3), (3, 1), (1000,), (0,)]
KEY64 = np.array([0x0123456789ABCDEF, 0xFEDCBA9876543210], np.uint64)
KEY32 = np.array([7, 0xFFFFFFFF, 12345, 0x80000000], np.uint32)


def assert_bit_identical(fun, *args, x64: bool = False) -> None:
    """Every output of mnjit(fun) equals jax.jit(fun)'s exactly: dtype, shape and bits."""
    with jax.enable_x64(True) if x64 else contextlib.nullcontext():
        expected = jax.tree_util.tree_leaves(jax.jit(fun)(*args))
        compiled = mnjit(fun)
        actual = jax.tree_util.tree_leaves(compiled(*args))
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, a.shape, e.dtype, e.shape)
            np.testing.assert_array_equal(np.asarray(a), np.asarray(e))
        check_model(compiled.lower(*args).onnx_model)


def draw(algorithm, shape, dtype):
    return lambda key: jax.lax.rng_bit_generator(key, shape, dtype=dtype, algorithm=algorithm)


@pytest.mark.parametrize("algorithm,dtype,shape", list(itertools.product(ALGORITHMS, DTYPES, SHAPES)),
                         ids=lambda v: "x".join(map(str, v)) or "scalar" if isinstance(v, tuple) else v)
def test_table(algorithm: str, dtype: str, shape: tuple[int, ...]) -> None:
    assert_bit_identical(draw(ALGORITHMS[algorithm], shape, DTYPES[dtype]), KEY64, x64=True)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", ["u8", "u32"])
def test_u32_key(algorithm: str, dtype: str) -> None:
    """JAX's own key layout, u32[4], bitcast to u64[2] around the op (without x64)."""
    assert_bit_identical(draw(ALGORITHMS[algorithm], (5, 3), DTYPES[dtype]), KEY32)


# Counters that wrap: ThreeFry's 64-bit counter, Philox's low word carrying into the key word.
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype,shape", [("u32", (9,)), ("u64", (3, 3)), ("u16", (2, 5))])
def test_counter_wraps(algorithm: str, dtype: str, shape) -> None:
    key = np.array([0xFFFFFFFFFFFFFFFF, 2 ** 64 - 3], np.uint64)
    assert_bit_identical(draw(ALGORITHMS[algorithm], shape, DTYPES[dtype]), key, x64=True)


def test_chained_draws() -> None:
    """The new state feeds the next draw: both streams stay identical."""
    def chain(key):
        outs = []
        for name, shape in [("philox", (3,)), ("three_fry", (2, 2)), ("default", ())]:
            key, bits = jax.lax.rng_bit_generator(key, shape, algorithm=ALGORITHMS[name])
            outs.append(bits)
        return key, outs
    assert_bit_identical(chain, KEY64, x64=True)


def test_vmap() -> None:
    """Batched keys go through the batching rule (one draw per key, dynamic_update_slice of the states)."""
    keys = np.stack([KEY64, KEY64 + np.uint64(1), KEY64[::-1].copy()])
    assert_bit_identical(jax.vmap(draw(ALGORITHMS["default"], (4,), jnp.uint32)), keys, x64=True)


# -- jax.random with the rbg implementations ------------------------------------------
def rbg_cases(impl: str) -> list[Case]:
    def typed(fn):
        return lambda k, *args: fn(jax.random.wrap_key_data(k, impl=impl), *args)

    key = np.asarray(jax.random.key_data(jax.random.key(2024, impl=impl)))
    exact = (0, 0)
    return [
        Case(f"{impl}_key", lambda s: jax.random.key_data(jax.random.key(s, impl=impl)), (np.int32(5),), tol=exact),
        Case(f"{impl}_split", typed(lambda k: jax.random.key_data(jax.random.split(k, 5))), (key,), tol=exact),
        Case(f"{impl}_split_shape", typed(lambda k: jax.random.key_data(jax.random.split(k, (2, 3)))), (key,),
             tol=exact),
        Case(f"{impl}_fold_in", typed(lambda k, d: jax.random.key_data(jax.random.fold_in(k, d))),
             (key, np.int32(-9)), tol=exact),
        Case(f"{impl}_uniform", typed(lambda k: jax.random.uniform(k, (4, 6))), (key,), tol=exact),
        Case(f"{impl}_uniform_f64", typed(lambda k: jax.random.uniform(k, (7,), jnp.float64)), (key,), tol=exact,
             x64=True),
        Case(f"{impl}_uniform_f16", typed(lambda k: jax.random.uniform(k, (9,), jnp.float16)), (key,), tol=exact),
        Case(f"{impl}_normal", typed(lambda k: jax.random.normal(k, (6, 5))), (key,)),  # erf_inv: float tolerance
        Case(f"{impl}_randint", typed(lambda k: jax.random.randint(k, (40,), -1000, 1000)), (key,), tol=exact),
        Case(f"{impl}_randint_i64", typed(lambda k: jax.random.randint(k, (9,), -2 ** 60, 2 ** 61, jnp.int64)),
             (key,), tol=exact, x64=True),
        Case(f"{impl}_bits_u32", typed(lambda k: jax.random.bits(k, (3, 5))), (key,), tol=exact),
        Case(f"{impl}_bits_u8", typed(lambda k: jax.random.bits(k, (11,), jnp.uint8)), (key,), tol=exact),
        Case(f"{impl}_bits_u64", typed(lambda k: jax.random.bits(k, (5,), jnp.uint64)), (key,), tol=exact, x64=True),
        Case(f"{impl}_permutation", typed(lambda k: jax.random.permutation(k, 50)), (key,), tol=exact),
        Case(f"{impl}_permutation_rows", typed(lambda k, x: jax.random.permutation(k, x)),
             (key, np.arange(24, dtype=np.float32).reshape(8, 3)), tol=exact),
    ]


@pytest.mark.parametrize("case", rbg_cases("rbg") + rbg_cases("unsafe_rbg"), ids=repr)
def test_rbg(case: Case) -> None:
    run_case(case)


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_rbg_normal_bits(impl: str) -> None:
    """normal's float tolerance above is for erf_inv only: the bits under it are identical."""
    key = np.asarray(jax.random.key_data(jax.random.key(11, impl=impl)))
    assert_bit_identical(lambda k: jax.random.bits(jax.random.split(jax.random.wrap_key_data(k, impl=impl))[1],
                                                   (6, 5)), key)


# -- forms JAX does not emit: StableHLO text, run by JAX's CPU backend as the reference -----
def module(algorithm: str, words: int, out: str) -> bytes:
    state = f"tensor<{words}xui64>"
    return f"""
func.func public @main(%arg0: {state}) -> ({state}, tensor<{out}>) {{
  %s, %o = stablehlo.rng_bit_generator %arg0, algorithm = {algorithm} : ({state}) -> ({state}, tensor<{out}>)
  return %s, %o : {state}, tensor<{out}>
}}""".encode()


@pytest.mark.parametrize("algorithm,words,out,key", [
    ("PHILOX", 3, "7xui32", [1, 2 ** 64 - 1, 5]),  # the low word carries into the high one
    ("PHILOX", 3, "3x3xui64", [9, 2 ** 64 - 2, 2 ** 64 - 1]),  # ... and the 128-bit counter wraps
    ("DEFAULT", 3, "5xui8", [1, 2, 3]),
    ("PHILOX", 3, "ui16", [4, 5, 6]),
    ("THREE_FRY", 2, "4x3xi32", [1, 2]),  # signed: the same bits (XLA's executable returns them unsigned)
    ("PHILOX", 2, "9xi64", [3, 4]),
    ("DEFAULT", 2, "9xi8", [3, 4]),
], ids=str)
def test_module_forms(algorithm: str, words: int, out: str, key: list[int]) -> None:
    conversion = hlo2onnx.convert(module(algorithm, words, out))
    state = np.array(key, np.uint64)
    session = ort.InferenceSession(conversion.to_proto().SerializeToString(), providers=["CPUExecutionProvider"])
    actual = session.run(None, {session.get_inputs()[0].name: state})
    expected = reference_runner(conversion.loaded)([state])
    assert actual[1].dtype.itemsize == expected[1].dtype.itemsize
    np.testing.assert_array_equal(actual[0], expected[0])
    np.testing.assert_array_equal(actual[1].view(expected[1].dtype), expected[1])


@pytest.mark.parametrize("algorithm,words,out,match", [
    ("THREE_FRY", 3, "4xui32", "THREE_FRY with a u64\\[3\\] state"),
    ("PHILOX", 4, "4xui32", "PHILOX with a u64\\[4\\] state"),
    ("PHILOX", 2, "4xf32", "float32.*bitcast"),
])
def test_refused(algorithm: str, words: int, out: str, match: str) -> None:
    with pytest.raises(UnsupportedOpError, match=f"rng_bit_generator.*{match}"):
        hlo2onnx.convert(module(algorithm, words, out))
