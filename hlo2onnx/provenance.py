"""Node provenance: the StableHLO op (and user source line) each ONNX node came from.

The translator writes it (tag_nodes); every rewrite in patterns/ hands it on to the nodes it makes
(inherit_sources), naming itself as their RULE; the report and the target check read it to name, for any
node, the op, the line and the rewrite that produced it.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import onnx_ir as ir

from hlo2onnx.graphs import can_hold_subgraphs, subgraphs

SOURCE_OP, SOURCE_LOC = "hlo2onnx.op", "hlo2onnx.loc"
RULE = "hlo2onnx.rule"  # the rewrite rule that made the node


def tag_nodes(nodes: Iterable[ir.Node], op_name: str, where: str | None) -> None:
    """Marks `nodes` and the untagged nodes of their subgraphs (Loop/If bodies a rule built) as `op_name`'s."""
    for node in nodes:
        props = node.metadata_props
        if SOURCE_OP in props:
            continue  # emitted by a nested op (a region's body)
        props[SOURCE_OP] = op_name
        if where:
            props[SOURCE_LOC] = where
        if can_hold_subgraphs(node):
            for graph in subgraphs(node):
                tag_nodes(graph, op_name, where)


def inherit_sources(old: Sequence[ir.Node], new: Sequence[ir.Node], rule_name: str | None) -> None:
    """New nodes name every StableHLO op (and the first source line) behind the nodes they replace,
    and the rule that made them (None: the first rule named by an old node, if any)."""
    rule_name = rule_name or next((node.metadata_props[RULE] for node in old if RULE in node.metadata_props), None)
    ops = sorted({op for node in old for op in node.metadata_props.get(SOURCE_OP, "").split(",") if op})
    loc = next((node.metadata_props[SOURCE_LOC] for node in old if SOURCE_LOC in node.metadata_props), None)
    for node in new:
        if ops:
            node.metadata_props[SOURCE_OP] = ",".join(ops)
        if loc:
            node.metadata_props[SOURCE_LOC] = loc
        if rule_name:
            node.metadata_props[RULE] = rule_name
