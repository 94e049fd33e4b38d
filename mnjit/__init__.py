"""mnjit: jax.jit's interface, ONNX Runtime's execution.

    from mnjit import mnjit
    step = mnjit(step)        # instead of jax.jit(step)

    from mnjit import nnx_jit
    step = nnx_jit(step)      # instead of flax's nnx.jit(step): nnx objects are updated in place
"""
from __future__ import annotations

# The capture and runtime rely on private APIs checked on a range of jax and ONNX Runtime releases:
# importing compat refuses a jax outside it, ort_capi() an onnxruntime outside it, with a clear message.
from hlo2onnx import compat

compat.ort_capi()

from mnjit.api import MnjitFunction, mnjit  # noqa: E402
from mnjit.disk_cache import configure as configure_cache  # noqa: E402
from mnjit.flax_nnx import NnxJitFunction, nnx_jit  # noqa: E402
from mnjit.stages import Compiled, MnjitLowered  # noqa: E402
# Top-level names for the helpers: after `from mnjit import mnjit`, the name mnjit is the function, and
# mnjit.runtime or mnjit.tiering would be looked up on it.
from mnjit.runtime import intra_op_threads, set_intra_op_threads  # noqa: E402
from mnjit.tiering import TierPolicy, TierStatus, settle  # noqa: E402

__all__ = ["mnjit", "MnjitFunction", "MnjitLowered", "Compiled", "nnx_jit", "NnxJitFunction", "set_intra_op_threads",
           "intra_op_threads", "settle", "TierPolicy", "TierStatus", "configure_cache"]
__version__ = "0.1.0"
