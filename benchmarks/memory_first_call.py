"""Peak memory of the first call with a large closed-over constant: mnjit against jax.jit.

Each (variant, jit) pair runs in a fresh process. The process imports jax and mnjit, makes the constant and
the argument, and warms both jits up on a tiny function (ORT's and XLA's start-up are not the constant's cost);
the peak resident set is then reset to the current one (`/proc/self/clear_refs`, or the baseline is the peak so
far where that is refused), the function is called once, and the report is the rise of the peak, in copies of
the constant's size.

With `--hoisted` the constants are passed to the module as arguments (jax_use_simplified_jaxpr_constants, the
default from jax 0.12.1; `--embedded` turns it off): they become the ONNX model's weights either way.

    python benchmarks/memory_first_call.py [--mb 600] [--variants numpy,ones,jax,several,twice] [--hoisted]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

import jax

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# Each variant defines `fun` from the constant's size in float32 elements `n`; x is a float32 scalar.
VARIANTS = {
    "numpy": "w = make(n)\nfun = lambda x: (jnp.asarray(w) * x).sum()",
    "ones": "w = np.ones(n, np.float32)\nfun = lambda x: (jnp.asarray(w) * x).sum()",  # the example
    "jax": "w = jnp.asarray(make(n))\nfun = lambda x: (w * x).sum()",
    "several": "ws = [make(n // 3, seed) for seed in range(3)]\n"
               "fun = lambda x: sum((jnp.asarray(w) * (x + i)).sum() for i, w in enumerate(ws))",
    "twice": "w = make(n)\nfun = lambda x: (jnp.asarray(w) * x).sum() + (jnp.asarray(w) + x).max()",
}

CHILD = """
import json, resource
import numpy as np, jax, jax.numpy as jnp
from mnjit import mnjit
import mnjit as mnjit_package  # noqa: E402

mnjit_package.configure_cache(False)  # first calls measured cold: mnjit's persistent cache off (bench_warm_start.py: warm)

def make(n, seed=0):
    # Random values: a constant of equal elements is lowered as a splat (the "ones" variant).
    return np.random.default_rng(seed).random(n, dtype=np.float32)

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None

def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return status("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def peak():
    return status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

jax.config.update("jax_use_simplified_jaxpr_constants", {hoisted})
n = {n}
{variant}
x = jnp.float32(1.5)
jit = {jit}
jit(lambda v: v + 1)(x).block_until_ready()
jax.jit(lambda v: v * 2)(x).block_until_ready()
base = reset_peak()
compiled = jit(fun)
result = compiled(x)
result.block_until_ready()
report = {{"copies": (peak() - base) / (n * 4), "result": float(result)}}
if {save_to!r}:  # mnjit only: the model saved with its weights in a file beside it
    base = reset_peak()
    compiled.lower(x).save({save_to!r}, external_data="weights.bin")
    report["save_copies"] = (peak() - base) / (n * 4)
print(json.dumps(report))
"""


def measure(variant: str, jit: str, n: int, hoisted: bool | None = None, save_to: str = "") -> dict:
    """{"copies": peak extra copies, "result": the function's value} for `variant` under `jit` ("mnjit" or
    "jax"), with a constant of `n` float32 elements, in a fresh process. `hoisted`: whether jax passes large
    constants as arguments of the module (None: this jax's default). `save_to` (mnjit): then saves the model
    there with external data and adds "save_copies", the peak rise of the save."""
    if hoisted is None:
        hoisted = jax.config.jax_use_simplified_jaxpr_constants
    code = CHILD.format(n=n, variant=VARIANTS[variant], jit="mnjit" if jit == "mnjit" else "jax.jit",
                        hoisted=bool(hoisted), save_to=save_to)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                         timeout=1800)
    if run.returncode != 0:
        raise RuntimeError(f"{variant}/{jit} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=600, help="the constant's size in MB (10^6 bytes)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--hoisted", action=argparse.BooleanOptionalAction, default=None,
                        help="constants as arguments of the module (default: this jax's own setting)")
    args = parser.parse_args()
    n = int(args.mb * 1e6) // 4
    variants = args.variants.split(",")
    print(f"constant {args.mb:g} MB; peak extra copies of it at the first call (fresh process each)")
    # The results' relative difference: an f32 sum of 10^8 terms accumulates differently in ORT and XLA.
    print(f"{'variant':<10}{'jax.jit':>9}{'mnjit':>9}{'rel. diff':>11}")
    for variant in variants:
        theirs, ours = measure(variant, "jax", n, args.hoisted), measure(variant, "mnjit", n, args.hoisted)
        diff = abs(ours["result"] - theirs["result"]) / abs(theirs["result"])
        print(f"{variant:<10}{theirs['copies']:9.2f}{ours['copies']:9.2f}{diff:11.1e}", flush=True)


if __name__ == "__main__":
    main()
