"""The Fisher covariance of the sampled P(k) parameters (the posterior metric's dense
block, :meth:`FieldModel.hyper_posterior_covariance`) against an independent NumPy
computation, where log A and n are strongly correlated.

32³ in the 200 Mpc/h box of ``configs/hierarchical_64.yaml`` (its 64³ box at half the
cells): Gaussian data of uniform noise, no mask, so :math:`p(d \\mid A, n)` is a product
over Fourier modes of Gaussians of variance :math:`V_k = s_k(A, n) + \\sigma^2` per real
coordinate. The Fisher information is minus the Hessian, at the fiducial values, of the
expected log likelihood of data drawn there,
:math:`-\\tfrac12 \\sum_k h_k (V_k(\\theta_0) / V_k(\\theta) + \\ln V_k(\\theta))`, taken here
by central differences of that NumPy function.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from fieldhmc import models

GRID = models.Grid((32, 32, 32), 200.0)
AMPLITUDE, INDEX, K_PIVOT, SIGMA = 1000.0, -1.5, 0.1, 2.0
PRIORS = {"log_amplitude": (np.log(AMPLITUDE), 1.0), "index": (INDEX, 0.5)}


def conditional_model(grid):
    """The config's P(k) and noise, log A and n sampled, conditional, float64."""
    return models.GaussianFieldModel(
        grid,
        models.PowerLaw(AMPLITUDE, INDEX, K_PIVOT),
        SIGMA,
        parametrization="conditional",
        hyper_priors=PRIORS,
        dtype=tf.float64,
    )


def mode_variance(theta, grid):
    """Variance s_k(log A, n) + sigma^2 of each real coordinate of the data's orthonormal
    modes, and the modes' Hermitian weights (NumPy)."""
    k = grid.kmag()
    pos = k > 0
    log_k = np.log(np.where(pos, k, K_PIVOT) / K_PIVOT)
    to_s = grid.num_cells / grid.volume  # P(k) -> variance of an orthonormal mode
    s = np.where(pos, np.exp(theta[0] + theta[1] * log_k) * to_s, 0.0)
    return s + SIGMA**2, grid.hermitian_weights()


def central_hessian(f, x, eps):
    """Hessian of ``f`` at ``x`` (2-D) by central differences of step ``eps``."""
    hess = np.empty((2, 2))
    for a in range(2):
        for b in range(2):
            ea, eb = np.eye(2)[a] * eps, np.eye(2)[b] * eps
            hess[a, b] = (f(x + ea + eb) - f(x + ea - eb) - f(x - ea + eb) + f(x - ea - eb)) / (
                4 * eps**2
            )
    return hess


def expected_log_likelihood(theta, theta0):
    """E over data simulated at ``theta0`` of log p(d | theta), up to a constant (NumPy)."""
    v, h = mode_variance(theta, GRID)
    v0, _ = mode_variance(theta0, GRID)
    return -0.5 * float(np.sum(h * (v0 / v + np.log(v))))


def test_fisher_block_is_the_expected_hessian():
    model = conditional_model(GRID)
    names, cov = model.hyper_posterior_covariance()
    assert names == tuple(PRIORS)
    theta0 = np.array([np.log(AMPLITUDE), INDEX])
    hess = central_hessian(lambda t: expected_log_likelihood(t, theta0), theta0, 1e-3)
    prior_precision = np.diag([1.0 / PRIORS[n][1] ** 2 for n in names])
    expected = np.linalg.inv(-hess + prior_precision)
    np.testing.assert_allclose(cov, expected, rtol=1e-5)
    sd = np.sqrt(np.diag(cov))
    assert cov[0, 1] / (sd[0] * sd[1]) < -0.7  # the case the dense block is for
    # the diagonal metric's scales are the marginal widths of the same block
    scales = model.hyper_posterior_scales()
    np.testing.assert_allclose([scales[n] for n in names], sd, rtol=1e-12)


def exact_log_posterior(theta, d2, loc, scale, grid):
    """log p(log A, n | d) up to a constant from the data's orthonormal modes (NumPy)."""
    v, h = mode_variance(theta, grid)
    lp = -0.5 * float(np.sum(h * (d2 / v + np.log(v))))
    return lp - 0.5 * float(np.sum(((np.asarray(theta) - loc) / scale) ** 2))


def test_laplace_fit_is_at_the_exact_posterior_mode():
    """Data simulated at a prior draw of (log A, n) far from the fiducial values: the
    Laplace fit's mode maximises the exact marginal posterior (NumPy, scipy's optimiser)
    and its covariance is minus the inverse of that function's Hessian there (central
    differences); the fiducial Fisher matrix is several times off."""
    from scipy import optimize

    from fieldhmc.samplers import stateless_seed

    grid = models.Grid((16, 16, 16), 200.0)  # configs/hierarchical_64.yaml's box
    model = conditional_model(grid)
    # the data of a plausible prior draw, 1.5 and 0.8 prior widths off
    truth = np.array([np.log(AMPLITUDE) + 1.5, INDEX + 0.4])
    simulator = models.GaussianFieldModel(
        grid, models.PowerLaw(np.exp(truth[0]), truth[1], K_PIVOT), SIGMA, dtype=tf.float64
    )
    data = np.asarray(simulator.sample(seed=stateless_seed(11))["data"])
    d2 = np.abs(np.fft.rfftn(data, norm="ortho")) ** 2
    loc = np.array([PRIORS[n][0] for n in PRIORS])
    scale = np.array([PRIORS[n][1] for n in PRIORS])

    def f(t):
        return -exact_log_posterior(t, d2, loc, scale, grid)

    ref = optimize.minimize(f, truth, method="Nelder-Mead", options={"xatol": 1e-9, "fatol": 1e-12})
    mode = ref.x
    cov_ref = np.linalg.inv(central_hessian(f, mode, 1e-4))
    sd = np.sqrt(np.diag(cov_ref))

    names, u, cov = model.hyper_posterior_laplace(data)
    assert names == tuple(PRIORS)
    assert np.all(np.abs(u - mode) / sd < 1e-2), (u, mode, sd)
    np.testing.assert_allclose(cov, cov_ref, rtol=2e-2, atol=2e-2 * sd.min() ** 2)
    # the case it is for: the data's parameters are many posterior widths from the
    # fiducial values, where the Fisher widths are far too wide
    assert np.max(np.abs(mode - loc) / sd) > 3
    _, fisher = model.hyper_posterior_covariance()
    assert np.max(np.sqrt(np.diag(fisher)) / sd) > 1.5


def test_no_laplace_fit_under_conditional_scale():
    """conditional_scale's latent z = 0 is the field 0, where the log density does not see
    the data (its "mode" was log A 0.97 against the exact posterior's 4.75 on an 8³
    problem): no fit there, and the workflow's posterior block is the fiducial Fisher
    covariance; a windowed metric starts from the prior widths."""
    from fieldhmc import config as cfg
    from fieldhmc import workflow

    root = Path(__file__).resolve().parents[2]
    overrides = ["grid.shape=[8,8,8]", "model.parametrisation=conditional_scale"]
    config = cfg.load_config(root / "configs" / "hierarchical_64.yaml", overrides)
    model = workflow.build_model(config)
    data = np.asarray(workflow.obtain_data(config, model).data)
    assert model.is_conditional and model.hyper_posterior_laplace(data) is None
    names, cov = workflow._hyper_block(config, model, data)
    expected_names, expected = model.hyper_posterior_covariance()
    assert names == expected_names
    np.testing.assert_array_equal(cov, expected)
    windowed = cfg.load_config(
        root / "configs" / "hierarchical_64.yaml",
        [*overrides, "sampler.preconditioner=diagonal", "sampler.kind=fieldnuts"],
    )
    assert workflow._hyper_block(windowed, model, data) is None
