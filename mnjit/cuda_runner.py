"""ONNX Runtime's CUDA provider with jax GPU arrays in and out, no host copies.

Inputs are bound by their device address (IOBinding); outputs are allocated by
ORT on the same GPU and handed to jax through DLPack, so they stay on the GPU
as jax arrays. Needs the `cuda` extra (onnxruntime-gpu and jax's CUDA plugin).
Written against ORT's documented IOBinding API; it runs only where a GPU is
(tests/test_cuda.py skips elsewhere).
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from hlo2onnx import compat
from mnjit.runtime import CapsuleHolder, create_session

_C = compat.ort_capi()


class CudaOrtRunner:
    """One ORT session on a GPU; `run` takes flat jax arrays (moved to the GPU if they are not there)."""

    def __init__(self, model: ir.Model, in_avals: Sequence, out_avals: Sequence, providers: Sequence[str]):
        self._device = jax.devices("gpu")[0]
        device_id = self._device.local_hardware_id or 0
        # onnxruntime-gpu finds the CUDA and cuDNN libraries of the nvidia-* wheels (which jax's CUDA plugin
        # and onnxruntime-gpu[cuda,cudnn] install) only once they are loaded; a no-op in CPU builds.
        ort.preload_dlls(msvc=False)
        options = [{"device_id": str(device_id)} if p != "CPUExecutionProvider" else {} for p in providers]
        self.session, self._weights = create_session(model, list(zip(providers, options)))
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.in_dtypes = [np.dtype(a.dtype) for a in in_avals]
        self._ort_gpu = _C.OrtDevice(_C.OrtDevice.cuda(), _C.OrtDevice.default_memory(), device_id)
        self._run_options = _C.RunOptions()
        self._c_session = compat.c_session(self.session)

    def run(self, leaves: Sequence) -> list[jax.Array]:
        binding = _C.SessionIOBinding(self._c_session)
        keep_alive = []
        for name, leaf, dtype in zip(self.input_names, leaves, self.in_dtypes):
            array = jax.device_put(jax.numpy.asarray(leaf, dtype=dtype), self._device)  # no-op when already there
            array.block_until_ready()  # jax's stream must have written it before ORT's stream reads it
            keep_alive.append(array)
            binding.bind_input(name, self._ort_gpu, dtype, array.shape, array.unsafe_buffer_pointer())
        for name in self.output_names:
            binding.bind_output(name, self._ort_gpu)
        self._c_session.run_with_iobinding(binding, self._run_options)
        binding.synchronize_outputs()  # ORT's stream has finished writing before jax reads
        device_id = self._device.local_hardware_id or 0
        return [jax.dlpack.from_dlpack(CapsuleHolder(c, (compat.KDL_CUDA, device_id)))
                for c in binding.get_outputs().to_dlpacks(None)]

