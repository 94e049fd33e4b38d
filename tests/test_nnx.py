"""A flax nnx model whose state holds an nnx.Rngs (Dropout) and BatchNorm statistics, trained with a step under
mnjit that updates the model the way nnx.jit does; compared with nnx.jit step by step."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mnjit import mnjit

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        # No bias before BatchNorm (as usual): its gradient is zero up to rounding, which Adam's normalization
        # would amplify into lr-sized steps that differ between any two compilers.
        self.hidden = nnx.Linear(4, 16, use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(16, rngs=rngs)
        self.dropout = nnx.Dropout(0.25, rngs=rngs)
        self.out = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(self.dropout(nnx.relu(self.norm(self.hidden(x)))))


def train_step(model: MLP, optimizer: nnx.Optimizer, x, y):
    def loss_fn(model):
        return jnp.mean((model(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def _make():
    model = MLP(nnx.Rngs(params=0, dropout=1))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def _leaves(tree):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def test_nnx_train_step_matches_nnx_jit():
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32))
               for _ in range(5)]

    reference_model, reference_optimizer = _make()
    reference_step = nnx.jit(train_step)

    model, optimizer = _make()
    graphdef, state = nnx.split((model, optimizer))

    @mnjit
    def step(state, x, y):  # what nnx.jit does: merge, run, return the updated state
        model, optimizer = nnx.merge(graphdef, state)
        loss = train_step(model, optimizer, x, y)
        return loss, nnx.state((model, optimizer))

    for x, y in batches:
        expected_loss = reference_step(reference_model, reference_optimizer, x, y)
        loss, state = step(state, x, y)
        np.testing.assert_allclose(loss, expected_loss, rtol=2e-5, atol=1e-6)
    assert step.translations == 1  # the state's structure, dtypes and key types round-trip unchanged
    ours, theirs = _leaves(state), _leaves(nnx.state((reference_model, reference_optimizer)))
    assert len(ours) == len(theirs)
    for a, e in zip(ours, theirs):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=2e-4, atol=1e-5)
    nnx.update(model, nnx.split(nnx.merge(graphdef, state)[0])[1])  # the state goes back into the model
    model.eval()
    reference_model.eval()
    x = batches[0][0]
    np.testing.assert_allclose(model(x), reference_model(x), rtol=2e-4, atol=1e-5)
