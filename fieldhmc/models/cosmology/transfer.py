"""The Eisenstein & Hu (1998) matter transfer function, with and without wiggles.

TensorFlow float64, differentiable in :math:`\\Omega_m` (batched, e.g. ``[chains]``),
with :math:`\\Omega_b, h, T_\\mathrm{CMB}` fixed. ``k`` is in h/Mpc; the formulas
below use :math:`k` in Mpc\\ :sup:`-1` (:math:`k h`) and lengths in Mpc. With
:math:`\\Theta = T_\\mathrm{CMB}/2.7\\,\\mathrm K`, :math:`\\omega_m = \\Omega_m h^2`,
:math:`\\omega_b = \\Omega_b h^2`, :math:`f_b = \\Omega_b/\\Omega_m`,
:math:`f_c = 1 - f_b` (equation numbers of [1]_):

.. math::

    z_{eq} = 2.50\\times10^4\\,\\omega_m\\Theta^{-4}, \\quad
    k_{eq} = 7.46\\times10^{-2}\\,\\omega_m\\Theta^{-2}, \\quad
    z_d = \\frac{1291\\,\\omega_m^{0.251}}{1 + 0.659\\,\\omega_m^{0.828}}
          \\left(1 + b_1\\omega_b^{b_2}\\right) \\quad (2\\text{-}4)

    R(z) = 31.5\\,\\omega_b\\Theta^{-4}(z/10^3)^{-1}, \\quad
    s = \\frac{2}{3k_{eq}}\\sqrt{\\frac{6}{R_{eq}}}
        \\ln\\frac{\\sqrt{1+R_d} + \\sqrt{R_d + R_{eq}}}{1 + \\sqrt{R_{eq}}}, \\quad
    k_\\mathrm{Silk} = 1.6\\,\\omega_b^{0.52}\\omega_m^{0.73}
                     \\left[1 + (10.4\\,\\omega_m)^{-0.95}\\right] \\quad (5\\text{-}7)

    T = f_b T_b + f_c T_c, \\qquad
    T_c = f\\,\\tilde T_0(k, 1, \\beta_c) + (1 - f)\\,\\tilde T_0(k, \\alpha_c, \\beta_c),
    \\quad f = \\frac{1}{1 + (ks/5.4)^4} \\quad (16\\text{-}18)

    \\tilde T_0(k, \\alpha, \\beta) = \\frac{\\ln(e + 1.8\\beta q)}
        {\\ln(e + 1.8\\beta q) + C q^2}, \\quad
    C = \\frac{14.2}{\\alpha} + \\frac{386}{1 + 69.9 q^{1.08}}, \\quad
    q = \\frac{k}{13.41 k_{eq}} \\quad (10, 19, 20)

    T_b = \\left[\\frac{\\tilde T_0(k,1,1)}{1 + (ks/5.2)^2}
          + \\frac{\\alpha_b}{1 + (\\beta_b/ks)^3} e^{-(k/k_\\mathrm{Silk})^{1.4}}\\right]
          j_0(k\\tilde s), \\quad
    \\tilde s = \\frac{s}{[1 + (\\beta_\\mathrm{node}/ks)^3]^{1/3}} \\quad (21, 22)

with :math:`\\alpha_c, \\beta_c` (eqs. 11-12), :math:`\\alpha_b` (eqs. 14-15, with
:math:`G(y)` at :math:`y = (1 + z_{eq})/(1 + z_d)`), :math:`\\beta_\\mathrm{node}`
(eq. 23) and :math:`\\beta_b` (eq. 24) as printed. The no-wiggle form (section 4.2):

.. math::

    T_0 = \\frac{L_0}{L_0 + C_0 q^2}, \\quad L_0 = \\ln(2e + 1.8 q), \\quad
    C_0 = 14.2 + \\frac{731}{1 + 62.5 q}, \\quad
    q = \\frac{k}{h\\,\\mathrm{Mpc}^{-1}}\\frac{\\Theta^2}{\\Gamma_\\mathrm{eff}}
    \\quad (28, 29)

    \\Gamma_\\mathrm{eff} = \\Omega_m h\\left[\\alpha_\\Gamma
        + \\frac{1 - \\alpha_\\Gamma}{1 + (0.43\\,ks)^4}\\right], \\quad
    \\alpha_\\Gamma = 1 - 0.328\\ln(431\\,\\omega_m) f_b + 0.38\\ln(22.3\\,\\omega_m) f_b^2
    \\quad (30, 31)

with the fitted sound horizon :math:`s = 44.5\\ln(9.83/\\omega_m)/\\sqrt{1 + 10\\,\\omega_b^{3/4}}`
Mpc (eq. 26), as the paper prescribes.

**Conventions.** This module follows the paper as printed, as jax-cosmo (hence the
flbench benchmark [2]_) and pmwd do. The authors' own code (``tf_fit.c``), CCL and
CosmoMAD instead read eq. 2 as :math:`1 + z_{eq}` and put :math:`1 + z_d` into
:math:`R_d`; that shifts :math:`T_b` by :math:`\\lesssim 4\\times10^{-4}` (the
tests reproduce CCL's published table with that variant of the NumPy reference).
jax-cosmo's no-wiggle form uses the exact :math:`s` (eq. 6) instead of eq. 26.

**Numerics.** :math:`\\alpha_b/(1 + (\\beta_b/ks)^3)` is evaluated as
:math:`\\alpha_b (ks)^3/((ks)^3 + \\beta_b^3)` and :math:`k\\tilde s` as
:math:`(ks)^2/((ks)^3 + \\beta_\\mathrm{node}^3)^{1/3}`, and :math:`j_0` by its
Taylor series below :math:`10^{-2}`, so values and gradients are accurate down to
:math:`k \\to 0`; :math:`k \\le 0` returns :math:`T = 1` (the limit) with zero
gradient.

References
----------
.. [1] Eisenstein & Hu (1998), "Baryonic features in the matter transfer function",
   ApJ 496, 605, astro-ph/9709112.
.. [2] Simon-Onfroy, Lanusse & de Mattia (2025), arXiv:2504.20130; Campagne et al.
   (2023), "JAX-COSMO", arXiv:2302.05163.
"""

from __future__ import annotations

import math

import tensorflow as tf

from fieldhmc.models.cosmology.parameters import PLANCK18, FixedCosmology

__all__ = ["eisenstein_hu_transfer"]


def _c(x: float) -> tf.Tensor:
    return tf.constant(x, tf.float64)


def _sinc(x: tf.Tensor) -> tf.Tensor:
    """sin(x)/x with a Taylor branch near 0 (accurate value and gradient)."""
    small = x < _c(1e-2)
    safe = tf.where(small, tf.ones_like(x), x)
    x2 = x * x
    series = 1.0 - x2 / 6.0 + x2 * x2 / 120.0
    return tf.where(small, series, tf.sin(safe) / safe)


def _t0_tilde(q: tf.Tensor, alpha, beta) -> tf.Tensor:
    """Eqs. 19-20."""
    log_term = tf.math.log(_c(math.e) + 1.8 * beta * q)
    c = 14.2 / alpha + 386.0 / (1.0 + 69.9 * tf.pow(q, _c(1.08)))
    return log_term / (log_term + c * q * q)


def _with_wiggles(k, omega_m, fixed: FixedCosmology):
    h2 = fixed.h**2
    theta = fixed.t_cmb / 2.7
    w_m = omega_m * h2
    w_b = fixed.omega_b * h2
    f_b = fixed.omega_b / omega_m
    f_c = 1.0 - f_b
    z_eq = 2.50e4 * w_m * theta**-4  # eq 2
    k_eq = 7.46e-2 * w_m * theta**-2  # eq 3, Mpc^-1
    b1 = 0.313 * tf.pow(w_m, _c(-0.419)) * (1.0 + 0.607 * tf.pow(w_m, _c(0.674)))
    b2 = 0.238 * tf.pow(w_m, _c(0.223))
    z_d = (
        1291.0
        * tf.pow(w_m, _c(0.251))
        / (1.0 + 0.659 * tf.pow(w_m, _c(0.828)))
        * (1.0 + b1 * tf.pow(_c(w_b), b2))
    )  # eq 4
    r_coef = 31.5 * w_b * theta**-4 * 1e3
    r_d = r_coef / z_d  # eq 5
    r_eq = r_coef / z_eq
    s = (
        2.0
        / (3.0 * k_eq)
        * tf.sqrt(6.0 / r_eq)
        * tf.math.log((tf.sqrt(1.0 + r_d) + tf.sqrt(r_d + r_eq)) / (1.0 + tf.sqrt(r_eq)))
    )  # eq 6, Mpc
    k_silk = 1.6 * w_b**0.52 * tf.pow(w_m, _c(0.73)) * (1.0 + tf.pow(10.4 * w_m, _c(-0.95)))  # eq 7
    a1 = tf.pow(46.9 * w_m, _c(0.670)) * (1.0 + tf.pow(32.1 * w_m, _c(-0.532)))
    a2 = tf.pow(12.0 * w_m, _c(0.424)) * (1.0 + tf.pow(45.0 * w_m, _c(-0.582)))
    alpha_c = tf.pow(a1, -f_b) * tf.pow(a2, -(f_b**3))  # eq 11
    bb1 = 0.944 / (1.0 + tf.pow(458.0 * w_m, _c(-0.708)))
    bb2 = tf.pow(0.395 * w_m, _c(-0.0266))
    beta_c = 1.0 / (1.0 + bb1 * (tf.pow(f_c, bb2) - 1.0))  # eq 12
    y = (1.0 + z_eq) / (1.0 + z_d)
    x = tf.sqrt(1.0 + y)
    g = y * (-6.0 * x + (2.0 + 3.0 * y) * tf.math.log((x + 1.0) / (x - 1.0)))  # eq 15
    alpha_b = 2.07 * k_eq * s * tf.pow(1.0 + r_d, _c(-0.75)) * g  # eq 14
    beta_node = 8.41 * tf.pow(w_m, _c(0.435))  # eq 23
    beta_b = 0.5 + f_b + (3.0 - 2.0 * f_b) * tf.sqrt((17.2 * w_m) ** 2 + 1.0)  # eq 24

    k_mpc = k * fixed.h
    q = k_mpc / (13.41 * k_eq)  # eq 10
    ks = k_mpc * s
    ks3 = ks**3
    f = 1.0 / (1.0 + (ks / 5.4) ** 4)  # eq 18
    t_c = f * _t0_tilde(q, 1.0, beta_c) + (1.0 - f) * _t0_tilde(q, alpha_c, beta_c)  # eq 17
    ks_tilde = ks * ks / tf.pow(ks3 + beta_node**3, _c(1.0 / 3.0))  # eq 22 times k
    t_b = (
        _t0_tilde(q, 1.0, 1.0) / (1.0 + (ks / 5.2) ** 2)
        + alpha_b * ks3 / (ks3 + beta_b**3) * tf.exp(-tf.pow(k_mpc / k_silk, _c(1.4)))
    ) * _sinc(ks_tilde)  # eq 21
    return f_b * t_b + f_c * t_c  # eq 16


def _no_wiggles(k, omega_m, fixed: FixedCosmology):
    h = fixed.h
    theta = fixed.t_cmb / 2.7
    w_m = omega_m * h**2
    w_b = fixed.omega_b * h**2
    f_b = fixed.omega_b / omega_m
    s = 44.5 * tf.math.log(9.83 / w_m) / math.sqrt(1.0 + 10.0 * w_b**0.75)  # eq 26, Mpc
    alpha_g = (
        1.0 - 0.328 * tf.math.log(431.0 * w_m) * f_b + 0.38 * tf.math.log(22.3 * w_m) * f_b**2
    )  # eq 31
    gamma_eff = omega_m * h * (alpha_g + (1.0 - alpha_g) / (1.0 + (0.43 * k * h * s) ** 4))
    q = k * theta**2 / gamma_eff  # eq 28, k in h/Mpc
    log_term = tf.math.log(_c(2.0 * math.e) + 1.8 * q)
    c0 = 14.2 + 731.0 / (1.0 + 62.5 * q)
    return log_term / (log_term + c0 * q * q)  # eq 29


def eisenstein_hu_transfer(
    k, omega_m, fixed: FixedCosmology = PLANCK18, wiggles: bool = True
) -> tf.Tensor:
    """E&H (1998) matter transfer function :math:`T(k)`, :math:`T \\to 1` as :math:`k \\to 0`.

    Parameters
    ----------
    k : array-like or tf.Tensor
        Wavenumbers ``[...K]``, h/Mpc.
    omega_m : float or tf.Tensor
        :math:`\\Omega_m` of batch shape ``B`` (e.g. ``[chains]``), float64,
        :math:`> \\Omega_b` (not checked here: see
        :func:`~fieldhmc.models.cosmology.clip_to_support`).
    fixed : FixedCosmology
        :math:`\\Omega_b, h, T_\\mathrm{CMB}`.
    wiggles : bool
        Full formula with baryon oscillations (eqs. 16-24), else the no-wiggle form
        (eqs. 26-31).

    Returns
    -------
    tf.Tensor
        float64, shape ``B + K``.
    """
    k = tf.convert_to_tensor(k, tf.float64)
    omega_m = tf.convert_to_tensor(omega_m, tf.float64)
    k_rank = len(k.shape)
    omega_m = tf.reshape(
        omega_m, tf.concat([tf.shape(omega_m), tf.ones([k_rank], tf.int32)], axis=0)
    )
    is_pos = k > 0
    k_safe = tf.where(is_pos, k, tf.ones_like(k))
    t = (_with_wiggles if wiggles else _no_wiggles)(k_safe, omega_m, fixed)
    return tf.where(is_pos, t, tf.ones_like(t))
