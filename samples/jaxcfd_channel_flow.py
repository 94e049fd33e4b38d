"""JAX-CFD's 2-D channel flow demo, run by mnjit.

The official demo (jax-cfd notebooks/channel_flow_demo.ipynb) with one change:
`jit` is mnjit. Flow between no-slip walls driven by a uniform pressure
gradient on a 512x128 grid, with Van Leer advection, as a rollout of nested
scans (outer trajectory of repeated inner steps).

Defaults are shortened so a run takes about a minute; `--full` gives the
official lengths (12 outputs x 10000 steps). `--jit jax:jit` runs the
original; `--check` runs both and compares the velocity fields.
"""
from __future__ import annotations

import argparse
import time
import types

import jax.numpy as jnp
import numpy as np

import jax_cfd.base as cfd
from jax_cfd.base import boundaries as _cfd_boundaries
from mnjit import mnjit as jit  # the one change: was `from jax import jit`
from _common import add_jit_options, chosen_jit, verdict  # noqa: E402  --jit/--check, shared by the samples


def _none_to_zero(values):
    if values is None:
        return 0.0
    return tuple(_none_to_zero(v) for v in values) if isinstance(values, (tuple, list)) else values


def _pad_accepting_none(array, pad_width, mode="constant", **kwargs):
    # jax-cfd 0.2.1 passes constant_values containing None for periodic axes (whose
    # padding is zero there, so the value is never used); numpy ignored it, jax.numpy.pad rejects it.
    if "constant_values" in kwargs:
        kwargs["constant_values"] = _none_to_zero(kwargs["constant_values"])
    return jnp.pad(array, pad_width, mode=mode, **kwargs)


# Compatibility shim, local to jax-cfd's boundaries module (JAX itself is untouched).
_cfd_boundaries.jnp = types.SimpleNamespace(**{**vars(jnp), "pad": _pad_accepting_none})


def build(inner_steps: int, outer_steps: int, size=(512, 128)):
    domain = ((0, 8), (0, 2))
    density, viscosity, pressure_gradient = 1.0, 1e-3, 2e-3
    grid = cfd.grids.Grid(size, domain=domain)
    velocity_bc = (cfd.boundaries.channel_flow_boundary_conditions(ndim=2),
                   cfd.boundaries.channel_flow_boundary_conditions(ndim=2))
    zero = lambda x, y: jnp.zeros_like(x + y)  # noqa: E731
    v0 = cfd.initial_conditions.initial_velocity_field(
        velocity_fns=(zero, zero), grid=grid, velocity_bc=velocity_bc,
        pressure_solve=cfd.pressure.solve_fast_diag_channel_flow, iterations=5)
    max_velocity, cfl_safety_factor = 1, 0.5
    dt = cfd.equations.stable_time_step(max_velocity, cfl_safety_factor, viscosity, grid)

    def forcing(v):
        return tuple(cfd.grids.GridArray(f * jnp.ones_like(u.data), u.offset, u.grid)
                     for f, u in zip((pressure_gradient, 0), v))

    def convect(v):
        return tuple(cfd.advection.advect_van_leer(u, v, dt) for u in v)

    step_fn = cfd.funcutils.repeated(
        cfd.equations.semi_implicit_navier_stokes(
            density=density, viscosity=viscosity, dt=dt, grid=grid, convect=convect,
            pressure_solve=cfd.pressure.solve_fast_diag_channel_flow, forcing=forcing),
        steps=inner_steps)
    rollout = cfd.funcutils.trajectory(step_fn, outer_steps, start_with_input=True)
    return rollout, v0


def run(jit, inner_steps: int, outer_steps: int, quiet: bool = False):
    rollout, v0 = build(inner_steps, outer_steps)
    rollout_fn = jit(rollout)
    start = time.perf_counter()
    _, trajectory = rollout_fn(v0)
    u = np.asarray(trajectory[0].data)
    elapsed = time.perf_counter() - start
    if not quiet:
        for i in range(outer_steps):
            print(f"output {i:3d}: max u = {u[i].max():.6f}, mean u = {u[i].mean():.6f}")
        print(f"rollout of {outer_steps} x {inner_steps} steps in {elapsed:.2f} s (first call, compile included)")
    return trajectory, rollout_fn, v0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inner-steps", type=int, default=50)
    parser.add_argument("--outer-steps", type=int, default=12)
    parser.add_argument("--full", action="store_true", help="the official lengths: 12 x 10000 steps")
    add_jit_options(parser, "the velocity fields")
    args = parser.parse_args(argv)
    inner, outer = (10_000, 12) if args.full else (args.inner_steps, args.outer_steps)
    trajectory, _, _ = run(chosen_jit(args.jit, jit), inner, outer)
    if args.check:
        import jax
        reference, _, _ = run(jax.jit, inner, outer, quiet=True)
        diff = max(float(np.max(np.abs(np.asarray(a.data) - np.asarray(b.data))))
                   for a, b in zip(trajectory, reference))
        print(f"max velocity difference vs jax.jit: {diff:.3e}")
        return verdict(diff <= 1e-5, "velocity fields differ from jax.jit by more than 1e-5")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
