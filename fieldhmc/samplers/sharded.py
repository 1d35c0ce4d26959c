"""HMC with the state sharded over a DTensor mesh, run by the chunked driver.

Each device holds its x-slab of the position, the momentum and the gradient;
the log density and the kinetic energy are global float64 sums. The transition is
plain Metropolis-adjusted HMC (leapfrog, identity metric, a fixed number of steps,
one Metropolis test per chain) written with ops DTensor can shard, compiled once
with ``tf.function`` (DTensor programs are not XLA-compiled); the driver adapts its
step size during warm-up by dual averaging on the host (:func:`dual_averaging_update`).

:class:`ShardedSampler` runs it through the driver's
:meth:`fieldhmc.samplers.driver.Sampler.run` -- the same chunks, checkpoints,
trace/field storage, progress and TensorBoard scalars as a single-device run -- by
replacing the driver's compiled pieces (see the "Extension" note of
:class:`~fieldhmc.samplers.driver.Sampler`). :func:`run_sharded_hmc` is the same
transition in a bare Python loop (benchmarks, and the reference the driver run must
reproduce). With ``kind`` ``mclmc`` or ``mams`` the sampler runs the microcanonical
kernels and their staged tuners instead (:mod:`fieldhmc.samplers.sharded_mclmc`), with
the same chunking and the same counter-based random numbers.

**Why the chunk is a Python loop over a compiled transition.** The driver's chunk is
one ``tf.while_loop`` under XLA. DTensor programs cannot be XLA-compiled, and a
``tf.while_loop`` whose body runs the slab transforms segfaults TensorFlow 2.21
(the relayout + FFT pair inside a DTensor while body; each op alone is fine; no
upstream issue found). The sharded chunk therefore calls one compiled transition
per step from Python; it never retraces (the step and keys are tensors).

**Sharding-invariant random numbers.** TensorFlow's stateless random ops give a
DTensor sharded along an axis *different* numbers from an unsharded tensor (DTensor
folds the device id into the seed), so a 4-device run could never reproduce a
1-device one. The momenta and Metropolis uniforms are therefore a counter-based
generator of the element's global index: SplitMix64 (Steele, Lea & Flood 2014) of
``key(seed, step) + index``, two 53-bit uniforms per element, Box-Muller. Each
device computes its own slab's numbers from the slab's global indices, so the
draws do not depend on the mesh, and step ``t`` (over warm-up and sampling) depends
on ``(seed, t)`` only, so a resumed run replays an uninterrupted one.

References
----------
1. Neal (2011), "MCMC using Hamiltonian dynamics", arXiv:1206.1901.
2. Steele, Lea & Flood (2014), "Fast splittable pseudorandom number generators",
   OOPSLA 2014, doi:10.1145/2660193.2660195.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from fieldhmc.ops import sharded
from fieldhmc.samplers.driver import (
    STAT_NAMES,
    Sampler,
    SamplerSettings,
    _RunState,
    _welford_update,
    _zero_welford,
    field_stats_every,
    tuned_parameters,
)
from fieldhmc.samplers.kernels import MAX_ENERGY_ERROR
from fieldhmc.samplers.kinds import MICROCANONICAL_KINDS, default_target_accept_prob

__all__ = [
    "ShardedFieldOutputs",
    "dual_averaging_update",
    "ShardedHMCResult",
    "ShardedHMCResults",
    "ShardedSampler",
    "index_normal",
    "make_hmc_transition",
    "run_sharded_hmc",
]

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


def _base_key(seed: int, stream: int) -> tf.Tensor:
    """uint64 scalar per (seed, stream): 0 momenta, 1 Metropolis uniforms."""
    return _splitmix64(_u64((int(seed) * _GOLDEN + stream) % 2**64))


def _step_key(base: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    return _splitmix64(base + tf.cast(step, tf.uint64) * _u64(_GOLDEN))


def _key(seed: int, step: tf.Tensor, stream: int) -> tf.Tensor:
    return _step_key(_base_key(seed, stream), step)


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


def _replicate(value, mesh: dtensor.Mesh | None) -> tf.Tensor:
    t = tf.convert_to_tensor(value)
    if mesh is None:
        return t
    return dtensor.copy_to_mesh(t, dtensor.Layout.replicated(mesh, t.shape.rank))


def _host(t) -> np.ndarray:
    """A (DTensor or plain) tensor's global value as a NumPy copy."""
    if isinstance(t, np.ndarray):
        return np.array(t, copy=True)
    if dtensor.is_dtensor(t):
        return np.array(sharded.gather(t), copy=True)
    return np.array(t.numpy(), copy=True)


def make_hmc_transition(
    value_and_gradient_fn: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]],
    shape: tuple[int, ...],
    dtype: tf.DType,
    *,
    num_leapfrog_steps: int,
    mesh: dtensor.Mesh | None = None,
) -> Callable:
    """One compiled Metropolis-adjusted HMC transition on a (possibly sharded) state.

    Parameters
    ----------
    value_and_gradient_fn : callable
        ``x -> (log p float64 [chains], grad like x)``.
    shape : tuple of int
        ``(chains, n0, n1, n2)``.
    dtype : tf.DType
        State dtype.
    num_leapfrog_steps : int
        Leapfrog steps (unrolled in the compiled transition).
    mesh : dtensor.Mesh, optional
        The state's mesh (None for plain tensors).

    Returns
    -------
    callable
        ``one_step(x, lp, grad, step_size, momentum_base, accept_base, step) ->
        (x, lp, grad, energy, energy_error, is_accepted)``: ``step_size`` a scalar of
        ``dtype``, the two bases uint64 scalars (:func:`_base_key`), ``step`` int64;
        ``energy`` is :math:`-\\log p(x_{t-1}) + K(p_0)`, ``energy_error``
        :math:`H_1 - H_0`, both float64 ``[chains]``.
    """
    if num_leapfrog_steps < 1:
        raise ValueError(f"num_leapfrog_steps must be >= 1, got {num_leapfrog_steps}")
    index = _global_index(tuple(int(n) for n in shape), mesh)
    chains = int(shape[0])
    chain_index = _replicate(np.arange(chains, dtype=np.uint64), mesh)

    def kinetic(p):
        return 0.5 * tf.reduce_sum(tf.square(tf.cast(p, tf.float64)), axis=[1, 2, 3])

    @tf.function(autograph=False)
    def one_step(x, lp, grad, step_size, momentum_base, accept_base, step):
        eps = tf.cast(step_size, dtype)
        half = 0.5 * eps
        p = index_normal(index, _step_key(momentum_base, step), dtype)
        h0 = -lp + kinetic(p)
        xn, pn, gn, lpn = x, p + half * grad, grad, lp
        for i in range(num_leapfrog_steps):
            xn = xn + eps * pn
            lpn, gn = value_and_gradient_fn(xn)
            pn = pn + (eps if i < num_leapfrog_steps - 1 else half) * gn
        h1 = -lpn + kinetic(pn)
        uniform = _uniform53(_splitmix64(_step_key(accept_base, step) + chain_index))
        log_u = tf.math.log(1.0 - uniform)
        energy_error = h1 - h0
        accept = log_u < -tf.where(tf.math.is_finite(energy_error), energy_error, np.inf)
        mask = tf.reshape(accept, [chains, 1, 1, 1])
        return (
            tf.where(mask, xn, x),
            tf.where(accept, lpn, lp),
            tf.where(mask, gn, grad),
            h0,
            energy_error,
            accept,
        )

    return one_step


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
    """Metropolis-adjusted HMC on a (possibly sharded) field state, in a bare loop.

    The transition of :class:`ShardedSampler` without the driver (no chunks,
    checkpoints or storage); with the same seed it gives the same draws.

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
    one_step = make_hmc_transition(
        value_and_gradient_fn, shape, dtype, num_leapfrog_steps=num_leapfrog_steps, mesh=mesh
    )
    eps = _replicate(tf.constant(step_size, dtype), mesh)
    bases = _base_key(seed, 0), _base_key(seed, 1)
    x = init_state
    lp, grad = tf.function(value_and_gradient_fn, autograph=False)(x)
    lps, accepts, records = [], [], []
    for t in range(num_burnin_steps + num_results):
        x, lp, grad, _, _, accept = one_step(x, lp, grad, eps, *bases, tf.constant(t, tf.int64))
        if t >= num_burnin_steps:
            lps.append(_host(lp))
            accepts.append(_host(accept))
            if record_fn is not None:
                records.append(record_fn(x))
    return ShardedHMCResult(x, np.stack(lps), np.stack(accepts), records)


# --- the driver's sharded sampler -------------------------------------------------------------
class ShardedHMCResults(NamedTuple):
    """Kernel results the sharded chunk carries (and the checkpoint stores).

    Attributes
    ----------
    target_log_prob : tf.Tensor
        float64 ``[chains]`` (replicated) at the current state.
    grad_target_log_prob : tf.Tensor
        Its gradient, ``[chains, *grid]`` in slabs.
    new_step_size : tf.Tensor
        Scalar: the leapfrog step the next transition uses (TFP's name).
    error_sum, log_averaging_step : tf.Tensor
        float64 scalars: the dual-averaging state (TFP's names, see
        :func:`dual_averaging_update`).
    """

    target_log_prob: tf.Tensor
    grad_target_log_prob: tf.Tensor
    new_step_size: tf.Tensor
    error_sum: tf.Tensor
    log_averaging_step: tf.Tensor


def dual_averaging_update(
    step: int,
    accept_prob: float,
    step_size: float,
    error_sum: float,
    log_averaging_step: float,
    *,
    target_accept_prob: float,
    initial_step_size: float,
    num_adaptation_steps: int,
) -> tuple[float, float, float]:
    """One step of TFP's ``DualAveragingStepSizeAdaptation``, in float64 on the host.

    Hoffman & Gelman's dual averaging (arXiv:1111.4246, Algorithm 5) with TFP's
    defaults: shrinkage target :math:`\\mu = \\log(10 \\epsilon_0)`, :math:`\\gamma =
    0.05`, :math:`t_0 = 10`, :math:`\\kappa = 0.75`; ``accept_prob`` is the mean of the
    chains' acceptance probabilities (TFP's ``reduce_logmeanexp``). With
    :math:`n = \\text{step} + 1` and :math:`H_n` the running sum of
    ``target_accept_prob - accept_prob``:

    .. math:: \\log\\epsilon_n = \\mu - \\frac{\\sqrt n\\, H_n}{\\gamma (n + t_0)},\\qquad
              \\log\\bar\\epsilon_n = n^{-\\kappa}\\log\\epsilon_n
              + (1 - n^{-\\kappa}) \\log\\bar\\epsilon_{n-1}.

    The step size is :math:`\\epsilon_n` while ``n < num_adaptation_steps``,
    :math:`\\bar\\epsilon_n` at ``n == num_adaptation_steps`` and fixed afterwards.

    Returns
    -------
    tuple of float
        ``(new_step_size, error_sum, log_averaging_step)``.
    """
    n = step + 1
    if n > num_adaptation_steps:
        return step_size, error_sum, log_averaging_step
    error_sum = error_sum + target_accept_prob - accept_prob
    log_step = math.log(10.0 * initial_step_size) - error_sum * math.sqrt(n) / ((n + 10) * 0.05)
    eta = n**-0.75
    log_averaging_step = eta * log_step + (1.0 - eta) * log_averaging_step
    new = log_step if n < num_adaptation_steps else log_averaging_step
    return math.exp(new), error_sum, log_averaging_step


@dataclass(frozen=True)
class ShardedFieldOutputs:
    """Per-transition field quantities of a sharded run (the driver's ``FieldOutputs``).

    The field is :math:`\\delta` of the target (:meth:`ShardedGaussianTarget.delta`);
    its binned power, tracked modes and running mean/variance are computed on the
    mesh with the sharded ``rfft3d`` (bins summed by ``unsorted_segment_sum``, which
    DTensor shards), exactly as :func:`fieldhmc.models.measure_power` defines them.

    Parameters
    ----------
    grid : fieldhmc.models.Grid
    kbins : fieldhmc.models.KBins
    tracked : np.ndarray, optional
        int ``[T, 3]`` half-spectrum indices of the traced modes (backward-normalised
        ``rfft3d(delta)``, as the single-device run traces them).
    store_fields : bool
        Keep every ``field_thin``-th draw of :math:`\\delta` (gathered to the host).
    """

    grid: object
    kbins: object
    tracked: np.ndarray | None = None
    store_fields: bool = True


class _ShardedCarry:
    """The chunk's carried state as (DTensor) tensors; the interface of the driver's carry.

    Field-sized arrays (trailing axes ``grid_shape``) are laid out in x-slabs (the
    ``n0`` axis sharded), everything else is replicated. :meth:`numpy` gathers to the
    host (checkpoints, summaries): one copy of the state in host memory per chunk.
    """

    def __init__(self, mesh: dtensor.Mesh | None, grid_shape: tuple[int, int, int]):
        self.mesh = mesh
        self.grid_shape = tuple(grid_shape)
        self._parts: dict = {}

    def place(self, value) -> tf.Tensor:
        """A host array (or tensor) in its layout on the mesh."""
        if dtensor.is_dtensor(value):
            return value
        arr = np.asarray(value)
        if self.mesh is None:
            return tf.constant(arr)
        if arr.ndim >= 3 and tuple(arr.shape[-3:]) == self.grid_shape:
            dim = self.mesh.dim_names[0]
            specs = [dtensor.UNSHARDED] * (arr.ndim - 3) + [dim] + [dtensor.UNSHARDED] * 2
            return sharded.shard(arr, dtensor.Layout(specs, self.mesh))
        return _replicate(arr, self.mesh)

    def load(self, **parts) -> None:
        for name, value in parts.items():
            self._parts[name] = tf.nest.map_structure(self.place, value)

    def read(self, name: str):
        return self._parts[name]

    def assign(self, name: str, value) -> None:
        self._parts[name] = value

    @property
    def dtype(self) -> tf.DType:
        return self._parts["x"][0].dtype

    def shapes(self, name: str) -> list[tuple[int, ...]]:
        return [tuple(t.shape) for t in tf.nest.flatten(self._parts[name])]

    def numpy(self, name: str):
        return tf.nest.map_structure(_host, self._parts[name])


def _seed_int(seed) -> int:
    """The int of :func:`fieldhmc.seeds.stateless_seed` (its inverse)."""
    a, b = (int(v) for v in np.asarray(seed).reshape(-1))
    return a | (b << 31)


class ShardedSampler(Sampler):
    """The chunked driver running HMC, MCLMC or MAMS on a sharded field.

    :meth:`~fieldhmc.samplers.driver.Sampler.run` is the driver's own (chunks,
    checkpoint after every chunk, resume, trace and field sinks, progress,
    TensorBoard); this class replaces the compiled pieces it calls: the state lives
    on the mesh (:class:`_ShardedCarry`), a chunk loops over one compiled transition
    (module docs), and the log density is carried in float64, so the driver's
    re-centring offset is bookkeeping only. Checkpoints hold the gathered host
    arrays (the state, its gradient, the field moments; for mclmc / mams also the
    velocity, the host tuning state and, while the tuner still reads them, its
    weighted moments and recorded coordinates) and are re-sharded on resume.

    Parameters
    ----------
    target : fieldhmc.models.sharded.ShardedGaussianTarget
        The log density on the mesh (or on plain tensors, ``target.mesh = None``:
        the single-device reference).
    settings : SamplerSettings
        ``kind`` ``"hmc"``, ``"mclmc"`` or ``"mams"``; no jitter, no diagonal
        adaptation. ``hmc``: :func:`make_hmc_transition`, the step size adapted during
        warm-up by dual averaging toward ``target_accept_prob`` (as the single-device
        ``hmc``; :func:`dual_averaging_update`), ``num_leapfrog_steps`` fixed.
        ``mclmc`` / ``mams``: :class:`fieldhmc.samplers.sharded_mclmc.ShardedMicrocanonical`,
        the kernels of :mod:`fieldhmc.samplers.mclmc` with their staged tuners (step
        size and ``L``) during warm-up; ``step_size``, ``trajectory_length``,
        ``integrator``, ``desired_energy_var`` and ``target_accept_prob`` as there.
    field_outputs : ShardedFieldOutputs, optional
        Per-draw power, tracked modes, field moments and stored draws of delta.
    random : {"counter", "philox"}
        ``mclmc`` / ``mams`` only: mesh-invariant counter-based draws (the default), or
        the unsharded kernels' own draws (plain tensors, ``target.mesh = None``: then
        the run reproduces the unsharded driver's ``mclmc`` / ``mams`` on the same
        target).
    """

    def __init__(
        self,
        target,
        settings: SamplerSettings,
        field_outputs: ShardedFieldOutputs | None = None,
        random: str = "counter",
    ):
        kinds = ("hmc", *MICROCANONICAL_KINDS)
        problems = [
            (settings.kind not in kinds, f"kind in {kinds} (got {settings.kind!r})"),
            (settings.jitter_leapfrog, "jitter_leapfrog=False"),
            (settings.step_size_jitter != 0.0, "step_size_jitter=0"),
            (settings.adapt_diagonal, "adapt_diagonal=False"),
        ]
        for bad, needed in problems:
            if bad:
                raise ValueError(f"the sharded sampler needs {needed}")
        dtype = target.dtype
        super().__init__(target, settings, ("field",), [np.ones((), dtype.as_numpy_dtype)])
        self.field_outputs = field_outputs
        self.target = target
        self.mesh = target.mesh
        self._shape = (settings.num_chains, *target.grid_shape)
        self._value_and_gradient = tf.function(target.value_and_gradient, autograph=False)
        self._micro = None
        if settings.kind in MICROCANONICAL_KINDS:
            from fieldhmc.samplers.sharded_mclmc import ShardedMicrocanonical

            self._micro = ShardedMicrocanonical(
                settings.kind,
                target.value_and_gradient,
                self._shape,
                dtype,
                self.mesh,
                step_size=settings.step_size,
                trajectory_length=settings.trajectory_length,
                num_adaptation_steps=settings.num_burnin_steps,
                integrator=settings.integrator,
                desired_energy_var=settings.desired_energy_var,
                target_accept_prob=settings.target_accept_prob
                or default_target_accept_prob(settings.kind),
                random=random,
            )
        else:
            if random != "counter":
                raise ValueError("random='philox' applies to kind mclmc / mams only")
            self._one_step = make_hmc_transition(
                target.value_and_gradient,
                self._shape,
                dtype,
                num_leapfrog_steps=settings.num_leapfrog_steps,
                mesh=self.mesh,
            )
        self._field_values = self._field_moments = None
        if field_outputs is not None:
            self._field_values, self._field_moments = self._make_field_stats()
        # The driver's compiled pieces, replaced (Sampler's "Extension" note).
        self._carry = _ShardedCarry(self.mesh, target.grid_shape)
        self._lp64 = self._carried_log_prob
        self._bootstrap = self._results_template
        self._chunk = self._run_chunk if self._micro is None else self._run_microcanonical_chunk

    # -- what Sampler.run calls ------------------------------------------------------------
    def _carried_log_prob(self, x_parts) -> tf.Tensor:
        """float64 ``[chains]`` at the carried state (carried, not recomputed)."""
        del x_parts
        return self._carry.read("results").target_log_prob

    def _results_template(self, *args):
        """The results' structure (for packing a checkpoint's arrays)."""
        del args
        if self._micro is not None:
            from fieldhmc.samplers.sharded_mclmc import ShardedMicrocanonicalResults

            return ShardedMicrocanonicalResults(*[0] * len(ShardedMicrocanonicalResults._fields))
        return ShardedHMCResults(0, 0, 0, 0, 0)

    def _scales_tensors(self, scales, dtype):
        return None  # identity metric

    def _fresh_state(self, init_state: Sequence[np.ndarray]) -> _RunState:
        (x,) = (np.asarray(p) for p in init_state)
        if x.shape != self._shape:
            raise ValueError(f"initial state has shape {x.shape}, expected {self._shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("initial state of 'field' contains NaN or Inf")
        x = x.astype(self.target.dtype.as_numpy_dtype)
        xt = self._carry.place(x)
        lp, grad = self._value_and_gradient(xt)
        reference = _host(lp)
        if not np.all(np.isfinite(reference)):
            raise ValueError("the log density is not finite at the initial state")
        fw = _zero_welford([self.target.grid_shape] if self.field_outputs else [()])
        if self._micro is not None:
            results = self._micro.bootstrap(xt, lp, grad, self._carry.place)
        else:
            zero = np.zeros((), np.float64)
            step_size = np.asarray(self.settings.step_size, np.float64)
            results = ShardedHMCResults(lp, grad, step_size, zero, zero)
        self._carry.load(x=[xt], results=results, fw=fw, lw=_zero_welford([]))
        return _RunState(step=0, scales=[np.ones((), x.dtype)], reference=reference)

    def _run_chunk(self, scales, reference, delta, seed, start, num_steps):
        """``num_steps`` transitions from the carried state (as the driver's chunk)."""
        del scales, reference, delta  # identity metric; the log density is float64
        s = self.settings
        key = _seed_int(seed.numpy())
        bases = _base_key(key, 0), _base_key(key, 1)
        carry = self._carry
        (x,) = carry.read("x")
        res = carry.read("results")
        fw = carry.read("fw")
        lp, grad = res.target_log_prob, res.grad_target_log_prob
        eps, error_sum, log_avg = (
            float(_host(t)) for t in (res.new_step_size, res.error_sum, res.log_averaging_step)
        )
        adapt = {
            "target_accept_prob": s.target_accept_prob or default_target_accept_prob("hmc"),
            "initial_step_size": s.step_size,
            "num_adaptation_steps": s.num_burnin_steps,
        }
        dtype = self.target.dtype
        chains = s.num_chains
        names = ("lp", "energy", "energy_error", "is_accepted", "step_size")
        out = {name: [] for name in names}
        stats = {name: [] for name in self._field_names()}
        fields = []
        first = int(start.numpy())
        for i in range(int(num_steps.numpy())):
            step = first + i
            x, lp, grad, energy, energy_error, accepted = self._one_step(
                x, lp, grad, tf.constant(eps, dtype), *bases, tf.constant(step, tf.int64)
            )
            values = [_host(v) for v in (lp, energy, energy_error, accepted)]
            out["step_size"].append(np.full(chains, eps))
            for name, value in zip(names[:4], values, strict=True):
                out[name].append(value)
            accept_prob = float(np.mean(_acceptance(values[2])))
            eps, error_sum, log_avg = dual_averaging_update(
                step, accept_prob, eps, error_sum, log_avg, **adapt
            )
            fw = self._field_step(x, fw, step, stats, fields)
        carry.assign("x", [x])
        hyper = [np.asarray(v, np.float64) for v in (eps, error_sum, log_avg)]
        carry.assign("results", ShardedHMCResults(lp, grad, *map(carry.place, hyper)))
        carry.assign("fw", fw)
        ee = np.stack(out["energy_error"])
        n = ee.shape[0]
        bufs = {
            "lp": np.stack(out["lp"]),
            "acceptance_rate": _acceptance(ee),
            "is_accepted": np.stack(out["is_accepted"]),
            "diverging": ~np.isfinite(ee) | (ee > MAX_ENERGY_ERROR),
            "energy": np.stack(out["energy"]),
            "step_size": np.stack(out["step_size"]),
            "n_steps": np.full((n, chains), s.num_leapfrog_steps, np.int32),
            "tree_depth": np.zeros((n, chains), np.int32),
            "energy_error": ee,
        }
        return self._chunk_outputs(bufs, stats, fields)

    def _run_microcanonical_chunk(self, scales, reference, delta, seed, start, num_steps):
        """``num_steps`` MCLMC / MAMS transitions from the carried state (as the driver's
        chunk): the tuner runs on the host between the compiled transitions."""
        del scales, reference, delta  # identity metric; the log density is float64
        carry = self._carry
        (x,) = carry.read("x")
        chain = self._micro.start(x, carry.read("results"), seed.numpy())
        fw = carry.read("fw")
        out = {name: [] for name in STAT_NAMES}
        stats = {name: [] for name in self._field_names()}
        fields = []
        first = int(start.numpy())
        for i in range(int(num_steps.numpy())):
            step = first + i
            values = self._micro.one_step(chain, step)
            for name in STAT_NAMES:
                out[name].append(values[name])
            fw = self._field_step(chain.x, fw, step, stats, fields)
        carry.assign("x", [chain.x])
        carry.assign("results", self._micro.results(chain, carry.place))
        carry.assign("fw", fw)
        bufs = {name: np.stack(v) for name, v in out.items()}
        return self._chunk_outputs(bufs, stats, fields)

    def _field_names(self) -> list[str]:
        fo = self.field_outputs
        if fo is None:
            return []
        return ["power"] + (["tracked_real", "tracked_imag"] if _has(fo) else [])

    def _field_step(self, x, fw, step: int, stats: dict, fields: list):
        """The field outputs of one transition, as the driver's chunk computes them:
        P(k) and tracked modes on traced draws (every ``thin``-th after warm-up, zeros
        otherwise), the running moments every :func:`field_stats_every`-th, a stored
        draw of delta every ``field_thin``-th. Appends to ``stats`` / ``fields``;
        returns the moments."""
        fo, s = self.field_outputs, self.settings
        if fo is None:
            return fw
        names = self._field_names()
        after = step - s.num_burnin_steps
        is_trace = after >= 0 and after % s.thin == 0
        is_moment = after >= 0 and after % field_stats_every(s) == 0
        keep = after >= 0 and fo.store_fields and after % s.field_thin == 0
        values = [np.zeros(self._field_stat_shapes[n], np.float64) for n in names]
        if is_trace or is_moment or keep:
            delta, computed = self._field_values(x)
            if is_moment:
                fw = self._field_moments(fw, delta)
            if is_trace:
                values = [_host(v) for v in computed]
            if keep:
                fields.append(_host(delta))
        for name, value in zip(names, values, strict=True):
            stats[name].append(value)
        return fw

    def _chunk_outputs(self, bufs: dict, stats: dict, fields: list):
        bufs = dict(bufs)
        bufs.update({name: np.stack(v) for name, v in stats.items()})
        dtype = self.target.dtype
        field_buf = np.stack(fields) if fields else np.zeros([1], dtype.as_numpy_dtype)
        return (
            {name: tf.constant(v) for name, v in bufs.items()},
            tf.constant(field_buf),
            tf.constant(len(fields)),
        )

    def _summary(self, rs: _RunState) -> dict:
        summary = super()._summary(rs)
        if self._micro is not None:  # the tuned step size and L per sqrt(d) of the field
            ones = np.broadcast_to(np.ones((), self.target.dtype.as_numpy_dtype), self._shape[1:])
            summary["tuned"] = tuned_parameters(
                self.settings.kind, self._carry.numpy("results"), [ones]
            )
        return summary

    # -- field statistics on the mesh ------------------------------------------------------
    def _make_field_stats(self):
        fo = self.field_outputs
        mesh = self.mesh
        grid, kbins = fo.grid, fo.kbins
        n0, n1, n2 = self.target.grid_shape
        dtype = self.target.dtype
        nb = kbins.num_bins
        ids = np.where(kbins.index >= 0, kbins.index, nb).astype(np.int32)
        ids = np.broadcast_to(ids, (n0, n1, n2 // 2 + 1))
        weights = tf.constant(grid.hermitian_weights()[0, 0], dtype)
        norm = grid.volume / float(grid.num_cells) ** 2
        num = kbins.num_modes
        scale = tf.constant(np.where(num > 0, norm / np.maximum(num, 1.0), np.nan), tf.float64)
        tracked = None if not _has(fo) else np.asarray(fo.tracked, np.int64)
        num_tracked = 0 if tracked is None else len(tracked)
        chains = self.settings.num_chains
        self._field_stat_shapes = {
            "power": (chains, nb),
            "tracked_real": (chains, num_tracked),
            "tracked_imag": (chains, num_tracked),
        }
        tids = np.full((n0, n1, n2 // 2 + 1), num_tracked, np.int32)
        if tracked is not None:
            for t, (i, j, k) in enumerate(tracked):
                tids[i, j, k] = t
        if mesh is None:
            ids_t, tids_t = tf.constant(ids), tf.constant(tids)
        else:
            layout = dtensor.Layout([dtensor.UNSHARDED, mesh.dim_names[0], dtensor.UNSHARDED], mesh)
            ids_t, tids_t = sharded.shard(ids, layout), sharded.shard(tids, layout)
            scale, weights = _replicate(scale, mesh), _replicate(weights, mesh)
        target = self.target

        def rfft(delta):
            if mesh is None:
                from fieldhmc.ops import fft

                return fft.rfft3d(delta)
            return sharded.rfft3d(delta, mesh)

        @tf.function(autograph=False)
        def field_values(x):
            delta = target.delta(x)
            modes = rfft(delta)  # [c, n0, n1, m]
            power2 = (tf.math.real(modes) ** 2 + tf.math.imag(modes) ** 2) * weights
            sums = tf.math.unsorted_segment_sum(tf.transpose(power2, [1, 2, 3, 0]), ids_t, nb + 1)
            power = tf.transpose(tf.cast(sums[:nb], tf.float64)) * scale
            values = [power]
            if tracked is not None:
                picked = tf.math.unsorted_segment_sum(
                    tf.transpose(modes, [1, 2, 3, 0]), tids_t, num_tracked + 1
                )[:num_tracked]
                values += [
                    tf.transpose(tf.cast(tf.math.real(picked), tf.float64)),
                    tf.transpose(tf.cast(tf.math.imag(picked), tf.float64)),
                ]
            return delta, values

        @tf.function(autograph=False)
        def field_moments(fw, delta):
            return _welford_update(fw, [tf.cast(delta, tf.float64)])

        return field_values, field_moments


def _acceptance(energy_error: np.ndarray) -> np.ndarray:
    """Metropolis acceptance probability ``min(1, exp(-energy error))`` (NaN -> 0)."""
    lar = np.where(np.isnan(energy_error), -np.inf, -energy_error)
    return np.exp(np.minimum(lar, 0.0))


def _has(fo: ShardedFieldOutputs) -> bool:
    return fo.tracked is not None and len(fo.tracked) > 0
