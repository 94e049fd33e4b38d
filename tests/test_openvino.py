"""The openvino-cpu target against jax.jit: the ORT op tables run on OpenVINO, and what its table excludes
is refused by name, never computed wrongly. Skipped when openvino is not installed (the `test` extra
installs it)."""
from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("openvino")

import hlo2onnx  # noqa: E402
import test_complex  # noqa: E402
import test_control_flow  # noqa: E402
import test_fft  # noqa: E402
import test_int_wrap  # noqa: E402
import test_ops_bits  # noqa: E402
import test_ops_conv_window  # noqa: E402
import test_ops_core  # noqa: E402
import test_ops_indexing  # noqa: E402
import test_ops_sort  # noqa: E402
import test_special  # noqa: E402
import test_zero_size  # noqa: E402
from harness import Case, assert_same, check_concurrent_calls, rand, run_case  # noqa: E402
from mnjit import mnjit  # noqa: E402
from mnjit.openvino_runner import OpenVinoCompileError  # noqa: E402

TARGET = "openvino-cpu"
REFUSED = (hlo2onnx.UnsupportedOpError, hlo2onnx.targets.TargetError)


# NaN and infinities included: where OpenVINO 2026.4 answers them differently from XLA (Exp, Gelu, HardSigmoid,
# Softmax rows, all-infinite reductions, comparisons, Max/Min/Clip/Relu, constant products folded to x * inf),
# the pipeline's guards and the target's rewrites give XLA's values (docs/runtime.md).
def _table(*cases: Case) -> list:
    return [pytest.param(c, id=c.name) for c in cases]


ALL = [*test_ops_core.CASES, *test_zero_size.CASES, *test_ops_indexing.CASES, *test_ops_conv_window.CASES,
       *test_ops_sort.CASES, *test_ops_bits.CASES, *test_int_wrap.CASES, *test_control_flow.CASES,
       *test_complex.CASES, *test_fft.CASES, *test_special.UNARY_CASES, *test_special.BINARY_CASES]
# A representative subset keeps `make test` short (about a minute on one core); the stress run takes all.
TABLE = _table(*test_ops_core.CASES, *test_zero_size.CASES, *test_ops_indexing.CASES[::2],
               *test_ops_conv_window.CASES[::2], *test_ops_sort.CASES[::2], *test_ops_bits.CASES[::4],
               *test_int_wrap.CASES[::4], *test_control_flow.CASES[::2], *test_complex.CASES[::4],
               *test_fft.CASES[::4], *test_special.UNARY_CASES[::4], *test_special.BINARY_CASES[::4])


@pytest.mark.parametrize("case", TABLE)
def test_table(case: Case) -> None:
    """Each case matches jax.jit on openvino-cpu, or is refused with an error naming the op and dtype."""
    _matches_or_refused(case)


@pytest.mark.stress
@pytest.mark.parametrize("case", _table(*ALL))
def test_full_tables(case: Case) -> None:
    _matches_or_refused(case)


def _matches_or_refused(case: Case) -> None:
    try:
        run_case(case, target=TARGET)
    except REFUSED as e:
        message = str(e)
        assert TARGET in message and ("wrong results for" in message or "does not match XLA" in message
                                      or "narrower type" in message or "no " in message), message
    except OpenVinoCompileError as e:  # OpenVINO itself refused the model: clear, never a wrong answer
        assert "OpenVINO" in str(e)


# -- refusals: what OpenVINO gets wrong is refused, naming the op and dtype ---------------------------------
@pytest.mark.parametrize("fun, args, x64, op, dtype", [
    (lambda a: a + a, (np.array([100, 27], np.int8),), False, "Add", "int8"),
    (lambda a: a * a, (np.array([200, 3], np.uint8),), False, "Mul", "uint8"),
    (lambda a, b: a // b, (np.array([2**31 - 1], np.int32), np.array([3], np.int32)), False, "Div", "int32"),
    (lambda a: a * 2.0, (np.array([1.0 + 2**-40]),), True, "float64", "float64"),
    (lambda a: a + 1, (np.array([2**40], np.int64),), True, "int64", "int64"),
    (lambda a: jnp.argsort(a), (np.array([3.0, 1.0, 3.0], np.float32),), False, "TopK", "sort"),
])
def test_refused(fun, args, x64, op, dtype) -> None:
    with jax.enable_x64(x64):
        with pytest.raises(REFUSED) as info:
            mnjit(fun, target=TARGET)(*args)
        assert op in str(info.value) and dtype in str(info.value), str(info.value)
        mnjit(fun)(*args)  # ORT runs it: the refusal is the target's, not the translator's


def test_table_still_wrong() -> None:
    """The measured faults still happen, so the refusals are not stale (a newer OpenVINO may fix them)."""
    from onnx import TensorProto, helper

    from mnjit.openvino_runner import COMPILE_CONFIG, core

    def run(op: str, dtype: int, *inputs: np.ndarray) -> np.ndarray:
        names = [f"i{k}" for k in range(len(inputs))]
        graph = helper.make_graph([helper.make_node(op, names, ["o"])], "g",
                                  [helper.make_tensor_value_info(n, dtype, a.shape) for n, a in zip(names, inputs)],
                                  [helper.make_tensor_value_info("o", dtype, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        compiled = core().compile_model(core().read_model(model.SerializeToString()), "CPU", COMPILE_CONFIG)
        return np.asarray(compiled(list(inputs))[0])

    a8 = np.array([127], np.int8)
    assert run("Add", TensorProto.INT8, a8, a8)[0] != np.int8(-2), "int8 Add wraps now: revisit the table"
    big = np.array([2**40 + 3], np.int64)
    assert run("Identity", TensorProto.INT64, big)[0] != big[0], "int64 is kept whole now: revisit the table"
    f64 = np.array([1 + 2**-40])
    assert run("Add", TensorProto.DOUBLE, f64, f64)[0] != 2 * f64[0], "f64 Add is exact now: revisit the table"


def test_nan_in_comparisons_max_min_relu() -> None:
    """OpenVINO's Greater is true for NaN and its Max/Min/Clip/Relu drop NaN; the pipeline's NaN guards and
    rewrites (hlo2onnx/targets/portable.py, openvino_rewrite.py) match XLA."""
    a = np.array([np.nan, 1.0, 3.0, np.nan, -np.inf, 2.5], np.float32)
    b = np.array([2.0, np.nan, 2.0, np.nan, np.nan, 1.0], np.float32)
    for fun in (lambda x, y: (x > y, x >= y, x < y, x <= y), lambda x, y: (jnp.maximum(x, y), jnp.minimum(x, y)),
                lambda x, y: (jax.nn.relu(x), jnp.maximum(x, 1.0), jnp.minimum(2.0, y)),
                lambda x, y: (jnp.clip(x, -1.0, 1.0), jnp.clip(y, x, 2.0)),
                lambda x, y: jnp.where(x > 0, x, y)):
        _compare(fun, a, b)


def test_clamp_by_broadcasting_constants() -> None:
    """OpenVINO fuses Max and Min with one-element constants into a Clamp that drops the rank those constants
    broadcast to (dynamic_update_slice's clamped start index failed to compile; x[3] clamped by [[lo]] came
    back as [3]); the target's rewrite lifts the operand's rank first."""
    x = np.array([4.0, -3.0, 0.5], np.float32)
    for i in (-5, 0, 1, 2, 9):
        _compare(lambda v, u, j: jax.lax.dynamic_update_slice(v, u, (j,)), x, np.float32([7.0]), np.int32(i))
    lo, hi = np.zeros((1, 1), np.float32), np.full((1, 1), 2.0, np.float32)
    _compare(lambda v: jnp.minimum(jnp.maximum(v, lo), hi), x)
    _compare(lambda s: jnp.minimum(jnp.maximum(s, lo[0]), hi[0]) * 3, np.float32(5.0))


# -- the runner: dtypes and shapes across the boundary -----------------------------------------------------------
def _compare(fun, *args, tol=None) -> None:
    assert_same(mnjit(fun, target=TARGET)(*args), jax.jit(fun)(*args), tol)


def test_bool_complex_scalar_empty_weak() -> None:
    x = rand((2, 3))
    _compare(lambda a, b: (a > b, a.astype(jnp.complex64) * 1j, jnp.sum(a), jnp.zeros((0, 2)), a * 2),
             x, rand((2, 3), seed=1))
    _compare(lambda z: (z * z, jnp.abs(z)), rand((3,), np.complex64))
    _compare(lambda s, v: s * v + 1, np.float32(2.5), x)  # a 0-d input stays 0-d
    _compare(lambda e, v: (e + 1, v), np.zeros((0, 3), np.float32), x)
    _compare(lambda v: (2.0 * jnp.sum(v), 3.0), x)  # the constant comes back weak-typed, as from jax.jit
    _compare(lambda b: jnp.logical_not(b), np.array([True, False]))


def test_typed_key_passes_through() -> None:
    """Typed PRNG keys cross as their uint32 key data (random bits themselves are refused on this target)."""
    key = jax.random.key(3)
    out_key, doubled = mnjit(lambda k, v: (k, v * 2), target=TARGET)(key, rand((3,)))
    assert out_key.dtype == key.dtype
    np.testing.assert_array_equal(jax.random.key_data(out_key), jax.random.key_data(key))
    assert_same(doubled, jax.jit(lambda v: v * 2)(rand((3,))))


def test_strided_and_unused_inputs() -> None:
    x = rand((4, 6))
    _compare(lambda a, unused: a * 2, x[:, ::2], x)  # OpenVINO drops the unused input; a strided numpy leaf
    _compare(lambda a: a.T @ a, jnp.asarray(x))


def test_outputs_are_not_overwritten() -> None:
    f = mnjit(lambda a: a + 1, target=TARGET)
    first = f(np.zeros(3, np.float32))
    f(np.ones(3, np.float32))
    np.testing.assert_array_equal(np.asarray(first), np.ones(3, np.float32))


def test_threads() -> None:
    """Concurrent calls on one signature each get their own answer (the request is shared under a lock)."""
    check_concurrent_calls(TARGET, size=64, threads=8, repeats=20, warm=False)


# -- models ----------------------------------------------------------------------------------------------------
def test_models() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from bench_models import cnn, mlp, transformer

    for model in (mlp(batch=8), cnn(batch=2), transformer(batch=1, seq=16, d=32, f=64)):
        expected = jax.jit(model.fun)(*model.args)
        assert_same(mnjit(model.fun, target=TARGET)(*model.args), expected, (2e-4, 2e-4), model.name)


def test_threads_stay_flat_across_signatures() -> None:
    """Each compiled model runs on the calling thread (NUM_STREAMS=0): signatures add no OS threads."""
    import os

    f = mnjit(lambda a: jnp.tanh(a) * 2 + 1, target=TARGET)
    f(np.ones(1, np.float32))
    before = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
    for n in range(2, 32):
        f(np.ones(n, np.float32))
    after = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
    assert after - before <= 2, f"{after - before} OS threads for 30 signatures"
