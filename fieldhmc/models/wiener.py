"""Exact reference posteriors for Gaussian prior + Gaussian noise (the Wiener filter).

With fixed hyperparameters (here: the fiducial ones, whether or not the model
samples them) the posterior of :class:`GaussianFieldModel` is Gaussian. In the
orthonormal Fourier basis the prior covariance is :math:`S = \\mathrm{diag}(s_k)`,
:math:`s_k = P(k) N/V`, and the noise precision is
:math:`W = \\mathrm{diag}(m_x/\\sigma_x^2)`.

* **No mask, scalar** :math:`\\sigma`: the posterior is diagonal in Fourier space,

  .. math::

      \\hat\\delta_k = \\frac{P(k)}{P(k) + N_P}\\, d_k, \\qquad
      \\frac{E|\\delta_k - \\hat\\delta_k|^2}{V} = \\left(\\frac1{P(k)} + \\frac1{N_P}\\right)^{-1},
      \\qquad N_P = \\sigma^2 \\frac VN

  (:math:`N_P` is the noise power), given exactly by :func:`wiener_posterior`.
* **Mask and/or sigma map**: the mean from preconditioned conjugate gradients
  (:mod:`fieldhmc.models.wiener_solver`, relative residual ``tol``), the per-mode
  variances from a dense Cholesky solve on small grids (:func:`dense_posterior`),
  and variances of chosen voxels or latent coordinates from one CG solve each
  (:func:`wiener_variance`).

Modes use the continuum convention :math:`\\delta_k = (V/N)\\,\\mathrm{rfft3d}(\\delta)_k`
and mode variances are in power units, :math:`E|\\delta_k - \\hat\\delta_k|^2 / V`
((Mpc/h)^3), directly comparable with :math:`P(k)`; the ``k = 0`` mode is fixed to 0
(variance 0).

The ``"field"`` latent posterior follows from the linear map
:math:`\\delta = Q\\,T x`: :math:`Q` = ``irfft3d(pack(.), norm="ortho")`` is orthogonal,
:math:`T = \\mathrm{diag}(\\sqrt{s_{k(j)}})` (non-centred; 0 for the mean mode) and
the centred latent is :math:`x^c_j = c_j x^{nc}_j`, :math:`c_j = \\sqrt{s_{k(j)}}`
(1 for the mean mode), so

.. math::

    \\Sigma_{nc} = (I + T Q^\\top W Q T)^{-1}, \\qquad
    \\mu_{nc} = \\Sigma_{nc}\\, T Q^\\top W d.

References
----------
1. Wiener (1949), "Extrapolation, Interpolation and Smoothing of Stationary Time Series".
2. Elsner & Wandelt (2013), arXiv:1210.4931.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import scipy.linalg
import tensorflow as tf

from fieldhmc.models.wiener_solver import WienerSystem, wiener_filter_mean

__all__ = [
    "DensePosterior",
    "WienerPosterior",
    "WienerVariance",
    "dense_posterior",
    "wiener_posterior",
    "wiener_variance",
]

#: Largest ``N`` for which dense posteriors are built by default (an N x N float64
#: matrix is 134 MB at N = 4096 = 16^3).
DENSE_MAX_SIZE = 4096


class WienerPosterior(NamedTuple):
    """Gaussian posterior summary at the fiducial hyperparameters.

    Attributes
    ----------
    mean_field : np.ndarray
        float64 ``grid_shape``: posterior mean of :math:`\\delta(x)`.
    mean_modes : np.ndarray
        complex128 ``[n0, n1, n2 // 2 + 1]``: :math:`(V/N)\\,\\mathrm{rfft3d}(\\hat\\delta)`,
        (Mpc/h)^3.
    mode_variance : np.ndarray or None
        float64 ``[n0, n1, n2 // 2 + 1]``: :math:`E|\\delta_k - \\hat\\delta_k|^2 / V` in
        (Mpc/h)^3 (0 at ``k = 0``); ``None`` if not computed (large masked grids).
    mean_latent : np.ndarray
        float64 ``grid_shape``: posterior mean of the ``"field"`` latent.
    method : str
        ``"diagonal"`` (exact, Fourier-diagonal) or ``"cg"``.
    num_iterations : int
        CG iterations (0 for ``"diagonal"``).
    residual : float
        Relative residual of the CG solution (0 for ``"diagonal"``).
    """

    mean_field: np.ndarray
    mean_modes: np.ndarray
    mode_variance: np.ndarray | None
    mean_latent: np.ndarray
    method: str
    num_iterations: int
    residual: float


class DensePosterior(NamedTuple):
    """Dense Gaussian posterior of the ``"field"`` latent (small grids).

    Attributes
    ----------
    mean : np.ndarray
        float64 ``grid_shape``: posterior mean of the latent reals.
    covariance : np.ndarray
        float64 ``[N, N]`` over the flattened (C-order) latent.
    mean_field : np.ndarray
        float64 ``grid_shape``: posterior mean of :math:`\\delta`.
    mode_variance : np.ndarray
        float64 ``[n0, n1, n2 // 2 + 1]`` in (Mpc/h)^3, as in :class:`WienerPosterior`.
    """

    mean: np.ndarray
    covariance: np.ndarray
    mean_field: np.ndarray
    mode_variance: np.ndarray


class WienerVariance(NamedTuple):
    """Posterior variances of chosen voxels and latent coordinates (float64 ``[num]``)."""

    voxel_variance: np.ndarray
    latent_variance: np.ndarray


def _check_gaussian(model, data) -> np.ndarray:
    if not getattr(model, "is_gaussian_likelihood", False):
        raise ValueError(
            f"the exact posterior needs a Gaussian likelihood (GaussianFieldModel), got "
            f"{type(model).__name__}"
        )
    return model.check_data(data)


def _latent_scales(model) -> tuple[np.ndarray, np.ndarray]:
    """``t`` (delta = Q T x_nc) and ``c`` (x_c = c x_nc), float64 flat ``[N]``.

    Only for the data-free parametrisations: a ``conditional`` latent is measured from
    the data's surrogate posterior, so these scales would silently describe another
    coordinate (write the model non-centred for latent-space references).
    """
    if model.parametrization not in ("noncentred", "centred"):
        raise ValueError(
            f"the Wiener posterior in latent coordinates needs the noncentred or centred "
            f"parametrisation, got {model.parametrization!r} (its latent depends on the data)"
        )
    s_real = model.signal_variance_np().reshape(-1)[model.packing.mode_of_real]
    is_mean = model.packing.mode_of_real == 0
    t = np.where(is_mean, 0.0, np.sqrt(s_real))
    c = np.where(is_mean, 1.0, np.sqrt(s_real))
    if model.parametrization == "noncentred":
        c = np.ones_like(c)
    return t, c


def _mode_variance_from_latent(model, latent_var_nc: np.ndarray) -> np.ndarray:
    """Per-mode variance (power units) from non-centred latent variances ``[N]``.

    Each real coordinate ``j`` feeds its owner bin ``k(j)`` with :math:`|coef|^2 =
    1/\\text{count}`; the tied partner of a pair on a self-paired plane (which owns
    no reals) has the same variance as its representative.
    """
    grid = model.grid
    mode_of_real = model.packing.mode_of_real
    num_modes = int(np.prod(grid.modes_shape))
    count = np.bincount(mode_of_real, minlength=num_modes)
    total = np.bincount(mode_of_real, weights=latent_var_nc, minlength=num_modes)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_bin = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    n0, n1, m = grid.modes_shape
    i0, i1, i2 = np.meshgrid(np.arange(n0), np.arange(n1), np.arange(m), indexing="ij")
    partner = ((-i0) % n0) * n1 * m + ((-i1) % n1) * m + i2
    per_bin = np.where(count > 0, per_bin, per_bin[partner.reshape(-1)])
    s = model.signal_variance_np().reshape(-1)
    return (grid.cell_volume * s * per_bin).reshape(grid.modes_shape)


def _dense_q(model, chunk: int = 512) -> np.ndarray:
    """Dense ``Q`` [N, N]: column ``j`` is ``irfft3d(pack(e_j), norm="ortho")`` flattened."""
    grid = model.grid
    n = grid.num_cells
    cols = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        eye = np.zeros((stop - start, n))
        eye[np.arange(stop - start), np.arange(start, stop)] = 1.0
        modes = model.packing.modes_from_real(tf.constant(eye.reshape(-1, *grid.grid_shape)))
        modes = np.asarray(modes)
        fields = np.fft.irfftn(modes, s=grid.grid_shape, axes=(-3, -2, -1), norm="ortho")
        cols.append(fields.reshape(stop - start, n))
    return np.concatenate(cols, axis=0).T


def dense_posterior(model, data, max_size: int = DENSE_MAX_SIZE) -> DensePosterior:
    """Exact Gaussian posterior of the ``"field"`` latent by dense linear algebra.

    .. math:: \\Sigma_{nc} = (I + T Q^\\top W Q T)^{-1}, \\quad
              \\mu_{nc} = \\Sigma_{nc} T Q^\\top W d, \\quad
              \\mu_c = c \\odot \\mu_{nc}, \\quad \\Sigma_c = c c^\\top \\odot \\Sigma_{nc}

    at the fiducial hyperparameters, via a Cholesky factorisation.

    Parameters
    ----------
    model : GaussianFieldModel
    data : array-like
        ``grid_shape``.
    max_size : int
        Refuse grids with more cells (cost :math:`O(N^3)`, memory :math:`O(N^2)`).

    Returns
    -------
    DensePosterior

    Raises
    ------
    ValueError
        Non-Gaussian likelihood, bad data, or ``N > max_size``.
    """
    data = _check_gaussian(model, data)
    grid = model.grid
    n = grid.num_cells
    if n > max_size:
        raise ValueError(f"dense posterior needs N <= {max_size} cells, got {n}")
    q = _dense_q(model)
    t, c = _latent_scales(model)
    b = q * t[None, :]
    w = model.noise_weights.reshape(-1)
    precision = np.eye(n) + b.T @ (w[:, None] * b)
    chol = scipy.linalg.cho_factor(precision, lower=True)
    mean_nc = scipy.linalg.cho_solve(chol, b.T @ (w * data.reshape(-1)))
    cov_nc = scipy.linalg.cho_solve(chol, np.eye(n))
    cov_nc = 0.5 * (cov_nc + cov_nc.T)
    mean_field = (b @ mean_nc).reshape(grid.grid_shape)
    mode_variance = _mode_variance_from_latent(model, np.diag(cov_nc))
    return DensePosterior(
        mean=(c * mean_nc).reshape(grid.grid_shape),
        covariance=c[:, None] * cov_nc * c[None, :],
        mean_field=mean_field,
        mode_variance=mode_variance,
    )


def wiener_posterior(
    model,
    data,
    tol: float = 1e-10,
    max_iter: int | None = None,
    dense_max_size: int = DENSE_MAX_SIZE,
) -> WienerPosterior:
    """Posterior mean (field, modes, latent) and per-mode variances at the fiducial.

    Exact and Fourier-diagonal for scalar sigma without mask; otherwise the mean
    by preconditioned CG to relative residual ``tol`` and the per-mode variances
    from :func:`dense_posterior` when ``N <= dense_max_size`` (else ``None``; see
    :func:`wiener_variance`).

    Parameters
    ----------
    model : GaussianFieldModel
    data : array-like
        ``grid_shape``.
    tol : float
        CG relative residual of the whitened system.
    max_iter : int, optional
    dense_max_size : int

    Returns
    -------
    WienerPosterior
    """
    data = _check_gaussian(model, data)
    grid = model.grid
    s = model.signal_variance_np()
    if model.is_fourier_diagonal:
        noise_var = float(model.sigma) ** 2
        d_modes = np.fft.rfftn(data, norm="ortho")
        mean_field = np.fft.irfftn(d_modes * s / (s + noise_var), s=grid.grid_shape, norm="ortho")
        mode_variance = grid.cell_volume * s * noise_var / (s + noise_var)
        method, iterations, residual = "diagonal", 0, 0.0
    else:
        d_eff, weights = model._gaussian_approximation(data)
        mean_field, result = wiener_filter_mean(
            grid.grid_shape, s, weights, d_eff, tol=tol, max_iter=max_iter
        )
        method, iterations, residual = "cg", result.num_iterations, result.residual
        mode_variance = None
        if grid.num_cells <= dense_max_size:
            mode_variance = dense_posterior(model, data, max_size=dense_max_size).mode_variance
    mean_modes = grid.cell_volume * np.fft.rfftn(mean_field)
    mean_latent = np.asarray(model.latents_from_field(mean_field), dtype=np.float64)
    return WienerPosterior(
        mean_field=mean_field,
        mean_modes=mean_modes,
        mode_variance=mode_variance,
        mean_latent=mean_latent,
        method=method,
        num_iterations=iterations,
        residual=residual,
    )


def wiener_variance(
    model,
    data,
    voxels: Sequence[Sequence[int]] = (),
    latent_indices: Sequence[Sequence[int]] = (),
    tol: float = 1e-10,
) -> WienerVariance:
    """Posterior variances of chosen voxels of :math:`\\delta` and latent coordinates, by CG.

    One preconditioned CG solve per item in the whitened space
    :math:`\\delta = S^{1/2} y` (:math:`A = I + S^{1/2} W S^{1/2}`):
    :math:`\\mathrm{Var}(a^\\top y) = a^\\top A^{-1} a` with :math:`a = S^{1/2} e_x` for a
    voxel and :math:`a = c_j\\, Q e_j` for latent coordinate ``j``. Works on any
    grid size; no sampling.

    Parameters
    ----------
    model : GaussianFieldModel
    data : array-like
        Validated only (the variances do not depend on the data).
    voxels, latent_indices : sequence of (i0, i1, i2)
        Grid indices.
    tol : float

    Returns
    -------
    WienerVariance
        float64 arrays ``[len(voxels)]`` and ``[len(latent_indices)]``.
    """
    _check_gaussian(model, data)
    grid = model.grid
    system = WienerSystem(grid.grid_shape, model.signal_variance_np(), model.noise_weights)
    _, c = _latent_scales(model)

    def variance(a: np.ndarray) -> float:
        return float(np.vdot(a, system.solve(a, tol=tol).solution))

    vox = []
    for idx in voxels:
        e = np.zeros(grid.grid_shape)
        e[tuple(idx)] = 1.0
        vox.append(variance(system.sqrt_signal(e)))
    lat = []
    for idx in latent_indices:
        e = np.zeros(grid.grid_shape)
        e[tuple(idx)] = 1.0
        j = int(np.ravel_multi_index(tuple(idx), grid.grid_shape))
        modes = np.asarray(model.packing.modes_from_real(tf.constant(e)))
        qe = np.fft.irfftn(modes, s=grid.grid_shape, norm="ortho")
        lat.append(c[j] ** 2 * variance(qe))
    return WienerVariance(np.asarray(vox, np.float64), np.asarray(lat, np.float64))
