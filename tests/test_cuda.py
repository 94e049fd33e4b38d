"""ort-cuda on a GPU: jax GPU arrays in, GPU arrays out, compared with jax.jit. Skipped without a GPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mnjit import mnjit
from mnjit.device import TargetUnavailableError


def _gpu_target_available() -> bool:
    try:
        mnjit(lambda x: x, target="ort-cuda")
        return True
    except TargetUnavailableError:
        return False


pytestmark = pytest.mark.skipif(not _gpu_target_available(),
                                reason="ort-cuda needs a GPU, onnxruntime-gpu and jax's CUDA plugin (pip install "
                                       "'mnjit[cuda]')")

CASES = [
    ("mlp", lambda w, x: jax.nn.relu(x @ w).sum(axis=1), ((64, 32), (16, 64))),
    ("elementwise", lambda a, b: jnp.tanh(a) * b + 1, ((128,), (128,))),
    ("reduce", lambda a, b: (a * b).mean(axis=0), ((8, 9), (8, 9))),
]


@pytest.mark.parametrize("name, fun, shapes", CASES, ids=[c[0] for c in CASES])
def test_gpu_arrays_in_and_out(name, fun, shapes):
    gpu = jax.devices("gpu")[0]
    args = [jax.device_put(np.random.default_rng(i).standard_normal(s).astype(np.float32), gpu)
            for i, s in enumerate(shapes)]
    result = mnjit(fun, target="ort-cuda")(*args)
    assert result.devices() == {gpu}  # stayed on the GPU
    np.testing.assert_allclose(np.asarray(result), np.asarray(jax.jit(fun)(*args)), rtol=1e-4, atol=1e-5)
