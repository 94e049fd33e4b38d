"""mnjit / jax.jit ratios for the JAX-MD and JAX-CFD samples, measured side by side in one run.

(a) JAX-MD FIRE: one `fire_apply(state)` step, N=1000 disks in 2-D at density 0.8, x64.
(b) JAX-CFD channel flow: one call of the `build(inner, outer)` rollout (512x128 grid).

Prints the first call (trace + translate/compile + run) and the steady-state time per call:
the median of interleaved rounds, mnjit and jax.jit alternating so they share the machine's
noise. A ratio below 1 means mnjit is faster. `--profile DIR` also writes ORT's per-node
profile of mnjit's steady state and prints the time per ONNX op type.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import random

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's mnjit/hlo2onnx, not an installed copy
from mnjit import mnjit  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "samples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mnist import first_call, steady  # noqa: E402  one timing method for every benchmark


def fire_case(n: int = 1000, dimension: int = 2, density: float = 0.8):
    """The FIRE step function and a state a few steps in (as jaxmd_minimize.py sets it up)."""
    from jax_md import energy, minimize, quantity, space

    box_size = quantity.box_size_at_number_density(n, density, dimension)
    displacement, shift = space.periodic(box_size)
    positions = random.uniform(random.PRNGKey(0), (n, dimension), maxval=box_size, dtype=jnp.float64)
    fire_init, fire_apply = minimize.fire_descent(energy.soft_sphere_pair(displacement), shift)
    state = fire_init(positions)
    step = jax.jit(lambda s: fire_apply(s))  # its own cache entry: the timed jax.jit(fire_apply) compiles afresh
    for _ in range(5):
        state = step(state)
    return fire_apply, (state,)


def cfd_case(inner: int, outer: int):
    from jaxcfd_channel_flow import build

    rollout, v0 = build(inner, outer)
    return rollout, (v0,)


def report(label: str, times: dict[str, float]) -> None:
    m, j = times["mnjit"], times["jax.jit"]
    print(f"{label:40s} mnjit {m * 1e3:10.3f} ms   jax.jit {j * 1e3:10.3f} ms   ratio {m / j:6.2f}", flush=True)


def graph_summary(fn) -> str:
    """Node counts of mnjit's model: the whole graph and the largest Loop body."""
    entry = next(iter(fn._cache.values()))
    graph = entry.lowered.model.graph
    total = sum(1 for _ in graph.all_nodes())
    loops = [n for n in graph.all_nodes() if n.op_type == "Loop"]
    body = max((len(n.attributes["body"].as_graph()) for n in loops), default=0)
    return f"{total} ONNX nodes, {len(loops)} Loops (largest body {body} nodes)"


def profile(label: str, fn, args, calls: int, directory: Path) -> None:
    """Reruns mnjit's model under ORT's profiler and prints where the time goes, per op type."""
    import onnxruntime as ort

    from mnjit.runtime import session_options

    entry = next(iter(fn._cache.values()))
    options = session_options()
    options.enable_profiling = True
    options.profile_file_prefix = str(directory / label.split()[0].lower())
    session = ort.InferenceSession(entry.lowered.model_bytes, options, providers=["CPUExecutionProvider"])
    # Plain numpy feeds by input name: the runner's zero-copy path is not what the profile is for.
    names = [i.name for i in session.get_inputs()]
    feeds = dict(zip(names, (np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(args))))
    for _ in range(calls):
        session.run(None, feeds)
    path = session.end_profiling()
    per_op, total = defaultdict(float), 0.0
    for event in json.loads(Path(path).read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            per_op[event["args"]["op_name"]] += event["dur"]
            total += event["dur"]
    print(f"  ORT profile ({path}): kernel time per op type, % of {total / calls / 1e3:.2f} ms per call")
    for op, us in sorted(per_op.items(), key=lambda kv: -kv[1])[:15]:
        print(f"    {op:24s} {100 * us / total:5.1f}%  {us / calls / 1e3:8.3f} ms")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fire-calls", type=int, default=20, help="FIRE steps per timed round")
    parser.add_argument("--cfd-inner", type=int, default=25)
    parser.add_argument("--cfd-outer", type=int, default=12)
    parser.add_argument("--only", choices=("fire", "cfd"))
    parser.add_argument("--profile", type=Path, help="write ORT profiles of mnjit's models into this folder")
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; steady = median of {args.rounds} interleaved rounds")

    # Each sample in its own precision: FIRE in x64 as the official example, the CFD demo in f32.
    cases = []
    if args.only in (None, "fire"):
        cases.append(("FIRE step (N=1000, 2-D, x64)", True, fire_case, (), args.fire_calls))
    if args.only in (None, "cfd"):
        cases.append((f"CFD rollout ({args.cfd_outer} x {args.cfd_inner}, f32)", False, cfd_case,
                      (args.cfd_inner, args.cfd_outer), 1))
    for label, x64, make, make_args, calls in cases:
        with jax.enable_x64(x64):
            fn, fargs = make(*make_args)
            candidates = {"mnjit": mnjit(fn), "jax.jit": jax.jit(fn)}
            report(label + ": first call", {n: first_call(f, *fargs) for n, f in candidates.items()})
            print(f"  mnjit model: {graph_summary(candidates['mnjit'])}")
            report(label + ": steady", steady(candidates, fargs, args.rounds, calls))
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                profile(label, candidates["mnjit"], fargs, calls, args.profile)


if __name__ == "__main__":
    main()
