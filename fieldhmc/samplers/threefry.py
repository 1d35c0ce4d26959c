"""Float32 normal draws: Threefry-2x32 of each element's index, by inversion.

fieldnuts draws a field-sized normal momentum once per transition and mclmc a
partial-refresh normal once per step (every second gradient). Under XLA:CPU
TensorFlow's stateless Philox costs ~11 ns per 32-bit word, more than the rest of the
draw: at [4, 16, 16, 16] TensorFlow's Philox normal took 342 µs and its Threefry normal
209 µs, 3.3 and 2.0 FFT pairs. The same counter-based generator written as uint32
TensorFlow ops fuses with the inversion into elementwise loops: 44 µs
(``benchmarks/normal_draws.py``). Element ``i`` of a draw is word 0 of Threefry-2x32 (20
rounds; Salmon et al. 2011) of the counter ``(i, 0)`` under the key given by the seed,
so no index-sized buffer exists under XLA, and the integer part is bit-identical in
eager mode and under XLA.

XLA fuses the rounds into every reader of the draw (they are cheap integer ops, which
it duplicates rather than materialise): a draw read by k fusions computes them k times.
hmc's momentum (read by its float64 kinetic energy and the first half step) and mams'
velocity (normalised: a norm and a divide) came out slower per gradient with this draw
than with TensorFlow's, so they keep theirs (``benchmarks/README.md``).

References
----------
1. Salmon, Moraes, Dror & Shaw (2011), "Parallel random numbers: as easy as 1, 2, 3",
   SC '11, doi:10.1145/2063384.2063405 (Threefry; the known-answer vectors of its
   Random123 library are the tests' reference).
"""

from __future__ import annotations

import math

import tensorflow as tf

__all__ = ["normal_of_bits", "standard_normal", "threefry2x32"]

# Threefry-2x32's rotation constants and key-schedule parity (Random123's threefry.h).
_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
_PARITY = 0x1BD11BDA


def _u32(v: int) -> tf.Tensor:
    return tf.constant(v, tf.uint32)


def _rotl(x: tf.Tensor, r: int) -> tf.Tensor:
    return tf.bitwise.bitwise_or(
        tf.bitwise.left_shift(x, _u32(r)), tf.bitwise.right_shift(x, _u32(32 - r))
    )


def threefry2x32(key, x0, x1) -> tuple[tf.Tensor, tf.Tensor]:
    """Threefry-2x32 with 20 rounds of the counter ``(x0, x1)`` (uint32 tensors of one
    shape) under ``key`` (uint32 ``[2]``): the two output words."""
    k0, k1 = key[0], key[1]
    ks = (k0, k1, tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(k0, k1), _u32(_PARITY)))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for r in range(20):
        x0 = x0 + x1
        x1 = tf.bitwise.bitwise_xor(_rotl(x1, _ROTATIONS[r % 8]), x0)
        if r % 4 == 3:  # key injection s after every 4 rounds
            s = (r + 1) // 4
            x0 = x0 + ks[s % 3]
            x1 = x1 + ks[(s + 1) % 3] + _u32(s)
    return x0, x1


@tf.autograph.experimental.do_not_convert
def standard_normal(shape, seed) -> tf.Tensor:
    r"""float32 standard-normal draws of ``shape`` by inversion of 24 random bits.

    .. math:: z = \pm\, \Phi^{-1}(p), \qquad p = (2k + 1)\, 2^{-25}, \quad
              k \in \{0, \dots, 2^{23} - 1\},

    with :math:`k` 23 bits and the sign one more bit of the element's Threefry word, so
    :math:`p \in (0, 1/2)` is exact in float32: the draws are the normal quantiles of
    :math:`2^{24}` equally likely levels, exactly symmetric (largest :math:`|z|` = 5.42).
    ``tf.math.ndtri`` is Cephes' in eager mode (relative error below 1e-6) and
    :math:`\sqrt 2\, \mathrm{erf}^{-1}(2p - 1)` under XLA (below 6e-6, both against
    float64; ``tests/samplers/test_threefry.py``).

    Parameters
    ----------
    shape : sequence of int or int Tensor
        At most :math:`2^{32}` elements.
    seed : int Tensor [2]
        Stateless seed (its two words, as uint32, are the key).

    Returns
    -------
    tf.Tensor
        ``shape``, float32.
    """
    static = tf.get_static_value(tf.convert_to_tensor(shape, tf.int32))
    if static is not None and math.prod(static.tolist()) > 2**32:
        raise ValueError(f"standard_normal draws at most 2**32 elements, not {static}")
    shape = static if static is not None else tf.convert_to_tensor(shape, tf.int32)
    key = tf.bitcast(tf.convert_to_tensor(seed, tf.int32), tf.uint32)
    # The element's index as the counter's first word (int64 so that 2**31..2**32 - 1 fit)
    index = tf.cast(tf.range(tf.reduce_prod(tf.cast(shape, tf.int64))), tf.uint32)
    word, _ = threefry2x32(key, index, tf.zeros_like(index))
    return tf.reshape(normal_of_bits(word), shape)


@tf.autograph.experimental.do_not_convert
def normal_of_bits(bits) -> tf.Tensor:
    """The inversion of :func:`standard_normal` (and of hmc's Philox draw,
    ``kernels.standard_normal``): 32 random bits (uint32) to a float32 normal quantile."""
    k = tf.bitcast(tf.bitwise.right_shift(bits, _u32(9)), tf.int32)
    z = tf.math.ndtri(tf.cast(2 * k + 1, tf.float32) * (2.0**-25))  # < 0
    is_negative = tf.bitwise.bitwise_and(bits, _u32(1)) > 0
    return tf.where(is_negative, z, -z)
