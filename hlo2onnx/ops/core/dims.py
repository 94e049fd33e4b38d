"""Sizes of symbolic dims (jax.export shape polymorphism) as int64 tensors computed in the graph.

A rule's static shapes read -1 where a dim is symbolic. Where a rule must spell
such a shape (Reshape, Expand, ConstantOfShape, TopK's k), the -1 becomes a
`Shape` of a tensor that carries the dim. Every helper returns exactly the
constant the static rule wrote when no dim is symbolic, so static models keep
their graphs node for node.
"""
from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import onnx_ir as ir

# A static size, or a 1-element int64 tensor holding a symbolic one.
Dim = Union[int, ir.Value]


def is_static(shape: Sequence[int]) -> bool:
    return all(d >= 0 for d in shape)


def dim(b, x: ir.Value, axis: int, size: int) -> Dim:
    """`size` when static, else x's size along `axis` read at run time."""
    return size if size >= 0 else b.op("Shape", x, start=axis, end=axis + 1)


def dims(b, x: ir.Value, shape: Sequence[int]) -> list[Dim]:
    return [dim(b, x, axis, size) for axis, size in enumerate(shape)]


def shape_value(b, parts: Sequence[Dim]) -> ir.Value:
    """A 1-D int64 shape tensor; a constant when every part is static."""
    if all(isinstance(p, int) for p in parts):
        return b.shape_const(list(parts))
    pieces: list[ir.Value] = []
    run: list[int] = []
    for p in parts:
        if isinstance(p, int):
            run.append(p)
            continue
        if run:
            pieces.append(b.shape_const(run))
            run = []
        pieces.append(p)
    if run:
        pieces.append(b.shape_const(run))
    return pieces[0] if len(pieces) == 1 else b.op("Concat", *pieces, axis=0)


def product(b, parts: Sequence[Dim]) -> Dim:
    static = int(np.prod([p for p in parts if isinstance(p, int)], dtype=np.int64))
    result: Dim = static
    for p in parts:
        if not isinstance(p, int):
            result = p if isinstance(result, int) and result == 1 else b.op(
                "Mul", p, b.shape_const([result]) if isinstance(result, int) else result)
    return result


def difference(b, a: Dim, c: Dim) -> Dim:
    """a - c: an int when both are static."""
    if isinstance(a, int) and isinstance(c, int):
        return a - c
    return b.op("Sub", b.shape_const([a]) if isinstance(a, int) else a, b.shape_const([c]) if isinstance(c, int) else c)


def reshape(b, x: ir.Value, parts: Sequence[Dim]) -> ir.Value:
    """Reshape to `parts`: a -1 stands for at most one symbolic part, as the static rules wrote it."""
    if sum(not isinstance(p, int) for p in parts) <= 1:
        return b.op("Reshape", x, b.shape_const([p if isinstance(p, int) else -1 for p in parts]))
    return b.op("Reshape", x, shape_value(b, parts), allowzero=1)


def known_entries(value: ir.Value, n: int) -> list[int | None]:
    """The `n` entries (row-major) of a small int tensor that the graph holds as constants (None for others).

    jax builds such tensors as a Concat of constants and reshaped dim sizes; this follows Concat, Cast,
    Reshape and Squeeze/Unsqueeze back to constants (initializers or ConstantOfShape splats).
    """
    if value.const_value is not None:
        return [int(v) for v in value.const_value.numpy().reshape(-1)]
    node = value.producer()
    if node is not None and node.op_type == "ConstantOfShape" and node.inputs[0].const_value is not None:
        fill = node.attributes["value"].as_tensor().numpy().reshape(-1)
        return [int(fill[0])] * int(np.prod(node.inputs[0].const_value.numpy()))
    if node is not None and node.op_type in ("Cast", "Reshape", "Squeeze", "Unsqueeze", "Identity"):
        return known_entries(node.inputs[0], n)
    if node is not None and node.op_type == "Concat" and node.attributes["axis"].as_int() == 0 and all(
            i.shape is not None and i.shape.is_static() for i in node.inputs):
        # Row-major: joining along axis 0 joins the flattened pieces.
        entries: list[int | None] = []
        for piece in node.inputs:
            entries.extend(known_entries(piece, int(np.prod(piece.shape.numpy()))))
        return entries if len(entries) == n else [None] * n
    return [None] * n


def refuse(ctx, axes: Sequence[int], why: str, operand: int = 0) -> None:
    """Raises for symbolic dims at `axes` of an operand that this form of the op cannot take."""
    shape = ctx.in_types[operand].shape
    bad = [a for a in axes if shape[a] < 0]
    if bad:
        raise NotImplementedError(f"symbolic dimension {bad[0]} of operand {operand} "
                                  f"(shape {_spell(shape)}): {why}")


def _spell(shape: Sequence[int]) -> str:
    return "x".join("?" if d < 0 else str(d) for d in shape)
