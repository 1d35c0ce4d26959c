"""Wiener filter and exact Gaussian posteriors vs brute-force dense linear algebra."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.models import (
    PARAMETRIZATIONS,
    conjugate_gradient,
    dense_posterior,
    wiener_filter_mean,
    wiener_posterior,
    wiener_variance,
)
from tests.models.conftest import build_model
from tests.models.numpy_reference import kmag_full

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _dft_matrix(grid_shape) -> np.ndarray:
    """Unnormalised full 3D DFT matrix [N, N] (C order)."""
    mats = [np.exp(-2j * np.pi * np.outer(np.arange(n), np.arange(n)) / n) for n in grid_shape]
    return functools.reduce(np.kron, mats)


def brute_force(model, data):
    """Posterior of delta by dense algebra in pixel space, independent of the packing.

    C_S = D^H diag(s_full) D / N with s_full = P(|k|) N / V on the full spectrum;
    mean = C_S[:, O] (C_S[O, O] + diag(sigma_O^2))^-1 d_O.
    """
    grid = model.grid
    n = grid.num_cells
    dft = _dft_matrix(grid.grid_shape)
    p_full = model.power.numpy(kmag_full(grid.grid_shape, grid.box_size)).reshape(-1)
    s_full = p_full * n / grid.volume
    cov_s = np.real(dft.conj().T @ (s_full[:, None] * dft)) / n
    obs = model.noise_weights.reshape(-1) > 0
    noise = 1.0 / model.noise_weights.reshape(-1)[obs]
    gain = np.linalg.solve(cov_s[np.ix_(obs, obs)] + np.diag(noise), cov_s[obs, :]).T
    mean = gain @ data.reshape(-1)[obs]
    cov = cov_s - gain @ cov_s[obs, :]
    # mode variance (power units): V / N^2 * E|F_k - F_hat_k|^2 on the half-spectrum
    full = np.real(np.einsum("kx,xy,ky->k", dft, cov, dft.conj()))
    full = full.reshape(grid.grid_shape)[..., : grid.modes_shape[2]]
    return mean.reshape(grid.grid_shape), cov, grid.volume / n**2 * full


def _problem(grid_key, likelihood, parametrization="noncentred", sampled=False):
    model, _ = build_model(grid_key, likelihood, parametrization, sampled)
    data = model.sample(seed=[8, 1])["data"].numpy()
    return model, data


@pytest.mark.parametrize("grid_key", ["even", "odd"])
def test_diagonal_posterior_is_exact(grid_key):
    model, data = _problem(grid_key, "gaussian")
    post = wiener_posterior(model, data)
    assert post.method == "diagonal"
    mean, _, mode_var = brute_force(model, data)
    np.testing.assert_allclose(post.mean_field, mean, atol=1e-12)
    np.testing.assert_allclose(post.mode_variance, mode_var, rtol=1e-9, atol=1e-9)
    # S (S + N)^-1 in power units, N = sigma^2 V / N
    p = model.power.numpy(model.grid.kmag())
    noise_power = model.sigma**2 * model.grid.cell_volume
    np.testing.assert_allclose(post.mode_variance, p * noise_power / (p + noise_power))
    d_modes = model.grid.cell_volume * np.fft.rfftn(data)
    np.testing.assert_allclose(post.mean_modes, p / (p + noise_power) * d_modes, atol=1e-10)
    # CG on the same problem converges in one preconditioned step to the same mean
    cg_mean, result = wiener_filter_mean(
        model.grid.grid_shape, model.signal_variance_np(), model.noise_weights, data
    )
    assert result.num_iterations == 1
    np.testing.assert_allclose(cg_mean, mean, atol=1e-10)


@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
@pytest.mark.parametrize("grid_key", ["even", "odd"])
def test_cg_and_dense_match_brute_force_with_mask_and_sigma_map(grid_key, parametrization):
    model, data = _problem(grid_key, "gaussian_mask_map", parametrization)
    post = wiener_posterior(model, data, tol=1e-12)
    assert post.method == "cg" and post.residual <= 1e-12
    mean, cov, mode_var = brute_force(model, data)
    scale = np.abs(mean).max()
    np.testing.assert_allclose(post.mean_field, mean, atol=1e-9 * scale)
    np.testing.assert_allclose(post.mode_variance, mode_var, rtol=1e-8, atol=1e-8)
    dense = dense_posterior(model, data)
    np.testing.assert_allclose(dense.mean_field, mean, atol=1e-9 * scale)
    np.testing.assert_allclose(dense.mean, post.mean_latent, atol=1e-8)
    # latent covariance pushed through delta = field_from_latents(x) (linear) is cov
    n = model.grid.num_cells
    basis = tf.constant(np.eye(n).reshape(n, *model.grid.grid_shape))
    jac = model.field_from_latents(basis).numpy().reshape(n, n).T  # d delta / d x
    np.testing.assert_allclose(jac @ dense.covariance @ jac.T, cov, atol=1e-10)
    np.testing.assert_allclose((jac @ dense.mean.reshape(-1)).reshape(mean.shape), mean, atol=1e-9)


@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
def test_wiener_variance_by_cg_matches_dense(parametrization):
    model, data = _problem("odd", "gaussian_mask_map", parametrization)
    _, cov, _ = brute_force(model, data)
    dense = dense_posterior(model, data)
    voxels = [(0, 0, 0), (3, 2, 1), (6, 5, 4)]
    latents = [(0, 0, 0), (0, 0, 1), (2, 3, 4), (6, 5, 4)]
    var = wiener_variance(model, data, voxels=voxels, latent_indices=latents, tol=1e-12)
    flat = [np.ravel_multi_index(v, model.grid.grid_shape) for v in voxels]
    np.testing.assert_allclose(var.voxel_variance, np.diag(cov)[flat], rtol=1e-9)
    flat = [np.ravel_multi_index(v, model.grid.grid_shape) for v in latents]
    np.testing.assert_allclose(var.latent_variance, np.diag(dense.covariance)[flat], rtol=1e-9)


@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
@pytest.mark.parametrize("grid_key", ["even", "odd"])
def test_precision_diag_is_exact_without_mask(grid_key, parametrization):
    model, data = _problem(grid_key, "gaussian", parametrization)
    dense = dense_posterior(model, data)
    precision = np.linalg.inv(dense.covariance)
    expected = model.posterior_precision_diag(data).reshape(-1)
    np.testing.assert_allclose(precision, np.diag(expected), atol=1e-8 * expected.max())
    prior = model.prior_precision_diag().reshape(-1)
    assert np.all(expected >= prior)


def test_precision_diag_approximates_masked_posterior():
    model, data = _problem("even", "gaussian_mask_map", "noncentred")
    exact = np.diag(np.linalg.inv(dense_posterior(model, data).covariance))
    approx = model.posterior_precision_diag(data).reshape(-1)
    # Fourier-diagonal approximation: right on average, not per coordinate
    assert np.mean(approx) == pytest.approx(np.mean(exact), rel=1e-6)


@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
def test_init_wiener_is_the_posterior_mean(parametrization):
    model, data = _problem("odd", "gaussian_mask_map", parametrization, sampled=True)
    (_, _, field) = model.init_latents("wiener", 2, seed=[0, 0], data=data)
    dense = dense_posterior(model, data)
    np.testing.assert_allclose(field.numpy()[1], dense.mean, atol=1e-7)


@pytest.mark.parametrize("parametrization", ["noncentred", "centred", "conditional_scale"])
def test_init_posterior_draws_the_exact_posterior_without_mask(parametrization):
    """Unmasked Gaussian data: ``init_latents("posterior")`` draws delta from the exact
    posterior (dense reference). z-scores of the mean and variance of every voxel and of
    random projections over 4,000 chains; a prior draw fails the variances."""
    model, data = _problem("odd", "gaussian", parametrization)
    mean, cov, _ = brute_force(model, data)
    chains = 4000
    init = model.init_latents("posterior", chains, seed=[5, 6], data=data)
    delta = model.target_log_prob_fn(data).field_from_latents(*init).numpy()
    x = delta.reshape(chains, -1) - mean.reshape(-1)
    rng = np.random.default_rng(3)
    dirs = np.concatenate([np.eye(x.shape[1]), rng.normal(size=(8, x.shape[1]))])
    proj, var = x @ dirs.T, np.einsum("ij,jk,ik->i", dirs, cov, dirs)
    keep = var > 1e-12 * var.max()  # the mean mode's direction is fixed
    proj, var = proj[:, keep], var[keep]
    z_mean = proj.mean(0) / np.sqrt(var / chains)
    z_var = (proj.var(0, ddof=1) / var - 1) / np.sqrt(2 / (chains - 1))
    assert np.abs(z_mean).max() < 4.5, np.abs(z_mean).max()
    assert np.abs(z_var).max() < 4.5, np.abs(z_var).max()


def test_conjugate_gradient_on_a_small_spd_matrix():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(30, 30))
    a = a @ a.T + 30 * np.eye(30)
    b = rng.normal(size=30)
    result = conjugate_gradient(lambda x: a @ x, b, tol=1e-12)
    np.testing.assert_allclose(result.solution, np.linalg.solve(a, b), rtol=1e-10)
    assert result.residual <= 1e-12
    assert conjugate_gradient(lambda x: a @ x, np.zeros(30)).num_iterations == 0
    with pytest.raises(RuntimeError, match="did not reach"):
        conjugate_gradient(lambda x: a @ x, b, tol=1e-14, max_iter=2)


def test_exact_posteriors_reject_poisson_and_large_grids():
    model, data = _problem("odd", "poisson_mask")
    with pytest.raises(ValueError, match="Gaussian likelihood"):
        wiener_posterior(model, data)
    gauss, gdata = _problem("even", "gaussian_mask_map")
    with pytest.raises(ValueError, match="N <= 100"):
        dense_posterior(gauss, gdata, max_size=100)
    assert wiener_posterior(gauss, gdata, dense_max_size=100).mode_variance is None
