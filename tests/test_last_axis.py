"""A short last axis that broadcasts, s[..., 1] op v[..., K], becomes a Concat of K copies (patterns/last_axis.py).

Values must be jax.jit's (NaN, infinities, signed zeros in both operands), and the
graph must hold the Concat where the rule applies and not where the array is small.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import Case, rand, run_case
from mnjit import mnjit
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


def test_fusing_targets_keep_the_broadcast():
    """A target whose compiler fuses broadcasts (IREE) gets the broadcasting op itself: the Concat would be
    two strided copies there. The values are still jax.jit's."""
    pytest.importorskip("iree.runtime")
    s, v = operands(300)
    for target, concats in (("ort-cpu", 1), ("iree-cpu", 0)):
        model = mnjit(force, target=target).lower(s, v).onnx_model
        assert sum(node.op_type == "Concat" for node in model.graph.node) == concats, target
    product = lambda s, v: s[..., None] * v  # noqa: E731  one rounding per element: every bit the same
    np.testing.assert_array_equal(np.asarray(mnjit(product, target="iree-cpu")(s, v)), jax.jit(product)(s, v))


def test_small_arrays_keep_the_broadcast():
    case = Case("small", force, operands(20))
    run_case(case)
    assert all_ops(case.fun, *case.args)["Concat"] == 0



def test_widened_inside_a_fire_loop():
    """JAX-MD's FIRE in a fori_loop: the force's s[..., None] is a Reshape that had no static shape in the body
    until patterns/body_shapes.py gave it one."""
    from jax_md import energy, minimize, quantity, space

    n = 200
    box = quantity.box_size_at_number_density(n, 0.8, 2)
    displacement, shift = space.periodic(box)
    with jax.enable_x64(True):
        positions = jax.random.uniform(jax.random.PRNGKey(0), (n, 2), maxval=box, dtype=jnp.float64)
        fire_init, fire_apply = minimize.fire_descent(energy.soft_sphere_pair(displacement), shift)
        leaves, tree = jax.tree_util.tree_flatten(fire_init(positions))
        leaves = [np.asarray(jnp.asarray(leaf)) for leaf in leaves]

    def loop(*leaves):
        state = jax.tree_util.tree_unflatten(tree, leaves)
        return jax.lax.fori_loop(0, 3, lambda i, s: fire_apply(s), state).position

    case = Case("fire_loop", loop, leaves, x64=True)
    run_case(case)
    with jax.enable_x64(True):
        ops = all_ops(case.fun, *case.args)
    assert ops["Loop"] == 1 and ops["Concat"] >= 1 and ops["Mod"] == 1, dict(ops)


# -- x[..., t::k]: pooling windows along the last axis, as one Reshape, Transpose and Split ------------------
def pool(reducer, init, k, stride=None):
    stride = k if stride is None else stride
    return lambda x: jax.lax.reduce_window(x, init, reducer, (1, 1, 1, k), (1, 1, 1, stride), "VALID")


def pooled_input(shape, dtype=np.float32, nan=False):
    """Specials in windows of their own and mixed. NaN only where asked: XLA's CPU max/min windows drop a NaN
    or keep it depending on its place in the window (measured, with or without this rewrite)."""
    special = SPECIAL if nan else SPECIAL[~np.isnan(SPECIAL)]
    x = rand(shape, dtype, seed=3)
    x.reshape(-1)[:len(special) * 3] = np.repeat(special, 3)
    x[0, 0, 1, :len(special)] = special[::-1]
    return x


STRIDED = [  # (case, Splits expected)
    (Case("max_2", pool(jax.lax.max, -np.inf, 2), (pooled_input((4, 8, 32, 64)),)), 1),
    (Case("max_2_crop", pool(jax.lax.max, -np.inf, 2), (pooled_input((4, 8, 32, 65)),)), 1),  # the last column left out
    (Case("max_3", pool(jax.lax.max, -np.inf, 3), (pooled_input((4, 8, 32, 66)),)), 1),
    (Case("min_2_f64", pool(jax.lax.min, np.inf, 2), (pooled_input((4, 8, 32, 64), np.float64),), x64=True), 1),
    (Case("mul_2", pool(jax.lax.mul, 1.0, 2), (pooled_input((4, 8, 32, 64), nan=True),)), 1),
    (Case("int_max_2", pool(jax.lax.max, np.iinfo(np.int32).min, 2),
          (rand((4, 8, 32, 64), np.int32, seed=4),)), 1),
    (Case("overlapping_windows", pool(jax.lax.max, -np.inf, 3, 2), (pooled_input((4, 8, 32, 65)),)), 1),  # t = 0, 1
    (Case("small", pool(jax.lax.max, -np.inf, 2), (pooled_input((2, 2, 4, 64)),)), 0),
    (Case("every_other_odd", lambda x: (x[..., ::2], x[..., 1::2]), (pooled_input((4, 8, 32, 65)),)), 1),  # 33, 32
]


def pool2d(layout: str, k: int = 2):
    window = (1, 1, k, k) if layout == "NCHW" else (1, k, k, 1)
    return lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, window, "VALID")


# Inner axes: H (and W in NHWC) are split as blocks of the rows after them, when those rows are 16 long or more
# (and the array, once pooled along H, still has MIN_ELEMENTS).
STRIDED += [
    (Case("nchw_2x2", pool2d("NCHW"), (pooled_input((4, 8, 64, 64)),)), 2),
    (Case("nchw_3x3_crop", pool2d("NCHW", 3), (pooled_input((4, 8, 94, 96)),)), 2),
    (Case("nhwc_2x2", pool2d("NHWC"), (pooled_input((8, 32, 32, 16)),)), 2),
    (Case("every_other_row", lambda x: (x[:, :, ::2], x[:, :, 1::2]), (pooled_input((4, 8, 64, 64)),)), 1),
    (Case("nhwc_2x2_narrow_channels", pool2d("NHWC"), (rand((8, 64, 64, 3), seed=5),)), 1),  # W's rows: 3
]


@pytest.mark.parametrize("case,splits", STRIDED, ids=[c.name for c, _ in STRIDED])
def test_strided_last_axis_slices(case, splits):
    run_case(dataclasses.replace(case, tol=(0, 0)))  # block copies and the same merges: the same values
    with jax.enable_x64(case.x64):
        ops = all_ops(case.fun, *case.args)
    assert ops["Split"] == splits, dict(ops)
