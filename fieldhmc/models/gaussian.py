"""Gaussian-field prior with Gaussian voxel noise (scalar or per-voxel sigma, optional mask).

.. math::

    d_x \\mid \\delta \\sim \\mathcal N(\\delta_x, \\sigma_x^2) \\quad (m_x = 1),
    \\qquad \\ln p(d \\mid \\delta) = \\sum_{x: m_x = 1}
    \\left[-\\frac{(d_x - \\delta_x)^2}{2\\sigma_x^2} - \\ln\\sigma_x
    - \\tfrac12 \\ln 2\\pi\\right];

masked voxels (:math:`m_x = 0`) contribute nothing (their data and sigma are
ignored; synthetic data there are 0). With fixed hyperparameters the posterior
is Gaussian: see :func:`fieldhmc.models.wiener_posterior`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from fieldhmc.models.field_model import FieldModel, _zeros_like_sample
from fieldhmc.models.grid import Grid
from fieldhmc.models.power import PowerSpectrum
from fieldhmc.models.priors import NormalPrior
from fieldhmc.models.reduction import reduce_sum_float64

tfd = tfp.distributions

__all__ = ["GaussianFieldModel", "check_mask"]


def check_mask(mask, grid: Grid, *, binary: bool) -> np.ndarray | None:
    """Validate a survey mask (``None`` passes through).

    Parameters
    ----------
    mask : array-like or None
        ``grid_shape`` with values in ``[0, 1]`` (only 0 and 1 if ``binary``).
    grid : Grid
    binary : bool

    Returns
    -------
    np.ndarray or None
        float64 ``grid_shape``.

    Raises
    ------
    ValueError
        Wrong shape, NaN/Inf, values outside ``[0, 1]`` (or not 0/1), all zeros.
    """
    if mask is None:
        return None
    mask = grid.check_field(mask, "mask")
    if binary and not np.all((mask == 0) | (mask == 1)):
        raise ValueError(
            f"mask must contain only 0 and 1 for Gaussian noise, got values in "
            f"[{mask.min():.3g}, {mask.max():.3g}]"
        )
    if np.any(mask < 0) or np.any(mask > 1):
        raise ValueError(f"mask values must be in [0, 1], got [{mask.min():.3g}, {mask.max():.3g}]")
    if not mask.any():
        raise ValueError("mask is all zeros: no voxel is observed")
    return mask


class GaussianFieldModel(FieldModel):
    """Gaussian random field observed with Gaussian noise, optionally through a mask.

    Covers the likelihoods "Gaussian noise, scalar sigma or a per-voxel sigma map" and
    "Gaussian noise with a survey mask". See :class:`FieldModel` for the prior,
    latents and the sampler interface.

    Parameters
    ----------
    grid : Grid
    power : PowerSpectrum
    sigma : float or array-like
        Noise standard deviation (dimensionless, like :math:`\\delta`): a scalar or
        ``grid_shape``. Must be positive and finite on observed voxels; ignored
        (may be ``inf``) where masked.
    mask : array-like, optional
        ``grid_shape`` of 0 (masked) and 1 (observed).
    parametrization, hyper_priors, dtype
        See :class:`FieldModel`.

    Raises
    ------
    ValueError
        Negative, zero (observed), NaN or wrongly-shaped sigma; a bad or all-zero
        mask; a non-positive :math:`P(k)`.
    """

    is_gaussian_likelihood = True

    def __init__(
        self,
        grid: Grid,
        power: PowerSpectrum,
        sigma,
        mask=None,
        *,
        parametrization: str = "noncentred",
        hyper_priors: Mapping[str, NormalPrior | tuple[float, float]] | None = None,
        dtype: tf.DType = tf.float32,
    ):
        super().__init__(
            grid, power, parametrization=parametrization, hyper_priors=hyper_priors, dtype=dtype
        )
        self.mask = check_mask(mask, grid, binary=True)
        sigma = np.asarray(sigma, dtype=np.float64)
        if sigma.ndim != 0 and sigma.shape != grid.grid_shape:
            raise ValueError(
                f"sigma has shape {sigma.shape}, expected a scalar or grid shape {grid.grid_shape}"
            )
        if np.any(np.isnan(sigma)):
            raise ValueError("sigma contains NaN")
        if np.any(sigma < 0):
            raise ValueError(
                f"sigma has negative values (min {sigma.min():.3g}); noise standard deviations "
                "must be positive"
            )
        observed = np.ones(grid.grid_shape, bool) if self.mask is None else self.mask > 0
        sigma_obs = np.broadcast_to(sigma, grid.grid_shape)[observed]
        if np.any(sigma_obs == 0):
            raise ValueError(
                f"sigma is zero at {int((sigma_obs == 0).sum())} observed voxels; noise standard "
                "deviations must be positive"
            )
        if not np.all(np.isfinite(sigma_obs)):
            raise ValueError("sigma must be finite at observed voxels (mask them instead)")
        self.sigma = sigma
        self._observed = observed
        self.num_observed = int(observed.sum())
        self._sigma_safe = np.where(observed, sigma, 1.0)
        self._weights = np.where(observed, 1.0 / self._sigma_safe**2, 0.0)
        self._log_norm = float(
            -np.log(self._sigma_safe[observed]).sum()
            - 0.5 * self.num_observed * math.log(2 * math.pi)
        )

    @property
    def is_fourier_diagonal(self) -> bool:
        """True for scalar sigma and no mask: the posterior is diagonal in Fourier space."""
        return self.mask is None and self.sigma.ndim == 0

    @property
    def noise_weights(self) -> np.ndarray:
        """Noise precision per voxel :math:`W_x = m_x / \\sigma_x^2`, float64 ``grid_shape``."""
        return self._weights.copy()

    @property
    def noise_precision_mean(self) -> float:
        """:math:`\\bar W = \\mathrm{mean}(m / \\sigma^2)`."""
        return float(self._weights.mean())

    def _check_data(self, data) -> np.ndarray:
        return self.grid.check_field(data, "data")

    def _gaussian_approximation(self, data):
        return np.where(self._observed, data, 0.0), self._weights

    def _likelihood_constants(self, data):
        if self.is_fourier_diagonal:
            weights = tf.constant(float(self._weights.reshape(-1)[0]), tf.float64)
        else:
            weights = tf.constant(self._weights, tf.float64)
        return {
            "data": tf.constant(np.where(self._observed, data, 0.0), self.dtype),
            "weights": weights,
            "log_norm": tf.constant(self._log_norm, tf.float64),
        }

    def _log_likelihood(self, delta, hp, c, lc):
        residual = tf.cast(lc["data"] - delta, tf.float64)
        return -0.5 * reduce_sum_float64(lc["weights"] * tf.square(residual)) + lc["log_norm"]

    def _data_distribution(self, delta, hp, c):
        noise = tfd.Normal(delta, tf.constant(self._sigma_safe, self.dtype))
        if self.mask is not None:
            noise = tfd.Masked(
                noise, validity_mask=tf.constant(self._observed), safe_sample_fn=_zeros_like_sample
            )
        return tfd.Independent(noise, reinterpreted_batch_ndims=3, name="data")
