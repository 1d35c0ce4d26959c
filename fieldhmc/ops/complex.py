"""NaN-safe complex helpers: ``abs`` and ``angle`` with finite gradients at 0.

``tf.abs(z)`` has gradient ``z / |z|``, i.e. NaN at ``z = 0``; ``tf.math.angle``
gives ``-inf + nan j`` there. A single ``tf.where`` does not help, because the
gradient of the branch not taken is still multiplied by zero and ``0 * nan = nan``.
The double-``where`` trick feeds the unsafe op a harmless value (``1``) at the
zeros, then selects the chosen result: the gradient at 0 is exactly 0 and
everywhere else bit-identical to TensorFlow's.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["safe_abs", "safe_angle"]


def _guarded(z: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    z = tf.convert_to_tensor(z)
    if not z.dtype.is_complex:
        raise TypeError(f"expected a complex tensor, got {z.dtype}")
    is_zero = tf.equal(z, tf.zeros([], z.dtype))
    return is_zero, tf.where(is_zero, tf.ones([], z.dtype), z)


def safe_abs(z) -> tf.Tensor:
    """``|z|`` for complex ``z``, with gradient 0 (not NaN) where ``z == 0``."""
    is_zero, z_safe = _guarded(z)
    return tf.where(is_zero, tf.zeros([], z.dtype.real_dtype), tf.abs(z_safe))


def safe_angle(z) -> tf.Tensor:
    """``arg z`` in ``(-pi, pi]``, 0 at ``z == 0`` with gradient 0 there."""
    is_zero, z_safe = _guarded(z)
    return tf.where(is_zero, tf.zeros([], z.dtype.real_dtype), tf.math.angle(z_safe))
