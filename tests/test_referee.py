"""The referee of target="auto" (mnjit/referee.py): a compiled tier is kept when its results are as close to jax.jit's
as ort-cpu's are, and refused when it is further off; jax.jit's own executable is the reference.

Fake compiled tiers (TierPolicy.build) make the cases deterministic: one off by a little or a lot on a program
where ort-cpu matches jax.jit closely, and one that computes exactly what ort-cpu does on a chaotic program where
ort-cpu itself drifts far from jax.jit (sin and tanh differ in the last bits, and 60 steps of a chaotic map grow
that into whole units).
"""
from __future__ import annotations

import jax
import jax.extend.core as jc
import jax.numpy as jnp
import numpy as np
import pytest

from harness import assert_same, rand
from mnjit import mnjit, referee, tiering

TOL = (1e-5, 1e-5)


def _mlp(x, w):
    return jnp.tanh(x @ w).sum(axis=0) * 0.5


def _chaos(x):
    for _ in range(60):
        x = jnp.sin(3.0 * x) * 1.7 + jnp.tanh(x) * 0.9
    return x


class _Tier:
    """A compiled-tier builder: `run(jaxpr)` gives the function that computes the tier's outputs."""

    def __init__(self, run, name: str = "fake"):
        self.make, self.name, self.runs = run, name, 0

    def __call__(self, traced) -> tiering.CompiledTier:
        compute = self.make(traced.jaxpr)
        tier = self

        class Runner:
            def run(self, leaves):
                tier.runs += 1
                return list(compute(*leaves))

        return tiering.CompiledTier(self.name, Runner())


def _off_by(relative: float):
    """jax.jit's result, every float output off by `relative` of its largest magnitude."""
    def make(closed):
        run = jax.jit(jc.jaxpr_as_fun(closed))
        return lambda *leaves: [out + relative * jnp.abs(out).max() for out in run(*leaves)]
    return make


def _like_ort_cpu(closed):
    """What ort-cpu computes, by another mnjit function of the same jaxpr: drifts exactly as far as ort-cpu."""
    f = mnjit(jc.jaxpr_as_fun(closed))
    return lambda *leaves: f(*leaves)


def _auto(fun, build):
    return mnjit(fun, target="auto", tier_policy=tiering.TierPolicy(build=build, min_speedup=0))


@pytest.mark.parametrize("relative", [1.0, 1e-3])
def test_wrong_tier_is_refused(relative):
    """Off by its whole magnitude, or just past f32's tolerance (1e-4 relative), where ort-cpu is within 1e-6."""
    tier = _Tier(_off_by(relative))
    f = _auto(_mlp, tier)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    status = tiering.settle(f, x, w)
    assert status.decided and status.serving == "ort-cpu" and "disagreed with jax.jit" in status.reason, status
    assert "ort-cpu" in status.reason and tier.runs == 1  # compared once, never timed nor serving
    assert_same(f(x, w), jax.jit(_mlp)(x, w), TOL)


def test_tier_within_tolerance_is_kept():
    tier = _Tier(_off_by(1e-6))
    f = _auto(_mlp, tier)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    assert tiering.settle(f, x, w).serving == "fake"
    assert_same(f(x, w), jax.jit(_mlp)(x, w), (1e-4, 1e-4))


def test_tier_drifting_as_far_as_ort_cpu_is_kept():
    x = jnp.linspace(-1, 1, 64, dtype=jnp.float32)
    expected = jax.jit(_chaos)(x)
    drift = referee.error(mnjit(_chaos)(x), expected)
    assert drift > 100, drift  # ort-cpu itself is far beyond the tolerance: a fixed one would refuse the tier
    tier = _Tier(_like_ort_cpu)
    f = _auto(_chaos, tier)
    status = tiering.settle(f, x)
    assert status.serving == "fake", status
    runs = tier.runs
    assert_same(f(x), mnjit(_chaos)(x), (0, 0))  # the tier serves: ort-cpu's values, bit for bit
    assert tier.runs == runs + 1


def test_rule():
    """error() in units of the tolerance; verdict() against max(1, K x ort-cpu's error). Numbers from the
    held-out runs: the CFD step (ort-cpu 2.4e-7 from jax.jit, IREE 40x further, past 1e-5) and 100 FIRE steps
    (ort-cpu 7.1e-5 from jax.jit, a tier as far)."""
    reference = np.linspace(-1, 1, 101, dtype=np.float32)
    assert referee.error(reference, reference) == 0
    assert referee.error(reference + np.float32(5e-6), reference) == pytest.approx(0.5, rel=0.01)
    assert referee.verdict([reference + np.float32(1e-5 * 40)], [reference + np.float32(2.4e-7)], [reference])
    assert referee.verdict([reference + np.float32(7.1e-5)], [reference - np.float32(7.1e-5)], [reference]) is None
    assert referee.verdict([reference + np.float32(2.5e-4)], [reference + np.float32(7.1e-5)], [reference]) is None
    assert referee.verdict([reference + np.float32(5e-4)], [reference + np.float32(7.1e-5)], [reference])
    ints = np.arange(10)
    assert referee.verdict([ints + (ints == 3)], [ints], [ints])  # integers: exact unless ort-cpu differs too
    assert referee.verdict([ints + (ints == 3)], [ints + (ints == 4)], [ints]) is None
    nans = np.array([np.nan, 1.0])
    assert referee.error(nans, nans) == 0 and referee.error(np.array([0.0, 1.0]), nans) == np.inf
    assert referee.error(np.ones(3), np.ones(4)) == np.inf


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_implied_never_accepts_what_the_verdict_refuses(dtype):
    """referee.implied skips jax.jit's run: a candidate within IMPLIED of ort-cpu's tolerance must pass verdict()
    whatever jax.jit computed. Adversarial triples: ort-cpu at errors around 1/K from jax.jit (where the bound is
    tightest) and far beyond, the candidate pushed IMPLIED further the same way; with IMPLIED at 0.9 this fails."""
    dt = jnp.dtype(dtype)
    rtol, atol = referee.TOLERANCE[dtype]
    rng, skipped = np.random.default_rng(0), []
    for trial in range(300):
        jax_out = (rng.standard_normal(64) * 10.0 ** rng.uniform(-3, 3)).astype(dt)
        r = jax_out.astype(np.float64)
        scale = atol * max(1.0, float(np.abs(r).max()))
        ort_error = [0.0, 0.05, 0.2, 0.25, 0.3, 1.0, 3.0, 50.0][trial % 8]
        ort = (r + np.sign(rng.standard_normal(64)) * ort_error * (scale + rtol * np.abs(r))).astype(dt)
        o = ort.astype(np.float64)
        o_scale = atol * max(1.0, float(np.abs(o).max()))
        push = np.sign(o - r) + (o == r)  # away from jax.jit's value
        candidate = (o + push * referee.IMPLIED * 0.85 * (o_scale + rtol * np.abs(o))).astype(dt)
        if not referee.implied([candidate], [ort]):
            skipped.append(trial)
            continue  # rounding to the dtype may have carried it past IMPLIED
        assert referee.verdict([candidate], [ort], [jax_out]) is None, (trial, ort_error)
    assert len(skipped) < 150, len(skipped)  # most triples test the bound


def test_jax_jit_runs_only_where_ort_cpu_does_not_settle_it(monkeypatch):
    """A tier equal to ort-cpu (or within IMPLIED of it) is accepted without jax.jit's run; one further off is
    judged by it."""
    runs = []

    def counting(traced):
        executable = reference(traced)
        return lambda *leaves: runs.append(1) or executable(*leaves)

    reference = referee.reference
    monkeypatch.setattr(referee, "reference", counting)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    assert tiering.settle(_auto(_mlp, _Tier(_off_by(1e-6))), x, w).serving == "fake"
    assert runs == []
    assert tiering.settle(_auto(_mlp, _Tier(_off_by(1e-3))), x, w).serving == "ort-cpu"
    assert runs == [1]
