"""ort-cpu's models for the test tables are byte for byte those of the reference (tests/data/ort_cpu_graphs.json,
written by tests/graph_hashes.py): a target's rewrites and NaN guards live in that target, so no change made for
another target may reach ort-cpu's graphs, or their speed. A change meant for ort-cpu's graphs rewrites the
reference in the same commit (tests/graph_hashes.py says how). metadata_props' record of integer wraparound is
left out of the hash.

The cases are split into shards so that pytest-xdist spreads them; a case whose StableHLO the reference lacks
(lowered by another jax version than the reference's two) is not compared, and each shard must compare most
of its cases.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_hashes import hashes

REFERENCE = json.loads((Path(__file__).resolve().parent / "data" / "ort_cpu_graphs.json").read_text())
SHARDS = 8


@pytest.mark.parametrize("shard", range(SHARDS))
def test_ort_cpu_graphs_unchanged(shard: int) -> None:
    compared, changed, unknown = 0, [], 0
    for module, model in hashes(shard, SHARDS):
        if module not in REFERENCE:
            unknown += 1
            continue
        compared += 1
        # A list: the graphs of each jax version, where the translation reads jax itself (the Erf and Gelu
        # fusions' templates are jax's own lowering of erf and erfc).
        want = REFERENCE[module]
        if model not in (want if isinstance(want, list) else [want]):
            changed.append(module)
    assert not changed, f"{len(changed)} of {compared} ort-cpu graphs changed (StableHLO hashes {changed[:5]})"
    assert compared > 4 * unknown, f"only {compared} compared, {unknown} not in the reference"
