"""Fake compiled tiers for target="auto"'s tests (tests/test_auto_tier*.py): jax.jit of the signature's jaxpr as
a TierPolicy.build, optionally off by `delta`, slowed by `delay` or held at a `gate`, which makes the slow
compiler, the disagreement and eviction during a compile deterministic.
"""
from __future__ import annotations

import dataclasses
import threading
import time

import jax
import jax.extend.core as jc
import jax.numpy as jnp

from mnjit import mnjit, tiering

TOL = (1e-5, 1e-5)  # ort-cpu and the compiled tiers against jax.jit, on whole small programs


def mlp(x, w):
    return jnp.tanh(x @ w).sum(axis=0) * 0.5


class Fake:
    """A compiled-tier builder: jax.jit of the signature's jaxpr, `delta` added to its float outputs, `delay`
    seconds per call, built only once `gate` opens (or failing with `fail`); it counts the calls its tiers serve."""

    def __init__(self, delta: float = 0.0, gate: threading.Event | None = None, fail: str | None = None,
                 delay: float = 0.0):
        self.delta, self.gate, self.fail, self.delay = delta, gate, fail, delay
        self.runs = 0
        self.built = 0
        self.broken = False  # its runs raise

    def __call__(self, traced) -> tiering.CompiledTier:
        if self.gate is not None:
            assert self.gate.wait(60), "the test never opened the gate"
        if self.fail:
            raise RuntimeError(self.fail)
        run = jax.jit(jc.jaxpr_as_fun(traced.jaxpr))
        # Compiled at build, as a real tier is: its first run (the comparison, which may be timed) runs warm.
        run.lower(*traced.jaxpr.in_avals).compile()
        self.built += 1
        fake = self

        class Runner:
            def run(self, leaves):
                fake.runs += 1
                if fake.broken:
                    raise RuntimeError("the device is gone")
                time.sleep(fake.delay(fake.runs) if callable(fake.delay) else fake.delay)
                return [out + fake.delta if jnp.issubdtype(out.dtype, jnp.floating) else out
                        for out in run(*leaves)]

        return tiering.CompiledTier("fake", Runner())


class Variants:
    """A builder giving variants of one compiled tier: one per Fake, named by its keyword."""

    def __init__(self, **fakes: Fake):
        self.fakes = fakes

    def __call__(self, traced) -> list[tiering.CompiledTier]:
        return [dataclasses.replace(fake(traced), variant=name) for name, fake in self.fakes.items()]


def auto(fun, build=None, **policy):
    return mnjit(fun, target="auto", tier_policy=tiering.TierPolicy(build=build, **policy))
