"""Python host callbacks under mnjit (jax.pure_callback, io_callback, jax.debug.print/callback, equinox's error
checks): results and side effects as under jax.jit, loops kept as one ONNX Loop, errors raised as jax.jit raises
them, and models that hold callbacks refused where no runtime could call them."""
from __future__ import annotations

import threading

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import onnx_ir as ir
import pytest
from jax.experimental import io_callback

import hlo2onnx
from harness import assert_same, check_model, rand
from mnjit import mnjit


def _spec(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def pure_sin(x):
    return jax.pure_callback(np.sin, _spec(x), x) * 2


def pure_many(x, n):
    """Several outputs of several dtypes, one of them complex."""
    def host(a, k):
        return (np.cos(a).astype(a.dtype), (k * 3).astype(k.dtype), a > 0,
                (a + 1j * a).astype(np.result_type(a.dtype, np.complex64)))
    specs = (_spec(x), _spec(n), jax.ShapeDtypeStruct(x.shape, bool),
             jax.ShapeDtypeStruct(x.shape, jnp.result_type(x.dtype, jnp.complex64)))
    a, k, positive, z = jax.pure_callback(host, specs, x, n)
    return a + 1, k - 1, ~positive, z * 2


def pure_complex_in(z):
    return jax.pure_callback(lambda v: np.abs(v).astype(v.real.dtype), jax.ShapeDtypeStruct(z.shape, z.real.dtype), z)


def in_fori_loop(x):
    def body(i, c):
        return c + jax.pure_callback(np.cos, _spec(c), c) * i
    return jax.lax.fori_loop(0, 5, body, x)


def in_while_loop(x):
    def cond(c):
        return c[1] < 4
    def body(c):
        value, i = c
        return value * jax.pure_callback(lambda v: (v * 0.5).astype(v.dtype), _spec(value), value), i + 1
    return jax.lax.while_loop(cond, body, (x, 0))


def in_scan(x):
    def step(carry, row):
        out = jax.pure_callback(lambda a, b: (a * b).astype(a.dtype), _spec(row), carry, row)
        return carry + 1, out
    return jax.lax.scan(step, x[0], x)


def in_cond(x):
    return jax.lax.cond(x.sum() > 0, lambda v: jax.pure_callback(np.exp, _spec(v), v), lambda v: v - 1, x)


def vmapped(x):
    return jax.vmap(lambda row: jax.pure_callback(np.tanh, _spec(row), row, vmap_method="sequential"))(x)


def integer_wrap(x):
    return jax.pure_callback(lambda v: (v * 7).astype(v.dtype), _spec(x), x) + jnp.int32(2**31 - 1)


def scalar_result(x):
    return jax.pure_callback(lambda v: np.float32(v.sum()), jax.ShapeDtypeStruct((), jnp.float32), x) + x


CASES = [
    ("pure", pure_sin, [rand((3, 4))]),
    ("scalar_result", scalar_result, [rand((3,))]),
    ("several_outputs", pure_many, [rand((5,)), np.arange(5, dtype=np.int32)]),
    ("complex_input", pure_complex_in, [rand((4,), np.complex64)]),
    ("fori_loop", in_fori_loop, [rand((4,))]),
    ("while_loop", in_while_loop, [rand((3,))]),
    ("scan", in_scan, [rand((6, 2))]),
    ("cond_taken", in_cond, [np.abs(rand((3,)))]),
    ("cond_not_taken", in_cond, [-np.abs(rand((3,)))]),
    ("vmap_sequential", vmapped, [rand((3, 2))]),
    ("integer_wrap", integer_wrap, [np.arange(4, dtype=np.int32)]),
]


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("name,fun,args", CASES, ids=[c[0] for c in CASES])
def test_results_match_jax_jit(name, fun, args, x64):
    with jax.enable_x64(x64):
        expected = jax.jit(fun)(*args)
        compiled = mnjit(fun)
        assert_same(compiled(*args), expected, what=name)
        assert_same(compiled(*args), expected, what=f"{name} (second call)")
        check_model(compiled.lower(*args).onnx_model)


def _recording(ordered: bool):
    """A function that records what it was called with, under io_callback; and the record."""
    seen = []

    def host(v):
        seen.append(np.asarray(v).copy())
        return (v * 2).astype(v.dtype)

    def fun(x):
        def body(i, c):
            return io_callback(host, _spec(c), c + i, ordered=ordered)
        return jax.lax.fori_loop(0, 4, body, x)
    return fun, seen


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
def test_io_callback_runs_once_per_iteration_in_order(ordered):
    x = rand((3,))
    fun, seen_jit = _recording(ordered)
    expected = jax.jit(fun)(x)
    fun, seen = _recording(ordered)
    assert_same(mnjit(fun)(x), expected)
    assert len(seen) == len(seen_jit) == 4
    for got, want in zip(seen, seen_jit):
        np.testing.assert_array_equal(got, want)


def test_callback_whose_inputs_do_not_change_in_the_loop_runs_every_iteration():
    calls = []

    def fun(x, y):
        def body(i, c):
            # Reads only y, which the loop never changes: it must not be moved out of the loop.
            return c + io_callback(lambda v: calls.append(1) or v, _spec(y), y)
        return jax.lax.fori_loop(0, 6, body, x)
    x, y = rand((2,)), rand((2,), seed=1)
    assert_same(mnjit(fun)(x, y), jax.jit(fun)(x, y))
    assert len(calls) == 12  # six under jax.jit, six under mnjit


def test_debug_print_and_callback_print_what_jax_jit_prints(capfd):
    def fun(x):
        jax.debug.print("x = {x}", x=x)
        def body(i, c):
            jax.debug.print("step {i}: {c}", i=i, c=c)
            return c * 2
        y = jax.lax.fori_loop(0, 3, body, x)
        jax.debug.callback(lambda v: print("callback saw", np.asarray(v).sum()), y)
        return y
    x = np.arange(3, dtype=np.float32)
    jax.jit(fun)(x).block_until_ready()
    expected = capfd.readouterr().out
    mnjit(fun)(x).block_until_ready()
    assert capfd.readouterr().out == expected
    assert expected.count("step") == 3


def test_a_function_that_only_prints_prints(capfd):
    def fun(x):
        jax.debug.print("only {x}", x=x)
    x = np.arange(2, dtype=np.float32)
    jax.jit(fun)(x)
    jax.effects_barrier()
    expected = capfd.readouterr().out
    assert mnjit(fun)(x) is None
    assert capfd.readouterr().out == expected == "only [0. 1.]\n"


def test_side_effect_callback_with_unused_result_runs():
    seen = []

    def fun(x):
        io_callback(lambda v: seen.append(1) or v, _spec(x), x)  # result dropped
        return x + 1
    mnjit(fun)(rand((2,)))
    assert seen == [1]


def test_one_callback_inlined_twice_runs_twice(capfd):
    @jax.jit
    def inner(v):
        jax.debug.print("inner {v}", v=v)
        return v

    def fun(x):
        return inner(x) + inner(x)
    x = np.ones(2, np.float32)
    jax.jit(fun)(x).block_until_ready()
    expected = capfd.readouterr().out
    mnjit(fun)(x).block_until_ready()
    assert capfd.readouterr().out == expected
    assert expected.count("inner") == 2


# -- errors -----------------------------------------------------------------------------------------------------
def _raises(a):
    raise ValueError("the host function failed")


def test_a_raising_callback_raises_as_under_jax_jit_and_the_function_still_runs():
    def fun(x, fail):
        return jax.lax.cond(fail, lambda v: jax.pure_callback(_raises, _spec(v), v), lambda v: v + 1, x)
    compiled = mnjit(fun)
    with pytest.raises(jax.errors.JaxRuntimeError) as expected:
        jax.jit(fun)(rand((2,)), True)
    with pytest.raises(jax.errors.JaxRuntimeError) as got:
        compiled(rand((2,)), True)
    assert str(got.value).startswith("INTERNAL: CpuCallback error calling callback:")
    assert str(expected.value).startswith("INTERNAL: CpuCallback error calling callback:")
    assert "the host function failed" in str(got.value)
    assert isinstance(got.value.__cause__, ValueError)
    assert_same(compiled(rand((2,)), False), jax.jit(fun)(rand((2,)), False))


def test_equinox_error_if_raises_its_message_and_costs_nothing_when_it_holds():
    def fun(x):
        def body(i, c):
            c = eqx.error_if(c, c > 100.0, "value left the domain")
            return c * 1.5
        return jax.lax.fori_loop(0, 20, body, x)
    compiled = mnjit(fun)
    ok = np.full(2, 1e-3, np.float32)
    assert_same(compiled(ok), jax.jit(fun)(ok))
    with pytest.raises(jax.errors.JaxRuntimeError, match="value left the domain"):
        compiled(np.ones(2, np.float32))
    report = compiled.lower(ok).report()
    assert "Loop" in report and "HostCallback" in report


def test_errors_stay_with_their_thread():
    def fun(x):
        return eqx.error_if(x, x > 0, "positive")
    compiled = mnjit(fun)
    compiled(-np.ones(2, np.float32))
    outcomes = {}

    def call(name, value):
        try:
            for _ in range(20):
                compiled(np.full(2, value, np.float32))
            outcomes[name] = "ok"
        except jax.errors.JaxRuntimeError as e:
            outcomes[name] = "positive" in str(e)
    threads = [threading.Thread(target=call, args=("good", -1.0)), threading.Thread(target=call, args=("bad", 1.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes == {"good": "ok", "bad": True}


# -- where callbacks cannot go ----------------------------------------------------------------------------------
def test_save_refuses_a_model_with_callbacks(tmp_path):
    lowered = mnjit(pure_sin).lower(rand((3,)))
    with pytest.raises(hlo2onnx.Hlo2OnnxError, match="runs only under mnjit"):
        lowered.save(tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_converting_without_mnjit_names_the_callback_and_the_line():
    module = jax.jit(pure_sin).lower(rand((3,))).compiler_ir("stablehlo")
    with pytest.raises(hlo2onnx.UnsupportedOpError, match="runs only under mnjit") as e:
        hlo2onnx.translate(module)
    assert "test_host_callbacks.py" in str(e.value)


def test_callbacks_run_on_the_host_for_core_and_are_refused_by_openvino():
    # A callback is host work by nature: core (ORT on the CPU) runs it; OpenVINO cannot call Python.
    assert_same(mnjit(pure_sin, target="core")(rand((3,))), jax.jit(pure_sin)(rand((3,))))
    pytest.importorskip("openvino")
    with pytest.raises(hlo2onnx.TargetError, match="host callback"):
        mnjit(pure_sin, target="openvino-cpu")(rand((3,)))


def test_callbacks_are_released_with_their_signature():
    import gc

    from mnjit import host_callbacks

    compiled = mnjit(pure_sin, max_cache_size=1)
    before = set(host_callbacks._table)
    compiled(rand((3,)))
    first = set(host_callbacks._table) - before
    assert len(first) == 1
    compiled(rand((4,)))  # evicts the first signature
    gc.collect()
    assert not first & set(host_callbacks._table)
    assert_same(compiled(rand((4,))), jax.jit(pure_sin)(rand((4,))))


# -- the libraries that call back by default ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def dfx():
    return pytest.importorskip("diffrax")


def test_diffrax_tsit5_with_pid_controller(dfx):
    def solve(y0, rate):
        term = dfx.ODETerm(lambda t, y, k: -k * y + jnp.sin(t))
        sol = dfx.diffeqsolve(term, dfx.Tsit5(), t0=0.0, t1=3.0, dt0=0.1, y0=y0, args=rate,
                              stepsize_controller=dfx.PIDController(rtol=1e-5, atol=1e-7),
                              saveat=dfx.SaveAt(ts=jnp.linspace(0.0, 3.0, 7)))
        return sol.ys, sol.stats["num_steps"]
    y0, rate = jnp.array([1.0, 2.0]), jnp.float32(0.7)
    ys, steps = mnjit(solve)(y0, rate)
    ys_jit, steps_jit = jax.jit(solve)(y0, rate)
    assert int(steps) == int(steps_jit)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(ys_jit), rtol=2e-5, atol=2e-6)


def test_diffrax_event_stops_the_solve(dfx):
    """diffrax's documented bouncing-ball event: a Newton root find on the event condition inside the solve's
    loop, under a cond. ORT lost an If condition hoisted out of that loop (hlo2onnx/ops/control/loop_analysis.py)."""
    optx = pytest.importorskip("optimistix")

    def fall(y0):
        sol = dfx.diffeqsolve(dfx.ODETerm(lambda t, y, args: jnp.array([y[1], -9.81])), dfx.Tsit5(), 0.0, 10.0,
                              0.01, y0, event=dfx.Event(lambda t, y, args, **kwargs: y[0], optx.Newton(1e-5, 1e-5)))
        return sol.ts, sol.ys
    y0 = jnp.array([10.0, 0.0])
    (ts, ys), (ts_jit, ys_jit) = mnjit(fall)(y0), jax.jit(fall)(y0)
    np.testing.assert_allclose(np.asarray(ts), np.asarray(ts_jit), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(ys_jit), rtol=1e-5, atol=1e-5)  # the height is ~0 there
    np.testing.assert_allclose(np.asarray(ts), [np.sqrt(2 * 10.0 / 9.81)], rtol=1e-4)


def test_diffrax_neural_ode_gradient(dfx):
    def loss(w, y0):
        term = dfx.ODETerm(lambda t, y, w: jnp.tanh(w @ y))
        sol = dfx.diffeqsolve(term, dfx.Tsit5(), t0=0.0, t1=1.0, dt0=0.1, y0=y0, args=w,
                              stepsize_controller=dfx.PIDController(rtol=1e-4, atol=1e-6))
        return jnp.sum(sol.ys[-1] ** 2)
    w, y0 = jnp.asarray(rand((3, 3), low=-0.5, high=0.5)), jnp.ones(3)
    grad = jax.grad(loss)
    np.testing.assert_allclose(np.asarray(mnjit(grad)(w, y0)), np.asarray(jax.jit(grad)(w, y0)),
                               rtol=1e-4, atol=1e-6)


def test_optimistix_newton_root_find():
    optx = pytest.importorskip("optimistix")

    def root(y0):
        sol = optx.root_find(lambda y, _: y ** 3 - jnp.array([8.0, 27.0]), optx.Newton(rtol=1e-6, atol=1e-6), y0)
        return sol.value, sol.stats["num_steps"]
    y0 = jnp.array([1.0, 1.0])
    value, steps = mnjit(root)(y0)
    value_jit, steps_jit = jax.jit(root)(y0)
    assert int(steps) == int(steps_jit)
    np.testing.assert_allclose(np.asarray(value), np.asarray(value_jit), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(value), [2.0, 3.0], rtol=1e-5)


def test_optimistix_nelder_mead_minimise():
    """NelderMead shrinks its simplex with `simplex.at[...].set(...)`: a scatter without index columns. In x64.

    jax 0.12.0.1 and 0.12.1 lower it to the same StableHLO (compared: only the mesh's name differs), and mnjit
    gives 0.12.0.1's jax.jit bit for bit (115 steps); jax 0.12.1's XLA contracts f64 multiply-adds into FMAs
    (its jax.jit and eager runs both take 117 steps, to the same point within the solver's 1e-8). So the steps
    and the point are compared at the solver's own resolution."""
    optx = pytest.importorskip("optimistix")

    def minimise(y0):
        sol = optx.minimise(lambda y, _: jnp.sum((y - jnp.array([1.0, -2.0])) ** 2) + y[0] * y[1] * 0.1,
                            optx.NelderMead(rtol=1e-8, atol=1e-8), y0, max_steps=500)
        return sol.value, sol.stats["num_steps"]
    with jax.enable_x64(True):
        y0 = jnp.zeros(2)
        (value, steps), (value_jit, steps_jit) = mnjit(minimise)(y0), jax.jit(minimise)(y0)
    assert abs(int(steps) - int(steps_jit)) <= 2 and int(steps) < 500
    np.testing.assert_allclose(np.asarray(value), np.asarray(value_jit), rtol=1e-7)


def test_lineax_linear_solve():
    lx = pytest.importorskip("lineax")

    def solve(a, b):
        return lx.linear_solve(lx.MatrixLinearOperator(a), b, lx.LU()).value
    a = jnp.asarray(rand((4, 4)) + 4 * np.eye(4, dtype=np.float32))
    b = jnp.asarray(rand((4,), seed=2))
    assert_same(mnjit(solve)(a, b), jax.jit(solve)(a, b), tol=(1e-5, 1e-5))


def test_token_ops_from_other_producers_translate():
    # jax threads tokens through arguments; other producers make and join them (StableHLO spec: after_all).
    text = """
    func.func @main(%arg0: tensor<2xf32>) -> (!stablehlo.token, tensor<2xf32>) {
      %0 = stablehlo.create_token : !stablehlo.token
      %1 = stablehlo.after_all %0, %0 : !stablehlo.token
      %2 = stablehlo.after_all : !stablehlo.token
      %3 = stablehlo.after_all %1, %2 : !stablehlo.token
      return %3, %arg0 : !stablehlo.token, tensor<2xf32>
    }"""
    import onnxruntime as ort

    conversion = hlo2onnx.convert(text.encode())
    assert conversion.op_counts["stablehlo.after_all"] >= 3
    proto = ir.to_proto(conversion.model)
    assert len(proto.graph.output) == 1  # the token is no output
    session = ort.InferenceSession(proto.SerializeToString())
    x = rand((2,))
    np.testing.assert_array_equal(session.run(None, {session.get_inputs()[0].name: x})[0], x)
