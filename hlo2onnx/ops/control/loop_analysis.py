"""The loop analysis behind stablehlo.while's translation (control_flow.py): a compiler pass, not a rule.

It reads the StableHLO of a while loop and finds what makes its ONNX Loop lean:

* carried values the body passes through unchanged (the body reads the outer value instead);
* a counter that steps by one against a loop-invariant bound, which gives the Loop its trip count
  (static, or an affine expression of the initial values for fori_loop's traced bounds);
* the buffers lax.scan stacks its outputs into (a dynamic_update_slice at row `counter` or
  `length - 1 - counter` of a buffer nothing else reads, every row written once), which become Loop
  scan outputs;
* body nodes that read only outer values, which are hoisted out of the loop.

It follows values through the private functions JAX calls (`dynamic_update_index_in_dim`,
`closed_call`), which the translator inlines.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx import host_calls
from hlo2onnx.builder import Builder
from hlo2onnx.ops.core.shape import reshape_to
from hlo2onnx.translator import Translator
from hlo2onnx.types import is_token, tensor_type

# Ops that draw a new value per run: never hoisted out of a loop.
_RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli"})

# A position in the inlined program: a value and the func.call ops (outermost first) it sits inside.
Frames = tuple  # tuple[mlir.Operation, ...]
# Affine integer expression over the loop's block arguments: ({arg_index: coefficient}, constant).
Affine = tuple  # tuple[dict[int, int], int]


# -- subgraphs ---------------------------------------------------------------------------------------------
def hoist_invariants(sb: Builder, b: Builder, body_inputs: Sequence[ir.Value]) -> None:
    """Moves the body nodes that read only outer values out of the loop: each would compute the same result
    every iteration (broadcast constants, casts of loop-invariant operands)."""
    local = set(body_inputs)
    hoisted: list[ir.Node] = []
    for node in list(sb.graph):
        # A nested Loop/If may read this body's values from its own subgraph: it stays.
        nested = any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())
        # A callback runs once per iteration under jax.jit too (its function may count or print).
        # An If's condition stays too: ORT 1.31-1.32 lost one hoisted out of a Loop that is itself inside an If
        # branch ("Missing Input" at the If, at every optimization level; diffrax's event solve,
        # tests/test_host_callbacks.py). A small model of that shape ran, so the exact trigger is unknown.
        if nested or node.op_type in _RANDOM or host_calls.is_host_call(node) \
                or any(v in local for v in node.inputs if v is not None) or _if_condition(node):
            local.update(node.outputs)
        else:  # names from the body's namer would clash in the outer graph
            sb.graph.remove(node)
            node.name = f"{sb.graph.name}/hoisted{len(hoisted)}"
            for i, value in enumerate(node.outputs):
                value.name = f"{node.name}_{i}"
            b.graph.append(node)
            hoisted.append(node)


def _if_condition(node: ir.Node) -> bool:
    return any(user.op_type == "If" and user.domain == "" and index == 0
               for value in node.outputs for user, index in value.uses())


# -- following values through inlined calls ------------------------------------------------------------------
def op_name(op) -> str:
    return op.operation.name  # OpView.name can be an attribute (func.func's sym_name)


def _step_out(value: mlir.Value, frames: Frames, translator: Translator):
    """Moves `value` across call boundaries until it is an op result or an argument of the loop's own block."""
    while True:
        if isinstance(value, mlir.BlockArgument) and frames:
            call = frames[-1]
            value, frames = call.operands[value.arg_number], frames[:-1]
        elif isinstance(value, mlir.OpResult) and op_name(value.owner) == "func.call":
            call = value.owner.operation
            callee = translator.functions[mlir.FlatSymbolRefAttr(call.attributes["callee"]).value]
            ret = list(callee.regions[0].blocks[0].operations)[-1]
            value, frames = ret.operands[value.result_number], frames + (call,)
        else:
            return value, frames


def int_constant(value: mlir.Value) -> int | None:
    """The value of an integer scalar constant (never reads a large constant's data)."""
    if (not isinstance(value, mlir.OpResult) or op_name(value.owner) != "stablehlo.constant"
            or mlir.RankedTensorType(value.type).shape):
        return None
    array = np.array(value.owner.attributes["value"])
    if array.size != 1 or array.dtype.kind not in "iu":
        return None
    return int(array.reshape(()))


@dataclass
class _Reader:
    """Reads integer values of a loop region as affine functions of its block arguments."""

    block: mlir.Block
    translator: Translator
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)  # argument -> (first, last) value

    def affine(self, value: mlir.Value, frames: Frames = ()) -> Affine | None:
        value, frames = _step_out(value, frames, self.translator)
        if not _is_int(value):
            return None
        if isinstance(value, mlir.BlockArgument):
            return ({value.arg_number: 1}, 0) if not frames and value.owner == self.block else None
        constant = int_constant(value)
        if constant is not None:
            return {}, constant
        op = value.owner
        if op_name(op) == "stablehlo.convert":
            return self.affine(op.operands[0], frames)
        if op_name(op) in ("stablehlo.add", "stablehlo.subtract"):
            lhs, rhs = (self.affine(x, frames) for x in op.operands)
            if lhs is None or rhs is None:
                return None
            sign = 1 if op_name(op) == "stablehlo.add" else -1
            coefs = dict(lhs[0])
            for k, c in rhs[0].items():
                coefs[k] = coefs.get(k, 0) + sign * c
            return {k: c for k, c in coefs.items() if c}, lhs[1] + sign * rhs[1]
        if op_name(op) == "stablehlo.select":
            # JAX's negative-index wrap, select(i < 0, i + n, i): just i when i never goes negative.
            pred, _, on_false = op.operands
            index = self.affine(on_false, frames)
            pred, pred_frames = _step_out(pred, frames, self.translator)
            if index is None or not isinstance(pred, mlir.OpResult) or op_name(pred.owner) != "stablehlo.compare":
                return None
            compare = pred.owner
            lhs, rhs = compare.operands
            if (_direction(compare) == "LT" and self.affine(lhs, pred_frames) == index
                    and self.affine(rhs, pred_frames) == ({}, 0) and self.lowest(index) >= 0):
                return index
        return None

    def lowest(self, expr: Affine) -> float:
        """The least value `expr` takes over the loop's iterations (-inf when unknown)."""
        low = expr[1]
        for k, c in expr[0].items():
            if k not in self.ranges:
                return -np.inf
            low += min(c * v for v in self.ranges[k])
        return low


def _is_int(value: mlir.Value) -> bool:
    # Tokens (ordered host callbacks) are no tensors.
    return not is_token(value.type) and \
        isinstance(mlir.RankedTensorType(value.type).element_type, mlir.IntegerType)


def _direction(compare: mlir.Operation) -> str:
    return stablehlo.ComparisonDirectionAttr(compare.attributes["comparison_direction"]).value


def _feeds_only(value: mlir.Value, frames: Frames, target: tuple, translator: Translator) -> bool:
    """Whether every use of `value` is operand 0 of `target` (an op and its frames), looking into calls."""
    for use in value.uses:
        owner = use.owner
        if op_name(owner) == "func.call":
            callee = translator.functions[mlir.FlatSymbolRefAttr(owner.attributes["callee"]).value]
            arg = callee.regions[0].blocks[0].arguments[use.operand_number]
            if not _feeds_only(arg, frames + (owner.operation,), target, translator):
                return False
        elif not (use.operand_number == 0 and (owner.operation, frames) == target):
            return False
    return True


def _yielded_only_at(value: mlir.Value, frames: Frames, position: int) -> bool:
    """Whether `value` is used only by returns that carry it out as the loop body's result `position`."""
    for use in value.uses:
        owner = use.owner
        if op_name(owner) == "func.return" and frames:
            call = frames[-1]
            if not _yielded_only_at(call.results[use.operand_number], frames[:-1], position):
                return False
        elif not (op_name(owner) == "stablehlo.return" and not frames and use.operand_number == position):
            return False
    return True


# -- the loop plan -----------------------------------------------------------------------------------------
@dataclass
class _Scan:
    reverse: bool
    dus: mlir.Operation
    frames: Frames


@dataclass
class LoopPlan:
    invariant: set[int] = field(default_factory=set)
    trip: int | None = None  # static trip count, when a counter against a constant bounds the loop
    count: Affine | None = None  # else the trip count max(0, count) over the carried values' initial values
    scans: dict[int, _Scan] = field(default_factory=dict)  # carried index -> the stacking write


def plan_loop(op: mlir.Operation, translator: Translator) -> LoopPlan:
    cond, body = (r.blocks[0] for r in op.regions)
    yields = list(list(body.operations)[-1].operands)
    plan = LoopPlan(invariant={k for k, v in enumerate(yields) if v == body.arguments[k]})
    # Counters: +1 per iteration. `starts` holds those that start at a constant.
    reader = _Reader(body, translator)
    counters = {k for k, out in enumerate(yields) if reader.affine(out) == ({k: 1}, 1)}
    starts = {k: int_constant(op.operands[k]) for k in counters}
    starts = {k: v for k, v in starts.items() if v is not None}
    compare = _step_out(list(cond.operations)[-1].operands[0], (), translator)[0]
    if not counters or not isinstance(compare, mlir.OpResult) or op_name(compare.owner) != "stablehlo.compare":
        return plan
    compare = compare.owner
    if _direction(compare) != "LT":
        return plan
    lhs, rhs = (_Reader(cond, translator).affine(x) for x in compare.operands)
    if lhs is None or rhs is None or len(lhs[0]) != 1:
        return plan
    (k, coef), = lhs[0].items()
    # counter + c0 < bound + c1 with a loop-invariant bound: the loop runs max(0, bound + c1 - c0 - start) times.
    if coef != 1 or k not in counters or not set(rhs[0]) <= plan.invariant:
        return plan
    count = ({**rhs[0], k: -1}, rhs[1] - lhs[1])
    if any(tensor_type(op.operands[j].type).dtype == np.uint64 for j in count[0]):
        return plan  # the count is computed in int64
    if k in starts:
        count = ({j: c for j, c in count[0].items() if j != k}, count[1] - starts[k])
    if count[0]:  # traced bounds (fori_loop(lo, n)): the count is computed once, before the loop
        plan.count = count
        return plan
    plan.trip = max(0, count[1])
    reader.ranges = {k: (s, s + plan.trip - 1) for k, s in starts.items()}
    for j, out in enumerate(yields):
        if j not in plan.invariant and j not in counters:
            scan = _stacking_write(op, reader, j, out, starts, plan.trip)
            if scan is not None:
                plan.scans[j] = scan
    return plan


def _stacking_write(op, reader: _Reader, j: int, out: mlir.Value, starts: dict[int, int], trip: int) -> _Scan | None:
    """The dynamic_update_slice that writes row t (or trip-1-t) of carried buffer `j` at iteration t, if any."""
    body, translator = reader.block, reader.translator
    if is_token(op.operands[j].type):
        return None  # a token
    shape = tuple(mlir.RankedTensorType(op.operands[j].type).shape)
    if trip == 0 or not shape or shape[0] != trip:
        return None
    value, frames = _step_out(out, (), translator)
    if not isinstance(value, mlir.OpResult) or op_name(value.owner) != "stablehlo.dynamic_update_slice":
        return None
    dus = value.owner.operation
    update_shape = tuple(mlir.RankedTensorType(dus.operands[1].type).shape)
    if update_shape != (1,) + shape[1:]:
        return None
    if min(shape[1:], default=0) < 0 and not _same_dims(dus.operands[1], frames, op.operands[j], (), translator):
        # A symbolic row dim of the update may be a smaller dim than the buffer's (an update of (1, s) into
        # (trip, t)): yielded as the row, it would make the result (trip, s).
        return None
    if _step_out(dus.operands[0], frames, translator) != (body.arguments[j], ()):
        return None
    index, *rest = (reader.affine(x, frames) for x in dus.operands[2:])
    if index is None or any(r != ({}, 0) for r in rest) or len(index[0]) != 1:
        return None
    (k, coef), = index[0].items()
    if k not in starts or coef not in (1, -1):
        return None
    first = coef * starts[k] + index[1]  # the row written at iteration 0
    if (coef, first) not in ((1, 0), (-1, trip - 1)):
        return None
    target = (dus, frames)
    if not _feeds_only(body.arguments[j], (), target, translator) or not _yielded_only_at(value, frames, j):
        return None
    return _Scan(coef == -1, dus, frames)


def _same_dims(a: mlir.Value, a_frames: Frames, b: mlir.Value, b_frames: Frames, translator: Translator) -> bool:
    """Whether the trailing dims of `a` and `b` (the leading one may differ) are known equal: both computed by
    a dynamic broadcast or reshape to sizes that are the same constants and dimension variables (jax's scan
    makes its buffer and each row so)."""
    dims = [_spelled_dims(v, f, translator) for v, f in ((a, a_frames), (b, b_frames))]
    return None not in dims and len(dims[0]) == len(dims[1]) and all(
        isinstance(x, int) == isinstance(y, int) and x == y for x, y in zip(dims[0][1:], dims[1][1:]))


def _spelled_dims(value: mlir.Value, frames: Frames, translator: Translator) -> list | None:
    """The sizes a dynamic_broadcast_in_dim or dynamic_reshape gives `value`: ints, and for symbolic ones the
    scalar value that holds the size (a dimension variable, followed out of inlined calls); None otherwise."""
    value, frames = _step_out(value, frames, translator)
    if not isinstance(value, mlir.OpResult) or op_name(value.owner) not in (
            "stablehlo.dynamic_broadcast_in_dim", "stablehlo.dynamic_reshape"):
        return None
    return _entries(value.owner.operands[1], frames, translator)


def _entries(value: mlir.Value, frames: Frames, translator: Translator) -> list | None:
    """The entries of a 1-D shape tensor that jax builds by concatenating constants and reshaped sizes."""
    value, frames = _step_out(value, frames, translator)
    if isinstance(value, mlir.OpResult):
        name = op_name(value.owner)
        if name == "stablehlo.constant":
            array = np.array(value.owner.attributes["value"])
            return [int(v) for v in array.reshape(-1)] if array.dtype.kind in "iu" else None
        if name == "stablehlo.concatenate":
            parts = [_entries(x, frames, translator) for x in value.owner.operands]
            return None if None in parts else [e for part in parts for e in part]
        if name in ("stablehlo.reshape", "stablehlo.convert"):
            inner = value.owner.operands[0]
            if mlir.RankedTensorType(inner.type).shape:
                return _entries(inner, frames, translator) if name == "stablehlo.convert" else None
            size, size_frames = _step_out(inner, frames, translator)
            while isinstance(size, mlir.OpResult) and op_name(size.owner) == "stablehlo.convert":
                size, size_frames = _step_out(size.owner.operands[0], size_frames, translator)
            constant = int_constant(size)
            return [constant if constant is not None else size]
    return None


def scan_overrides(plan: LoopPlan, translator: Translator) -> dict:
    """emit_block overrides that turn each stacking write into "yield this row" (descending into calls)."""
    tree: dict = {}
    for scan in plan.scans.values():
        node = tree
        for call in scan.frames:
            node = node.setdefault(call.results[0], {})
        node[scan.dus.results[0]] = _row_of(scan.dus)

    def build(node: dict) -> dict:
        return {key: _inline_with(key.owner.operation, build(sub), translator) if isinstance(sub, dict) else sub
                for key, sub in node.items()}

    return build(tree)


def _row_of(dus: mlir.Operation) -> Callable:
    row = tensor_type(dus.results[0].type).storage.shape[1:]  # complex rows are float pairs

    def emit(b: Builder, inputs: list[ir.Value]) -> list[ir.Value]:
        if min(row, default=0) < 0:  # symbolic dims in the row: drop the unit axis instead of spelling them
            return [b.op("Squeeze", inputs[1], b.shape_const([0]))]
        return [reshape_to(b, inputs[1], row)]

    return emit


def _inline_with(call: mlir.Operation, overrides: dict, translator: Translator) -> Callable:
    callee = translator.functions[mlir.FlatSymbolRefAttr(call.attributes["callee"]).value]

    def emit(b: Builder, inputs: list[ir.Value]) -> list[ir.Value]:
        return translator.emit_block(callee.regions[0].blocks[0], inputs, b, overrides)

    return emit
