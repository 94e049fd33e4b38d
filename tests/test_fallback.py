"""mnjit(f, fallback=True): what the target cannot run goes to jax.jit, the rest runs as ONNX partitions.

Every result is compared with jax.jit on the same inputs; effects are counted on both sides.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import jax.scipy.linalg
import numpy as np
import pytest
from jax.experimental import io_callback

import hlo2onnx
from harness import assert_same, rand
from hlo2onnx import targets
from mnjit import device, mnjit
from mnjit.partition_runner import PartitionedRunner

X = jnp.asarray(rand((5,), seed=1))


def _refused(y):
    """An op core has no kernel for (Round), which jax.jit runs: the fallback's example. (Host callbacks were,
    until mnjit ran them from the ONNX graph: test_host_callbacks.py.)"""
    return jnp.round(y * 4)


def chained(x):
    """Two supported regions joined through one unsupported op: each region needs the one before."""
    y = jnp.sin(x) * 2 + 1
    z = jnp.round(y)  # REFUSED_LINE
    return jnp.tanh(z) * y - 3


REFUSED_LINE = chained.__code__.co_firstlineno + 3


# Both ways a fallback function runs: traced whole inside mnjit's jax.jit dispatch with ONNX partitions as ORT
# custom calls ("fast"), and partition by partition from Python ("python"; a capped cache takes that path).
PATHS = {"fast": {}, "python": {"max_cache_size": 8}}


def _fallback(fun, path: str = "fast", **options):
    return mnjit(fun, fallback=True, **PATHS[path], **options)


def _took(f, path: str) -> None:
    """Checks that the last call of `f` ran on `path`."""
    (entry,) = f._cache.values()
    assert (entry.fast is not None and f._fast_ok) == (path == "fast")


def _sessions(f, *args) -> int:
    f(*args)
    (entry,) = f._cache.values()  # the one signature called
    assert isinstance(entry.runner, PartitionedRunner)
    return entry.runner.sessions


@pytest.mark.parametrize("path", PATHS)
def test_two_regions_around_one_unsupported_op_give_two_sessions(path):
    f = _fallback(chained, path, target="core")
    assert_same(f(X), jax.jit(chained)(X))
    _took(f, path)
    lowered = f.lower(X)
    assert [p.runs_on for p in lowered.partitions] == ["core", "xla", "core"]
    assert [len(p.closed.jaxpr.eqns) for p in lowered.onnx_partitions] == [3, 3]
    assert _sessions(f, X) == 2


def test_independent_unsupported_op_does_not_split_the_onnx_part():
    def f(x):
        a = jnp.sin(x)
        b = _refused(x)  # needs only the input: scheduled beside the ONNX part, not inside it
        return jnp.exp(a) + 1, b

    g = mnjit(f, target="core", fallback=True)
    assert_same(g(X), jax.jit(f)(X))
    assert [p.runs_on for p in g.lower(X).partitions] in (["core", "xla"], ["xla", "core"])
    assert _sessions(g, X) == 1


def test_report_names_fallen_back_op_and_user_line():
    text = mnjit(chained, target="core", fallback=True).lower(X).report()
    assert "2 ONNX partition(s), 1 jax.jit partition(s), 1 op(s) fell back" in text
    assert f"fell back: round at {__file__}:{REFUSED_LINE}" in text
    assert "ONNX on core, 3 jaxpr eqn(s)" in text


def test_strict_mode_still_raises():
    with pytest.raises(hlo2onnx.UnsupportedOpError):
        mnjit(lambda x: jax.lax.rng_uniform(0.0, 1.0, x.shape) + x, target="core")(X)
    with pytest.raises(hlo2onnx.UnsupportedOpError, match="Round"):
        mnjit(chained, target="core")(X)
    with pytest.raises(hlo2onnx.TargetError):
        mnjit(_while, target="core")(X)


def test_supported_function_is_one_model():
    f = mnjit(lambda x: jnp.sin(x) @ jnp.cos(x)[:, None], fallback=True)
    lowered = f.lower(X)
    assert lowered.whole and len(lowered.partitions) == 1 and lowered.fell_back == []
    assert lowered.model is lowered.partitions[0].conversion.model
    assert {"Sin", "Cos"} <= {n.op_type for n in lowered.onnx_model.graph.node}
    with pytest.raises(ValueError, match="partitions"):
        mnjit(chained, target="core", fallback=True).lower(X).model
    assert_same(f(X), jax.jit(lambda x: jnp.sin(x) @ jnp.cos(x)[:, None])(X))


# -- the unsupported ops of the issue, each against jax.jit ----------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_debug_print_prints_as_often_as_jit(capfd, path):
    def f(x):
        y = jnp.sin(x) + 1
        jax.debug.print("y0={a}", a=y[0])
        return y * 3

    g = _fallback(f, path, target="core")
    for _ in range(2):
        assert_same(g(X), jax.jit(f)(X))
    jax.effects_barrier()
    printed = capfd.readouterr().out.splitlines()
    expected = f"y0={float(jnp.sin(X[0]) + 1)!r}"[:8]
    assert len(printed) == 4 and all(line.startswith(expected) for line in printed), printed
    # A callback is host work: it stays in the one ONNX model (mnjit calls it), nothing falls back.
    assert g.lower(X).whole


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("ordered", [False, True])
def test_io_callback_runs_as_often_and_in_order(ordered, path):
    log = []

    def record(tag):
        def callback(v):
            log.append((tag, np.asarray(v).copy()))
            return np.asarray(v) * 2

        return callback

    def f(x):
        a = io_callback(record("a"), jax.ShapeDtypeStruct(x.shape, x.dtype), jnp.sin(x), ordered=ordered)
        b = io_callback(record("b"), jax.ShapeDtypeStruct(x.shape, x.dtype), jnp.exp(a), ordered=ordered)
        return b - 1

    expected = jax.jit(f)(X)
    jax.effects_barrier()
    jit_log, log[:] = list(log), []
    g = _fallback(f, path, target="core")
    assert_same(g(X), expected)
    assert g.lower(X).whole
    jax.effects_barrier()
    assert [tag for tag, _ in log] == [tag for tag, _ in jit_log] == ["a", "b"]
    for (_, got), (_, want) in zip(log, jit_log):
        np.testing.assert_allclose(got, want, rtol=2e-6)


def test_pure_callback_under_vmap():
    def f(x):
        return _refused(jnp.sin(x)) * 2

    def g(x):
        return jax.vmap(lambda row: jax.pure_callback(np.cos, jax.ShapeDtypeStruct(row.shape, row.dtype), row,
                                                       vmap_method="sequential"))(jnp.sin(x)) * 2

    assert_same(mnjit(f, target="core", fallback=True)(X), jax.jit(f)(X))
    m = jnp.asarray(rand((3, 4), seed=2))
    assert_same(mnjit(g, target="core", fallback=True)(m), jax.jit(g)(m))


def _schur(m):
    t, z = jax.scipy.linalg.schur(m)
    return jnp.sort(jnp.abs(jnp.diagonal(t))) * 2 + jnp.sum(m), jnp.abs(z).sum()


SCHUR_LINE = _schur.__code__.co_firstlineno + 1


def test_schur_falls_back_under_core():
    m = jnp.asarray(rand((4, 4), seed=3))
    g = mnjit(_schur, target="core", fallback=True)  # schur's Loops are beyond core: that part runs on XLA
    assert_same(g(m), jax.jit(_schur)(m), tol=(1e-5, 1e-5))
    lowered = g.lower(m)
    assert "schur" in [op.primitive for op in lowered.fell_back]
    assert lowered.onnx_partitions
    assert f"fell back: schur at {__file__}:{SCHUR_LINE}:" in lowered.report()
    # jnp.sort's body is traced inside jax: its line is the call's
    assert f"fell back: sort at {__file__}:{SCHUR_LINE + 1}:" in lowered.report()
    assert f"{__file__}:" not in "".join(op.reason for op in lowered.fell_back)
    # ort-cpu translates schur (ops/linalg/schur.py): one model, nothing falls back.
    whole = mnjit(_schur, fallback=True)
    assert whole.lower(m).whole
    assert_same(whole(m), jax.jit(_schur)(m), tol=(1e-4, 1e-4))


def _while(x):
    i, y = jax.lax.while_loop(lambda c: c[1].sum() < 100.0, lambda c: (c[0] + 1, c[1] * 1.5 + 1), (0, jnp.abs(x)))
    return jnp.sin(y) + i


@pytest.mark.parametrize("path", PATHS)
def test_while_loop_under_core_falls_back_whole(path):
    g = _fallback(_while, path, target="core")
    assert_same(g(X), jax.jit(_while)(X))
    _took(g, path)
    lowered = g.lower(X)
    assert [op.primitive for op in lowered.fell_back] == ["while"]
    assert "Loop" in lowered.fell_back[0].reason


def _core_with_chain(chain: tuple[str, ...]) -> hlo2onnx.Target:
    """core naming `chain` to run what it refuses (openvino-cpu names ort-cpu). Where Target has no such
    field yet, a subclass adds it."""
    if "fallback_chain" in {f.name for f in dataclasses.fields(hlo2onnx.Target)}:
        return dataclasses.replace(targets.CORE, fallback_chain=chain)

    @dataclasses.dataclass(frozen=True)
    class Chained(hlo2onnx.Target):
        fallback_chain: tuple[str, ...] = ()

    fields = {f.name: getattr(targets.CORE, f.name) for f in dataclasses.fields(targets.CORE)}
    return Chained(**fields, fallback_chain=chain)


def test_fallback_chain_runs_refused_part_on_the_next_target():
    g = mnjit(_while, target=_core_with_chain(("ort-cpu",)), fallback=True)
    assert_same(g(X), jax.jit(_while)(X))
    runs_on = [p.runs_on for p in g.lower(X).partitions]
    assert "ort-cpu" in runs_on and "xla" not in runs_on


def test_fallback_chain_skips_a_target_this_machine_lacks():
    try:
        device.require(targets.ORT_CUDA)
        pytest.skip("this machine runs ort-cuda")
    except device.TargetUnavailableError:
        pass
    g = mnjit(_while, target=_core_with_chain(("ort-cuda",)), fallback=True)
    assert_same(g(X), jax.jit(_while)(X))
    assert [p.runs_on for p in g.lower(X).partitions] == ["core", "xla", "core"]


# -- composition -------------------------------------------------------------------------------------------------
def test_jitted_helper_is_inlined():
    @jax.jit
    def helper(y):
        y = jnp.sin(y) * 2
        return _refused(y) + jnp.cos(y)

    def f(x):
        return helper(x + 1) * 3

    g = mnjit(f, target="core", fallback=True)
    assert_same(g(X), jax.jit(f)(X))
    lowered = g.lower(X)
    # Only the refused op runs under jax.jit: the helper's other ops join the ONNX partitions.
    assert [op.primitive for op in lowered.fell_back] == ["round"]
    assert sum(len(p.closed.jaxpr.eqns) for p in lowered.partitions if p.runs_on == "xla") == 1


def test_grad_and_vmap():
    def f(x):
        y = jnp.sin(x) * x
        jax.debug.print("sum={s}", s=y.sum())
        return jnp.sum(y ** 2)

    x = X
    # The gradient program: the print runs from the ONNX graph.
    g = mnjit(jax.grad(f), target="core", fallback=True)
    assert_same(g(x), jax.jit(jax.grad(f))(x))
    assert g.lower(x).onnx_partitions
    # Transformations of a fallback function trace through it, as with jax.jit.
    h = mnjit(f, target="core", fallback=True)
    assert_same(jax.grad(h)(x), jax.grad(jax.jit(f))(x))
    m = jnp.asarray(rand((3, 5), seed=4))
    assert_same(jax.vmap(h)(m), jax.vmap(jax.jit(f))(m))


def test_keys_cross_partitions():
    def f(key, x):
        noise = jax.random.normal(key, x.shape)  # ONNX on ort-cpu, reading a typed key
        z = _refused(x + noise)
        return z * 2, jax.random.split(key)[0]  # a typed key out of an ONNX partition

    key = jax.random.key(3)
    g = mnjit(f, fallback=True)
    got, want = g(key, X), jax.jit(f)(key, X)
    assert_same(got[0], want[0], tol=(1e-5, 1e-5))
    assert got[1].dtype == want[1].dtype
    assert (jax.random.key_data(got[1]) == jax.random.key_data(want[1])).all()
    assert g.lower(key, X).onnx_partitions


@pytest.mark.parametrize("name", ["cond", "scan", "print_in_loop"])
def test_control_flow_under_core(name, capfd):
    def f(x):
        y = jnp.sin(x)
        if name == "cond":
            y = jax.lax.cond(y.sum() > 0, lambda v: v * 2, lambda v: v - 1, y)
        elif name == "scan":
            y = jax.lax.scan(lambda c, v: (c + v, c * v), 0.0, y)[1]
        else:
            def body(i, v):
                jax.debug.print("step {i}", i=i)
                return v * 1.5
            y = jax.lax.fori_loop(0, 3, body, y)
        return jnp.exp(y) + 1

    assert_same(mnjit(f, target="core", fallback=True)(X), jax.jit(f)(X))
    jax.effects_barrier()
    out = capfd.readouterr().out
    assert out.count("step") == (6 if name == "print_in_loop" else 0)


@pytest.mark.parametrize("path", PATHS)
def test_constant_and_input_outputs(path):
    def f(x):
        return _refused(x), 1.0, x, jnp.float32(2)

    assert_same(_fallback(f, path, target="core")(X), jax.jit(f)(X))
    x = np.asarray(X)  # inputs handed back as outputs come back as jax arrays, as from jax.jit
    assert_same(_fallback(f, path, target="core")(x), jax.jit(f)(x))
    assert_same(_fallback(lambda s: (_refused(s), s), path, target="core")(2.0),
                jax.jit(lambda s: (_refused(s), s))(2.0))


def _chained_targets() -> list[str]:
    """Shipped targets that name a fallback chain (openvino-cpu names ort-cpu) and run on this machine."""
    found = []
    for target in hlo2onnx.TARGETS.values():
        if getattr(target, "fallback_chain", ()):
            try:
                device.require(target)
            except device.TargetUnavailableError:
                continue
            found.append(target.name)
    return found


@pytest.mark.parametrize("name", _chained_targets() or [pytest.param("none", marks=pytest.mark.skip(
    reason="no shipped target names a fallback chain here"))])
def test_shipped_fallback_chain(name):
    def f(x, n):
        y = jnp.sin(x) * 2
        k = (n * 1103515245 + 12345) >> 3  # integer wraparound and shifts: refused by some runtimes
        return jnp.tanh(y) + k.astype(jnp.float32), _refused(y)

    n = jnp.arange(5, dtype=jnp.int32) * 100003
    g = mnjit(f, target=name, fallback=True)
    assert_same(g(X, n), jax.jit(f)(X, n))
    target = hlo2onnx.TARGETS[name]
    assert {p.runs_on for p in g.lower(X, n).partitions} <= {name, *target.fallback_chain, "xla"}


def test_partition_without_custom_call_runs_from_python():
    # On ort-cpu the while loop is an ONNX Loop without a fixed trip count, which the custom call refuses
    # (Ctrl-C could not end it): the plan, made inside the fast path's trace, runs partition by partition.
    def f(x):
        return _refused(_while(x)), 1.0, jnp.arange(3)

    g = mnjit(f, fallback=True)
    assert_same(g(X), jax.jit(f)(X))
    assert_same(g(X + 1), jax.jit(f)(X + 1))
    (entry,) = g._cache.values()
    assert entry.fast is None and any(p.runs_on == "ort-cpu" for p in entry.lowered.partitions)


@pytest.mark.parametrize("path", PATHS)
def test_pytrees_static_arguments_and_cache(path):
    def f(params, x, *, scale):
        y = jnp.tanh(x @ params["w"] + params["b"]) * scale
        return {"out": _refused(y) + params["b"], "aux": (y.sum(), scale)}

    params = {"w": jnp.asarray(rand((5, 4), seed=5)), "b": jnp.asarray(rand((4,), seed=6))}
    g = _fallback(f, path, static_argnames="scale", target="core")
    want = jax.jit(f, static_argnames="scale")
    for scale in (2.0, 2.0, 3.0):
        assert_same(g(params, X, scale=scale), want(params, X, scale=scale))
    assert g.translations == 2
