"""Conversion cost against jax's own lowering: transformers of L = 1, 4, 16, 64 layers, forward and gradient.

    python benchmarks/bench_convert.py [--layers 1,4,16,64] [--reps 3] [--profile]

Prints, per model: StableHLO ops, ONNX nodes, jax's lower() time (trace + lower, a fresh jax.jit each
time), hlo2onnx's translate time (everything after lower(): parse to optimized model) and its ratio to
lower(), the same ratio in CPU time (steadier on a shared machine), the translate time per op, and ORT's
session-creation time. lower() and translate alternate `--reps` times and each takes its median, so both
see the same machine. The summary gives the ratio for the largest model and the cost per op at each size
against the smallest: a flat column is linear growth in the op count. `--profile` prints the translator's
top functions (cProfile) for the largest model.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hlo2onnx  # noqa: E402
from mnjit.runtime import create_session  # noqa: E402


def layer_norm(x, g, b, eps: float = 1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * g + b


def block(p, x, heads: int = 4):
    b, s, d = x.shape
    h = layer_norm(x, p["g1"], p["b1"])
    q, k, v = (jnp.einsum("bsd,de->bse", h, p[n]).reshape(b, s, heads, d // heads) for n in ("wq", "wk", "wv"))
    att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // heads), axis=-1)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, d) @ p["wo"]
    h = layer_norm(x, p["g2"], p["b2"])
    return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]


def transformer(layers: int, d: int = 64, seq: int = 16, batch: int = 2):
    rng = np.random.default_rng(0)
    normal = lambda *s: (rng.standard_normal(s) * 0.05).astype(np.float32)  # noqa: E731
    params = [{"wq": normal(d, d), "wk": normal(d, d), "wv": normal(d, d), "wo": normal(d, d),
               "w1": normal(d, 4 * d), "w2": normal(4 * d, d), "g1": np.ones(d, np.float32),
               "b1": np.zeros(d, np.float32), "g2": np.ones(d, np.float32), "b2": np.zeros(d, np.float32)}
              for _ in range(layers)]

    def forward(params, x):
        for p in params:
            x = block(p, x)
        return x

    def loss_grad(params, x):
        return jax.grad(lambda ps: forward(ps, x).sum())(params)

    return forward, loss_grad, (params, normal(batch, seq, d))


def _count_ops(module) -> int:
    count = 0

    def walk(op):
        nonlocal count
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    count += 1
                    walk(inner.operation)
    walk(module.operation)
    return count


def _median(values: list[float]) -> float:
    return statistics.median(values)


def measure(name: str, fun, args, reps: int, profile: bool = False) -> dict[str, float]:
    """Times lower() and translate alternately `reps` times (medians); prints one row."""
    lower_wall, lower_cpu, translate_wall, translate_cpu = [], [], [], []
    for _ in range(reps):
        gc.collect()  # neither side pays for the other's garbage
        wall, cpu = time.perf_counter(), time.process_time()
        # A new function each time: jax caches a trace by the function it was given.
        module = jax.jit(lambda *a: fun(*a), keep_unused=True).trace(*args).lower().compiler_ir("stablehlo")
        lower_wall.append(time.perf_counter() - wall)
        lower_cpu.append(time.process_time() - cpu)
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        model = hlo2onnx.translate(module)
        translate_wall.append(time.perf_counter() - wall)
        translate_cpu.append(time.process_time() - cpu)
    ops = _count_ops(module)
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        hlo2onnx.translate(module)
        profiler.disable()
    nodes = sum(1 for _ in model.graph.all_nodes())
    start = time.perf_counter()
    create_session(model, ["CPUExecutionProvider"])
    session_s = time.perf_counter() - start
    row = {"ops": ops, "lower": _median(lower_wall), "translate": _median(translate_wall),
           "cpu_ratio": _median(translate_cpu) / _median(lower_cpu)}
    row["ratio"] = row["translate"] / row["lower"]
    print(f"{name:<22}{ops:>8}{nodes:>8}{row['lower'] * 1e3:>10.0f}{row['translate'] * 1e3:>13.0f}"
          f"{row['ratio']:>9.2f}x{row['cpu_ratio']:>9.2f}x{row['translate'] / ops * 1e6:>9.1f}{session_s * 1e3:>11.0f}",
          flush=True)
    if profile:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="1,4,16,64")
    parser.add_argument("--reps", type=int, default=3, help="lower/translate pairs per model (medians)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'model':<22}{'ops':>8}{'nodes':>8}{'lower ms':>10}{'translate ms':>13}{'/lower':>10}"
          f"{'cpu':>10}{'us/op':>9}{'session ms':>11}")
    layer_counts = [int(n) for n in args.layers.split(",")]
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for layers in layer_counts:
        forward, grad, fargs = transformer(layers)
        last = layers == layer_counts[-1]
        for kind, fun in (("forward", forward), ("gradient", grad)):
            rows[kind, layers] = measure(f"{kind} L={layers}", fun, fargs, args.reps, profile=args.profile and last)
    largest, smallest = layer_counts[-1], layer_counts[0]
    for kind in ("forward", "gradient"):
        row = rows[kind, largest]
        base = rows[kind, smallest]["translate"] / rows[kind, smallest]["ops"]
        per_op = ", ".join(f"L={n}: {rows[kind, n]['translate'] / rows[kind, n]['ops'] / base:.2f}"
                           for n in layer_counts)
        print(f"{kind}: translate/lower at {row['ops']} ops (L={largest}) {row['ratio']:.2f}x "
              f"(cpu {row['cpu_ratio']:.2f}x); translate cost per op against L={smallest}: {per_op}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
