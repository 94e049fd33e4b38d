"""target="auto"'s state (mnjit/tiering.py): the compiled tier, the policy that judges it, each signature's
phase, samples and decision as the tiering's lock guards them, what `tier_status` reports, and `settle`, which
waits for it."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax

from mnjit import device, referee

BASE = "ort-cpu"


@dataclass(frozen=True)
class CompiledTier:
    """A signature's second tier: `runner.run(leaves)` returns the same flat outputs as ort-cpu's. A build may
    give several, variants of one tier (`variant` tells them apart: IREE's two CPU drivers); each is compared
    with ort-cpu, they are timed against each other and ort-cpu, and only the fastest is kept."""

    name: str
    runner: device.Runner
    detail: str = ""
    variant: str = ""

    @property
    def label(self) -> str:
        return tier_label(self.name, self.variant)


def tier_label(name: str, variant: str = "") -> str:
    """A compiled tier's label, as reports show it and stored decisions name it: the tier and its variant."""
    return f"{name} ({variant})" if variant else name


@dataclass(frozen=True)
class TierPolicy:
    """How `target="auto"` builds and judges the compiled tier (mnjit's `tier_policy=` option).

    `build(traced)` makes the compiled tier of one signature from its `jax.stages.Traced`, or variants of it
    (a sequence of CompiledTier), on the worker thread (None: iree-cpu with partitioned execution, on IREE's
    two CPU drivers; a test may give its own). The compiled tier serves
    when ort-cpu's median call time divided by its own exceeds `min_speedup`: the margin keeps noise from
    moving a signature (and the function's other signatures, which leave jax.jit's fast dispatch while one
    runs on the compiled tier) to a tier that is not clearly faster.
    """

    build: Callable[[Any], CompiledTier | Sequence[CompiledTier]] | None = None
    trials: int = 3  # timed calls per tier that decide, unless a limit below comes first
    # Limits from the moment the build is ready: the comparing call and the timing calls together. Past either,
    # the decision is taken on the calls timed so far (once every tier has one).
    decision_calls: int = 20
    decision_s: float = 2.0
    # A tier whose best timed call is this many times the best tier's leaves the turns (no more calls spent
    # on it); ort-cpu always stays.
    clearly_slower: float = 2.0
    # Once a call takes longer: two timed calls per tier, the faster of each counting (one call each let an
    # outlier decide: the CFD rollout's local-task variant timed once at 1.4 s, 0.53 s call after call).
    slow_call_s: float = 1.0
    min_speedup: float = 1.1
    referee_k: float = referee.K  # the compiled tier may be up to k times further from jax.jit than ort-cpu

    def __post_init__(self):
        if not 1 <= self.trials:
            raise ValueError(f"TierPolicy needs trials >= 1, got {self.trials}")
        if self.decision_calls < 2 or self.decision_s <= 0 or self.clearly_slower <= 1:
            raise ValueError("TierPolicy needs decision_calls >= 2, decision_s > 0 and clearly_slower > 1")

    def fingerprint(self) -> str:
        """What of the policy a stored decision depends on (the builder is the default's: iree-cpu)."""
        return (f"trials={self.trials};calls={self.decision_calls};s={self.decision_s:g};"
                f"slower={self.clearly_slower:g};slow={self.slow_call_s:g};speedup={self.min_speedup:g};"
                f"k={self.referee_k:g}")


class Phase(enum.Enum):
    COMPILING = "compiling"  # queued for the worker, or being built
    READY = "ready"  # built: the next call is compared
    CHECKING = "checking"  # the worker compares it on a call's inputs
    TIMING = "timing"  # calls alternate between the tiers
    COMPILED = "compiled"  # decided: the compiled tier serves
    BASE = "base"  # decided: ort-cpu serves (the reason says why)


# Phases in which calls must take mnjit's Python path (jax.jit's fast path would never reach the tiers).
ROUTED = {Phase.READY, Phase.CHECKING, Phase.TIMING, Phase.COMPILED}


@dataclass
class SignatureTier:
    """One cached signature's tiering state; guarded by its Tiering's lock."""

    traced: Any
    x64: bool
    phase: Phase = Phase.COMPILING
    reason: str = ""
    compiled: CompiledTier | None = None  # the one that serves once decided; until then the first candidate
    candidates: tuple[CompiledTier, ...] = ()  # built and not dropped; one once decided
    # timing: the calls timed per tier, the candidates' in their order, then ort-cpu's
    samples: list[list[float]] = field(default_factory=list)
    out: set[int] = field(default_factory=set)  # timing: tiers (indices into samples) left out as clearly slower
    turn: int = 0  # timing: the index (into samples) of the tier of the current block of calls
    streak: int = 0  # timing: calls made in the current block
    slow: bool = False  # timing: a call took over slow_call_s
    cancelled: bool = False
    reference: Any = None  # jax.jit's executable of the jaxpr, for the comparison (READY to CHECKING)
    # COMPILING: the latest call that took over slow_call_s on ort-cpu, as (inputs, outputs, seconds); the build,
    # once ready, compares on it at once instead of waiting for the next call (Tiering._compile)
    slow_call: tuple[list, list, float] | None = None
    ready_at: float = 0.0  # perf_counter when the build was ready
    calls: int = 0  # calls since the build was ready
    decided_after: tuple[float, int] | None = None  # seconds and calls from the build's readiness to the decision
    decision_key: str | None = None  # where the decision is stored (None: not stored)
    from_cache: bool = False  # decided in an earlier process


@dataclass(frozen=True)
class TierStatus:
    """Which tier serves a signature, whether that is final, and why."""

    serving: str
    decided: bool
    reason: str
    # Seconds and calls from the compiled tier's readiness to the decision (None: not decided by timing here).
    decision_s: float | None = None
    decision_calls: int | None = None
    cached: bool = False  # decided in an earlier process, read from the persistent cache

    def __str__(self) -> str:
        text = f"{self.serving}: {self.reason}" if self.reason else self.serving
        if self.decided:
            return f"{text} (decided)"
        # Calls never wait for the compiled tier: a signature stays pending while its build or comparison runs
        # in the background, however many calls pass meanwhile.
        return (f"{text} (undecided: ort-cpu serves meanwhile, and calls never wait for the decision; "
                "mnjit.settle(f, *args) does)")

    __repr__ = __str__


def failed_run(name: str, error: Exception) -> str:
    """The reason a tier is dropped after a call of it raised `error`."""
    return f"{name} failed on a call: {type(error).__name__}: {' '.join(str(error).split())[:300]}"


def settle(fun: Any, *args, timeout: float = 300.0, **kwargs) -> TierStatus:
    """Calls `fun` (a target="auto" function) with these arguments until its tier for them is decided, and
    returns the decision: for tests and benchmarks that want the steady state (calls themselves never wait)."""
    deadline = time.monotonic() + timeout
    while True:
        fun.wait_for_tiering(max(0.0, deadline - time.monotonic()))
        status = fun.tier_status(*args, **kwargs)
        if status.decided or time.monotonic() > deadline:
            return status
        jax.block_until_ready(fun(*args, **kwargs))
