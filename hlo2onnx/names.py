"""The names of a model's inputs and outputs, which serving clients address tensors by, and their layout.

By default a dict's keys name its leaves: `f(inputs)` with `inputs = {'image': ...}` has the input `image`, a
result `{'probs': ..., 'logits': ...}` the outputs `probs` and `logits` (nested keys join with "."); other
leaves keep jax's names (`x`, `params['w']` where two short names would clash) and results `out0`, `out1`...

`apply` sets names a caller chooses, and turns NHWC inputs and outputs (JAX's layout) into NCHW ones at the
boundary, the layout pass folding the added Transposes into the convolutions' own where it can.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

import onnx_ir as ir

from hlo2onnx.errors import Hlo2OnnxError

__all__ = ["short_names", "output_name", "apply", "signature", "VALID_NAME"]

# A key path as jax prints it (jax.tree_util.keystr): ['key'], [0], .attr, after an optional head.
_HEAD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PART = re.compile(r"\['((?:[^'\\]|\\.)*)'\]|\[(-?\d+)\]|\.([A-Za-z_][A-Za-z0-9_]*)")
# What a caller may name an input or output: names that Triton's config, KServe's JSON and Python keywords all
# take as they are.
VALID_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")


def _key_path(text: str) -> list[str] | None:
    """The keys after the head of `text` (`inputs['extra']['z']` -> extra, z), or None when a part is a
    position or the text is no key path."""
    head = _HEAD.match(text)
    pos, keys = head.end() if head else 0, []
    while pos < len(text):
        part = _PART.match(text, pos)
        if part is None or part.group(2) is not None:
            return None
        keys.append(part.group(1) if part.group(1) is not None else part.group(3))
        pos = part.end()
    return keys


def _short(full: str) -> str:
    keys = _key_path(full)
    name = ".".join(keys) if keys else ""
    return name if VALID_NAME.fullmatch(name) else full


def short_names(full: Sequence[str]) -> list[str]:
    """Input names as dict keys (`inputs['image']` -> `image`) where those are valid and distinct, else as given."""
    short = [_short(name) for name in full]
    count: dict[str, int] = {}
    for name in short:
        count[name] = count.get(name, 0) + 1
    return [s if count[s] == 1 else f for s, f in zip(short, full)]


def output_name(result_info: str | None, index: int) -> str:
    """An output's name from jax's `jax.result_info` (`result['probs']` -> `probs`), else `out<index>`."""
    if result_info:
        keys = _key_path(result_info[len("result"):] if result_info.startswith("result") else result_info)
        name = ".".join(keys) if keys else ""
        if VALID_NAME.fullmatch(name):
            return name
    return f"out{index}"


def _check_names(names: Sequence[str] | None, values: Sequence[ir.Value], kind: str) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        names = names.split(",")
    names = list(names)
    current = [v.name for v in values]
    if len(names) != len(values):
        raise Hlo2OnnxError(f"{len(names)} {kind} name(s) given for the model's {len(values)} {kind}s "
                            f"({', '.join(current)})")
    for name in names:
        if not isinstance(name, str) or not VALID_NAME.fullmatch(name):
            raise Hlo2OnnxError(f"invalid {kind} name {name!r}: a name starts with a letter or '_' and holds "
                                "letters, digits and _ . : / - only")
    return names


def _free_name(graph: ir.Graph, name: str, keep: set[ir.Value]) -> None:
    """Renames a value of the main graph other than those in `keep` that holds `name` (ONNX names are unique)."""
    taken = {v.name for node in graph for v in node.outputs} | set(graph.initializers) | \
        {v.name for v in graph.inputs} | {v.name for v in graph.outputs}
    for value in [*graph.inputs, *graph.outputs, *(v for node in graph for v in node.outputs),
                  *graph.initializers.values()]:
        if value.name == name and value not in keep:
            n = 1
            while f"{name}_{n}" in taken:
                n += 1
            if value.is_initializer():
                graph.initializers.pop(name)
                value.name = f"{name}_{n}"
                graph.register_initializer(value)
            else:
                value.name = f"{name}_{n}"
            taken.add(value.name)


def rename(model: ir.Model, input_names: Sequence[str] | str | None = None,
           output_names: Sequence[str] | str | None = None) -> None:
    """Gives the graph's inputs and outputs these names, in order (a comma-separated str is split)."""
    graph = model.graph
    inputs = _check_names(input_names, list(graph.inputs), "input")
    outputs = _check_names(output_names, list(graph.outputs), "output")
    final = (inputs or [v.name for v in graph.inputs]) + (outputs or [v.name for v in graph.outputs])
    seen: set[str] = set()
    for name in final:
        if name in seen:
            raise Hlo2OnnxError(f"the name {name!r} is given to two of the model's inputs and outputs: each needs "
                                "its own")
        seen.add(name)
    boundary = set(graph.inputs) | set(graph.outputs)
    for values, names in ((graph.inputs, inputs), (graph.outputs, outputs)):
        for value, name in zip(values, names or ()):
            value.name = None  # frees the old name first: a swap of two names is no clash
        for value, name in zip(values, names or ()):
            _free_name(graph, name, boundary)
            value.name = name


def _find(values: Sequence[ir.Value], names: Iterable[str], kind: str) -> list[int]:
    positions = {v.name: i for i, v in enumerate(values)}
    found = []
    for name in names:
        if name not in positions:
            raise Hlo2OnnxError(f"{kind}s_as_nchw: the model has no {kind} {name!r} (its {kind}s: "
                                f"{', '.join(positions)})")
        rank = len(values[positions[name]].shape or ())
        if values[positions[name]].shape is None or rank < 3:
            raise Hlo2OnnxError(f"{kind}s_as_nchw: {kind} {name!r} has rank {rank}: NCHW needs a batch, channel "
                                "and at least one spatial dim")
        found.append(positions[name])
    return found


def _transpose(value: ir.Value, perm: list[int], name: str) -> ir.Node:
    node = ir.Node("", "Transpose", [value], attributes=[ir.AttrInt64s("perm", perm)], num_outputs=1)
    out = node.outputs[0]
    out.name, out.type = name, value.type
    out.shape = ir.Shape([value.shape[p] for p in perm])
    return node


def to_nchw(model: ir.Model, inputs: Iterable[str] = (), outputs: Iterable[str] = ()) -> tuple[list[int], list[int]]:
    """Makes the named NHWC (channels-last) inputs and outputs NCHW (channels-first) ones with a Transpose at the
    boundary, then lets the layout pass cancel them against the convolutions' own; returns their positions."""
    from hlo2onnx.patterns.cleanup import clean  # the rewrite passes load with the rule table, not before
    from hlo2onnx.patterns.layout import sink_transposes

    graph = model.graph
    in_positions, out_positions = _find(graph.inputs, inputs, "input"), _find(graph.outputs, outputs, "output")
    for i in in_positions:
        old = graph.inputs[i]
        rank, name = len(old.shape), old.name
        new = ir.Value(name=name, type=old.type, shape=ir.Shape([old.shape[0], old.shape[rank - 1],
                                                                 *list(old.shape)[1:rank - 1]]))
        old.name = None
        node = _transpose(new, [0, *range(2, rank), 1], f"{name}_nhwc")
        ir.convenience.replace_all_uses_with(old, node.outputs[0], replace_graph_outputs=True)
        graph.inputs[i] = new
        if len(graph):
            graph.insert_before(graph[0], node)
        else:
            graph.append(node)
    for i in out_positions:
        old = graph.outputs[i]
        rank, name = len(old.shape), old.name
        old.name = f"{name}_nhwc"
        node = _transpose(old, [0, rank - 1, *range(1, rank - 1)], name)
        graph.append(node)
        graph.outputs[i] = node.outputs[0]
    if in_positions or out_positions:
        sink_transposes(model)
        clean(model)
    return in_positions, out_positions


def apply(model: ir.Model, *, input_names: Sequence[str] | str | None = None,
          output_names: Sequence[str] | str | None = None, inputs_as_nchw: Iterable[str] | str = (),
          outputs_as_nchw: Iterable[str] | str = ()) -> tuple[list[int], list[int]]:
    """Renames, then transposes to NCHW (the names given to *_as_nchw are the final ones), in place; returns the
    positions of the inputs and outputs made NCHW."""
    inputs_as_nchw = [n for n in inputs_as_nchw.split(",") if n] if isinstance(inputs_as_nchw, str) \
        else list(inputs_as_nchw)
    outputs_as_nchw = [n for n in outputs_as_nchw.split(",") if n] if isinstance(outputs_as_nchw, str) \
        else list(outputs_as_nchw)
    rename(model, input_names, output_names)
    return to_nchw(model, inputs_as_nchw, outputs_as_nchw)


def wanted(input_names=None, output_names=None, inputs_as_nchw=(), outputs_as_nchw=()) -> bool:
    """Whether any of `apply`'s options is set (then a caller applies them to a copy of its model)."""
    return input_names is not None or output_names is not None or bool(inputs_as_nchw) or bool(outputs_as_nchw)


def copy(model: ir.Model) -> ir.Model:
    """An independent copy of `model` (a round trip through its protobuf, weights included)."""
    return ir.from_proto(ir.to_proto(model))


def signature(model: ir.Model) -> str:
    """`name(image: float[2,28,28,1]) -> (probs: float[2,10])`: the model's inputs and outputs as a server sees
    them (symbolic dims by name)."""
    def described(value: ir.Value) -> str:
        dims = ",".join(str(d) for d in value.shape) if value.shape is not None else "?"
        dtype = value.dtype.name.lower() if value.dtype is not None else "?"
        return f"{value.name}: {dtype}[{dims}]"
    outputs = ", ".join(map(described, model.graph.outputs))
    return f"{model.graph.name}({', '.join(map(described, model.graph.inputs))}) -> ({outputs})"
