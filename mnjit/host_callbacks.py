"""Python host callbacks inside mnjit's ONNX models: the functions behind `mnjit.HostCallback` nodes.

jax lowers jax.pure_callback, io_callback, jax.debug.print and equinox's error checks to calls of Python
functions it keeps beside the module (hlo2onnx/host_calls.py). mnjit registers each under a process-wide id
that the node names; ORT runs the node through mnjit's C extension (csrc/host_callback.h), which calls
`_dispatch` here with the kernel's context. Arguments are copied out of ORT's buffers (the function may keep
them, as jax.jit's callbacks may) and results copied into the outputs ORT allocates.

A function that raises fails the run with an ORT error status; the exception waits, per thread, in
`_pending` for the runner to raise it as jax.jit does (`raise_pending`). The table is process-wide because the
C dispatcher is: an entry lives as long as the compiled signature that registered it (`Registration`).
"""
from __future__ import annotations

import ctypes
import itertools
import threading
import traceback
import weakref
from math import prod
from typing import Callable, Sequence

import jax
import numpy as np
import onnx_ir as ir

from hlo2onnx import host_calls
from hlo2onnx.provenance import SOURCE_LOC
from mnjit import runtime

_MAX_RANK = 64  # kMaxRank in host_callback.h
_DISPATCHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_size_t)
# ONNX element types -> numpy (complex arrives as float pairs: a node's `complex_*` attributes say where).
_NUMPY = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
          9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64, 16: jax.numpy.bfloat16}
_COMPLEX = {np.dtype(np.float32): np.dtype(np.complex64), np.dtype(np.float64): np.dtype(np.complex128)}


class _Callback:
    def __init__(self, function: Callable, complex_in: Sequence[int], complex_out: Sequence[int], effects: bool):
        self.function = function
        # A callback run for its effects writes a last output, an order token (hlo2onnx.host_calls.order_effects).
        self.effects = effects
        self.complex_in, self.complex_out = frozenset(complex_in), frozenset(complex_out)


_table: dict[int, _Callback] = {}
_table_lock = threading.Lock()
_ids = itertools.count(1)
_pending = threading.local()
_lib: ctypes.CDLL | None = None


def reserve(count: int) -> list[int]:
    """Fresh ids for a lowering's `count` callbacks (given to the translator before the model exists)."""
    with _table_lock:
        return [next(_ids) for _ in range(count)]


class Registration:
    """The callbacks of one translated signature, in the table while this object lives."""

    def __init__(self, model: ir.Model, functions: Sequence[Callable], ids: Sequence[int]) -> None:
        by_id = dict(zip(ids, functions))
        entries = {}
        for node in host_calls.host_calls(model):
            attrs = node.attributes
            callback = attrs["callback"].as_int()
            entries[callback] = _Callback(by_id[callback], _ints(attrs.get("complex_inputs")),
                                          _ints(attrs.get("complex_outputs")), _flag(attrs, "effects"))
        with _table_lock:
            _table.update(entries)
        self.ids = list(entries)
        weakref.finalize(self, _forget, self.ids)


def describe(model: ir.Model) -> str:
    """How many callbacks `model` holds, and the user lines they come from."""
    nodes = host_calls.host_calls(model)
    lines = sorted({node.metadata_props[SOURCE_LOC] for node in nodes if SOURCE_LOC in node.metadata_props})
    return f"{len(nodes)} callback{'s' if len(nodes) != 1 else ''}" + (f" at {', '.join(lines)}" if lines else "")


def _flag(attrs, name: str) -> bool:
    return name in attrs and attrs[name].as_int() == 1


def _ints(attr: ir.Attr | None) -> list[int]:
    return list(attr.as_ints()) if attr is not None else []


def _forget(ids: list[int]) -> None:
    with _table_lock:
        for callback in ids:
            _table.pop(callback, None)


def install(lib: ctypes.CDLL) -> None:
    """Hands the C extension its dispatcher (once, when mnjit/ffi.py loads it)."""
    global _lib
    c = ctypes
    lib.mnjit_cb_arity.argtypes = [c.c_void_p, c.POINTER(c.c_size_t), c.POINTER(c.c_size_t)]
    lib.mnjit_cb_input.argtypes = [c.c_void_p, c.c_size_t, c.POINTER(c.c_void_p), c.POINTER(c.c_int32),
                                   c.POINTER(c.c_size_t), c.POINTER(c.c_int64)]
    lib.mnjit_cb_output.argtypes = [c.c_void_p, c.c_size_t, c.POINTER(c.c_int64), c.c_size_t, c.POINTER(c.c_int)]
    lib.mnjit_cb_output.restype = c.c_void_p
    lib.mnjit_cb_set_dispatcher.argtypes = [_DISPATCHER]
    _lib = lib
    lib.mnjit_cb_set_dispatcher(_dispatch_pointer)


def _dispatch(callback: int, after: int, context: int, error: int, error_size: int) -> int:
    """Runs one callback node (`after`: its last input only orders it); every exception is kept for `raise_pending` (one escaping a ctypes callback
    would be printed and the run would go on as if it had succeeded)."""
    try:
        entry = _table.get(callback)
        if entry is None:
            raise RuntimeError(f"mnjit: host callback {callback} was released")
        n_in, n_out = ctypes.c_size_t(), ctypes.c_size_t()
        _lib.mnjit_cb_arity(context, ctypes.byref(n_in), ctypes.byref(n_out))
        # An ordered callback's function takes the token first and returns it first (a bool scalar here).
        args = [_read_input(context, i, i in entry.complex_in) for i in range(n_in.value - after)]
        results = list(entry.function(*args))
        if entry.effects:
            results.append(np.bool_(True))
        if len(results) != n_out.value:
            raise RuntimeError(f"mnjit: host callback returned {len(results)} values for {n_out.value} outputs")
        for i, result in enumerate(results):
            _write_output(context, i, np.asarray(result), i in entry.complex_out)
        return 0
    except BaseException as e:  # noqa: BLE001  (KeyboardInterrupt too: raised again by raise_pending)
        _pending.error = e
        text = f"{type(e).__name__}: {e}".encode(errors="replace")[:max(error_size - 1, 0)]
        ctypes.memmove(error, text + b"\0", len(text) + 1)
        return 1


_dispatch_pointer = _DISPATCHER(_dispatch)  # kept alive for as long as C may call it


def _read_input(context: int, index: int, is_complex: bool) -> np.ndarray:
    data, onnx_type, rank = ctypes.c_void_p(), ctypes.c_int32(), ctypes.c_size_t()
    dims = (ctypes.c_int64 * _MAX_RANK)()
    if _lib.mnjit_cb_input(context, index, ctypes.byref(data), ctypes.byref(onnx_type), ctypes.byref(rank),
                           dims) != 0:
        raise RuntimeError(f"mnjit: cannot read host callback input {index}")
    dtype = np.dtype(_NUMPY[onnx_type.value])
    array = np.empty(tuple(dims[:rank.value]), dtype)
    if array.nbytes:
        ctypes.memmove(array.ctypes.data, data.value, array.nbytes)
    return runtime.pairs_as_complex(array, _COMPLEX[dtype]) if is_complex else array


def _write_output(context: int, index: int, result: np.ndarray, is_complex: bool) -> None:
    if is_complex:
        result = runtime.complex_as_pairs(result)
    result = np.ascontiguousarray(result)
    dims = (ctypes.c_int64 * max(result.ndim, 1))(*result.shape)
    ok = ctypes.c_int()
    data = _lib.mnjit_cb_output(context, index, dims, result.ndim, ctypes.byref(ok))
    if not ok.value:
        raise RuntimeError(f"mnjit: cannot allocate host callback output {index} of shape {result.shape}")
    if result.nbytes and prod(result.shape):
        ctypes.memmove(data, result.ctypes.data, result.nbytes)


def take_pending() -> BaseException | None:
    """The exception a callback raised on this thread since the last call, if any."""
    error = getattr(_pending, "error", None)
    _pending.error = None
    return error


def raise_pending(error: BaseException | None) -> None:
    """Raises a callback's exception as jax.jit does (JaxRuntimeError naming the traceback; Ctrl-C as is)."""
    if error is None:
        return
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        raise error
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    raise jax.errors.JaxRuntimeError(f"INTERNAL: CpuCallback error calling callback: {text}") from error
