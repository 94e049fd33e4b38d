"""What mnjit keeps in its persistent cache (mnjit/disk_cache.py), and the keys it keeps them under.

Three kinds of entries:
- `translation`: a lowering's ONNX model (and its conversion report's text) for one target and opset;
- `iree`: an IREE module (.vmfb) compiled from one ONNX model with one set of iree-compile flags;
- `decision`: target="auto"'s tier for one signature (which tier, which of its variants, and why);
- `fact`: a yes-or-no measured on one translation's model (whether its ORT run is short enough for the fast
  path's custom call: a probe run of the whole model, saved on a warm first call), or a number measured on the
  environment alone (ORT's NCHWc block size on this CPU: mnjit/nchwc.py);
- `trace`: the key of a stored translation, under the key of jax.jit's trace it came from (mnjit/trace_key.py):
  a warm process's first call finds its model without lowering the trace to StableHLO.

Every key is a SHA-256 over what can change the value or its timing: the StableHLO module's bytecode (with
its source locations, which error messages and node metadata cite) and the values of its `jax.const`
arguments (hlo2onnx/compat.py: const_args), the target, opset and options, and the environment
(mnjit/cache_key.py, `environment()`): the versions of mnjit, jax, jaxlib, onnxruntime, onnx, onnx-ir, numpy
and IREE, a fingerprint of mnjit's and hlo2onnx's source files (a working copy's edits change translations without a new
version), and the CPU (its model and feature flags: iree-compile targets the host's features, and a tier
decided on one CPU says nothing of another).

Lowerings with Python host callbacks are never stored: their models name functions registered in this process.
A translation reached through its trace's key keeps the node metadata (source locations) of the process that
made it: the trace key leaves out the call site, which changes no value the model computes.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np
import onnx
import onnx_ir as ir

import hlo2onnx
from hlo2onnx import compat
from mnjit import disk_cache, host_callbacks, trace_key
from mnjit import cache_key
from mnjit.cache_key import key

TRANSLATION, IREE, DECISION, TRACE = "translation", "iree", "decision", "trace"


def module_digest(lowered: jax.stages.Lowered) -> bytes:
    """The SHA-256 of a lowering's StableHLO bytecode and its jax.const arguments' values."""
    digest = hashlib.sha256(lowered.compiler_ir("stablehlo").operation.get_asm(binary=True, enable_debug_info=True))
    for value in compat.const_args(lowered):
        array = np.asarray(value)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.digest()


class CachedReport(hlo2onnx.ConversionReport):
    """The conversion report of a translation read from the cache: the text it printed when it was made."""

    def __init__(self, model: ir.Model, text: str, target: hlo2onnx.Target, op_counts: dict[str, int]):
        super().__init__(model, op_counts, None, target)
        self.text = text

    def __str__(self) -> str:
        return f"Translation: read from mnjit's persistent cache\n{self.text}"


@dataclass
class Translation:
    """The result of `translate`: what host_callbacks.translate gives, the key it is cached under (None: not
    cacheable), and whether it was read from the cache."""

    conversion: hlo2onnx.ConversionReport
    callbacks: host_callbacks.Registration | None
    key: str | None
    cached: bool


def translate(lowered: jax.stages.Lowered, target: hlo2onnx.Target, opset: int, name: str) -> Translation:
    """host_callbacks.translate through the persistent cache: read when stored, stored when made."""
    store = disk_cache.current()
    if store is None or compat.host_callbacks(lowered):
        return Translation(*host_callbacks.translate(lowered, target, opset, name), None, False)
    entry_key = key(TRANSLATION, module_digest(lowered), target.name, str(opset), name)
    payload = store.get(TRANSLATION, entry_key)
    if payload is not None:
        try:
            return Translation(_load_translation(payload, target), None, entry_key, True)
        except Exception:  # valid checksum, unreadable content (a bug of the writer): rebuilt below
            pass
    conversion, callbacks = host_callbacks.translate(lowered, target, opset, name)
    if callbacks is None:
        try:
            payload = _dump_translation(conversion)
        except Exception:  # e.g. over protobuf's 2 GB: not stored
            payload = None
        if payload is not None:
            store.put(TRANSLATION, entry_key, payload)
    return Translation(conversion, callbacks, entry_key, False)


def translate_trace(traced: Any, target: hlo2onnx.Target, opset: int, name: str,
                    keep_stablehlo: bool = False) -> tuple[Translation, jax.stages.Lowered | None]:
    """`translate` of a trace's lowering, looked up first by the trace itself (mnjit/trace_key.py): on a hit the
    trace is not lowered unless `keep_stablehlo` asks for its lowering (None otherwise). The trace key also finds
    what the lowering's own key may miss: a lowering's source locations depend on where it was traced from."""
    store = disk_cache.current()
    digest = trace_key.digest(traced) if store is not None else None
    alias = None if digest is None else key(TRACE, digest, target.name, str(opset), name)
    if alias is not None:
        stored = store.get(TRACE, alias)
        try:
            entry_key = stored.decode("ascii") if stored is not None else None
            payload = store.get(TRANSLATION, entry_key) if entry_key else None
            if payload is not None:
                found = Translation(_load_translation(payload, target), None, entry_key, True)
                return found, traced.lower() if keep_stablehlo else None
        except Exception:  # a foreign key or an unreadable entry: lowered and translated below
            pass
    lowered = traced.lower()
    translation = translate(lowered, target, opset, name)
    if alias is not None and translation.key is not None and translation.callbacks is None:
        store.put(TRACE, alias, translation.key.encode("ascii"))
    return translation, lowered


def _dump_translation(conversion: hlo2onnx.ConversionReport) -> bytes:
    meta = json.dumps({"report": str(conversion), "op_counts": conversion.op_counts}).encode()
    return struct.pack("<Q", len(meta)) + meta + ir.to_proto(conversion.model).SerializeToString()


def _load_translation(payload: bytes, target: hlo2onnx.Target) -> CachedReport:
    (length,) = struct.unpack_from("<Q", payload)
    meta = json.loads(payload[8:8 + length])
    model = ir.from_proto(onnx.load_from_string(payload[8 + length:]))
    return CachedReport(model, meta["report"], target, meta["op_counts"])


_cached_only = contextvars.ContextVar("mnjit_cached_only", default=False)


@contextlib.contextmanager
def cached_only():
    """Within it, a module missing from the cache raises NotCached instead of being compiled: a stored tier
    decision loads its tier on the caller's thread only when that costs no compile."""
    token = _cached_only.set(True)
    try:
        yield
    finally:
        _cached_only.reset(token)


class NotCached(LookupError):
    """A compiled module was needed under cached_only() and the cache lacks it."""


def load_module(module_key: str) -> bytes | None:
    """An IREE module stored under `module_key` (iree_key), or None; NotCached under cached_only()."""
    store = disk_cache.current()
    vmfb = None if store is None else store.get(IREE, module_key)
    if vmfb is None and _cached_only.get():
        raise NotCached(module_key)
    return vmfb


def store_module(module_key: str, vmfb: bytes) -> None:
    store = disk_cache.current()
    if store is not None:
        store.put(IREE, module_key, vmfb)


def iree_key(model_digest: bytes) -> str:
    """The key of an IREE module, from the digest of its ONNX model and iree-compile's flags."""
    return key(IREE, model_digest)


def load_decision(decision_key: str) -> dict[str, Any] | None:
    store = disk_cache.current()
    payload = None if store is None else store.get(DECISION, decision_key)
    if payload is None:
        return None
    try:
        decision = json.loads(payload)
        return decision if isinstance(decision, dict) and isinstance(decision.get("serving"), str) else None
    except ValueError:
        return None


def store_decision(decision_key: str, decision: dict[str, Any]) -> None:
    store = disk_cache.current()
    if store is not None:
        store.put(DECISION, decision_key, json.dumps(decision, sort_keys=True).encode())


def decision_key(translation_key: str, policy: str) -> str:
    """The key of a signature's tier decision: its ort-cpu translation's key, and the policy's thresholds."""
    return key(DECISION, translation_key, policy)


def remembered(translation_key: str | None, fact: str, measure: Callable[[], bool]) -> bool:
    """`measure()`, stored under the translation's key and `fact`, or read where an earlier process stored it."""
    if translation_key is None:
        return measure()
    return bool(cache_key.stored_number((translation_key, fact), lambda: int(bool(measure())), below=2))
