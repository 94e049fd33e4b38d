"""ORT inside jax.jit: an XLA FFI custom call that runs an ONNX Runtime session (csrc/ort_ffi.cc).

A signature that takes this path costs jax.jit's own C++ dispatch plus ORT's run: ORT reads
XLA's argument buffers and writes into the result buffers XLA allocated, with no Python in
between (docs/runtime.md has the measurements). The extension is compiled on first use
with the system's C++ compiler against the XLA FFI headers that jaxlib ships, and cached;
without a compiler, mnjit keeps its Python path and says why in `status()`.

The same sessions serve mnjit's Python path (FfiRunner: slow runs and while loops, which must stay
interruptible), and all of them share one intra-op thread pool (docs/runtime.md, Threads).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from math import prod
from pathlib import Path
from typing import Sequence

import jax
import numpy as np
import onnx_ir as ir
import onnxruntime

from hlo2onnx import compat, host_calls
from mnjit import host_callbacks, nchwc, runtime

_SOURCE = Path(__file__).with_name("csrc") / "ort_ffi.cc"
_TARGET_NAME = "mnjit_ort_run"
# ONNX element types by numpy dtype; complex travels as float pairs on a trailing axis (hlo2onnx's storage).
_ONNX_TYPES = {np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.uint16): 4,
               np.dtype(np.int16): 5, np.dtype(np.int32): 6, np.dtype(np.int64): 7, np.dtype(np.bool_): 9,
               np.dtype(np.float16): 10, np.dtype(np.float64): 11, np.dtype(np.uint32): 12,
               np.dtype(np.uint64): 13, np.dtype(jax.numpy.bfloat16): 16}
_COMPLEX = {np.dtype(np.complex64): 1, np.dtype(np.complex128): 11}
_ERROR_SIZE = 1024
MAX_WEIGHT_BYTES = 16 << 20


class _Library:
    """The loaded extension, built and registered with jax once per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self.reason = "not tried yet"
        self._preloading = False

    def get(self, paths: tuple[Path, str] | None = None) -> ctypes.CDLL | None:
        if self._lib is not None:
            return self._lib
        with self._lock:
            if self._lib is None and self.reason == "not tried yet":
                try:
                    self._lib = _load(*(paths or _paths()))
                    self.reason = "ready"
                except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                    self.reason = str(e)
        return self._lib

    def preload(self) -> None:
        with self._lock:
            if self._preloading or self._lib is not None:
                return
            self._preloading = True
        # The paths are found here, on the caller's thread (under a millisecond): on the loading thread each of
        # their file reads gave up the GIL to the first call's trace and waited up to a switch interval (5 ms)
        # for it back, delaying ORT's environment by 15 ms, which the first call then waited for (measured).
        try:
            paths = _paths()
        except (OSError, RuntimeError):
            paths = None  # the loading thread finds the same error and records it
        threading.Thread(target=self.get, args=(paths,), name="mnjit-ort-load", daemon=True).start()

    def after_fork(self) -> None:
        """In a forked child: the preloading thread did not come along, and may have held the lock."""
        self._lock = threading.Lock()
        if self._lib is None:
            self.reason, self._preloading = "not tried yet", False


_LIBRARY = _Library()
os.register_at_fork(after_in_child=_LIBRARY.after_fork)


def preload() -> None:
    """Loads the extension on a daemon thread, once per process: loading ONNX Runtime's library and creating
    its environment (20-30 ms, in C, without the GIL) then overlaps the trace of the first call, which waits
    for it in `get` only if it is not done. Called at a first call, not when a function is made: ORT's thread
    pool, made here, does not survive a fork, and forking after defining functions is common."""
    _LIBRARY.preload()


def status() -> str:
    """'ready', or why the fast path is off (for example: no C++ compiler)."""
    _LIBRARY.get()
    return _LIBRARY.reason


def _cache_dir() -> Path:
    root = os.environ.get("MNJIT_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME")
                                                             or os.path.expanduser("~/.cache"), "mnjit")
    return Path(root)


def _paths() -> tuple[Path, str]:
    """Where the extension built for this source, jaxlib, ORT and Python is cached, and ORT's library."""
    sources = b"".join(path.read_bytes() for path in sorted(_SOURCE.parent.iterdir()))  # the .cc and its headers
    key = hashlib.sha256(sources + jax.__version__.encode() + onnxruntime.__version__.encode()
                         + sys.version.encode()).hexdigest()[:16]
    return _cache_dir() / f"ort_ffi-{key}.so", _ort_library()


def _build(built: Path) -> Path:
    """Compiles the extension once per source, jaxlib and ORT version; concurrent builders race harmlessly."""
    if built.exists():
        return built
    include = Path(jax.ffi.include_dir())
    built.parent.mkdir(parents=True, exist_ok=True)
    compiler = os.environ.get("CXX", "g++")
    with tempfile.TemporaryDirectory(dir=built.parent) as scratch:
        partial = Path(scratch) / built.name
        command = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-w", f"-I{include}", str(_SOURCE),
                   "-o", str(partial), "-ldl"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except FileNotFoundError:
            raise RuntimeError(f"no C++ compiler ({compiler}) to build mnjit's ORT custom call") from None
        if done.returncode != 0:
            raise RuntimeError(f"building mnjit's ORT custom call failed: {done.stderr.strip()[-2000:]}")
        os.replace(partial, built)  # atomic: another process sees the whole file or none
    return built


def _ort_library() -> str:
    capi = Path(onnxruntime.__file__).parent / "capi"
    found = sorted(capi.glob("libonnxruntime.so*"))
    if not found:
        raise RuntimeError(f"this onnxruntime ships no libonnxruntime.so in {capi}")
    return str(found[-1])


def _load(extension: Path, ort_library: str) -> ctypes.CDLL:
    if sys.platform != "linux":
        raise RuntimeError("the ORT custom call is built for Linux only")
    lib = ctypes.CDLL(str(_build(extension)))
    c = ctypes
    lib.ort_ffi_init.argtypes = [c.c_char_p, c.c_int, c.c_char_p, c.c_size_t]
    lib.ort_ffi_create.argtypes = [c.c_char_p, c.c_size_t, c.c_char_p, c.c_int64, c.c_char_p, c.c_int64,
                                   c.POINTER(c.c_int64), c.c_char_p, c.c_size_t]
    lib.ort_ffi_create.restype = c.c_int64
    lib.ort_ffi_release.argtypes = [c.c_int64]
    lib.ort_ffi_probe.argtypes = [c.c_int64, c.c_void_p, c.c_char_p, c.c_size_t]
    lib.ort_ffi_run_options.restype = c.c_void_p
    lib.ort_ffi_terminate.argtypes = [c.c_void_p]
    lib.ort_ffi_release_run_options.argtypes = [c.c_void_p]
    lib.ort_ffi_probe.restype = c.c_double
    lib.ort_ffi_run.argtypes = [c.c_int64, c.c_void_p, c.POINTER(c.c_void_p), c.POINTER(c.c_void_p), c.c_char_p,
                                c.c_size_t]
    error = ctypes.create_string_buffer(_ERROR_SIZE)
    threads = runtime.intra_op_threads()
    if lib.ort_ffi_init(ort_library.encode(), threads, error, _ERROR_SIZE) != 0:
        raise RuntimeError(f"ONNX Runtime's C API: {error.value.decode(errors='replace')}")
    runtime.pool_created(threads)
    host_callbacks.install(lib)
    jax.ffi.register_ffi_target(_TARGET_NAME, jax.ffi.pycapsule(lib.MnjitOrtRun), platform="cpu")
    return lib


def _tensor_spec(aval) -> list[int] | None:
    dtype = np.dtype(aval.dtype)
    shape = [int(d) for d in aval.shape]
    if dtype in _COMPLEX:
        onnx_type, shape = _COMPLEX[dtype], shape + [2]
    elif dtype in _ONNX_TYPES:
        onnx_type = _ONNX_TYPES[dtype]
    else:
        return None
    return [onnx_type, len(shape), *shape, int(np.prod(aval.shape, dtype=np.int64)) * dtype.itemsize]


RELEASED = "mnjit: this ONNX session was released"  # the custom call's error (csrc) once its session is gone


class FfiSession:
    """One ORT session behind the custom call; `call` emits it inside a jax trace."""

    def __init__(self, lib: ctypes.CDLL, handle: int, out_avals: Sequence, bounded: bool,
                 callbacks: bool = False) -> None:
        self._lib, self.handle = lib, handle
        self.bounded = bounded  # no while loop: the run time cannot hang on the data
        # Python host callbacks: run on mnjit's Python path only (their exceptions are raised there; jax.jit's
        # custom call would hold them in XLA's thread), and never probed (a probe would call them).
        self.callbacks = callbacks
        self._results = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals]
        self._call = jax.ffi.ffi_call(_TARGET_NAME, self._results)

    def call(self, *leaves) -> list:
        return list(self._call(*leaves, session=np.int64(self.handle)))

    def runs_in_jit(self) -> bool:
        """Whether jax.jit may run this session as a custom call, which Ctrl-C cannot end: only when its run
        time cannot hang on the data (no while loop) and one run on zero-filled inputs ends within
        SLOW_RUN_SECONDS (the probe is terminated there, and by Ctrl-C)."""
        if not self.bounded or self.callbacks:
            return False
        lib, error = self._lib, ctypes.create_string_buffer(_ERROR_SIZE)
        run_options = lib.ort_ffi_run_options()
        if not run_options:
            return False
        limit = runtime.SLOW_RUN_SECONDS
        try:
            took = runtime.run_interruptibly(lambda: lib.ort_ffi_probe(self.handle, run_options, error, _ERROR_SIZE),
                                             lambda: lib.ort_ffi_terminate(run_options), limit)
        finally:
            lib.ort_ffi_release_run_options(run_options)
        return took is not None and 0 <= took <= limit

    def run(self, inputs: Sequence[int], outputs: Sequence[int], interruptible: bool) -> None:
        """Runs on buffers given by address (inputs, then outputs); Ctrl-C ends an `interruptible` run."""
        lib, error = self._lib, ctypes.create_string_buffer(_ERROR_SIZE)
        pointers = (ctypes.c_void_p * (len(inputs) + len(outputs)))(*inputs, *outputs)
        outs = ctypes.cast(ctypes.byref(pointers, len(inputs) * ctypes.sizeof(ctypes.c_void_p)),
                           ctypes.POINTER(ctypes.c_void_p))

        def ort_run(run_options) -> tuple[int, BaseException | None]:
            # On the thread that runs ORT, which is the one its callbacks ran on (sequential execution).
            failed = lib.ort_ffi_run(self.handle, run_options, pointers, outs, error, _ERROR_SIZE)
            return failed, host_callbacks.take_pending() if self.callbacks else None

        if not interruptible:
            failed, raised = ort_run(None)
        else:
            run_options = lib.ort_ffi_run_options()
            if not run_options:
                raise MemoryError("ONNX Runtime could not create run options")
            try:
                failed, raised = runtime.run_interruptibly(lambda: ort_run(run_options),
                                                           lambda: lib.ort_ffi_terminate(run_options))
            finally:
                lib.ort_ffi_release_run_options(run_options)
        if failed:
            message = error.value.decode(errors="replace")
            host_callbacks.raise_pending(raised)
            raise RuntimeError(f"ONNX Runtime: {message}")

    def __del__(self) -> None:
        self._lib.ort_ffi_release(self.handle)


def _fixed_trip_count(loop: ir.Node) -> bool:
    """A fori_loop's Loop (constant trip count): its run time does not hang on the data, so the probe tells."""
    trip_count = loop.inputs[0] if loop.inputs else None
    return trip_count is not None and trip_count.const_value is not None


def create(model: ir.Model, in_avals: Sequence, out_avals: Sequence) -> FfiSession | None:
    """A session on mnjit's own ORT environment (its shared thread pool), or None where mnjit's Python
    module session must run the model instead:

    - weights above MAX_WEIGHT_BYTES stay with the Python path, which hands them to ORT without a copy
      (this session gets them serialized);
    - dtypes ORT has no C type for (float8, int4) stay there too, as does everything when the extension
      cannot be built (`status()` says why).
    """
    lib = _LIBRARY.get()
    specs = [_tensor_spec(a) for a in [*in_avals, *out_avals]]
    callbacks = bool(host_calls.host_calls(model))  # only this session can call Python: it must take the model
    if callbacks and lib is None:
        raise RuntimeError(f"this function calls Python on the host, which needs mnjit's C extension: {_LIBRARY.reason}")
    if callbacks and any(s is None for s in specs):
        raise TypeError("a function with Python host callbacks cannot take or return float8 or int4 arrays")
    if lib is None or any(s is None for s in specs) or not out_avals:
        return None
    weights = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
    if weights > MAX_WEIGHT_BYTES and not callbacks:
        return None
    proto = ir.to_proto(model)
    nchwc.rewrite(proto)  # this CPU's convolution kernels: never part of a saved model
    model_bytes = proto.SerializeToString()
    names = [[v.name.encode() for v in values] for values in (model.graph.inputs, model.graph.outputs)]
    flat = [n for spec in specs for n in spec]
    error = ctypes.create_string_buffer(_ERROR_SIZE)
    handle = lib.ort_ffi_create(model_bytes, len(model_bytes), b"\0".join(names[0]) + b"\0", len(names[0]),
                                b"\0".join(names[1]) + b"\0", len(names[1]), (ctypes.c_int64 * len(flat))(*flat),
                                error, _ERROR_SIZE)
    if not handle and callbacks:
        raise RuntimeError(f"ONNX Runtime: {error.value.decode(errors='replace')}")
    if not handle:
        return None  # the Python path creates its own session and reports ORT's error
    bounded = not any(node.op_type == "Scan" or node.op_type == "Loop" and not _fixed_trip_count(node)
                      for node in model.graph.all_nodes())
    return FfiSession(lib, handle, out_avals, bounded, callbacks)


class FfiRunner:
    """Runs an FfiSession outside jax.jit (the Python path: slow runs, while loops, capped caches) on
    caller-owned buffers: jax arrays in by address, fresh 64-byte-aligned numpy outputs that jax imports
    without a copy. Slow runs go through a worker thread, so that Ctrl-C ends them."""

    def __init__(self, session: FfiSession, in_avals: Sequence, out_avals: Sequence) -> None:
        self.session = session
        self.in_dtypes = [np.dtype(a.dtype) for a in in_avals]
        self.outs = [(tuple(int(d) for d in a.shape), np.dtype(a.dtype)) for a in out_avals]
        self.weak = [i for i, a in enumerate(out_avals) if getattr(a, "weak_type", False)]
        self.device = jax.devices("cpu")[0]
        self._slow = True  # until a run shows otherwise: the first run may be long

    def run(self, leaves: Sequence) -> list[jax.Array]:
        keep_alive, inputs = [], []  # converted leaves must live until the run ends
        for leaf, dtype in zip(leaves, self.in_dtypes):
            if type(leaf) is runtime.ARRAY_TYPE and leaf.dtype == dtype:
                leaf.block_until_ready()  # jax computes asynchronously; the address is only valid once ready
                inputs.append(leaf.unsafe_buffer_pointer())
                continue
            # numpy leaves may need jax's dtype canonicalization (int64 -> int32 without x64)
            array = np.ascontiguousarray(np.asarray(leaf, dtype=dtype))
            keep_alive.append(array)
            inputs.append(array.ctypes.data)
        outputs = [_aligned_empty(shape, dtype) for shape, dtype in self.outs]
        interruptible = self._slow and threading.current_thread() is threading.main_thread()
        start = time.perf_counter()
        self.session.run(inputs, [o.ctypes.data for o in outputs], interruptible)
        if interruptible:
            self._slow = time.perf_counter() - start > runtime.SLOW_RUN_SECONDS
        results = [runtime.host_to_jax(o, self.device) for o in outputs]
        for i in self.weak:
            results[i] = compat.mark_weak(results[i])
        return results


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized array whose buffer starts on a 64-byte boundary: jax imports it without a copy."""
    nbytes = prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    offset = -raw.ctypes.data % 64
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)
