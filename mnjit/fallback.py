"""Partitioned execution, `mnjit(f, fallback=True)`: what the target runs goes to ONNX, the rest to jax.jit.

The function is traced to a jaxpr once per signature. When the whole function
translates for the target, it runs as one ONNX model, exactly as without
fallback. Otherwise calls into jitted sub-functions (pjit, custom_jvp/vjp) are
inlined, each equation is classified by translating it alone (cached by
primitive, params and avals), and the equations are scheduled so that runs of
the same placement are as long as the data dependencies allow. Each run becomes
one partition: an ONNX model on the target (or on a target of its fallback
chain), or the run's sub-jaxpr for XLA.

A plan runs in two ways (mnjit/partition_runner.py): traced whole inside mnjit's
fast-path jax.jit, or one partition at a time from Python. docs/fallback.md has
the design and measurements.

A higher-order equation (while, cond, scan) whose body holds an unsupported op
falls back whole: its body is not split.
"""
from __future__ import annotations

import heapq
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import jax.extend.core as jc
import numpy as np
import onnx
import onnx_ir as ir

import hlo2onnx
from hlo2onnx import targets as target_table
from hlo2onnx.errors import source_line
from mnjit import device, host_callbacks, persist, stages
from hlo2onnx.files import save_model

XLA = "xla"
# Call-like primitives whose body is evaluated as-is outside differentiation: inlined, so that one
# unsupported op inside a jitted helper does not send the whole helper to XLA. custom_jvp/vjp calls only
# run their primal body here (mnjit's tracer path hands grad/vmap to jax.jit before any partitioning).
_INLINE = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
           "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr"}

# (runner factory) target, model, in avals, out avals -> an object with run(leaves) -> list of arrays
MakeRunner = Callable[[hlo2onnx.Target, ir.Model, list, list], Any]


@dataclass
class FallbackOp:
    """One jaxpr equation the target could not run, where it was written, and why."""

    primitive: str
    where: str | None
    reason: str

    def __str__(self) -> str:
        return f"{self.primitive} at {self.where or '<unknown>'}: {self.reason}"


@dataclass
class Partition:
    """A maximal run of equations with one placement: a target's name, or "xla" for jax.jit."""

    runs_on: str
    closed: jc.ClosedJaxpr
    in_slots: tuple[int, ...]
    out_slots: tuple[int, ...]
    target: hlo2onnx.Target | None = None
    conversion: hlo2onnx.ConversionReport | None = None
    fell_back: list[FallbackOp] = field(default_factory=list)  # the ops not on the main target
    callbacks: host_callbacks.Registration | None = None  # keeps its Python host callbacks callable

    @property
    def is_onnx(self) -> bool:
        return self.runs_on != XLA


@dataclass
class PartitionedLowered(stages.TracedInfo):
    """One captured signature, split into ONNX partitions and jax.jit partitions (`report()` lists them)."""

    traced: Any
    target: hlo2onnx.Target
    partitions: list[Partition]
    n_slots: int
    constants: dict[int, Any]  # slot -> value for outputs that are constants or literals
    out_slots: tuple[int, ...]
    whole: bool  # the whole function is one ONNX model: nothing was split
    tier: Callable[[], Any] | None = None  # target="auto": which tier serves the signature (mnjit/tiering.py)
    compiler: Callable[[], Any] | None = None  # set by MnjitFunction.lower (mnjit/stages.py)

    def compile(self, compiler_options: dict | None = None):
        return stages.compile_lowered(self)

    @property
    def jaxpr(self):
        return self.traced.jaxpr

    def cost_analysis(self) -> Any:
        """jax's estimate for the whole program (jax.stages.Lowered.cost_analysis)."""
        return self.traced.lower().cost_analysis()

    @property
    def onnx_partitions(self) -> list[Partition]:
        return [p for p in self.partitions if p.is_onnx]

    @property
    def fell_back(self) -> list[FallbackOp]:
        return [op for p in self.partitions for op in p.fell_back]

    @property
    def model(self) -> ir.Model:
        """The ONNX model, when the function is a single ONNX partition."""
        if len(self.partitions) != 1 or not self.partitions[0].is_onnx:
            raise ValueError(f"the function runs as {len(self.partitions)} partitions, not one ONNX model; "
                             "see .partitions and .report()")
        return self.partitions[0].conversion.model

    @property
    def onnx_model(self) -> onnx.ModelProto:
        return ir.to_proto(self.model)

    def as_text(self, debug_info: bool = False) -> str:
        """The whole function's StableHLO (before splitting)."""
        return self.traced.lower().as_text(debug_info=debug_info)

    def save(self, path: str | os.PathLike, external_data: str | None = None) -> None:
        """Writes the model, when the function is a single ONNX partition (see MnjitLowered.save)."""
        host_callbacks.refuse_saving(self.partitions[0].callbacks if len(self.partitions) == 1 else None, self.model)
        save_model(self.model, path, external_data)

    def report(self) -> str:
        onnx_parts = self.onnx_partitions
        lines = [f"auto: {self.tier()}"] if self.tier is not None else []
        lines += [f"Target {self.target.name} with fallback: {len(onnx_parts)} ONNX partition(s), "
                 f"{len(self.partitions) - len(onnx_parts)} jax.jit partition(s), "
                 f"{len(self.fell_back)} op(s) fell back"]
        for i, part in enumerate(self.partitions, 1):
            eqns = len(part.closed.jaxpr.eqns)
            if part.is_onnx:
                nodes = sum(1 for _ in ir.traversal.RecursiveGraphIterator(part.conversion.model.graph))
                lines.append(f"- partition {i}: ONNX on {part.runs_on}, {eqns} jaxpr eqn(s) -> {nodes} ONNX node(s), "
                             f"{len(part.in_slots)} input(s), {len(part.out_slots)} output(s)")
            else:
                lines.append(f"- partition {i}: jax.jit (XLA), {eqns} jaxpr eqn(s)")
            lines += [f"    fell back: {op}" for op in part.fell_back]
        for i, part in enumerate(onnx_parts, 1):
            lines.append(f"ONNX partition {i} of {len(onnx_parts)} ({part.runs_on}):")
            lines += ["  " + line for line in str(part.conversion).splitlines()]
        return "\n".join(lines)


# -- planning -----------------------------------------------------------------------------------------
def plan(traced: Any, target: hlo2onnx.Target, opset: int, name: str) -> PartitionedLowered:
    """Splits a traced function (jax.jit(...).trace) into partitions for `target`."""
    closed = traced.jaxpr
    try:  # the whole function first: one model, no splitting, when the target runs all of it
        # Through the persistent cache, keyed on the trace first (a warm process's stored tier lowers nothing).
        translation, _ = persist.translate_trace(traced, target, opset, name)
        conversion, callbacks = translation.conversion, translation.callbacks
    except Exception:  # any refusal: classify op by op below (the per-op reasons go in the report)
        conversion = None
    if conversion is not None:
        n_in = len(closed.jaxpr.invars)
        part = Partition(target.name, closed, tuple(range(n_in)), tuple(range(n_in, n_in + len(closed.out_avals))),
                         target, conversion, callbacks=callbacks)
        return PartitionedLowered(traced, target, [part], n_in + len(closed.out_avals), {}, part.out_slots, True)
    return _split(traced, closed, target, opset, name)


def _chain(target: hlo2onnx.Target) -> list[hlo2onnx.Target]:
    """The target and the targets it names to run what it refuses (`fallback_chain`, when Target has one),
    leaving out those this machine lacks: XLA is always behind them."""
    chain = [target]
    for other in getattr(target, "fallback_chain", ()):
        candidate = target_table.get(other)
        try:
            device.require(candidate)
        except device.TargetUnavailableError:
            continue
        chain.append(candidate)
    return chain


def _split(traced, closed: jc.ClosedJaxpr, target: hlo2onnx.Target, opset: int, name: str) -> PartitionedLowered:
    consts, eqns, outvars = _inline(closed)
    chain = _chain(target)
    placements, reasons = zip(*(_place(eqn, chain, opset) for eqn in eqns)) if eqns else ((), ())
    order = schedule(eqns, placements)
    groups: list[list[int]] = []
    for i in order:
        if groups and placements[groups[-1][-1]] == placements[i]:
            groups[-1].append(i)
        else:
            groups.append([i])

    # Slots: the function's inputs first, then every value a partition hands to another.
    slots = {v: i for i, v in enumerate(closed.jaxpr.invars)}
    defined = {v: g for g, group in enumerate(groups) for i in group for v in eqns[i].outvars
               if not isinstance(v, jc.DropVar)}
    needed = {v for v in outvars if isinstance(v, jc.Var)}
    reads: list[list[jc.Var]] = []
    for g, group in enumerate(groups):
        seen: dict[jc.Var, None] = {}
        for i in group:
            for v in eqns[i].invars:
                if isinstance(v, jc.Var) and defined.get(v) != g:
                    seen[v] = None
        reads.append(list(seen))
        needed.update(seen)

    partitions = []
    for g, group in enumerate(groups):
        place = placements[group[0]]
        outs = [v for i in group for v in eqns[i].outvars if v in needed and not isinstance(v, jc.DropVar)]
        for v in outs:
            slots[v] = len(slots)
        constvars = [v for v in reads[g] if v in consts]
        invars = [v for v in reads[g] if v not in consts]
        effects = frozenset().union(*(eqns[i].effects for i in group))
        sub = jc.ClosedJaxpr(_jaxpr(constvars, invars, outs, [eqns[i] for i in group], effects, f"{name}_p{g}"),
                             [consts[v] for v in constvars])
        part = Partition(chain[place].name if place < len(chain) else XLA, sub, tuple(slots[v] for v in invars),
                         tuple(slots[v] for v in outs))
        part.fell_back = [FallbackOp(eqns[i].primitive.name, _where(eqns[i]), reasons[i]) for i in group
                          if reasons[i] is not None]
        if not outs and not effects:
            continue  # nothing reads it: dead code, which jax.jit would drop too
        if part.is_onnx:
            part.target = chain[place]
            try:
                part.conversion, part.callbacks = _translate(sub, part.target, opset, f"{name}_p{g}")
            except Exception as e:  # ops that run alone but not together: the run goes to jax.jit whole
                part.runs_on, part.target = XLA, None
                part.fell_back = [FallbackOp(eqns[i].primitive.name, _where(eqns[i]),
                                             f"its partition did not translate: {e}") for i in group]
        partitions.append(part)

    # Outputs no partition computes (literals, constants) come from jax.jit once, as jax.jit returns them
    # (weak types included).
    fixed = [v for v in outvars if not (isinstance(v, jc.Var) and v in slots)]
    constvars = list(dict.fromkeys(v for v in fixed if isinstance(v, jc.Var)))
    # Planning may run inside mnjit's fast-path trace: evaluated eagerly, the values are arrays, not tracers
    # that would leak into the Python path's runner.
    with jax.ensure_compile_time_eval():
        values = jax.jit(jc.jaxpr_as_fun(jc.ClosedJaxpr(
            _jaxpr(constvars, [], fixed, [], frozenset(), f"{name}_constants"), [consts[v] for v in constvars])))()
    constants, out_slots, values = {}, [], iter(values)
    for v in outvars:
        if isinstance(v, jc.Var) and v in slots:
            out_slots.append(slots[v])
        else:
            out_slots.append(len(slots) + len(constants))
            constants[out_slots[-1]] = next(values)
    return PartitionedLowered(traced, target, partitions, len(slots) + len(constants), constants,
                              tuple(out_slots), False)


def _place(eqn, chain: list[hlo2onnx.Target], opset: int) -> tuple[int, str | None]:
    """The index in `chain` of the first target that runs `eqn` (len(chain): XLA), and why the main target
    does not (None when it does)."""
    reason = None
    for place, candidate in enumerate(chain):
        refusal = classify(eqn, candidate, opset)
        if refusal is None:
            return place, reason
        reason = reason or f"{candidate.name}: {refusal}"
    return len(chain), reason


def _jaxpr(constvars: list, invars: list, outvars: list, eqns: list, effects, name: str) -> jc.Jaxpr:
    # A Jaxpr without DebugInfo is deprecated (jax#26480); the names are only for jax's messages.
    debug = jc.DebugInfo("mnjit fallback", name, tuple(f"in{i}" for i in range(len(invars))),
                         tuple(f"out{i}" for i in range(len(outvars))))
    return jc.Jaxpr(constvars, invars, outvars, eqns, effects, debug)


def _inline(closed: jc.ClosedJaxpr) -> tuple[dict, list, list]:
    """The equations with call-like ones replaced by their bodies (fresh variables for each copy, since one
    body may be called twice), the constants by variable, and the outputs."""
    consts: dict[jc.Var, Any] = dict(zip(closed.jaxpr.constvars, closed.consts))
    eqns: list = []

    def walk(jaxpr: jc.Jaxpr, env: dict, caller=None) -> list:
        """`caller`: the source info of the innermost call being inlined that names a user line. A body
        traced inside jax (jnp.sort is jitted) has only jax's frames; its equations take the call's."""
        def read(v):
            return env.get(v, v) if isinstance(v, jc.Var) else v

        for eqn in jaxpr.eqns:
            invars = [read(v) for v in eqn.invars]
            key = _INLINE.get(eqn.primitive.name)
            body = eqn.params.get(key) if key else None
            user_line = _where(eqn) is not None
            if isinstance(body, jc.ClosedJaxpr):
                inner = {}
                for var, value in zip(body.jaxpr.constvars, body.consts):
                    inner[var] = jc.Var(var.aval)
                    consts[inner[var]] = value
                inner.update(zip(body.jaxpr.invars, invars))
                for out, result in zip(eqn.outvars, walk(body.jaxpr, inner, eqn.source_info if user_line else caller)):
                    env[out] = result
                continue
            outvars = []
            for v in eqn.outvars:
                if not isinstance(v, jc.DropVar):
                    env[v] = jc.Var(v.aval)
                outvars.append(env.get(v, v))
            source = eqn.source_info if user_line or caller is None else caller
            eqns.append(eqn.replace(invars=invars, outvars=outvars, source_info=source))
        return [read(v) for v in jaxpr.outvars]

    top = {v: v for v in closed.jaxpr.invars}
    top.update({v: v for v in closed.jaxpr.constvars})
    outvars = walk(closed.jaxpr, top)
    return consts, eqns, outvars


def schedule(eqns: Sequence, placements: Sequence[int]) -> list[int]:
    """A topological order of `eqns` that keeps equations of one placement together as long as data allows.

    Greedy: stay on the current placement while it has a ready equation (earliest first), else switch to
    the placement of the earliest ready one. Effectful equations keep their relative order.
    """
    producer: dict[jc.Var, int] = {}
    successors: list[list[int]] = [[] for _ in eqns]
    waiting = [0] * len(eqns)
    last_effect = None
    for i, eqn in enumerate(eqns):
        preds = {producer[v] for v in eqn.invars if isinstance(v, jc.Var) and v in producer}
        if eqn.effects:
            if last_effect is not None:
                preds.add(last_effect)
            last_effect = i
        for p in preds:
            successors[p].append(i)
        waiting[i] = len(preds)
        for v in eqn.outvars:
            if not isinstance(v, jc.DropVar):
                producer[v] = i
    ready: dict[int, list[int]] = {}
    for i, n in enumerate(waiting):
        if n == 0:
            heapq.heappush(ready.setdefault(placements[i], []), i)
    order: list[int] = []
    current = placements[0] if eqns else 0
    while len(order) < len(eqns):
        if not ready.get(current):
            current = min((heap[0], place) for place, heap in ready.items() if heap)[1]
        i = heapq.heappop(ready[current])
        order.append(i)
        for s in successors[i]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready.setdefault(placements[s], []), s)
    return order


# -- classification -----------------------------------------------------------------------------------
# id(target) -> (target, {equation key: verdict}). Targets hold dicts, so they are not hashable themselves;
# the entry keeps its target alive, so the id is never reused for another one.
_verdicts: dict[int, tuple[hlo2onnx.Target, dict[Any, str | None]]] = {}
_MAX_VERDICTS = 4096
_LOCATION = re.compile(r" \(at [^)]*\)| at \S+:\d+")


def classify(eqn, target: hlo2onnx.Target, opset: int) -> str | None:
    """None when `target` runs `eqn` on its own; otherwise why not (the translator's error)."""
    try:
        key = (opset, eqn.primitive, tuple(sorted(eqn.params.items())),
               tuple((v.aval, _literal_key(v)) for v in eqn.invars))
        hash(key)
    except TypeError:  # unhashable params (arrays): classified each time
        key = None
    verdicts = _verdicts.setdefault(id(target), (target, {}))[1]
    if len(verdicts) > _MAX_VERDICTS:  # keys hold the params (loop bodies and their constants): bounded
        verdicts.clear()
    if key is not None and key in verdicts:
        return verdicts[key]
    invars = list(dict.fromkeys(v for v in eqn.invars if isinstance(v, jc.Var)))
    outvars = [jc.Var(v.aval) if isinstance(v, jc.DropVar) else v for v in eqn.outvars]
    single = jc.ClosedJaxpr(_jaxpr([], invars, outvars, [eqn.replace(outvars=outvars)], eqn.effects,
                                   eqn.primitive.name), [])
    try:
        _translate(single, target, opset, eqn.primitive.name, persistent=False)  # probes: not worth a file each
        verdict = None
    except Exception as e:  # fallback's promise is that the program runs; the reason goes in the report
        # The first clause: the advice that follows is about the strict mode (run that part outside), which
        # fallback does for the user. Locations are dropped: the verdict is shared by every equation of its
        # key, and each FallbackOp names its own line.
        verdict = _LOCATION.sub("", str(e).split("; ")[0]) or type(e).__name__
    if key is not None:
        verdicts[key] = verdict
    return verdict


def _literal_key(atom) -> tuple | None:
    """A literal's value as hashable bytes (jax holds literals as arrays, which do not hash)."""
    if not isinstance(atom, jc.Literal):
        return None
    value = np.asarray(atom.val)
    return value.dtype.str, value.shape, value.tobytes()


def _translate(closed: jc.ClosedJaxpr, target: hlo2onnx.Target, opset: int, name: str, persistent: bool = True):
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in closed.in_avals]
    # keep_unused: the ONNX inputs must be exactly the partition's inputs, in order.
    traced = jax.jit(jc.jaxpr_as_fun(closed), keep_unused=True).trace(*args)
    if not persistent:
        return host_callbacks.translate(traced.lower(), target, opset, name)
    translation, _ = persist.translate_trace(traced, target, opset, name)  # through the persistent cache
    return translation.conversion, translation.callbacks


def _where(eqn) -> str | None:
    """The user's line that made `eqn`: its traceback written as MLIR locations are, so that hlo2onnx's
    filter (innermost frame outside jax, mnjit and hlo2onnx) reads it."""
    traceback = eqn.source_info.traceback
    if traceback is None:
        return None
    return source_line(" ".join(f'"{frame.file_name}":{frame.line_num}' for frame in traceback.frames))
