"""Differentiable real FFTs, Hermitian packing and NaN-safe complex helpers.

Importing this package registers gradients for TensorFlow's ``RFFT3D`` and
``IRFFT3D`` op types (TensorFlow leaves them empty); see
:func:`fieldhmc.ops.fft.register_gradients` and ``docs/fft-gradients.md``.
"""

from fieldhmc.ops.complex import safe_abs, safe_angle
from fieldhmc.ops.fft import (
    irfft,
    irfft2d,
    irfft3d,
    irfftn,
    register_gradients,
    rfft,
    rfft2d,
    rfft3d,
    rfftn,
)
from fieldhmc.ops.hermitian import (
    HermitianPacking,
    hermitian_project,
    hermitian_weights,
    modes_from_real,
    real_from_modes,
)

register_gradients()

__all__ = [
    "HermitianPacking",
    "hermitian_project",
    "hermitian_weights",
    "irfft",
    "irfft2d",
    "irfft3d",
    "irfftn",
    "modes_from_real",
    "real_from_modes",
    "register_gradients",
    "rfft",
    "rfft2d",
    "rfft3d",
    "rfftn",
    "safe_abs",
    "safe_angle",
]
