"""target="auto" on signatures whose calls take over slow_call_s (mnjit/tiering.py): fewer, longer timing calls,
and a comparison that runs as soon as the build is ready, on a slow call held from the build's time. Fake tiers
(tests/fake_tiers.py) make the timings deterministic; results are checked against jax.jit.
"""
from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import pytest

from fake_tiers import TOL, Fake, Variants, auto, mlp
from harness import assert_same, rand
from mnjit import tiering


def test_slow_calls_are_timed_twice_the_faster_counting():
    """Calls over slow_call_s: one timed call per tier let an outlier decide (the CFD rollout's local-task variant,
    1.4 s once and 0.53 s call after call, lost to a 0.75 s variant); two each, the faster counting."""
    outlier_first = Fake(delay=lambda run: 0.4 if run == 2 else 0.06)  # run 1 is the comparison
    steady = Fake(delay=0.12)
    # clearly_slower out of reach: ort-cpu's fast calls would otherwise decide at once (clear_winner)
    f = auto(mlp, Variants(outlier=outlier_first, steady=steady), min_speedup=0, slow_call_s=0.03,
              clearly_slower=1e9)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    status = tiering.settle(f, x, w)
    assert status.decided and "on outlier" in status.reason and "best of 2" in status.reason, status
    assert_same(f(x, w), jax.jit(mlp)(x, w), TOL)


def test_slow_calls_past_decision_s_decide_on_the_comparison():
    """Calls over slow_call_s, past decision_s once compared: the comparison's runs are the timed calls (one
    per tier), and the decision comes with it, not after more slow calls of each tier (FIRE's loop took 13 s)."""
    fast, slow = Fake(delay=0.06), Fake(delay=0.3)
    f = auto(mlp, Variants(fast=fast, slow=slow), min_speedup=0, slow_call_s=0.03, decision_s=0.1)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    status = tiering.settle(f, x, w)
    assert status.decided and "on fast" in status.reason and "best of 1 and 1 calls" in status.reason, status
    assert (fast.runs, slow.runs) == (1, 1)  # the comparison only
    assert status.decision_calls <= 2, status
    assert_same(f(x, w), jax.jit(mlp)(x, w), TOL)


def _loop(x, w, n):
    """A while loop (its trip count is an argument): the Python path runs it on ort-cpu, timed. A contraction:
    rounding differences shrink from step to step."""
    return jax.lax.fori_loop(0, n, lambda i, c: jnp.cos(c @ w), x)


@pytest.mark.parametrize("case", ["ort-cpu clearly faster", "wrong tier", "close"])
def test_slow_call_while_compiling_is_compared_at_once(case):
    """A call over slow_call_s made while the tier builds is kept, inputs and outputs: the build, once ready,
    compares on it at once (FIRE's 100-step loop waited 1.6 s for a next call to start and 1.6 s for it to run).
    A tier clearly slower or faster is decided there, with no call after the build; a wrong one is dropped; a
    close one is timed call by call."""
    gate = threading.Event()
    fake = {"ort-cpu clearly faster": Fake(gate=gate, delay=0.4), "wrong tier": Fake(gate=gate, delta=1.0),
            "close": Fake(gate=gate)}[case]
    # "close": no tier can be clearly faster (clearly_slower out of reach), whatever the machine's timings
    f = auto(_loop, fake, **({"slow_call_s": 0.0, "clearly_slower": 1e9} if case == "close" else {"slow_call_s": 0.02}))
    x, w = rand((128, 128)), rand((128, 128), seed=1) * 0.01
    n = jnp.int32(1000 if case != "close" else 20)
    expected = jax.jit(_loop)(x, w, n)
    try:
        for _ in range(2):
            assert_same(f(x, w, n), expected, TOL)
    finally:
        gate.set()
    assert f.wait_for_tiering(60)
    status = f.tier_status(x, w, n)
    if case == "close":
        assert not status.decided and "timing" in status.reason, status
        status = tiering.settle(f, x, w, n)
        assert status.decided and status.decision_calls > 0 and fake.runs > 1, (status, fake.runs)
    else:
        assert status.decided and status.serving == "ort-cpu" and status.decision_calls == 0, status
        assert fake.runs == 1, fake.runs  # the comparison only, on the held call
        assert ("disagreed" if case == "wrong tier" else "best of 1 and 1 calls") in status.reason, status
    assert_same(f(x, w, n), expected, TOL)


def test_held_slow_call_deleted_meanwhile_compares_the_next_call():
    """The held call's arrays may be donated to another jax.jit or deleted while the tier builds: the next call is
    compared instead, and the tier is not dropped for an error of the caller's making."""
    gate = threading.Event()
    fake = Fake(gate=gate)
    f = auto(_loop, fake, slow_call_s=0.0, min_speedup=0)
    x, w = rand((128, 128)), rand((128, 128), seed=1) * 0.01
    n = jnp.int32(20)
    expected = jax.jit(_loop)(x, w, n)
    try:
        f(x, w, n).delete()
    finally:
        gate.set()
    assert f.wait_for_tiering(60)
    assert "compares" in str(f.tier_status(x, w, n)) and fake.runs == 0
    status = tiering.settle(f, x, w, n)
    assert status.decided and status.serving == "fake", status
    assert_same(f(x, w, n), expected, TOL)
