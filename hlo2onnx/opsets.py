"""The ONNX opsets hlo2onnx writes, and the check of a requested one against them (a target's own opset is
resolved in hlo2onnx.targets, which builds on this module)."""
from __future__ import annotations

# Rules use the opset-18 Reduce* forms; 23 brings ONNX Attention and RMSNormalization, 24 Swish, 26 BitCast
# (ORT 1.32 and OpenVINO 2026.4 run 26; see docs/formats.md). Defined in hlo2onnx.defaults, which the command's
# --help reads without loading jax.
from hlo2onnx.defaults import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET  # noqa: F401  (public here too)
from hlo2onnx.errors import Hlo2OnnxError


class OpsetError(Hlo2OnnxError, ValueError):
    """An opset outside MIN_OPSET..MAX_OPSET (a ValueError too: mnjit's callers catch that)."""


def check_opset(opset: object) -> int:
    """`opset`, or OpsetError when hlo2onnx cannot write it (ORT would reject the model later)."""
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise OpsetError(f"opset {opset!r} is not supported (choose {MIN_OPSET} to {MAX_OPSET})")
    return opset
