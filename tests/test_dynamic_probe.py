"""Symbolic-dim exports that used to be refused: slices of symbolic size (jnp's x[:, 1:], jnp.diff: a
stablehlo.dynamic_gather whose window is symbolic).

Each row is a test_dynamic_export.DynCase, compared with jax.jit at several sizes in both x64 modes.
"""
from __future__ import annotations

import jax.numpy as jnp
import pytest
from jax import lax

from test_dynamic_export import Arg, DynCase, check_symbolic, I32

# s <= t where a case needs it; 1 and a large-ish size included.
SIZES = [{"b": 1, "s": 1, "t": 3}, {"b": 3, "s": 4, "t": 7}, {"b": 17, "s": 20, "t": 20}]


SLICES = [
    DynCase("slice_tail", lambda x: x[:, 1:], [Arg("b, t")], sizes=SIZES),
    DynCase("slice_both_ends", lambda x: x[1:, 1:-1], [Arg("b, t")], sizes=SIZES),
    DynCase("slice_last_three", lambda x: x[:, -3:], [Arg("b, t")], sizes=SIZES, constraints=["t >= 3"]),
    DynCase("slice_half", lambda x: x[:, : x.shape[1] // 2], [Arg("b, t")], sizes=SIZES),
    DynCase("slice_row_tail", lambda x, i: x[i, 1:], [Arg("b, t"), Arg("", I32, -4, 30)], sizes=SIZES),
    DynCase("slice_tail_column", lambda x: x[:, 1:, 2], [Arg("b, t, 4")], sizes=SIZES),
    DynCase("diff", lambda x: jnp.diff(x, axis=1), [Arg("b, t")], sizes=SIZES),
    DynCase("diff_over_batch", lambda x: jnp.diff(x, axis=0), [Arg("b, 3")], sizes=SIZES),
    DynCase("positions_sliced", lambda x, e: x + e[: x.shape[1]], [Arg("b, t, 4"), Arg("32, 4")], sizes=SIZES,
            constraints=["t <= 32"]),
]

@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("case", SLICES, ids=repr)
def test_symbolic_windows(case: DynCase, x64: bool):
    check_symbolic(case, x64)
