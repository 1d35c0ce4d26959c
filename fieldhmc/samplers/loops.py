"""Helpers for ``tf.while_loop`` bodies under XLA."""

from __future__ import annotations

import tensorflow as tf

__all__ = ["pinned_to"]


def pinned_to(counter, tensors):
    """``tensors`` (a nest of floating tensors), made to depend on a loop's ``counter``.

    XLA's loop-invariant code motion hoists out of a ``tf.while_loop`` whatever its body
    computes from loop-invariant values (what the body reads from its closure), so that
    work runs whether or not the loop takes a trip. For a loop of zero or one trips used
    as a conditional (the driver's field outputs, the microcanonical tuners) it then runs
    on every transition: a field made from the closure's state cost an extra
    ``irfft3d`` per mclmc transition. Inside such a loop, read the closure's tensors
    through this: each plus ``counter * 0.0``, which XLA does not fold (``x * 0`` is NaN
    for an infinite ``x``) and fuses into its first reader. The values are unchanged
    (a ``-0.0`` becomes ``+0.0``). An optimization barrier does not do it: XLA:CPU
    expands barriers before loop-invariant code motion runs.
    """
    zero = tf.cast(counter, tf.float32) * 0.0
    return tf.nest.map_structure(lambda t: t + tf.cast(zero, t.dtype), tensors)
