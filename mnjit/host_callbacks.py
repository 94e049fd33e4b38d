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
from typing import Callable, Sequence

import jax
import numpy as np
import onnx_ir as ir

import hlo2onnx
from hlo2onnx import compat, host_calls
from hlo2onnx.provenance import SOURCE_LOC
from mnjit import runtime

_MAX_RANK = 64  # kMaxRank in host_callback.h
_DISPATCHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_size_t)
# ONNX element types -> numpy (complex arrives as float pairs: a node's `complex_*` attributes say where).
_NUMPY = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
          9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64, 16: jax.numpy.bfloat16}
_TOKEN = np.ones((), np.bool_)
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


def translate(lowered: jax.stages.Lowered, target: hlo2onnx.Target, opset: int,
              name: str) -> tuple[hlo2onnx.ConversionReport, Registration | None]:
    """Translates a lowering whose callbacks mnjit will run; the registration keeps them callable."""
    functions = compat.host_callbacks(lowered)
    ids = reserve(len(functions)) if functions else None
    conversion = hlo2onnx.translate_report(lowered, target=target, opset=opset, name=name,
                                           host_callbacks=ids)
    needed = functions and host_calls.host_calls(conversion.model)  # pure callbacks nobody reads are gone
    return conversion, Registration(conversion.model, functions, ids) if needed else None


def refuse_saving(registration: Registration | None, model: ir.Model) -> None:
    """save() of a model holding callbacks: no runtime but mnjit's can call them."""
    if registration is not None:
        raise hlo2onnx.Hlo2OnnxError(
            f"this function calls Python on the host ({describe(model)}): its ONNX model runs only under mnjit, "
            "which calls the functions; other runtimes cannot load it, so it is not saved. Move the callbacks "
            "(jax.debug.print, pure_callback, io_callback, equinox checks such as eqx.error_if) out of the "
            "function to export it")


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
    # Out-parameters go as byref objects (_Scratch): c_void_p argtypes take them without a conversion.
    lib.mnjit_cb_arity.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p]
    lib.mnjit_cb_input.argtypes = [c.c_void_p, c.c_size_t, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p]
    lib.mnjit_cb_output.argtypes = [c.c_void_p, c.c_size_t, c.c_void_p, c.c_size_t, c.c_void_p]
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
        scratch = _scratch_local
        _lib.mnjit_cb_arity(context, scratch.n_in_ref, scratch.n_out_ref)
        n_in, n_out = scratch.n_in.value, scratch.n_out.value
        # An ordered callback's function takes the token first and returns it first (a bool scalar here).
        args = [_read_input(context, i, i in entry.complex_in) for i in range(n_in - after)]
        results = list(entry.function(*args))
        if entry.effects:
            results.append(_TOKEN)
        if len(results) != n_out:
            raise RuntimeError(f"mnjit: host callback returned {len(results)} values for {n_out} outputs")
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
    scratch = _scratch_local
    if _lib.mnjit_cb_input(context, index, scratch.data_ref, scratch.type_ref, scratch.rank_ref, scratch.dims) != 0:
        raise RuntimeError(f"mnjit: cannot read host callback input {index}")
    dtype = np.dtype(_NUMPY[scratch.onnx_type.value])
    array = np.empty(tuple(scratch.dims[:scratch.rank.value]), dtype)
    if array.nbytes:
        ctypes.memmove(_address(array), scratch.data.value, array.nbytes)
    return runtime.pairs_as_complex(array, _COMPLEX[dtype]) if is_complex else array


def _write_output(context: int, index: int, result: np.ndarray, is_complex: bool) -> None:
    if is_complex:
        result = runtime.complex_as_pairs(result)
    result = np.asarray(result, order="C")  # not ascontiguousarray: it makes a scalar 1-d
    scratch = _scratch_local
    scratch.dims[:result.ndim] = result.shape
    data = _lib.mnjit_cb_output(context, index, scratch.dims, result.ndim, scratch.ok_ref)
    if not scratch.ok.value:
        raise RuntimeError(f"mnjit: cannot allocate host callback output {index} of shape {result.shape}")
    if result.nbytes:
        ctypes.memmove(data, _address(result), result.nbytes)


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]  # a third of `array.ctypes.data`'s cost


class _Scratch(threading.local):
    """Per-thread ctypes out-parameters, made once (a callback in a loop runs once per iteration)."""

    def __init__(self) -> None:
        self.data, self.onnx_type, self.rank, self.ok = ctypes.c_void_p(), ctypes.c_int32(), ctypes.c_size_t(), \
            ctypes.c_int()
        self.n_in, self.n_out = ctypes.c_size_t(), ctypes.c_size_t()
        self.dims = (ctypes.c_int64 * _MAX_RANK)()
        self.data_ref, self.type_ref, self.rank_ref, self.ok_ref = map(
            ctypes.byref, (self.data, self.onnx_type, self.rank, self.ok))
        self.n_in_ref, self.n_out_ref = ctypes.byref(self.n_in), ctypes.byref(self.n_out)


_scratch_local = _Scratch()  # one per thread (threading.local)


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
