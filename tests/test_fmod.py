"""Float remainder computed from arithmetic (hlo2onnx/ops/elementwise/fmod.py), for targets whose Mod kernel is
wrong, and the constant exponents of `power` simplified as XLA simplifies them: both bit for bit against jax.jit.

The remainder is checked on ORT through a target that refuses Mod (every bit, subnormals and -0 included) and
on iree-cpu, where it replaces IREE's Mod (every bit but subnormals, which IREE flushes to zero: a documented
divergence of that target). The corpora span each format's whole exponent range, so that the looping
branch runs; a corpus of small quotients passes the first test (max|x| against min|y|), one of small quotients
over varying scales the second (element by element); empty operands run too.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import pytest

from hlo2onnx import targets
from mnjit import mnjit

_FLOATS = "float16 bfloat16 float32 float64"
NO_MOD = dataclasses.replace(targets.ORT_CPU, name="ort-cpu-no-mod",
                             refused={"Mod": frozenset(np.dtype(t) for t in ("float16", "float32", "float64"))
                                      | {np.dtype(ml_dtypes.bfloat16)}})
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


def _wide(dtype, n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Signed values over the whole exponent range, subnormals included, and every pair of special values."""
    rng = np.random.default_rng(seed)
    info = ml_dtypes.finfo(dtype)
    exponents = rng.uniform(np.log2(float(info.smallest_subnormal)), np.log2(float(info.max)), size=(2, n))
    values = np.sign(rng.standard_normal((2, n))) * np.exp2(exponents)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 3.0, -4.0, 2.0, 1e-3, -1e4, float(info.max),
                float(info.tiny), float(info.smallest_subnormal), -float(info.smallest_subnormal)]
    a, b = np.meshgrid(specials, specials)
    return (np.concatenate([values[0], a.ravel()]).astype(dtype), np.concatenate([values[1], b.ravel()]).astype(dtype))


def _small(dtype, n: int = 3000, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Quotients below 2^20 (a periodic box, an angle): the one-step branch."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-30, 30, n) * np.exp2(rng.integers(-10, 10, n))
    y = rng.uniform(0.1, 4, n) * np.sign(rng.standard_normal(n))
    return x.astype(dtype), y.astype(dtype)


def _mixed(dtype, n: int = 3000, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Small quotients of operands whose scales vary together: max|x| / min|y| is past 2^28 (the first test
    fails), every |x| / |y| below 2^20 (the element-by-element test passes)."""
    rng = np.random.default_rng(seed)
    info = ml_dtypes.finfo(dtype)
    y = np.exp2(rng.uniform(np.log2(float(info.tiny)) + 1, np.log2(float(info.max)) - 21, n))
    x = y * rng.uniform(-2.0 ** 19, 2.0 ** 19, n)
    y = y * np.sign(rng.standard_normal(n))
    # The ends of the range (f16's is too narrow for the random pairs alone to fail the first test).
    big, tiny = float(info.max), float(info.tiny)
    x = np.concatenate([x, [0.9 * big, 3 * tiny]]).astype(dtype)
    y = np.concatenate([y, [0.3 * big, 2 * tiny]]).astype(dtype)
    ax, ay = np.abs(x.astype(np.float64)), np.abs(y.astype(np.float64))
    assert ax.max() >= 2.0 ** 28 * ay.min() and (ax < 2.0 ** 20 * ay).all()
    return x, y


def _near_limit(dtype, n: int = 3000, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Quotients just below the one-step branch's limit (2^22 for f64, 2^23 for the narrow formats, whose f32
    quotient must stay an f32 integer), integers and near-integers among them: the one-step branch alone."""
    rng = np.random.default_rng(seed)
    bits = 22 if np.dtype(dtype) == np.float64 else 23
    y = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-12, -8, n))).astype(dtype)
    whole = rng.integers(2 ** (bits - 1), 2 ** bits, n - n // 2) * (1 + rng.choice([0, 1e-7, -1e-7], n - n // 2))
    q = np.concatenate([rng.uniform(2.0 ** (bits - 1), 2.0 ** bits, n // 2), whole])
    x = (y.astype(np.float64) * q * np.sign(rng.standard_normal(n))).astype(dtype)
    small = np.abs(x.astype(np.float64)) < 2.0 ** bits * np.abs(y.astype(np.float64))
    return x[small], y[small]


def _empty(dtype, n: int = 0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((0, 3), dtype), np.ones((0, 3), dtype)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _compare(x, y, target, skip_subnormal: bool) -> None:
    f = lambda a, b: jax.lax.rem(a, b)  # noqa: E731
    expected = np.asarray(jax.jit(f)(x, y))
    actual = np.asarray(mnjit(f, target=target)(x, y))
    assert actual.dtype == expected.dtype
    nan = np.isnan(expected.astype(np.float64))
    same = (_bits(actual) == _bits(expected)) | (nan & np.isnan(actual.astype(np.float64)))
    if skip_subnormal:
        tiny = float(ml_dtypes.finfo(x.dtype).tiny)
        subnormal = lambda v: (v != 0) & (np.abs(v.astype(np.float64)) < tiny)  # noqa: E731
        same |= subnormal(x) | subnormal(y) | subnormal(expected)
    bad = np.flatnonzero(~same)
    assert bad.size == 0, [(x[i], y[i], expected[i], actual[i]) for i in bad[:5]]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("corpus", [_wide, _small, _near_limit, _mixed, _empty])
def test_remainder_is_exact_on_ort(dtype, corpus) -> None:
    with jax.enable_x64(dtype is np.float64):
        x, y = corpus(dtype)
        _compare(x, y, NO_MOD, skip_subnormal=False)


def _pair_difference(a, b):
    """x_i - x_j + x_0: a pair displacement, the broadcast of smaller operands that fmod bounds |x| from."""
    return a[:, None] - b[None, :] + a[0]


def _compare_pairs(dtype, corpus, target, skip_subnormal: bool, n: int = 40) -> None:
    """fmod of a pair difference (the one-pass bound on |x| decides its If) against jax.jit, bit for bit."""
    with np.errstate(over="ignore"):  # _mixed's own check overflows on its largest f64 values
        values, divisors = corpus(dtype, n=4 * n * n)
    a, b = values[:n], values[n:2 * n]
    y = np.resize(divisors, (n, n)) if divisors.size else np.ones((n, n), dtype)
    f = lambda a, b, y: jax.lax.rem(_pair_difference(a, b), y)  # noqa: E731
    expected = np.asarray(jax.jit(f)(a, b, y))
    actual = np.asarray(mnjit(f, target=target)(a, b, y))
    nan = np.isnan(expected.astype(np.float64))
    same = (_bits(actual) == _bits(expected)) | (nan & np.isnan(actual.astype(np.float64)))
    if skip_subnormal:
        x = np.asarray(jax.jit(_pair_difference)(a, b))
        tiny = float(ml_dtypes.finfo(dtype).tiny)
        subnormal = lambda v: (v != 0) & (np.abs(v.astype(np.float64)) < tiny)  # noqa: E731
        same |= subnormal(x) | subnormal(y) | subnormal(expected)
    bad = np.argwhere(~same)
    assert bad.size == 0, [(a[i], b[j], y[i, j], expected[i, j], actual[i, j]) for i, j in bad[:5]]


_PAIR_CORPORA = [_wide, _small, _near_limit, _mixed]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("corpus", _PAIR_CORPORA)
def test_remainder_of_pair_differences_on_ort(dtype, corpus) -> None:
    with jax.enable_x64(dtype is np.float64):
        _compare_pairs(dtype, corpus, NO_MOD, skip_subnormal=False)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("corpus", _PAIR_CORPORA)
def test_remainder_of_pair_differences_on_iree(dtype, corpus) -> None:
    pytest.importorskip("iree.runtime")
    with jax.enable_x64(dtype is np.float64):
        _compare_pairs(dtype, corpus, "iree-cpu", skip_subnormal=True)


def test_pair_difference_bound_reads_no_pair_tensor() -> None:
    """The If's test on a pair difference reduces the (n,) operands only, and each branch computes the
    difference itself (none is made outside the If); a remainder of a graph input still reduces x."""
    n = 64
    a, y = np.linspace(-3, 3, n, dtype=np.float32), np.full((n, n), 2.5, np.float32)
    f = lambda a, y: jax.lax.rem(_pair_difference(a, a), y)  # noqa: E731
    model = onnx.shape_inference.infer_shapes(mnjit(f, target=NO_MOD).lower(a, y).onnx_model)
    sizes = {v.name: int(np.prod([d.dim_value for d in v.type.tensor_type.shape.dim]))
             for v in [*model.graph.input, *model.graph.value_info]}
    reduced = [sizes[node.input[0]] for node in model.graph.node if node.op_type == "ReduceMax"]  # |x|'s
    assert reduced and max(reduced) <= n, reduced
    assert not [node for node in model.graph.node if node.op_type == "Sub"]  # the difference is in the branches
    x = np.full((n, n), 7.0, np.float32)
    plain = onnx.shape_inference.infer_shapes(mnjit(jax.lax.rem, target=NO_MOD).lower(x, y).onnx_model)
    assert sum(node.op_type == "ReduceMax" for node in plain.graph.node) == 1


def test_remainder_without_mod_node() -> None:
    """The target's Mod is not used; the looping branch is a Loop inside an If."""
    x, y = _small(np.float32)
    model = mnjit(jnp.fmod, target=NO_MOD).lower(x, y).onnx_model
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Mod"] == 0 and ops["If"] == 1, dict(ops)
    assert mnjit(jnp.fmod).lower(x, y).onnx_model.graph.node[0].op_type == "Mod"  # ORT's own Mod stays


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("corpus", [_wide, _small, _near_limit, _mixed, _empty])
def test_remainder_on_iree(dtype, corpus) -> None:
    pytest.importorskip("iree.runtime")
    if dtype is ml_dtypes.bfloat16:
        pytest.skip("iree-cpu computes no bf16 arithmetic (its table)")
    with jax.enable_x64(dtype is np.float64):
        x, y = corpus(dtype, n=800)
        _compare(x, y, "iree-cpu", skip_subnormal=True)


def test_jnp_mod_and_grad_on_iree() -> None:
    """jnp.mod (a periodic box) and its gradient run on IREE whole, and match jax.jit."""
    pytest.importorskip("iree.runtime")
    from harness import assert_same

    def energy(r, box):
        d = jnp.mod(r[:, None, :] - r[None, :, :] + box / 2, box) - box / 2
        return jnp.sum((1.0 - jnp.sqrt(jnp.sum(d * d, -1) + 1e-3)) ** 2.0)

    r = np.random.default_rng(0).uniform(0, 5, (16, 2)).astype(np.float32)
    g = mnjit(jax.value_and_grad(energy), target="iree-cpu")
    assert_same(g(r, np.float32(5.0)), jax.jit(jax.value_and_grad(energy))(r, np.float32(5.0)), (2e-5, 2e-5))


# -- power with a constant exponent ---------------------------------------------------------------------------------
@pytest.mark.parametrize("exponent", [0.0, 1.0, 2.0, -1.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_power_by_constant_as_xla_simplifies_it(exponent, dtype) -> None:
    """x ** 0, 1, 2 and -1 need no Pow (XLA's algebraic simplifier writes 1, x, x * x, 1 / x), and match every
    bit of jax.jit where the result is normal; jax-md's x ** alpha reaches the rule as alpha - 1 converted."""
    with jax.enable_x64(dtype is np.float64):
        rng = np.random.default_rng(0)
        x = (rng.standard_normal(4000) * np.exp2(rng.uniform(-60, 60, 4000))).astype(dtype)
        x = np.concatenate([x, np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype)])
        alpha = np.asarray(exponent + 1.0, np.float32)
        f = lambda a: a ** (jnp.asarray(alpha).astype(dtype) - 1.0)  # noqa: E731
        model = mnjit(f).lower(x).onnx_model
        assert "Pow" not in {n.op_type for n in model.graph.node}
        expected, actual = np.asarray(jax.jit(f)(x)), np.asarray(mnjit(f)(x))
        # XLA flushes subnormal results to zero, ORT's Mul does not (as for every product): not compared.
        subnormal = lambda v: (v != 0) & (np.abs(v) < np.finfo(dtype).tiny)  # noqa: E731
        normal = ~(subnormal(expected) | subnormal(actual))
        same = (_bits(actual) == _bits(expected)) | (np.isnan(actual) & np.isnan(expected)) | ~normal
        assert same.all(), (x[~same][:4], actual[~same][:4], expected[~same][:4])


def test_power_by_other_constants_and_variables_keeps_pow() -> None:
    x = np.linspace(0.5, 3, 16, dtype=np.float32)
    for f in (lambda a: a ** np.float32(3.0), lambda a: a ** np.float32(0.5), lambda a: a ** a):
        assert "Pow" in {n.op_type for n in mnjit(f).lower(x).onnx_model.graph.node}


@pytest.mark.parametrize("x64", [False, True])
def test_jax_md_fire_step_on_iree(x64) -> None:
    """JAX-MD's FIRE step (periodic box: two remainders, a power by 2.0 and its gradient's alpha - 1) runs on
    IREE whole and matches jax.jit. An If branch that handed on a value computed outside it broke IREE's
    runtime here ("transient buffer has not been committed"), not on the smaller graphs above."""
    pytest.importorskip("iree.runtime")
    pytest.importorskip("jax_md")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from bench_models import fire
    from harness import assert_same

    with jax.enable_x64(x64):
        model = fire(n=64)
        args = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64 if x64 else np.float32)
                                      if np.issubdtype(np.asarray(a).dtype, np.floating) else a, model.args)
        g = mnjit(model.fun, target="iree-cpu")
        assert len(g.lower(*args).onnx_model.graph.node) > 0
        assert_same(g(*args), jax.jit(model.fun)(*args), (1e-12, 1e-12) if x64 else (2e-5, 2e-5))
