"""Running a fallback plan (mnjit/fallback.py): `fused` traces all of it inside mnjit's fast-path jax.jit, ONNX
partitions as ORT custom calls (one dispatch per call, XLA hands the buffers over); `PartitionedRunner` calls
each partition from Python (ORT's runners and jax.jit take and return jax arrays, so nothing is copied there
either)."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.extend.core as jc

from mnjit.fallback import MakeRunner, PartitionedLowered


class PartitionedRunner:
    """Runs a plan: each partition reads its inputs from the slots and writes its outputs back."""

    def __init__(self, lowered: PartitionedLowered, make_runner: MakeRunner):
        self.lowered = lowered
        self.stages = []
        for part in lowered.partitions:
            if part.is_onnx:
                run = make_runner(part.target, part.conversion.model, list(part.closed.in_avals),
                                  list(part.closed.out_avals)).run
            else:
                run = _jitted(part.closed)
            self.stages.append((run, part.in_slots, part.out_slots))
        self.sessions = sum(p.is_onnx for p in lowered.partitions)
        # Outputs that are inputs as given: jax.jit returns them as jax arrays even when given numpy or Python
        # scalars, so the runner converts those the same way.
        n_inputs = len(lowered.traced.jaxpr.jaxpr.invars)
        self._passed_through = [k for k, slot in enumerate(lowered.out_slots) if slot < n_inputs]
        if lowered.whole:
            self.run = self.stages[0][0]  # one model, called directly: no slot bookkeeping

    def run(self, leaves: Sequence) -> list:
        outputs = _execute(self.lowered, self.stages, leaves)
        for k in self._passed_through:
            if not isinstance(outputs[k], jax.Array):
                outputs[k] = _identity(outputs[k])
        return outputs


_identity = jax.jit(lambda value: value)


def _execute(lowered: PartitionedLowered, stages: list, leaves: Sequence) -> list:
    env = [None] * lowered.n_slots
    env[:len(leaves)] = leaves
    for slot, value in lowered.constants.items():
        env[slot] = value
    for run, in_slots, out_slots in stages:
        outputs = run([env[i] for i in in_slots])
        for slot, value in zip(out_slots, outputs):
            env[slot] = value
    return [env[i] for i in lowered.out_slots]


def fused(lowered: PartitionedLowered, make_call: MakeRunner) -> Callable[[list], list] | None:
    """The whole plan as one function for mnjit's fast path to trace inside jax.jit: ONNX partitions as the
    calls `make_call` gives (ORT custom calls, mnjit/ffi.py), the rest as their own equations. One dispatch
    runs every partition, and XLA hands buffers between them. None when some ONNX partition cannot take a
    custom call: the plan then runs through PartitionedRunner."""
    stages = []
    for part in lowered.partitions:
        if part.is_onnx:
            call = make_call(part.target, part.conversion.model, list(part.closed.in_avals),
                             list(part.closed.out_avals))
            if call is None:
                return None
        else:
            call = functools.partial(_inline_call, jc.jaxpr_as_fun(part.closed))
        stages.append((call, part.in_slots, part.out_slots))
    return functools.partial(_execute, lowered, stages)


def _inline_call(fun: Callable, leaves: list) -> list:
    return fun(*leaves)


def _jitted(closed: jc.ClosedJaxpr) -> Callable[[list], list]:
    fun = jax.jit(jc.jaxpr_as_fun(closed), keep_unused=True)
    return lambda leaves: fun(*leaves)
