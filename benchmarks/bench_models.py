"""mnjit against jax.jit and jax2onnx on five models, in one run.

For each model: ONNX node count, model bytes, conversion time (trace + lower +
translate for mnjit; jax2onnx.to_onnx for jax2onnx) and steady-state time per
call (ONNX Runtime for both ONNX models, XLA for jax.jit). Steady-state times
are medians of interleaved rounds, so the candidates share the machine's noise.

    python benchmarks/bench_models.py [--rounds 7] [--models mlp,cnn]

The models are written in plain jnp (no flax): tests/test_patterns_extra.py
imports them to check that the fusions fire on them. jax2onnx is optional
(`pip install .[bench]`); without it its columns read "n/a".
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# This checkout's mnjit/hlo2onnx, not an installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

F32 = np.float32


@dataclass
class Model:
    name: str
    fun: Callable
    args: tuple
    calls: int = 20  # calls per timing round


def _normal(rng, *shape, scale=1.0):
    return (rng.normal(size=shape) * scale).astype(F32)


# -- MLP predict ------------------------------------------------------------------------------------
def mlp_predict(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return jax.nn.log_softmax(x @ w + b)


def mlp(batch: int = 128) -> Model:
    rng = np.random.default_rng(0)
    sizes = [784, 1024, 1024, 10]
    params = [(_normal(rng, m, n, scale=m ** -0.5), _normal(rng, n, scale=0.1)) for m, n in zip(sizes, sizes[1:])]
    return Model("mlp_predict", mlp_predict, (params, rng.random((batch, 784), F32)), calls=50)


# -- MNIST training step -----------------------------------------------------------------------------
def mnist_step(batch: int = 128) -> Model:
    from jax.example_libraries import optimizers, stax

    init, predict = stax.serial(stax.Dense(1024), stax.Relu, stax.Dense(1024), stax.Relu, stax.Dense(10),
                                stax.LogSoftmax)
    opt_init, opt_update, get_params = optimizers.momentum(0.001, mass=0.9)

    def loss(params, inputs, targets):
        return -jnp.mean(jnp.sum(predict(params, inputs) * targets, axis=1))

    def update(opt_state, inputs, targets):
        return opt_update(0, jax.grad(loss)(get_params(opt_state), inputs, targets), opt_state)

    _, params = init(jax.random.PRNGKey(0), (-1, 784))
    rng = np.random.default_rng(0)
    inputs = rng.random((batch, 784), F32)
    targets = np.eye(10, dtype=F32)[rng.integers(0, 10, batch)]
    # The optimizer state as plain nested lists of arrays (its own pytree node is not flattenable by jax2onnx).
    state = jax.tree_util.tree_map(np.asarray, jax.tree_util.tree_leaves(opt_init(params)))
    tree = jax.tree_util.tree_structure(opt_init(params))

    def step(leaves, inputs, targets):
        return jax.tree_util.tree_leaves(update(jax.tree_util.tree_unflatten(tree, leaves), inputs, targets))

    return Model("mnist_step", step, (state, inputs, targets), calls=20)


# -- CNN with inference batch norm (NHWC, plain jnp) ----------------------------------------------------
def conv2d(x, w, b, stride: int = 1):
    y = lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + b


def batch_norm(x, stats, eps: float = 1e-5):
    """Running-statistics batch norm over the last (channel) axis."""
    scale = stats["gamma"] / jnp.sqrt(stats["var"] + eps)
    return (x - stats["mean"]) * scale + stats["beta"]


def max_pool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def cnn_predict(params, x):
    for layer in params["convs"]:
        x = jax.nn.relu(batch_norm(conv2d(x, layer["w"], layer["b"]), layer["bn"]))
        x = max_pool(x)
    x = x.mean(axis=(1, 2))
    return x @ params["head"]["w"] + params["head"]["b"]


def cnn(batch: int = 32) -> Model:
    rng = np.random.default_rng(0)
    channels = [3, 32, 64, 64]
    convs = []
    for cin, cout in zip(channels, channels[1:]):
        bn = {"gamma": 1 + _normal(rng, cout, scale=0.1), "beta": _normal(rng, cout, scale=0.1),
              "mean": _normal(rng, cout, scale=0.1), "var": rng.uniform(0.5, 1.5, cout).astype(F32)}
        convs.append({"w": _normal(rng, 3, 3, cin, cout, scale=(9 * cin) ** -0.5), "b": _normal(rng, cout, scale=0.1),
                      "bn": bn})
    params = {"convs": convs, "head": {"w": _normal(rng, channels[-1], 10, scale=0.1), "b": _normal(rng, 10)}}
    return Model("cnn_bn", cnn_predict, (params, rng.random((batch, 32, 32, 3), F32)), calls=10)


# -- transformer encoder block (hand-written layer norm) ---------------------------------------------------
def layer_norm(x, g, b, eps: float = 1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * g + b


def encoder_block(p, x, heads: int = 8):
    batch, seq, d = x.shape
    h = layer_norm(x, p["ln1_g"], p["ln1_b"])
    split = lambda t: t.reshape(batch, seq, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(h @ p["wq"]), split(h @ p["wk"]), split(h @ p["wv"])
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads).astype(F32)
    attended = jax.nn.softmax(scores, axis=-1) @ v
    x = x + attended.transpose(0, 2, 1, 3).reshape(batch, seq, d) @ p["wo"]
    h = jax.nn.gelu(layer_norm(x, p["ln2_g"], p["ln2_b"]) @ p["w1"] + p["b1"], approximate=False)
    return x + h @ p["w2"] + p["b2"]


def transformer(batch: int = 8, seq: int = 128, d: int = 256, f: int = 1024) -> Model:
    rng = np.random.default_rng(0)
    n = lambda *shape: _normal(rng, *shape, scale=shape[0] ** -0.5)  # noqa: E731
    p = dict(ln1_g=1 + _normal(rng, d, scale=0.1), ln1_b=_normal(rng, d, scale=0.1), wq=n(d, d), wk=n(d, d),
             wv=n(d, d), wo=n(d, d), ln2_g=1 + _normal(rng, d, scale=0.1), ln2_b=_normal(rng, d, scale=0.1),
             w1=n(d, f), b1=_normal(rng, f, scale=0.1), w2=n(f, d), b2=_normal(rng, d, scale=0.1))
    return Model("transformer_block", encoder_block, (p, _normal(rng, batch, seq, d)), calls=10)


# -- JAX-MD FIRE step (float32) ----------------------------------------------------------------------------
def fire(n: int = 1000) -> Model:
    from jax_md import energy, minimize, quantity, space

    box = quantity.box_size_at_number_density(n, 0.8, 2)
    displacement, shift = space.periodic(box)
    positions = jax.random.uniform(jax.random.PRNGKey(0), (n, 2), maxval=box, dtype=jnp.float32)
    fire_init, fire_apply = minimize.fire_descent(energy.soft_sphere_pair(displacement), shift)
    state = fire_init(positions)
    leaves, tree = jax.tree_util.tree_flatten(state)

    def step(*leaves):
        return jax.tree_util.tree_leaves(fire_apply(jax.tree_util.tree_unflatten(tree, leaves)))

    # Weak types do not survive ONNX's signature; the leaves are passed strongly typed to every candidate.
    args = tuple(np.asarray(jnp.asarray(leaf)) for leaf in leaves)  # python floats -> float32 (x64 off)
    return Model("jaxmd_fire_step", step, args, calls=10)


BUILDERS: dict[str, Callable[[], Model]] = {"mlp": mlp, "mnist": mnist_step, "cnn": cnn,
                                            "transformer": transformer, "fire": fire}
# The models whose ORT time should not exceed jax.jit's (the goal).
SPEED_GOAL = ("mlp", "cnn", "transformer")
NODE_GOAL = 0.6  # mnjit nodes <= 0.6x jax2onnx's


# -- measuring -----------------------------------------------------------------------------------------------
@dataclass
class Column:
    """One candidate on one model: an ONNX model (or none, for jax.jit) and how to call it."""

    nodes: int | None = None
    model_bytes: int | None = None
    convert_s: float | None = None
    run: Callable[[], Any] | None = None
    steady_s: float | None = None
    note: str = ""


def _flat(model: Model) -> tuple[list[np.ndarray], Callable]:
    """The model's leaves and a function of the leaves (jax2onnx takes flat arrays)."""
    leaves, tree = jax.tree_util.tree_flatten(model.args)

    def flat_fun(*xs):
        return tuple(jax.tree_util.tree_leaves(model.fun(*jax.tree_util.tree_unflatten(tree, xs))))

    return [np.asarray(jnp.asarray(x)) for x in leaves], flat_fun


def _ort_session(model_bytes: bytes):
    """mnjit's own session settings, for both ONNX models (a fair race between the graphs)."""
    import onnxruntime as ort

    from mnjit.runtime import session_options

    return ort.InferenceSession(model_bytes, session_options(), providers=["CPUExecutionProvider"])


def measure_mnjit(model: Model) -> Column:
    from mnjit import mnjit

    start = time.perf_counter()
    lowered = mnjit(model.fun).lower(*model.args)
    data = lowered.model_bytes
    convert_s = time.perf_counter() - start
    leaves, _ = _flat(model)
    session = _ort_session(data)
    names = [i.name for i in session.get_inputs()]
    feed = dict(zip(names, leaves))
    return Column(len(lowered.onnx_model.graph.node), len(data), convert_s, lambda: session.run(None, feed))


_JAX2ONNX_WARM = []


def _warm_jax2onnx(jax2onnx) -> None:
    """jax2onnx's first conversion in a process pays its one-time start-up (loading its plugins: seconds); one
    tiny conversion first keeps that out of every model's conversion time, as mnjit's own start-up is."""
    if not _JAX2ONNX_WARM:
        _JAX2ONNX_WARM.append(True)
        try:
            jax2onnx.to_onnx(lambda x: x + 1, [jax.ShapeDtypeStruct((2,), jnp.float32)])
        except Exception:  # noqa: BLE001 (the real conversion reports its own failure)
            pass


def measure_jax2onnx(model: Model) -> Column:
    try:
        import jax2onnx
    except ImportError:
        return Column(note="jax2onnx not installed (pip install .[bench])")
    leaves, flat_fun = _flat(model)
    _warm_jax2onnx(jax2onnx)
    start = time.perf_counter()
    try:
        proto = jax2onnx.to_onnx(flat_fun, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves])
    except Exception as e:  # noqa: BLE001 (a model jax2onnx cannot convert is a result, not a crash)
        return Column(note=f"jax2onnx failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    convert_s = time.perf_counter() - start
    data = proto.SerializeToString()
    try:
        session = _ort_session(data)
    except Exception as e:  # noqa: BLE001
        return Column(len(proto.graph.node), len(data), convert_s,
                      note=f"ORT cannot load it: {str(e).splitlines()[0][:100]}")
    feed = dict(zip([i.name for i in session.get_inputs()], leaves))
    return Column(len(proto.graph.node), len(data), convert_s, lambda: session.run(None, feed))


def measure_jit(model: Model) -> Column:
    jitted = jax.jit(model.fun)
    args = jax.tree_util.tree_map(jnp.asarray, model.args)
    start = time.perf_counter()
    jax.block_until_ready(jitted.lower(*args).compile())
    convert_s = time.perf_counter() - start
    jax.block_until_ready(jitted(*args))
    return Column(convert_s=convert_s, run=lambda: jax.block_until_ready(jitted(*args)))


def steady(columns: dict[str, Column], rounds: int, calls: int) -> None:
    runnable = {name: c for name, c in columns.items() if c.run is not None}
    for name, column in list(runnable.items()):
        try:
            column.run()  # warm-up
        except Exception as e:  # noqa: BLE001 (a model ORT cannot run is a result)
            column.note = f"ORT failed: {str(e).splitlines()[0][-100:]}"
            del runnable[name]
    samples = {name: [] for name in runnable}
    for _ in range(rounds):
        for name, column in runnable.items():
            start = time.perf_counter()
            for _ in range(calls):
                column.run()
            samples[name].append((time.perf_counter() - start) / calls)
    for name, s in samples.items():
        runnable[name].steady_s = statistics.median(s)


def bench(model: Model, rounds: int) -> dict[str, Column]:
    columns = {"mnjit": measure_mnjit(model), "jax2onnx": measure_jax2onnx(model), "jax.jit": measure_jit(model)}
    steady(columns, rounds, model.calls)
    return columns


def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if unit == "ms":
        return f"{value * 1e3:.3f}"
    if unit == "KiB":
        return f"{value / 1024:.0f}"
    return str(value)


def print_table(key: str, model: Model, columns: dict[str, Column]) -> None:
    print(f"\n{model.name}")
    print(f"  {'':9s} {'nodes':>6s} {'KiB':>8s} {'convert ms':>11s} {'steady ms':>10s}")
    for name, c in columns.items():
        print(f"  {name:9s} {_fmt(c.nodes):>6s} {_fmt(c.model_bytes, 'KiB'):>8s} {_fmt(c.convert_s, 'ms'):>11s} "
              f"{_fmt(c.steady_s, 'ms'):>10s}  {c.note}")
    m, j2o, jit = columns["mnjit"], columns["jax2onnx"], columns["jax.jit"]
    goals = []
    if m.nodes is not None and j2o.nodes:
        ratio = m.nodes / j2o.nodes
        goals.append(f"nodes {ratio:.2f}x jax2onnx ({'ok' if ratio <= NODE_GOAL else 'MISSED'} <= {NODE_GOAL})")
    if key in SPEED_GOAL and m.steady_s and jit.steady_s:
        ratio = m.steady_s / jit.steady_s
        goals.append(f"ORT {ratio:.2f}x jax.jit ({'ok' if ratio <= 1 else 'MISSED'} <= 1)")
    if goals:
        print("  goals: " + "; ".join(goals))


def main(argv=None) -> None:
    import mnjit

    mnjit.configure_cache(False)  # conversion times measured cold: mnjit's persistent cache off
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default=",".join(BUILDERS), help=f"comma-separated subset of {list(BUILDERS)}")
    args = parser.parse_args(argv)
    import onnxruntime

    try:
        import jax2onnx  # noqa: F401
        from importlib.metadata import version
        j2o = f"jax2onnx {version('jax2onnx')}"
    except ImportError:
        j2o = "jax2onnx not installed: its columns read n/a"
    print(f"jax {jax.__version__}, onnxruntime {onnxruntime.__version__}, {j2o}; CPU; "
          f"steady times are medians of {args.rounds} interleaved rounds")
    for key in args.models.split(","):
        model = BUILDERS[key]()
        print_table(key, model, bench(model, args.rounds))


if __name__ == "__main__":
    main()
