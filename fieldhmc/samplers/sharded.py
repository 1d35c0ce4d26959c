"""HMC with the state sharded over a DTensor mesh (standalone; not yet the driver).

Each device holds its x-slab of the position, the momentum and the gradient;
the log density and the kinetic energy are global float64 sums. The transition is
plain Metropolis-adjusted HMC (leapfrog, identity metric, fixed step size and
number of steps, one Metropolis test per chain) written with ops DTensor can
shard, compiled once with ``tf.function`` (DTensor programs are not XLA-compiled).

**Sharding-invariant random numbers.** TensorFlow's stateless random ops give a
DTensor sharded along an axis *different* numbers from an unsharded tensor (DTensor
folds the device id into the seed), so a 4-device run could never reproduce a
1-device one. The momenta and Metropolis uniforms are therefore a counter-based
generator of the element's global index: SplitMix64 (Steele, Lea & Flood 2014) of
``key(seed, step) + index``, two 53-bit uniforms per element, Box-Muller. Each
device computes its own slab's numbers from the slab's global indices, so the
draws do not depend on the mesh.

References
----------
1. Neal (2011), "MCMC using Hamiltonian dynamics", arXiv:1206.1901.
2. Steele, Lea & Flood (2014), "Fast splittable pseudorandom number generators",
   OOPSLA 2014, doi:10.1145/2660193.2660195.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from fieldhmc.ops import sharded

__all__ = ["ShardedHMCResult", "index_normal", "run_sharded_hmc"]

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _u64(v: int) -> tf.Tensor:
    return tf.constant(v, tf.uint64)


def _splitmix64(z: tf.Tensor) -> tf.Tensor:
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(30))) * _u64(_M1)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(27))) * _u64(_M2)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(31)))


def _uniform53(h: tf.Tensor) -> tf.Tensor:
    """float64 in [0, 1) from the top 53 bits."""
    return tf.cast(tf.bitwise.right_shift(h, _u64(11)), tf.float64) * (2.0**-53)


def _key(seed: int, step: tf.Tensor, stream: int) -> tf.Tensor:
    base = _splitmix64(_u64((int(seed) * _GOLDEN + stream) % 2**64))
    return _splitmix64(base + tf.cast(step, tf.uint64) * _u64(_GOLDEN))


def index_normal(index: tf.Tensor, key: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Standard normals that are a function of each element's global ``index`` only.

    Parameters
    ----------
    index : tf.Tensor
        uint64 global linear indices (any shape/layout).
    key : tf.Tensor
        uint64 scalar (per seed and step).
    dtype : tf.DType
        Output dtype (computed in float64).
    """
    h1 = _splitmix64(key + index * _u64(2))
    h2 = _splitmix64(key + index * _u64(2) + _u64(1))
    u1 = 1.0 - _uniform53(h1)  # (0, 1]
    u2 = _uniform53(h2)
    z = tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * np.pi * u2)
    return tf.cast(z, dtype)


def _global_index(shape: tuple[int, ...], mesh: dtensor.Mesh | None) -> tf.Tensor:
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


@dataclass
class ShardedHMCResult:
    """What :func:`run_sharded_hmc` returns.

    Attributes
    ----------
    state : tf.Tensor
        Final position ``[chains, *grid]`` (DTensor in slabs, or a plain tensor).
    target_log_prob : np.ndarray
        float64 ``[num_results, chains]``.
    is_accepted : np.ndarray
        bool ``[num_results, chains]``.
    records : list
        ``record_fn(state)`` of every kept draw (e.g. gathered fields).
    """

    state: tf.Tensor
    target_log_prob: np.ndarray
    is_accepted: np.ndarray
    records: list = field(default_factory=list)


def run_sharded_hmc(
    value_and_gradient_fn: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]],
    init_state: tf.Tensor,
    *,
    step_size: float,
    num_leapfrog_steps: int,
    num_results: int,
    num_burnin_steps: int = 0,
    seed: int = 0,
    mesh: dtensor.Mesh | None = None,
    record_fn: Callable[[tf.Tensor], object] | None = None,
) -> ShardedHMCResult:
    """Metropolis-adjusted HMC on a (possibly sharded) field state.

    Parameters
    ----------
    value_and_gradient_fn : callable
        ``x -> (log p float64 [chains], grad like x)``, e.g.
        :meth:`fieldhmc.models.sharded.ShardedGaussianTarget.value_and_gradient`.
    init_state : tf.Tensor
        ``[chains, n0, n1, n2]``: a slab DTensor on ``mesh``, or a plain tensor.
    step_size : float
        Leapfrog step (identity metric).
    num_leapfrog_steps : int
        Leapfrog steps per transition (unrolled in the compiled step).
    num_results, num_burnin_steps : int
        Kept and discarded transitions; step ``t`` (over both) uses key ``(seed, t)``.
    seed : int
        The run's seed.
    mesh : dtensor.Mesh, optional
        The state's mesh (None for plain tensors).
    record_fn : callable, optional
        Called on the state after every kept transition (outside the compiled step).

    Returns
    -------
    ShardedHMCResult
    """
    if num_leapfrog_steps < 1 or num_results < 1 or num_burnin_steps < 0:
        raise ValueError("need num_leapfrog_steps >= 1, num_results >= 1, num_burnin_steps >= 0")
    shape = tuple(int(n) for n in init_state.shape)
    dtype = init_state.dtype
    index = _global_index(shape, mesh)
    chains = shape[0]
    chain_index = tf.constant(np.arange(chains, dtype=np.uint64))
    if mesh is not None:
        chain_index = dtensor.copy_to_mesh(chain_index, dtensor.Layout.replicated(mesh, 1))
    eps = tf.constant(step_size, dtype)
    half = tf.constant(0.5 * step_size, dtype)

    def kinetic(p):
        return 0.5 * tf.reduce_sum(tf.square(tf.cast(p, tf.float64)), axis=[1, 2, 3])

    @tf.function
    def one_step(x, lp, grad, step):
        p = index_normal(index, _key(seed, step, 0), dtype)
        h0 = -lp + kinetic(p)
        xn, pn, gn = x, p + half * grad, grad
        for i in range(num_leapfrog_steps):
            xn = xn + eps * pn
            lpn, gn = value_and_gradient_fn(xn)
            pn = pn + (eps if i < num_leapfrog_steps - 1 else half) * gn
        h1 = -lpn + kinetic(pn)
        log_u = tf.math.log(1.0 - _uniform53(_splitmix64(_key(seed, step, 1) + chain_index)))
        energy_error = h1 - h0
        accept = log_u < -tf.where(tf.math.is_finite(energy_error), energy_error, np.inf)
        mask = tf.reshape(accept, [chains, 1, 1, 1])
        return (
            tf.where(mask, xn, x),
            tf.where(accept, lpn, lp),
            tf.where(mask, gn, grad),
            accept,
        )

    x = init_state
    lp, grad = tf.function(value_and_gradient_fn)(x)
    lps, accepts, records = [], [], []
    for t in range(num_burnin_steps + num_results):
        x, lp, grad, accept = one_step(x, lp, grad, tf.constant(t, tf.int64))
        if t >= num_burnin_steps:
            lps.append(_host(lp))
            accepts.append(_host(accept))
            if record_fn is not None:
                records.append(record_fn(x))
    return ShardedHMCResult(x, np.stack(lps), np.stack(accepts), records)


def _host(t: tf.Tensor) -> np.ndarray:
    if dtensor.is_dtensor(t):
        return sharded.gather(t)
    return t.numpy()
