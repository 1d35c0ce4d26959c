"""Float64 reductions of per-voxel log-density terms.

A float32 sum of :math:`N = 256^3 \\approx 1.7 \\times 10^7` terms of order one has
magnitude :math:`\\sim 10^7`, where the float32 spacing is already 1: the
Metropolis-Hastings log accept ratio, a difference of two such sums of order
one, is lost. The models therefore compute each term in the latents' dtype
(float32 is accurate *per term*) and reduce in float64, so the accumulated
error is that of the terms, :math:`\\sim \\sqrt N\\, \\epsilon_{32} |t|`, instead
of the float32 spacing at the total. ``benchmarks/logprob_precision.py``
measures both.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["reduce_sum_float64"]


def reduce_sum_float64(terms: tf.Tensor, event_ndims: int = 3) -> tf.Tensor:
    """Sum the last ``event_ndims`` axes of ``terms`` in float64.

    .. math:: S = \\sum_{x} \\mathrm{float64}(t_x)

    Parameters
    ----------
    terms : tf.Tensor
        Real ``[..., *event]`` of any float dtype.
    event_ndims : int
        Number of trailing axes to reduce.

    Returns
    -------
    tf.Tensor
        float64 ``[...]``.
    """
    terms = tf.cast(terms, tf.float64)
    if event_ndims == 0:
        return terms
    return tf.reduce_sum(terms, axis=list(range(-event_ndims, 0)))
