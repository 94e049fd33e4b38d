"""Typed PRNG keys (jax.random.key) in and out of mnjit, for each implementation, compared with jax.jit; and the
libraries that hold them: flax linen dropout rngs and a flax nnx model whose state holds an nnx.Rngs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import assert_same
from mnjit import mnjit

IMPLS = ["threefry2x32", "rbg", "unsafe_rbg"]


def _same_tree(actual, expected) -> None:
    """Keys compared by implementation and key data; arrays by harness rules."""
    a_leaves, a_tree = jax.tree_util.tree_flatten(actual)
    e_leaves, e_tree = jax.tree_util.tree_flatten(expected)
    assert a_tree == e_tree
    for a, e in zip(a_leaves, e_leaves):
        if jax.dtypes.issubdtype(e.dtype, jax.dtypes.extended):
            assert a.dtype == e.dtype and a.shape == e.shape
            assert jax.random.key_impl(a) == jax.random.key_impl(e)
            np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(e))
        else:
            assert_same(a, e)


FUNCTIONS = {
    "uniform": lambda k: jax.random.uniform(k, (3,)),
    "split": lambda k: jax.random.split(k),
    "split_and_draw": lambda k: (jax.random.split(k, 3), jax.random.normal(k, (2, 2))),
    "fold_in_tree": lambda k: {"a": jax.random.fold_in(k, 7), "b": [jax.random.bits(k, (4,))]},
    "new_key_out": lambda k: jax.random.key(3),
    "loop_carry": lambda k: jax.lax.fori_loop(0, 4, lambda i, c: jax.random.fold_in(c, i), k),
    "scan_draws": lambda k: jax.lax.scan(lambda c, _: (jax.random.split(c)[0], jax.random.uniform(c)), k,
                                         None, length=5),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_typed_keys_in_and_out(impl, name):
    fun = FUNCTIONS[name]
    key = jax.random.key(0, impl=impl)
    _same_tree(mnjit(fun)(key), jax.jit(fun)(key))


@pytest.mark.parametrize("impl", IMPLS)
def test_keys_inside_pytrees_and_beside_arrays(impl):
    fun = lambda state, x: ({"key": jax.random.split(state["key"])[0], "x": state["x"] + x},  # noqa: E731
                            jax.random.uniform(state["key"], x.shape) * x)
    state = {"key": jax.random.key(1, impl=impl), "x": jnp.arange(3.0)}
    _same_tree(mnjit(fun)(state, jnp.ones(3)), jax.jit(fun)(state, jnp.ones(3)))


@pytest.mark.parametrize("impl", IMPLS)
def test_keys_under_vmap_and_as_a_batch(impl):
    keys = jax.random.split(jax.random.key(2, impl=impl), 4)
    draw = lambda k: jax.random.uniform(k, (2,))  # noqa: E731
    _same_tree(jax.vmap(mnjit(draw))(keys), jax.vmap(draw)(keys))
    _same_tree(mnjit(jax.vmap(draw))(keys), jax.jit(jax.vmap(draw))(keys))


def test_legacy_uint32_keys_still_work():
    key = jax.random.PRNGKey(0)
    fun = lambda k: (jax.random.split(k), jax.random.uniform(k, (3,)))  # noqa: E731
    _same_tree(mnjit(fun)(key), jax.jit(fun)(key))


def test_flax_linen_dropout_with_typed_rngs():
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.Dense(8)(x)
            return nn.Dropout(0.5, deterministic=not train)(jax.nn.relu(x))

    model = Block()
    x = jnp.ones((4, 5))
    params = model.init(jax.random.key(0), x, train=False)
    apply = lambda p, x, k: model.apply(p, x, train=True, rngs={"dropout": k})  # noqa: E731
    _same_tree(mnjit(apply)(params, x, jax.random.key(1)), jax.jit(apply)(params, x, jax.random.key(1)))
