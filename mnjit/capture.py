"""Capture and translation of one signature (mnjit/api.py): jax.jit's trace, its lowering through mnjit's
persistent cache (mnjit/persist.py), and the cache entry that runs it."""
from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable

import jax

import hlo2onnx
from hlo2onnx import compat
from hlo2onnx.interrupts import InterruptGuard
from mnjit import device, persist, tiering, fallback as partitioned, partition_runner
from mnjit.fast_call import FastCall, fast_call_for, ffi_session, runner_for
from mnjit.stages import MnjitLowered

AnyLowered = MnjitLowered | partitioned.PartitionedLowered


@dataclass
class CacheEntry:
    """One cached signature: its translation, output tree and runners."""

    lowered: AnyLowered
    out_tree: Any
    make_runner: Callable[[], device.Runner]
    fast: FastCall | None = None
    built_runner: device.Runner | None = None
    tier: tiering.SignatureTier | None = None  # target="auto" only

    @property
    def runner(self) -> device.Runner:
        # Built on first use: a signature on the fast path never needs a second session.
        if self.built_runner is None:
            self.built_runner = self.make_runner()
        return self.built_runner


class Pending:
    """A signature one thread is translating; the others wait for it instead of translating it again."""

    def __init__(self):
        self.done = threading.Event()
        self.entry: CacheEntry | None = None  # None once done: the translation failed (each caller retries)


@dataclass(frozen=True)
class Capture:
    """What one function's lowerings need: jax.jit of the function, the target, opset and name."""

    jitted: Any
    target: hlo2onnx.Target
    opset: int
    name: str
    fallback: bool

    def lower(self, args: tuple, kwargs: dict, keep_stablehlo: bool = True) -> AnyLowered:
        """Traces, lowers and translates one concrete signature (read from the persistent cache when stored).
        Without `keep_stablehlo` (a cache entry, which drops it anyway), a translation stored under the trace's
        own key is read without lowering the trace at all."""
        # The previous translation's entries there would keep its lowerings alive (hlo2onnx/compat.py).
        compat.release_dce_cache()
        # Tracing and lowering make cyclic garbage too: Ctrl-C must not be lost in a gc callback.
        with InterruptGuard():
            traced = self.jitted.trace(*args, **kwargs)
            if self.fallback:
                return partitioned.plan(traced, self.target, self.opset, self.name)
            # Through the persistent cache (mnjit/persist.py): read where an earlier process translated it.
            translation, lowered = persist.translate_trace(traced, self.target, self.opset, self.name,
                                                           keep_stablehlo)
        return MnjitLowered(traced, lowered, translation.conversion.model, translation.conversion,
                            translation.callbacks, cache_key=translation.key, from_cache=translation.cached)

    def lower_symbolic(self, args: tuple, kwargs: dict) -> MnjitLowered:
        """Shape-polymorphic capture: jax.export's lowering (dimension variables, shape assertions), then the
        same translation hlo2onnx.convert gives artifacts (dynamic=True)."""
        if self.fallback:
            raise ValueError("fallback=True needs concrete shapes: symbolic dims cannot split into partitions")
        compat.release_dce_cache()
        with InterruptGuard():
            traced = self.jitted.trace(*args, **kwargs)
            exported = jax.export.export(self.jitted)(*args, **kwargs)
            converted = hlo2onnx.convert(exported, target=self.target, opset=self.opset, dynamic=True,
                                         name=self.name)
        report = hlo2onnx.ConversionReport(converted.model, converted.op_counts, converted.optimized,
                                           converted.target, converted.violations)
        return MnjitLowered(traced, None, converted.model, report, exported=exported)

    def entry(self, args: tuple, kwargs: dict, fast: bool, lowered: AnyLowered | None,
              start_tier: Callable[[AnyLowered], tiering.SignatureTier] | None = None) -> CacheEntry:
        """The cache entry of one signature: translated here, or from `lowered` (lower().compile()).
        `start_tier` (target="auto") gives the signature's tier; one decided for the compiled tier in an earlier
        process serves from this call on, and the entry gets no fast path (its ORT session is made if needed)."""
        # A caller's lowering is not translated again; the entry keeps its own copy, which drops the StableHLO
        # below and holds nothing of the caller's compile().
        lowered = self.lower(args, kwargs, keep_stablehlo=False) if lowered is None else dataclasses.replace(lowered, compiler=None,
                                                                                        tier=None)
        tier = None if start_tier is None else start_tier(lowered)
        if tier is not None and tier.phase is tiering.Phase.COMPILED:
            fast = False
        if self.fallback:
            entry = CacheEntry(lowered, lowered.traced.out_tree,
                               functools.partial(partition_runner.PartitionedRunner, lowered, runner_for), tier=tier)
            entry.fast = partition_runner.fused(lowered, fast_call_for) if fast else None
            return entry
        in_avals = jax.tree_util.tree_leaves(lowered.traced.in_avals)
        out_avals = jax.tree_util.tree_leaves(lowered.traced.out_info)
        if len(lowered.model.graph.inputs) != len(in_avals):
            raise AssertionError("ONNX inputs do not match the flattened arguments")
        model, target = lowered.model, self.target
        make_runner = functools.partial(runner_for, target, model, in_avals, out_avals)
        # The StableHLO module holds a copy of every constant; the entry keeps only the ONNX model.
        lowered.lowered = None
        entry = CacheEntry(lowered, lowered.traced.out_tree, make_runner, tier=tier)
        session = ffi_session(target, model, in_avals, out_avals) if fast else None
        if session is not None and persist.remembered(lowered.cache_key, "runs_in_jit", session.runs_in_jit):
            entry.fast = FastCall(session, in_avals, out_avals)
        elif session is not None:  # too slow for the custom call: the Python path runs this same session
            entry.make_runner = functools.partial(runner_for, target, model, in_avals, out_avals, session)
        return entry
