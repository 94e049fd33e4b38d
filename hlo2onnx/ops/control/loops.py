"""ONNX Loops built from Python bodies (`loop`, `loop_until`), for rules whose computation is a loop over
whole batches: the LAPACK routines (linalg/), scatter in order (indexing/), fmod's exact long division
(elementwise/). stablehlo.while itself is control_flow.py."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import onnx_ir as ir

from hlo2onnx.builder import Builder, graph_input
from hlo2onnx.ops.core.shape import reshape_to
from hlo2onnx.types import TensorType, set_type

_I64 = TensorType((), np.dtype(np.int64))
_BOOL = TensorType((), np.dtype(np.bool_))
# (loop builder, step, carried values) -> (new carried values, rows of the scan outputs)
Body = Callable[[Builder, ir.Value, list[ir.Value]], tuple[Sequence[ir.Value], Sequence[ir.Value]]]


def loop_step(b: Builder, k: ir.Value) -> ir.Value:
    """The loop step as a one-element index: Gather with it keeps the gathered axis."""
    return reshape_to(b, k, [1])


def _loop(b: Builder, name: str, trip: int | ir.Value, go_on: ir.Value | None, inits: Sequence[ir.Value],
          types: Sequence[TensorType], row_types: Sequence[TensorType], body) -> list[ir.Value]:
    """The ONNX Loop both builders below make; `body(sb, step, cond, carried)` -> (flag, outs, rows). A trip
    count known only at run time (an int64 scalar value) takes no scan outputs."""
    if isinstance(trip, ir.Value) and row_types:
        raise ValueError("a Loop with a run-time trip count stacks no rows")
    sb = b.subgraph(name)
    step, cond = graph_input(_I64), graph_input(_BOOL)
    carried = [graph_input(t) for t in types]
    flag, outs, rows = body(sb, step, cond, carried)
    graph = sb.finish_subgraph([step, cond, *carried], [flag, *outs, *rows], [_BOOL, *types, *row_types])
    trip_count = trip if isinstance(trip, ir.Value) else b.const(np.int64(trip))
    results = b.ops("Loop", trip_count, go_on, *inits, body=graph,
                    num_outputs=len(types) + len(row_types))
    stacked = [TensorType((trip, *t.shape), t.dtype) for t in row_types]
    for value, ttype in zip(results, [*types, *stacked]):
        set_type(value, ttype)
    return list(results)


def loop(b: Builder, name: str, trip: int | ir.Value, inits: Sequence[ir.Value], types: Sequence[TensorType],
         body: Body, row_types: Sequence[TensorType] = ()) -> list[ir.Value]:
    """An ONNX Loop of `trip` steps (a constant, or an int64 scalar computed at run time) carrying `inits`; scan
    outputs stack the rows `body` yields."""
    def steps(sb, step, cond, carried):
        outs, rows = body(sb, step, carried)
        return cond, outs, rows
    return _loop(b, name, trip, None, inits, types, row_types, steps)


# (loop builder, step, carried values) -> (new carried values, whether to go on: a bool scalar)
Until = Callable[[Builder, ir.Value, list[ir.Value]], tuple[Sequence[ir.Value], ir.Value]]


def loop_until(b: Builder, name: str, trip: int, go_on: ir.Value, inits: Sequence[ir.Value],
               types: Sequence[TensorType], body: Until) -> list[ir.Value]:
    """An ONNX Loop of at most `trip` steps carrying `inits`, run while `go_on` (then the body's flag) holds."""
    def steps(sb, step, cond, carried):
        outs, flag = body(sb, step, carried)
        return flag, outs, []
    return _loop(b, name, trip, go_on, inits, types, (), steps)
