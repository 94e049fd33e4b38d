"""First calls in a new process, with mnjit's persistent cache cold and warm, against jax.jit's first call with
jax's persistent compilation cache cold and warm: one process per measurement, in one run, with the load.

For each model (bench_models' builders), in this order, each in a fresh Python process:
  mnjit cold    target="auto" (or --target) with an empty mnjit cache: trace, lower, translate, ORT session, first
                run; then the process calls until the tier is decided (stored for the next)
  mnjit warm    the same in a new process: translation, IREE modules and the decision read from the cache
  jax cold      jax.jit's first call, jax's persistent cache off
  jax warm      jax.jit's first call with jax's persistent cache warm (a process before filled it)
The times exclude imports and building the arguments; each is the wall time of the first call, to its result.
With --repeats N, the warm processes (mnjit warm, jax cold, jax warm) run N times each, interleaved, and the
medians are shown (one run's load spike would otherwise decide a ratio).

    python benchmarks/bench_warm_start.py [--models mlp,cnn] [--target auto] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
    import json, sys, time
    sys.path.insert(0, {bench!r})
    import mnjit
    mnjit.configure_cache({mnjit_cache!r})  # (MNJIT_CACHE_DIR would also move the fast path's built extension)
    import jax
    import bench_models
    model = getattr(bench_models, {model!r})()
    args = jax.device_put(jax.tree_util.tree_map(jax.numpy.asarray, model.args))
    if {kind!r} == "jax":
        jax.config.update("jax_compilation_cache_dir", {jax_cache!r} if {warm!r} else None)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        f = jax.jit(model.fun)
    else:
        from mnjit import mnjit, tiering
        f = mnjit(model.fun, target={target!r})
    start = time.perf_counter()
    jax.block_until_ready(f(*args))
    first = time.perf_counter() - start
    extra = {{}}
    if {kind!r} == "mnjit" and {target!r} == "auto":
        status = f.tier_status(*args)
        extra = {{"tier_after_first": status.serving, "cached": status.cached}}
        status = tiering.settle(f, *args)
        extra.update(tier=status.serving, decision_s=status.decision_s, decision_calls=status.decision_calls)
    print(json.dumps({{"first": first, **extra}}))
"""


def _child(model: str, kind: str, warm: bool, target: str, mnjit_cache: str, jax_cache: str) -> dict:
    code = textwrap.dedent(CHILD.format(bench=str(ROOT / "benchmarks"), model=model, kind=kind, warm=warm,
                                        target=target, jax_cache=jax_cache, mnjit_cache=mnjit_cache))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    if done.returncode:
        raise RuntimeError(f"{model} {kind}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,mnist_step,cnn,transformer,fire")
    parser.add_argument("--target", default="auto")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}; first calls in seconds, each in a new process")
    print(f"{'model':12s} {'mnjit cold':>10s} {'mnjit warm':>10s} {'jax cold':>9s} {'jax warm':>9s} "
          f"{'warm/jax cold':>13s} {'warm/jax warm':>13s}  tier (decided after)")
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as mnjit_cache, tempfile.TemporaryDirectory() as jax_cache:
            cold = _child(model, "mnjit", False, args.target, mnjit_cache, jax_cache)
            _child(model, "jax", True, args.target, mnjit_cache, jax_cache)  # fills jax's cache
            runs = {"warm": [], "jax_cold": [], "jax_warm": []}
            for _ in range(args.repeats):  # interleaved: a load change reaches all three columns alike
                runs["warm"].append(_child(model, "mnjit", True, args.target, mnjit_cache, jax_cache))
                runs["jax_cold"].append(_child(model, "jax", False, args.target, mnjit_cache, jax_cache))
                runs["jax_warm"].append(_child(model, "jax", True, args.target, mnjit_cache, jax_cache))
            warm, jax_cold, jax_warm = ({**found[0], "first": statistics.median(r["first"] for r in found)}
                                        for found in runs.values())
        tier = ""
        if "tier" in cold:
            tier = (f"{cold['tier']} ({cold['decision_s']:.2f} s, {cold['decision_calls']} calls); warm: "
                    f"{warm['tier_after_first']} from the first call{' (cached)' if warm['cached'] else ''}"
                    if cold["decision_s"] is not None else f"{cold['tier']}; warm: {warm['tier_after_first']}")
        print(f"{model:12s} {cold['first']:10.3f} {warm['first']:10.3f} {jax_cold['first']:9.3f} "
              f"{jax_warm['first']:9.3f} {warm['first'] / jax_cold['first']:13.2f} "
              f"{warm['first'] / jax_warm['first']:13.2f}  {tier}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
