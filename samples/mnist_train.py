"""The official JAX MNIST example (stax + optimizers.momentum), run by mnjit.

Copied from jax/examples/mnist_classifier.py with one change: `jit` is mnjit.
Run with `--jit jax:jit` to get the original behaviour, and `--check` to run
both and report the largest difference.

    python samples/mnist_train.py                      # synthetic MNIST-shaped data
    python samples/mnist_train.py --data-dir ~/mnist   # real idx files
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import os
import time

import jax.numpy as jnp
import numpy as np
import numpy.random as npr
from jax import grad, random
from jax.example_libraries import optimizers, stax
from jax.example_libraries.stax import Dense, LogSoftmax, Relu

from mnjit import mnjit as jit  # the one change: was `from jax import jit`
from _common import add_jit_options, chosen_jit, verdict  # noqa: E402  --jit/--check, shared by the samples


# -- data ----------------------------------------------------------------------------------
def _read_idx(path: str) -> np.ndarray:
    """Reads an MNIST idx file (optionally gzipped): magic, dims, then raw uint8 data."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte idx file")
    ndim = data[3]
    dims = np.frombuffer(data, dtype=">u4", count=ndim, offset=4).astype(int)
    payload = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if payload.size != np.prod(dims):
        raise ValueError(f"{path}: truncated ({payload.size} bytes for shape {tuple(dims)})")
    return payload.reshape(dims)


def _find(data_dir: str, stem: str) -> str:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if os.path.exists(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    raise FileNotFoundError(f"no {stem}[.gz] in {data_dir}")


def _one_hot(labels: np.ndarray, k: int = 10) -> np.ndarray:
    return np.array(labels[:, None] == np.arange(k), np.float32)


def mnist(data_dir: str | None, num_train: int = 60000, num_test: int = 10000):
    """Returns (train_images, train_labels, test_images, test_labels) like the example's datasets.mnist()."""
    if data_dir:
        parts = [_read_idx(_find(data_dir, s)) for s in
                 ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                  "t10k-labels-idx1-ubyte")]
        train_images, train_labels, test_images, test_labels = parts
        flat = lambda x: (x.reshape(x.shape[0], -1) / np.float32(255.0)).astype(np.float32)  # noqa: E731
        return flat(train_images), _one_hot(train_labels), flat(test_images), _one_hot(test_labels)
    # Deterministic synthetic data: one random stroke prototype per class plus noise, so the
    # network has something to learn and accuracy rises as with real digits.
    rng = np.random.default_rng(0)
    prototypes = (rng.random((10, 784)) < 0.15).astype(np.float32)

    def make(n: int, seed: int):
        r = np.random.default_rng(seed)
        labels = r.integers(0, 10, n)
        images = prototypes[labels] * r.uniform(0.05, 0.35, (n, 1)) + r.normal(0.2, 0.5, (n, 784))
        return np.clip(images, 0, 1).astype(np.float32), _one_hot(labels)

    return (*make(num_train, 1), *make(num_test, 2))


# -- the example ------------------------------------------------------------------------------
def train(jit, data, num_epochs: int, batch_size: int = 128, step_size: float = 0.001, momentum_mass: float = 0.9,
          quiet: bool = False):
    train_images, train_labels, test_images, test_labels = data
    init_random_params, predict = stax.serial(Dense(1024), Relu, Dense(1024), Relu, Dense(10), LogSoftmax)

    def loss(params, batch):
        inputs, targets = batch
        preds = predict(params, inputs)
        return -jnp.mean(jnp.sum(preds * targets, axis=1))

    def accuracy(params, batch):
        inputs, targets = batch
        target_class = jnp.argmax(targets, axis=1)
        predicted_class = jnp.argmax(predict(params, inputs), axis=1)
        return jnp.mean(predicted_class == target_class)

    num_train = train_images.shape[0]
    num_complete_batches, leftover = divmod(num_train, batch_size)
    num_batches = num_complete_batches + bool(leftover)

    def data_stream():
        rng = npr.RandomState(0)
        while True:
            perm = rng.permutation(num_train)
            for i in range(num_batches):
                batch_idx = perm[i * batch_size:(i + 1) * batch_size]
                yield train_images[batch_idx], train_labels[batch_idx]

    batches = data_stream()
    opt_init, opt_update, get_params = optimizers.momentum(step_size, mass=momentum_mass)

    @jit
    def update(i, opt_state, batch):
        params = get_params(opt_state)
        return opt_update(i, grad(loss)(params, batch), opt_state)

    evaluate_loss, evaluate_accuracy = jit(loss), jit(accuracy)
    _, init_params = init_random_params(random.PRNGKey(0), (-1, 28 * 28))
    opt_state = opt_init(init_params)
    itercount = itertools.count()
    history = []
    if not quiet:
        print("\nStarting training...")
    for epoch in range(num_epochs):
        start_time = time.time()
        for _ in range(num_batches):
            opt_state = update(next(itercount), opt_state, next(batches))
        epoch_time = time.time() - start_time
        params = get_params(opt_state)
        train_loss = float(evaluate_loss(params, (train_images, train_labels)))
        train_acc = float(evaluate_accuracy(params, (train_images, train_labels)))
        test_acc = float(evaluate_accuracy(params, (test_images, test_labels)))
        history.append((train_loss, train_acc, test_acc))
        if not quiet:
            print(f"Epoch {epoch} in {epoch_time:0.2f} sec: loss {train_loss:.6f}, "
                  f"training accuracy {train_acc:.4f}, test accuracy {test_acc:.4f}")
    return history, get_params(opt_state)


def _largest_loss_difference(history, reference) -> float:
    """The largest relative difference of the per-epoch training losses."""
    return max(abs(a[0] - b[0]) / abs(b[0]) for a, b in zip(history, reference))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="folder with the MNIST idx files (else synthetic data)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--num-train", type=int, default=60000, help="synthetic training images")
    add_jit_options(parser, "the losses")
    parser.add_argument("--noise-floor", action="store_true",
                        help="with --check: also run jax.jit on data with one pixel moved by one ulp, to show how "
                             "far jax.jit's own losses drift from a change that small")
    args = parser.parse_args(argv)
    data = mnist(args.data_dir, num_train=args.num_train)
    history, params = train(chosen_jit(args.jit, jit), data, args.epochs)
    if args.check:
        import jax
        print("\nRunning jax.jit for comparison...")
        ref_history, ref_params = train(jax.jit, data, args.epochs, quiet=True)
        loss_rel = _largest_loss_difference(history, ref_history)
        param_abs = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                        zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(ref_params)))
        print(f"max relative loss difference vs jax.jit: {loss_rel:.3e}; max parameter difference: {param_abs:.3e}")
        if args.noise_floor:
            # Training amplifies any rounding difference: this is what one ulp in one input does to jax.jit itself.
            images = data[0].copy()
            i, j = np.argwhere((images > 0.3) & (images < 0.7))[0]
            images[i, j] = np.nextafter(images[i, j], np.float32(1))
            nudged, _ = train(jax.jit, (images, *data[1:]), args.epochs, quiet=True)
            floor = _largest_loss_difference(nudged, ref_history)
            print(f"jax.jit against itself with one pixel moved by one ulp: {floor:.3e} relative loss difference")
        return verdict(loss_rel <= 1e-5, "losses differ from jax.jit by more than 1e-5 relative")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
