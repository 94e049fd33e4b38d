"""Hashes of the ort-cpu graphs of every case of the test tables (tests/case_tables.py), keyed by a hash of
the case's StableHLO: tests/test_ort_cpu_graphs.py holds the graphs byte-identical to the reference in
tests/data/ort_cpu_graphs.json, which `python tests/graph_hashes.py > tests/data/ort_cpu_graphs.json` writes.

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


if __name__ == "__main__":
    reference = {}
    for path in sys.argv[1:]:  # references to merge (one per jax version)
        reference.update(json.loads(Path(path).read_text()))
    reference.update(dict(hashes()))
    print(json.dumps(dict(sorted(reference.items())), indent=0))
