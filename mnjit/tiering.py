"""Tiered execution, `mnjit(f, target="auto")`: ort-cpu serves at once, iree-cpu takes over where it is faster.

Per signature (docs/runtime.md, Tiered execution):
1. The first calls run on ort-cpu exactly as with `target="ort-cpu"` (its fast path included), and the
   signature's compiled tier is queued for the background worker: the jaxpr planned for iree-cpu with
   partitioned execution (what IREE refuses, while loops for one, runs on ort-cpu) and compiled.
2. Once it is built, the next call is served by ort-cpu as before, and the worker runs the compiled tier, and
   jax.jit's executable of the jaxpr as the referee, on that call's inputs: the compiled tier is kept when its
   results are as close to jax.jit's as ort-cpu's are (mnjit/referee.py). A tier further off, or any error in
   building or running it, is dropped for that signature, with the reason logged (logger "mnjit") and shown
   by `lower(...).report()`. A signature whose calls take over `slow_call_s` on ort-cpu is compared at once
   instead, on the latest such call made while the build ran (its inputs and outputs held until then).
3. Then real calls take turns on the tiers, each timed to completion, in blocks of a warm-up call and two timed
   ones (one timed call, the faster of two per tier counting, once a call takes over `slow_call_s`; then the
   comparison's runs are each tier's first timed call, and decide at once when `decision_s` has passed or one
   tier is `clearly_slower` times faster than the others). A tier clearly slower than the best
   (`clearly_slower`) leaves the turns at once. The decision comes when each
   tier has `trials` timed calls, or once `decision_calls` calls or `decision_s` seconds have passed since
   the build was ready (each tier timed once at least): the compiled tier keeps the signature if
   ort-cpu's median (or best) is over `min_speedup` (1.1) times its own; otherwise ort-cpu does, its fast path
   included.
4. Decisions (and refusals by the compiler or the referee) are stored in mnjit's persistent cache
   (mnjit/persist.py): a later process's first call of the signature runs on the decided tier, its modules
   read from the cache.

No call waits for the compiler: the worker is one daemon thread per process (mnjit/background.py), fed by a queue of
at most `MAX_JOBS` jobs (a signature that finds it full stays on ort-cpu, and says so). A signature that
leaves the cache (max_cache_size, clear_cache) is cancelled: a job not started is skipped, a compile under
way finishes and its result is dropped. Functions with side effects (io_callback, jax.debug.print) stay on
ort-cpu: comparing would run their effects twice.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from mnjit import background, persist, referee, tier_trials
# The state's types are this module's public names too (mnjit.TierPolicy, tiering.CompiledTier).
from mnjit.tier_state import (BASE, ROUTED, CompiledTier, Phase, SignatureTier, TierPolicy, TierStatus, failed_run,
                              settle)

__all__ = ["BASE", "MAX_JOBS", "CompiledTier", "Phase", "SignatureTier", "TierPolicy", "TierStatus", "Tiering",
           "settle"]
logger = logging.getLogger("mnjit")
MAX_JOBS = background.MAX_JOBS


def _deleted(arrays: Sequence) -> bool:
    return any(isinstance(a, jax.Array) and a.is_deleted() for a in arrays)


def _held(leaves: Sequence) -> list:
    """A call's inputs as the worker compares on them later: numpy inputs may be changed in place after the call
    returns, so they are copied (jax arrays are immutable)."""
    return [np.array(leaf) if isinstance(leaf, np.ndarray) else leaf for leaf in leaves]


class Tiering:
    """One auto function's tiering: starts each signature's background build, routes calls, judges the
    tiers. `active` counts the signatures whose calls must take the Python path."""

    def __init__(self, policy: TierPolicy, build: Callable[[Any], CompiledTier] | None,
                 unavailable: str | None = None):
        self.policy = policy
        self._build = policy.build or build
        self._unavailable = unavailable if policy.build is None else None
        self._name = "iree-cpu" if policy.build is None else "the compiled tier"  # until one is built
        # Only the default builder's decisions are stored: a test's builder is another tier under the same name.
        self._persist = policy.build is None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._jobs = 0  # this function's jobs queued or running
        self._deferred = threading.local()  # signatures whose build waits for the call that made them
        self.active = 0

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self, traced, x64: bool, translation_key: str | None = None) -> SignatureTier:
        """A new signature's state. Its compiled tier is built on the worker, never on this thread, and only
        once the call that made the signature is done (`release`): the build would slow that first call. A
        decision stored by an earlier process (under the signature's `translation_key`) is taken at once
        instead, its compiled tier loaded here from the persistent cache."""
        sig = SignatureTier(traced, x64)
        if self._unavailable:
            sig.phase, sig.reason = Phase.BASE, self._unavailable
            return sig
        if traced.jaxpr.effects:
            sig.phase, sig.reason = Phase.BASE, "the function has side effects (comparing would run them twice)"
            return sig
        if self._persist and translation_key is not None:
            sig.decision_key = persist.decision_key(translation_key, self.policy.fingerprint())
            if self._recall(sig):
                return sig
        self._deferred.__dict__.setdefault("signatures", []).append(sig)
        return sig

    def _recall(self, sig: SignatureTier) -> bool:
        """Takes the stored decision of `sig`, if any; False where there is none or its tier cannot be loaded
        from the cache alone (then the signature is built and judged as a new one)."""
        decision = persist.load_decision(sig.decision_key)
        if decision is None:
            return False
        note = " [decided in an earlier process: mnjit's persistent cache]"
        if decision["serving"] == BASE:
            sig.phase, sig.reason, sig.traced, sig.from_cache = Phase.BASE, decision.get("reason", "") + note, None, True
            return True
        try:
            with persist.cached_only():  # a module missing from the cache would compile here, on the caller
                built = self._build(sig.traced, only=decision.get("variant"))  # the default builder's option
        except Exception:
            return False
        candidates = (built,) if isinstance(built, CompiledTier) else tuple(built)
        chosen = next((c for c in candidates if c.label == decision.get("variant")), None)
        if chosen is None:
            return False
        with self._lock:
            sig.candidates, sig.compiled, sig.from_cache, sig.traced = (chosen,), chosen, True, None
            self._settle(sig, Phase.COMPILED, decision.get("reason", "") + note)
        return True

    def _remember(self, sig: SignatureTier, serving: str, variant: str = "") -> None:
        """Stores a final decision taken here (by timing, the compiler or the referee) for later processes."""
        if sig.decision_key is not None and not sig.from_cache:
            persist.store_decision(sig.decision_key, {"serving": serving, "variant": variant, "reason": sig.reason})

    def release(self, result: Any) -> None:
        """After a call on this thread: queues the builds it deferred, the worker waiting first for `result`
        (jax dispatches asynchronously: the call's own computation may still be running)."""
        deferred = self._deferred.__dict__.get("signatures")
        if not deferred:
            return
        self._deferred.signatures = []
        for sig in deferred:
            if not self._submit(sig, self._compile, [result]):
                with self._lock:
                    self._settle(sig, Phase.BASE, f"the background queue was full ({MAX_JOBS} jobs)")

    def cancel(self, sig: SignatureTier) -> None:
        """The signature left the cache: its jobs are skipped and its compiled tier released."""
        with self._lock:
            sig.cancelled = True
            self._settle(sig, Phase.BASE, "evicted from the cache")

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until this function has no background job queued or running (False: timed out)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._jobs == 0, timeout)

    def routed(self, sig: SignatureTier) -> bool:
        """Whether the signature's calls must take the Python path (a compiled tier serves or is being judged)."""
        return sig.phase in ROUTED

    def _submit(self, sig: SignatureTier, step: Callable[..., None], *args) -> bool:
        def job() -> None:
            try:
                if not sig.cancelled:
                    with jax.enable_x64(sig.x64):  # jax's config is per thread: the signature's, not the worker's
                        step(sig, *args)
            except Exception as e:  # never reaches a call: the compiled tier is dropped instead
                self._drop(sig, f"{type(e).__name__}: {e}")
            finally:
                with self._idle:
                    self._jobs -= 1
                    self._idle.notify_all()

        with self._lock:
            self._jobs += 1
        if background.WORKER.submit(job):
            return True
        with self._idle:
            self._jobs -= 1
            self._idle.notify_all()
        return False

    def _compile(self, sig: SignatureTier, first_result: list) -> None:
        try:
            jax.block_until_ready(first_result.pop())
        except Exception:  # the call failed: its signature is built all the same
            pass
        try:
            built = self._build(sig.traced)
        except Exception as e:  # IREE's importer or compiler refused it, or nothing of it runs there
            if self._drop(sig, f"{self._name} could not compile it: {' '.join(str(e).split())[:300]}"):
                self._remember(sig, BASE)
            return
        candidates = (built,) if isinstance(built, CompiledTier) else tuple(built)
        if not candidates:
            self._drop(sig, f"{self._name}'s build gave no tier")
            return
        reference = referee.reference(sig.traced)  # compiled now: the decision's clock starts once all is ready
        with self._lock:
            if sig.cancelled or sig.phase is not Phase.COMPILING:
                return  # evicted meanwhile: the result is dropped here
            slow_call, sig.slow_call = sig.slow_call, None
            if slow_call is not None and _deleted(slow_call[0] + slow_call[1]):
                slow_call = None  # donated or deleted since (jax.Array.delete): the next call is compared instead
            sig.candidates, sig.compiled = candidates, candidates[0]
            sig.phase = Phase.READY if slow_call is None else Phase.CHECKING
            sig.samples = [[] for _ in range(len(candidates) + 1)]
            sig.traced, sig.reference = None, reference  # the plan holds what the compiled tier needs
            sig.ready_at, sig.calls = time.perf_counter(), 0
            self.active += 1
        if slow_call is not None:  # compared now, on a slow call made meanwhile (_base_while_compiling)
            self._check(sig, *slow_call)

    def _check(self, sig: SignatureTier, leaves: list, expected: list, base_s: float = 0.0) -> None:
        """Judges every candidate (the first only, for slow calls) against jax.jit's result on the call's inputs,
        ort-cpu's distance from it setting the bar (mnjit/referee.py; jax.jit runs only for a candidate that
        ort-cpu's result alone does not settle: referee.implied); those too far off or failing are dropped.
        Without a reference (jax.jit failed), the candidates are compared with ort-cpu's outputs at the dtypes'
        tolerance."""
        executable, sig.reference = sig.reference, None  # one comparison: released after it

        @functools.cache
        def jax_result() -> list | None:  # jax.jit's run, once, for the first candidate not implied by ort-cpu's
            if executable is None:
                return None
            try:
                return list(jax.block_until_ready(executable(*leaves)))
            except Exception:
                return None

        agreed, problems, took = [], [], {}
        # Slow calls (ort-cpu's over slow_call_s): the first variant only (IREE's task pool, 1.19 s against 2.36 s on
        # local-sync on FIRE's 100-step loop); each one compared is a slow run more before the decision.
        slow = base_s > self.policy.slow_call_s
        for compiled in sig.candidates[:1] if slow else sig.candidates:
            try:
                start = time.perf_counter()
                actual = jax.block_until_ready(compiled.runner.run(leaves))
                took[id(compiled)] = time.perf_counter() - start
                if referee.implied(actual, expected, self.policy.referee_k):
                    problem = None
                elif (reference := jax_result()) is not None:
                    problem = referee.verdict(actual, expected, reference, self.policy.referee_k)
                    problem = problem and f"{compiled.label} disagreed with jax.jit more than ort-cpu does: {problem}"
                else:
                    problem = referee.disagreement(actual, expected)
                    problem = problem and f"{compiled.label} disagreed with ort-cpu on a call: {problem}"
            except Exception as e:
                problem = failed_run(compiled.label, e)
            (problems if problem else agreed).append(problem or compiled)
        if agreed:  # the others go on
            for problem in problems:
                logger.warning("mnjit auto: a variant of the compiled tier is dropped: %s", problem)
        with self._lock:
            if sig.phase is not Phase.CHECKING:
                return
            if agreed:
                sig.candidates, sig.compiled, sig.phase = tuple(agreed), agreed[0], Phase.TIMING
                sig.samples = [[] for _ in range(len(agreed) + 1)]
                if not slow and max(took.values()) <= self.policy.slow_call_s:
                    return
                # Slow calls: the comparison's runs are the first timed call of each tier (its candidates on the
                # worker, ort-cpu on the call that claimed it or held while building). Past decision_s (FIRE's x100
                # loop: 13 s to decide on four more calls of each tier), they decide now, one call each.
                sig.slow = True
                sig.samples = [[took[id(c)]] for c in agreed] + [[base_s]]
                # As _record: a next call as long as the fastest tier's would pass decision_s, so it decides now.
                shortest = min(times[0] for times in sig.samples)
                if (time.perf_counter() - sig.ready_at + shortest < self.policy.decision_s
                        and not tier_trials.clear_winner(sig.samples, self.policy.clearly_slower)):
                    return
                decided = self._decide(sig, sig.candidates)
        if agreed:
            self._announce(sig, *decided)
            return
        if self._drop(sig, problems[0], logging.WARNING) and "disagreed" in problems[0]:
            self._remember(sig, BASE)

    def _drop(self, sig: SignatureTier, reason: str, level: int = logging.INFO) -> bool:
        """The compiled tier is dropped for `reason`; False if the signature was decided or evicted already."""
        with self._lock:
            if sig.cancelled or sig.phase is Phase.BASE:
                return False  # evicted, or decided already (a compiled tier that fails later is still dropped)
            self._settle(sig, Phase.BASE, reason)
        logger.log(level, "mnjit auto: the compiled tier is dropped, ort-cpu serves: %s", reason)
        return True

    def _settle(self, sig: SignatureTier, phase: Phase, reason: str) -> None:
        """Under the lock: the signature's final phase; a dropped compiled tier is released."""
        if sig.phase in ROUTED and phase not in ROUTED:
            self.active -= 1
        elif sig.phase not in ROUTED and phase in ROUTED:
            self.active += 1
        if sig.ready_at and sig.decided_after is None and phase in (Phase.BASE, Phase.COMPILED):
            sig.decided_after = (time.perf_counter() - sig.ready_at, sig.calls)
        sig.phase, sig.reason = phase, reason
        if phase is Phase.BASE:
            sig.compiled, sig.candidates, sig.traced, sig.reference, sig.slow_call = None, (), None, None, None

    # -- calls -----------------------------------------------------------------------------------------------
    def run(self, sig: SignatureTier, leaves: Sequence, run_base: Callable[[Sequence], list]) -> list:
        """One call of the signature: on the tier that serves, or as a comparison or timing trial."""
        phase, compiled = sig.phase, sig.compiled
        if phase is Phase.COMPILED and compiled is not None:
            try:
                return compiled.runner.run(leaves)
            except Exception as e:  # e.g. a runtime error: the call is answered by ort-cpu instead
                self._drop(sig, failed_run(compiled.name, e), logging.WARNING)
                return run_base(leaves)
        if phase is Phase.READY:
            with self._lock:
                claimed = sig.phase is Phase.READY
                if claimed:
                    sig.phase = Phase.CHECKING
                sig.calls += 1
            start = time.perf_counter()
            try:
                outputs = run_base(leaves)
                if claimed:  # timed to completion: a slow signature's decision may rest on this call (_check)
                    jax.block_until_ready(outputs)
            except BaseException:
                if claimed:
                    self._unclaim(sig)  # a later call compares instead
                raise
            if claimed:
                base_s = time.perf_counter() - start
                if not self._submit(sig, self._check, _held(leaves), list(outputs), base_s):
                    self._unclaim(sig)  # the queue was full: a later call tries again
            return outputs
        if phase is Phase.CHECKING:
            with self._lock:
                sig.calls += 1
        if phase is Phase.TIMING:
            return self._trial(sig, leaves, run_base)
        if phase is Phase.COMPILING:
            return self._base_while_compiling(sig, leaves, run_base)
        return run_base(leaves)

    def _base_while_compiling(self, sig: SignatureTier, leaves: Sequence, run_base: Callable[[Sequence], list]) -> list:
        """A call on ort-cpu while the compiled tier builds. One that takes over `slow_call_s` is held, inputs and
        outputs, for the comparison to run on as soon as the build is ready (_compile), with ort-cpu's best such
        time as its timing: waiting for the next call would cost one slow call to start and one to run (FIRE's
        100-step loop: 1.6 s each on ort-cpu). Only the latest is held, and only until the build is ready."""
        start = time.perf_counter()
        outputs = run_base(leaves)
        seconds = time.perf_counter() - start  # the Python path returns once run (the fast path is never this slow)
        if seconds > self.policy.slow_call_s:
            held = _held(leaves)
            with self._lock:
                if sig.phase is Phase.COMPILING:
                    best = seconds if sig.slow_call is None else min(seconds, sig.slow_call[2])
                    sig.slow_call = (held, list(outputs), best)
        return outputs

    def _unclaim(self, sig: SignatureTier) -> None:
        with self._lock:
            if sig.phase is Phase.CHECKING:
                sig.phase = Phase.READY

    def _trial(self, sig: SignatureTier, leaves: Sequence, run_base: Callable[[Sequence], list]) -> list:
        """A timing call. The tiers still in the turns (the candidates, then ort-cpu) take turns in blocks of a
        warm-up call and two timed ones: right after a switch a tier runs faster or slower than it does call
        after call (measured: IREE's MLP at 6-8 ms alternating per call, 8 ms in a row), and call after call is
        how it will serve. Once a call takes over `slow_call_s`, blocks are one timed call long."""
        with self._lock:
            candidates, block = sig.candidates, 1 if sig.slow else 3
            if sig.streak >= block or sig.turn in sig.out:
                sig.turn, sig.streak = tier_trials.next_turn(sig.turn, len(sig.samples), sig.out), 0
            sig.streak += 1
            sig.calls += 1
            turn, timed = sig.turn, sig.slow or sig.streak > 1
        if sig.phase is not Phase.TIMING or not candidates or turn > len(candidates):
            return self.run(sig, leaves, run_base)
        start = time.perf_counter()
        if turn < len(candidates):
            try:
                outputs = jax.block_until_ready(candidates[turn].runner.run(leaves))
            except Exception as e:
                self._drop(sig, failed_run(candidates[turn].label, e), logging.WARNING)
                return run_base(leaves)
        else:
            outputs = jax.block_until_ready(run_base(leaves))
        seconds = time.perf_counter() - start
        self._record(sig, candidates, turn, seconds, timed or seconds > self.policy.slow_call_s)
        return outputs

    def _record(self, sig: SignatureTier, candidates: tuple[CompiledTier, ...], turn: int, seconds: float,
                timed: bool) -> None:
        with self._lock:
            if sig.phase is not Phase.TIMING or sig.candidates is not candidates:
                return
            if not timed:
                return
            samples = sig.samples
            samples[turn].append(seconds)
            sig.slow = sig.slow or seconds > self.policy.slow_call_s
            tier_trials.leave_out_slower(samples, sig.out, self.policy.clearly_slower)
            # The limits count from the build's readiness: the comparison's time (on the worker) and calls made
            # meanwhile included, as a caller waiting for the decision sees it. A next call about as long as this
            # one would pass the time limit: decided now.
            over = (sig.calls >= self.policy.decision_calls
                    or time.perf_counter() - sig.ready_at + seconds >= self.policy.decision_s)
            if not tier_trials.timed_enough(samples, sig.out, sig.slow, self.policy.trials, over):
                return
            decided = self._decide(sig, candidates)
        self._announce(sig, *decided)

    def _decide(self, sig: SignatureTier, candidates: tuple[CompiledTier, ...]) -> tuple[CompiledTier | None, str]:
        """Under the lock: the decision on the calls timed so far; returns what serves and why (_announce)."""
        best, verdict, times = tier_trials.verdict(sig.samples, [c.label for c in candidates], sig.slow,
                                                   self.policy.min_speedup)
        if best is not None:
            variant = candidates[best].variant
            sig.candidates = (candidates[best],)  # the other variants are released
            sig.compiled = candidates[best]
            self._settle(sig, Phase.COMPILED, f"{verdict}{f' on {variant}' if variant else ''} {times}")
        else:
            self._settle(sig, Phase.BASE, verdict)
        return sig.compiled, sig.reason

    def _announce(self, sig: SignatureTier, compiled: CompiledTier | None, reason: str) -> None:
        """Outside the lock: stores a decision for later processes and logs it."""
        self._remember(sig, compiled.name if compiled is not None else BASE, compiled.label if compiled else "")
        logger.info("mnjit auto: %s serves: %s", compiled.label if compiled is not None else BASE, reason)

    # -- reporting -------------------------------------------------------------------------------------------
    def status(self, sig: SignatureTier | None) -> TierStatus:
        if sig is None:
            if self._unavailable:
                return TierStatus(BASE, True, self._unavailable)
            return TierStatus(BASE, False, "not called with this signature yet (ort-cpu serves the first calls "
                                           f"while {self._name} compiles in the background)")
        with self._lock:
            phase, reason, compiled, samples = sig.phase, sig.reason, sig.compiled, sig.samples
            name = compiled.name if compiled is not None else self._name
            timed = " and ".join(c.label for c in sig.candidates)
            detail = f" ({compiled.detail})" if compiled is not None and compiled.detail else ""
            after = sig.decided_after or (None, None)
            if phase is Phase.COMPILED:
                text = f"{reason}; {compiled.detail}" if compiled.detail else reason
                return TierStatus(name, True, text, *after, sig.from_cache)
            if phase is Phase.BASE:
                return TierStatus(BASE, True, reason, *after, sig.from_cache)
            pending = {Phase.COMPILING: f"pending: {name} compiling in the background",
                       Phase.READY: f"{name}{detail} compiled; the next call compares it with jax.jit and ort-cpu",
                       Phase.CHECKING: f"{name}{detail} being compared with jax.jit and ort-cpu on a call's inputs",
                       Phase.TIMING: f"timing {timed}{detail} against ort-cpu "
                                     f"({' and '.join(str(len(t)) for t in samples)} calls so far)"}[phase]
            return TierStatus(BASE, False, pending)
