r"""MCLMC and MAMS with the state sharded over a DTensor mesh (for ``ShardedSampler``).

The algorithms are those of :mod:`fieldhmc.samplers.mclmc` -- the isokinetic
integrators, MCLMC's partial velocity refresh, MAMS's full refresh, randomised
trajectory length and Metropolis test, and both staged tuners -- rearranged for a
state that lives on a mesh:

* each device holds its x-slab of the position, the velocity and the gradient (and,
  during the moment stage of the tuner, of the step-size-weighted mean and second
  moment); every reduction -- the log density, :math:`|g|`, :math:`u \cdot e`, the
  velocity norms, :math:`\Delta K` and the energy error, the total variance -- is a
  global float64 sum (DTensor inserts the all-reduce);
* the transition is not one XLA program (DTensor programs are not XLA-compiled, and
  a DTensor ``tf.while_loop`` over the slab transforms segfaults TF 2.21, see
  :mod:`fieldhmc.samplers.sharded`): one compiled MCLMC transition, or for MAMS one
  compiled integrator step called :math:`N` times from Python;
* the tuners' scalar state (the step-size predictor, dual averaging, the tolerance
  windows, the stage-3 autocorrelation buffer of at most 512 coordinates per chain)
  is kept on the host in float64 and updated by the same rules as
  ``MicrocanonicalLangevin._tune`` / ``MetropolisAdjustedMicrocanonical._tune``
  (the recorded coordinates are picked on the mesh by a segment sum);
* random numbers come from a :class:`CounterDraws` (SplitMix64 of each element's
  global index, as the sharded HMC's momenta), so a run does not depend on the mesh
  and step ``t`` only on ``(seed, t)``. :class:`PhiloxDraws` draws instead exactly
  what the unsharded kernels draw (plain tensors only): with it the same code
  reproduces ``fieldhmc.samplers.mclmc`` run by the unsharded driver, tuning
  included (float64, to rounding), which is how the port is tested.

References
----------
.. [1] J. Robnik, G. B. De Luca, E. Silverstein and U. Seljak, "Microcanonical
   Hamiltonian Monte Carlo", JMLR 24 (2023), arXiv:2212.08549.
.. [2] J. Robnik, R. Cohn-Gordon and U. Seljak, "Metropolis adjusted microcanonical
   Hamiltonian Monte Carlo", arXiv:2503.01707 (2025).
.. [3] BlackJAX, ``adaptation/mclmc_adaptation.py`` and
   ``adaptation/adjusted_mclmc_adaptation.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from tensorflow.experimental import dtensor

from fieldhmc.samplers import mclmc as mc
from fieldhmc.samplers.sharded import (
    _base_key,
    _global_index,
    _host,
    _replicate,
    _seed_int,
    _splitmix64,
    _step_key,
    _uniform53,
    index_normal,
)

__all__ = [
    "TUNING_NAMES",
    "CounterDraws",
    "PhiloxDraws",
    "ShardedMicrocanonical",
    "ShardedMicrocanonicalResults",
    "autocorrelation_time",
    "num_integration_steps",
]

# Counter streams (the sharded HMC uses 0 and 1).
_REFRESH, _NAN_VELOCITY, _VELOCITY, _LENGTH, _ACCEPT, _INITIAL = 2, 3, 4, 5, 6, 7
# Host tuning scalars, in this order (names of mclmc.MicrocanonicalTuning).
TUNING_NAMES = (
    "time",
    "x_average",
    "step_size_max",
    "log_step_size",
    "log_step_size_avg",
    "da_step",
    "avg_error",
    "mu",
    "weight",
)


class ShardedMicrocanonicalResults(NamedTuple):
    """What the sharded chunk carries between chunks (and the checkpoint stores).

    Attributes
    ----------
    target_log_prob : tf.Tensor
        float64 ``[chains]`` at the current state.
    grads_target_log_prob : tf.Tensor
        Its gradient, ``[chains, *grid]`` in slabs.
    velocity : tf.Tensor
        MCLMC's unit velocity (jointly per chain), in slabs; a scalar for MAMS (which
        draws a fresh one every transition).
    step_size, trajectory_length : tf.Tensor
        float64 scalars :math:`\\epsilon`, :math:`L` (BlackJAX units) of the next
        transition.
    tuning : tf.Tensor
        float64 ``[9]``, the tuner's scalars (:data:`TUNING_NAMES`).
    mean, m2 : tf.Tensor
        Step-size-weighted per-chain moments ``[chains, *grid]`` (state dtype, slabs)
        while the moment stage can still use them, scalars afterwards.
    buffer : tf.Tensor
        float64 ``[n3, chains * K]`` recorded coordinates of stage 3 (a scalar after it).
    """

    target_log_prob: tf.Tensor
    grads_target_log_prob: tf.Tensor
    velocity: tf.Tensor
    step_size: tf.Tensor
    trajectory_length: tf.Tensor
    tuning: tf.Tensor
    mean: tf.Tensor
    m2: tf.Tensor
    buffer: tf.Tensor


# --- random numbers ---------------------------------------------------------------------------
class CounterDraws:
    """Mesh-invariant draws: SplitMix64 of ``key(seed, stream, step)`` and the global index.

    Host methods return the ``noise`` tensor a compiled function turns into normals
    with :meth:`normal`; uniforms are computed on the host.
    """

    def __init__(self, seed: int, shape: tuple[int, ...], dtype: tf.DType, mesh):
        self._dtype = dtype
        self._index = _global_index(shape, mesh)
        self._chains = np.arange(shape[0], dtype=np.uint64)
        self._bases = self._bases_of(seed)

    @staticmethod
    def _bases_of(seed: int) -> dict:
        streams = (_REFRESH, _NAN_VELOCITY, _VELOCITY, _LENGTH, _ACCEPT)
        return {s: _base_key(seed, s) for s in streams}

    def with_seed(self, seed: int) -> CounterDraws:
        """The same draws (sharing the global index) for another run seed."""
        other = CounterDraws.__new__(CounterDraws)
        other.__dict__.update(self.__dict__, _bases=self._bases_of(seed))
        return other

    def _key(self, stream: int, step: int) -> tf.Tensor:
        return _step_key(self._bases[stream], tf.constant(step, tf.int64))

    def initial_velocity(self) -> tf.Tensor:
        return _step_key(_base_key(0, _INITIAL), tf.constant(0, tf.int64))

    def refresh(self, step: int) -> tf.Tensor:
        return self._key(_REFRESH, step)

    def nan_velocity(self, step: int) -> tf.Tensor:
        return self._key(_NAN_VELOCITY, step)

    def velocity(self, step: int) -> tf.Tensor:
        return self._key(_VELOCITY, step)

    def length_uniform(self, step: int) -> float:
        return float(_uniform53(_splitmix64(self._key(_LENGTH, step))).numpy())

    def accept_uniform(self, step: int) -> np.ndarray:
        key = self._key(_ACCEPT, step)
        return _uniform53(_splitmix64(key + tf.constant(self._chains))).numpy()

    def normal(self, noise: tf.Tensor) -> tf.Tensor:
        """Standard normals of the state's shape and layout (inside compiled code)."""
        return index_normal(self._index, noise, self._dtype)


class PhiloxDraws:
    """The unsharded kernels' own draws (plain tensors only): the driver's
    ``stateless_fold_in(seed, step)`` split as ``MicrocanonicalLangevin.one_step`` and
    ``MetropolisAdjustedMicrocanonical.one_step`` split it.

    The draws are made by XLA-compiled functions, as in the unsharded driver's chunk:
    XLA's Philox normals and uniforms are not TensorFlow's for the same seed. The
    ``noise`` of a normal is therefore the normal field itself.
    """

    def __init__(self, seed: tf.Tensor, shape: tuple[int, ...], dtype: tf.DType):
        self._seed = tf.convert_to_tensor(seed)
        self._shape = shape
        self._dtype = dtype
        self._normal = tf.function(
            lambda s: tf.random.stateless_normal(shape, seed=s, dtype=dtype, alg="philox"),
            jit_compile=True,
            autograph=False,
        )
        self._uniform = tf.function(
            lambda s, n: tf.random.stateless_uniform(n, seed=s, dtype=dtype, alg="philox"),
            jit_compile=True,
            autograph=False,
        )

        def seeds(seed, step):
            step_seed = tfp.random.sanitize_seed(
                tf.random.experimental.stateless_fold_in(seed, step)
            )
            refresh_seed, nan_seed = tfp.random.split_seed(step_seed)
            velocity_seed, length_seed, accept_seed = tfp.random.split_seed(step_seed, n=3)
            return {
                "refresh": tfp.random.split_seed(refresh_seed, n=1)[0],
                "nan": tfp.random.split_seed(nan_seed, n=1)[0],
                "velocity": tfp.random.split_seed(velocity_seed, n=1)[0],
                "length": length_seed,
                "accept": accept_seed,
            }

        self._seeds = tf.function(seeds, jit_compile=True, autograph=False)
        self._first = tf.function(
            lambda: tfp.random.split_seed(tf.constant([0, 0], tf.int32), n=1)[0],
            jit_compile=True,
            autograph=False,
        )

    def with_seed(self, seed) -> PhiloxDraws:
        """The same compiled draws for another run seed (int32 ``[2]``)."""
        other = PhiloxDraws.__new__(PhiloxDraws)
        other.__dict__.update(self.__dict__, _seed=tf.convert_to_tensor(seed))
        return other

    def _of(self, step: int, name: str) -> tf.Tensor:
        return self._seeds(self._seed, tf.constant(step, tf.int32))[name]

    def initial_velocity(self) -> tf.Tensor:
        return self._normal(self._first())

    def refresh(self, step: int) -> tf.Tensor:
        return self._normal(self._of(step, "refresh"))

    def nan_velocity(self, step: int) -> tf.Tensor:
        return self._normal(self._of(step, "nan"))

    def velocity(self, step: int) -> tf.Tensor:
        return self._normal(self._of(step, "velocity"))

    def length_uniform(self, step: int) -> float:
        return float(self._uniform(self._of(step, "length"), []).numpy())

    def accept_uniform(self, step: int) -> np.ndarray:
        u = self._uniform(self._of(step, "accept"), [self._shape[0]])
        return u.numpy().astype(np.float64)

    def normal(self, noise: tf.Tensor) -> tf.Tensor:
        return noise


# --- host-side pieces of the tuners -------------------------------------------------------
def autocorrelation_time(buffer: np.ndarray, reduce: Callable = np.mean) -> float:
    """NumPy float64 port of ``mclmc._autocorrelation_time`` (``buffer [n, chains, K]``).

    Autocovariances by FFT per chain, combined over chains as Stan's rank-free ESS,
    summed over Geyer's initial positive sequence of pairs; ``reduce`` over the K
    coordinates (``np.mean`` for MCLMC, ``np.max`` for MAMS).
    """
    x = np.transpose(np.asarray(buffer, np.float64), (1, 2, 0))  # chains, K, n
    chains, n = x.shape[0], x.shape[-1]
    xc = x - x.mean(axis=-1, keepdims=True)
    size = 2 ** int(math.ceil(math.log2(2 * n)))
    f = np.fft.rfft(xc, n=size)
    acov = np.fft.irfft(f * np.conj(f), n=size)[..., :n] / n
    mean_acov = acov.mean(axis=0)  # K, n
    w = mean_acov[..., 0] * n / max(n - 1, 1)
    if chains > 1:
        b_over_n = np.var(x.mean(axis=-1), axis=0) * chains / (chains - 1)
    else:
        b_over_n = np.zeros_like(w)
    var_plus = w * (n - 1) / n + b_over_n
    var_plus = np.where(var_plus > 0, var_plus, 1.0)
    rho = 1.0 - (w[:, None] - mean_acov) / var_plus[:, None]
    m = n // 2
    pairs = rho[:, 0 : 2 * m : 2] + rho[:, 1 : 2 * m : 2]
    keep = np.cumprod(pairs > 0, axis=-1)
    tau = -1.0 + 2.0 * np.sum(pairs * keep, axis=-1)
    return float(reduce(np.maximum(tau, 1.0 / n)))


def num_integration_steps(mean_steps: float, uniform: float) -> int:
    """``mclmc._num_integration_steps`` on the host: :math:`N = \\lceil U s \\rceil`."""
    mu = max(mean_steps, 1.0)
    k = math.floor(2.0 * mu - 1.0)
    s = k + k * (mu - 0.5 * (k + 1.0)) / (k + 1.0 - mu)
    return max(int(math.ceil(uniform * s)), 1)


@dataclass
class _Chain:
    """A chunk's working state: device tensors and host float64 tuning."""

    x: tf.Tensor
    lp: tf.Tensor
    grad: tf.Tensor
    velocity: tf.Tensor | None
    eps: float
    length: float
    tuning: dict
    mean: tf.Tensor | None
    m2: tf.Tensor | None
    buffer: np.ndarray | None
    draws: object


# --- device pieces ------------------------------------------------------------------------
def _dot64(a, b):
    """Global float64 ``sum(a * b)`` per chain (``[chains]``)."""
    return tf.reduce_sum(tf.cast(a, tf.float64) * tf.cast(b, tf.float64), axis=[1, 2, 3])


def _bcast(c, like):
    return tf.reshape(tf.cast(c, like.dtype), [-1, 1, 1, 1])


def _normalize(v):
    return v / _bcast(tf.sqrt(_dot64(v, v)), v)


def _velocity_update(u, g, tau, dim: int):
    """``mclmc.velocity_update`` with float64 reductions (``tau`` float64 scalar)."""
    g_norm = tf.sqrt(_dot64(g, g))
    safe = tf.where(g_norm > 0, g_norm, tf.ones_like(g_norm))
    e = g / _bcast(safe, g)
    c = _dot64(u, e)
    delta = tau * g_norm / float(dim - 1)
    zeta = tf.exp(-delta)
    a = (1.0 - zeta) * (1.0 + zeta + c * (1.0 - zeta))
    raw = _bcast(a, e) * e + _bcast(2.0 * zeta, u) * u
    dk = (delta - math.log(2.0) + tf.math.log(1.0 + c + (1.0 - c) * zeta**2)) * (dim - 1)
    return _normalize(raw), dk


class ShardedMicrocanonical:
    """The sharded MCLMC / MAMS transition with its staged tuner.

    Parameters
    ----------
    kind : {"mclmc", "mams"}
    value_and_gradient_fn : callable
        ``x -> (log p float64 [chains], grad like x)``.
    shape : tuple of int
        ``(chains, n0, n1, n2)``.
    dtype : tf.DType
        State dtype.
    mesh : dtensor.Mesh or None
    step_size, trajectory_length : float
        Initial :math:`\\epsilon / \\sqrt d` and :math:`L / \\sqrt d` (the units of
        :func:`fieldhmc.samplers.build_kernel`).
    num_adaptation_steps : int
        Tuning transitions (``mclmc.MCLMC_STAGES`` / ``MAMS_STAGES``).
    integrator : {"minimal_norm", "leapfrog"}
    desired_energy_var, target_accept_prob : float
        MCLMC's bias tolerance; MAMS's dual-averaging target.
    random : {"counter", "philox"}
        :class:`CounterDraws` (mesh-invariant) or :class:`PhiloxDraws` (the unsharded
        kernels' draws; ``mesh`` must be None).
    """

    def __init__(
        self,
        kind: str,
        value_and_gradient_fn: Callable,
        shape: tuple[int, ...],
        dtype: tf.DType,
        mesh: dtensor.Mesh | None,
        *,
        step_size: float,
        trajectory_length: float,
        num_adaptation_steps: int,
        integrator: str = "minimal_norm",
        desired_energy_var: float = 5e-4,
        target_accept_prob: float = 0.9,
        random: str = "counter",
    ):
        if kind not in ("mclmc", "mams"):
            raise ValueError(f"kind must be mclmc or mams, got {kind!r}")
        if integrator not in mc.INTEGRATORS:
            raise ValueError(
                f"integrator must be one of {tuple(mc.INTEGRATORS)}, got {integrator!r}"
            )
        if random not in ("counter", "philox"):
            raise ValueError(f"random must be 'counter' or 'philox', got {random!r}")
        if random == "philox" and mesh is not None:
            raise ValueError("random='philox' (the unsharded kernels' draws) needs mesh=None")
        self.kind = kind
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtype
        self.mesh = mesh
        self.random = random
        self.dim = math.prod(self.shape[1:])
        root_d = math.sqrt(self.dim)
        self.initial_step_size = step_size * root_d
        self.initial_trajectory_length = trajectory_length * root_d
        self.num_adaptation_steps = int(num_adaptation_steps)
        self.integrator = integrator
        self.gradients_per_step = len(mc.INTEGRATORS[integrator][1])
        self.desired_energy_var = float(desired_energy_var)
        self.target_accept_prob = float(target_accept_prob)
        stages = mc.MCLMC_STAGES if kind == "mclmc" else mc.MAMS_STAGES
        self.stage_ends = mc._stage_bounds(self.num_adaptation_steps, stages)
        self.buffer_steps = max(self.stage_ends[2] - self.stage_ends[1], 1)
        k = min(self.dim, mc._ESS_COORDINATES)
        stride = max(1, self.dim // k)
        self.num_recorded = len(range(0, self.dim, stride)[:k])
        self._vg = value_and_gradient_fn
        self._draws_template = (
            PhiloxDraws(np.zeros(2, np.int32), self.shape, dtype)
            if random == "philox"
            else CounterDraws(0, self.shape, dtype, mesh)
        )
        self._subset_ids = self._make_subset_ids(stride)
        self._compile()

    # -- compiled pieces ---------------------------------------------------------------------
    def _make_subset_ids(self, stride: int):
        """Segment ids picking the coordinates ``mclmc._subset`` records: flat index
        ``j * stride`` -> ``j`` (``j < K``), every other cell -> ``K``. Computed on the
        mesh from broadcast index ranges (no field-sized host array)."""
        n0, n1, n2 = self.shape[1:]
        k = self.num_recorded

        @tf.function(autograph=False)
        def ids(index):
            flat = tf.squeeze(tf.cast(index, tf.int64), axis=0)
            q = flat // stride
            keep = (flat % stride == 0) & (q < k)
            return tf.where(keep, tf.cast(q, tf.int32), tf.constant(k, tf.int32))

        return ids(_global_index((1, n0, n1, n2), self.mesh))

    def _compile(self):
        b, a = mc.INTEGRATORS[self.integrator]
        dim, dtype, vg = self.dim, self.dtype, self._vg

        def integrate(x, u, g, eps):
            dk_total = 0.0
            lp = None
            for i, ai in enumerate(a):
                u, dk = _velocity_update(u, g, b[i] * eps, dim)
                dk_total = dk_total + dk
                x = x + tf.cast(ai * eps, dtype) * u
                lp, g = vg(x)
            u, dk = _velocity_update(u, g, b[-1] * eps, dim)
            return x, u, lp, g, dk_total + dk

        def finite_of(x, lp, energy_change):
            ok = tf.reduce_all(tf.math.is_finite(x), axis=[1, 2, 3])
            return ok & tf.math.is_finite(lp) & tf.math.is_finite(energy_change)

        def select(cond, new, old):
            return tf.where(tf.reshape(cond, [-1, 1, 1, 1]), new, old)

        # Normals from a chunk's noise tensor: the template's (draws of another seed
        # share its global index; the seed is in the noise).
        normal = self._draws_template.normal

        @tf.function(autograph=False)
        def unit_velocity(noise):
            return _normalize(normal(noise))

        @tf.function(autograph=False)
        def mclmc_step(x, u, g, lp, eps, nu, noise):
            x1, u1, lp1, g1, dk = integrate(x, u, g, eps)
            u1 = _normalize(u1 + tf.cast(nu, dtype) * normal(noise))
            energy_change = dk - lp1 + lp
            finite = finite_of(x1, lp1, energy_change)
            return (
                select(finite, x1, x),
                u1,
                select(finite, g1, g),
                tf.where(finite, lp1, lp),
                tf.where(finite, energy_change, tf.zeros_like(energy_change)),
                finite,
            )

        @tf.function(autograph=False)
        def replace_velocity(u, finite, noise):
            return select(finite, u, _normalize(normal(noise)))

        @tf.function(autograph=False)
        def mams_integrate(x, u, g, eps, dk):
            x, u, lp, g, d = integrate(x, u, g, eps)
            return x, u, lp, g, dk + d

        @tf.function(autograph=False)
        def mams_finish(x, lp, lp0, dk):
            energy_change = dk - lp + lp0
            return energy_change, finite_of(x, lp, energy_change)

        @tf.function(autograph=False)
        def mams_select(accepted, x, x0, g, g0, lp, lp0):
            return select(accepted, x, x0), select(accepted, g, g0), tf.where(accepted, lp, lp0)

        @tf.function(autograph=False)
        def moments(mean, m2, x, frac, weight):
            d = x - mean
            new_mean = mean + tf.cast(frac, dtype) * d
            return new_mean, m2 + tf.cast(weight, dtype) * d * (x - new_mean)

        @tf.function(autograph=False)
        def total_variance(mean, m2, w):
            within = tf.reduce_mean(tf.cast(m2, tf.float64), axis=0) / w
            between = tf.math.reduce_variance(tf.cast(mean, tf.float64), axis=0)
            return tf.reduce_sum(within + between)

        k = self.num_recorded

        @tf.function(autograph=False)
        def subset(x):
            picked = tf.math.unsorted_segment_sum(
                tf.transpose(x, [1, 2, 3, 0]), self._subset_ids, k + 1
            )
            return tf.transpose(picked[:k])  # [chains, K]

        self._unit_velocity = unit_velocity
        self._mclmc_step = mclmc_step
        self._replace_velocity = replace_velocity
        self._mams_integrate = mams_integrate
        self._mams_finish = mams_finish
        self._mams_select = mams_select
        self._moments = moments
        self._total_variance_fn = total_variance
        self._subset = subset

    def _draws(self, seed) -> object:
        """The draws of a run with the driver's ``seed`` (int32 ``[2]``)."""
        if self.random == "philox":
            return self._draws_template.with_seed(np.asarray(seed, np.int32))
        return self._draws_template.with_seed(_seed_int(np.asarray(seed)))

    # -- state -------------------------------------------------------------------------------
    def bootstrap(
        self, x: tf.Tensor, lp: tf.Tensor, grad: tf.Tensor, place
    ) -> ShardedMicrocanonicalResults:
        """Results at a fresh state (``place``: host array -> its layout on the mesh)."""
        zero = np.zeros((), self.dtype.as_numpy_dtype)
        if self.kind == "mclmc":
            draws = self._draws(np.zeros(2, np.int32))
            velocity = self._unit_velocity(draws.initial_velocity())
        else:
            velocity = place(zero)
        eps = self.initial_step_size
        tuning = dict.fromkeys(TUNING_NAMES, 0.0)
        tuning.update(
            step_size_max=math.inf,
            log_step_size=math.log(eps),
            da_step=1.0,
            mu=math.log(10.0 * eps),
        )
        adapting = self.num_adaptation_steps > 0
        moments_needed = adapting and self.stage_ends[1] - self.stage_ends[0] > 0
        mean = place(np.zeros(self.shape, zero.dtype)) if moments_needed else place(zero)
        m2 = place(np.zeros(self.shape, zero.dtype)) if moments_needed else place(zero)
        buffer = np.zeros((self.buffer_steps, self.shape[0] * self.num_recorded))
        return ShardedMicrocanonicalResults(
            target_log_prob=lp,
            grads_target_log_prob=grad,
            velocity=velocity,
            step_size=place(np.float64(eps)),
            trajectory_length=place(np.float64(self.initial_trajectory_length)),
            tuning=place(np.array([tuning[n] for n in TUNING_NAMES], np.float64)),
            mean=mean,
            m2=m2,
            buffer=place(buffer if adapting else np.zeros((), np.float64)),
        )

    def start(self, x: tf.Tensor, results: ShardedMicrocanonicalResults, seed) -> _Chain:
        """A chunk's working state from the carried results (host scalars in float64)."""
        draws = self._draws(seed)
        tuning = dict(zip(TUNING_NAMES, (float(v) for v in _host(results.tuning)), strict=True))
        buffer = _host(results.buffer)
        mean = results.mean if results.mean.shape.rank else None
        m2 = results.m2 if results.m2.shape.rank else None
        return _Chain(
            x=x,
            lp=results.target_log_prob,
            grad=results.grads_target_log_prob,
            velocity=results.velocity if self.kind == "mclmc" else None,
            eps=float(_host(results.step_size)),
            length=float(_host(results.trajectory_length)),
            tuning=tuning,
            mean=mean,
            m2=m2,
            buffer=None
            if buffer.ndim == 0
            else buffer.reshape(self.buffer_steps, self.shape[0], self.num_recorded),
            draws=draws,
        )

    def results(self, chain: _Chain, place) -> ShardedMicrocanonicalResults:
        """The carried results of a chunk's final working state."""
        zero = np.zeros((), self.dtype.as_numpy_dtype)
        buffer = (
            np.zeros((), np.float64)
            if chain.buffer is None
            else chain.buffer.reshape(self.buffer_steps, -1)
        )
        return ShardedMicrocanonicalResults(
            target_log_prob=chain.lp,
            grads_target_log_prob=chain.grad,
            velocity=chain.velocity if chain.velocity is not None else place(zero),
            step_size=place(np.float64(chain.eps)),
            trajectory_length=place(np.float64(chain.length)),
            tuning=place(np.array([chain.tuning[n] for n in TUNING_NAMES], np.float64)),
            mean=chain.mean if chain.mean is not None else place(zero),
            m2=chain.m2 if chain.m2 is not None else place(zero),
            buffer=place(buffer),
        )

    # -- one transition ----------------------------------------------------------------------
    def one_step(self, chain: _Chain, step: int) -> dict:
        """Advance ``chain`` by the transition of global step ``step``; its host statistics.

        Returns the per-chain traces of :func:`fieldhmc.samplers.kernels.step_stats` for
        the microcanonical kinds (``lp`` in float64, ``step_size`` as
        :math:`\\epsilon / \\sqrt d` after the tuner's update).
        """
        if self.kind == "mclmc":
            stats, statistic, finite = self._mclmc(chain, step)
        else:
            stats, statistic, finite = self._mams(chain, step)
        if step < self.num_adaptation_steps:
            tune = self._tune_mclmc if self.kind == "mclmc" else self._tune_mams
            chain.eps, chain.length = tune(chain, step, statistic, finite)
            if step >= self.stage_ends[1] - 1:  # the moments are not read again
                chain.mean = chain.m2 = None
            if step >= self.stage_ends[2] - 1:
                chain.buffer = None
        chains = self.shape[0]
        stats["step_size"] = np.full(chains, chain.eps / math.sqrt(self.dim))
        stats["energy"] = np.full(chains, np.nan)
        stats["tree_depth"] = np.zeros(chains, np.int32)
        return stats

    def _mclmc(self, chain: _Chain, step: int):
        eps, length, d = chain.eps, chain.length, chain.draws
        nu = math.sqrt((math.exp(2.0 * eps / length) - 1.0) / self.dim)
        x, u, g, lp, energy_change, finite = self._mclmc_step(
            chain.x,
            chain.velocity,
            chain.grad,
            chain.lp,
            tf.constant(eps, tf.float64),
            tf.constant(nu, tf.float64),
            d.refresh(step),
        )
        finite_h = _host(finite)
        if not finite_h.all():
            u = self._replace_velocity(u, finite, d.nan_velocity(step))
        chain.x, chain.velocity, chain.grad, chain.lp = x, u, g, lp
        ec = _host(energy_change)
        chains = self.shape[0]
        stats = {
            "lp": _host(lp),
            "acceptance_rate": np.full(chains, np.nan),
            "is_accepted": finite_h,
            "diverging": ~finite_h | (ec > mc.MAX_ENERGY_ERROR),
            "n_steps": np.full(chains, self.gradients_per_step, np.int32),
            "energy_error": ec,
        }
        return stats, ec, finite_h

    def _mams(self, chain: _Chain, step: int):
        eps, d = chain.eps, chain.draws
        n = num_integration_steps(chain.length / eps, d.length_uniform(step))
        x, u, g = chain.x, self._unit_velocity(d.velocity(step)), chain.grad
        dk = _replicate(np.zeros(self.shape[0]), self.mesh)
        lp = chain.lp
        eps_t = tf.constant(eps, tf.float64)
        for _ in range(n):
            x, u, lp, g, dk = self._mams_integrate(x, u, g, eps_t, dk)
        energy_change, finite = self._mams_finish(x, lp, chain.lp, dk)
        ec, finite_h = _host(energy_change), _host(finite)
        log_accept = np.where(finite_h, -ec, -np.inf)
        accepted = np.log(d.accept_uniform(step)) < log_accept
        chain.x, chain.grad, chain.lp = self._mams_select(
            _replicate(accepted, self.mesh), x, chain.x, g, chain.grad, lp, chain.lp
        )
        with np.errstate(invalid="ignore"):
            accept_prob = np.exp(np.minimum(log_accept, 0.0))
            diverging = ~finite_h | (ec > mc.MAX_ENERGY_ERROR)
        stats = {
            "lp": _host(chain.lp),
            "acceptance_rate": accept_prob,
            "is_accepted": accepted,
            "diverging": diverging,
            "n_steps": np.full(self.shape[0], n * self.gradients_per_step, np.int32),
            "energy_error": np.where(finite_h, ec, 0.0),
        }
        return stats, accept_prob, finite_h

    # -- the tuners (host float64; the rules of mclmc.py's _tune) ---------------------------
    def _update_moments(self, chain: _Chain, weight: float) -> None:
        """``_MicrocanonicalBase._moments`` (a zero weight changes nothing: skipped)."""
        if weight == 0.0:
            return
        total = chain.tuning["weight"] + weight
        frac = weight / total if total > 0 else 0.0
        chain.mean, chain.m2 = self._moments(
            chain.mean,
            chain.m2,
            chain.x,
            tf.constant(frac, tf.float64),
            tf.constant(weight, tf.float64),
        )
        chain.tuning["weight"] = total

    def _total_variance(self, chain: _Chain) -> float:
        w = chain.tuning["weight"]
        w = w if w > 0 else 1.0
        return float(
            _host(self._total_variance_fn(chain.mean, chain.m2, tf.constant(w, tf.float64)))
        )

    def _record(self, chain: _Chain, row: int) -> None:
        chain.buffer[row] = _host(self._subset(chain.x)).astype(np.float64)

    def _tune_mclmc(self, chain: _Chain, t: int, energy_change: np.ndarray, finite: np.ndarray):
        eps, length, tun = chain.eps, chain.length, chain.tuning
        end1, end2, end3 = self.stage_ends
        all_finite = bool(finite.all())
        xi = float(np.mean(energy_change**2)) / (self.dim * self.desired_energy_var) + 1e-8
        weight = math.exp(-0.5 * (math.log(xi) / (6.0 * mc._TRUST)) ** 2)
        x_average = mc._DECAY * tun["x_average"] + weight * (xi / eps**6)
        time = mc._DECAY * tun["time"] + weight
        step_size_max = tun["step_size_max"] if all_finite else 0.8 * eps
        predicted = (x_average / time) ** (-1.0 / 6.0) if time > 0 else eps
        predicted = min(predicted, step_size_max)
        eps_new = eps
        if t < end2:
            tun.update(time=time, x_average=x_average, step_size_max=step_size_max)
            eps_new = predicted
        if end1 <= t < end2 and all_finite:
            self._update_moments(chain, eps)
        if end2 - end1 > 1 and t == end2 - 1:
            length = math.sqrt(self._total_variance(chain))
        if end3 - end2 >= 2:
            eps_new = self._enforce_tolerance(t, eps_new, energy_change, finite, tun)
            if end2 <= t < end3:
                self._record(chain, t - end2)
            if t == end3 - 1:
                length = 0.4 * eps * autocorrelation_time(chain.buffer)
        return eps_new, length

    def _enforce_tolerance(self, t, eps, energy_change, finite, tun) -> float:
        """``MicrocanonicalLangevin._enforce_tolerance`` (sum and count in
        ``avg_error`` / ``da_step``)."""
        end2, end3 = self.stage_ends[1], self.stage_ends[2]
        window = max(1, math.ceil((end3 - end2) / mc._TOLERANCE_WINDOWS))
        if not end2 <= t < end3:
            return eps
        error = np.where(finite, energy_change, mc.MAX_ENERGY_ERROR)
        value = float(np.mean(error**2)) / self.dim
        restart = t == end2
        total = (0.0 if restart else tun["avg_error"]) + value
        count = (0.0 if restart else tun["da_step"]) + 1.0
        done = ((t - end2 + 1) % window == 0) or t == end3 - 1
        measured = total / count
        desired = self.desired_energy_var
        if done and measured > 2.0 * desired:
            eps = eps * (desired / measured) ** (1.0 / 6.0)
        tun["avg_error"] = 0.0 if done else total
        tun["da_step"] = 0.0 if done else count
        return eps

    def _tune_mams(self, chain: _Chain, t: int, accept_prob: np.ndarray, finite: np.ndarray):
        eps, big_l, tun = chain.eps, chain.length, chain.tuning
        end1, end2, end3, end4 = self.stage_ends
        target = self.target_accept_prob
        da_t = tun["da_step"]
        acc = float(np.mean(np.where(finite, accept_prob, 0.0)))
        avg_error = (1.0 - 1.0 / (da_t + 10.0)) * tun["avg_error"] + (target - acc) / (da_t + 10.0)
        log_eps = tun["mu"] - math.sqrt(da_t) / 0.05 * avg_error
        log_eps = min(log_eps, math.log(big_l / 1.1))
        eta = da_t ** (-0.75)
        log_eps_avg = eta * log_eps + (1.0 - eta) * tun["log_step_size_avg"]
        adapting = t < end1 or end3 <= t < end4
        eps_new = eps
        if adapting:
            tun.update(
                log_step_size=log_eps,
                log_step_size_avg=log_eps_avg,
                da_step=da_t + 1.0,
                avg_error=avg_error,
            )
            eps_new = math.exp(log_eps)
        l_new = big_l * eps_new / eps if t < end1 else big_l
        final = math.exp(tun["log_step_size_avg"])
        if t == end1 - 1 or t == end4 - 1:
            eps_new = final
        if t == end1 - 1:
            l_new = l_new * final / math.exp(log_eps)
        if end1 <= t < end2 and bool(finite.all()):
            self._update_moments(chain, eps)
        if end2 - end1 > 1 and t == end2 - 1:
            change = min(max(1.3 * math.sqrt(self._total_variance(chain)) / l_new, 0.0), 2.0)
            l_new = l_new * change
            eps_new = min(eps_new, l_new / 1.1)
        if end3 - end2 >= 2:
            if end2 <= t < end3:
                self._record(chain, t - end2)
            if t == end3 - 1:
                tau = autocorrelation_time(chain.buffer, np.max)
                l_new = min(max(0.5 * l_new * tau, l_new), 2.0 * l_new)
        if t == end3 - 1:
            tun.update(
                log_step_size=math.log(eps_new),
                log_step_size_avg=0.0,
                da_step=1.0,
                avg_error=0.0,
                mu=math.log(10.0 * eps_new),
            )
        return eps_new, l_new
