"""The flat :math:`\\Lambda`CDM background: :math:`E(a)` and :math:`\\Omega_m(a)`.

Matter and a cosmological constant only (radiation is neglected, as in the growth
equations of jax-cosmo and FlowPM; it matters only for :math:`a \\lesssim 10^{-3}`,
where the E&H transfer function already accounts for it):

.. math::

    E(a) = \\frac{H(a)}{H_0} = \\sqrt{\\Omega_m a^{-3} + 1 - \\Omega_m}, \\qquad
    \\Omega_m(a) = \\frac{\\Omega_m a^{-3}}{E^2(a)}
                 = \\frac{\\Omega_m}{\\Omega_m + (1 - \\Omega_m) a^3}, \\qquad
    \\frac{d\\ln E}{d\\ln a} = -\\frac{3}{2}\\Omega_m(a).

Both functions broadcast their TensorFlow float64 arguments (e.g. ``omega_m`` of
shape ``[chains]`` against a scalar ``a``).
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["hubble_rate", "matter_density"]


def hubble_rate(omega_m, a) -> tf.Tensor:
    """:math:`E(a) = H(a)/H_0` for flat :math:`\\Lambda`CDM (float64, broadcast shape)."""
    omega_m = tf.convert_to_tensor(omega_m, tf.float64)
    a = tf.convert_to_tensor(a, tf.float64)
    one = tf.constant(1.0, tf.float64)
    return tf.sqrt(omega_m / a**3 + one - omega_m)


def matter_density(omega_m, a) -> tf.Tensor:
    """:math:`\\Omega_m(a) = \\Omega_m / (\\Omega_m + (1 - \\Omega_m) a^3)` (float64)."""
    omega_m = tf.convert_to_tensor(omega_m, tf.float64)
    a = tf.convert_to_tensor(a, tf.float64)
    one = tf.constant(1.0, tf.float64)
    return omega_m / (omega_m + (one - omega_m) * a**3)
