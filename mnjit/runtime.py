"""Runs an ONNX model on ONNX Runtime with jax.Arrays in and out, through DLPack.

The per-call path uses ORT's C-level `run_with_ortvaluevector` and jax's raw
DLPack import: the public wrappers cost tens of microseconds per call
(findings.md). Both are private, so each has a public fallback chosen once
at import.
"""
from __future__ import annotations

from typing import Sequence

import jax
import ml_dtypes
import numpy as np
import onnxruntime as ort
from jax._src.lib import _jax  # raw DLPack import; public fallback below

_C = ort.capi._pybind_state
_FAST_RUN = hasattr(_C.InferenceSession, "run_with_ortvaluevector") and hasattr(_C, "OrtValueVector")
_FAST_IMPORT = hasattr(_jax, "dlpack_managed_tensor_to_buffer")
_ARRAY_TYPE = type(jax.numpy.zeros(()))
_KDL_CPU = 1
_BOOL = np.dtype(np.bool_)
# dtype -> (same-width unsigned view, ONNX TensorProto type)
_ML_DTYPES = {
    np.dtype(ml_dtypes.bfloat16): (np.uint16, 16),
    np.dtype(ml_dtypes.float8_e4m3fn): (np.uint8, 17),
    np.dtype(ml_dtypes.float8_e5m2): (np.uint8, 19),
}
# The graph holds complex tensors as float (real, imag) pairs on a trailing axis (hlo2onnx TensorType.storage).
_COMPLEX_PAIRS = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}
_NO_DLPACK = frozenset({_BOOL, *_ML_DTYPES, *_COMPLEX_PAIRS})


def _dlpack_pusher():
    """OrtValueVector's push of a DLPack capsule, chosen once: ORT <= 1.31 takes an is_bool flag, 1.32 dropped it."""
    push = _C.OrtValueVector.push_back
    try:
        push(_C.OrtValueVector(), np.zeros(1, np.float32).__dlpack__(), False)
        return lambda vector, capsule: push(vector, capsule, False)
    except TypeError:
        return push


_push_dlpack = _dlpack_pusher() if _FAST_RUN else None


def session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    # Measured: lower levels ran a CNN 1.4-1.6x slower; PARALLEL mode 1.8-19x slower.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    # ORT's pool threads spin between kernels by default. With other work on the cores (a loaded
    # 2-core machine, measured), spinning made the CFD rollout 2.3x and the FIRE step 1.7x slower than
    # with sleeping threads (on a quiet machine the two were within 5%).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class OrtRunner:
    """One ORT session; `run` takes flat jax/numpy leaves and returns flat jax.Arrays."""

    def __init__(self, model_bytes: bytes, in_dtypes: Sequence[np.dtype], out_avals: Sequence,
                 providers: Sequence[str] = ("CPUExecutionProvider",)):
        self.session = ort.InferenceSession(model_bytes, session_options(), providers=list(providers))
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.in_dtypes = [np.dtype(d) for d in in_dtypes]
        self.out_avals = list(out_avals)
        self._weak = [i for i, aval in enumerate(self.out_avals) if getattr(aval, "weak_type", False)]
        self._bool_out = {i for i, aval in enumerate(self.out_avals) if np.dtype(aval.dtype) == _BOOL}
        self._complex_out = {i: np.dtype(aval.dtype) for i, aval in enumerate(self.out_avals)
                             if np.dtype(aval.dtype) in _COMPLEX_PAIRS}
        self._device = jax.devices("cpu")[0]
        self._ort_cpu = _C.OrtDevice(_C.OrtDevice.cpu(), _C.OrtDevice.default_memory(), 0)
        self._fetch_devices = [self._ort_cpu] * len(self.output_names)
        self._run_options = _C.RunOptions()
        self._c_session = self.session._sess

    def run(self, leaves: Sequence) -> list[jax.Array]:
        if not _FAST_RUN:
            return self._run_public(leaves)
        feeds, keep_alive = self.feeds(leaves)
        fetches = self.execute(feeds)
        del keep_alive
        return self.to_jax(fetches)

    def feeds(self, leaves: Sequence):
        """ORT inputs for `leaves`: DLPack views of jax arrays, numpy views of the rest (no copies)."""
        feeds = _C.OrtValueVector()
        keep_alive = []  # ortvalue_from_numpy does not own its buffer
        for leaf, dtype in zip(leaves, self.in_dtypes):
            if type(leaf) is _ARRAY_TYPE and leaf.dtype == dtype and dtype not in _NO_DLPACK:
                _push_dlpack(feeds, leaf.__dlpack__())
                continue
            # Bool does not cross DLPack into ORT, nor do ml_dtypes; numpy leaves may need
            # jax's dtype canonicalization (int64 -> int32 without x64). A view, not a copy, when dtypes agree.
            array = np.asarray(leaf, dtype=dtype)
            if dtype in _COMPLEX_PAIRS:
                array = complex_as_pairs(array)
            keep_alive.append(array)
            if dtype in _ML_DTYPES:  # ORT's numpy bridge knows no ml_dtypes: pass the bits and the ONNX type
                feeds.push_back(_C.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    array.view(_ML_DTYPES[dtype][0]), _ML_DTYPES[dtype][1]))
            else:
                feeds.push_back(_C.OrtValue.ortvalue_from_numpy(array, self._ort_cpu))
        return feeds, keep_alive

    def execute(self, feeds):
        # A fresh output vector every call: ORT allocates new buffers, so arrays
        # returned earlier are never overwritten (no IOBinding reuse).
        fetches = _C.OrtValueVector()
        self._c_session.run_with_ortvaluevector(self._run_options, self.input_names, feeds, self.output_names,
                                                fetches, self._fetch_devices)
        return fetches

    def to_jax(self, fetches) -> list[jax.Array]:
        bools = self._bool_out
        capsules = fetches.to_dlpacks(None)
        outputs = []
        for i, capsule in enumerate(capsules):
            if i in bools:  # bool arrives through DLPack as uint8
                outputs.append(jax.device_put(fetches[i].numpy().astype(_BOOL, copy=False), self._device))
            elif i in self._complex_out:
                pairs = np.from_dlpack(_CapsuleHolder(capsule))  # a view of ORT's buffer
                outputs.append(jax.device_put(pairs_as_complex(pairs, self._complex_out[i]), self._device))
            elif _FAST_IMPORT:
                # copy=None: zero-copy when 64-byte aligned (ORT's CPU allocator is), else jax copies.
                outputs.append(_jax.dlpack_managed_tensor_to_buffer(capsule, self._device, None, None, _KDL_CPU))
            else:
                outputs.append(jax.dlpack.from_dlpack(_CapsuleHolder(capsule)))
        return self._fix_weak(outputs)

    def _run_public(self, leaves: Sequence) -> list[jax.Array]:
        feeds = {}
        for name, leaf, dtype in zip(self.input_names, leaves, self.in_dtypes):
            if type(leaf) is _ARRAY_TYPE and dtype != _BOOL and leaf.dtype == dtype:
                feeds[name] = ort.OrtValue.from_dlpack(leaf)
            elif dtype in _ML_DTYPES:
                feeds[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.asarray(leaf, dtype=dtype).view(_ML_DTYPES[dtype][0]), _ML_DTYPES[dtype][1])
            elif dtype in _COMPLEX_PAIRS:
                feeds[name] = ort.OrtValue.ortvalue_from_numpy(complex_as_pairs(np.asarray(leaf, dtype=dtype)))
            else:
                feeds[name] = ort.OrtValue.ortvalue_from_numpy(np.asarray(leaf, dtype=dtype))
        results = self.session.run_with_ort_values(self.output_names, feeds)
        outputs = []
        for value, aval in zip(results, self.out_avals):
            if np.dtype(aval.dtype) == _BOOL:
                outputs.append(jax.device_put(value.numpy(), self._device))
            elif np.dtype(aval.dtype) in _COMPLEX_PAIRS:
                outputs.append(jax.device_put(pairs_as_complex(value.numpy(), np.dtype(aval.dtype)), self._device))
            else:
                outputs.append(jax.dlpack.from_dlpack(value))
        return self._fix_weak(outputs)

    def _fix_weak(self, outputs: list[jax.Array]) -> list[jax.Array]:
        # Weak types are invisible in StableHLO but callers depend on them (jax-md's
        # FIRE state carries a weak f64 mass). Marking one costs a tiny convert.
        for i in self._weak:
            outputs[i] = _mark_weak(outputs[i])
        return outputs


def complex_as_pairs(array: np.ndarray) -> np.ndarray:
    """A zero-copy float view of a complex array with a trailing (real, imag) axis.

    Through a new unit axis, so that 0-d arrays view too; a strided array is copied once.
    """
    return np.require(array, requirements="C")[..., None].view(_COMPLEX_PAIRS[array.dtype])


def pairs_as_complex(pairs: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The complex view of a float array whose last axis holds (real, imag)."""
    return np.require(pairs, requirements="C").view(dtype)[..., 0]


def _mark_weak(array: jax.Array) -> jax.Array:
    from jax._src.lax import lax as lax_internal  # no public way to set weak_type

    return lax_internal._convert_element_type(array, weak_type=True)


class _CapsuleHolder:
    """Adapts a bare capsule to the __dlpack__ protocol for the public import."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, **_):
        return self._capsule

    def __dlpack_device__(self):
        return (_KDL_CPU, 0)
