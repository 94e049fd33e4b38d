"""jax.random (threefry2x32, the default) compared bit for bit with jax.jit.

Keys cross the jit boundary as raw key data (typed keys cannot be an mnjit argument or result).
Where a sampler goes through a transcendental (log, erf_inv's polynomial, ...), ORT's kernel may
round differently from XLA's by an ulp; those cases name the function and keep a tolerance.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import Case, run_case

KEY = np.asarray(jax.random.key_data(jax.random.PRNGKey(2024)))
LOGITS = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25], [0.02, 0.97, 0.01]], np.float32))
EXACT = (0, 0)


def typed(fn):
    return lambda k, *args: fn(jax.random.wrap_key_data(k), *args)


CASES = [
    Case("key", lambda s: jax.random.key_data(jax.random.key(s)), (np.int32(5),), tol=EXACT),
    Case("PRNGKey_negative", jax.random.PRNGKey, (np.int32(-123456),), tol=EXACT),
    Case("PRNGKey_u32", jax.random.PRNGKey, (np.uint32(4_000_000_000),), tol=EXACT),
    Case("PRNGKey_i64", jax.random.PRNGKey, (np.int64(-2**50 + 11),), tol=EXACT, x64=True),
    Case("split_2", typed(lambda k: jax.random.key_data(jax.random.split(k))), (KEY,), tol=EXACT),
    Case("split_7x2", typed(lambda k: jax.random.key_data(jax.random.split(k, (7, 2)))), (KEY,), tol=EXACT),
    Case("split_chain", typed(lambda k: jax.random.key_data(jax.random.split(jax.random.split(k)[1], 5))), (KEY,),
         tol=EXACT),
    Case("fold_in", typed(lambda k, d: jax.random.key_data(jax.random.fold_in(k, d))), (KEY, np.int32(-9)), tol=EXACT),
    Case("fold_in_vmap", typed(lambda k, d: jax.random.key_data(jax.vmap(jax.random.fold_in, (None, 0))(k, d))),
         (KEY, np.arange(6, dtype=np.int32)), tol=EXACT),
    Case("bits_u32", typed(lambda k: jax.random.bits(k, (3, 5))), (KEY,), tol=EXACT),
    Case("bits_u8", typed(lambda k: jax.random.bits(k, (11,), jnp.uint8)), (KEY,), tol=EXACT),
    Case("bits_u16", typed(lambda k: jax.random.bits(k, (11,), jnp.uint16)), (KEY,), tol=EXACT),
    Case("bits_u64", typed(lambda k: jax.random.bits(k, (5,), jnp.uint64)), (KEY,), tol=EXACT, x64=True),
    Case("uniform_f32", typed(lambda k: jax.random.uniform(k, (4, 6))), (KEY,), tol=EXACT),
    # u * (max - min) + min: XLA's CPU backend contracts it into one FMA, ORT rounds the product first,
    # so results differ by up to half an ulp of the product (|product| < 5.5: 2.4e-7), never more.
    Case("uniform_f32_bounds", typed(lambda k: jax.random.uniform(k, (33,), minval=-5.0, maxval=0.5)), (KEY,),
         tol=(0, 2.4e-7)),
    Case("uniform_f16", typed(lambda k: jax.random.uniform(k, (33,), jnp.float16)), (KEY,), tol=EXACT),
    Case("uniform_bf16", typed(lambda k: jax.random.uniform(k, (33,), jnp.bfloat16).astype(jnp.float32)), (KEY,),
         tol=EXACT),
    Case("uniform_f64", typed(lambda k: jax.random.uniform(k, (17,), jnp.float64, -1, 1)), (KEY,), tol=EXACT,
         x64=True),
    Case("randint_i32", typed(lambda k: jax.random.randint(k, (40,), -1000, 1000)), (KEY,), tol=EXACT),
    Case("randint_full_range", typed(lambda k: jax.random.randint(k, (40,), -2**31, 2**31 - 1)), (KEY,), tol=EXACT),
    Case("randint_u8", typed(lambda k: jax.random.randint(k, (40,), 0, 255, jnp.uint8)), (KEY,), tol=EXACT),
    Case("randint_i64", typed(lambda k: jax.random.randint(k, (9,), -2**60, 2**61, jnp.int64)), (KEY,), tol=EXACT,
         x64=True),
    Case("bernoulli", typed(lambda k: jax.random.bernoulli(k, 0.25, (64,))), (KEY,), tol=EXACT),
    Case("bernoulli_p_array", typed(lambda k, p: jax.random.bernoulli(k, p)),
         (KEY, np.linspace(0, 1, 12, dtype=np.float32)), tol=EXACT),
    Case("rademacher", typed(lambda k: jax.random.rademacher(k, (20,))), (KEY,), tol=EXACT),
    Case("categorical", typed(jax.random.categorical), (KEY, LOGITS), tol=EXACT),
    Case("categorical_shape", typed(lambda k, l: jax.random.categorical(k, l, axis=-1, shape=(5, 3))), (KEY, LOGITS),
         tol=EXACT),
    Case("permutation_int", typed(lambda k: jax.random.permutation(k, 50)), (KEY,), tol=EXACT),
    Case("permutation_rows", typed(lambda k, x: jax.random.permutation(k, x)),
         (KEY, np.arange(24, dtype=np.float32).reshape(8, 3)), tol=EXACT),
    Case("choice_replace", typed(lambda k: jax.random.choice(k, 20, (10,))), (KEY,), tol=EXACT),
    Case("choice_no_replace", typed(lambda k: jax.random.choice(k, 20, (10,), replace=False)), (KEY,), tol=EXACT),
    Case("choice_p", typed(lambda k, p: jax.random.choice(k, 4, (12,), p=p)),
         (KEY, np.array([0.1, 0.2, 0.3, 0.4], np.float32)), tol=EXACT),
    Case("ball", typed(lambda k: jax.random.ball(k, 3, shape=(4,))), (KEY,)),
    # Through a transcendental: erf_inv's polynomial (normal, truncated_normal), log (exponential,
    # gumbel, laplace, logistic), and gamma's rejection loop (log, exp, sqrt inside a while).
    Case("normal", typed(lambda k: jax.random.normal(k, (6, 5))), (KEY,)),
    Case("normal_f64", typed(lambda k: jax.random.normal(k, (12,), jnp.float64)), (KEY,), x64=True),
    Case("normal_f16", typed(lambda k: jax.random.normal(k, (12,), jnp.float16)), (KEY,)),
    Case("truncated_normal", typed(lambda k: jax.random.truncated_normal(k, -1.5, 2.0, (20,))), (KEY,)),
    Case("exponential", typed(lambda k: jax.random.exponential(k, (20,))), (KEY,)),
    Case("gumbel", typed(lambda k: jax.random.gumbel(k, (20,))), (KEY,)),
    Case("laplace", typed(lambda k: jax.random.laplace(k, (20,))), (KEY,)),
    Case("logistic", typed(lambda k: jax.random.logistic(k, (20,))), (KEY,)),
    Case("cauchy", typed(lambda k: jax.random.cauchy(k, (20,))), (KEY,), tol=(1e-5, 1e-6)),
    Case("gamma", typed(lambda k, a: jax.random.gamma(k, a)), (KEY, np.array([0.3, 1.0, 2.5, 7.0, 30.0], np.float32)),
         tol=(1e-5, 1e-6)),
    Case("beta", typed(lambda k: jax.random.beta(k, 2.0, 3.0, (8,))), (KEY,), tol=(1e-5, 1e-6)),
    Case("dirichlet", typed(lambda k: jax.random.dirichlet(k, jnp.array([1.0, 2.0, 3.0]), (4,))), (KEY,),
         tol=(1e-5, 1e-6)),
    Case("poisson", typed(lambda k: jax.random.poisson(k, 3.5, (16,))), (KEY,), tol=EXACT),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_prng(case: Case) -> None:
    run_case(case)


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_rng_bit_generator_impls(impl: str) -> None:
    """The rbg implementations lower to stablehlo.rng_bit_generator: bit for bit too.

    test_rng_bit_generator.py covers the op and these implementations in full.
    """
    key = np.asarray(jax.random.key_data(jax.random.key(7, impl=impl)))

    def draw(k):
        k = jax.random.wrap_key_data(k, impl=impl)
        return jax.random.uniform(k, (4, 3)), jax.random.key_data(jax.random.split(k, 3))

    run_case(Case(f"{impl}_uniform_split", draw, (key,), tol=EXACT))
