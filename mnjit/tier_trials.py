"""target="auto"'s timing rules (mnjit/tiering.py): whose turn it is, which tier leaves the turns, when the
calls timed so far decide, and what they decide. Pure functions of the samples: tiering holds the state and
its lock.

Samples are per tier: the compiled candidates in their order, then ort-cpu, last. `out` holds the indices of
candidates left out of the turns as clearly slower (ort-cpu never is).
"""
from __future__ import annotations

import statistics
from typing import Sequence


def next_turn(turn: int, tiers: int, out: set[int]) -> int:
    """The tier after `turn` in the turns."""
    while True:
        turn = (turn + 1) % tiers
        if turn not in out:
            return turn


def leave_out_slower(samples: Sequence[Sequence[float]], out: set[int], clearly_slower: float) -> None:
    """Adds to `out` the candidates whose best call is `clearly_slower` times the best tier's best, once every
    tier in the turns has two timed calls (one call of a tier may be an outlier; slow calls come one per turn)."""
    active = [i for i in range(len(samples)) if i not in out]
    if len(active) < 2 or any(len(samples[i]) < 2 for i in active):
        return
    bests = {i: min(samples[i]) for i in active}
    fastest = min(bests.values())
    for i, best in bests.items():
        if i < len(samples) - 1 and best > clearly_slower * fastest:
            out.add(i)


def clear_winner(samples: Sequence[Sequence[float]], clearly_slower: float) -> bool:
    """Whether every tier has a timed call and one tier's best is `clearly_slower` times faster than every
    other's: slow calls decide on it at once (a second slow call of each would not change the verdict)."""
    if len(samples) < 2 or not all(samples):
        return False
    fastest, runner_up = sorted(min(times) for times in samples)[:2]
    return runner_up >= clearly_slower * fastest


def timed_enough(samples: Sequence[Sequence[float]], out: set[int], slow: bool, trials: int,
                 over_limit: bool) -> bool:
    """Whether the tiers in the turns have `trials` timed calls each (two for slow calls), or one each once a
    limit is passed (`over_limit`); every candidate left out decides at once."""
    counts = [len(times) for i, times in enumerate(samples) if i not in out]
    if len(counts) == 1:
        return True
    return min(counts) >= (2 if slow else trials) or (min(counts) >= 1 and over_limit)


def verdict(samples: Sequence[Sequence[float]], labels: Sequence[str], slow: bool,
            min_speedup: float) -> tuple[int | None, str, str]:
    """The candidate that serves (None: ort-cpu), the verdict and the times behind it (for ort-cpu, all in the
    verdict): the fastest candidate by median (by best, for slow calls) keeps the signature if ort-cpu's is
    over `min_speedup` times its own."""
    statistic, kind = (min, "best") if slow else (statistics.median, "medians")
    typical = [statistic(times) if times else float("inf") for times in samples]
    base = typical.pop()
    best = min(range(len(labels)), key=typical.__getitem__)
    mine = typical[best]
    times = (f"{duration(mine)} against {duration(base)} on ort-cpu, {kind} of {len(samples[best])} and "
             f"{len(samples[-1])} calls")
    others = "".join(f"; {label} {duration(m)}" for i, (label, m) in enumerate(zip(labels, typical)) if i != best)
    margin = f"min_speedup={min_speedup:g}"
    if base / max(mine, 1e-9) > min_speedup:
        return best, f"{'faster' if mine < base else f'slower, kept by {margin}'}", f"({times}{others})"
    return None, f"{labels[best]} {f'faster, not by {margin}' if mine < base else 'slower'} ({times}{others})", ""


def duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"
