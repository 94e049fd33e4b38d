"""target="auto" (mnjit/tiering.py): ort-cpu serves at once while a compiled tier is built in the background;
the compiled tier is compared on a real call and kept only where it agrees and is faster.

Results are checked against jax.jit before and after the switch. Fake compiled tiers (tests/fake_tiers.py) make
the slow compiler, the disagreement and eviction during a compile deterministic; the IREE cases are skipped
where IREE is not installed. Signatures with slow calls: tests/test_auto_tier_slow.py.
"""
from __future__ import annotations

import importlib.util
import logging
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fake_tiers import TOL, Fake, Variants, auto, mlp
from harness import assert_same, rand
from mnjit import iree_tier, mnjit, tiering

needs_iree = pytest.mark.skipif(importlib.util.find_spec("iree") is None, reason="IREE is not installed")
def test_options_are_checked():
    with pytest.raises(ValueError, match="target='auto'"):
        mnjit(mlp, tier_policy=tiering.TierPolicy())
    with pytest.raises(ValueError, match="trials"):
        tiering.TierPolicy(trials=0)
    assert mnjit(mlp).tier_status(rand((4, 4)), rand((4, 4))) is None


def test_first_call_does_not_wait_for_the_compiler():
    gate = threading.Event()
    fake = Fake(gate=gate)
    f = auto(mlp, fake, min_speedup=0)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    expected = jax.jit(mlp)(x, w)
    try:
        assert_same(f(x, w), expected, TOL)  # returns while the builder is held at the gate
        for _ in range(3):
            assert_same(f(x, w), expected, TOL)
        status = f.tier_status(x, w)
        assert not status.decided and "pending" in str(status) and status.serving == "ort-cpu", status
        assert "pending" in f.lower(x, w).report().splitlines()[0]
        assert not f.wait_for_tiering(0.05)  # the build is still under way: no call waited for it
    finally:
        gate.set()
    assert f.wait_for_tiering(60)
    assert "compares" in str(f.tier_status(x, w))
    status = tiering.settle(f, x, w)
    assert status.decided and status.serving == "fake", status
    runs = fake.runs
    assert_same(f(x, w), expected, TOL)
    assert fake.runs == runs + 1  # the compiled tier serves now


def test_disagreeing_tier_is_dropped(caplog):
    fake = Fake(delta=1.0)
    f = auto(mlp, fake, min_speedup=0)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    expected = jax.jit(mlp)(x, w)
    with caplog.at_level(logging.INFO, logger="mnjit"):
        assert_same(f(x, w), expected, TOL)
        assert f.wait_for_tiering(60)
        assert_same(f(x, w), expected, TOL)  # the comparison call: the caller gets ort-cpu's result
        assert f.wait_for_tiering(60)
    status = f.tier_status(x, w)
    assert status.decided and status.serving == "ort-cpu" and "disagreed" in status.reason, status
    assert any(r.name == "mnjit" and r.levelno == logging.WARNING and "disagreed" in r.getMessage()
               for r in caplog.records)
    runs = fake.runs
    for _ in range(3):
        assert_same(f(x, w), expected, TOL)
    assert fake.runs == runs == 1  # only the comparison ran it
    assert "disagreed" in f.lower(x, w).report().splitlines()[0]


def test_slower_tier_is_not_kept():
    fake = Fake(delay=0.02)
    f = auto(mlp, fake)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    status = tiering.settle(f, x, w)
    assert status.decided and status.serving == "ort-cpu" and "slower" in status.reason, status
    # The comparison, then one block of each tier (a warm-up and two timed calls): the fake, clearly slower (over
    # 2x), leaves the turns and ort-cpu is decided at once.
    assert fake.runs == 1 + 3, fake.runs
    assert status.decision_calls == 1 + 3 + 3 and "medians of 2 and 2 calls" in status.reason, status
    runs = fake.runs
    assert_same(f(x, w), jax.jit(mlp)(x, w), TOL)
    assert fake.runs == runs


@pytest.mark.parametrize("limit", ["calls", "seconds"])
def test_decision_within_limits(limit):
    """Once the build is ready, the decision takes at most decision_calls calls or decision_s seconds (more trials
    asked for than fit in either), on the calls timed so far."""
    fake = Fake(delay=0.01)
    policy = {"trials": 50, "min_speedup": 0, "clearly_slower": 1e9}  # no tier leaves the turns
    policy.update({"decision_calls": 12} if limit == "calls" else {"decision_s": 0.3, "decision_calls": 1000})
    f = auto(mlp, fake, **policy)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    status = tiering.settle(f, x, w)
    assert status.decided and status.serving == "fake", status
    if limit == "calls":
        assert status.decision_calls == 12, status
    else:
        # Decided once a next call (10 ms of sleep) would pass the limit, or by the call under way.
        assert 0.25 <= status.decision_s < 0.3 + 0.2, status
    assert_same(f(x, w), jax.jit(mlp)(x, w), TOL)


def test_fastest_variant_serves():
    slow, fast = Fake(delay=0.01), Fake()
    f = auto(mlp, Variants(slow=slow, fast=fast), min_speedup=0)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    status = tiering.settle(f, x, w)
    assert status.decided and status.serving == "fake" and "on fast" in status.reason, status
    assert "fake (slow)" in status.reason  # the other variant's time is reported beside
    assert slow.runs >= 1 + 3 and fast.runs >= 1 + 3  # each compared once, then timed
    runs = slow.runs, fast.runs
    for _ in range(3):
        assert_same(f(x, w), jax.jit(mlp)(x, w), TOL)
    assert (slow.runs, fast.runs) == (runs[0], runs[1] + 3)  # only the fastest serves


def test_disagreeing_variant_is_dropped_the_other_serves(caplog):
    bad, good = Fake(delta=1.0), Fake(delay=0.002)
    f = auto(mlp, Variants(bad=bad, good=good), min_speedup=0)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    with caplog.at_level(logging.INFO, logger="mnjit"):
        status = tiering.settle(f, x, w)
    assert status.decided and status.serving == "fake", status
    assert bad.runs == 1  # the comparison only: never timed, never serving
    assert any(r.levelno == logging.WARNING and "fake (bad) disagreed" in r.getMessage() for r in caplog.records)
    assert_same(f(x, w), jax.jit(mlp)(x, w), TOL)


def test_every_variant_disagreeing_stays_on_ort_cpu():
    f = auto(mlp, Variants(one=Fake(delta=1.0), two=Fake(delta=2.0)), min_speedup=0)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    status = tiering.settle(f, x, w)
    assert status.decided and status.serving == "ort-cpu" and "fake (one) disagreed" in status.reason, status


@pytest.mark.parametrize("when", ["comparison", "serving"])
def test_tier_failing_at_run_time_is_dropped(when):
    fake = Fake()
    f = auto(mlp, fake, min_speedup=0)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    expected = jax.jit(mlp)(x, w)
    if when == "serving":
        assert tiering.settle(f, x, w).serving == "fake"
    else:
        assert_same(f(x, w), expected, TOL)
        assert f.wait_for_tiering(60)  # built: the next call is compared
    fake.broken = True
    for _ in range(3):
        assert_same(f(x, w), expected, TOL)  # the caller never sees the compiled tier's error
    assert f.wait_for_tiering(60)
    status = f.tier_status(x, w)
    assert status.decided and status.serving == "ort-cpu" and "the device is gone" in status.reason, status


def test_failing_build_stays_on_ort_cpu():
    f = auto(mlp, Fake(fail="no kernel for this"))
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    assert_same(f(x, w), jax.jit(mlp)(x, w), TOL)
    assert f.wait_for_tiering(60)
    status = f.tier_status(x, w)
    assert status.decided and status.serving == "ort-cpu" and "no kernel for this" in status.reason, status


def test_side_effects_stay_on_ort_cpu(capsys):
    def noisy(x):
        jax.debug.print("sum {s}", s=x.sum())
        return x * 2

    fake = Fake()
    f = auto(noisy, fake)
    x = np.arange(3, dtype=np.float32)
    assert_same(f(x), jax.jit(noisy)(x), TOL)
    assert_same(f(x), jax.jit(noisy)(x), TOL)
    status = f.tier_status(x)
    assert status.decided and "side effects" in status.reason and fake.built == 0, status
    assert capsys.readouterr().out.count("sum 3.0") == 4  # twice each from mnjit and jax.jit, never doubled


@pytest.mark.parametrize("evict", ["max_cache_size", "clear_cache"])
def test_eviction_during_compile(evict):
    gate = threading.Event()
    fake = Fake(gate=gate)
    options = {"max_cache_size": 1} if evict == "max_cache_size" else {}
    f = mnjit(mlp, target="auto", tier_policy=tiering.TierPolicy(build=fake, min_speedup=0), **options)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    x2 = rand((4, 8), seed=2)
    try:
        assert_same(f(x, w), jax.jit(mlp)(x, w), TOL)
        if evict == "clear_cache":
            f.clear_cache()
        else:
            assert_same(f(x2, w), jax.jit(mlp)(x2, w), TOL)  # the first signature leaves the cache
        assert f.tier_status(x, w).reason.startswith("not called")
    finally:
        gate.set()
    assert f.wait_for_tiering(60)
    assert fake.runs == 0  # the evicted signature's tier was dropped, never run
    assert f._tiers.active == (0 if evict == "clear_cache" else 1)  # only the live signature counts
    status = tiering.settle(f, x, w)  # the signature compiles again and settles
    assert status.serving == "fake", status
    assert_same(f(x, w), jax.jit(mlp)(x, w), TOL)


def test_threads_call_through_every_phase():
    gate = threading.Event()
    fake = Fake(gate=gate)
    f = auto(mlp, fake, min_speedup=0)
    w = rand((8, 8), seed=9)
    inputs = [rand((16, 8), seed=s) for s in range(6)]
    expected = [jax.jit(mlp)(x, w) for x in inputs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(40):
                assert_same(f(inputs[i], w), expected[i], TOL)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in workers:
        t.start()
    time.sleep(0.05)
    gate.set()  # built while the threads call: comparison, timing and the switch happen under them
    for t in workers:
        t.join()
    assert not errors, errors[0]
    status = tiering.settle(f, inputs[0], w)
    assert status.serving == "fake", status
    assert f.translations == 1


def test_transformations():
    f = auto(mlp, Fake(), min_speedup=0)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    for settled in (False, True):
        if settled:
            assert tiering.settle(f, x, w).serving == "fake"
        loss = lambda x, w, g: g(x, w).sum()  # noqa: E731
        assert_same(jax.grad(loss)(x, w, f), jax.grad(loss)(x, w, mlp), TOL)
        assert_same(jax.vmap(f, (0, None))(jnp.stack([x, x + 1]), w),
                    jax.vmap(mlp, (0, None))(jnp.stack([x, x + 1]), w), TOL)
        assert_same(jax.jit(f)(x, w), jax.jit(mlp)(x, w), TOL)


@needs_iree
def test_iree_tier_matches_jax_before_and_after_the_switch():
    f = auto(mlp, min_speedup=0)  # the real iree-cpu tier, kept whatever its speed
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    assert_same(f(x, w), jax.jit(mlp)(x, w), TOL)
    status = tiering.settle(f, x, w)
    assert status.decided and status.serving == "iree-cpu", status
    # A model IREE runs whole is timed on both of IREE's CPU drivers; the reason names the one kept.
    assert "on IREE's local-" in status.reason and "iree-cpu (IREE's local-" in status.reason, status
    assert f.lower(x, w).report().startswith("auto: iree-cpu")
    x3 = rand((16, 8), seed=3)  # new values, same signature: served by IREE
    assert_same(f(x3, w), jax.jit(mlp)(x3, w), TOL)
    with jax.enable_x64(True):  # the worker compiles and compares under the signature's x64 setting
        x64, w64 = rand((16, 8), np.float64), rand((8, 8), np.float64, seed=1)
        status = tiering.settle(f, x64, w64)
        assert status.serving == "iree-cpu", status
        assert_same(f(x64, w64), jax.jit(mlp)(x64, w64), (1e-12, 1e-12))


@needs_iree
def test_iree_variants_share_the_other_partitions_runners():
    """Both drivers' variants of a partitioned plan: each compiles its IREE part, one ort-cpu session serves both."""
    from mnjit import device

    def fun(x):  # a while loop without a trip count runs on ort-cpu, the rest on IREE
        y = jax.lax.while_loop(lambda y: jnp.abs(y).sum() < 1e3, lambda y: y * 2, x)
        return jnp.tanh(y @ y.T) * 0.5

    made = []

    def make_runner(target, model, in_avals, out_avals, iree_driver=None):
        made.append((target.runtime, iree_driver))
        return device.make_runner(target, model, in_avals, out_avals, iree_driver=iree_driver)

    x = rand((8, 8))
    variants = iree_tier.iree_tier(jax.jit(fun).trace(x), opset=21, name="fun", make_runner=make_runner)
    assert [v.variant for v in variants] == ["IREE's local-task driver", "IREE's local-sync driver"]
    assert all("partitions:" in v.detail for v in variants), variants
    assert made.count(("onnxruntime", None)) == 1, made
    assert ("iree", "local-task") in made and ("iree", "local-sync") in made, made
    for v in variants:
        assert_same(v.runner.run([x]), jax.tree_util.tree_leaves(jax.jit(fun)(x)), TOL, v.variant)
    # A decision read from the cache builds its variant only (`only`, the label it stored).
    made.clear()
    sync, = iree_tier.iree_tier(jax.jit(fun).trace(x), opset=21, name="fun", make_runner=make_runner,
                                only=variants[1].label)
    assert sync.label == variants[1].label and made == [("onnxruntime", None), ("iree", "local-sync")], made
    assert_same(sync.runner.run([x]), jax.tree_util.tree_leaves(jax.jit(fun)(x)), TOL, sync.variant)


@needs_iree
def test_threads_on_the_sync_driver():
    """IREE's local-sync driver runs on each calling thread: concurrent calls keep their own answers."""
    from mnjit import device

    def sync_only(traced):
        variants = iree_tier.iree_tier(traced, opset=21, name="mlp", make_runner=device.make_runner)
        return [v for v in variants if "local-sync" in v.variant]

    f = auto(mlp, sync_only, min_speedup=0)
    w = rand((8, 8), seed=9)
    inputs = [rand((64, 8), seed=s) for s in range(6)]
    assert "local-sync" in tiering.settle(f, inputs[0], w).reason
    results: dict[int, list] = {}

    def work(i: int) -> None:
        results[i] = [f(inputs[i], w) for _ in range(20)]

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    for i, x in enumerate(inputs):
        for result in results[i]:
            assert_same(result, jax.jit(mlp)(x, w), TOL)


@needs_iree
def test_iree_refusing_everything_stays_on_ort_cpu():
    def doubling(x):  # a while loop without a trip count: IREE refuses it, and it is the whole program
        return jax.lax.while_loop(lambda y: jnp.abs(y).sum() < 1e3, lambda y: y * 2, x)

    f = mnjit(doubling, target="auto")
    x = rand((8,))
    assert_same(f(x), jax.jit(doubling)(x), TOL)
    assert f.wait_for_tiering(120)
    status = f.tier_status(x)
    assert status.decided and status.serving == "ort-cpu" and "runs none of it" in status.reason, status
    assert_same(f(x), jax.jit(doubling)(x), TOL)
