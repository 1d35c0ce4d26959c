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

import numpy as np
import tensorflow as tf

from fieldhmc import models

GRID = models.Grid((32, 32, 32), 200.0)
AMPLITUDE, INDEX, K_PIVOT, SIGMA = 1000.0, -1.5, 0.1, 2.0
PRIORS = {"log_amplitude": (np.log(AMPLITUDE), 1.0), "index": (INDEX, 0.5)}


def expected_log_likelihood(theta, theta0):
    """E over data simulated at ``theta0`` of log p(d | theta), up to a constant (NumPy)."""
    h = GRID.hermitian_weights()
    k = GRID.kmag()
    pos = k > 0
    log_k = np.log(np.where(pos, k, K_PIVOT) / K_PIVOT)
    to_s = GRID.num_cells / GRID.volume  # P(k) -> variance of an orthonormal mode

    def variance(t):
        return np.where(pos, np.exp(t[0] + t[1] * log_k) * to_s, 0.0) + SIGMA**2

    v, v0 = variance(theta), variance(theta0)
    return -0.5 * float(np.sum(h * (v0 / v + np.log(v))))


def test_fisher_block_is_the_expected_hessian():
    model = models.GaussianFieldModel(
        GRID,
        models.PowerLaw(AMPLITUDE, INDEX, K_PIVOT),
        SIGMA,
        parametrization="conditional",
        hyper_priors=PRIORS,
        dtype=tf.float64,
    )
    names, cov = model.hyper_posterior_covariance()
    assert names == tuple(PRIORS)
    theta0 = np.array([np.log(AMPLITUDE), INDEX])
    eps = 1e-3
    hess = np.empty((2, 2))
    for a in range(2):
        for b in range(2):
            ea, eb = np.eye(2)[a] * eps, np.eye(2)[b] * eps
            f = [
                expected_log_likelihood(theta0 + sa * ea + sb * eb, theta0)
                for sa, sb in ((1, 1), (1, -1), (-1, 1), (-1, -1))
            ]
            hess[a, b] = (f[0] - f[1] - f[2] + f[3]) / (4 * eps**2)
    prior_precision = np.diag([1.0 / PRIORS[n][1] ** 2 for n in names])
    expected = np.linalg.inv(-hess + prior_precision)
    np.testing.assert_allclose(cov, expected, rtol=1e-5)
    sd = np.sqrt(np.diag(cov))
    assert cov[0, 1] / (sd[0] * sd[1]) < -0.7  # the case the dense block is for
    # the diagonal metric's scales are the marginal widths of the same block
    scales = model.hyper_posterior_scales()
    np.testing.assert_allclose([scales[n] for n in names], sd, rtol=1e-12)
