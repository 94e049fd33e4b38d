"""Host callbacks in ONNX: the `mnjit.HostCallback` node, and what the rest of hlo2onnx must know about it.

jax.pure_callback, io_callback, jax.debug.print and equinox's error checks lower to the custom call
`xla_ffi_python_cpu_callback`, which calls a Python function. hlo2onnx writes it as one HostCallback node in
the `mnjit` domain, so that a loop holding a callback stays one ONNX Loop; mnjit's runtime executes the node
(mnjit/host_callbacks.py). A file holding one cannot run anywhere else, so hlo2onnx writes such nodes only when
the caller hands it the functions (`host_callbacks`: mnjit does).

Unlike every ONNX op, a callback may have side effects: passes that drop unused nodes, merge equal ones or move
nodes out of loops ask `pinned` first.
"""
from __future__ import annotations

from typing import Iterator

import onnx_ir as ir

DOMAIN = "mnjit"
OP_TYPE = "HostCallback"
DOMAIN_VERSION = 1
# The custom call jax emits for host callbacks on the CPU.
CALL_TARGET = "xla_ffi_python_cpu_callback"
# The model metadata key that marks a model needing mnjit's runtime.
NEEDS_MNJIT = "mnjit.host_callbacks"


def is_host_call(node: ir.Node) -> bool:
    return node.op_type == OP_TYPE and node.domain == DOMAIN


def pinned(node: ir.Node) -> bool:
    """Whether `node` must run even when nothing reads its outputs, as often as the program says: a
    callback with side effects, or a Loop/If holding one."""
    if is_host_call(node):
        effects = node.attributes.get("effects")
        return effects is not None and effects.as_int() == 1
    return any(pinned(inner) for graph in _subgraphs(node) for inner in graph.all_nodes())


def order_effects(graph: ir.Graph, previous: ir.Value | None = None) -> ir.Value | None:
    """Makes the callbacks with side effects run in program order (the order the translator emitted them).

    ONNX orders nodes by data only, so each such callback reads one output of the effect before it as an extra,
    last input (its `after` attribute says so; the runtime ignores the value) and writes a token as its last
    output. A Loop/If holding effects is ordered through its body: the body's first effect reads the outer value,
    which makes the Loop wait for it, and the next effect reads the Loop's first output. Returns the last
    effect's value.
    """
    for node in graph:
        if not pinned(node):
            continue
        if is_host_call(node):
            if previous is not None:
                node.resize_inputs(len(node.inputs) + 1)
                node.replace_input_with(len(node.inputs) - 1, previous)
                node.attributes["after"] = ir.AttrInt64("after", 1)
            previous = node.outputs[-1]
            continue
        for body in _subgraphs(node):
            order_effects(body, previous)
        previous = node.outputs[0] if node.outputs else previous
    return previous


def host_calls(model: ir.Model) -> list[ir.Node]:
    """Every HostCallback node of `model`, subgraphs included."""
    return [node for node in model.graph.all_nodes() if is_host_call(node)]


def _subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.as_graph()
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.as_graphs()
