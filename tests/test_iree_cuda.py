"""The iree-cuda target on a GPU: jax GPU arrays in and out through DLPack, the op-table subset and the models
of test_iree.py compared with jax.jit on the same GPU. Skipped without a GPU, jax's CUDA plugin and IREE
(benchmarks/gpu_check.sh runs it on a lent GPU machine).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("iree.compiler")
pytest.importorskip("iree.runtime")

import test_iree  # noqa: E402
from harness import Case, assert_same, rand  # noqa: E402
from mnjit import mnjit  # noqa: E402
from mnjit.device import TargetUnavailableError  # noqa: E402
from mnjit.iree_runner import IreeRunner, cuda_backend  # noqa: E402

TARGET = "iree-cuda"
# jax.jit's f32 matrix products on an H100 round their inputs to TF32 (jax's default precision), IREE's do not:
# 3e-4 apart on a 64-term sum (measured).
_TF32 = (1e-3, 1e-3)


def _available() -> bool:
    try:
        mnjit(lambda x: x, target=TARGET)
        return True
    except TargetUnavailableError:
        return False


pytestmark = pytest.mark.skipif(not _available(), reason="iree-cuda needs a GPU that jax sees (jax's CUDA plugin) "
                                                         "and IREE (pip install 'mnjit[iree]')")


@pytest.mark.parametrize("case", test_iree.TABLE, ids=lambda c: c.name)
def test_table(case: Case) -> None:
    """Each case matches jax.jit on the GPU, or is refused by name (the iree-cpu table), or IREE fails clearly."""
    test_iree._matches_or_refused(case, strict=False, target=TARGET)


def test_gpu_arrays_in_and_out_without_copies() -> None:
    """jax GPU arrays cross into IREE and back by DLPack (the runner records why if either direction copies)."""
    gpu = jax.devices("gpu")[0]
    fun = lambda w, x: (jax.nn.relu(x @ w).sum(axis=1), jnp.tanh(x) * 2 + 1)  # noqa: E731
    args = [jax.device_put(rand(s, seed=i), gpu) for i, s in enumerate(((64, 32), (16, 64)))]
    expected = jax.jit(fun)(*args)
    result = mnjit(fun, target=TARGET)(*args)
    assert {d for r in result for d in r.devices()} == {gpu}
    assert_same(result, expected, _TF32)
    model = mnjit(fun, target=TARGET).lower(*args).onnx_model
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    runner = IreeRunner(model.SerializeToString(), avals, [jax.ShapeDtypeStruct(e.shape, e.dtype) for e in expected],
                        cuda_backend(gpu))
    assert_same(tuple(runner.run(args)), expected, _TF32)
    assert runner.copy_reason == {}


@pytest.mark.parametrize("x64", [False, True])
def test_floats_in_both_x64_modes(x64) -> None:
    fun = lambda a: (jnp.exp(a) * a + jnp.sqrt(jnp.abs(a)), (a @ a.T).sum(), 1.0 + a * 2.0**-40)  # noqa: E731
    with jax.enable_x64(x64):
        x = rand((6, 6), np.float64 if x64 else np.float32)
        assert_same(mnjit(fun, target=TARGET)(x), jax.jit(fun)(x), (1e-12, 1e-12) if x64 else (2e-5, 2e-5))


def test_fori_loop_and_fallback() -> None:
    x = rand((4, 3))
    assert_same(mnjit(test_iree._fori, target=TARGET)(x), jax.jit(test_iree._fori)(x), (1e-5, 1e-5))
    # A while loop is refused by IREE's importer: with fallback=True it runs on the next target of the chain.
    g = mnjit(test_iree._while, target=TARGET, fallback=True)
    assert_same(g(x), jax.jit(test_iree._while)(x), (1e-5, 1e-5))


def test_models() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from bench_models import cnn, mlp, transformer

    for model in (mlp(batch=8), cnn(batch=4), transformer(batch=1, seq=16, d=32, f=64)):
        expected = jax.jit(model.fun)(*model.args)
        assert_same(mnjit(model.fun, target=TARGET)(*model.args), expected, (2e-3, 2e-3), model.name)
