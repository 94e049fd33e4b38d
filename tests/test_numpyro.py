"""NumPyro's documented programs under mnjit, against jax.jit: distributions (sampling, which loops and draws,
and log densities), a model's potential and its gradient, one NUTS and one HMC transition, SVI's update and
Predictive, each in both x64 modes.

NumPyro's programs do not survive a switch of jax.enable_x64 within a process (jax.jit alone then fails with
"expected f64[8] but got f32[8]"), so the cases run in the process's own mode and one test runs them all again
in a process of its own with JAX_ENABLE_X64=1.

Whole chains are compared over a few transitions only: a transition is the same to a few ulps, and a chain
amplifies ulps (NUTS's tree doubling turns on comparisons), so jax.jit's own chain would drift as far from a
differently fused XLA one.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from harness import assert_same
from mnjit import mnjit

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
infer = pytest.importorskip("numpyro.infer")
from numpyro.infer.autoguide import AutoMultivariateNormal, AutoNormal  # noqa: E402
from numpyro.infer.hmc import hmc  # noqa: E402
from numpyro.infer.util import initialize_model  # noqa: E402

# The eight schools model of NumPyro's front page.
SCHOOLS = 8
OBSERVED = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", SCHOOLS):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def _key():
    return jax.random.PRNGKey(0)


def _potential(model=eight_schools, args=(SIGMA, OBSERVED), kwargs=None):
    """A model's initial unconstrained parameters and its potential (eight schools by default)."""
    params, potential_fn, _, _ = initialize_model(_key(), model, model_args=args, model_kwargs=kwargs)
    return params, potential_fn


def _transition(algo: str, **init):
    """One transition of the functional HMC/NUTS API (what MCMC jits), from a warmed-up state."""
    params, potential_fn = _potential()
    init_kernel, sample_kernel = hmc(potential_fn, algo=algo)
    return sample_kernel, (init_kernel(params, num_warmup=100, **init),)


def _chain(steps: int):
    params, potential_fn = _potential()
    init_kernel, sample_kernel = hmc(potential_fn, algo="NUTS")

    def chain(key):
        state = init_kernel(params, num_warmup=20, rng_key=key)
        return jax.lax.fori_loop(0, steps, lambda i, s: sample_kernel(s), state).z
    return chain, (_key(),)


def _svi():
    svi = infer.SVI(eight_schools, AutoNormal(eight_schools), numpyro.optim.Adam(0.01), infer.Trace_ELBO())
    return svi, svi.init(_key(), SIGMA, OBSERVED)


def _svi_update():
    svi, state = _svi()
    return lambda s: svi.update(s, SIGMA, OBSERVED), (state,)


def _svi_steps():
    svi, state = _svi()
    return lambda s: jax.lax.fori_loop(0, 20, lambda i, s: svi.update(s, SIGMA, OBSERVED)[0], s), (state,)


def _predictive():
    predictive = infer.Predictive(eight_schools, num_samples=50)
    return lambda key: predictive(key, SIGMA), (_key(),)


def ar1(y=None, steps=20):
    """An AR(1) series through numpyro.contrib.control_flow.scan (the time-series examples)."""
    from numpyro.contrib.control_flow import scan
    phi = numpyro.sample("phi", dist.Uniform(-1, 1))
    scale = numpyro.sample("scale", dist.HalfNormal(1.0))

    def step(previous, observed):
        value = numpyro.sample("y", dist.Normal(phi * previous, scale), obs=observed)
        return value, value
    scan(step, 0.0, y, length=steps)


def gaussian_process(x, y=None):
    """The Gaussian process example's RBF kernel: a Cholesky factor inside MultivariateNormal."""
    var = numpyro.sample("var", dist.LogNormal(0.0, 1.0))
    length = numpyro.sample("length", dist.LogNormal(0.0, 1.0))
    noise = numpyro.sample("noise", dist.LogNormal(-2.0, 1.0))
    k = var * jnp.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / length ** 2) + (noise + 1e-6) * jnp.eye(x.shape[0])
    numpyro.sample("y", dist.MultivariateNormal(jnp.zeros(x.shape[0]), covariance_matrix=k), obs=y)


def _of_potential(transform, model=eight_schools, args=(SIGMA, OBSERVED), kwargs=None):
    """A case: `transform` of the model's potential, at its initial parameters."""
    def build():
        params, potential_fn = _potential(model, args, kwargs)
        return transform(potential_fn), (params.z,)
    return build


def _svi_mvn_guide():
    """AutoMultivariateNormal: a scale_tril parameter, triangular solves in the ELBO's gradient."""
    guide = AutoMultivariateNormal(eight_schools)
    svi = infer.SVI(eight_schools, guide, numpyro.optim.Adam(0.01), infer.Trace_ELBO())
    return lambda s: svi.update(s, SIGMA, OBSERVED), (svi.init(_key(), SIGMA, OBSERVED),)


def _sampler(make, shape=(200,)):
    return lambda: (lambda key: make().sample(key, shape), (_key(),))


def _log_prob(make, values):
    return lambda: (lambda x: make().log_prob(x), (jnp.asarray(values),))


# name -> (builder returning (fun, args), relative tolerance in f32, in f64). Built inside the x64 mode.
CASES = {
    "normal_sample": (_sampler(lambda: dist.Normal(0.0, 1.0)), 2e-6, 1e-13),
    "gamma_sample": (_sampler(lambda: dist.Gamma(2.5, 1.0)), 1e-5, 1e-12),
    "dirichlet_sample": (_sampler(lambda: dist.Dirichlet(jnp.ones(5)), (50,)), 1e-5, 1e-12),
    "beta_sample": (_sampler(lambda: dist.Beta(2.0, 3.0)), 1e-5, 1e-12),
    "poisson_sample": (_sampler(lambda: dist.Poisson(3.5)), 0, 0),
    "binomial_sample": (_sampler(lambda: dist.Binomial(10, 0.3)), 0, 0),
    "categorical_sample": (_sampler(lambda: dist.Categorical(logits=jnp.arange(5.0))), 0, 0),
    "lkj_cholesky_sample": (_sampler(lambda: dist.LKJCholesky(3, 2.0), (5,)), 1e-5, 1e-12),
    "mvn_log_prob": (_log_prob(lambda: dist.MultivariateNormal(jnp.zeros(3), jnp.eye(3) * 2.0),
                               np.linspace(-1, 1, 12).reshape(4, 3)), 2e-6, 1e-13),
    "student_t_log_prob": (_log_prob(lambda: dist.StudentT(3.0, 0.0, 1.0), np.linspace(-3, 3, 10)), 2e-6, 1e-13),
    "beta_log_prob": (_log_prob(lambda: dist.Beta(2.0, 3.0), np.linspace(0.1, 0.9, 10)), 2e-6, 1e-13),
    "potential": (_of_potential(lambda potential_fn: potential_fn), 2e-6, 1e-13),
    "potential_grad": (_of_potential(jax.grad), 1e-5, 1e-12),
    "nuts_transition": (lambda: _transition("NUTS"), 2e-5, 1e-11),
    "hmc_transition": (lambda: _transition("HMC", trajectory_length=1.0), 2e-5, 1e-11),
    "nuts_chain_3": (lambda: _chain(3), 2e-5, 1e-11),
    "svi_update": (_svi_update, 2e-5, 1e-11),
    "svi_mvn_guide": (_svi_mvn_guide, 1e-4, 1e-10),
    "ar1_scan_value_and_grad": (_of_potential(jax.value_and_grad, ar1, (), {"y": np.sin(np.arange(20.0))}), 1e-5,
                                1e-12),
    "gaussian_process_value_and_grad": (_of_potential(jax.value_and_grad, gaussian_process,
                                                      (np.linspace(0, 1, 15), np.sin(6 * np.linspace(0, 1, 15)))),
                                        1e-4, 1e-10),
    "svi_20_steps": (_svi_steps, 1e-4, 1e-10),
    "predictive": (_predictive, 2e-5, 1e-11),
}


def _plain(tree):
    """Typed PRNG keys as their key data (assert_same compares arrays as numpy)."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x,
                        tree)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax_jit(name):
    build, rtol32, rtol64 = CASES[name]
    fun, args = build()
    rtol = rtol64 if jax.config.jax_enable_x64 else rtol32
    assert_same(_plain(mnjit(fun)(*args)), _plain(jax.jit(fun)(*args)), tol=(rtol, rtol))


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="this is the x64 run")
def test_matches_jax_jit_in_x64_mode():
    env = {**os.environ, "JAX_ENABLE_X64": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           f"{__file__}::test_matches_jax_jit"], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=900)
    assert done.returncode == 0 and f"{len(CASES)} passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
