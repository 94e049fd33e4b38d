"""stablehlo.while -> Loop, stablehlo.case / stablehlo.if -> If.

A while loop becomes one ONNX Loop whose body also evaluates the cond region
on the new carried values. These rewrites keep the loop lean:

* carried values the body passes through unchanged are not carried: the body
  reads the outer value (ONNX subgraphs see their enclosing scopes);
* a counter that steps by one and is compared against a loop-invariant bound
  gives the Loop its trip count (static, or computed once before the loop for
  fori_loop's traced bounds), so the cond is not evaluated per step; a static
  trip count of one inlines the body, of zero passes the initial values on;
* body nodes that read only outer values are hoisted out of the loop;
* the buffers lax.scan stacks its outputs into (a dynamic_update_slice at row
  `counter` or `length - 1 - counter` of a buffer nothing else reads, every row
  written once) become Loop scan outputs: the body yields one row and ONNX
  Runtime stacks them, instead of copying the whole buffer every iteration.

The analysis that finds these is a pass of its own: loop_analysis.py.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir

from hlo2onnx.builder import Builder, graph_input
from hlo2onnx.ops.control.loop_analysis import hoist_invariants, int_constant, op_name, plan_loop, scan_overrides
from hlo2onnx.registry import allow_dynamic, register
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import TensorType, set_type

_INT64_MIN = np.iinfo(np.int64).min
_SCALAR_I64 = TensorType((), np.dtype(np.int64))
_SCALAR_BOOL = TensorType((), np.dtype(np.bool_))
# Loop and If carry symbolic dims as they are; the ops of their bodies are checked one by one.
allow_dynamic("stablehlo.while", "stablehlo.case", "stablehlo.if")


# -- rules -------------------------------------------------------------------------------------------------
@register("stablehlo.while")
def while_(ctx: RuleContext, *inits):
    tr, b = ctx.translator, ctx.b
    cond, body = (r.blocks[0] for r in ctx.hlo_op.regions)
    plan = plan_loop(ctx.hlo_op, tr)
    if plan.scans and not b.target.supports("Loop:scan", np.dtype(np.int64)) \
            and all(len(ctx.out_types[k].shape) > 1 for k in plan.scans):
        # The target takes no scan outputs (IREE): lax.scan's buffers stay carried values, written a row per
        # iteration as jax wrote them, and the Loop keeps its trip count. Not for scalar rows, whose writes
        # iree-compile 3.13 fails to legalize inside a Loop (measured): that loop stays refused.
        plan.scans = {}
    if plan.trip is not None and plan.trip <= 1:
        # As XLA's while-loop simplifier does: no loop for zero or one iteration (an ORT Loop costs a
        # subgraph run and copies of the carried values even for one step).
        return tr.emit_block(body, list(inits), b) if plan.trip == 1 else list(inits)
    n = len(inits)
    carried = [k for k in range(n) if k not in plan.invariant and k not in plan.scans]
    sb = b.subgraph("while_body")
    iteration, cond_in = graph_input(_SCALAR_I64), graph_input(_SCALAR_BOOL)
    carried_in = {k: graph_input(ctx.in_types[k]) for k in carried}
    # A scan buffer's block argument only feeds its overridden write: the outer value stands in.
    yields = tr.emit_block(body, [carried_in.get(k, inits[k]) for k in range(n)], sb, scan_overrides(plan, tr))
    # With a trip count the cond input stays true, and passing it on costs no node.
    cond_out, cond_init = cond_in, None
    if plan.trip is not None:
        trip = b.const(np.int64(plan.trip))
    elif plan.count is not None:
        trip = b.const(np.int64(plan.count[1]))
        for j, coef in plan.count[0].items():
            trip = b.op("Add" if coef > 0 else "Sub", trip, _scaled(b, b.cast(inits[j], np.int64), abs(coef)))
        trip = b.op("Max", trip, b.const(np.int64(0)))
    else:
        cond_out = tr.emit_block(cond, [yields[k] if k in carried_in else inits[k] for k in range(n)], sb)[0]
        trip, cond_init = None, tr.emit_block(cond, list(inits), b)[0]
    scans = list(plan.scans)
    row_types = [TensorType(ctx.out_types[k].shape[1:], ctx.out_types[k].dtype) for k in scans]
    hoist_invariants(sb, b, [iteration, cond_in, *carried_in.values()])
    graph = sb.finish_subgraph([iteration, cond_in, *carried_in.values()],
                             [cond_out, *(yields[k] for k in carried), *(yields[k] for k in scans)],
                             [_SCALAR_BOOL, *(ctx.in_types[k] for k in carried), *row_types])
    outs = b.ops("Loop", trip, cond_init, *(inits[k] for k in carried), body=graph,
                 num_outputs=len(carried) + len(scans))
    results = list(inits)
    for k, value in zip(carried + scans, outs):
        set_type(value, ctx.out_types[k])
        results[k] = value
    for k in scans:
        if plan.scans[k].reverse:  # ONNX stacks in iteration order; the scan wrote rows from the end
            results[k] = b.op("Slice", results[k], b.shape_const([-1]), b.shape_const([_INT64_MIN]),
                              b.shape_const([0]), b.shape_const([-1]))
    return results


def _scaled(b: Builder, x: ir.Value, factor: int) -> ir.Value:
    return x if factor == 1 else b.op("Mul", x, b.const(np.int64(factor)))


def _branch(ctx: RuleContext, block: mlir.Block, name: str) -> ir.Graph:
    sb = ctx.b.subgraph(name)
    outs = ctx.translator.emit_block(block, [], sb)
    return sb.finish_subgraph([], outs, ctx.out_types)


@register("stablehlo.if")
def if_(ctx: RuleContext, pred):
    then_block, else_block = (r.blocks[0] for r in ctx.hlo_op.regions)
    return ctx.b.ops("If", pred, then_branch=_branch(ctx, then_block, "if_true"),
                     else_branch=_branch(ctx, else_block, "if_false"), num_outputs=len(ctx.out_types))


@register("stablehlo.case")
def case(ctx: RuleContext, index):
    """Branch `index`, or the last branch when `index` is out of range: a balanced tree of Ifs."""
    b = ctx.b
    blocks = [r.blocks[0] for r in ctx.hlo_op.regions]
    count = len(blocks)
    if count == 1:
        return ctx.translator.emit_block(blocks[0], [], b)
    if count == 2:  # any index but 0 takes the last branch
        return b.ops("If", b.cast(index, np.bool_), then_branch=_branch(ctx, blocks[1], "case_1"),
                     else_branch=_branch(ctx, blocks[0], "case_0"), num_outputs=len(ctx.out_types))
    if not _clamped(ctx.hlo_op.operands[0], count):
        last = b.const(count - 1, np.int32)
        outside = b.op("Or", b.op("Less", index, b.const(0, np.int32)),
                       b.op("Greater", index, last))
        index = b.op("Where", outside, last, index)
    return _case_tree(ctx, b, index, blocks, 0, count)


def _case_tree(ctx: RuleContext, b: Builder, index: ir.Value, blocks, lo: int, hi: int):
    if hi - lo == 1:
        return ctx.translator.emit_block(blocks[lo], [], b)
    mid = (lo + hi) // 2
    halves = []
    for start, stop in ((lo, mid), (mid, hi)):
        sb = b.subgraph(f"case_{start}_{stop - 1}")
        halves.append(sb.finish_subgraph([], _case_tree(ctx, sb, index, blocks, start, stop), ctx.out_types))
    return b.ops("If", b.op("Less", index, b.const(mid, np.int32)), then_branch=halves[0], else_branch=halves[1],
                 num_outputs=len(ctx.out_types))


def _clamped(index: mlir.Value, count: int) -> bool:
    """Whether `index` is a clamp to [0, count-1], as lax.switch emits before its case op."""
    if not isinstance(index, mlir.OpResult) or op_name(index.owner) != "stablehlo.clamp":
        return False
    low, _, high = index.owner.operands
    return int_constant(low) == 0 and int_constant(high) == count - 1
