"""Independent NumPy/SciPy implementations of the models' densities (float64).

Shares only the Hermitian packing (``fieldhmc.ops``, tested on its own) with the
library; k-grids come from full-spectrum ``np.fft.fftfreq``, the densities from
``scipy.stats``, the field variance from a sum over the *full* spectrum.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from scipy import stats

from fieldhmc.ops import HermitianPacking


def kmag_half(grid_shape, box_size) -> np.ndarray:
    n0, n1, n2 = grid_shape
    l0, l1, l2 = box_size
    kx = 2 * np.pi * np.fft.fftfreq(n0) * n0 / l0
    ky = 2 * np.pi * np.fft.fftfreq(n1) * n1 / l1
    kz = 2 * np.pi * np.arange(n2 // 2 + 1) / l2
    kx, ky, kz = np.meshgrid(kx, ky, kz, indexing="ij")
    return np.sqrt(kx**2 + ky**2 + kz**2)


def kmag_full(grid_shape, box_size) -> np.ndarray:
    axes = [
        2 * np.pi * np.fft.fftfreq(n) * n / ell for n, ell in zip(grid_shape, box_size, strict=True)
    ]
    kx, ky, kz = np.meshgrid(*axes, indexing="ij")
    return np.sqrt(kx**2 + ky**2 + kz**2)


def power_law(k, log_amplitude, index, k_pivot, turnover=None):
    """A (k/kp)^n [T(k)/T(kp)] with T = (1+(k/kt)^2)^(-g/2) exp(-(k/kc)^2); 0 at k=0."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(divide="ignore"):
        p = np.exp(log_amplitude) * (k / k_pivot) ** index
    if turnover is not None:
        kt, gamma, kc = turnover

        def shape(q):
            out = (1 + (q / kt) ** 2) ** (-gamma / 2)
            return out if kc is None else out * np.exp(-((q / kc) ** 2))

        p = p * shape(k) / shape(k_pivot)
    return np.where(k > 0, p, 0.0)


class ReferenceModel:
    """Mirror of a FieldModel's definition, evaluated with NumPy/SciPy."""

    def __init__(
        self,
        grid_shape,
        box_size,
        power_fn,
        parametrization,
        likelihood,
        hyper_priors=None,
    ):
        self.grid_shape = tuple(grid_shape)
        self.box_size = tuple(box_size)
        self.n = int(np.prod(grid_shape))
        self.volume = float(np.prod(box_size))
        self.power_fn = power_fn  # (k, log_amplitude, index) -> P
        self.parametrization = parametrization
        self.likelihood = likelihood  # dict(kind="gaussian", sigma, mask) or poisson
        self.hyper_priors = hyper_priors or {}
        self.packing = HermitianPacking(self.grid_shape)
        self.k_half = kmag_half(self.grid_shape, self.box_size)
        self.k_full = kmag_full(self.grid_shape, self.box_size)

    def signal_variance(self, log_amplitude, index):
        return self.power_fn(self.k_half, log_amplitude, index) * self.n / self.volume

    def delta(self, field, log_amplitude, index):
        z = self.packing.modes_from_real(tf.constant(field, tf.float64)).numpy()
        if self.parametrization == "noncentred":
            z = z * np.sqrt(self.signal_variance(log_amplitude, index))
        else:
            z = z * (self.k_half > 0)
        return np.fft.irfftn(z, s=self.grid_shape, norm="ortho")

    def log_prob(self, field, data, log_amplitude, index, hypers_sampled=True):
        lp = 0.0
        for name, value in (("log_amplitude", log_amplitude), ("index", index)):
            if name in self.hyper_priors:
                loc, scale = self.hyper_priors[name]
                lp += stats.norm.logpdf(value, loc, scale)
        if self.parametrization == "noncentred":
            lp += stats.norm.logpdf(field).sum()
        else:
            s = self.signal_variance(log_amplitude, index).reshape(-1)
            var = s[self.packing.mode_of_real].reshape(self.grid_shape)
            var = np.where((self.packing.mode_of_real == 0).reshape(self.grid_shape), 1.0, var)
            lp += stats.norm.logpdf(field, 0.0, np.sqrt(var)).sum()
        delta = self.delta(field, log_amplitude, index)
        lik = self.likelihood
        mask = np.ones(self.grid_shape) if lik.get("mask") is None else lik["mask"]
        obs = mask > 0
        if lik["kind"] == "gaussian":
            sigma = np.broadcast_to(lik["sigma"], self.grid_shape)
            lp += stats.norm.logpdf(data[obs], delta[obs], sigma[obs]).sum()
        else:
            p_full = self.power_fn(self.k_full, log_amplitude, index)
            sigma2 = p_full.sum() / self.volume
            rate = lik["mean_density"] * mask * np.exp(delta - 0.5 * sigma2)
            lp += stats.poisson.logpmf(data[obs], rate[obs]).sum()
        return lp
