"""The MNIST example's training step under mnjit agrees with jax.jit step by step."""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mnjit import mnjit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "samples"))
import mnist_train  # noqa: E402


def test_update_matches_jit_over_20_steps():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from bench_mnist import build

    predict, update, _, opt_state, _, get_params = build()
    images, labels, _, _ = mnist_train.mnist(None, num_train=20 * 32, num_test=10)
    loss = lambda p, x, y: -jnp.mean(jnp.sum(predict(p, x) * y, axis=1))  # noqa: E731
    ours, ref = mnjit(update), jax.jit(update)
    state_ours = state_ref = opt_state
    for i in range(20):
        batch = (images[i * 32:(i + 1) * 32], labels[i * 32:(i + 1) * 32])
        state_ours, state_ref = ours(i, state_ours, batch), ref(i, state_ref, batch)
    assert ours.translations == 1
    leaves_ours, leaves_ref = jax.tree_util.tree_leaves(state_ours), jax.tree_util.tree_leaves(state_ref)
    for a, b in zip(leaves_ours, leaves_ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    params_ours, params_ref = get_params(state_ours), get_params(state_ref)
    l_ours, l_ref = float(loss(params_ours, images, labels)), float(loss(params_ref, images, labels))
    assert abs(l_ours - l_ref) / abs(l_ref) < 1e-5


def test_sample_trains_and_agrees_with_jit(capsys):
    assert mnist_train.main(["--epochs", "1", "--num-train", "1024", "--check"]) == 0
    out = capsys.readouterr().out
    assert "OK: matches jax.jit" in out and "Epoch 0" in out


def test_idx_reader_rejects_bad_files(tmp_path):
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(b"\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x1c\x00\x00\x00\x1c\x01\x02")  # truncated
    try:
        mnist_train._read_idx(str(bad))
    except ValueError as e:
        assert "truncated" in str(e)
    else:
        raise AssertionError("truncated idx file accepted")
