"""The E&H linear P(k) as a field prior: :class:`CosmologicalPower`, a PowerSpectrum.

:class:`~fieldhmc.models.cosmology.EisensteinHuPower` computes
:math:`P(k; \\Omega_m, \\sigma_8)`; this adapter gives it the interface a
:class:`~fieldhmc.models.FieldModel` evaluates its prior through
(:class:`~fieldhmc.models.PowerSpectrum`), so that :math:`\\Omega_m` and :math:`\\sigma_8`
are sampled like ``log_amplitude`` and ``index``: latents ``"Omega_m"`` and
``"sigma8"`` (:data:`~fieldhmc.models.cosmology.COSMOLOGY_PARAMETER_NAMES`), any
:class:`~fieldhmc.models.ScalarPrior` (truncated Normal in the configs), the conditional
parametrisation's :math:`s_k(\\theta)`, ``samples.nc``, the report and the plots.

On a grid the spectrum is evaluated on the distinct values of :math:`|k|` and gathered
back (:meth:`grid_terms_np`: ``power_k_unique`` float64 ``[U]``, ``power_k_inverse`` int32
of the half-spectrum), exactly as :func:`~fieldhmc.models.cosmology.linear_power` does for
a NumPy ``k``, but with both made once, eagerly, by the model (captured by a compiled
caller, not embedded).

The spectrum is that of the linear field **today** (:math:`a = 1`, :math:`\\sigma_8` of
today); a forward model applies the growth to :math:`a_\\mathrm{obs}`
(:class:`~fieldhmc.models.GalaxyClusteringForward`).

Outside the physical domain (:math:`\\Omega_m \\le \\Omega_b` or :math:`> 1`,
:math:`\\sigma_8 \\le 0`) the spectrum is evaluated at the clipped values (finite value and
gradient) and :meth:`in_support` is False: the model's log density is :math:`-\\infty`
there (:class:`~fieldhmc.models.field_model.PinnedTarget`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fieldhmc.models.cosmology.linear_power import (
    COSMOLOGY_PARAMETER_NAMES,
    EisensteinHuPower,
    linear_power,
)
from fieldhmc.models.cosmology.parameters import PLANCK18, FixedCosmology, in_support
from fieldhmc.models.power import PowerSpectrum

__all__ = ["CosmologicalPower"]

_K_PIVOT = 0.1


class CosmologicalPower(PowerSpectrum):
    """Linear :math:`P(k, a=1; \\Omega_m, \\sigma_8)` of Eisenstein & Hu, a field prior.

    Parameters
    ----------
    omega_m, sigma8 : float
        Fiducial (or fixed) :math:`\\Omega_m \\in (\\Omega_b, 1]`, :math:`\\sigma_8 > 0`.
    fixed : FixedCosmology
        :math:`\\Omega_b, h, n_s, T_\\mathrm{CMB}`.
    wiggles : bool
        Baryon oscillations (default) or the no-wiggle transfer function.

    Notes
    -----
    As a :class:`~fieldhmc.models.PowerSpectrum` its fixed form is
    :math:`A (k/k_p)^0\\, T(k)/T(k_p)` with :math:`T = P_\\mathrm{fid}`, :math:`k_p = 0.1`
    h/Mpc, :math:`A = P_\\mathrm{fid}(k_p)`, so the base class's NumPy and TensorFlow
    evaluations give the fiducial spectrum; the sampled parameters are
    :attr:`parameter_names` ``("Omega_m", "sigma8")``.

    Raises
    ------
    ValueError
        Unphysical fiducial values (naming the parameter).
    """

    parameter_names: tuple[str, ...] = COSMOLOGY_PARAMETER_NAMES

    def __init__(
        self,
        omega_m: float = 0.3111,
        sigma8: float = 0.8102,
        fixed: FixedCosmology = PLANCK18,
        wiggles: bool = True,
    ):
        self.eisenstein_hu = EisensteinHuPower(omega_m, sigma8, 1.0, fixed, wiggles)
        self.fixed = fixed
        self.wiggles = bool(wiggles)
        p_pivot = float(self.eisenstein_hu.numpy(np.asarray([_K_PIVOT]))[0])
        super().__init__(p_pivot, 0.0, _K_PIVOT)

    @property
    def omega_m(self) -> float:
        return self.eisenstein_hu.omega_m

    @property
    def sigma8(self) -> float:
        return self.eisenstein_hu.sigma8

    @property
    def fiducial(self) -> dict[str, float]:
        """``{"Omega_m": ..., "sigma8": ...}``."""
        return self.eisenstein_hu.fiducial

    # --- the PowerSpectrum form at the fiducial values ------------------------------------
    def _log_shape_np(self, k):
        return np.log(self.eisenstein_hu.numpy(np.asarray(k, np.float64)))

    def _log_shape_tf(self, k):
        return tf.cast(tf.math.log(self.eisenstein_hu(tf.cast(k, tf.float64))), k.dtype)

    def numpy(self, k) -> np.ndarray:
        """Fiducial :math:`P(k)` (NumPy float64, 0 at ``k = 0``)."""
        return self.eisenstein_hu.numpy(k)

    def __call__(self, k, Omega_m=None, sigma8=None, dtype: tf.DType | None = None):  # noqa: N803
        """:math:`P(k)` in TensorFlow (``B + K``), ``None`` parameters fiducial."""
        p = self.eisenstein_hu(k, _float64(Omega_m), _float64(sigma8))
        return p if dtype is None else tf.cast(p, dtype)

    # --- the grid hooks -------------------------------------------------------------------
    def grid_terms_np(self, kmag: np.ndarray) -> dict[str, np.ndarray]:
        """``power_k_unique`` (float64, the distinct :math:`|k|`) and ``power_k_inverse``
        (int32, ``kmag``'s index into them)."""
        k_unique, inverse = np.unique(np.asarray(kmag, np.float64), return_inverse=True)
        return {
            "power_k_unique": k_unique,
            "power_k_inverse": inverse.reshape(np.shape(kmag)).astype(np.int32),
        }

    def grid_power(self, terms, is_pos, hp) -> tf.Tensor:
        e = self.eisenstein_hu
        omega_m = _float64(hp.get("Omega_m"))
        sigma8 = _float64(hp.get("sigma8"))
        p_unique = linear_power(
            terms["power_k_unique"],
            e.omega_m if omega_m is None else omega_m,
            e.sigma8 if sigma8 is None else sigma8,
            1.0,
            e.fixed,
            e.wiggles,
            e.num_nodes,
            e.num_growth_steps,
        )
        return tf.gather(p_unique, terms["power_k_inverse"], axis=-1)

    def log_power_derivatives_np(self, kmag: np.ndarray) -> dict[str, np.ndarray]:
        """:math:`\\partial\\ln P/\\partial\\Omega_m` by central differences (step
        :math:`10^{-5}`), :math:`\\partial\\ln P/\\partial\\sigma_8 = 2/\\sigma_8`."""
        kmag = np.asarray(kmag, np.float64)
        is_pos = kmag > 0
        k_unique, inverse = np.unique(kmag, return_inverse=True)
        eps = 1e-5
        e = self.eisenstein_hu
        hi = np.asarray(e(k_unique, omega_m=tf.constant(e.omega_m + eps, tf.float64)))
        lo = np.asarray(e(k_unique, omega_m=tf.constant(e.omega_m - eps, tf.float64)))
        ratio = np.where(k_unique > 0, hi / np.where(lo > 0, lo, 1.0), 1.0)
        d_omega = (np.log(ratio) / (2 * eps))[inverse].reshape(kmag.shape)
        return {
            "Omega_m": np.where(is_pos, d_omega, 0.0),
            "sigma8": np.where(is_pos, 2.0 / e.sigma8, 0.0),
        }

    def in_support(self, hp) -> tf.Tensor | None:
        omega_m, sigma8 = _float64(hp.get("Omega_m")), _float64(hp.get("sigma8"))
        if omega_m is None and sigma8 is None:
            return None
        return in_support(omega_m, sigma8, None, self.fixed.omega_b)

    def __repr__(self) -> str:
        return (
            f"CosmologicalPower(omega_m={self.omega_m!r}, sigma8={self.sigma8!r}, "
            f"fixed={self.fixed!r}, wiggles={self.wiggles!r})"
        )


def _float64(value):
    """A tensor (any float dtype) as float64; Python values and ``None`` pass through."""
    if value is None or not tf.is_tensor(value):
        return value
    return tf.cast(value, tf.float64)
