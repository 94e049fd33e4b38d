"""The plan gather and scatter share (gather.py, scatter.py; dynamic_slice.py uses its start-index helpers).

The start indices become an int64 matrix `batch + [K]` (`Starts`), batching dims become iota columns, windows
wider than one element add constant offsets, and a single ONNX Gather/GatherElements/GatherND (or
ScatterElements/ScatterND) runs on the operand with its indexed dims moved first. Axes are tracked as labels,
("b", j) for batch axis j of the indices and ("o", d) for operand dim d, so one transpose + reshape gives
StableHLO's result layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import onnx_ir as ir

from hlo2onnx.ops.core import dims as symbolic
from hlo2onnx.ops.core.shape import reshape_to, transpose_to

I64 = np.dtype(np.int64)
Label = tuple[str, int]


# -- start indices ----------------------------------------------------------------
@dataclass
class Starts:
    """Start indices as `matrix` (int64, `batch` + [len(dims)]); column k indexes operand dim dims[k].

    `pairs` are the batching dims: (operand dim, batch axis of the indices).
    """

    matrix: ir.Value
    batch: list[int]
    dims: list[int]
    pairs: list[tuple[int, int]]
    const: np.ndarray | None  # the matrix's values when the indices are a constant


def read_starts(b, indices: ir.Value, shape: Sequence[int], index_vector_dim: int, index_map: Sequence[int],
            operand_batching: Sequence[int], indices_batching: Sequence[int]) -> Starts:
    rank = len(shape)
    if index_vector_dim == rank:
        batch = list(shape)
        matrix = b.op("Unsqueeze", indices, b.shape_const([rank]))
    else:
        batch = [n for i, n in enumerate(shape) if i != index_vector_dim]
        matrix = transpose_to(b, indices, [i for i in range(rank) if i != index_vector_dim] + [index_vector_dim])
    const = None
    if indices.const_value is not None:
        array = indices.const_value.numpy().astype(np.int64)
        const = array[..., None] if index_vector_dim == rank else np.moveaxis(array, index_vector_dim, -1)
    pairs = [(d, axis if axis < index_vector_dim else axis - 1)
             for d, axis in zip(operand_batching, indices_batching)]
    return Starts(b.cast(matrix, I64), batch, list(index_map), pairs, const)


def with_batching_columns(b, s: Starts) -> tuple[ir.Value, list[int]]:
    """The matrix with one iota column per batching dim, and the operand dim of every column."""
    columns, dims = [s.matrix], list(s.dims)
    for d, j in s.pairs:
        aligned = [-1 if i == j else 1 for i in range(len(s.batch))] + [1]
        if symbolic.is_static(s.batch):
            iota = b.const(np.arange(s.batch[j], dtype=np.int64).reshape(aligned))
            columns.append(b.op("Expand", iota, b.shape_const(s.batch + [1])))
        else:  # a symbolic batch: the iota's length and the broadcast shape read from the matrix
            n = b.op("Squeeze", b.op("Shape", s.matrix, start=j, end=j + 1))
            iota = reshape_to(b, b.op("Range", b.const(np.int64(0)), n, b.const(np.int64(1))), aligned)
            full = symbolic.shape_value(b, symbolic.dims(b, s.matrix, s.batch) + [1])
            columns.append(b.op("Expand", iota, full))
        dims.append(d)
    return (b.op("Concat", *columns, axis=-1) if len(columns) > 1 else s.matrix), dims


def known_within(s: Starts, high: Sequence[symbolic.Dim]) -> bool:
    """Whether every start column is known to lie in [0, high] (no columns, or constant indices)."""
    if not s.dims:
        return True
    if not all(isinstance(h, int) for h in high):
        return False
    return s.const is not None and bool(((s.const >= 0) & (s.const <= np.asarray(high))).all())


def start_bounds(b, operand: ir.Value, shape: Sequence[int], sizes: Sequence[symbolic.Dim], dims: Sequence[int]):
    """The largest start of each of `dims` whose window still fits (`dim - size`): an int, or a 1-element
    int64 tensor where the operand's dim or the size (a dynamic_gather's) is symbolic."""
    high: list[symbolic.Dim] = []
    for d in dims:
        if isinstance(sizes[d], int) and sizes[d] < 0:
            raise NotImplementedError(f"a window of symbolic size along indexed dimension {d}")
        high.append(symbolic.difference(b, symbolic.dim(b, operand, d, shape[d]), sizes[d]))
    return high


def bounds_value(b, high: Sequence[symbolic.Dim]) -> ir.Value:
    """`high` (start_bounds) as one int64 tensor: a constant, or assembled from the symbolic entries."""
    return b.const(np.asarray(high, np.int64)) if all(isinstance(h, int) for h in high) \
        else symbolic.shape_value(b, high)


def starts_fit(b, s: Starts, high: Sequence[int]) -> ir.Value | None:
    """Bool of shape `batch`: every start column lies in [0, high]; None when that is known statically."""
    if known_within(s, high):
        return None
    ok = b.op("And", b.op("GreaterOrEqual", s.matrix, b.const(np.zeros(1, I64))),
              b.op("LessOrEqual", s.matrix, bounds_value(b, high)))
    if len(s.dims) == 1:
        if sum(n < 0 for n in s.batch) > 1:  # as single_column: a Reshape spells one symbolic dim
            return b.op("Squeeze", ok, b.shape_const([len(s.batch)]))
        return reshape_to(b, ok, s.batch)
    return b.op("ReduceMin", ok, b.shape_const([-1]), keepdims=0)


def clamp_starts(b, starts: ir.Value, high: Sequence[int]) -> ir.Value:
    """XLA's clamp of start indices into [0, high] (high = dim - slice size)."""
    clipped = b.op("Min", starts, bounds_value(b, high))
    return b.op("Max", clipped, b.const(np.zeros(1, I64)))


def window_offsets(b, starts: ir.Value, batch: list[int], sizes: Sequence[symbolic.Dim]) -> ir.Value:
    """starts (batch + [K]) plus every offset of a window of `sizes` (one per column; a symbolic size is a
    1-element int64 tensor).

    Gives batch + [sizes above 1, and symbolic ones] + [K]: only windows wider than one element get an axis.
    """
    wide = [k for k, n in enumerate(sizes) if not isinstance(n, int) or n > 1]
    if not wide:
        return starts
    if all(isinstance(n, int) for n in sizes):
        grid = np.indices([sizes[k] for k in wide], dtype=np.int64)
        offsets = np.zeros([sizes[k] for k in wide] + [len(sizes)], np.int64)
        for axis, k in enumerate(wide):
            offsets[..., k] = grid[axis]
    else:  # each column's offsets a run-time Range along its own axis, broadcast into the grid by the sums
        offsets = None
        for axis, k in enumerate(wide):
            aligned = [1] * axis + [-1] + [1] * (len(wide) - axis - 1) + [1]
            if isinstance(sizes[k], int):
                line = b.const(np.arange(sizes[k], dtype=np.int64).reshape(aligned))
            else:
                n = b.op("Squeeze", sizes[k], b.shape_const([0]))
                line = reshape_to(b, b.op("Range", b.const(np.int64(0)), n, b.const(np.int64(1))), aligned)
            column = b.op("Mul", line, b.const(np.eye(len(sizes), dtype=np.int64)[k]))
            offsets = column if offsets is None else b.op("Add", offsets, column)
    if symbolic.is_static(batch):
        starts = reshape_to(b, starts, batch + [1] * len(wide) + [len(sizes)])
    else:
        starts = b.op("Unsqueeze", starts, b.shape_const(list(range(len(batch), len(batch) + len(wide)))))
    return b.op("Add", starts, b.const(offsets) if isinstance(offsets, np.ndarray) else offsets)


# -- layout -------------------------------------------------------------------------
def arrange(b, x: ir.Value, labels: list[Label], target: list[Label], out_shape: Sequence[int]) -> ir.Value:
    """Transposes `x` (axes named by `labels`) into `target` order; axes in only one of them have size 1."""
    present = [label for label in target if label in labels]
    perm = [labels.index(label) for label in present] + [i for i, lb in enumerate(labels) if lb not in target]
    x = transpose_to(b, x, perm)
    if present != target or len(labels) != len(target):
        # Only unit axes come and go: symbolic sizes are read from x's own axes.
        parts = [symbolic.dim(b, x, present.index(label), n) if label in present else n
                 for label, n in zip(target, out_shape)]
        x = symbolic.reshape(b, x, parts)
    return x


def axis_labels(rank: int, window_axes: Sequence[int], window_dims: Sequence[int]) -> list[Label]:
    """Axis labels of a gather result or scatter update: window axes carry operand dims, the rest batch axes."""
    window = dict(zip(window_axes, window_dims))
    batch = iter(range(rank))
    return [("o", window[axis]) if axis in window else ("b", next(batch)) for axis in range(rank)]


def crop(b, x: ir.Value, shape: Sequence[int], sizes: Sequence[symbolic.Dim], dims: Sequence[int]) -> ir.Value:
    """x[0:sizes[d]] along each of `dims` narrower than the operand (or not known not to be: symbolic)."""
    axes = [d for d in dims if not isinstance(sizes[d], int) or shape[d] < 0 or sizes[d] < shape[d]]
    if not axes:
        return x
    return b.op("Slice", x, b.shape_const([0] * len(axes)), symbolic.shape_value(b, [sizes[d] for d in axes]),
                b.shape_const(axes))


def elements_form(s: Starts, rank: int, window: Sequence[int]) -> tuple[int, list[int | None]] | None:
    """(axis, batch axis per operand dim) when GatherElements/ScatterElements fit, else None.

    They fit when one start column picks single elements along `axis`, every other operand dim is a
    batching dim, and at most one batch axis is left over: it runs along `axis` (None: a new unit axis).
    """
    if len(s.dims) != 1 or window[s.dims[0]] != 1 or len(s.pairs) != rank - 1:
        return None
    axis = s.dims[0]
    paired = dict(s.pairs)
    free = [j for j in range(len(s.batch)) if j not in paired.values()]
    if len(free) > 1:
        return None
    return axis, [paired[d] if d != axis else (free[0] if free else None) for d in range(rank)]


def operand_order(b, x: ir.Value, batch: list[int], order: list[int | None]) -> ir.Value:
    """x (shaped `batch`) with its axes put in operand order: axis d of the result is batch axis order[d]."""
    if None in order:
        x = b.op("Unsqueeze", x, b.shape_const([len(batch)]))
    return transpose_to(b, x, [len(batch) if j is None else j for j in order])


def single_column(b, s: Starts) -> ir.Value:
    """The single-column matrix shaped `batch`."""
    if sum(n < 0 for n in s.batch) > 1:
        return b.op("Squeeze", s.matrix, b.shape_const([len(s.batch)]))
    return reshape_to(b, s.matrix, s.batch)
