"""Gaussian-field prior with Gaussian voxel noise (scalar or per-voxel sigma, optional mask).

.. math::

    d_x \\mid \\delta \\sim \\mathcal N(\\mu_x, \\sigma_x^2) \\quad (m_x = 1),
    \\qquad \\mu = F(\\delta) \\ (\\text{default } \\mu = \\delta),

masked voxels (:math:`m_x = 0`) contribute nothing (their data and sigma are
ignored; synthetic data there are 0). The model is a
:class:`~fieldhmc.models.forward.ForwardFieldModel` with a
:class:`~fieldhmc.models.likelihoods.GaussianLikelihood`. With the identity forward
model and fixed hyperparameters the posterior is Gaussian: see
:func:`fieldhmc.models.wiener_posterior`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from fieldhmc.models.forward import ForwardFieldModel
from fieldhmc.models.grid import Grid
from fieldhmc.models.likelihoods import GaussianLikelihood, check_mask
from fieldhmc.models.power import PowerSpectrum
from fieldhmc.models.priors import NormalPrior

__all__ = ["GaussianFieldModel", "check_mask"]


class GaussianFieldModel(ForwardFieldModel):
    """Gaussian random field observed with Gaussian noise, optionally through a mask.

    Covers the likelihoods "Gaussian noise, scalar sigma or a per-voxel sigma map" and
    "Gaussian noise with a survey mask", optionally after a forward model. See
    :class:`~fieldhmc.models.FieldModel` for the prior, latents and the sampler
    interface and :class:`~fieldhmc.models.ForwardFieldModel` for ``forward``.

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
    forward, forward_params, check_forward
        Forward model (default: the identity); see :class:`ForwardFieldModel`.
    parametrization, hyper_priors, dtype
        See :class:`~fieldhmc.models.FieldModel`.

    Raises
    ------
    ValueError
        Negative, zero (observed), NaN or wrongly-shaped sigma; a bad or all-zero
        mask; a non-positive :math:`P(k)`.
    """

    def __init__(
        self,
        grid: Grid,
        power: PowerSpectrum,
        sigma,
        mask=None,
        *,
        forward: Callable[..., tf.Tensor] | None = None,
        forward_params: Mapping[str, Any] | None = None,
        check_forward: bool | None = None,
        parametrization: str = "noncentred",
        hyper_priors: Mapping[str, NormalPrior | tuple[float, float]] | None = None,
        dtype: tf.DType = tf.float32,
    ):
        likelihood = GaussianLikelihood(grid, sigma, mask)
        super().__init__(
            grid,
            power,
            likelihood,
            forward,
            forward_params,
            check_forward=check_forward,
            parametrization=parametrization,
            hyper_priors=hyper_priors,
            dtype=dtype,
        )
        self.sigma = likelihood.sigma
        self.num_observed = likelihood.num_observed
        self._observed = likelihood.observed
        self._weights = likelihood.weights

    @property
    def is_fourier_diagonal(self) -> bool:
        """True for scalar sigma, no mask and the identity forward model: the posterior is
        diagonal in Fourier space."""
        return self.forward is None and self.likelihood.is_fourier_diagonal

    @property
    def noise_weights(self) -> np.ndarray:
        """Noise precision per voxel :math:`W_x = m_x / \\sigma_x^2`, float64 ``grid_shape``."""
        return self._weights.copy()
