"""Activation fusions: Erf, Gelu (erf and tanh forms), Softplus, HardSigmoid, HardSwish, Clip, Relu,
LeakyRelu, Sigmoid and Swish, each matched on the canonical form of what jax.nn emits."""
from __future__ import annotations

import math

import jax
import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult

from hlo2onnx.patterns import templates
from hlo2onnx.patterns.base import Fusion, is_close, numpy_dtype, scalar

_SQRT_HALF = math.sqrt(0.5)


def _constants(result: MatchResult, **expected: tuple) -> MatchResult:
    """Each keyword names a (value, expected) pair; a mismatch explains the failed match."""
    for name, (value, want) in expected.items():
        if not is_close(value, want, rtol=1e-5):
            return result.fail(f"{name} is {scalar(value)}, not {want}", value)
    return result


class Erf(Fusion):
    """chlo's polynomial expansion of erf (one per dtype, taken from JAX itself) -> Erf."""

    op_type = "Erf"

    def __init__(self, opset, target, dtype: str, source: str = "jit"):
        super().__init__(opset, target)
        self.dtype, self.source = dtype, source
        self.name = f"Erf[{dtype},{source}]"

    def pattern(self, op, x):
        return templates.replay(templates.template(jax.lax.erf, self.dtype, self.source), op, x)

    def check(self, context, x, **_) -> MatchResult:
        return self.available(x)

    def rewrite(self, op, x, **_):
        return op.Erf(x)


class Gelu(Erf):
    """jax.nn.gelu(approximate=False): 0.5 x erfc(-x / sqrt 2), with chlo's erfc expansion.

    Gelu from opset 20; before it, 0.5 x (1 + Erf(x / sqrt 2)).
    """

    op_type = "Gelu"

    def __init__(self, opset, target, dtype: str, source: str = "jit"):
        super().__init__(opset, target, dtype, source)
        self.name = f"Gelu[{dtype},{source}]"

    def pattern(self, op, x, half, scale):
        erfc = templates.template(jax.lax.erfc, self.dtype, self.source)
        erfc = templates.replay(erfc, op, op.Mul(op.Neg(x), scale))
        return op.Mul(op.Mul(half, x), erfc)

    def check(self, context, x, half, scale, **_) -> MatchResult:
        result = self.available(x, "Gelu" if self.opset >= 20 else "Erf")
        return _constants(result, half=(half, 0.5), scale=(scale, _SQRT_HALF)) if result else result

    def rewrite(self, op, x, **_):
        if self.opset >= 20:
            return op.Gelu(x)
        dtype = numpy_dtype(x)
        half, one, scale = (op.Constant(value=ir.tensor(np.asarray(c, dtype))) for c in (0.5, 1, _SQRT_HALF))
        return op.Mul(op.Mul(half, x), op.Add(one, op.Erf(op.Mul(x, scale))))


class GeluFromErf(Fusion):
    """x * 0.5 * (1 + erf(x / sqrt 2)) written by hand, once Erf is fused."""

    op_type = "Gelu"
    min_opset = 20

    def pattern(self, op, x, half, one, scale):
        return op.Mul(op.Mul(half, x), op.Add(one, op.Erf(op.Mul(x, scale))))

    def check(self, context, x, half, one, scale, **_) -> MatchResult:
        result = self.available(x)
        return _constants(result, half=(half, 0.5), one=(one, 1), scale=(scale, _SQRT_HALF)) if result else result

    def rewrite(self, op, x, **_):
        return op.Gelu(x)


class GeluFromErfDiv(GeluFromErf):
    def pattern(self, op, x, half, one, scale):
        return op.Mul(op.Mul(half, x), op.Add(one, op.Erf(op.Div(x, scale))))

    def check(self, context, x, half, one, scale, **_) -> MatchResult:
        result = self.available(x)
        return _constants(result, half=(half, 0.5), one=(one, 1), scale=(scale, math.sqrt(2))) if result else result


class GeluTanh(Fusion):
    """jax.nn.gelu(approximate=True): x * 0.5 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    op_type = "Gelu"
    min_opset = 20

    def pattern(self, op, x, c, k, half, one):
        inner = op.Mul(c, op.Add(x, op.Mul(k, op.Mul(op.Mul(x, x), x))))
        return op.Mul(x, op.Mul(half, op.Add(one, op.Tanh(inner))))

    def check(self, context, x, c, k, half, one, **_) -> MatchResult:
        result = self.available(x)
        result = self.available(x, "Gelu:tanh") if result else result  # a target may refuse only this form
        return _constants(result, c=(c, math.sqrt(2 / math.pi)), k=(k, 0.044715), half=(half, 0.5),
                          one=(one, 1)) if result else result

    def rewrite(self, op, x, **_):
        return op.Gelu(x, approximate="tanh")


class Softplus(Fusion):
    """jax.nn.softplus = logaddexp(x, 0): max(x, 0) + log1p(exp(-|x|)), NaN passed through.

    log1p is the translator's accurate form (ops/elementwise/arithmetic.py)."""

    op_type = "Softplus"

    def pattern(self, op, x, zero, zero2, one1, one3):
        u = op.Exp(op.Neg(op.Abs(x)))
        v = op.Add(u, one1)
        log_v = op.Log(v)
        vm1 = op.Sub(v, one3)
        log1p = op.Where(op.Greater(op.Abs(vm1), zero2), op.Where(op.IsInf(v), log_v, op.Mul(log_v, op.Div(u, vm1))), u)
        return op.Where(op.Not(op.Equal(x, x)), x, op.Add(op.Max(x, zero), log1p))

    def check(self, context, x, zero, zero2, one1, one3, **_) -> MatchResult:
        result = self.available(x)
        return _constants(result, zero=(zero, 0), zero2=(zero2, 0), one1=(one1, 1), one3=(one3, 1)) \
            if result else result

    def rewrite(self, op, x, **_):
        return op.Softplus(x)


class HardSigmoid(Fusion):
    """jax.nn.hard_sigmoid: relu6(x + 3) / 6 = HardSigmoid(alpha=1/6, beta=1/2)."""

    op_type = "HardSigmoid"

    def pattern(self, op, x, three, zero, six1, six2):
        return op.Div(op.Min(op.Max(op.Add(x, three), zero), six1), six2)

    def check(self, context, x, three, zero, six1, six2, **_) -> MatchResult:
        result = self.available(x)
        return _constants(result, three=(three, 3), zero=(zero, 0), six1=(six1, 6), six2=(six2, 6)) \
            if result else result

    def rewrite(self, op, x, **_):
        return op.HardSigmoid(x, alpha=1 / 6, beta=0.5)


class HardSwish(Fusion):
    """jax.nn.hard_swish: x * hard_sigmoid(x)."""

    op_type = "HardSwish"
    min_opset = 14

    def pattern(self, op, x):
        return op.Mul(x, op.HardSigmoid(x, _outputs=["hs"]))

    def check(self, context, x, hs, **_) -> MatchResult:
        result = self.available(x)
        attrs = hs.producer().attributes
        if result and not (math.isclose(attrs["alpha"].as_float(), 1 / 6, rel_tol=1e-6)
                           and attrs["beta"].as_float() == 0.5):
            return result.fail("HardSigmoid with other alpha and beta than HardSwish's", hs)
        return result

    def rewrite(self, op, x, **_):
        return op.HardSwish(x)


class Clip(Fusion):
    """min(max(x, lo), hi) with scalar constant bounds (jnp.clip, relu6)."""

    op_type = "Clip"

    def pattern(self, op, x, lo, hi):
        return op.Min(op.Max(x, lo), hi)

    def check(self, context, x, lo, hi, **_) -> MatchResult:
        result = self.available(x)
        if result and (scalar(lo) is None or scalar(hi) is None):
            return result.fail("bounds are not scalar constants", [lo, hi])
        return result

    def rewrite(self, op, x, lo, hi, **_):
        dtype = numpy_dtype(x)
        return op.Clip(x, op.Constant(value=ir.tensor(np.asarray(scalar(lo), dtype))),
                       op.Constant(value=ir.tensor(np.asarray(scalar(hi), dtype))))


class Relu(Fusion):
    """max(x, 0) -> Relu (both propagate NaN)."""

    op_type = "Relu"

    def pattern(self, op, x, zero):
        return op.Max(x, zero)

    def check(self, context, x, zero, **_) -> MatchResult:
        result = self.available(x)
        if result and context.output_values[0].shape != x.shape:
            return result.fail("max broadcasts x", x)
        return _constants(result, zero=(zero, 0)) if result else result

    def rewrite(self, op, x, **_):
        return op.Relu(x)


class LeakyRelu(Fusion):
    """where(x >= 0, x, alpha * x): jax.nn.leaky_relu."""

    op_type = "LeakyRelu"

    def pattern(self, op, x, zero, alpha):
        return op.Where(op.GreaterOrEqual(x, zero), x, op.Mul(alpha, x))

    def check(self, context, x, zero, alpha, **_) -> MatchResult:
        result = self.available(x)
        if result and scalar(alpha) is None:
            return result.fail("the slope is not a scalar constant", alpha)
        if result and context.output_values[0].shape != x.shape:
            return result.fail("where broadcasts x", x)
        return _constants(result, zero=(zero, 0)) if result else result

    def rewrite(self, op, x, alpha, **_):
        return op.LeakyRelu(x, alpha=float(scalar(alpha)))


class Sigmoid(Fusion):
    """1 / (1 + exp(-x)): jax.nn.sigmoid lowers to this, not to logistic."""

    op_type = "Sigmoid"

    def pattern(self, op, x, one1, one2):
        return op.Div(one1, op.Add(one2, op.Exp(op.Neg(x))))

    def check(self, context, x, one1, one2, **_) -> MatchResult:
        result = self.available(x)
        return _constants(result, one1=(one1, 1), one2=(one2, 1)) if result else result

    def rewrite(self, op, x, **_):
        return op.Sigmoid(x)


class Swish(Fusion):
    """x * sigmoid(x): jax.nn.silu; the Swish op exists from opset 24."""

    op_type = "Swish"
    min_opset = 24

    def pattern(self, op, x):
        return op.Mul(x, op.Sigmoid(x))

    def check(self, context, x, **_) -> MatchResult:
        if self.opset > 24:  # measured: ORT 1.32 finds no Swish implementation in opset-25 and -26 models
            return MatchResult().fail(f"Swish is fused at opset 24 only, not {self.opset}", x)
        return self.available(x)

    def rewrite(self, op, x, **_):
        return op.Swish(x)


def rules(opset: int, target, template_dtypes: list[str]) -> list:
    """In order: the erf expansions first (Gelu needs Erf), HardSigmoid and Softplus before Relu eats their max."""
    found = []
    for dtype in template_dtypes:
        found += [Gelu.rule(opset, target, dtype, source) for source in templates.sources(jax.lax.erfc, dtype)]
        found += [Erf.rule(opset, target, dtype, source) for source in templates.sources(jax.lax.erf, dtype)]
    for cls in (GeluFromErf, GeluFromErfDiv, GeluTanh, Softplus, HardSigmoid, HardSwish, Clip, Relu,
                LeakyRelu, Sigmoid, Swish):
        if opset >= cls.min_opset:
            rule = cls.rule(opset, target)
            # Commuted variants only for the small patterns; the long ones are matched in JAX's own order.
            found += rule.commute() if cls not in (GeluTanh, Softplus) else [rule]
    return found
