"""The device layer against jax.jit, side by side in one run: tiny-call dispatch, then first-call and
steady-state ratios per target for the MLP, the CNN and the transformer block.

    python benchmarks/bench_device.py [--rounds 7] [--targets ort-cpu,auto,openvino-cpu] [--models mlp,cnn,fire]
                                      [--tiny-only]

Every ratio is mnjit / jax.jit measured in the same process with interleaved rounds (medians), so both
share the machine's noise; the load average is printed beside them. A target whose runtime or device is
missing here is listed as unavailable; one that refuses a model (a strict op table) as refused.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import hlo2onnx  # noqa: E402
from bench_models import BUILDERS  # noqa: E402  the same models as bench_models
from mnjit import mnjit, tiering  # noqa: E402
import mnjit as mnjit_package  # noqa: E402

mnjit_package.configure_cache(False)  # first calls measured cold: mnjit's persistent cache off (bench_warm_start.py: warm)
from mnjit.device import TargetUnavailableError  # noqa: E402


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _per_call(fn, arg, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(arg)
    return (time.perf_counter() - start) / calls


def tiny_dispatch(targets: list[str], rounds: int) -> None:
    """x + 1 on float32[4]: what a call costs beyond the computation."""
    x = jnp.zeros(4, jnp.float32)
    fns = {"jax.jit": jax.jit(lambda v: v + 1)}
    for name in targets:
        fns[name] = mnjit(lambda v: v + 1, target=name)
    for fn in fns.values():
        jax.block_until_ready(fn(x))
    decided = {name: tiering.settle(fns[name], x) for name in targets if name == "auto"}  # its steady state
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(_per_call(fn, x, 5000))
    jit = statistics.median(times["jax.jit"])
    print(f"tiny call (x + 1, f32[4]), {_load()}")
    print(f"  jax.jit        {jit * 1e6:8.2f} us")
    for name in targets:
        ours = statistics.median(times[name])
        tier = f"   (on {decided[name].serving})" if name in decided else ""
        print(f"  mnjit {name:<12} {ours * 1e6:8.2f} us   ratio {ours / jit:5.2f}   (goal <= 2.0){tier}")


def _first_call(make, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(make()(*args))
    return time.perf_counter() - start


def _steady(fn, args, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) / calls


def models(targets: list[str], rounds: int, names: list[str]) -> None:
    print(f"\nmodels, ratios mnjit / jax.jit ({_load()})")
    print(f"  {'model':<18}{'target':<14}{'first call ms':>22}{'ratio':>8}{'steady ms':>22}{'ratio':>8}")
    for model in (BUILDERS[name]() for name in names):
        # On the default device, as a training loop's state is: a numpy argument would be copied to it on every
        # call, by jax.jit and by the GPU targets alike.
        model = dataclasses.replace(model, args=jax.device_put(model.args))
        jit_first = _first_call(lambda: jax.jit(model.fun), model.args)
        jitted = jax.jit(model.fun)
        jax.block_until_ready(jitted(*model.args))
        for name in targets:
            try:
                first = _first_call(lambda: mnjit(model.fun, target=name), model.args)
            except (hlo2onnx.TargetError, hlo2onnx.UnsupportedOpError):
                print(f"  {model.name:<18}{name:<14}  refused (outside the target's op table)")
                continue
            ours = mnjit(model.fun, target=name)
            jax.block_until_ready(ours(*model.args))
            mine, theirs = [], []
            for _ in range(rounds):
                mine.append(_steady(ours, model.args, model.calls))
                theirs.append(_steady(jitted, model.args, model.calls))
            steady_ours, steady_jit = statistics.median(mine), statistics.median(theirs)
            print(f"  {model.name:<18}{name:<14}{first * 1e3:10.1f} / {jit_first * 1e3:8.1f}"
                  f"{first / jit_first:8.2f}{steady_ours * 1e3:10.2f} / {steady_jit * 1e3:8.2f}"
                  f"{steady_ours / steady_jit:8.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--targets", default=",".join(["auto", *hlo2onnx.TARGETS]), help="mnjit targets (and auto)")
    parser.add_argument("--tiny-only", action="store_true", help="the tiny call only, no models")
    # fire: the JAX-MD FIRE step (f32, N=1000), f32 elementwise-heavy work; needs the `samples` extra.
    parser.add_argument("--models", default="mlp,cnn,transformer,fire")
    args = parser.parse_args(argv)
    available = []
    for name in args.targets.split(","):
        try:
            mnjit(lambda v: v, target=name)
            available.append(name)
        except TargetUnavailableError as e:
            print(f"{name}: unavailable here: {e}")
    print(f"jax {jax.__version__}, devices {jax.devices()}")
    tiny_dispatch(available, args.rounds)
    if args.tiny_only:
        return
    names = args.models.split(",")
    if "fire" in names and importlib.util.find_spec("jax_md") is None:
        print("fire: skipped, jax-md is not installed (pip install 'mnjit[samples]')")
        names.remove("fire")
    models(available, args.rounds, names)


if __name__ == "__main__":
    main()
