"""Counter-based random numbers that do not depend on how a field is sharded.

TensorFlow's stateless random ops give a DTensor sharded along an axis *different*
numbers from an unsharded tensor (DTensor folds the device id into the seed), so a
4-device run could never reproduce a 1-device one. The mesh samplers therefore draw
from a counter-based generator of the element's global index: SplitMix64 (Steele,
Lea & Flood 2014) of ``key(seed, stream, step) + index``, two 53-bit uniforms per
element, Box-Muller. Each device computes its own slab's numbers from the slab's
global indices, so the draws do not depend on the mesh, and step ``t`` (over warm-up
and sampling) depends on ``(seed, t)`` only, so a resumed run replays an
uninterrupted one.

References
----------
1. Steele, Lea & Flood (2014), "Fast splittable pseudorandom number generators",
   OOPSLA 2014, doi:10.1145/2660193.2660195.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from fieldhmc.ops import sharded

__all__ = [
    "CounterDraws",
    "base_key",
    "global_index",
    "index_normal",
    "key",
    "scalar_part_indices",
    "seed_int",
    "splitmix64",
    "step_key",
    "uniform53",
]

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB

# Streams: 0 HMC momenta, 1 HMC Metropolis uniforms, the microcanonical kernels', then
# the jittered HMC's number of leapfrog steps.
MOMENTUM, ACCEPT_HMC, REFRESH, NAN_VELOCITY, VELOCITY, LENGTH, ACCEPT, INITIAL, JITTER = range(9)


def _u64(v: int) -> tf.Tensor:
    return tf.constant(v, tf.uint64)


def splitmix64(z: tf.Tensor) -> tf.Tensor:
    """SplitMix64's output function of uint64 ``z``."""
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(30))) * _u64(_M1)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(27))) * _u64(_M2)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(31)))


def uniform53(h: tf.Tensor) -> tf.Tensor:
    """float64 in [0, 1) from the top 53 bits of uint64 ``h``."""
    return tf.cast(tf.bitwise.right_shift(h, _u64(11)), tf.float64) * (2.0**-53)


def base_key(seed: int, stream: int) -> tf.Tensor:
    """uint64 scalar per (seed, stream)."""
    return splitmix64(_u64((int(seed) * _GOLDEN + stream) % 2**64))


def step_key(base: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """uint64 scalar of a stream's ``base`` key at global step ``step`` (int tensor)."""
    return splitmix64(base + tf.cast(step, tf.uint64) * _u64(_GOLDEN))


def key(seed: int, step: tf.Tensor, stream: int) -> tf.Tensor:
    return step_key(base_key(seed, stream), step)


def seed_int(seed) -> int:
    """The int of :func:`fieldhmc.seeds.stateless_seed` (its inverse)."""
    a, b = (int(v) for v in np.asarray(seed).reshape(-1))
    return a | (b << 31)


def index_normal(index: tf.Tensor, key: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Standard normals that are a function of each element's global ``index`` only.

    Parameters
    ----------
    index : tf.Tensor
        uint64 global linear indices (any shape/layout).
    key : tf.Tensor
        uint64 scalar (per seed, stream and step).
    dtype : tf.DType
        Output dtype (computed in float64).
    """
    h1 = splitmix64(key + index * _u64(2))
    h2 = splitmix64(key + index * _u64(2) + _u64(1))
    u1 = 1.0 - uniform53(h1)  # (0, 1]
    u2 = uniform53(h2)
    z = tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * np.pi * u2)
    return tf.cast(z, dtype)


def global_index(shape: tuple[int, ...], mesh: dtensor.Mesh | None) -> tf.Tensor:
    """uint64 C-order index of every element of ``[chains, n0, n1, n2]``, laid out as slabs.

    Built by broadcasting per-axis ranges, so no device holds more than its slab.
    """
    c, n0, n1, n2 = shape
    ranges = [
        np.arange(c, dtype=np.uint64).reshape(c, 1, 1, 1) * np.uint64(n0 * n1 * n2),
        np.arange(n0, dtype=np.uint64).reshape(1, n0, 1, 1) * np.uint64(n1 * n2),
        np.arange(n1, dtype=np.uint64).reshape(1, 1, n1, 1) * np.uint64(n2),
        np.arange(n2, dtype=np.uint64).reshape(1, 1, 1, n2),
    ]
    if mesh is None:
        parts = [tf.constant(r) for r in ranges]
    else:
        rep = dtensor.Layout.replicated(mesh, 4)
        parts = [dtensor.copy_to_mesh(tf.constant(r), rep) for r in ranges]
        parts[1] = dtensor.relayout(parts[1], sharded.slab_layout(mesh))
    return ((parts[0] + parts[1]) + parts[2]) + parts[3]


def scalar_part_indices(shape: tuple[int, ...], num_parts: int, mesh) -> list[tf.Tensor]:
    """uint64 ``[chains]`` global indices of ``num_parts`` state parts ``[chains]`` (sampled
    hyperparameters) next to a field ``shape`` ``[chains, n0, n1, n2]``: past the field's
    indices, ``chains`` per part, replicated on ``mesh``. Their normals are independent
    of the field's and do not depend on the mesh."""
    chains = int(shape[0])
    first = int(np.prod([int(n) for n in shape]))
    out = []
    for j in range(num_parts):
        index = np.arange(first + j * chains, first + (j + 1) * chains, dtype=np.uint64)
        t = tf.constant(index)
        if mesh is not None:
            t = dtensor.copy_to_mesh(t, dtensor.Layout.replicated(mesh, 1))
        out.append(t)
    return out


class CounterDraws:
    """Mesh-invariant draws of one run: SplitMix64 of ``key(seed, stream, step)`` and the
    global index.

    The field-sized methods return the uint64 ``noise`` key a compiled function turns
    into normals with :meth:`normal`; uniforms are computed eagerly (replicated).
    """

    def __init__(
        self, seed: int, shape: tuple[int, ...], dtype: tf.DType, mesh, num_scalar_parts: int = 0
    ):
        self._dtype = dtype
        self._index = global_index(shape, mesh)
        self._scalar_indices = scalar_part_indices(shape, num_scalar_parts, mesh)
        self._chains = np.arange(shape[0], dtype=np.uint64)
        self._bases = self._bases_of(seed)

    @staticmethod
    def _bases_of(seed: int) -> dict:
        streams = (MOMENTUM, ACCEPT_HMC, REFRESH, NAN_VELOCITY, VELOCITY, LENGTH, ACCEPT)
        return {s: base_key(seed, s) for s in streams}

    def with_seed(self, seed: int) -> CounterDraws:
        """The same draws (sharing the global index) for another run seed."""
        other = CounterDraws.__new__(CounterDraws)
        other.__dict__.update(self.__dict__, _bases=self._bases_of(seed))
        return other

    def key(self, stream: int, step: int) -> tf.Tensor:
        """uint64 scalar of ``stream`` at global step ``step``."""
        return step_key(self._bases[stream], tf.constant(step, tf.int64))

    def initial_velocity(self) -> tf.Tensor:
        return step_key(base_key(0, INITIAL), tf.constant(0, tf.int64))

    def refresh(self, step: int) -> tf.Tensor:
        return self.key(REFRESH, step)

    def nan_velocity(self, step: int) -> tf.Tensor:
        return self.key(NAN_VELOCITY, step)

    def velocity(self, step: int) -> tf.Tensor:
        return self.key(VELOCITY, step)

    def length_uniform(self, step: int) -> tf.Tensor:
        """float64 scalar uniform in [0, 1)."""
        return uniform53(splitmix64(self.key(LENGTH, step)))

    def accept_uniform(self, step: int) -> tf.Tensor:
        """float64 ``[chains]`` uniforms in [0, 1)."""
        return uniform53(splitmix64(self.key(ACCEPT, step) + tf.constant(self._chains)))

    def normal(self, noise: tf.Tensor) -> tf.Tensor:
        """Standard normals of the field's shape and layout (inside compiled code)."""
        return index_normal(self._index, noise, self._dtype)

    def normals(self, noise: tf.Tensor) -> list[tf.Tensor]:
        """Standard normals of every part of the state: the scalar parts, then the field."""
        scalars = [index_normal(i, noise, self._dtype) for i in self._scalar_indices]
        return [*scalars, self.normal(noise)]
