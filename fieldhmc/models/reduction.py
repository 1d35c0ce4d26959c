"""Float64 reductions of per-voxel log-density terms.

A float32 sum of :math:`N = 256^3 \\approx 1.7 \\times 10^7` terms of order one has
magnitude :math:`\\sim 10^7`, where the float32 spacing is already 1: the
Metropolis-Hastings log accept ratio, a difference of two such sums of order
one, is lost. The models therefore compute each term in the latents' dtype
(float32 is accurate *per term*) and reduce in float64, so the accumulated
error is that of the terms, :math:`\\sim \\sqrt N\\, \\epsilon_{32} |t|`, instead
of the float32 spacing at the total. ``benchmarks/logprob_precision.py``
measures both.

**Blocked accumulation.** XLA:CPU writes the input of a large reduction to memory
before reducing it (it does not fuse the producer into the reduction), so a cast to
float64 *before* the sum writes and reads a float64 copy of the whole field: at
256³ a 128 MiB buffer per reduction per chain, per gradient (``benchmarks/scaling.py``).
Float32 terms are therefore first summed in float32 over blocks of
:data:`BLOCK` consecutive voxels -- a partial sum of a few terms of order one, whose
rounding is of the order of the terms' own -- and only the :math:`N / \\text{BLOCK}`
partial sums are cast to float64 and accumulated there. The error of the total stays
:math:`O(\\sqrt N\\, \\epsilon_{32} |t|)`, a few times that of an exact float64 sum of
the float32 terms (``benchmarks/logprob_precision.py``: the ``blocked`` row).
"""

from __future__ import annotations

import math

import tensorflow as tf

__all__ = ["BLOCK", "reduce_sum_float64"]

#: Consecutive float32 terms summed in float32 before the float64 accumulation.
BLOCK = 16


def reduce_sum_float64(terms: tf.Tensor, event_ndims: int = 3, block: int = BLOCK) -> tf.Tensor:
    """Sum the last ``event_ndims`` axes of ``terms`` in float64.

    .. math:: S = \\sum_{b} \\mathrm{float64}\\Big(\\sum_{x \\in b} t_x\\Big)

    over blocks :math:`b` of ``block`` consecutive (row-major) terms, the inner sums in
    the terms' dtype. float64 terms, ``block=1``, or an event size that no block size
    ``block, block/2, ..., 2`` divides, are summed in float64 term by term.

    Parameters
    ----------
    terms : tf.Tensor
        Real ``[..., *event]`` of any float dtype; the event shape must be static.
    event_ndims : int
        Number of trailing axes to reduce.
    block : int
        Largest number of terms summed in their own dtype before the cast.

    Returns
    -------
    tf.Tensor
        float64 ``[...]``.
    """
    terms = tf.convert_to_tensor(terms)
    if event_ndims == 0:
        return tf.cast(terms, tf.float64)
    axes = list(range(-event_ndims, 0))
    event = terms.shape[-event_ndims:]
    k = 1
    if terms.dtype != tf.float64 and event.is_fully_defined():
        size = math.prod(event)
        k = next((b for b in _halvings(block) if size % b == 0), 1)
    if k == 1:
        return tf.reduce_sum(tf.cast(terms, tf.float64), axis=axes)
    batch = tf.shape(terms)[: tf.rank(terms) - event_ndims]
    blocks = tf.reshape(terms, tf.concat([batch, [math.prod(event) // k, k]], 0))
    partial = tf.reduce_sum(blocks, axis=-1)
    return tf.reduce_sum(tf.cast(partial, tf.float64), axis=-1)


def _halvings(block: int) -> list[int]:
    out = []
    while block > 1:
        out.append(block)
        block //= 2
    return out
