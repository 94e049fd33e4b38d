"""The cost of host callbacks inside a loop: mnjit against jax.jit, side by side in one run.

Rows: a fori_loop with no callback (the loop's own cost), with equinox's error check whose condition never
holds (the callback sits in an If branch that is not taken: what diffrax and optimistix pay per step), and with
an io_callback called every iteration (a Python call per step). Times are per iteration, best of --rounds.

    python benchmarks/bench_callbacks.py [--steps 20000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # this checkout's mnjit

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import io_callback  # noqa: E402

from mnjit import mnjit  # noqa: E402


def plain(x, n):
    return jax.lax.fori_loop(0, n, lambda i, c: c * 0.999 + 1.0, x)


def error_check(x, n):
    def body(i, c):
        return eqx.error_if(c, c > 1e30, "diverged") * 0.999 + 1.0
    return jax.lax.fori_loop(0, n, body, x)


def called_each_step(x, n):
    def body(i, c):
        return io_callback(lambda v: v, jax.ShapeDtypeStruct(c.shape, c.dtype), c) * 0.999 + 1.0
    return jax.lax.fori_loop(0, n, body, x)


def per_step(fun, x, steps: int, rounds: int) -> float:
    fun(x, 10).block_until_ready()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fun(x, steps).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    x = jnp.ones(16, jnp.float32)
    print(f"load average {os.getloadavg()[0]:.2f}; jax {jax.__version__}; {args.steps} steps, best of {args.rounds}")
    print(f"{'loop body':<28}{'jax.jit us/step':>16}{'mnjit us/step':>16}{'ratio':>8}")
    for name, fun in (("no callback", plain), ("eqx.error_if (not raised)", error_check),
                      ("io_callback every step", called_each_step)):
        jit_us = per_step(jax.jit(fun), x, args.steps, args.rounds)
        mnjit_us = per_step(mnjit(fun), x, args.steps, args.rounds)
        np.testing.assert_allclose(np.asarray(mnjit(fun)(x, 100)), np.asarray(jax.jit(fun)(x, 100)), rtol=1e-5)
        print(f"{name:<28}{jit_us:>16.3f}{mnjit_us:>16.3f}{mnjit_us / jit_us:>8.1f}")


if __name__ == "__main__":
    main()
