"""A short last axis that broadcasts, s[..., 1] op v[..., K], becomes a Concat of K copies (patterns/last_axis.py).

Values must be jax.jit's (NaN, infinities, signed zeros in both operands), and the
graph must hold the Concat where the rule applies and not where the array is small.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import Case, rand, run_case
from test_algebra import all_ops

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -2.5, 1e-30])


def operands(n: int, dtype=np.float32):
    s = rand((n, n), dtype, seed=1)
    v = rand((n, n, 2), dtype, seed=2)
    s.ravel()[:len(SPECIAL)] = SPECIAL
    v[0, :len(SPECIAL), 0] = SPECIAL[::-1]
    v[0, :len(SPECIAL), 1] = SPECIAL
    return s, v


def force(s, v):  # JAX-MD's pair force: the scalar per pair times the displacement, summed over one side
    return jnp.sum(s[..., None] * v, axis=1)


CASES = [
    Case("mul", lambda s, v: s[..., None] * v, operands(300)),  # f32 sums of 300 terms differ by summation order
    Case("mul_sum_f64", force, operands(300, np.float64), x64=True),
    Case("add", lambda s, v: v + s[..., None], operands(300)),
    Case("sub_narrow_first", lambda s, v: s[..., None] - v, operands(300)),
    Case("div", lambda s, v: v / s[..., None], operands(300)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_widened(case):
    run_case(case)
    with jax.enable_x64(case.x64):
        assert all_ops(case.fun, *case.args)["Concat"] == 1


def test_small_arrays_keep_the_broadcast():
    case = Case("small", force, operands(20))
    run_case(case)
    assert all_ops(case.fun, *case.args)["Concat"] == 0
