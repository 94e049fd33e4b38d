"""Runs an ONNX model on ORT's Python module with jax.Arrays in and out: the runner for what mnjit's own C
session (mnjit/ffi.py) cannot take (weights over 16 MB, which this path hands to ORT in place; float8/int4),
and the helpers both paths share (threads, interruptible runs, DLPack import, weak types).

The per-call path binds each jax array's buffer to ORT by address through a
C-level IOBinding and imports ORT's outputs into jax through DLPack, so no
array is copied. The public wrappers cost tens of microseconds per call
(docs/runtime.md). The C-level ones are private to ORT and jaxlib, which is
why both are pinned to a checked range in setup.cfg.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Callable, Sequence, TypeVar

import jax
import ml_dtypes
import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from hlo2onnx import compat
from hlo2onnx.types import FLOAT8
from mnjit import nchwc

_C = compat.ort_capi()
_to_buffer = compat.dlpack_to_buffer  # the raw DLPack import (3.4 us against 50 us for the public one)
ARRAY_TYPE = type(jax.numpy.zeros(()))  # jax.Array's concrete class: an exact type test
_BOOL = np.dtype(np.bool_)
# dtype -> (same-width unsigned view, ONNX TensorProto type): ORT's numpy bridge knows no ml_dtypes.
_ML_DTYPES = {
    np.dtype(ml_dtypes.bfloat16): (np.uint16, 16),
    np.dtype(ml_dtypes.float8_e4m3fn): (np.uint8, 17),
    np.dtype(ml_dtypes.float8_e5m2): (np.uint8, 19),
}
# The graph holds complex tensors as float (real, imag) pairs on a trailing axis (hlo2onnx TensorType.storage).
_COMPLEX_PAIRS = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}
# Initializers at least this large are handed to ORT as the translator's own numpy buffers
# (add_external_initializers) instead of being serialized into the model: no serialized copy, and no 2 GB
# protobuf limit (docs/runtime.md, Weights).
EXTERNAL_WEIGHT_BYTES = 1024
# ONNX ops whose weights ORT's CPU kernels pre-pack at session creation (not done for shared initializers).
_PREPACKED = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN", "MatMulInteger",
                        "ConvInteger", "QLinearMatMul", "QLinearConv"})
# A run that took longer than this goes through the interruptible path next time (Ctrl-C ends it promptly).
SLOW_RUN_SECONDS = 0.02


# -- threads ------------------------------------------------------------------------------------------
# mnjit's sessions run on one intra-op pool (mnjit/ffi.py): created with the first session, sized here.
_threads: dict = {"intra_op": None, "pool": None}
_MAX_DEFAULT_THREADS = 8


def set_intra_op_threads(count: int) -> None:
    """Sets how many threads ORT computes a kernel with: the caller's and count - 1 pool threads.

    mnjit's sessions share one pool (the caller's thread counts as one of its threads), so OS threads stay
    flat however many signatures are cached, and its threads sleep between kernels. The default is one
    thread per core available to the process, at most 8. The pool is made with the first session: set the
    count before, a different count afterwards raises RuntimeError. Sessions the pool cannot serve (weights
    over mnjit.ffi.MAX_WEIGHT_BYTES, float8/int4 dtypes, no C++ compiler: mnjit.ffi.status()) compute on the
    calling thread unless a count is set, which gives each of them a pool of its own.
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"intra-op threads must be a positive integer, got {count!r}")
    if _threads["pool"] is not None and _threads["pool"] != count:
        raise RuntimeError(f"mnjit's ORT thread pool already runs {_threads['pool']} threads; set the count "
                           "before the first call")
    _threads["intra_op"] = count


def intra_op_threads() -> int:
    """The thread count of mnjit's shared pool (set_intra_op_threads)."""
    if _threads["intra_op"] is not None:
        return _threads["intra_op"]
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                      _MAX_DEFAULT_THREADS))


def pool_created(count: int) -> None:
    """Records the size of the pool mnjit.ffi created: later counts must match it."""
    _threads["pool"] = count


def session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    # Measured: lower levels ran a CNN 1.4-1.6x slower; PARALLEL mode 1.8-19x slower.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    # No shared pool reaches these sessions (they are ORT's Python module's): the calling thread only, unless
    # a count was set.
    options.intra_op_num_threads = _threads["intra_op"] or 1
    options.inter_op_num_threads = 1
    # ORT's pool threads spin between kernels by default. With other work on the cores (a loaded
    # 2-core machine, measured), spinning made the CFD rollout 2.3x and the FIRE step 1.7x slower than
    # with sleeping threads (on a quiet machine the two were within 5%).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def create_session(model: ir.Model, providers: Sequence[str]) -> tuple[ort.InferenceSession, list[np.ndarray]]:
    """An ORT session for `model`, whose large initializers ORT takes from the translator's buffers.

    Returns the session and the arrays it reads, which must outlive it.
    """
    options = session_options()
    weights, names, values, shared = [], [], [], []
    swapped: list[tuple[ir.Value, ir.TensorProtocol]] = []
    # ORT drops initializers no node reads before it takes these buffers by name, then fails to find them.
    nodes = list(model.graph.all_nodes())
    read = {id(value) for node in nodes for value in node.inputs if value is not None}
    # ORT 1.32 copies external initializers into buffers of its own. A CPU session also given the same OrtValues
    # as shared initializers uses them in place instead (the copy is freed before the first run), but never
    # pre-packs a shared weight: a MatMul at batch 1 ran 2.2x slower. Weights these ops read keep ORT's copy.
    # ORT's transpose optimizer transposes a constant it pushes a Transpose past in place, under the same name;
    # the shared OrtValue then replaces it by name, untransposed: a broadcast error, or a wrong answer where the
    # shapes still broadcast. It only acts on graphs that hold a Transpose.
    cpu_only = all(provider == "CPUExecutionProvider" for provider in providers)
    share = cpu_only and not any(node.op_type == "Transpose" for node in nodes)
    packed = {id(value) for node in nodes if node.op_type in _PREPACKED and node.domain == ""
              for value in node.inputs if value is not None}
    try:
        for value in model.graph.initializers.values():
            tensor = value.const_value
            if tensor is None or tensor.nbytes < EXTERNAL_WEIGHT_BYTES or id(value) not in read:
                continue
            array = _weight_array(tensor)
            if array is None:
                continue
            weights.append(array)
            names.append(value.name)
            values.append(_ortvalue(array, tensor.dtype))
            if share and id(value) not in packed:
                shared.append((value.name, values[-1]))
            # Serialized as a reference to external data that never gets read: ORT takes the buffer given here.
            value.const_value = ir.ExternalTensor("mnjit-in-memory", 0, tensor.nbytes, tensor.dtype,
                                                  shape=tensor.shape, name=value.name, base_dir="")
            swapped.append((value, tensor))
        proto = ir.to_proto(model)
        if cpu_only and not shared:  # its Transposes must not meet a shared weight (above)
            nchwc.rewrite(proto)  # this CPU's convolution kernels: never part of a saved model
        model_bytes = proto.SerializeToString()
    finally:
        for value, tensor in swapped:
            value.const_value = tensor
    if names:
        options.add_external_initializers(names, values)
    for name, value in shared:
        options.add_initializer(name, value)
    session = ort.InferenceSession(model_bytes, options, providers=list(providers))
    return session, weights


def _weight_array(tensor: ir.TensorProtocol) -> np.ndarray | None:
    """The tensor's data as a C-contiguous numpy array in its storage dtype, or None to serialize it."""
    if tensor.dtype in (ir.DataType.STRING,) or tensor.dtype.itemsize * 8 != tensor.dtype.bitwidth:
        return None  # strings, packed 4-bit types: left to the serializer
    array = np.ascontiguousarray(tensor.numpy())
    return array.reshape(tuple(tensor.shape.numpy()))


def _ortvalue(array: np.ndarray, dtype: ir.DataType):
    if array.dtype in _ML_DTYPES or array.dtype.kind == "V":
        width = np.dtype(f"u{array.dtype.itemsize}")
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(width), int(dtype))
    return ort.OrtValue.ortvalue_from_numpy(array)


# -- running ------------------------------------------------------------------------------------------
class OrtRunner:
    """One ORT session; `run` takes flat jax/numpy leaves and returns flat jax.Arrays."""

    def __init__(self, model: ir.Model, in_avals: Sequence, out_avals: Sequence,
                 providers: Sequence[str] = ("CPUExecutionProvider",)):
        self.session, self._weights = create_session(model, providers)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.in_dtypes = [np.dtype(a.dtype) for a in in_avals]
        self.out_avals = list(out_avals)
        self._weak = [i for i, aval in enumerate(self.out_avals) if getattr(aval, "weak_type", False)]
        self._bool_out = {i for i, aval in enumerate(self.out_avals) if np.dtype(aval.dtype) == _BOOL}
        self._complex_out = {i: np.dtype(aval.dtype) for i, aval in enumerate(self.out_avals)
                             if np.dtype(aval.dtype) in _COMPLEX_PAIRS}
        # float8 outputs: ORT before 1.32 exports them by no DLPack ("Unexpected data type of 19").
        self._float8_out = {i: np.dtype(aval.dtype) for i, aval in enumerate(self.out_avals)
                            if np.dtype(aval.dtype) in FLOAT8}
        self._plain_out = not self._bool_out and not self._complex_out and not self._float8_out
        self._device = jax.devices("cpu")[0]
        self._ort_cpu = _C.OrtDevice(_C.OrtDevice.cpu(), _C.OrtDevice.default_memory(), 0)
        self._c_session = compat.c_session(self.session)
        # Inputs bound by address need ORT's element type and the shape; dtypes ORT cannot take that way
        # (ml_dtypes, complex as pairs) go through OrtValues.
        self._by_address = [dtype not in _ML_DTYPES and dtype not in _COMPLEX_PAIRS for dtype in self.in_dtypes]
        self._run_options = _C.RunOptions()
        self._binding = _C.SessionIOBinding(self._c_session)
        self._binding_lock = threading.Lock()  # the shared binding serves one call at a time
        self._slow = True  # until a run shows otherwise: the first run may be long

    def run(self, leaves: Sequence) -> list[jax.Array]:
        if self._slow and threading.current_thread() is threading.main_thread():
            return self._run_interruptible(leaves)
        if self._binding_lock.acquire(blocking=False):
            try:
                return self._to_jax(self._run_bound(self._binding, leaves, self._run_options))
            finally:
                self._binding_lock.release()
        # Another thread holds the shared binding: a binding of our own (ORT runs sessions concurrently).
        return self._to_jax(self._run_bound(_C.SessionIOBinding(self._c_session), leaves, self._run_options))

    def _run_bound(self, binding, leaves: Sequence, run_options):
        keep_alive = []  # buffers bound by address or OrtValue must live until the run ends
        for name, leaf, dtype, by_address in zip(self.input_names, leaves, self.in_dtypes, self._by_address):
            if type(leaf) is ARRAY_TYPE and leaf.dtype == dtype and by_address:
                leaf.block_until_ready()  # jax computes asynchronously; the address is only valid once ready
                binding.bind_input(name, self._ort_cpu, dtype, leaf.shape, leaf.unsafe_buffer_pointer())
                continue
            # numpy leaves may need jax's dtype canonicalization (int64 -> int32 without x64): a view when
            # the dtypes agree.
            array = np.asarray(leaf, dtype=dtype)
            if dtype in _COMPLEX_PAIRS:
                array = complex_as_pairs(array)
            keep_alive.append(array)
            if dtype in _ML_DTYPES:
                value = _C.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(_ML_DTYPES[dtype][0]),
                                                                      _ML_DTYPES[dtype][1])
            else:
                value = _C.OrtValue.ortvalue_from_numpy(array, self._ort_cpu)
            keep_alive.append(value)
            binding.bind_ortvalue_input(name, value)
        # Outputs are bound afresh every call: ORT allocates new buffers, so arrays returned earlier are
        # never overwritten (a binding reused as-is would write the next run into them).
        for name in self.output_names:
            binding.bind_output(name, self._ort_cpu)
        self._c_session.run_with_iobinding(binding, run_options)
        # The capsules own ORT's output buffers; the binding's own vector is reused by the next call.
        outputs = binding.get_outputs()
        if not self._float8_out:
            return outputs.to_dlpacks(None)
        return [_float8_copy(outputs[i], self._float8_out[i]) if i in self._float8_out else outputs[i].to_dlpack()
                for i in range(len(self.output_names))]

    def _run_interruptible(self, leaves: Sequence) -> list[jax.Array]:
        run_options = _C.RunOptions()
        run_options.log_severity_level = 3  # a terminated run is not worth an error line on stderr

        def terminate():
            run_options.terminate = True

        start = time.perf_counter()
        capsules = run_interruptibly(
            lambda: self._run_bound(_C.SessionIOBinding(self._c_session), leaves, run_options), terminate)
        self._slow = time.perf_counter() - start > SLOW_RUN_SECONDS
        return self._to_jax(capsules)

    def _to_jax(self, capsules: list) -> list[jax.Array]:
        if self._plain_out:
            device = self._device
            # copy=None: zero-copy when 64-byte aligned (ORT's CPU allocator is), else jax copies.
            outputs = [_to_buffer(c, device, None, None, compat.KDL_CPU) for c in capsules]
        else:
            outputs = [self._import(i, capsule) for i, capsule in enumerate(capsules)]
        if self._weak:
            return self._fix_weak(outputs)
        return outputs

    def _import(self, i: int, capsule) -> jax.Array:
        if i in self._float8_out:  # a numpy copy (_float8_copy)
            return jax.device_put(capsule, self._device)
        if i in self._bool_out:  # bool arrives through DLPack as uint8
            return jax.device_put(np.from_dlpack(CapsuleHolder(capsule)).view(_BOOL), self._device)
        if i in self._complex_out:
            pairs = np.from_dlpack(CapsuleHolder(capsule))  # a view of ORT's buffer
            return jax.device_put(pairs_as_complex(pairs, self._complex_out[i]), self._device)
        return _to_buffer(capsule, self._device, None, None, compat.KDL_CPU)

    def _fix_weak(self, outputs: list[jax.Array]) -> list[jax.Array]:
        # Weak types are invisible in StableHLO but callers depend on them (jax-md's
        # FIRE state carries a weak f64 mass). Marking one costs a tiny convert.
        for i in self._weak:
            outputs[i] = compat.mark_weak(outputs[i])
        return outputs



def _float8_copy(value, dtype: np.dtype) -> np.ndarray:
    """A float8 OrtValue's bytes, copied into a numpy array of `dtype` (ORT's numpy() and DLPack export, before
    1.32, take no float8)."""
    raw = (ctypes.c_uint8 * value.tensor_size_in_bytes()).from_address(value.data_ptr())
    return np.frombuffer(raw, np.uint8).copy().view(dtype).reshape(value.shape())


T = TypeVar("T")


def run_interruptibly(work: Callable[[], T], terminate: Callable[[], None], limit: float | None = None) -> T | None:
    """`work()` on a worker thread, so that Ctrl-C reaches the calling (main) thread, which then calls
    `terminate()` (ORT checks its run options' flag between kernels and inside Loop bodies), waits for the
    run to end and re-raises. With a `limit` in seconds, a longer run is terminated and None returned.

    The worker releases a plain lock when done: a Thread.join interrupted by KeyboardInterrupt can return
    early on a later join, and the process would then exit under a running ORT call (std::terminate,
    measured). Exceptions of `work` reach the caller.
    """
    result: list = []
    finished = threading.Lock()
    finished.acquire()

    def worker():
        try:
            result.append(work())
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            result.append(e)
        finally:
            finished.release()

    threading.Thread(target=worker, name="mnjit-run", daemon=True).start()
    try:
        if not finished.acquire(timeout=-1 if limit is None else limit):
            terminate()
            _wait(finished)
            return None
    except KeyboardInterrupt:
        terminate()
        _wait(finished)
        raise
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _wait(finished: threading.Lock) -> None:
    while True:
        try:
            finished.acquire()
            return
        except KeyboardInterrupt:  # a second Ctrl-C: the run is already being ended
            continue


def host_to_jax(array: np.ndarray, device) -> jax.Array:
    """A CPU jax.Array holding `array`, which the caller hands over and must not write to again.

    Through DLPack: zero-copy when the buffer is 64-byte aligned (jax copies otherwise), about 5 us
    against jax.device_put's 27 (docs/runtime.md, OpenVINO section). ml_dtypes do not cross DLPack.
    """
    if array.dtype not in _ML_DTYPES:
        return _to_buffer(array.__dlpack__(), device, None, None, compat.KDL_CPU)
    return jax.device_put(array, device)


class NoOutputRunner:
    """A function whose result holds no arrays (`()`, `{}`, None): nothing to run, as with jax.jit."""

    def run(self, leaves: Sequence) -> list[jax.Array]:
        return []


class DroppedOutputs:
    """Runs a model whose outputs the function does not return (an order token), and returns nothing."""

    def __init__(self, runner) -> None:
        self.runner = runner

    def run(self, leaves: Sequence) -> list[jax.Array]:
        self.runner.run(leaves)
        return []


def complex_as_pairs(array: np.ndarray) -> np.ndarray:
    """A zero-copy float view of a complex array with a trailing (real, imag) axis.

    Through a new unit axis, so that 0-d arrays view too; a strided array is copied once.
    """
    return np.require(array, requirements="C")[..., None].view(_COMPLEX_PAIRS[array.dtype])


def pairs_as_complex(pairs: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The complex view of a float array whose last axis holds (real, imag)."""
    return np.require(pairs, requirements="C").view(dtype)[..., 0]


class CapsuleHolder:
    """Adapts a bare DLPack capsule to the __dlpack__ protocol for the public imports (np.from_dlpack,
    jax.dlpack.from_dlpack); `device` is DLPack's (device type, id) of its buffer."""

    def __init__(self, capsule, device: tuple[int, int] = (compat.KDL_CPU, 0)):
        self._capsule, self._device = capsule, device

    def __dlpack__(self, **_):
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device
