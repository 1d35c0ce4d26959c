"""Samplers against the exact Gaussian posterior of 8³ field models (Wiener reference).

Every latent coordinate's posterior mean and variance is compared with the dense
analytic posterior by MCSE-scaled z-scores; the z-scores as a whole must look like
N(0, 1) draws (chi-square test of their sum of squares, no |z| > 4.5). The test's
power is checked on the same number of draws from a posterior 10% too wide.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from fieldhmc import models
from fieldhmc.diagnostics import ess_bulk
from fieldhmc.samplers import (
    FieldOutputs,
    MemorySink,
    Sampler,
    SamplerSettings,
    stateless_seed,
)

GRID = models.Grid((8, 8, 8), 100.0)
POWER = models.PowerLaw(1000.0, -1.5, 0.1)


@pytest.fixture(scope="module", params=["unmasked", "masked"])
def problem(request):
    mask = None if request.param == "unmasked" else models.make_mask(GRID, "slab", 0.25, seed=3)
    model = models.GaussianFieldModel(GRID, POWER, sigma=2.0, mask=mask, dtype=tf.float64)
    data = np.asarray(model.sample(seed=stateless_seed(7))["data"])
    dense = models.dense_posterior(model, data)
    return request.param, model, data, dense


def _scales(model, data, preconditioner):
    if preconditioner == "posterior":
        return [1.0 / np.sqrt(model.posterior_precision_diag(data))]
    return [np.ones(GRID.grid_shape)]


def _sample(model, data, kind, preconditioner, num_chains=4, num_results=400, **kw):
    settings = SamplerSettings(
        kind=kind,
        num_chains=num_chains,
        num_burnin_steps=200,
        num_results=num_results,
        num_leapfrog_steps=12,
        jitter_leapfrog=kind == "hmc",
        max_tree_depth=7,
        adapt_diagonal=preconditioner == "diagonal",
        chunk_size=150,
        field_thin=1,
        seed=11,
        **kw,
    )
    outputs = FieldOutputs(
        field_fn=lambda field: field,  # store the latent itself
        power_fn=lambda f: tf.reduce_sum(f**2, axis=[-3, -2, -1])[:, None],
    )
    sampler = Sampler(
        model.target_log_prob_fn(data),
        settings,
        ["field"],
        _scales(model, data, preconditioner),
        outputs,
    )
    init = [np.asarray(model.init_latents("prior", num_chains, seed=stateless_seed(1)))[0]]
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as d:
        sampler.run(sink, Path(d), init, progress=False)
    return sink.stacked_fields()  # [draw, chain, 8, 8, 8]


def _zscores(draws, mean, var):
    post = np.moveaxis(draws, 0, 1).reshape(draws.shape[1], draws.shape[0], -1)
    mean, var = mean.reshape(-1), var.reshape(-1)
    z_mean = (post.mean(axis=(0, 1)) - mean) / np.sqrt(var / ess_bulk(post))
    sq = (post - mean) ** 2
    z_var = (sq.mean(axis=(0, 1)) - var) / (var * np.sqrt(2.0 / ess_bulk(sq)))
    return np.concatenate([z_mean, z_var])


def _looks_standard_normal(z) -> tuple[bool, str]:
    chi2 = float(np.sum(z**2))
    p = 2 * min(stats.chi2.sf(chi2, z.size), stats.chi2.cdf(chi2, z.size))
    worst = float(np.max(np.abs(z)))
    return (
        p > 1e-3 and worst < 4.5
    ), f"sum z^2={chi2:.0f} for {z.size} (p={p:.2g}), max|z|={worst:.2f}"


@pytest.mark.parametrize(
    ("kind", "preconditioner"),
    [("hmc", "posterior"), ("hmc", "diagonal"), ("nuts", "posterior"), ("nuts", "identity")],
)
def test_every_mode_matches_the_analytic_posterior(problem, kind, preconditioner):
    name, model, data, dense = problem
    draws = _sample(model, data, kind, preconditioner)
    ok, msg = _looks_standard_normal(_zscores(draws, dense.mean, np.diag(dense.covariance)))
    assert ok, f"{name} {kind}/{preconditioner}: {msg}"


def test_the_z_test_has_power(problem):
    """Independent draws from a posterior 10% too wide fail the same test."""
    _, _, _, dense = problem
    rng = np.random.default_rng(0)
    sd = np.sqrt(np.diag(dense.covariance)).reshape(GRID.grid_shape)
    draws = dense.mean + 1.1 * sd * rng.standard_normal((400, 4, *GRID.grid_shape))
    ok, msg = _looks_standard_normal(_zscores(draws, dense.mean, sd**2))
    assert not ok, msg
    exact = dense.mean + sd * rng.standard_normal((400, 4, *GRID.grid_shape))
    ok, msg = _looks_standard_normal(_zscores(exact, dense.mean, sd**2))
    assert ok, msg


@pytest.mark.parametrize("kind", ["hmc", "nuts"])
def test_target_conservation_from_exact_draws(problem, kind):
    """Exact posterior draws -> one transition -> still the posterior.

    512 chains start at exact draws (dense Cholesky); after one step each coordinate's
    mean and variance over chains are z-tested (independent chains: exact standard
    errors). Power: a 10% error in the posterior sd of every coordinate gives
    E[sum z_var^2] ~ 512 (1 + 0.21^2 * 512/2) -- rejected with near certainty.
    """
    _, model, data, dense = problem
    n = 512
    chol = np.linalg.cholesky(dense.covariance)
    rng = np.random.default_rng(5)
    start = dense.mean.reshape(-1) + rng.standard_normal((n, chol.shape[0])) @ chol.T
    settings = SamplerSettings(
        kind=kind,
        num_chains=n,
        num_burnin_steps=0,
        num_results=1,
        num_leapfrog_steps=10,
        max_tree_depth=6,
        step_size=0.3,
        chunk_size=1,
        field_thin=1,
        seed=2,
    )
    outputs = FieldOutputs(
        field_fn=lambda f: f, power_fn=lambda f: tf.reduce_sum(f**2, axis=[-3, -2, -1])[:, None]
    )
    sampler = Sampler(
        model.target_log_prob_fn(data),
        settings,
        ["field"],
        _scales(model, data, "posterior"),
        outputs,
    )
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as d:
        summary = sampler.run(sink, Path(d), [start.reshape(n, *GRID.grid_shape)], progress=False)
    after = summary["latent_state"][0].reshape(n, -1)
    assert not np.allclose(after, start)  # it moved
    mean, var = dense.mean.reshape(-1), np.diag(dense.covariance)
    z_mean = (after.mean(0) - mean) / np.sqrt(var / n)
    z_var = (((after - mean) ** 2).mean(0) - var) / (var * np.sqrt(2.0 / n))
    ok, msg = _looks_standard_normal(np.concatenate([z_mean, z_var]))
    assert ok, msg
