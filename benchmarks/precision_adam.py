"""Precision of a flax nnx training step (the nnx MNIST tutorial's CNN, adamw(0.005)) under mnjit and jax.jit,
each against the same step in float64: gradients after one step, parameters after three.

    python benchmarks/precision_adam.py

Adam divides each update by the root of the gradient's second moment, so an element whose gradient is near
zero moves by a learning-rate-sized step that rounding can tip: two correct float32 implementations drift
apart there. Whether mnjit's float32 arithmetic is worse than XLA's is what the float64 run answers
(docs/performance.md, "Precision").
"""
from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mnjit import mnjit  # noqa: E402


class CNN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.conv1(x)))
        x = self.avg_pool(nnx.relu(self.conv2(x)))
        return self.linear2(nnx.relu(self.linear1(x.reshape(x.shape[0], -1))))


def main() -> None:
    graphdef, params = nnx.split(CNN(rngs=nnx.Rngs(0)), nnx.Param)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 28, 28, 1)).astype(np.float32), rng.integers(0, 10, 32)

    def loss(params, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, params)(x), y).mean()

    grad = jax.grad(loss)
    tx = optax.adamw(0.005, 0.9)

    def step(params, opt_state, x, y):
        updates, opt_state = tx.update(grad(params, x, y), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def train(stepper, params, dtype):
        opt_state = tx.init(params)
        for _ in range(3):
            params, opt_state = stepper(params, opt_state, x.astype(dtype), y)
        return params

    def leaves(tree):
        return [np.asarray(leaf, np.float64) for leaf in jax.tree_util.tree_leaves(tree)]

    names = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    g_jit, g_ours = jax.jit(grad)(params, x, y), mnjit(grad)(params, x, y)
    p_jit, p_ours = train(jax.jit(step), params, np.float32), train(mnjit(step), params, np.float32)
    with jax.enable_x64(True):
        params64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
        g_64, p_64 = jax.jit(grad)(params64, x.astype(np.float64), y), train(jax.jit(step), params64, np.float64)

    print(f"{'gradient, |error| / max |g64|':<36}{'jax.jit':>12}{'mnjit':>12}")
    for name, a, b, r in zip(names, leaves(g_jit), leaves(g_ours), leaves(g_64)):
        scale = np.abs(r).max()
        print(f"{name[:35]:<36}{np.abs(a - r).max() / scale:12.2e}{np.abs(b - r).max() / scale:12.2e}")
    print(f"\n{'after 3 adamw steps, max |diff|':<36}{'jit - f64':>12}{'mnjit - f64':>12}{'mnjit - jit':>12}")
    for name, a, b, r in zip(names, leaves(p_jit), leaves(p_ours), leaves(p_64)):
        print(f"{name[:35]:<36}{np.abs(a - r).max():12.2e}{np.abs(b - r).max():12.2e}{np.abs(a - b).max():12.2e}")


if __name__ == "__main__":
    main()
