"""Fixed cosmological parameters, their validation, and the sampled parameters' support.

The sampled parameters are :math:`\\Omega_m` and :math:`\\sigma_8`; :math:`\\Omega_b`,
:math:`h`, :math:`n_s` and :math:`T_\\mathrm{CMB}` are fixed (:class:`FixedCosmology`,
defaults Planck 2018 as in the field-level benchmark [1]_). The physical domain is

.. math::

    \\Omega_b < \\Omega_m \\le 1 \\;(\\Omega_\\Lambda = 1 - \\Omega_m \\ge 0), \\qquad
    \\sigma_8 > 0, \\qquad 0 < a \\le 1.

Python values outside it raise :class:`ValueError` naming the parameter
(:func:`check_cosmology`). TensorFlow values are never rejected inside the model: the
functions of this package first map them into the domain (:func:`clip_to_support`)
so that values and gradients stay finite for any finite input, and the caller masks
with :func:`in_support` (log density :math:`-\\infty` where it is False; the gradient
of the masked branch is finite, so ``tf.where`` does not produce NaN).

References
----------
.. [1] Simon-Onfroy, Lanusse & de Mattia (2025), "Benchmarking field-level
   cosmological inference from galaxy surveys", arXiv:2504.20130 (Planck 2018,
   Table 2 best fit: Omega_b = 0.0490, h = 0.6766, n_s = 0.9665, Omega_m = 0.3111,
   sigma8 = 0.8102).
.. [2] Planck Collaboration (2020), "Planck 2018 results. VI.", arXiv:1807.06209.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow as tf

__all__ = [
    "PLANCK18",
    "FixedCosmology",
    "check_cosmology",
    "clip_to_support",
    "in_support",
]

#: Smallest CDM density kept by :func:`clip_to_support` (:math:`\Omega_m - \Omega_b`).
MIN_OMEGA_CDM = 1e-6
#: Smallest :math:`\sigma_8` and scale factor kept by :func:`clip_to_support`.
MIN_SIGMA8 = 1e-6
MIN_SCALE_FACTOR = 1e-6


def _finite(value, name: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class FixedCosmology:
    """The parameters that are never sampled.

    Parameters
    ----------
    omega_b : float
        Baryon density today, :math:`0 < \\Omega_b < 1`.
    h : float
        :math:`H_0 / (100\\,\\mathrm{km\\,s^{-1}\\,Mpc^{-1}}) > 0`.
    n_s : float
        Primordial spectral index (finite).
    t_cmb : float
        CMB temperature today, K (> 0).
    """

    omega_b: float = 0.0490
    h: float = 0.6766
    n_s: float = 0.9665
    t_cmb: float = 2.7255

    def __post_init__(self):
        if not 0.0 < _finite(self.omega_b, "Omega_b") < 1.0:
            raise ValueError(f"Omega_b must be in (0, 1), got {self.omega_b}")
        if not _finite(self.h, "h") > 0.0:
            raise ValueError(f"h must be positive, got {self.h}")
        _finite(self.n_s, "n_s")
        if not _finite(self.t_cmb, "T_CMB") > 0.0:
            raise ValueError(f"T_CMB must be positive, got {self.t_cmb}")


#: Planck 2018 (TT,TE,EE+lowE+lensing+BAO best fit) fixed parameters, as flbench.
PLANCK18 = FixedCosmology()


def check_cosmology(omega_m=None, sigma8=None, a=None, omega_b: float = PLANCK18.omega_b) -> None:
    """Raise :class:`ValueError` naming the first unphysical Python (or NumPy) value.

    Parameters
    ----------
    omega_m, sigma8, a : float or array-like, optional
        Checked elementwise when given: :math:`\\Omega_b < \\Omega_m \\le 1`,
        :math:`\\sigma_8 > 0`, :math:`0 < a \\le 1`, all finite.
    omega_b : float
        :math:`\\Omega_b` for the lower bound of :math:`\\Omega_m`.
    """
    checks = (
        (
            omega_m,
            "Omega_m",
            lambda x: (x > omega_b) & (x <= 1.0),
            f"in (Omega_b, 1] = ({omega_b}, 1]",
        ),
        (sigma8, "sigma8", lambda x: x > 0.0, "positive"),
        (a, "scale factor a", lambda x: (x > 0.0) & (x <= 1.0), "in (0, 1]"),
    )
    for value, name, is_ok, requirement in checks:
        if value is None:
            continue
        x = np.asarray(value, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{name} must be finite, got {value}")
        if not np.all(is_ok(x)):
            raise ValueError(f"{name} must be {requirement}, got {value}")


def clip_to_support(omega_m, sigma8, a, omega_b: float = PLANCK18.omega_b):
    """Map TensorFlow parameters into the physical domain (values and gradients finite).

    :math:`\\Omega_m \\to \\mathrm{clip}(\\Omega_m, \\Omega_b + 10^{-6}, 1)`,
    :math:`\\sigma_8 \\to \\max(\\sigma_8, 10^{-6})`,
    :math:`a \\to \\mathrm{clip}(a, 10^{-6}, 1)`. Inside the domain (beyond the
    margins) this is the identity with unit derivative; outside, the derivative is 0.
    ``None`` passes through.
    """

    def clip(x, lo, hi):
        if x is None:
            return None
        x = tf.convert_to_tensor(x, tf.float64)
        lo = tf.constant(lo, tf.float64)
        if hi is None:
            return tf.maximum(x, lo)
        return tf.clip_by_value(x, lo, tf.constant(hi, tf.float64))

    return (
        clip(omega_m, omega_b + MIN_OMEGA_CDM, 1.0),
        clip(sigma8, MIN_SIGMA8, None),
        clip(a, MIN_SCALE_FACTOR, 1.0),
    )


def in_support(omega_m=None, sigma8=None, a=None, omega_b: float = PLANCK18.omega_b):
    """Boolean tensor: the parameters are inside the physical domain (broadcast shape).

    Use as ``tf.where(in_support(...), log_prob, -inf)``; NaN inputs are outside.
    """
    ok = tf.constant(True)
    if omega_m is not None:
        om = tf.convert_to_tensor(omega_m, tf.float64)
        ok = ok & (om > tf.constant(omega_b, tf.float64)) & (om <= tf.constant(1.0, tf.float64))
    if sigma8 is not None:
        ok = ok & (tf.convert_to_tensor(sigma8, tf.float64) > tf.constant(0.0, tf.float64))
    if a is not None:
        a = tf.convert_to_tensor(a, tf.float64)
        ok = ok & (a > tf.constant(0.0, tf.float64)) & (a <= tf.constant(1.0, tf.float64))
    return ok
