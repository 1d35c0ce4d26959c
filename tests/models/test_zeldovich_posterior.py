"""Posterior recovery of the initial field through the Zel'dovich + CIC forward model.

Truth drawn from the prior, data = ZA(truth) + white noise, HMC with the posterior
preconditioner. On large scales (k below a third of the Nyquist frequency) the
posterior draws must reproduce the truth's power (transfer function within 5% of 1)
and correlate with it (r(k) >= 0.9); over every latent coordinate (independent,
whitened Fourier coordinates of the noncentred parametrisation) the truth must fall
inside the central 50/68/95% posterior intervals as often as exact posterior draws
(held-out draws of an independent chain) do, within the binomial Monte Carlo
standard error over coordinates.

The 32³ problem is ``slow``; the 8³ one runs by default (it checks the coverage,
which is meaningful with 512 coordinates, and T(k), r(k) on its few large-scale bins).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import diagnostics, models
from fieldhmc.samplers import FieldOutputs, MemorySink, Sampler, SamplerSettings, stateless_seed

# 8 Mpc/h cells; P(k) = 1000 (k / 0.1 h/Mpc)^-1.5 (Mpc/h)^3. Noise sigma = 0.1 per voxel
# of the evolved overdensity: at k = k_Nyq/3 = 0.13 h/Mpc the signal-to-noise per mode
# D^2 P N / (V sigma^2) ~ 130 (in the linear approximation).
CELL = 8.0
POWER = models.PowerLaw(1000.0, -1.5, 0.1)
SIGMA = 0.1
GROWTH = 1.0
PROBS = (0.5, 0.68, 0.95)
NUM_HELD_OUT = 8


def recover(n: int, num_results: int, num_burnin: int, num_chains: int = 4, seed: int = 5):
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
        num_leapfrog_steps=16,
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

    # Coverage of the true latent over every coordinate but the (prior-only) mean mode,
    # by equal-tailed intervals of chains 0..J-2. The reference ("nominal") is the
    # coverage of exact posterior draws -- NUM_HELD_OUT spaced draws of the held-out
    # last chain -- by the same intervals: it has the same finite-ESS shortfall of
    # sample-quantile intervals (~1/ESS), which a fixed p would wrongly count as bias.
    true_latent = truth["field"].numpy()
    keep = ~model._is_mean_coordinate
    draws = latents[:-1][:, :, keep]
    truth_cov = diagnostics.coverage(draws, true_latent[keep], PROBS)
    held_out = latents[-1][:: latents.shape[1] // NUM_HELD_OUT][:NUM_HELD_OUT]
    reference = np.mean(
        [diagnostics.coverage(draws, h[keep], PROBS)["coverage"] for h in held_out], axis=0
    )
    return {
        "t": t_k[large],
        "r": r_k[large],
        "k": kbins.k[large],
        "coverage": truth_cov["coverage"],
        "reference": reference,
        "num_elements": truth_cov["num_elements"],
    }


def _check(result):
    t, r = result["t"], result["r"]
    assert np.all(np.abs(t - 1) < 0.05), f"T(k) at k={result['k']}: {t}"
    assert np.all(r >= 0.9), f"r(k) at k={result['k']}: {r}"
    p = np.asarray(PROBS)
    # binomial over coordinates, for the truth and for the held-out draws
    se = np.sqrt(p * (1 - p) / result["num_elements"] * (1 + 1 / NUM_HELD_OUT))
    z = (result["coverage"] - result["reference"]) / se
    assert np.all(np.abs(z) < 3.5), (
        f"coverage {result['coverage']} vs posterior draws' {result['reference']} "
        f"(nominal {p}), z = {z}"
    )
    assert np.all(np.abs(result["reference"] - p) < 0.05)  # the intervals are sane


def test_zeldovich_posterior_recovers_the_truth_8():
    _check(recover(8, num_results=200, num_burnin=150))


@pytest.mark.slow
def test_zeldovich_posterior_recovers_the_truth_32():
    _check(recover(32, num_results=600, num_burnin=300))
