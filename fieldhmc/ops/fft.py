"""Differentiable real FFTs of rank 1, 2 and 3 with NumPy's ``norm`` conventions.

TensorFlow 2.21 registers gradients for ``RFFT``/``IRFFT``/``RFFT2D``/``IRFFT2D``
but none for ``RFFT3D``/``IRFFT3D``. This module registers them for TensorFlow's
own op types (see :func:`register_gradients`), which gives reverse mode,
reverse-over-reverse (each gradient calls the other, differentiable, op),
forward mode (``tf.autodiff.ForwardAccumulator``) and XLA, and makes plain
``tf.signal.rfft3d``/``irfft3d`` differentiable in user code too.

With :math:`N = \\prod_i n_i`, Hermitian weights :math:`w` (see
:mod:`fieldhmc.ops.hermitian`) and TensorFlow's convention for the gradient of a
real loss :math:`L` with respect to a complex :math:`z`,
:math:`\\partial L/\\partial \\mathrm{Re}\\, z + i\\, \\partial L/\\partial \\mathrm{Im}\\, z`,
the adjoints of the unnormalised ("backward") transforms are

.. math::

    x = \\mathrm{irfft}(Z) &\\Rightarrow \\bar Z = \\mathrm{rfft}(\\bar x)\\, w / N, \\\\
    X = \\mathrm{rfft}(x) &\\Rightarrow \\bar x = N\\, \\mathrm{irfft}(H(\\bar X) / w),

where :math:`H` projects the self-paired planes onto their Hermitian part
(a no-op for the CPU c2r, required for cuFFT). ``docs/fft-gradients.md`` derives
both.
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf

from fieldhmc.ops.hermitian import hermitian_project, hermitian_weights

__all__ = [
    "irfft",
    "irfft2d",
    "irfft3d",
    "irfftn",
    "register_gradients",
    "rfft",
    "rfft2d",
    "rfft3d",
    "rfftn",
]

_log = logging.getLogger(__name__)

_NORMS = ("backward", "ortho", "forward")
_RFFT = {1: tf.signal.rfft, 2: tf.signal.rfft2d, 3: tf.signal.rfft3d}
_IRFFT = {1: tf.signal.irfft, 2: tf.signal.irfft2d, 3: tf.signal.irfft3d}


def _fit(t: tf.Tensor, target, rank: int) -> tf.Tensor:
    """Crop or zero-pad the last ``rank`` axes of ``t`` (at their ends) to ``target``.

    This is what TF's FFT ops do to an input whose size differs from
    ``fft_length``; it is its own adjoint up to swapping the two shapes.
    """
    target = tf.convert_to_tensor(target, dtype=tf.int32)
    static_target = tf.get_static_value(target)
    static_in = t.shape[-rank:]
    if static_target is not None and static_in.is_fully_defined():
        if tuple(static_in) == tuple(int(n) for n in static_target):
            return t
    shape = tf.shape(t)
    batch_rank = tf.rank(t) - rank
    current = shape[batch_rank:]
    size = tf.concat([shape[:batch_rank], tf.minimum(current, target)], 0)
    t = tf.slice(t, tf.zeros_like(shape), size)
    pad_after = tf.maximum(target - current, 0)
    paddings = tf.stack(
        [tf.zeros_like(shape), tf.concat([tf.zeros_like(shape[:batch_rank]), pad_after], 0)],
        axis=1,
    )
    return tf.pad(t, paddings)


def _rfft_grad(rank: int):
    def grad_fn(op, grad):
        x, fft_length = op.inputs
        n = tf.cast(tf.reduce_prod(fft_length), grad.dtype.real_dtype)
        w = hermitian_weights(fft_length, grad.dtype.real_dtype)
        g = hermitian_project(grad, fft_length, rank) / tf.cast(w, grad.dtype)
        dx = _IRFFT[rank](g, fft_length) * n
        return _fit(dx, tf.shape(x)[-rank:], rank), None

    return grad_fn


def _irfft_grad(rank: int):
    def grad_fn(op, grad):
        z, fft_length = op.inputs
        n = tf.cast(tf.reduce_prod(fft_length), grad.dtype)
        w = hermitian_weights(fft_length, grad.dtype)
        dz = _RFFT[rank](grad, fft_length) * tf.cast(w / n, z.dtype)
        return _fit(dz, tf.shape(z)[-rank:], rank), None

    return grad_fn


def register_gradients() -> dict[str, bool]:
    """Register gradients for TF's ``RFFT3D`` and ``IRFFT3D`` op types (idempotent).

    Called on import of :mod:`fieldhmc.ops`. If TensorFlow (a future release) or
    another library has registered a gradient already, that one is kept and a
    debug message logged; the test suite checks whichever is registered against
    dense Jacobians.

    Returns
    -------
    dict
        ``{op_type: True if registered by this call}``.
    """
    out = {}
    for op_type, fn in (("RFFT3D", _rfft_grad(3)), ("IRFFT3D", _irfft_grad(3))):
        try:
            tf.RegisterGradient(op_type)(fn)
            out[op_type] = True
        except KeyError:  # "Registering two gradient with name ..."
            _log.debug("a gradient for %s is registered already; keeping it", op_type)
            out[op_type] = False
    return out


def _check_norm(norm: str) -> None:
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")


def _resolve_length(t: tf.Tensor, fft_length, rank: int, *, inverse: bool) -> tf.Tensor:
    if t.shape.rank is not None and t.shape.rank < rank:
        raise ValueError(f"input needs at least {rank} axes, got shape {t.shape}")
    if fft_length is None:
        shape = tf.shape(t)[-rank:]
        if inverse:  # NumPy's default: n_last = 2 (m - 1)
            shape = tf.concat([shape[:-1], 2 * (shape[-1:] - 1)], 0)
        return shape
    fft_length = tf.convert_to_tensor(fft_length, dtype=tf.int32)
    if fft_length.shape.rank == 0:
        fft_length = tf.reshape(fft_length, [1])
    if fft_length.shape.rank != 1 or (
        fft_length.shape[0] is not None and fft_length.shape[0] != rank
    ):
        raise ValueError(f"fft_length must have {rank} entries, got {fft_length}")
    static = tf.get_static_value(fft_length)
    if static is not None and np.any(np.asarray(static) < 1):
        raise ValueError(f"fft_length must be positive, got {static}")
    return fft_length


def _scale(norm: str, n: tf.Tensor, dtype: tf.DType, *, inverse: bool) -> tf.Tensor | None:
    """Factor applied to TF's (backward-normalised) result, or None for 1."""
    if norm == "backward":
        return None
    n = tf.cast(n, dtype)
    if norm == "ortho":
        return tf.sqrt(n) if inverse else tf.math.rsqrt(n)
    return n if inverse else 1.0 / n  # "forward"


def rfftn(x, rank: int = 3, fft_length=None, norm: str = "backward") -> tf.Tensor:
    """Real-to-complex FFT over the last ``rank`` axes, differentiable in every mode.

    .. math:: X_k = s \\sum_x f(x)\\, e^{-2\\pi i k\\cdot x/n},\\qquad
              s = 1,\\ N^{-1/2},\\ N^{-1}\\ \\text{for backward, ortho, forward.}

    Parameters
    ----------
    x : tf.Tensor
        Real (float32/float64) ``[..., n0, ..., n_last]``; leading axes are batch.
    rank : int
        1, 2 or 3.
    fft_length : sequence of int or int Tensor, optional
        Real lengths of the transformed axes; the input is cropped or zero-padded
        at the end of each axis to fit (as NumPy's ``s``). Default: input shape.
    norm : {"backward", "ortho", "forward"}
        NumPy's meaning. "ortho" makes the transform unitary on the Hermitian
        subspace, so gradients stay O(1) in N; "backward" makes a
        frequency-domain loss's gradient grow like N (and its curvature like N²).

    Returns
    -------
    tf.Tensor
        Complex64/128 ``[..., n0, ..., n_last // 2 + 1]``.
    """
    _check_norm(norm)
    if rank not in _RFFT:
        raise ValueError(f"rank must be 1, 2 or 3, got {rank}")
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"rfftn needs a real float input, got {x.dtype}")
    fft_length = _resolve_length(x, fft_length, rank, inverse=False)
    # Crop/pad here, differentiably, so the op always sees matching sizes: TF's
    # own rank-1/2 gradients assume it.
    out = _RFFT[rank](_fit(x, fft_length, rank), fft_length)
    s = _scale(norm, tf.reduce_prod(fft_length), out.dtype.real_dtype, inverse=False)
    return out if s is None else out * tf.cast(s, out.dtype)


def irfftn(modes, rank: int = 3, fft_length=None, norm: str = "backward") -> tf.Tensor:
    """Complex-to-real inverse FFT over the last ``rank`` axes (inverse of :func:`rfftn`).

    .. math:: f(x) = \\frac{1}{s N} \\sum_{k \\in \\text{half}} w_k\\,
              \\mathrm{Re}\\left(Z_k e^{2\\pi i k\\cdot x/n}\\right)

    Only the Hermitian part of the self-paired planes is read (on the CPU).

    Parameters
    ----------
    modes : tf.Tensor
        Complex64/128 ``[..., n0, ..., m]``.
    rank : int
        1, 2 or 3.
    fft_length : sequence of int or int Tensor, optional
        Real output lengths. Default ``(n0, ..., 2 (m - 1))`` as NumPy; pass it for
        odd last axes, whose half-spectrum length is the same as for ``n - 1``.
    norm : {"backward", "ortho", "forward"}
        As :func:`rfftn`.

    Returns
    -------
    tf.Tensor
        Real ``[..., *fft_length]``.
    """
    _check_norm(norm)
    if rank not in _IRFFT:
        raise ValueError(f"rank must be 1, 2 or 3, got {rank}")
    modes = tf.convert_to_tensor(modes)
    if not modes.dtype.is_complex:
        raise TypeError(f"irfftn needs a complex input, got {modes.dtype}")
    fft_length = _resolve_length(modes, fft_length, rank, inverse=True)
    half = tf.concat([fft_length[:-1], fft_length[-1:] // 2 + 1], 0)
    out = _IRFFT[rank](_fit(modes, half, rank), fft_length)
    s = _scale(norm, tf.reduce_prod(fft_length), out.dtype, inverse=True)
    return out if s is None else out * s


def rfft(x, fft_length=None, norm: str = "backward") -> tf.Tensor:
    """:func:`rfftn` over the last axis (``fft_length``: one-element sequence or int)."""
    return rfftn(x, 1, fft_length, norm)


def irfft(modes, fft_length=None, norm: str = "backward") -> tf.Tensor:
    """:func:`irfftn` over the last axis."""
    return irfftn(modes, 1, fft_length, norm)


def rfft2d(x, fft_length=None, norm: str = "backward") -> tf.Tensor:
    """:func:`rfftn` over the last two axes."""
    return rfftn(x, 2, fft_length, norm)


def irfft2d(modes, fft_length=None, norm: str = "backward") -> tf.Tensor:
    """:func:`irfftn` over the last two axes."""
    return irfftn(modes, 2, fft_length, norm)


def rfft3d(x, fft_length=None, norm: str = "backward") -> tf.Tensor:
    """:func:`rfftn` over the last three axes."""
    return rfftn(x, 3, fft_length, norm)


def irfft3d(modes, fft_length=None, norm: str = "backward") -> tf.Tensor:
    """:func:`irfftn` over the last three axes."""
    return irfftn(modes, 3, fft_length, norm)
