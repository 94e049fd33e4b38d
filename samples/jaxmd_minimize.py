"""JAX-MD's FIRE energy minimization of a soft-sphere packing, run by mnjit.

The official example (jax-md's README / minimization notebook) with one change:
`jit` is mnjit. N=1000 disks in 2-D at density 0.8, x64 enabled as in the
original, 200 FIRE steps. `--jit jax:jit` runs the original; `--check` runs both.
"""
from __future__ import annotations

import argparse
import time

from jax import config

config.update("jax_enable_x64", True)  # as in the official example

import jax.numpy as jnp  # noqa: E402
from jax import random  # noqa: E402
from jax_md import energy, minimize, quantity, space  # noqa: E402

from mnjit import mnjit as jit  # noqa: E402  the one change: was `from jax import jit`
from _common import add_jit_options, chosen_jit, verdict  # noqa: E402  --jit/--check, shared by the samples


def run(jit, n: int = 1000, steps: int = 200, dimension: int = 2, density: float = 0.8, quiet: bool = False):
    box_size = quantity.box_size_at_number_density(n, density, dimension)
    displacement, shift = space.periodic(box_size)
    key = random.PRNGKey(0)
    R = random.uniform(key, (n, dimension), maxval=box_size, dtype=jnp.float64)
    energy_fn = energy.soft_sphere_pair(displacement)
    fire_init, fire_apply = minimize.fire_descent(energy_fn, shift)
    fire_apply = jit(fire_apply)
    energy_fn = jit(energy_fn)
    state = fire_init(R)
    energies = []
    start = time.perf_counter()
    for i in range(steps):
        state = fire_apply(state)
        energies.append(float(energy_fn(state.position)))
        if not quiet and (i % 20 == 0 or i == steps - 1):
            print(f"step {i:4d}  E = {energies[-1]:.10f}")
    elapsed = time.perf_counter() - start
    if not quiet:
        print(f"{steps} steps in {elapsed:.2f} s")
    return energies, state


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200)
    add_jit_options(parser, "the final energy")
    args = parser.parse_args(argv)
    energies, state = run(chosen_jit(args.jit, jit), args.n, args.steps)
    if args.check:
        import jax
        reference, ref_state = run(jax.jit, args.n, args.steps, quiet=True)
        # At density 0.8 the disks relax to a zero-energy packing, where a relative
        # difference means nothing: compare relatively while the energy is non-negligible.
        tiny = 1e-12
        final_diff = abs(energies[-1] - reference[-1])
        worst = max((abs(a - b) / abs(b) for a, b in zip(energies, reference) if abs(b) > tiny), default=0.0)
        position_diff = float(jnp.max(jnp.abs(state.position - ref_state.position)))
        print(f"final energy: mnjit {energies[-1]:.12g}, jax.jit {reference[-1]:.12g}; worst relative difference"
              f" while E > {tiny:g}: {worst:.3e}; max position difference {position_diff:.3e}")
        return verdict(final_diff <= 1e-6 * abs(reference[-1]) + tiny and worst <= 1e-6,
                       "energies differ from jax.jit by more than 1e-6 relative")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
