"""Posterior recovery of the initial field through the Zel'dovich + CIC forward model.

Truth drawn from the prior, data = ZA(truth) + white noise, HMC with the posterior
preconditioner. On large scales (k below a third of the Nyquist frequency) the
posterior draws must reproduce the truth's power (transfer function within 5% of 1)
and correlate with it (r(k) >= 0.9).

Coverage: over every latent coordinate (independent, whitened Fourier coordinates
of the noncentred parametrisation) the fraction of coordinates whose truth falls
inside the central 50/68/95% sample intervals built from all chains but one must equal
the fraction of the held-out chain's own draws inside them (:func:`coverage_z`),
within the standard error over coordinates. Intervals from a finite number of
autocorrelated draws cover less than p (0.95 -> 0.94 at ESS ~ 70), so a nominal p
would flag a calibrated sampler; the held-out draws give the exact expectation for
the chains at hand, checked by :func:`test_coverage_z_is_exact_for_autocorrelated_chains`
on synthetic chains, including slowly mixing ones and a 5% too narrow one.

The 32³ problem is ``slow``; the 8³ one runs by default (its coverage over 511
coordinates and T(k), r(k) on its few large-scale bins).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import scipy.signal
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


def coverage_z(draws: np.ndarray, truth: np.ndarray, probs=PROBS) -> tuple[np.ndarray, ...]:
    """Coverage of ``truth`` ``(K,)`` against that of held-out posterior draws,
    ``(observed, expected, z)`` per prob, from ``draws`` ``(chain, draw, K)``.

    For each chain :math:`c` the central sample intervals :math:`I_c` are built from
    the other chains' draws. The observed coverage is the fraction of the truth inside
    them, averaged over :math:`c`; the expected one the fraction of chain :math:`c`'s
    own draws inside them:

    .. math:: \\hat o = \\frac{1}{CK} \\sum_{c,j} 1[\\theta_j \\in I_{c,j}], \\qquad
        \\hat e = \\frac{1}{CKN} \\sum_{c,j,t} 1[x_{c,t,j} \\in I_{c,j}] .

    Each :math:`x_{c,t,j}` is a posterior draw independent of :math:`I_{c,j}`
    (independent stationary chains), as is :math:`\\theta_j` if the posterior is
    calibrated and the truth was drawn from the prior, so :math:`E \\hat o = E \\hat e`
    whatever the chains' autocorrelation, effective sample size or marginal shape:
    no asymptotic formula. (The first-order one, :math:`p - p/M - \\tfrac p2
    (1/\\mathrm{ESS}_a + 1/\\mathrm{ESS}_b)` with Geyer ESS of the interval-end
    indicators, under-predicted the shortfall of 300-draw HMC chains on the 32³
    Zel'dovich posterior by half: z = -3.1 at 95% that shrank to -1.0 and -0.5 with
    2x and 4x the draws.) The coordinates are independent, so the standard error is
    that of the per-coordinate averages over the K coordinates.
    """
    chains, length, num = draws.shape
    tails = np.asarray([t for p in probs for t in ((1 - p) / 2, (1 + p) / 2)])
    observed = np.zeros((len(probs), num))
    expected = np.zeros((len(probs), num))
    step = max(1, 2_000_000 // (chains * length))
    for s in range(0, num, step):
        x = np.asarray(draws[..., s : s + step], np.float64)
        t = np.asarray(truth[s : s + step], np.float64)
        for c in range(chains):
            rest = np.sort(np.delete(x, c, axis=0).reshape(-1, x.shape[-1]), axis=0)
            q = _quantiles(rest, tails)
            lo, hi = q[0::2], q[1::2]  # (len(probs), k)
            observed[:, s : s + step] += (t >= lo) & (t <= hi)
            inside = (x[c][None] >= lo[:, None]) & (x[c][None] <= hi[:, None])
            expected[:, s : s + step] += inside.mean(axis=1)
    observed /= chains
    expected /= chains
    se = np.sqrt((observed.var(axis=1, ddof=1) + expected.var(axis=1, ddof=1)) / num)
    o, e = observed.mean(axis=1), expected.mean(axis=1)
    return o, e, (o - e) / se


def _quantiles(ordered: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """``np.quantile(x, probs, axis=0)`` (linear method) of ``ordered = np.sort(x, 0)``."""
    h = (len(ordered) - 1) * probs
    i = np.minimum(np.floor(h).astype(int), len(ordered) - 2)
    f = (h - i)[:, None]
    return ordered[i] * (1 - f) + ordered[i + 1] * f


def _chains(rng, num_elements, *, slow_weight=0.0, scale=1.0, chains=4, length=300):
    """``(chain, draw, K)`` chains with N(0, scale^2) marginals: an antithetic AR(1)
    (rho = -0.5) part plus a fraction ``slow_weight`` of the variance in a slow AR(1)
    (rho = 0.98, integrated autocorrelation time 99); iid for ``slow_weight`` 0."""
    shape = (chains, length, num_elements)
    x = rng.standard_normal(shape, np.float32)
    if slow_weight == 0:
        return scale * x
    x = np.sqrt(1 - slow_weight) * _ar1(x, -0.5)
    x += np.sqrt(slow_weight) * _ar1(rng.standard_normal(shape, np.float32), 0.98)
    return scale * x


def _ar1(noise: np.ndarray, rho: float) -> np.ndarray:
    """Stationary N(0, 1) AR(1) along axis 1 driven by standard normal ``noise``."""
    scale = np.sqrt(1 - rho**2)
    start = (1 - scale) * noise[:, :1]  # so that x[:, 0] = noise[:, 0]
    return scipy.signal.lfilter([scale], [1, -rho], noise, axis=1, zi=start)[0]


@pytest.mark.parametrize(
    "case",
    [pytest.param("iid", marks=pytest.mark.slow), "slow", "narrow"],
    ids=["iid", "fast+slow", "5%-narrow"],
)
def test_coverage_z_is_exact_for_autocorrelated_chains(case):
    """N(0, 1) truths. iid and fast+slow-mixing chains with the N(0, 1) law: |z| < 3.5
    (for fast+slow the 95% coverage is far below nominal, 0.933, and the first-order
    ESS formula this replaces gave z95 = -4.5 to -6.2 here); chains whose law is 5%
    too narrow (a biased sampler): z < -3.5 at every prob."""
    rng = np.random.default_rng(3)
    num_elements = 20000
    kwargs = {"slow_weight": 0.5} if case == "slow" else {}
    if case == "narrow":
        kwargs["scale"] = 0.95
    x = _chains(rng, num_elements, **kwargs)
    observed, expected, z = coverage_z(x, rng.standard_normal(num_elements))
    if case == "narrow":
        assert np.all(z < -3.5), (observed, expected, z)
        return
    assert np.all(np.abs(z) < 3.5), (observed, expected, z)
    if case == "slow":
        se = np.sqrt(0.95 * 0.05 / num_elements)
        assert (0.95 - expected[-1]) / se > 4, expected  # the finite sample matters here


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
        f"coverage {result['coverage']} vs {result['expected']} of held-out draws "
        f"(nominal {PROBS}), z = {result['z']}"
    )


def test_zeldovich_posterior_recovers_the_truth_8():
    _check(recover(8, num_results=200, num_burnin=150))


@pytest.mark.slow
def test_zeldovich_posterior_recovers_the_truth_32():
    _check(recover(32, num_results=600, num_burnin=300))
