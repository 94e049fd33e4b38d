"""jnp.mod by a positive constant without ORT's float Mod (hlo2onnx/patterns/remainder.py).

Each case runs against jax.jit on the values the rewrite could break: signed zeros,
infinities, NaN, exact multiples of the divisor and their neighbours, tiny and
large dividends. The graph must have lost its Mod where the rule applies, and kept
it where the sign of a zero result would show.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import Case, run_case
from mnjit import mnjit
from test_algebra import all_ops

from hlo2onnx.patterns.remainder import split


def edge_values(dtype, c: float, size: int = 0) -> np.ndarray:
    """Dividends for jnp.mod(x, c): specials, k * c and its neighbours, tiny and up to 1e4 * c."""
    dtype = np.dtype(dtype)
    info = np.finfo(dtype)
    c = dtype.type(c)
    multiples = np.arange(-60, 61, dtype=dtype) * c
    near = np.concatenate([np.nextafter(multiples, dtype.type(np.inf)), np.nextafter(multiples, dtype.type(-np.inf))])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, info.tiny, -info.tiny, 1e-30, -1e-30, c / 2, -c / 2, c, -c],
                       dtype)
    rng = np.random.default_rng(0)
    spread = rng.uniform(-1e4, 1e4, 400).astype(dtype) * c
    near_c = (rng.uniform(-3, 3, 400) * c).astype(dtype)
    # No subnormals: XLA's CPU flushes them to zero and ORT does not, with or without the rewrite
    # (jnp.mod(-5e-324, c) is c in mnjit before and after it, 0 in jax.jit).
    near = near[(near == 0) | (abs(near) >= info.tiny)]
    values = np.concatenate([special, multiples, near, spread, near_c]).astype(dtype)
    if size:
        values = np.resize(rng.uniform(-40, 40, size).astype(dtype) * c, size)
        head = np.concatenate([special, multiples, near])
        values[:len(head)] = head
    return values


# jnp.mod(x, c) + k with a tiny k exposes the remainder itself (k vanishes next to any normal result) while the
# sign of a zero result cannot show: the rule applies. FIRE's wrap subtracts c / 2.
def plus_tiny(c, dtype):
    tiny = np.finfo(dtype).tiny
    return lambda x: jnp.mod(x, dtype(c)) + dtype(tiny)


def wrap(c, dtype):
    return lambda x: jnp.mod(x + dtype(c / 2), dtype(c)) - dtype(c / 2)


C = 35.35533905932738  # FIRE's box side at N=1000, density 0.8: not a power of two
FIRES = [
    Case("f32_plus_tiny", plus_tiny(C, np.float32), (edge_values(np.float32, C),)),
    Case("f64_plus_tiny", plus_tiny(C, np.float64), (edge_values(np.float64, C),), x64=True),
    Case("f32_wrap", wrap(C, np.float32), (edge_values(np.float32, C),)),
    Case("f64_wrap", wrap(C, np.float64), (edge_values(np.float64, C),), x64=True),
    Case("f32_small_divisor", plus_tiny(0.1, np.float32), (edge_values(np.float32, 0.1),)),
    Case("f32_large_array", plus_tiny(2.5, np.float32), (edge_values(np.float32, 2.5, size=70000),)),
    # A power-of-two divisor: exact, bit for bit.
    Case("f32_power_of_two", plus_tiny(4.0, np.float32), (edge_values(np.float32, 4.0),), tol=(0, 0)),
    Case("f64_power_of_two", plus_tiny(0.5, np.float64), (edge_values(np.float64, 0.5),), tol=(0, 0), x64=True),
]


@pytest.mark.parametrize("case", FIRES, ids=[c.name for c in FIRES])
def test_mod_rewritten(case):
    run_case(case)
    with jax.enable_x64(case.x64):
        ops = all_ops(case.fun, *case.args)
    assert ops["Mod"] == 0 and ops["Floor"] == 1, dict(ops)


# The remainder as an output (its zeros' signs show), a negative divisor, a variable divisor: Mod stays.
KEPT = [
    Case("output", lambda x: jnp.mod(x, np.float32(2.5)), (edge_values(np.float32, 2.5),)),
    Case("negative_divisor", lambda x: jnp.mod(x, np.float32(-2.5)) + np.float32(1), (edge_values(np.float32, 2.5),)),
    Case("variable_divisor", lambda x, c: jnp.mod(x, c) + np.float32(1),
         (edge_values(np.float32, 2.5), np.float32(2.5))),
    Case("fmod", lambda x: jnp.fmod(x, np.float32(2.5)) + np.float32(1), (edge_values(np.float32, 2.5),)),
]


@pytest.mark.parametrize("case", KEPT, ids=[c.name for c in KEPT])
def test_mod_kept(case):
    run_case(case)
    ops = all_ops(case.fun, *case.args)
    assert ops["Mod"] == 1, dict(ops)


def test_zero_signs_where_they_show():
    x = edge_values(np.float32, 2.5)
    expected = np.asarray(jax.jit(lambda x: jnp.mod(x, np.float32(2.5)))(x))
    actual = np.asarray(mnjit(lambda x: jnp.mod(x, np.float32(2.5)))(x))
    zeros = expected == 0
    assert zeros.sum() > 10 and (np.signbit(actual[zeros]) == np.signbit(expected[zeros])).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [C, 0.1, 4.0, 3e38, 1e-30])
def test_split_is_exact(dtype, c):
    c = np.dtype(dtype).type(c)
    hi, lo = split(c)
    bits = np.finfo(dtype).nmant + 1
    assert hi + lo == c and abs(lo) <= abs(c) * 2.0 ** (-(bits // 2) + 1)
    mantissa = np.frexp(hi)[0] * 2.0 ** ((bits + 1) // 2)
    assert mantissa == np.floor(mantissa)  # half the bits: f * hi is exact for |f| < 2 ** (bits // 2)


def test_mod_rewritten_inside_a_loop_body():
    """fori_loop bodies: the comparisons against hoisted splats had no static shape, so no rewrite fired there
    (patterns/body_shapes.py)."""
    c = np.float32(C)  # no product before the mod: XLA would fuse x * k + c into an FMA, and ORT does not

    def loop(x):
        return jax.lax.fori_loop(0, 3, lambda i, x: jnp.mod(x + c / 2, c) - c / 2, x)

    case = Case("loop", loop, (edge_values(np.float32, C, size=70000),))
    run_case(case)
    ops = all_ops(case.fun, *case.args)
    assert ops["Loop"] == 1 and ops["Mod"] == 0 and ops["Floor"] == 1, dict(ops)
