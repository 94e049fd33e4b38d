"""Runs an ONNX model on OpenVINO's CPU plugin with jax/numpy leaves in and jax.Arrays out.

The model is read through OpenVINO's ONNX frontend and compiled once per signature with the f32
precision hint: without it, CPUs with avx512_bf16 compute f32 models in bf16 (errors of 1e-3 to
1e-1, docs/runtime.md). Inputs are wrapped as OpenVINO tensors over the caller's buffers (no copy);
outputs are copied once out of the infer request's buffers, which the next run overwrites.
"""
from __future__ import annotations

import threading
from typing import Sequence

import jax
import ml_dtypes
import numpy as np
import onnx
import openvino as ov

from hlo2onnx.compat import mark_weak
from mnjit.runtime import complex_as_pairs, host_to_jax, pairs_as_complex

_COMPLEX64 = np.dtype(np.complex64)
# numpy dtypes OpenVINO tensors take directly; bf16 goes through a uint16 view typed as bf16.
_OV_TYPES = {np.dtype(n): t for n, t in (
    ("bool", ov.Type.boolean), ("int8", ov.Type.i8), ("int16", ov.Type.i16), ("int32", ov.Type.i32),
    ("int64", ov.Type.i64), ("uint8", ov.Type.u8), ("uint16", ov.Type.u16), ("uint32", ov.Type.u32),
    ("uint64", ov.Type.u64), ("float16", ov.Type.f16), ("float32", ov.Type.f32), ("float64", ov.Type.f64))}
_BF16 = np.dtype(ml_dtypes.bfloat16)
_OV_TYPES[_BF16] = ov.Type.bf16
_STORAGE = {_COMPLEX64: np.dtype(np.float32)}  # complex crosses as (real, imag) float pairs

# Compile settings (docs/runtime.md, OpenVINO section): f32 is mandatory for correctness. NUM_STREAMS=0 runs
# each inference on the calling thread with the plugin's shared thread pool, so a signature adds no OS
# threads (a LATENCY or 1-stream model adds 2 each: 100 over 50 signatures) and runs as fast (measured);
# pinning is off because the cores are shared with jax and other work.
COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 0, "ENABLE_CPU_PINNING": "NO"}

# A read-only input (a jax array's numpy view) this small is copied into its OpenVINO tensor: 1.2 us against
# 4.1 for wrapping it writable and sharing it (measured on f32[4]); larger ones are shared.
_COPY_BYTES = 16384

_core: list[ov.Core] = []
_core_lock = threading.Lock()


def core() -> ov.Core:
    """The process's one OpenVINO Core (its plugins and thread pools are shared by every compiled model)."""
    with _core_lock:
        if not _core:
            _core.append(ov.Core())
        return _core[0]


class OpenVinoCompileError(RuntimeError):
    """OpenVINO refused a model that the target's op table let through (an OpenVINO limitation)."""


def _first_line(error: Exception) -> str:
    # OpenVINO's messages start with lines of source locations; the check that failed is the last one.
    lines = [line for line in str(error).splitlines() if line.strip() and not line.startswith("Exception from")]
    return lines[-1] if lines else str(error)


class OpenVinoRunner:
    """One compiled OpenVINO model; `run` takes flat jax/numpy leaves and returns flat jax.Arrays.

    The model is run as written: the pipeline wrote it for openvino-cpu, rewrites included
    (hlo2onnx/targets/openvino_rewrite.py), as for any other front end."""

    def __init__(self, model_bytes: bytes, in_avals: Sequence, out_avals: Sequence):
        self.in_dtypes = [np.dtype(a.dtype) for a in in_avals]
        self.out_avals = list(out_avals)
        for dtype in {*self.in_dtypes, *(np.dtype(a.dtype) for a in self.out_avals)}:
            if dtype not in _OV_TYPES and dtype not in _STORAGE:
                raise TypeError(f"OpenVINO runner: dtype {dtype} cannot cross into OpenVINO")
        proto = onnx.load_from_string(model_bytes)
        onnx_inputs = [v.name for v in proto.graph.input]
        onnx_outputs = [v.name for v in proto.graph.output]
        if len(onnx_inputs) != len(in_avals) or len(onnx_outputs) != len(out_avals):
            raise ValueError(f"ONNX model has {len(onnx_inputs)} inputs and {len(onnx_outputs)} outputs, "
                             f"the signature {len(in_avals)} and {len(out_avals)}")
        try:
            model = core().read_model(model_bytes)
        except RuntimeError as e:
            raise OpenVinoCompileError(f"OpenVINO's ONNX frontend refused the model: {_first_line(e)}") from e
        # OpenVINO drops inputs no node reads: leaves are matched to the inputs it kept by name.
        position = {name: i for i, name in enumerate(onnx_inputs)}
        self._feeds = [position[_name(port, position)] for port in model.inputs]
        try:
            self.compiled = core().compile_model(model, "CPU", COMPILE_CONFIG)
        except RuntimeError as e:
            raise OpenVinoCompileError(f"OpenVINO's CPU plugin could not compile the model: {_first_line(e)}") from e
        ports = {}
        for k, port in enumerate(self.compiled.outputs):
            ports.update(dict.fromkeys(port.get_names(), k))
        missing = [name for name in onnx_outputs if name not in ports]
        if missing:
            raise ValueError(f"OpenVINO's compiled model lacks the ONNX outputs {missing}")
        self._fetch = [ports[name] for name in onnx_outputs]
        self._out_dtypes = [np.dtype(a.dtype) for a in self.out_avals]
        self._out_shapes = [tuple(a.shape) for a in self.out_avals]
        self._weak = [i for i, a in enumerate(self.out_avals) if getattr(a, "weak_type", False)]
        self._device = jax.devices("cpu")[0]
        self._request = self.compiled.create_infer_request()
        self._lock = threading.Lock()  # the shared request serves one call at a time

    def run(self, leaves: Sequence) -> list[jax.Array]:
        tensors = [self._tensor(leaves[i], self.in_dtypes[i]) for i in self._feeds]
        if self._lock.acquire(blocking=False):
            try:
                return self._infer(self._request, tensors)
            finally:
                self._lock.release()
        # Another thread is running the shared request: a request of our own (OpenVINO runs them concurrently).
        return self._infer(self.compiled.create_infer_request(), tensors)

    def _tensor(self, leaf, dtype: np.dtype) -> ov.Tensor:
        # np.asarray of a CPU jax.Array is a view of its buffer (after jax finishes computing it); numpy
        # leaves may need jax's dtype canonicalization (int64 -> int32 without x64): a view when dtypes agree.
        array = np.require(np.asarray(leaf, dtype=dtype), requirements="C")  # ascontiguousarray makes 0-d 1-d
        if dtype in _STORAGE:
            array = complex_as_pairs(array)
        elif dtype == _BF16:
            return ov.Tensor(array.view(np.uint16), array.shape, ov.Type.bf16)
        if not array.flags.writeable:
            if array.nbytes <= _COPY_BYTES:
                return ov.Tensor(array, shared_memory=False)
            # OpenVINO shares only writable buffers; it never writes inputs, so a writable view is safe.
            array = _writable_view(array)
        return ov.Tensor(array, shared_memory=True)

    def _infer(self, request: ov.InferRequest, tensors: list[ov.Tensor]) -> list[jax.Array]:
        for i, tensor in enumerate(tensors):
            request.set_input_tensor(i, tensor)
        request.infer()
        outputs = []
        for i, (dtype, shape) in enumerate(zip(self._out_dtypes, self._out_shapes)):
            if 0 in shape:  # OpenVINO reports 0-size outputs as shape []; they hold no data anyway
                outputs.append(jax.device_put(np.empty(shape, dtype), self._device))
                continue
            data = request.get_output_tensor(self._fetch[i]).data  # a view of the request's buffer, reused next run
            if dtype in _STORAGE:
                data = pairs_as_complex(data, dtype)
            elif dtype == _BF16:
                data = data.view(_BF16)
            if data.shape != shape and data.size == np.prod(shape, dtype=int):
                data = data.reshape(shape)  # OpenVINO gives some scalar results (a sum over nothing) shape [1]
            if data.dtype != dtype or data.shape != shape:
                raise RuntimeError(f"OpenVINO output {i} is {data.dtype}{list(data.shape)}, "
                                   f"expected {dtype}{list(shape)}")
            # The one copy: the request's buffer is overwritten by the next run (jax would alias it if aligned).
            outputs.append(host_to_jax(np.array(data), self._device))
        for i in self._weak:
            outputs[i] = mark_weak(outputs[i])
        return outputs


def _name(port, known: dict[str, int]) -> str:
    names = port.get_names() & known.keys()
    if len(names) != 1:
        raise ValueError(f"OpenVINO port {port} matches {sorted(names)} of the ONNX names")
    return names.pop()


def _writable_view(array: np.ndarray) -> np.ndarray:
    """A writable ndarray over a read-only array's memory: OpenVINO shares only writable buffers, and
    never writes its inputs. The view keeps `array` (and so the jax buffer behind it) alive."""
    return np.asarray(_Writable(array))


class _Writable:
    """A read-only array's buffer, described through the array interface as writable."""

    def __init__(self, array: np.ndarray):
        self._array = array
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface

