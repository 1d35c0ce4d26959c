"""A user's own forward models for the tests (and the example in docs/forward-models.md).

``biased_tracer`` is a good one; the others each break one rule that
:func:`fieldhmc.models.check_forward_fn` must report.
"""

import numpy as np
import tensorflow as tf

from fieldhmc import ops


def biased_tracer(delta, bias=1.5, smoothing_cells=1.0):
    """A linear bias of a Gaussian-smoothed field: b * (W * delta), [chains, n0, n1, n2]."""
    n0, n1, n2 = delta.shape[-3:]
    k0 = 2 * np.pi * np.fft.fftfreq(n0)[:, None, None]
    k1 = 2 * np.pi * np.fft.fftfreq(n1)[None, :, None]
    k2 = 2 * np.pi * np.fft.rfftfreq(n2)[None, None, :]
    kernel = np.exp(-0.5 * smoothing_cells**2 * (k0**2 + k1**2 + k2**2))
    modes = ops.rfft3d(delta)
    modes = modes * tf.cast(tf.constant(kernel, delta.dtype), modes.dtype)
    bias = tf.reshape(tf.cast(bias, delta.dtype), [-1, 1, 1, 1])  # a number, or [chains]
    return bias * ops.irfft3d(modes, fft_length=(n0, n1, n2))


def _kernel(shape, smoothing_cells):
    n0, n1, n2 = shape
    k0 = 2 * np.pi * np.fft.fftfreq(n0)[:, None, None]
    k1 = 2 * np.pi * np.fft.fftfreq(n1)[None, :, None]
    k2 = 2 * np.pi * np.fft.rfftfreq(n2)[None, None, :]
    return np.exp(-0.5 * smoothing_cells**2 * (k0**2 + k1**2 + k2**2))


def biased_tracer_with_modes(delta, bias=1.5, smoothing_cells=1.0):
    """``biased_tracer`` with the optional modes hook ``from_modes`` (below)."""
    return biased_tracer(delta, bias, smoothing_cells)


def _biased_tracer_from_modes(modes, bias=1.5, smoothing_cells=1.0):
    """The same prediction from ``modes = tf.signal.rfft3d(delta)``."""
    n0, n1, m = modes.shape[-3:]
    shape = (n0, n1, 2 * (m - 1))  # even n2 in these tests
    kernel = _kernel(shape, smoothing_cells)
    modes = modes * tf.cast(tf.constant(kernel, modes.dtype.real_dtype), modes.dtype)
    bias = tf.reshape(tf.cast(bias, modes.dtype.real_dtype), [-1, 1, 1, 1])
    return bias * ops.irfft3d(modes, fft_length=shape)


biased_tracer_with_modes.from_modes = _biased_tracer_from_modes


def inconsistent_modes(delta):
    """A ``from_modes`` that does not compute what the function computes."""
    return 2.0 * delta


inconsistent_modes.from_modes = lambda modes: (
    3.0
    * ops.irfft3d(modes, fft_length=(modes.shape[-3], modes.shape[-2], 2 * (modes.shape[-1] - 1)))
)


def needs_two(delta, other):
    """Wrong signature: a second positional argument without a default."""
    return delta + other


def wrong_shape(delta):
    return delta[:, 0]


def wrong_dtype(delta):
    return tf.cast(delta, tf.float64 if delta.dtype == tf.float32 else tf.float32)


def not_differentiable(delta):
    return tf.stop_gradient(delta) * 2.0


def numpy_inside(delta):
    return np.asarray(delta) * 2.0


def rounds(delta):
    return tf.round(delta * 10.0) / 10.0


def raises(delta):
    raise RuntimeError("boom")


NOT_A_FUNCTION = 3.0


def eager_only(delta):
    """Differentiable eagerly, but ``.numpy()`` fails in a compiled graph."""
    return delta * float(delta.numpy().std())


def ignores_its_bias(delta, bias=1.0):
    """Accepts ``bias`` but does not use it: sampling it must be refused."""
    return 2.0 * delta


def records_its_params(delta, bias=1.0, offset=0.0):
    """``bias * delta + offset``; appends the ``(bias, offset)`` it was called with to
    ``CALLS`` (eagerly: what a user's function receives)."""
    CALLS.append((bias, offset))
    if isinstance(bias, tf.Tensor):
        bias = tf.reshape(bias, [-1, 1, 1, 1])
    return bias * delta + offset


CALLS: list = []
