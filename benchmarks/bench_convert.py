"""Conversion cost against jax's own lowering: transformers of L = 1, 4, 16, 64 layers, forward and gradient.

    python benchmarks/bench_convert.py [--layers 1,4,16,64] [--profile]

Prints, per model: StableHLO ops, ONNX nodes, jax's lower() time, hlo2onnx's translate time (parse to
optimized model) and its ratio to lower(), and ORT session-creation time. The growth should stay linear
in the op count. `--profile` prints the translator's top functions (cProfile) for the largest model.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
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


def measure(name: str, fun, args, profile: bool = False) -> None:
    start = time.perf_counter()
    lowered = jax.jit(fun, keep_unused=True).trace(*args).lower()
    module = lowered.compiler_ir("stablehlo")
    lower_s = time.perf_counter() - start
    ops = _count_ops(module)
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    model = hlo2onnx.translate(module)
    if profiler:
        profiler.disable()
    translate_s = time.perf_counter() - start
    nodes = sum(1 for _ in model.graph.all_nodes())
    start = time.perf_counter()
    create_session(model, ["CPUExecutionProvider"])
    session_s = time.perf_counter() - start
    print(f"{name:<22}{ops:>8}{nodes:>8}{lower_s * 1e3:>10.0f}{translate_s * 1e3:>12.0f}"
          f"{translate_s / lower_s:>9.2f}x{translate_s / ops * 1e3:>10.3f}{session_s * 1e3:>11.0f}", flush=True)
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="1,4,16,64")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'model':<22}{'ops':>8}{'nodes':>8}{'lower ms':>10}{'translate ms':>13}{'/lower':>10}"
          f"{'ms/op':>10}{'session ms':>11}")
    layer_counts = [int(n) for n in args.layers.split(",")]
    for layers in layer_counts:
        forward, grad, fargs = transformer(layers)
        last = layers == layer_counts[-1]
        measure(f"forward L={layers}", forward, fargs, profile=args.profile and last)
        measure(f"gradient L={layers}", grad, fargs, profile=args.profile and last)


if __name__ == "__main__":
    main()
