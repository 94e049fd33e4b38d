"""target="auto"'s default compiled tier (mnjit/tiering.py): iree-cpu with partitioned execution, on IREE's two
CPU drivers."""
from __future__ import annotations

from collections import Counter

from hlo2onnx import targets as target_table
from mnjit import device
from mnjit import fallback as partitioned, partition_runner
from mnjit.tier_state import tier_label
from mnjit.tiering import CompiledTier

DRIVERS = ("local-task", "local-sync")


def iree_tier(traced, opset: int, name: str, make_runner: partitioned.MakeRunner,
              only: str | None = None) -> list[CompiledTier]:
    """iree-cpu with partitioned execution: what IREE refuses runs on ort-cpu (or jax.jit).

    Two variants, the same compiled modules on each of IREE's CPU drivers: `local-task` spreads each dispatch
    over a worker per core; `local-sync` runs them on the calling thread, which spares a hand-off to the workers
    and back per dispatch. Measured on the 64x64 CFD step (343 small nodes): 0.16 ms on local-sync against 0.45
    on local-task (jax.jit 0.2), and 1.6-2x slower on the MLP and transformer block, whose matmuls use both
    cores. The variants share the runners of the plan's other partitions (ort-cpu sessions are not duplicated).
    `only` (a variant's label) builds that one: a decision read from the cache names it, and loading the other
    driver's runtime would lengthen the first call of a new process.
    """
    target = target_table.get("iree-cpu")
    lowered = partitioned.plan(traced, target, opset, name)
    places = Counter(p.runs_on for p in lowered.partitions)
    if not places[target.name]:
        why = lowered.fell_back[0].reason if lowered.fell_back else "no partition"
        raise RuntimeError(f"iree-cpu runs none of it ({why})")
    others: dict[int, device.Runner] = {}  # by the partition's model

    def on(driver: str) -> partitioned.MakeRunner:
        def make(part_target, model, in_avals, out_avals) -> device.Runner:
            if part_target.runtime == "iree":
                return make_runner(part_target, model, in_avals, out_avals, iree_driver=driver)
            if id(model) not in others:
                others[id(model)] = make_runner(part_target, model, in_avals, out_avals)
            return others[id(model)]
        return make

    detail = "" if lowered.whole else "partitions: " + ", ".join(f"{n} on {p}" for p, n in places.items())
    variants = {driver: f"IREE's {driver} driver" for driver in DRIVERS}
    return [CompiledTier(target.name, partition_runner.PartitionedRunner(lowered, on(driver)), detail, variant)
            for driver, variant in variants.items() if only in (None, tier_label(target.name, variant))]


def unavailable_reason() -> str | None:
    """Why iree-cpu cannot be the compiled tier on this machine (None: it can)."""
    try:
        device.require(target_table.get("iree-cpu"))
    except device.TargetUnavailableError:
        return "IREE not installed (pip install 'mnjit[iree]')"
    return None
