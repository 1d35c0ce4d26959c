"""Gaussian-field prior with lognormal-Poisson counts (a galaxy-count model).

.. math::

    \\rho_x = \\bar n\\, \\exp\\!\\left(\\delta_x - \\tfrac12 \\sigma^2_\\delta\\right),
    \\qquad c_x \\sim \\mathrm{Poisson}(m_x \\rho_x),

with :math:`\\sigma^2_\\delta = \\frac1V\\sum_{k\\,\\text{full}} P(k)` the prior
variance of :math:`\\delta(x)` (so :math:`E[\\rho] = \\bar n`; it depends on the
hyperparameters when they are sampled) and :math:`m_x \\in [0, 1]` the
completeness. Voxels with :math:`m_x = 0` contribute nothing. The log-likelihood
is evaluated as

.. math::

    \\sum_{x: m_x > 0} c_x \\delta_x - \\frac{\\sigma^2_\\delta}{2} \\sum_x c_x
    - e^{-\\sigma^2_\\delta/2} \\sum_{x} \\lambda_x e^{\\delta_x}
    + \\sum_{x: m_x > 0} \\left[c_x \\ln\\lambda_x - \\ln c_x!\\right],
    \\qquad \\lambda_x = \\bar n m_x,

with every sum in float64. The posterior has no closed form.

References
----------
1. Coles & Jones (1991), "A lognormal model for the cosmological mass distribution".
2. Kitaura, Jasche & Metcalf (2010), "Recovering the non-linear density field from
   the galaxy distribution with a Poisson-lognormal filter", arXiv:0911.1407.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from scipy.special import gammaln

from fieldhmc.models.field_model import FieldModel, _zeros_like_sample
from fieldhmc.models.gaussian import check_mask
from fieldhmc.models.grid import Grid
from fieldhmc.models.power import PowerSpectrum
from fieldhmc.models.priors import NormalPrior
from fieldhmc.models.reduction import reduce_sum_float64

tfd = tfp.distributions

__all__ = ["LognormalPoissonModel"]


class LognormalPoissonModel(FieldModel):
    """Gaussian random field with lognormal-Poisson count data.

    Parameters
    ----------
    grid : Grid
    power : PowerSpectrum
    mean_density : float
        :math:`\\bar n > 0`, the mean number of objects per voxel (a physical number
        density times the cell volume ``V / N``).
    mask : array-like, optional
        Completeness ``grid_shape`` in ``[0, 1]``; 0 = unobserved.
    parametrization, hyper_priors, dtype
        See :class:`FieldModel`.
    """

    is_gaussian_likelihood = False

    def __init__(
        self,
        grid: Grid,
        power: PowerSpectrum,
        mean_density: float,
        mask=None,
        *,
        parametrization: str = "noncentred",
        hyper_priors: Mapping[str, NormalPrior | tuple[float, float]] | None = None,
        dtype: tf.DType = tf.float32,
    ):
        super().__init__(
            grid, power, parametrization=parametrization, hyper_priors=hyper_priors, dtype=dtype
        )
        mean_density = float(mean_density)
        if not (math.isfinite(mean_density) and mean_density > 0):
            raise ValueError(f"mean_density must be positive and finite, got {mean_density}")
        self.mean_density = mean_density
        self.mask = check_mask(mask, grid, binary=False)
        completeness = np.ones(grid.grid_shape) if self.mask is None else self.mask
        self._observed = completeness > 0
        self._expected = mean_density * completeness  # lambda_x = nbar m_x

    @property
    def noise_precision_mean(self) -> float:
        """:math:`\\bar n\\, \\mathrm{mean}(m)`: the Poisson Fisher information per voxel at
        :math:`\\delta = 0`, used as the effective :math:`1/\\sigma^2`."""
        return float(self._expected.mean())

    def _check_data(self, data) -> np.ndarray:
        counts = self.grid.check_field(data, "data")
        if np.any(counts < 0) or np.any(counts != np.round(counts)):
            bad = (counts < 0) | (counts != np.round(counts))
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            raise ValueError(
                f"data (Poisson counts) must be non-negative integers; found {counts[i]} at "
                f"voxel {i}"
            )
        return counts

    def _gaussian_approximation(self, data):
        lam = np.where(self._observed, self._expected, 1.0)
        d_eff = np.where(self._observed, data / lam - 1.0, 0.0)
        return d_eff, np.where(self._observed, self._expected, 0.0)

    def _likelihood_constants(self, data):
        counts = np.where(self._observed, data, 0.0)
        lam = np.where(self._observed, self._expected, 1.0)
        const = float(
            np.sum(np.where(self._observed, counts * np.log(lam) - gammaln(counts + 1), 0))
        )
        return {
            "counts": tf.constant(counts, self.dtype),
            "expected": tf.constant(np.where(self._observed, self._expected, 0.0), self.dtype),
            "observed": tf.constant(self._observed),
            "total_counts": tf.constant(counts.sum(), tf.float64),
            "const": tf.constant(const, tf.float64),
        }

    def _log_likelihood(self, delta, hp, c, lc):
        sigma2 = self._sigma2_delta(hp, c)
        # exp of masked voxels is never needed; keep it (and its gradient) finite there.
        safe_delta = tf.where(lc["observed"], delta, tf.zeros([], delta.dtype))
        linear = reduce_sum_float64(lc["counts"] * safe_delta)
        rate = reduce_sum_float64(lc["expected"] * tf.exp(safe_delta))
        return (
            linear - 0.5 * sigma2 * lc["total_counts"] - tf.exp(-0.5 * sigma2) * rate + lc["const"]
        )

    def _data_distribution(self, delta, hp, c):
        sigma2 = tf.cast(self._sigma2_delta(hp, c), self.dtype)
        sigma2 = tf.reshape(sigma2, tf.concat([tf.shape(sigma2), [1, 1, 1]], 0))
        log_lam = np.log(np.where(self._observed, self._expected, 1.0))
        log_rate = tf.constant(log_lam, self.dtype) + delta - 0.5 * sigma2
        counts = tfd.Poisson(log_rate=log_rate)
        if self.mask is not None:
            counts = tfd.Masked(
                counts, validity_mask=tf.constant(self._observed), safe_sample_fn=_zeros_like_sample
            )
        return tfd.Independent(counts, reinterpreted_batch_ndims=3, name="data")
