"""The seed workloads in one run: mnjit / jax.jit on every seed workload, with the load average beside it.

Workloads (steady state, the median of interleaved rounds, mnjit and jax.jit alternating):
  cfd_rollout   JAX-CFD channel flow, 12 x 25 steps on 512x128, f32 (bench_samples.cfd_case)
  fire_f64      JAX-MD FIRE step, N=1000 in 2-D, f64 (bench_samples.fire_case)
  fire_f32      the same step in f32 (bench_models.fire)
  fire_loop     100 FIRE f32 steps in a lax.fori_loop
  cfd_step64    one channel-flow step on a 64x64 grid, f32
  mlp, cnn, transformer, mnist   bench_models' builders
then the geomean of the ratios. Arguments are jax arrays (jax.device_put): jax.jit copies a
numpy argument on every call, which would tax jax.jit, not mnjit.

One column per target (--targets, default ort-cpu, and auto and iree-cpu where IREE is installed). Targets
other than ort-cpu and auto run with fallback=True: what they refuse (IREE: while loops without a trip count,
float Pow and trigonometry...) runs on ort-cpu through the partitioner; a target that fails a workload is
reported on its row and left out of its geomean. The auto column (mnjit/tiering.py) is timed once its tier is
decided (`tiering.settle`: the background compile, the comparison, the timing calls); the row says which tier
it ended on, and how long deciding took from the build's readiness (seconds and calls). "auto before the
decision" is auto / jax.jit timed right after auto's first call, while its compiled tier builds in the
background: what the first calls get. Columns run in the order given within each round, and ORT runs 3-15%
slower right after iree-cpu's calls than after jax.jit's (measured on the MLP and CNN, two ort-cpu columns
around an iree-cpu one), so auto comes before iree-cpu. First calls (trace, translate, first run) of ort-cpu
and auto are timed too, each on a fresh wrapper of the function (jax caches traces per function), after a
warm-up call of a third wrapper, in alternating order from row to row.

    python benchmarks/bench_workloads.py [--quick] [--only fire_f64,mlp] [--rounds 7] [--targets ort-cpu,iree-cpu]

The machine's load is printed per workload: on a shared machine a ratio means little without it.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from pathlib import Path

import jax
from jax import lax

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "samples"))
sys.path.insert(0, str(HERE))
import bench_models  # noqa: E402
import bench_samples  # noqa: E402
from bench_mnist import first_call, steady  # noqa: E402  one timing method for every benchmark

import mnjit as mnjit_package  # noqa: E402
from mnjit import mnjit, tiering  # noqa: E402


def _on_device(args):
    return jax.device_put(jax.tree_util.tree_map(jax.numpy.asarray, args))


def _model(builder):
    """A bench_models builder as (function, device arguments, calls per round)."""
    def make(quick: bool):
        model = builder()
        return model.fun, _on_device(model.args), max(1, model.calls // (4 if quick else 1))
    return make


def _fire_f64(quick: bool):
    fn, args = bench_samples.fire_case()
    return fn, _on_device(args), 3 if quick else 10


def _fire_loop(quick: bool):
    model = bench_models.fire()
    steps = 10 if quick else 100

    def run(*leaves):
        return lax.fori_loop(0, steps, lambda _, state: tuple(model.fun(*state)), tuple(leaves))

    return run, _on_device(model.args), 1


def _cfd_rollout(quick: bool):
    fn, args = bench_samples.cfd_case(5, 4) if quick else bench_samples.cfd_case(25, 12)
    return fn, _on_device(args), 1


def _cfd_step64(quick: bool):
    from jaxcfd_channel_flow import build

    fn, v0 = build(1, 1, size=(64, 64))
    return fn, _on_device((v0,)), 5 if quick else 20


# name -> (label, x64, make(quick) -> (fn, args, calls per round))
WORKLOADS = {
    "cfd_rollout": ("CFD rollout f32 12x25 (--quick 4x5)", False, _cfd_rollout),
    "fire_f64": ("FIRE step N=1000 f64", True, _fire_f64),
    "fire_f32": ("FIRE step N=1000 f32", False, _model(bench_models.fire)),
    "fire_loop": ("FIRE x100 fori_loop f32 (--quick x10)", False, _fire_loop),
    "cfd_step64": ("CFD step 64x64 f32", False, _cfd_step64),
    "mlp": ("MLP predict", False, _model(bench_models.mlp)),
    "cnn": ("CNN (BN, NHWC)", False, _model(bench_models.cnn)),
    "transformer": ("transformer block", False, _model(bench_models.transformer)),
    "mnist": ("MNIST train step", False, _model(bench_models.mnist_step)),
}


def _fresh(fn):
    return lambda *args: fn(*args)


def _first_calls(fn, fns: dict, args, order: list[str], rounds: int, calls: int) -> dict:
    """Seconds of each first call, in `order`, after a first call of another wrapper of `fn` has traced
    the jitted functions it calls (jax-md's, for one): the process is warm for each. Right after auto's first
    call, auto and jax.jit are timed in interleaved rounds while auto's compiled tier builds ("before": what
    the first calls get); then the build runs out before the next first call, so that it does not slow it."""
    jax.block_until_ready(mnjit(_fresh(fn))(*args))
    seconds = {}
    for t in order:
        seconds[t] = first_call(fns[t], *args)
        if t == "auto":
            built = time.perf_counter()
            before = steady({"auto": fns["auto"], "jax.jit": fns["jax.jit"]}, args, rounds, calls)
            seconds["before"] = before["auto"] / before["jax.jit"]
            seconds["before status"] = fns["auto"].tier_status(*args)
            fns[t].wait_for_tiering()
            seconds["auto build"] = time.perf_counter() - built
    return seconds


def measure(name: str, rounds: int, quick: bool, targets: list[str], row: int,
            details: dict | None = None) -> dict[str, float]:
    """mnjit on each target / jax.jit, timed in the same interleaved rounds. `details`, when given, receives the
    times (s), first calls (s), failures and auto's decision (benchmarks/make_tables.py reads them)."""
    label, x64, make = WORKLOADS[name]
    with jax.enable_x64(x64):
        fn, args, calls = make(quick)
        fns = {t: mnjit(_fresh(fn), target=t, fallback=t not in ("ort-cpu", "auto")) for t in targets}
        fns["jax.jit"] = jax.jit(fn)
        jax.block_until_ready(fns["jax.jit"](*args))
        timed = [t for t in ("ort-cpu", "auto") if t in targets]
        firsts = _first_calls(fn, fns, args, timed if row % 2 == 0 else timed[::-1], max(1, rounds // 2),
                              calls) if timed else {}
        failed = {}
        for t, f in list(fns.items()):  # first calls: trace, convert or compile, and warm up
            try:
                if t not in firsts:
                    jax.block_until_ready(f(*args))
                jax.block_until_ready(f(*args))
            except Exception as e:  # a target that fails this workload is reported, the others still timed
                failed[t] = " ".join(str(e).split())[:160]
                del fns[t]
        start = time.perf_counter()
        tier = tiering.settle(fns["auto"], *args) if "auto" in fns else None
        settling = time.perf_counter() - start
        times = steady(fns, args, rounds, calls)
    ratios = {t: times[t] / times["jax.jit"] for t in targets if t in times}
    if details is not None:
        details.update(label=label, times=times, firsts=firsts, failed=failed, tier=tier,
                       load=os.getloadavg()[0])
    columns = "  ".join(f"{t} {times[t] * 1e3:9.3f} ms {ratios[t]:5.2f}" if t in times else f"{t} {'failed':>17s}"
                        for t in targets)
    print(f"{label:36s} {columns}  jax.jit {times['jax.jit'] * 1e3:9.3f} ms  load {os.getloadavg()[0]:4.1f}",
          flush=True)
    for t, reason in failed.items():
        print(f"{'':36s} {t} failed: {reason}")
    if firsts:
        print(f"{'':36s} first call: " + "  ".join(f"{t} {firsts[t]:6.2f} s" for t in timed if t in fns))
    if tier is not None:
        decided = (f"{tier.decision_s:.2f} s and {tier.decision_calls} calls after the build was ready"
                   if tier.decision_s is not None else f"{settling:.1f} s after the build")
        was = firsts["before status"]
        print(f"{'':36s} auto before the decision {firsts['before']:5.2f} ({'undecided' if not was.decided else 'decided'}"
              f" after those rounds); built {firsts['auto build']:.1f} s after its first call; decided "
              f"{decided}: {tier}", flush=True)
        ratios["auto before"] = firsts["before"]
        ratios["decision s"] = tier.decision_s
    return ratios


def _geomean(ratios: dict[str, dict[str, float]], target: str) -> str:
    logs = [math.log(row[target]) for row in ratios.values() if row.get(target)]
    missing = f" (over {len(logs)})" if len(logs) < len(ratios) else ""
    return f"{target} {math.exp(sum(logs) / len(logs)):5.2f}{missing}" if logs else f"{target} -"


def _default_targets() -> str:
    return "ort-cpu,auto,iree-cpu" if importlib.util.find_spec("iree") is not None else "ort-cpu"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter CFD rollout and FIRE loop, 3 rounds")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--only", help="comma-separated workload names: " + ",".join(WORKLOADS))
    parser.add_argument("--targets", default=_default_targets(), help="comma-separated mnjit targets, one column each")
    parser.add_argument("--persistent-cache", action="store_true",
                        help="keep mnjit's persistent cache on (off by default here: first calls and decisions are "
                             "measured cold; benchmarks/bench_warm_start.py measures warm ones)")
    args = parser.parse_args(argv)
    if not args.persistent_cache:
        mnjit_package.configure_cache(False)
    names = args.only.split(",") if args.only else list(WORKLOADS)
    targets = args.targets.split(",")
    rounds = args.rounds or (3 if args.quick else 7)
    print(f"jax {jax.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()}; "
          f"median of {rounds} interleaved rounds; ratio = mnjit / jax.jit (< 1: mnjit faster)", flush=True)
    ratios = {name: measure(name, rounds, args.quick, targets, row) for row, name in enumerate(names)}
    geomeans = "  ".join(_geomean(ratios, t) for t in targets + (["auto before"] if "auto" in targets else []))
    print(f"{'geomean of ' + str(len(ratios)) + ' workloads':36s} {geomeans}  load {os.getloadavg()}")


if __name__ == "__main__":
    main()
