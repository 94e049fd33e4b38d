"""mnjit / jax.jit ratios for the MNIST example, measured side by side in one run.

Prints steady-state time per call (median of interleaved rounds), the first call
(trace + translate/compile + run), and the per-call overhead on a tiny function.
A ratio below 1 means mnjit is faster.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.example_libraries import optimizers, stax
from jax.example_libraries.stax import Dense, LogSoftmax, Relu

from mnjit import mnjit
import mnjit as mnjit_package  # noqa: E402

mnjit_package.configure_cache(False)  # first calls measured cold: mnjit's persistent cache off (bench_warm_start.py: warm)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "samples"))


def build(batch_size: int = 128):
    init_random_params, predict = stax.serial(Dense(1024), Relu, Dense(1024), Relu, Dense(10), LogSoftmax)
    opt_init, opt_update, get_params = optimizers.momentum(0.001, mass=0.9)

    def loss(params, batch):
        inputs, targets = batch
        return -jnp.mean(jnp.sum(predict(params, inputs) * targets, axis=1))

    def update(i, opt_state, batch):
        return opt_update(i, jax.grad(loss)(get_params(opt_state), batch), opt_state)

    _, params = init_random_params(jax.random.PRNGKey(0), (-1, 784))
    rng = np.random.default_rng(0)
    batch = (rng.random((batch_size, 784), np.float32), np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch_size)])
    batch = jax.tree_util.tree_map(jnp.asarray, batch)
    return predict, update, params, opt_init(params), batch, get_params


def first_call(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def steady(fns: dict, args, rounds: int, calls: int) -> dict[str, float]:
    """Median seconds per call; the candidates alternate within each round to share the machine's noise."""
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                out = fn(*args)
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(s) for name, s in samples.items()}


def report(label: str, times: dict[str, float]) -> None:
    m, j = times["mnjit"], times["jax.jit"]
    print(f"{label:34s} mnjit {m * 1e3:9.3f} ms   jax.jit {j * 1e3:9.3f} ms   ratio {m / j:6.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    predict, update, params, opt_state, batch, _ = build()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; times are medians of {args.rounds} interleaved rounds")

    cases = [("MNIST predict (batch 128)", predict, (params, batch[0]), 50),
             ("MNIST update step (batch 128)", update, (0, opt_state, batch), 20)]
    for label, fn, fargs, calls in cases:
        candidates = {"mnjit": mnjit(fn), "jax.jit": jax.jit(fn)}
        report(label + ": first call", {n: first_call(f, *fargs) for n, f in candidates.items()})
        report(label + ": steady", steady(candidates, fargs, args.rounds, calls))

    tiny = lambda x: x + 1.0  # noqa: E731
    x = jnp.ones((4,), jnp.float32)
    candidates = {"mnjit": mnjit(tiny), "jax.jit": jax.jit(tiny)}
    for fn in candidates.values():
        fn(x)
    report("tiny x+1: per-call overhead", steady(candidates, (x,), args.rounds, 2000))


if __name__ == "__main__":
    main()
