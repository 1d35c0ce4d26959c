"""Posterior recovery of the initial field through the Zel'dovich + CIC forward model.

Truth drawn from the prior, data = ZA(truth) + white noise, HMC with the posterior
preconditioner. On large scales (k below a third of the Nyquist frequency) the
posterior draws must reproduce the truth's power (transfer function within 5% of 1)
and correlate with it (r(k) >= 0.9).

Coverage: over every latent coordinate (independent, whitened Fourier coordinates
of the noncentred parametrisation) the fraction of coordinates whose truth falls
inside the central 50/68/95% sample intervals of the draws must equal what it should
be for a calibrated posterior sampled with the chains' finite effective sample size
(:func:`expected_coverage`), within the binomial standard error over coordinates.
Intervals from autocorrelated draws are short by about p/ESS (0.95 -> 0.94 at
ESS ~ 100), so a fixed nominal p would flag a calibrated sampler;
:func:`test_expected_coverage_is_exact_for_ar1_chains` checks the prediction against
AR(1) chains whose stationary law is the posterior and whose truth is drawn from it.

The 32³ problem is ``slow``; the 8³ one runs by default (its coverage over 511
coordinates and T(k), r(k) on its few large-scale bins).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import diagnostics, models
from fieldhmc.diagnostics.convergence import _ess_basic
from fieldhmc.samplers import FieldOutputs, MemorySink, Sampler, SamplerSettings, stateless_seed

# 8 Mpc/h cells; P(k) = 1000 (k / 0.1 h/Mpc)^-1.5 (Mpc/h)^3. Noise sigma = 0.1 per voxel
# of the evolved overdensity: at k = k_Nyq/3 = 0.13 h/Mpc the signal-to-noise per mode
# D^2 P N / (V sigma^2) ~ 130 (in the linear approximation).
CELL = 8.0
POWER = models.PowerLaw(1000.0, -1.5, 0.1)
SIGMA = 0.1
GROWTH = 1.0
PROBS = (0.5, 0.68, 0.95)


def expected_coverage(draws: np.ndarray, probs=PROBS) -> np.ndarray:
    """Expected coverage of a posterior draw by the central sample intervals, per element.

    ``draws`` ``(chain, draw, K)``; returns ``(len(probs), K)``. For a truth that is a
    posterior draw independent of the chains, the truth's sample quantile is
    :math:`u = F(\\theta) + \\epsilon` with :math:`F(\\theta)` uniform and
    :math:`\\mathrm{Var}\\,\\epsilon = F(1 - F) / \\mathrm{ESS}_F`, the ESS of the
    indicator :math:`I(x \\le q_F)`. Smoothing the uniform by this noise moves the
    CDF at :math:`b` by :math:`\\tfrac12 \\partial_F \\mathrm{Var}\\,\\epsilon`, so the
    coverage of :math:`[\\hat q_a, \\hat q_b]`, :math:`a, b = (1 \\mp p)/2`, is

    .. math:: p - \\frac{p}{M} - \\frac p2 \\left(\\frac{1}{\\mathrm{ESS}_a}
        + \\frac{1}{\\mathrm{ESS}_b}\\right) + O(\\mathrm{ESS}^{-2}),

    the :math:`p/M` term (M draws in all) from interpolating between order statistics
    (exact for iid draws: :math:`p (M - 1)/(M + 1)`).
    """
    num = draws.shape[0] * draws.shape[1]
    columns = np.ascontiguousarray(np.moveaxis(draws, -1, 0))  # (K, chain, draw)
    tails = [t for p in probs for t in ((1 - p) / 2, (1 + p) / 2)]
    quantiles = np.quantile(columns.reshape(len(columns), -1), tails, axis=1)
    inv_ess = [
        1.0 / _ess_basic((columns <= q[:, None, None]).astype(np.float64)) for q in quantiles
    ]
    return np.asarray(
        [p - p / num - 0.5 * p * (inv_ess[2 * i] + inv_ess[2 * i + 1]) for i, p in enumerate(probs)]
    )


def coverage_z(draws: np.ndarray, truth: np.ndarray, probs=PROBS) -> tuple[np.ndarray, ...]:
    """``(observed, expected, z)`` coverage over the K elements of ``truth`` ``(K,)``;
    z uses the binomial standard error over independent elements."""
    observed = diagnostics.coverage(draws, truth, probs)["coverage"]
    c = expected_coverage(draws, probs)
    se = np.sqrt((c * (1 - c)).sum(axis=1)) / c.shape[1]
    return observed, c.mean(axis=1), (observed - c.mean(axis=1)) / se


@pytest.mark.parametrize("rho", [pytest.param(0.0, marks=pytest.mark.slow), 0.8])
def test_expected_coverage_is_exact_for_ar1_chains(rho):
    """AR(1) chains with N(0, 1) stationary law and N(0, 1) truths: the observed coverage
    equals :func:`expected_coverage` within 3.5 standard errors, while for rho = 0.8
    (ESS ~ 50 per element) the 95% coverage is measurably below nominal."""
    rng = np.random.default_rng(3)
    num_elements, chains, length = 10000, 2, 200
    x = np.empty((chains, length, num_elements))
    x[:, 0] = rng.standard_normal((chains, num_elements))
    noise = np.sqrt(1 - rho**2) * rng.standard_normal((chains, length, num_elements))
    for t in range(1, length):
        x[:, t] = rho * x[:, t - 1] + noise[:, t]
    observed, expected, z = coverage_z(x, rng.standard_normal(num_elements))
    assert np.all(np.abs(z) < 3.5), (observed, expected, z)
    if rho > 0:
        se = np.sqrt(0.95 * 0.05 / num_elements)
        assert (0.95 - expected[-1]) / se > 4, expected  # the correction matters here
        assert (0.95 - observed[-1]) / se > 3, observed  # nominal would be rejected


def recover(
    n: int,
    num_results: int,
    num_burnin: int,
    num_chains: int = 4,
    seed: int = 5,
    num_leapfrog_steps: int = 16,
):
    grid = models.Grid((n, n, n), CELL * n)
    forward = models.ZeldovichForward(grid, growth=GROWTH)
    model = models.GaussianFieldModel(grid, POWER, SIGMA, forward=forward, dtype=tf.float32)
    truth = model.sample(seed=stateless_seed(seed))
    data = truth["data"].numpy()
    settings = SamplerSettings(
        kind="hmc",
        num_chains=num_chains,
        num_burnin_steps=num_burnin,
        num_results=num_results,
        num_leapfrog_steps=num_leapfrog_steps,
        jitter_leapfrog=True,
        step_size=0.1,
        chunk_size=100,
        field_thin=2,
        seed=seed,
    )
    outputs = FieldOutputs(
        field_fn=lambda field: field,  # keep the latent; delta is linear in it
        power_fn=lambda f: tf.reduce_sum(f**2, axis=[-3, -2, -1])[:, None],
    )
    scales = [1.0 / np.sqrt(model.posterior_precision_diag(data))]
    sampler = Sampler(model.target_log_prob_fn(data), settings, ["field"], scales, outputs)
    init = [np.asarray(model.init_latents("prior", num_chains, seed=stateless_seed(seed + 1))[0])]
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as d:
        sampler.run(sink, Path(d), init, progress=False)
    latents = np.swapaxes(sink.stacked_fields(), 0, 1)  # chain, draw, n, n, n
    deltas = np.stack(
        [model.field_from_latents(tf.constant(chain)).numpy() for chain in latents]
    )  # chain, draw, n, n, n

    kbins = grid.kbins()
    true_delta = truth["delta"].numpy()
    p_true = diagnostics.cross_power(true_delta, kbins.index, kbins.num_bins)
    p_draw = diagnostics.cross_power(deltas, kbins.index, kbins.num_bins)
    p_cross = diagnostics.cross_power(deltas, kbins.index, kbins.num_bins, field_b=true_delta)
    t_k = diagnostics.transfer_function(p_draw, p_true).mean(axis=(0, 1))
    r_k = diagnostics.cross_correlation(p_cross, p_draw, p_true).mean(axis=(0, 1))
    large = kbins.k < grid.nyquist.min() / 3

    # coverage of the true latent over every coordinate but the (prior-only) mean mode
    keep = ~model._is_mean_coordinate
    observed, expected, z = coverage_z(latents[:, :, keep], truth["field"].numpy()[keep])
    return {
        "t": t_k[large],
        "r": r_k[large],
        "k": kbins.k[large],
        "coverage": observed,
        "expected": expected,
        "z": z,
    }


def _check(result):
    t, r = result["t"], result["r"]
    assert np.all(np.abs(t - 1) < 0.05), f"T(k) at k={result['k']}: {t}"
    assert np.all(r >= 0.9), f"r(k) at k={result['k']}: {r}"
    assert np.all(np.abs(result["z"]) < 3.5), (
        f"coverage {result['coverage']} vs expected {result['expected']} at the chains' "
        f"ESS (nominal {PROBS}), z = {result['z']}"
    )


def test_zeldovich_posterior_recovers_the_truth_8():
    _check(recover(8, num_results=200, num_burnin=150))


@pytest.mark.slow
def test_zeldovich_posterior_recovers_the_truth_32():
    _check(recover(32, num_results=600, num_burnin=300))
