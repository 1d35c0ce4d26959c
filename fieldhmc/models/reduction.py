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

__all__ = ["BLOCK", "reduce_sum_float64", "reduce_sum_squares_float64"]

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
        k = _block_size(size, block)
    if k == 1:
        return tf.reduce_sum(tf.cast(terms, tf.float64), axis=axes)
    batch = tf.shape(terms)[: tf.rank(terms) - event_ndims]
    blocks = tf.reshape(terms, tf.concat([batch, [math.prod(event) // k, k]], 0))
    partial = tf.reduce_sum(blocks, axis=-1)
    return tf.reduce_sum(tf.cast(partial, tf.float64), axis=-1)


def reduce_sum_squares_float64(x: tf.Tensor, event_ndims: int = 3, block: int = BLOCK) -> tf.Tensor:
    """Sum the squares of the last ``event_ndims`` axes of ``x`` in float64, exactly per term.

    .. math:: S = \\sum_{b} \\sum_{x \\in b} \\mathrm{float64}(x)^2

    over blocks :math:`b` of ``block`` consecutive values of the last axis. For float32 ``x``
    every square is exact in float64 (at most 48 significant bits): the only error is the
    float64 rounding of the additions, a few :math:`\\epsilon_{64} S` (:math:`10^{-8}`
    at :math:`S \\approx 7 \\times 10^7`, the kinetic energy at 512³), where
    :func:`reduce_sum_float64` of float32 squares would err by
    :math:`\\sim \\sqrt N\\, \\epsilon_{32}` (:math:`10^{-3}`). The blocking only keeps
    XLA:CPU from writing a float64 copy of ``x`` before the reduction (see the module
    docstring); a last axis whose length no block size ``block, block/2, ..., 2``
    divides is summed term by term.

    Parameters
    ----------
    x : tf.Tensor
        Real ``[..., *event]`` of any float dtype; the event shape must be static.
    event_ndims : int
        Number of trailing axes to reduce.
    block : int
        Number of consecutive squares summed before the accumulation over blocks.

    Returns
    -------
    tf.Tensor
        float64 ``[...]``.
    """
    x = tf.convert_to_tensor(x)
    if event_ndims == 0:
        return tf.square(tf.cast(x, tf.float64))
    axes = list(range(-event_ndims, 0))
    last = x.shape[-1]
    k = 1
    if last is not None:
        k = _block_size(last, block)
    if k == 1:
        return tf.reduce_sum(tf.square(tf.cast(x, tf.float64)), axis=axes)
    # Blocks of k consecutive values along the last axis, summed by additions of strided
    # slices: a float64 reduce over a block axis would be merged by XLA with the one
    # over blocks (and read a float64 copy of x), a reshape to blocks makes a copy of x.
    partial = tf.square(tf.cast(x[..., 0::k], tf.float64))
    for j in range(1, k):
        partial = partial + tf.square(tf.cast(x[..., j::k], tf.float64))
    return tf.reduce_sum(partial, axis=axes)


def _block_size(size: int, block: int) -> int:
    """The largest of ``block, block/2, ..., 2`` that divides ``size``; 1 if none does."""
    return next((b for b in _halvings(block) if size % b == 0), 1)


def _halvings(block: int) -> list[int]:
    out = []
    while block > 1:
        out.append(block)
        block //= 2
    return out
