"""The fast path's pieces (mnjit/api.py): a call's signature, and the ORT custom call jax.jit's own C++ dispatch
runs for a cached signature (mnjit/ffi.py); the runners of the Python path."""
from __future__ import annotations

from typing import Any

import jax
import onnx_ir as ir
from jax import core

import hlo2onnx
from hlo2onnx import compat
from mnjit import device, ffi, physical, runtime
from mnjit.device import own_ort_cpu


class TracerSeen(Exception):
    """Raised by the signature walk: some argument is a tracer, so trace through instead."""


class PythonPath(Exception):
    """Raised while jax.jit traces the fast path: this signature runs through mnjit's Python path."""


class Routed(Exception):
    """Raised while jax.jit traces the fast path: this call takes the Python path, where the signature's compiled
    tier serves (target="auto", decided in an earlier process); other signatures keep the fast path."""


def leaf_signature(leaf: Any) -> tuple:
    """One argument leaf's part of the cache key: shape, dtype and weak type (TracerSeen for a tracer)."""
    if type(leaf) is runtime.ARRAY_TYPE:
        return leaf.shape, leaf.dtype, leaf.weak_type
    if isinstance(leaf, core.Tracer):
        raise TracerSeen
    aval = jax.typeof(leaf)  # canonicalizes dtypes (int64 -> int32 without x64) and weak types
    return aval.shape, aval.dtype, aval.weak_type


def runner_for(target: hlo2onnx.Target, model: ir.Model, in_avals: list, out_avals: list,
               session: ffi.FfiSession | None = None, iree_driver: str | None = None) -> device.Runner:
    """The Python path's runner of one model; typed keys and float0 leaves are wrapped as their physical arrays."""
    if not physical.needs_wrapping(in_avals + out_avals):
        return device.make_runner(target, model, in_avals, out_avals, session, iree_driver=iree_driver)
    runner = device.make_runner(target, model, list(map(physical.physical, in_avals)),
                                list(map(physical.physical, out_avals)), session, iree_driver=iree_driver)
    return physical.PhysicalLeaves(runner, in_avals, out_avals)


def ffi_session(target: hlo2onnx.Target, model: ir.Model, in_avals: list, out_avals: list) -> ffi.FfiSession | None:
    """mnjit's own C session for one model where the target is ORT on the CPU (mnjit/ffi.py), else None."""
    # float0 leaves cannot enter an XLA custom call: the Python path runs them.
    if not own_ort_cpu(target) or any(map(physical.is_float0, in_avals + out_avals)):
        return None
    return ffi.create(model, list(map(physical.physical, in_avals)), list(map(physical.physical, out_avals)))


class FastCall:
    """Emits one signature's ORT custom call inside jax.jit's trace, with typed keys and weak types
    restored around it (both are free there: XLA drops the no-op converts)."""

    def __init__(self, session: ffi.FfiSession, in_avals: list, out_avals: list):
        self.session = session
        self.key_inputs = list(physical.key_impls(in_avals))
        self.key_outputs = physical.key_impls(out_avals)
        self.weak_outputs = [i for i, aval in enumerate(out_avals) if aval.weak_type]

    def __call__(self, leaves: list) -> list:
        for i in self.key_inputs:
            leaves[i] = jax.random.key_data(leaves[i])
        outputs = self.session.call(*leaves)
        for i, impl in self.key_outputs.items():
            outputs[i] = jax.random.wrap_key_data(outputs[i], impl=impl)
        for i in self.weak_outputs:
            outputs[i] = compat.mark_weak(outputs[i])
        return outputs


def fast_call_for(target: hlo2onnx.Target, model: ir.Model, in_avals: list, out_avals: list) -> FastCall | None:
    """The ORT custom call for one model, or None where the Python path must run it (mnjit/ffi.py)."""
    session = ffi_session(target, model, in_avals, out_avals)
    return FastCall(session, in_avals, out_avals) if session is not None and session.runs_in_jit() else None
