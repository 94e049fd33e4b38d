"""Rounding an f32 value to bfloat16 or float16 in f32 arithmetic, exactly as a Cast does (round to nearest,
ties to even, subnormals and overflow to inf included), for runtimes that drop a Cast to a narrower float
inside a graph.

OpenVINO 2026.4's CPU plugin computes f32 -> bf16 -> f32 as the identity where the CPU lacks bf16 units (its
OPTIMIZATION_CAPABILITIES without BF16, or ONEDNN_MAX_CPU_ISA=AVX2 on one that has them; it still lists BF16
then), and f32 -> f16 -> f32 likewise on every CPU measured (none had FP16 among its capabilities): 2.179074
came back instead of bf16's 2.171875, 1 + 2**-12 instead of f16's 1.0. The capability a model was written on
says nothing of the machine that runs it, so openvino-cpu's rewrite rounds before every such Cast on every
machine; the Cast of a rounded value is exact, kept or dropped.

The rounding, with only ops that are exact in f32 (products by powers of two, comparisons, selects) but one
addition that rounds as the narrow type does:
1. p = 2**floor(log2 |x|), at least the narrow type's smallest normal, by a binary search over exponents (no
   bit access: BitCast is opset 26);
2. C = p * 2**(24 - significand bits): |x| + C rounds (in f32, to nearest even) to the narrow type's spacing
   at |x|, and (|x| + C) - C is that rounding (C is computed, not a constant: graph optimizers would fold
   (x + c) - c);
3. values near f32's top are scaled down by 2**-32 first (C would overflow), f16's above its range go to inf,
   a negative x is rounded with -C (rounding to nearest is symmetric), and zeros' signs and NaN are put back.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Narrow type -> (significand bits, smallest normal exponent, largest finite value or None for f32's range).
FORMATS = {onnx.TensorProto.BFLOAT16: (8, -126, None), onnx.TensorProto.FLOAT16: (11, -14, 65504.0)}
_STEPS = (64, 32, 16, 8, 4, 2, 1)  # exponent steps: 127 levels up, 126 down


class _Nodes:
    """Nodes appended in order, with fresh names under `base`."""

    def __init__(self, base: str, counter: list[int]):
        self.base, self.counter, self.nodes = base, counter, []

    def fresh(self) -> str:
        self.counter[0] += 1
        return f"{self.base}__round{self.counter[0]}"

    def const(self, value: float, dtype=np.float32) -> str:
        name = self.fresh()
        self.nodes.append(helper.make_node("Constant", [], [name],
                                           value=numpy_helper.from_array(np.asarray(value, dtype), name)))
        return name

    def op(self, op_type: str, *inputs: str) -> str:
        out = self.fresh()
        self.nodes.append(helper.make_node(op_type, list(inputs), [out]))
        return out


def round_as(x: str, narrow: int, base: str, counter: list[int]) -> tuple[list[onnx.NodeProto], str]:
    """Nodes computing the f32 value `x` rounded to the f32-representable values of `narrow` (a
    TensorProto element type in FORMATS), and the name of the result."""
    bits, min_exponent, largest = FORMATS[narrow]
    n = _Nodes(base, counter)
    a = n.op("Abs", x)
    if largest is not None:  # past the range everything is inf: no larger exponent matters
        a = n.op("Min", a, n.const(2.0 ** (int(np.log2(largest)) + 1)))
    low = n.op("Max", a, n.const(2.0 ** min_exponent))  # the spacing of subnormals is the smallest normal's
    steps = _STEPS if largest is None else tuple(s for s in _STEPS if s < 2 * (-min_exponent + 1))
    p = n.const(1.0)
    for k in steps:  # up: the largest power of two <= low, for low >= 1
        bigger = n.op("Mul", p, n.const(2.0 ** k))
        p = n.op("Where", n.op("GreaterOrEqual", low, bigger), bigger, p)
    for k in steps:  # down: the smallest power of two > low, for low < 1 (p <= low already stays)
        smaller = n.op("Mul", p, n.const(2.0 ** -k))
        p = n.op("Where", n.op("Greater", smaller, low), smaller, p)
    p = n.op("Where", n.op("Greater", p, low), n.op("Mul", p, n.const(0.5)), p)
    # Near f32's top, C = p * 2**shift would overflow: scale by 2**-32 (exact there) and back.
    scale = n.op("Where", n.op("GreaterOrEqual", p, n.const(2.0 ** 64)), n.const(2.0 ** -32), n.const(1.0))
    c = n.op("Mul", n.op("Mul", p, scale), n.const(2.0 ** (24 - bits)))
    c = n.op("Where", n.op("Less", x, n.const(0.0)), n.op("Mul", c, n.const(-1.0)), c)  # rounds -x as x
    clipped = x if largest is None else n.op("Clip", x, n.const(-(2.0 ** 16)), n.const(2.0 ** 16))
    rounded = n.op("Div", n.op("Sub", n.op("Add", n.op("Mul", clipped, scale), c), c), scale)
    if largest is not None:  # f16's overflow, with x's sign (|rounded| > largest is not 0)
        rounded = n.op("Where", n.op("Greater", n.op("Abs", rounded), n.const(largest)),
                       n.op("Mul", rounded, n.const(np.inf)), rounded)
    # A zero takes x's sign, as far as the runtimes keep it (ORT and OpenVINO gave +0.0 for -0.0 here, the
    # reference implementation -0.0); NaN stays NaN (every comparison above is false for it).
    tiny = n.op("Mul", n.op("Mul", x, n.const(2.0 ** -100)), n.const(2.0 ** -100))
    rounded = n.op("Where", n.op("Equal", rounded, n.const(0.0)), tiny, rounded)
    return n.nodes, n.op("Where", n.op("IsNaN", x), x, rounded)
