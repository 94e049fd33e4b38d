"""Precision of a flax training step (the MNIST tutorial's CNN, nnx's or --model linen's, adamw(0.005)) under mnjit
and jax.jit,
each against the same step in float64: gradients after one step, parameters after --steps steps (default 3),
and eager JAX (no jit: op by op, XLA's kernels) beside them.

    python benchmarks/precision_adam.py [--steps 10] [--model linen]

Adam divides each update by the root of the gradient's second moment, so an element whose gradient is near
zero moves by a learning-rate-sized step that rounding can tip: two correct float32 implementations drift
apart there. Whether mnjit's float32 arithmetic is worse than XLA's is what the float64 run answers
(docs/precision.md).
"""
from __future__ import annotations

import argparse
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


def linen_cnn():
    """The same CNN in flax linen (the linen MNIST tutorial's): its parameters and apply function."""
    from flax import linen as nn

    class LinenCNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.avg_pool(nn.relu(nn.Conv(32, (3, 3))(x)), (2, 2), (2, 2))
            x = nn.avg_pool(nn.relu(nn.Conv(64, (3, 3))(x)), (2, 2), (2, 2))
            return nn.Dense(10)(nn.relu(nn.Dense(256)(x.reshape(x.shape[0], -1))))

    model = LinenCNN()
    params = model.init(jax.random.key(0), np.zeros((1, 28, 28, 1), np.float32))["params"]
    return params, lambda params, x: model.apply({"params": params}, x)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="adamw steps before the parameters are compared")
    parser.add_argument("--model", choices=("nnx", "linen"), default="nnx")
    options = parser.parse_args(argv)
    steps = options.steps
    if options.model == "linen":
        params, apply = linen_cnn()
    else:
        graphdef, params = nnx.split(CNN(rngs=nnx.Rngs(0)), nnx.Param)

        def apply(params, x):
            return nnx.merge(graphdef, params)(x)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 28, 28, 1)).astype(np.float32), rng.integers(0, 10, 32)

    def loss(params, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(apply(params, x), y).mean()

    grad = jax.grad(loss)
    tx = optax.adamw(0.005, 0.9)

    def step(params, opt_state, x, y):
        updates, opt_state = tx.update(grad(params, x, y), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def train(stepper, params, dtype):
        opt_state = tx.init(params)
        for _ in range(steps):
            params, opt_state = stepper(params, opt_state, x.astype(dtype), y)
        return params

    def leaves(tree):
        return [np.asarray(leaf, np.float64) for leaf in jax.tree_util.tree_leaves(tree)]

    names = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    g_jit, g_ours = jax.jit(grad)(params, x, y), mnjit(grad)(params, x, y)
    p_jit, p_ours = train(jax.jit(step), params, np.float32), train(mnjit(step), params, np.float32)
    with jax.disable_jit():
        p_eager = train(step, params, np.float32)
    with jax.enable_x64(True):
        params64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
        g_64, p_64 = jax.jit(grad)(params64, x.astype(np.float64), y), train(jax.jit(step), params64, np.float64)

    print(f"{'gradient, |error| / max |g64|':<36}{'jax.jit':>12}{'mnjit':>12}")
    for name, a, b, r in zip(names, leaves(g_jit), leaves(g_ours), leaves(g_64)):
        scale = np.abs(r).max()
        print(f"{name[:35]:<36}{np.abs(a - r).max() / scale:12.2e}{np.abs(b - r).max() / scale:12.2e}")
    print(f"\n{f'after {steps} adamw steps, max |diff|':<36}{'jit - f64':>12}{'mnjit - f64':>12}{'eager - f64':>12}"
          f"{'mnjit - jit':>12}{'eager - jit':>12}")
    for name, a, b, e, r in zip(names, leaves(p_jit), leaves(p_ours), leaves(p_eager), leaves(p_64)):
        print(f"{name[:35]:<36}{np.abs(a - r).max():12.2e}{np.abs(b - r).max():12.2e}{np.abs(e - r).max():12.2e}"
              f"{np.abs(a - b).max():12.2e}{np.abs(a - e).max():12.2e}")


if __name__ == "__main__":
    main()
