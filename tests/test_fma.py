"""stablehlo.fma (a * b + c rounded once) bit for bit: against the exact value (Python fractions, rounded to
nearest even by hand) in f16, bf16, f32 and f64, and against jax.jit in f32 and f64 (XLA's CPU has no f16 or
bf16 fma: "UNIMPLEMENTED: Fma is not supported for element type f16 on CPU").

The corpora construct the cases a plain Mul then Add gets wrong (each asserts that it does on some rows):
products exactly halfway between two neighbours with a tiny c of either sign (where computing in a wider
type and rounding once more is wrong too), sums a hair off a midpoint (the product's own low bits, or a tail
far below the midpoint's last place), signed zeros with every special value,
and the extremes of each format: products past the range that c brings back, both terms tiny, subnormal
results. jax.jit is compared where no input or result is subnormal: XLA's CPU flushes those to zero
(tests/test_precision.py), where the exact value and ORT keep gradual underflow. NaN compares as NaN, not by
its bits. lax.fma exists from jax 0.12.1 on; lax.erf_inv and polynomials (lax.fmuladd's Horner steps, fma on
0.12.1) run on every jax.
"""
from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import hlo2onnx
from harness import Case, run_case
from mnjit import mnjit

F16, BF16, F32, F64 = (np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64))
DTYPES = [F16, BF16, F32, F64]
HAS_FMA = hasattr(lax, "fma") and jax.__version_info__ >= (0, 12, 1)
needs_fma = pytest.mark.skipif(not HAS_FMA, reason=f"jax {jax.__version__} has no lax.fma (from 0.12.1 on)")
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


# -- the exact reference -------------------------------------------------------------------------------------
def round_to(v: Fraction, dtype, extra: int = 0) -> Fraction | float:
    """v rounded to nearest even in `dtype` (gradual underflow, overflow to inf); with `extra` more bits of
    significand (and of subnormal quantum), as a Fraction. A zero result is +0: the caller signs it."""
    info = ml_dtypes.finfo(dtype)
    nmant, minexp, maxexp = int(info.nmant) + extra, int(info.minexp), int(info.maxexp)
    if v == 0:
        return 0.0
    m = abs(v)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    e -= Fraction(2) ** e > m
    quantum = Fraction(2) ** (max(e, minexp) - nmant)
    n, rest = divmod(m, quantum)
    n = int(n) + (rest > quantum / 2 or rest == quantum / 2 and n % 2 == 1)
    result = n * quantum
    if extra:
        return result if v > 0 else -result
    out = math.inf if result >= Fraction(2) ** maxexp else float(result)  # a number of dtype: a double
    return out if v > 0 else -out


def is_midpoint(v: Fraction, dtype) -> bool:
    return round_to(v, dtype) != v and round_to(v, dtype, extra=1) == v


def exact_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype) -> np.ndarray:
    """IEEE fusedMultiplyAdd, element by element: special values as a * b + c with the product unrounded."""
    out = []
    for x, y, z in zip(*(np.asarray(v).astype(np.float64).ravel().tolist() for v in (a, b, c))):
        if not (math.isfinite(x) and math.isfinite(y)):
            out.append(x * y + z)
        elif not math.isfinite(z):
            out.append(z)
        else:
            v = Fraction(x) * Fraction(y) + Fraction(z)
            if v != 0:
                rounded = round_to(v, dtype)  # a result rounded to 0 keeps v's sign
                out.append(rounded if rounded != 0 else math.copysign(0.0, v.numerator))
            else:  # -0 only for a zero product of sign - plus -0; an exact cancellation is +0
                product_negative = math.copysign(1, x) * math.copysign(1, y) < 0
                out.append(-0.0 if (x == 0 or y == 0) and product_negative and math.copysign(1, z) < 0 else 0.0)
    return np.array(out).astype(dtype)


def same_bits(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Elementwise: identical bits, or both NaN."""
    x, y = np.asarray(x), np.asarray(y)
    nan = np.isnan(x.astype(np.float64)) & np.isnan(y.astype(np.float64))
    return (x.view(_UINT[x.dtype.itemsize]) == y.view(_UINT[y.dtype.itemsize])) | nan


def assert_bits(actual, expected, a, b, c, what: str) -> None:
    ok = same_bits(actual, expected)
    if not ok.all():
        rows = [f"fma({a[i]!r}, {b[i]!r}, {c[i]!r}) = {actual[i]!r}, not {expected[i]!r}"
                for i in np.flatnonzero(~ok)[:8]]
        pytest.fail(f"{what}: {(~ok).sum()} of {ok.size} differ:\n" + "\n".join(rows))


def naive(a, b, c, dtype) -> np.ndarray:
    """Mul then Add, each rounded to `dtype` (what the rule must not be)."""
    with np.errstate(all="ignore"):
        product = (a.astype(np.float64) * b.astype(np.float64)).astype(np.float32).astype(dtype) \
            if dtype != F64 else a * b
        return (product.astype(np.float64) + c.astype(np.float64)).astype(np.float32).astype(dtype) \
            if dtype != F64 else product + c


def via_f32(a, b, c, dtype) -> np.ndarray:
    """The sum rounded to f64 (the product is exact there), to f32, then to `dtype`, each correctly: the double
    roundings the narrow formats' tie test corrects (ORT's f64 -> f16 and bf16 casts go through f32)."""
    s = (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)
    return np.array([round_to(Fraction(float(v)), dtype) if np.isfinite(v) else v for v in s]).astype(dtype)


# -- corpora -------------------------------------------------------------------------------------------------
def _as(dtype, *columns):
    with np.errstate(over="ignore"):
        return tuple(np.asarray(col, np.float64).astype(dtype) for col in columns)


def random_normal(dtype, n: int = 3000, seed: int = 0):
    """Mainstream operands: products and addends within a few dozen binades of each other."""
    rng = np.random.default_rng(seed)
    span = 8 if dtype == F16 else 30
    a, b = (rng.standard_normal(n) * np.exp2(rng.integers(-span // 2, span // 2, n)) for _ in range(2))
    return _as(dtype, a, b, rng.standard_normal(n) * np.exp2(rng.integers(-span, span, n)))


def wide(dtype, n: int = 3000, seed: int = 1):
    """Signed values over each format's whole exponent range, subnormals included."""
    rng = np.random.default_rng(seed)
    info = ml_dtypes.finfo(dtype)
    low, high = np.log2(float(info.smallest_subnormal)), np.log2(float(info.max))
    return _as(dtype, *(np.sign(rng.standard_normal(n)) * np.exp2(rng.uniform(low, high, n)) for _ in range(3)))


def midpoint(dtype, n: int = 300, seed: int = 2):
    """a * b exactly halfway between two neighbours (an odd significand times 3, 5, 7, ...), c a tiny term of
    either sign or zero: the tie goes c's way, which rounding the product first (or the sum to f64) loses."""
    rng = np.random.default_rng(seed)
    p = int(ml_dtypes.finfo(dtype).nmant) + 1
    rows = []
    while len(rows) < n:
        a = float(int(rng.integers(2 ** (p - 1), 2 ** p)) | 1) * 2.0 ** (int(rng.integers(-6, 6)) - p + 1)
        b = float(rng.choice([3, 5, 7, 9, 11, 13])) * 2.0 ** int(rng.integers(-8, 3))
        product = Fraction(a) * Fraction(b)
        if not is_midpoint(product, dtype):
            continue
        tiny = float(np.asarray(abs(float(product)) * 2.0 ** -int(rng.integers(p + 2, 60)), dtype))
        rows += [(a, b, tiny), (a, b, -tiny), (a, b, 0.0)]
    return _as(dtype, *zip(*rows))


def near_midpoint(dtype, n: int = 1500, seed: int = 3):
    """c = the rounding of M - a * b, M a midpoint next to a * b: the sum is M plus c's own rounding error."""
    rng = np.random.default_rng(seed)
    p = int(ml_dtypes.finfo(dtype).nmant) + 1
    a, b = _as(dtype, rng.uniform(1, 2, n) * np.exp2(rng.integers(-8, 8, n)),
               rng.uniform(1, 2, n) * np.exp2(rng.integers(-8, 8, n)) * np.sign(rng.standard_normal(n)))
    c = []
    for x, y in zip(a.astype(np.float64).tolist(), b.astype(np.float64).tolist()):
        product = Fraction(x) * Fraction(y)
        near = abs(Fraction(round_to(product, dtype)))
        e = near.numerator.bit_length() - near.denominator.bit_length()
        e -= Fraction(2) ** e > near
        half_ulp = Fraction(2) ** (e - p) * (1 if rng.random() < 0.5 else -1)
        c.append(round_to(Fraction(round_to(product, dtype)) + half_ulp - product, dtype))
    return a, b, np.array(c).astype(dtype)


def past_midpoint(dtype, n: int = 600, seed: int = 5):
    """a * b = 2^s (1 + eta), |eta| < 2^-p (b is 2^s / a rounded), c = M - 2^s for M an odd multiple of 2^s
    between 2^(s+p) and 2^(s+p+1), a midpoint there: the sum is M plus a tail far below M's last place. In
    f64 this is the tie the last TwoSum's error decides (c + RN(a * b) is M itself)."""
    rng = np.random.default_rng(seed)
    p = int(ml_dtypes.finfo(dtype).nmant) + 1
    rows = []
    for _ in range(n):
        shift = int(rng.integers(-6, 3))
        a = float(np.asarray(rng.uniform(1, 2) * 2.0 ** int(rng.integers(-3, 3)), dtype))
        b = float(round_to(Fraction(2) ** shift / Fraction(a), dtype))
        c = 2.0 ** shift * (2 ** p + 2 * int(rng.integers(0, 2 ** (p - 1))))
        sign = float(rng.choice([-1, 1]))  # -(a b + c) = (-a) b + (-c)
        rows.append((sign * a, b, sign * c))
    return _as(dtype, *zip(*rows))


def specials(dtype):
    """Every triple of signed zeros, infinities, NaN, +-1, the largest and smallest numbers, a subnormal."""
    info = ml_dtypes.finfo(dtype)
    values = [0.0, -0.0, 1.0, -1.0, 1.5, 2.0, 0.5, 3.0, np.inf, -np.inf, np.nan, float(info.max),
              -float(info.max), float(info.tiny), -float(info.tiny), float(info.smallest_subnormal)]
    return _as(dtype, *(g.ravel() for g in np.meshgrid(values, values, values)))


def extremes(dtype, n: int = 3000, seed: int = 4):
    """Products past the range with c taking most of them back, both terms tiny, subnormal results of
    cancelling normal terms, an operand near the top of the range times a small one."""
    rng = np.random.default_rng(seed)
    info = ml_dtypes.finfo(dtype)
    emax, emin = int(info.maxexp), int(info.minexp) - int(info.nmant)
    rows = []
    for kind in rng.integers(0, 4, n):
        u = rng.uniform(1, 2, 3)
        sign = rng.choice([-1.0, 1.0])
        if kind == 0:
            ea = int(rng.integers(emax // 2, emax))
            a, b = u[0] * 2.0 ** ea, sign * u[1] * 2.0 ** (emax + int(rng.integers(-3, 2)) - ea)
            c = -min(abs(a * b / 2), float(info.max)) * np.sign(a * b) * rng.uniform(0.5, 2)
        elif kind == 1:
            ea = int(rng.integers(emin // 2 - 10, emin // 4))
            a, b = u[0] * 2.0 ** ea, sign * u[1] * 2.0 ** (emin + int(rng.integers(-2, 40)) - ea)
            c = rng.uniform(-4, 4) * 2.0 ** (emin + int(rng.integers(0, 50)))
        elif kind == 2:
            ea = int(rng.integers(emin // 2, 0))
            a, b = _as(dtype, u[0] * 2.0 ** ea, u[1] * 2.0 ** (int(info.minexp) + 5 - ea))
            c = -float(np.asarray(float(a) * float(b), dtype)) + int(rng.integers(-8, 8)) * float(
                info.smallest_subnormal)
        else:
            ea = emax - int(rng.integers(1, 30))
            a, b = u[0] * 2.0 ** ea, sign * u[1] * 2.0 ** int(rng.integers(-ea - 40, -ea + 40))
            c = rng.uniform(-2, 2) * 2.0 ** int(rng.integers(-50, 50))
        rows.append((float(a), float(b), float(c)))
    return _as(dtype, *zip(*rows))


CORPORA = {"random": random_normal, "wide": wide, "midpoint": midpoint, "near_midpoint": near_midpoint,
           "past_midpoint": past_midpoint, "specials": specials, "extremes": extremes}
CORNERS = ("midpoint", "near_midpoint", "past_midpoint", "specials", "extremes")  # where a plain Mul then Add must fail
_MEMO: dict = {}


def corpus(name: str, dtype):
    key = (name, dtype)
    if key not in _MEMO:
        with np.errstate(over="ignore"):  # the extremes' products overflow on purpose
            a, b, c = CORPORA[name](dtype)
        _MEMO[key] = a, b, c, exact_fma(a, b, c, dtype)
    return _MEMO[key]


def run_fma(a, b, c, target: str = "ort-cpu") -> np.ndarray:
    with jax.enable_x64(a.dtype == F64):
        return np.asarray(mnjit(lax.fma, target=target)(a, b, c))


# -- tests ---------------------------------------------------------------------------------------------------
@needs_fma
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", CORPORA)
def test_exact(name: str, dtype) -> None:
    """Every bit, subnormals and signed zeros included, against the exact sum rounded once."""
    a, b, c, want = corpus(name, dtype)
    assert_bits(run_fma(a, b, c), want, a, b, c, f"{name} {dtype.name}")
    if name in CORNERS:  # the corpus can fail: a plain Mul then Add misses some of it
        assert not same_bits(naive(a, b, c, dtype), want).all()
    if name == "midpoint" and dtype != F64:  # and so does rounding the f64 sum again (through f32)
        assert not same_bits(via_f32(a, b, c, dtype), want).all()


def _normal(*arrays) -> np.ndarray:
    """Rows where no value is subnormal (XLA's CPU reads and writes those as zero)."""
    ok = np.ones(arrays[0].shape, bool)
    for v in arrays:
        v = np.abs(v.astype(np.float64))
        ok &= ~((v > 0) & (v < float(ml_dtypes.finfo(arrays[0].dtype).tiny)))
    return ok


@needs_fma
@pytest.mark.parametrize("dtype", [F32, F64], ids=lambda d: d.name)
@pytest.mark.parametrize("name", CORPORA)
def test_matches_jit(name: str, dtype) -> None:
    """The same bits as jax.jit (XLA's hardware fma) wherever XLA does not flush a subnormal."""
    a, b, c, want = corpus(name, dtype)
    keep = _normal(a, b, c, want)
    a, b, c, want = a[keep], b[keep], c[keep], want[keep]
    with jax.enable_x64(dtype == F64):
        expected = np.asarray(jax.jit(lax.fma)(a, b, c))
    assert_bits(expected, want, a, b, c, f"jax.jit against the exact value, {name} {dtype.name}")
    assert_bits(run_fma(a, b, c), expected, a, b, c, f"{name} {dtype.name}")


@needs_fma
@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=lambda d: d.name)
def test_iree(dtype) -> None:
    """iree-cpu runs the same graph exactly, subnormals aside (IREE flushes them: a documented divergence)."""
    pytest.importorskip("iree.compiler")
    pytest.importorskip("iree.runtime")
    for name in ("midpoint", "near_midpoint", "specials"):
        a, b, c, want = corpus(name, dtype)
        keep = _normal(a, b, c, want)
        a, b, c, want = a[keep], b[keep], c[keep], want[keep]
        assert_bits(run_fma(a, b, c, target="iree-cpu"), want, a, b, c, f"iree-cpu {name} {dtype.name}")


@needs_fma
@pytest.mark.parametrize("target", ["openvino-cpu", "core"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=lambda d: d.name)
def test_refused_without_float64(target: str, dtype) -> None:
    """Targets that lack f64 (core) refuse the op by name; one that computes f64 in f32 (openvino-cpu) refuses
    the form's float64 nodes, named as stablehlo.fma's, when no fusion replaced them."""
    a, b, c, _ = corpus("midpoint", dtype)
    with jax.enable_x64(dtype == F64):
        lowered = jax.jit(lax.fma).lower(a, b, c)
        if target == "core":
            with pytest.raises(hlo2onnx.UnsupportedOpError, match=r"stablehlo\.fma.*core cannot run fma's exact"):
                hlo2onnx.convert(lowered, target=target)
        else:
            with pytest.raises(hlo2onnx.TargetError, match=r"openvino-cpu cannot run .*float64 would be computed "
                                                            r"in a narrower type\) from stablehlo\.fma"):
                hlo2onnx.convert(lowered, target=target)


# A module with the op written out: jax before 0.12.1 does not emit it (and its MLIR does not parse it), so this
# is the row that names stablehlo.fma for tests/test_rule_coverage.py on every jax.
FMA_2X3 = """func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>, %c: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.fma %a, %b, %c : tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}"""


# A symbolic batch (jax 0.12.1's jax.export cannot serialize fma yet: written out): the rule reads no dim.
FMA_DYNAMIC = FMA_2X3.replace("2x3", "?x3")


@pytest.mark.parametrize("text", [FMA_2X3, FMA_DYNAMIC], ids=["static", "dynamic"])
def test_handwritten(text: str) -> None:
    try:
        hlo2onnx.parse_module(text)
    except hlo2onnx.InvalidInputError as e:
        pytest.skip(f"jax {jax.__version__}'s MLIR cannot read stablehlo.fma: {e}")
    import onnxruntime as ort

    proto = hlo2onnx.convert(text, dynamic=True).to_proto()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    a, b, c, want = corpus("midpoint", F32)
    for n in (2, 5) if "?" in text else (2,):
        args = [v[:3 * n].reshape(n, 3) for v in (a, b, c)]
        (actual,) = session.run(None, {i.name: v for i, v in zip(session.get_inputs(), args)})
        assert_bits(actual.ravel(), want[:3 * n], a, b, c, f"{n} rows")


# Functions jax writes with fma (jax 0.12.1) or with a multiply and an add (before), against jax.jit.
x_unit = np.concatenate([[-1.0, -0.999, -0.5, 0.0, 1e-6, 0.3, 0.9, 0.99, 1.0, 1.5, np.nan],
                         np.random.default_rng(5).uniform(-1, 1, 60)])
x_poly = np.random.default_rng(6).uniform(-3, 3, 64)
POLY = np.array([0.3, -1.7, 2.25, 0.1, -0.6, 1.3, 0.7, -0.2, 0.05])
CASES = [
    *[Case(f"erf_inv_{d.name}", lax.erf_inv, (x_unit.astype(d),), x64=d == F64,
           tol=(1e-5, 2e-6) if d == F32 else None) for d in (F32, F64)],
    # Horner steps of fmas on jax 0.12.1, where every bit agrees (older jax's polyval rounds differently and
    # cancels at these points: not a row there).
    *[Case(f"polyval_{d.name}", lambda x: jnp.polyval(jnp.asarray(POLY, x.dtype), x), (x_poly.astype(d),),
           x64=d == F64, tol=(0, 0)) for d in (F32, F64) if HAS_FMA],
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_jax_functions(case: Case) -> None:
    run_case(case)
