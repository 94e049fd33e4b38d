"""Names across scopes: a Loop/If body may not define a name its enclosing graphs define."""
from __future__ import annotations

import itertools

import onnx_ir as ir


def unshadow_names(graph: ir.Graph, outer: frozenset[str] = frozenset()) -> None:
    """Renames body values that take the name of a value of an enclosing graph.

    Each graph names new values with its own counter, so a rewrite inside a loop body can name a value `val_62`
    while the main graph has one too; ONNX forbids that (single assignment across scopes: ORT refuses the model
    as INVALID_GRAPH, onnx.checker and onnx-ir's NameFixPass let it pass when the outer one comes later). Only
    such names change: sibling bodies may share names, and a model without them stays as it is.
    """
    values = [*graph.inputs, *graph.initializers.values(), *(v for node in graph for v in node.outputs)]
    if outer:
        taken = outer | {v.name for v in values}
        for value in values:
            if value.name in outer:
                value.name = next(name for k in itertools.count(1)
                                  if (name := f"{value.name}_{k}") not in taken)
                taken |= {value.name}
    names = outer | {v.name for v in values}
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                unshadow_names(attr.as_graph(), names)
            elif attr.type == ir.AttributeType.GRAPHS:
                for body in attr.as_graphs():
                    unshadow_names(body, names)

