"""Node provenance: the StableHLO op (and user source line) each ONNX node came from.

The translator writes it (tag_nodes); fusions merge it (patterns/engine.py); the report and the target
check read it to name, for any node, the op and the line that produced it.
"""
from __future__ import annotations

from typing import Iterable

import onnx_ir as ir

SOURCE_OP, SOURCE_LOC = "hlo2onnx.op", "hlo2onnx.loc"


def tag_nodes(nodes: Iterable[ir.Node], op_name: str, where: str | None) -> None:
    """Marks `nodes` and the untagged nodes of their subgraphs (Loop/If bodies a rule built) as `op_name`'s."""
    for node in nodes:
        if SOURCE_OP in node.metadata_props:
            continue  # emitted by a nested op (a region's body)
        node.metadata_props[SOURCE_OP] = op_name
        if where:
            node.metadata_props[SOURCE_LOC] = where
        for attr in node.attributes.values():
            graphs = [attr.value] if attr.type == ir.AttributeType.GRAPH else (
                attr.value if attr.type == ir.AttributeType.GRAPHS else [])
            for graph in graphs:
                tag_nodes(graph, op_name, where)
