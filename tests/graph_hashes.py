"""Hashes of the ort-cpu graphs of every case of the test tables (tests/case_tables.py), keyed by a hash of
the case's StableHLO: tests/test_ort_cpu_graphs.py holds the graphs byte-identical to the reference in
tests/data/ort_cpu_graphs.json, which this script writes (see its end: one run per jax version, then merged).

Keyed by the StableHLO text, not the case's name: jax versions lower some cases differently, and a graph can
only be held to a reference made from the same module (cases whose text the reference lacks are skipped).
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Iterator

import onnx_ir as ir

import hlo2onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from case_tables import cases, lowered_text  # noqa: E402


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:20]


def graph_hash(text: str) -> str | None:
    """The hash of the serialized ort-cpu model of `text`, less the record of what it assumes of its consumer
    (added since the reference: targets/portable.py); None where it is not translated (a bad input)."""
    try:
        model = hlo2onnx.translate(hlo2onnx.parse_module(text), target="ort-cpu")
    except hlo2onnx.Hlo2OnnxError:
        return None
    model.metadata_props.pop("hlo2onnx.assumes", None)
    return digest(ir.serde.serialize_model(model).SerializeToString(deterministic=True))


def hashes(shard: int = 0, shards: int = 1) -> Iterator[tuple[str, str]]:
    """(StableHLO hash, model hash) of every case whose position is `shard` modulo `shards`."""
    for i, case in enumerate(cases()):
        if i % shards != shard:
            continue
        text = lowered_text(case)
        if text is not None:
            model = graph_hash(text)
            if model is not None:
                yield digest(text.encode()), model


def merge(references: list[dict]) -> dict:
    """One reference from several jax versions' own: a module whose graphs differ between them keeps each."""
    merged: dict = {}
    for reference in references:
        for module, graphs in reference.items():
            known = merged.setdefault(module, [])
            known.extend(g for g in (graphs if isinstance(graphs, list) else [graphs]) if g not in known)
    return {module: graphs[0] if len(graphs) == 1 else graphs for module, graphs in sorted(merged.items())}


if __name__ == "__main__":
    # Each jax version of .ci's two stacks writes its own (`python tests/graph_hashes.py > new-jax.json`); then
    # `python tests/graph_hashes.py --merge old-jax.json new-jax.json > tests/data/ort_cpu_graphs.json`.
    if sys.argv[1:2] == ["--merge"]:
        result = merge([json.loads(Path(path).read_text()) for path in sys.argv[2:]])
    else:
        result = dict(sorted(hashes()))
    print(json.dumps(result, indent=0))
