"""Scaled dot-product attention: softmax(q @ k^T * scale) @ v -> ONNX Attention (opset 23 on).

Matched on 4-D [batch, heads, seq, head_dim] operands, after the Softmax
fusion: the scores' scale is a scalar constant (multiplied or divided), k^T
is any value whose last two axes are the keys' (a Transpose is added to
give Attention k itself; the clean-up merges it with the one that made k^T).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult

from hlo2onnx.patterns.base import Fusion, numpy_dtype, scalar
from hlo2onnx.patterns.cleanup import known_dims

# ORT's CPU and CUDA kernels take these (docs/OperatorKernels.md, Attention 23).
_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


class Attention(Fusion):
    op_type = "Attention"
    min_opset = 23
    divide = True  # scores / s (jnp code) or scores * s

    def pattern(self, op, q, kt, scale, v):
        scores = op.MatMul(q, kt)
        scaled = op.Div(scores, scale) if self.divide else op.Mul(scores, scale)
        return op.MatMul(op.Softmax(scaled, _outputs=["probs"]), v)

    def check(self, context, q, kt, scale, v, probs, **_) -> MatchResult:
        result = self.available(q)
        if not result:
            return result
        if numpy_dtype(q) not in _DTYPES:
            return result.fail(f"Attention kernels take float32/float16, not {numpy_dtype(q)}", q)
        # Symbolic batch and sequence dims (None) pair with symbolic ones: the MatMuls come from dot_generals,
        # whose batch and contracted dims StableHLO makes equal. Heads and head_dim must be static.
        shapes = [known_dims(t) for t in (q, kt, v)]
        if any(s is None or len(s) != 4 for s in shapes):
            return result.fail(f"needs 4-D [batch, heads, seq, head_dim] operands, got {shapes}", [q, kt, v])
        (b, h, _, d), (kb, kh, kd, s), (vb, vh, vs, _) = shapes
        if None in (h, d) or (kb, kh, kd) != (b, h, d) or (vb, vh, vs) != (b, h, s):
            return result.fail(f"q {shapes[0]}, k^T {shapes[1]} and v {shapes[2]} do not line up", [q, kt, v])
        axis = probs.producer().attributes["axis"].as_int() if "axis" in probs.producer().attributes else -1
        if axis % 4 != 3:
            return result.fail(f"softmax over axis {axis}, not the keys' axis", probs)
        factor = scalar(scale)
        if factor is None or factor == 0:
            return result.fail("the scores' scale is not a non-zero scalar constant", scale)
        self._scale = float(1 / factor if self.divide else factor)
        return result

    def rewrite(self, op, q, kt, v, **_):
        k = op.Transpose(kt, perm=[0, 1, 3, 2])
        return op.Attention(q, k, v, scale=self._scale)


class AttentionMul(Attention):
    divide = False


class AttentionUnscaled(Attention):
    """softmax(q @ k^T) @ v, scale 1."""

    def pattern(self, op, q, kt, v):
        return op.MatMul(op.Softmax(op.MatMul(q, kt), _outputs=["probs"]), v)

    def check(self, context, q, kt, v, probs, **_) -> MatchResult:
        one = ir.Value(name="one", const_value=ir.tensor(np.asarray(1.0, np.float32)))
        return super().check(context, q, kt, one, v, probs)


def rules(opset: int, target) -> list:
    return [rule for cls in (Attention, AttentionMul, AttentionUnscaled) if opset >= cls.min_opset
            for rule in cls.rule(opset, target).commute()]
