"""mnjit: jax.jit's interface, ONNX Runtime's execution.

    from mnjit import mnjit
    step = mnjit(step)        # instead of jax.jit(step)
"""
from __future__ import annotations

import jax

# The capture and runtime rely on behaviour measured on this range (docs/runtime.md).
_SUPPORTED_JAX = ((0, 10), (0, 11))
_version = tuple(int(p) for p in jax.__version__.split(".")[:2])
if not (_SUPPORTED_JAX[0] <= _version < _SUPPORTED_JAX[1]):
    raise ImportError(
        f"mnjit supports jax 0.10.x; found jax {jax.__version__}. Install with: pip install 'jax>=0.10,<0.11'")

from mnjit.api import MnjitFunction, MnjitLowered, mnjit  # noqa: E402

__all__ = ["mnjit", "MnjitFunction", "MnjitLowered"]
__version__ = "0.1.0"
