"""Likelihoods comparing a forward model's prediction with gridded data.

A :class:`Likelihood` knows the data's support, the per-voxel log density of the
data given a prediction :math:`\\mu` on the data grid (``[batch, n0, n1, n2]``,
the output of a forward model; :math:`\\mu = \\delta` without one), and its TFP
distribution for simulating data. Terms are computed in the prediction's dtype and
reduced in float64 (:func:`~fieldhmc.models.reduction.reduce_sum_float64`).

* :class:`GaussianLikelihood` -- :math:`d_x \\sim \\mathcal N(\\mu_x, \\sigma_x^2)` on
  observed voxels (scalar or per-voxel :math:`\\sigma`, binary mask);
* :class:`LognormalPoissonLikelihood` -- counts
  :math:`c_x \\sim \\mathrm{Poisson}(\\bar n\\, m_x\\, e^{\\mu_x - \\sigma^2_\\delta/2})`
  with completeness :math:`m_x \\in [0, 1]`; :math:`\\sigma^2_\\delta` is the prior
  variance of :math:`\\delta(x)` supplied by the model (it depends on sampled
  hyperparameters).

References
----------
1. Coles & Jones (1991), "A lognormal model for the cosmological mass distribution".
2. Kitaura, Jasche & Metcalf (2010), "Recovering the non-linear density field from
   the galaxy distribution with a Poisson-lognormal filter", arXiv:0911.1407.
"""

from __future__ import annotations

import abc
import math

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from scipy.special import gammaln

from fieldhmc.models.grid import Grid
from fieldhmc.models.reduction import reduce_sum_float64

tfd = tfp.distributions

__all__ = ["GaussianLikelihood", "Likelihood", "LognormalPoissonLikelihood", "check_mask"]


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


def _zeros_like_sample(dist: tfd.Distribution) -> tf.Tensor:
    """``safe_sample_fn`` for :class:`tfd.Masked`: masked voxels get data 0."""
    return tf.zeros(dist.batch_shape_tensor(), dist.dtype)


class Likelihood(abc.ABC):
    """The distribution of gridded data given a prediction :math:`\\mu` on the grid.

    Subclass it to add a likelihood; the model calls, in this order,
    :meth:`check_data` (once, NumPy), :meth:`constants` (once, eager) and
    :meth:`log_prob` (inside the compiled sampler).

    Attributes
    ----------
    grid : Grid
    mask : np.ndarray or None
        float64 ``grid_shape``.
    is_gaussian : bool
        True if :meth:`log_prob` is Gaussian in :math:`\\mu` (Wiener filter exact for
        the identity forward model).
    uses_prior_variance : bool
        True if :meth:`log_prob` and :meth:`distribution` need ``sigma2_delta``.
    """

    is_gaussian: bool = False
    uses_prior_variance: bool = False

    def __init__(self, grid: Grid, mask=None, *, binary_mask: bool):
        if not isinstance(grid, Grid):
            raise ValueError(f"grid must be a fieldhmc.models.Grid, got {type(grid).__name__}")
        self.grid = grid
        self.mask = check_mask(mask, grid, binary=binary_mask)

    @abc.abstractmethod
    def check_data(self, data) -> np.ndarray:
        """Validate ``data``; return float64 ``grid_shape``.

        Raises
        ------
        ValueError
            Wrong shape, NaN/Inf, or values outside the support.
        """

    @abc.abstractmethod
    def constants(self, data: np.ndarray, dtype: tf.DType) -> dict[str, tf.Tensor]:
        """Tensors :meth:`log_prob` needs for these (validated) data."""

    @abc.abstractmethod
    def log_prob(self, prediction: tf.Tensor, lc, sigma2_delta=None) -> tf.Tensor:
        """:math:`\\ln p(d \\mid \\mu)`, float64 ``[batch]``, reduced in float64.

        Parameters
        ----------
        prediction : tf.Tensor
            ``[batch, n0, n1, n2]`` in the model dtype.
        lc : dict
            :meth:`constants` of the data.
        sigma2_delta : tf.Tensor, optional
            float64 ``[batch]`` or scalar, the prior variance of :math:`\\delta(x)`
            (given when :attr:`uses_prior_variance`).
        """

    @abc.abstractmethod
    def distribution(self, prediction: tf.Tensor, sigma2_delta=None) -> tfd.Distribution:
        """The TFP distribution of ``"data"`` (event ``grid_shape``)."""

    @property
    @abc.abstractmethod
    def noise_precision_mean(self) -> float:
        """Mean Fisher information per voxel about :math:`\\mu` (at :math:`\\mu = 0`)."""

    @abc.abstractmethod
    def gaussian_approximation(self, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(d_eff, weights)``: :math:`d_{eff} \\approx \\mathcal N(\\mu, W^{-1})` per voxel."""


class GaussianLikelihood(Likelihood):
    """Gaussian voxel noise, scalar or per-voxel :math:`\\sigma`, optional binary mask.

    .. math::

        \\ln p(d \\mid \\mu) = \\sum_{x: m_x = 1}
        \\left[-\\frac{(d_x - \\mu_x)^2}{2\\sigma_x^2} - \\ln\\sigma_x
        - \\tfrac12 \\ln 2\\pi\\right];

    masked voxels contribute nothing (their data and sigma are ignored; synthetic
    data there are 0).

    Parameters
    ----------
    grid : Grid
    sigma : float or array-like
        Noise standard deviation in the units of the prediction: a scalar or
        ``grid_shape``; positive and finite on observed voxels (may be ``inf`` where
        masked).
    mask : array-like, optional
        ``grid_shape`` of 0 (masked) and 1 (observed).

    Raises
    ------
    ValueError
        Negative, zero (observed), NaN or wrongly-shaped sigma; a bad or all-zero mask.
    """

    is_gaussian = True

    def __init__(self, grid: Grid, sigma, mask=None):
        super().__init__(grid, mask, binary_mask=True)
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
        self.num_observed = int(observed.sum())
        if self.mask is None and sigma.ndim == 0:
            # Uniform noise: read-only broadcast views (no float64 grids: 4 fields at 256³),
            # the same values as the general branch.
            shape = grid.grid_shape
            self.observed = np.broadcast_to(np.True_, shape)
            self.sigma_safe = np.broadcast_to(sigma, shape)
            self.weights = np.broadcast_to(1.0 / sigma**2, shape)
        else:
            self.observed = observed
            self.sigma_safe = np.where(observed, sigma, 1.0)
            self.weights = np.where(observed, 1.0 / self.sigma_safe**2, 0.0)
        del observed
        self.log_norm = float(
            -np.log(self.sigma_safe[self.observed]).sum()
            - 0.5 * self.num_observed * math.log(2 * math.pi)
        )

    @property
    def is_fourier_diagonal(self) -> bool:
        """True for scalar sigma and no mask."""
        return self.mask is None and self.sigma.ndim == 0

    @property
    def noise_precision_mean(self) -> float:
        """:math:`\\bar W = \\mathrm{mean}(m / \\sigma^2)`."""
        return float(self.weights.mean())

    def check_data(self, data) -> np.ndarray:
        return self.grid.check_field(data, "data")

    def gaussian_approximation(self, data):
        return np.where(self.observed, data, 0.0), self.weights

    def constants(self, data, dtype):
        # Weights in the model dtype: terms are formed there and summed in float64
        # (blocked, see fieldhmc.models.reduction); a float64 weight grid would make
        # XLA write a float64 copy of the terms before the reduction.
        if self.is_fourier_diagonal:
            weights = tf.constant(float(self.weights.flat[0]), dtype)
        else:
            weights = tf.constant(self.weights, dtype)
        return {
            "data": tf.constant(np.where(self.observed, data, 0.0), dtype),
            "weights": weights,
            "log_norm": tf.constant(self.log_norm, tf.float64),
        }

    def log_prob(self, prediction, lc, sigma2_delta=None):
        residual = lc["data"] - prediction
        terms = tf.cast(lc["weights"], residual.dtype) * tf.square(residual)
        return -0.5 * reduce_sum_float64(terms) + lc["log_norm"]

    def modes_constants(self, data, dtype) -> dict[str, tf.Tensor]:
        """Constants of :meth:`log_prob_modes` (Fourier-diagonal noise only): the data's
        unnormalised ``rfft3d`` and the per-:math:`k_z` weights :math:`h_k \\bar W / N`
        (1-D, length ``n2 // 2 + 1``)."""
        if not self.is_fourier_diagonal:
            raise ValueError("log_prob_modes needs a scalar sigma and no mask")
        real = tf.as_dtype(dtype)
        complex_dtype = tf.complex64 if real == tf.float32 else tf.complex128
        modes = np.fft.rfftn(np.asarray(data, np.float64))
        h = self.grid.hermitian_weights()[0, 0]  # depends on k_z only
        scale = float(self.weights.flat[0]) / self.grid.num_cells
        return {
            "data_modes": tf.constant(modes.astype(complex_dtype.as_numpy_dtype)),
            "modes_weights": tf.constant(h * scale, real),
        }

    def log_prob_modes(self, prediction_modes, lc):
        """:meth:`log_prob` of the prediction given by its unnormalised ``rfft3d``
        ``[..., n0, n1, n2 // 2 + 1]`` (needs :meth:`modes_constants` in ``lc``). For
        white noise Parseval gives the residual's squares from its modes,
        :math:`\\sum_x r_x^2 = N^{-1} \\sum_k h_k |R_k|^2` (Hermitian weights :math:`h_k`),
        so a forward model that ends in Fourier space needs no inverse transform."""
        residual = lc["data_modes"] - prediction_modes
        re, im = tf.math.real(residual), tf.math.imag(residual)
        terms = lc["modes_weights"] * (tf.square(re) + tf.square(im))
        return -0.5 * reduce_sum_float64(terms) + lc["log_norm"]

    def distribution(self, prediction, sigma2_delta=None):
        noise = tfd.Normal(prediction, tf.constant(self.sigma_safe, prediction.dtype))
        if self.mask is not None:
            noise = tfd.Masked(
                noise, validity_mask=tf.constant(self.observed), safe_sample_fn=_zeros_like_sample
            )
        return tfd.Independent(noise, reinterpreted_batch_ndims=3, name="data")


class LognormalPoissonLikelihood(Likelihood):
    """Poisson counts with a lognormal rate of the prediction.

    .. math::

        \\rho_x = \\bar n\\, \\exp\\!\\left(\\mu_x - \\tfrac12 \\sigma^2_\\delta\\right),
        \\qquad c_x \\sim \\mathrm{Poisson}(m_x \\rho_x),

    evaluated, with :math:`\\lambda_x = \\bar n m_x` and every sum in float64, as

    .. math::

        \\sum_{x: m_x > 0} c_x \\mu_x - \\frac{\\sigma^2_\\delta}{2} \\sum_x c_x
        - e^{-\\sigma^2_\\delta/2} \\sum_{x} \\lambda_x e^{\\mu_x}
        + \\sum_{x: m_x > 0} \\left[c_x \\ln\\lambda_x - \\ln c_x!\\right].

    Parameters
    ----------
    grid : Grid
    mean_density : float
        :math:`\\bar n > 0`, mean number of objects per voxel.
    mask : array-like, optional
        Completeness ``grid_shape`` in ``[0, 1]``; 0 = unobserved.
    """

    uses_prior_variance = True

    def __init__(self, grid: Grid, mean_density: float, mask=None):
        super().__init__(grid, mask, binary_mask=False)
        mean_density = float(mean_density)
        if not (math.isfinite(mean_density) and mean_density > 0):
            raise ValueError(f"mean_density must be positive and finite, got {mean_density}")
        self.mean_density = mean_density
        completeness = np.ones(grid.grid_shape) if self.mask is None else self.mask
        self.observed = completeness > 0
        self.expected = mean_density * completeness  # lambda_x = nbar m_x

    @property
    def noise_precision_mean(self) -> float:
        """:math:`\\bar n\\, \\mathrm{mean}(m)`, the Fisher information per voxel at 0."""
        return float(self.expected.mean())

    def check_data(self, data) -> np.ndarray:
        counts = self.grid.check_field(data, "data")
        if np.any(counts < 0) or np.any(counts != np.round(counts)):
            bad = (counts < 0) | (counts != np.round(counts))
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            raise ValueError(
                f"data (Poisson counts) must be non-negative integers; found {counts[i]} at "
                f"voxel {i}"
            )
        return counts

    def gaussian_approximation(self, data):
        lam = np.where(self.observed, self.expected, 1.0)
        d_eff = np.where(self.observed, data / lam - 1.0, 0.0)
        return d_eff, np.where(self.observed, self.expected, 0.0)

    def constants(self, data, dtype):
        counts = np.where(self.observed, data, 0.0)
        lam = np.where(self.observed, self.expected, 1.0)
        const = float(
            np.sum(np.where(self.observed, counts * np.log(lam) - gammaln(counts + 1), 0))
        )
        return {
            "counts": tf.constant(counts, dtype),
            "expected": tf.constant(np.where(self.observed, self.expected, 0.0), dtype),
            "observed": tf.constant(self.observed),
            "total_counts": tf.constant(counts.sum(), tf.float64),
            "const": tf.constant(const, tf.float64),
        }

    def log_prob(self, prediction, lc, sigma2_delta=None):
        # exp of masked voxels is never needed; keep it (and its gradient) finite there.
        safe = tf.where(lc["observed"], prediction, tf.zeros([], prediction.dtype))
        linear = reduce_sum_float64(lc["counts"] * safe)
        rate = reduce_sum_float64(lc["expected"] * tf.exp(safe))
        return (
            linear
            - 0.5 * sigma2_delta * lc["total_counts"]
            - tf.exp(-0.5 * sigma2_delta) * rate
            + lc["const"]
        )

    def distribution(self, prediction, sigma2_delta=None):
        dtype = prediction.dtype
        sigma2 = tf.cast(sigma2_delta, dtype)
        sigma2 = tf.reshape(sigma2, tf.concat([tf.shape(sigma2), [1, 1, 1]], 0))
        log_lam = np.log(np.where(self.observed, self.expected, 1.0))
        log_rate = tf.constant(log_lam, dtype) + prediction - 0.5 * sigma2
        counts = tfd.Poisson(log_rate=log_rate)
        if self.mask is not None:
            counts = tfd.Masked(
                counts, validity_mask=tf.constant(self.observed), safe_sample_fn=_zeros_like_sample
            )
        return tfd.Independent(counts, reinterpreted_batch_ndims=3, name="data")
