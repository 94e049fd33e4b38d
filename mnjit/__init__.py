"""mnjit: jax.jit's interface, ONNX Runtime's execution.

    from mnjit import mnjit
    step = mnjit(step)        # instead of jax.jit(step)
"""
from __future__ import annotations

# The capture and runtime rely on private APIs checked on a range of jax and ONNX Runtime releases:
# importing compat refuses a jax outside it, ort_capi() an onnxruntime outside it, with a clear message.
from hlo2onnx import compat

compat.ort_capi()

from mnjit.api import MnjitFunction, mnjit  # noqa: E402
from mnjit.flax_nnx import NnxJitFunction, nnx_jit  # noqa: E402
from mnjit.stages import Compiled, MnjitLowered  # noqa: E402

__all__ = ["mnjit", "MnjitFunction", "MnjitLowered", "Compiled", "nnx_jit", "NnxJitFunction"]
__version__ = "0.1.0"
