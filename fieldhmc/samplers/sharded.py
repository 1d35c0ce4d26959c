"""HMC with the state sharded over a DTensor mesh, run by the chunked driver.

Each device holds its x-slab of the position, the momentum and the gradient;
the log density and the kinetic energy are global float64 sums. The transition is
plain Metropolis-adjusted HMC (leapfrog, identity metric, a fixed number of steps,
one Metropolis test per chain) written with ops DTensor can shard, compiled once
with ``tf.function`` (DTensor programs are not XLA-compiled); the driver adapts its
step size during warm-up by TFP's ``DualAveragingStepSizeAdaptation`` (the single-device
``hmc``'s), run eagerly on the replicated scalars between the compiled transitions.

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

**Sharding-invariant random numbers**: the momenta and Metropolis uniforms are
counter-based (:mod:`fieldhmc.samplers.counter_random`), so the draws do not depend
on the mesh and a resumed run replays an uninterrupted one.

References
----------
1. Neal (2011), "MCMC using Hamiltonian dynamics", arXiv:1206.1901.
2. Hoffman & Gelman (2014), "The No-U-Turn Sampler", arXiv:1111.4246 (dual averaging).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from tensorflow.experimental import dtensor

from fieldhmc.mesh_support import mesh_support
from fieldhmc.ops import sharded
from fieldhmc.samplers.counter_random import (
    ACCEPT_HMC,
    JITTER,
    MOMENTUM,
    base_key,
    global_index,
    index_normal,
    scalar_part_indices,
    seed_int,
    splitmix64,
    step_key,
    uniform53,
)
from fieldhmc.samplers.driver import (
    STAT_NAMES,
    Sampler,
    SamplerSettings,
    _RunState,
    _welford_update,
    _zero_welford,
    field_stats_every,
)
from fieldhmc.samplers.kernels import MAX_ENERGY_ERROR
from fieldhmc.samplers.kinds import default_target_accept_prob
from fieldhmc.samplers.kinds.families import MicrocanonicalKind
from fieldhmc.samplers.reductions import host as _host
from fieldhmc.samplers.reductions import replicate as _replicate
from fieldhmc.samplers.sharded_mclmc import ShardedMicrocanonical

__all__ = [
    "ShardedFieldOutputs",
    "ShardedHMCResult",
    "ShardedHMCResults",
    "MeshChunkRunner",
    "ShardedSampler",
    "ShardedWindowedHMCResults",
    "make_hmc_transition",
    "run_sharded_hmc",
]


def make_hmc_transition(
    value_and_gradients_fn: Callable[[list], tuple[tf.Tensor, list]],
    shape: tuple[int, ...],
    dtype: tf.DType,
    *,
    num_leapfrog_steps: int,
    mesh: dtensor.Mesh | None = None,
    jitter_leapfrog: bool = False,
    num_scalar_parts: int = 0,
) -> Callable:
    """One compiled Metropolis-adjusted HMC transition on a (possibly sharded) state.

    The state is a list of parts: ``num_scalar_parts`` tensors ``[chains]`` (replicated
    on the mesh: sampled hyperparameters), then the field ``shape``. Kinetic energies are
    float64 sums over every part; each part's momenta are counter-based normals of their
    own global indices (the field's ``[0, chains N)``, then ``chains`` more per scalar
    part), so they do not depend on the mesh and the field's draws do not depend on the
    scalar parts.

    Parameters
    ----------
    value_and_gradients_fn : callable
        ``parts -> (log p float64 [chains], [grad like part, ...])``.
    shape : tuple of int
        The field's ``(chains, n0, n1, n2)``.
    dtype : tf.DType
        State dtype.
    num_leapfrog_steps : int
        Leapfrog steps (unrolled in the compiled transition).
    mesh : dtensor.Mesh, optional
        The state's mesh (None for plain tensors).
    jitter_leapfrog : bool
        Return the transition for a count given per call (the jittered HMC of
        :class:`fieldhmc.samplers.kernels.JitteredHamiltonianMonteCarlo`): one compiled
        leapfrog step called ``num_steps`` times, its last ``num_steps`` argument.
    num_scalar_parts : int
        Parts ``[chains]`` before the field.

    Returns
    -------
    callable
        ``one_step(parts, lp, grads, step_size, momentum_base, accept_base, step
        [, num_steps], scales=None) -> (parts, lp, grads, energy, energy_error,
        is_accepted)``: ``step_size`` a scalar of ``dtype``, the two bases uint64 scalars
        (:func:`~fieldhmc.samplers.counter_random.base_key`), ``step`` int64;
        ``energy`` is :math:`-\\log p(x_{t-1}) + K(p_0)`, ``energy_error``
        :math:`H_1 - H_0`, both float64 ``[chains]``. ``scales`` (a tensor per part,
        broadcasting against it) is a diagonal metric :math:`M^{-1/2}`: the dynamics of
        :math:`u = x / \\mathrm{scale}` written in :math:`x` (drift
        :math:`\\epsilon\\,\\mathrm{scale}\\,p`, kick :math:`\\epsilon\\,\\mathrm{scale}\\,
        \\nabla_x \\log p`), so the carried gradient stays that of :math:`x`.
    """
    if num_leapfrog_steps < 1:
        raise ValueError(f"num_leapfrog_steps must be >= 1, got {num_leapfrog_steps}")
    shape = tuple(int(n) for n in shape)
    chains = shape[0]
    chain_index = _replicate(np.arange(chains, dtype=np.uint64), mesh)
    indices = [*scalar_part_indices(shape, num_scalar_parts, mesh), global_index(shape, mesh)]

    def kinetic(ps):
        # the field's sum first: without scalar parts the energy is what it always was
        total = 0.5 * tf.reduce_sum(tf.square(tf.cast(ps[-1], tf.float64)), axis=[1, 2, 3])
        for p in ps[:-1]:
            total = total + 0.5 * tf.square(tf.cast(p, tf.float64))
        return total

    def scaled(vs, scales):
        return vs if scales is None else [v * sc for v, sc in zip(vs, scales, strict=True)]

    def select(accept, new, old):
        return [
            tf.where(tf.reshape(accept, [chains] + [1] * (n.shape.rank - 1)), n, o)
            for n, o in zip(new, old, strict=True)
        ]

    # The transition in three pieces, written once: unrolled into one compiled function
    # for a fixed count, called from Python per leapfrog step for a jittered one.
    def begin(lp, grads, step_size, momentum_base, step, scales):
        eps = tf.cast(step_size, dtype)
        key = step_key(momentum_base, step)
        ps = [index_normal(index, key, dtype) for index in indices]
        h0 = -lp + kinetic(ps)
        kicks = scaled(grads, scales)
        return [p + (0.5 * eps) * g for p, g in zip(ps, kicks, strict=True)], h0  # half kick

    def leapfrog(xs, ps, step_size, is_last: bool, scales):
        eps = tf.cast(step_size, dtype)
        xs = [x + eps * p for x, p in zip(xs, scaled(ps, scales), strict=True)]
        lp, gs = value_and_gradients_fn(xs)
        kick = (0.5 * eps) if is_last else eps
        return xs, [p + kick * g for p, g in zip(ps, scaled(gs, scales), strict=True)], lp, gs

    def end(xs, lp, grads, xn, pn, lpn, gn, h0, accept_base, step):
        h1 = -lpn + kinetic(pn)
        uniform = uniform53(splitmix64(step_key(accept_base, step) + chain_index))
        log_u = tf.math.log(1.0 - uniform)
        energy_error = h1 - h0
        accept = log_u < -tf.where(tf.math.is_finite(energy_error), energy_error, np.inf)
        return (
            select(accept, xn, xs),
            tf.where(accept, lpn, lp),
            select(accept, gn, grads),
            h0,
            energy_error,
            accept,
        )

    @tf.function(autograph=False)
    def one_step(xs, lp, grads, step_size, momentum_base, accept_base, step, scales=None):
        pn, h0 = begin(lp, grads, step_size, momentum_base, step, scales)
        xn, gn, lpn = xs, grads, lp
        for i in range(num_leapfrog_steps):
            xn, pn, lpn, gn = leapfrog(xn, pn, step_size, i == num_leapfrog_steps - 1, scales)
        return end(xs, lp, grads, xn, pn, lpn, gn, h0, accept_base, step)

    if not jitter_leapfrog:
        return one_step

    compile_fn = functools.partial(tf.function, autograph=False)
    begin_c, end_c = compile_fn(begin), compile_fn(end)
    kick = compile_fn(lambda xs, ps, eps, sc=None: leapfrog(xs, ps, eps, False, sc))
    last_kick = compile_fn(lambda xs, ps, eps, sc=None: leapfrog(xs, ps, eps, True, sc))

    def jittered_step(
        xs, lp, grads, step_size, momentum_base, accept_base, step, num_steps, scales=None
    ):
        pn, h0 = begin_c(lp, grads, step_size, momentum_base, step, scales)
        xn = xs
        for i in range(num_steps):
            xn, pn, lpn, gn = (last_kick if i == num_steps - 1 else kick)(xn, pn, step_size, scales)
        return end_c(xs, lp, grads, xn, pn, lpn, gn, h0, accept_base, step)

    return jittered_step


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

    def value_and_gradients(parts):
        lp, grad = value_and_gradient_fn(parts[0])
        return lp, [grad]

    one_step = make_hmc_transition(
        value_and_gradients, shape, dtype, num_leapfrog_steps=num_leapfrog_steps, mesh=mesh
    )
    eps = _replicate(tf.constant(step_size, dtype), mesh)
    bases = base_key(seed, MOMENTUM), base_key(seed, ACCEPT_HMC)
    xs = [init_state]
    lp, grads = tf.function(value_and_gradients, autograph=False)(xs)
    lps, accepts, records = [], [], []
    for t in range(num_burnin_steps + num_results):
        xs, lp, grads, _, _, accept = one_step(xs, lp, grads, eps, *bases, tf.constant(t, tf.int64))
        if t >= num_burnin_steps:
            lps.append(_host(lp))
            accepts.append(_host(accept))
            if record_fn is not None:
                records.append(record_fn(xs[0]))
    return ShardedHMCResult(xs[0], np.stack(lps), np.stack(accepts), records)


# --- the driver's sharded sampler -------------------------------------------------------------
class ShardedHMCResults(NamedTuple):
    """Kernel results the sharded chunk carries (and the checkpoint stores).

    Attributes
    ----------
    target_log_prob : tf.Tensor
        float64 ``[chains]`` (replicated) at the current state.
    grad_target_log_prob : list of tf.Tensor
        Its gradient per part (the field's ``[chains, *grid]`` in slabs).
    new_step_size : tf.Tensor
        Scalar: the leapfrog step the next transition uses (TFP's name).
    error_sum, log_averaging_step : tf.Tensor
        float64 scalars: the dual-averaging state (TFP's
        ``DualAveragingStepSizeAdaptationResults`` names).
    """

    target_log_prob: tf.Tensor
    grad_target_log_prob: tf.Tensor
    new_step_size: tf.Tensor
    error_sum: tf.Tensor
    log_averaging_step: tf.Tensor


class ShardedWindowedHMCResults(NamedTuple):
    """:class:`ShardedHMCResults` of a run adapting a diagonal metric in windows, plus
    where the step-size adaptation last restarted (each window end restarts TFP's dual
    averaging, as the single-device driver's ``_update_metric`` does).

    Attributes
    ----------
    adaptation_start : tf.Tensor
        float64 scalar: the global step of the last restart (0: none yet).
    shrink_step_size : tf.Tensor
        float64 scalar: the step size the restart started from (TFP's shrinkage target is
        ten times it).
    """

    target_log_prob: tf.Tensor
    grad_target_log_prob: tf.Tensor
    new_step_size: tf.Tensor
    error_sum: tf.Tensor
    log_averaging_step: tf.Tensor
    adaptation_start: tf.Tensor
    shrink_step_size: tf.Tensor


class _MeshHMCResults(NamedTuple):
    """What TFP's dual averaging sees of a mesh HMC transition (replicated scalars as
    plain host tensors)."""

    target_log_prob: tf.Tensor
    grad_target_log_prob: tf.Tensor
    log_accept_ratio: tf.Tensor
    step_size: tf.Tensor
    energy: tf.Tensor = None
    energy_error: tf.Tensor = None
    is_accepted: np.ndarray = None
    num_leapfrog_steps: int = 0


class _MeshHMC(tfp.mcmc.TransitionKernel):
    """:func:`make_hmc_transition` as a TFP kernel, for TFP's step-size adaptation
    (``seed``: the global step, which keys the counter-based draws). With
    ``jitter_base`` the number of leapfrog steps is drawn per transition, uniform on
    ``[1, num_leapfrog_steps]`` as ``JitteredHamiltonianMonteCarlo`` draws it."""

    def __init__(
        self,
        one_step_fn,
        momentum_base,
        accept_base,
        jitter_base=None,
        num_leapfrog_steps=0,
        scales=None,
    ):
        self._one_step_fn = one_step_fn
        self._bases = momentum_base, accept_base
        self._jitter = jitter_base, num_leapfrog_steps
        # the windowed diagonal metric (a tensor per part), passed only when adapted
        self._metric = {} if scales is None else {"scales": scales}
        self._parameters = dict(
            one_step_fn=one_step_fn,
            momentum_base=momentum_base,
            accept_base=accept_base,
            jitter_base=jitter_base,
            num_leapfrog_steps=num_leapfrog_steps,
            scales=scales,
        )

    @property
    def parameters(self):
        return self._parameters

    @property
    def is_calibrated(self) -> bool:
        return True

    def bootstrap_results(self, init_state):
        raise NotImplementedError("the mesh chunk builds the results from its carry")

    def one_step(self, current_state, previous_kernel_results, seed=None):
        r = previous_kernel_results
        eps = r.step_size
        step = tf.constant(seed, tf.int64)
        jitter_base, num_leapfrog_steps = self._jitter
        extra = ()
        if jitter_base is not None:
            u = float(uniform53(splitmix64(step_key(jitter_base, step))))
            extra = (1 + min(int(u * num_leapfrog_steps), num_leapfrog_steps - 1),)
        x, lp, grad, energy, energy_error, accepted = self._one_step_fn(
            current_state,
            r.target_log_prob,
            r.grad_target_log_prob,
            tf.cast(eps, current_state[-1].dtype),
            *self._bases,
            step,
            *extra,
            **self._metric,
        )
        ee = tf.constant(_host(energy_error))
        num_steps = extra[0] if extra else num_leapfrog_steps
        results = _MeshHMCResults(lp, grad, -ee, eps, energy, ee, _host(accepted), num_steps)
        return x, results


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


class ShardedSampler(Sampler):
    """The chunked driver running HMC, MCLMC or MAMS on a sharded field: a
    :class:`~fieldhmc.samplers.driver.Sampler` whose chunks a :class:`MeshChunkRunner`
    runs. Parameters as :class:`MeshChunkRunner`'s."""

    def __init__(
        self,
        target,
        settings: SamplerSettings,
        field_outputs: ShardedFieldOutputs | None = None,
        random: str = "counter",
    ):
        runner = MeshChunkRunner(target, settings, field_outputs, random)
        ones = [np.ones((), target.dtype.as_numpy_dtype)] * len(target.latent_names)
        super().__init__(target, settings, target.latent_names, ones, field_outputs, runner=runner)
        self.target = target
        self.mesh = target.mesh


class MeshChunkRunner:
    """The driver's chunks (:class:`~fieldhmc.samplers.driver.ChunkRunner`) for a state
    on a DTensor mesh.

    :meth:`~fieldhmc.samplers.driver.Sampler.run` is the driver's own (chunks,
    checkpoints, resume, trace and field sinks, progress,
    TensorBoard); the state lives on the mesh (:class:`_ShardedCarry`), a chunk loops
    over one compiled transition (module docs), and the log density is carried in
    float64, so the driver's re-centring offset is bookkeeping only. Checkpoints hold
    the gathered host arrays (the state, its gradient, the field moments; for mclmc / mams also the
    velocity, the host tuning state and, while the tuner still reads them, its
    weighted moments and recorded coordinates) and are re-sharded on resume.

    Parameters
    ----------
    target : fieldhmc.models.sharded.ShardedGaussianTarget
        The log density on the mesh (or on plain tensors, ``target.mesh = None``:
        the single-device reference).
    settings : SamplerSettings
        ``kind`` ``"hmc"``, ``"mclmc"`` or ``"mams"``. With
        sampled hyperparameters the state is the target's parts (``[chains]`` each before
        the field) and their model latents are traced as scalars, as on one device.
        ``hmc`` (fixed or jittered leapfrog count): :func:`make_hmc_transition`, the step
        size adapted during warm-up by dual averaging toward ``target_accept_prob`` (as the
        single-device ``hmc``: TFP's ``DualAveragingStepSizeAdaptation``),
        ``num_leapfrog_steps`` fixed (or, jittered, drawn per transition); with
        ``adapt_diagonal`` the driver's slow windows (:func:`~fieldhmc.samplers.driver.
        adaptation_windows`) estimate the per-element variance of the target's latent
        parts on the mesh (the field's in slabs), :func:`~fieldhmc.samplers.driver.
        windowed_scales` makes the metric of it at each window's end and the dual
        averaging restarts there (:meth:`restart_adaptation`), as on one device.
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
        reason = mesh_support(
            settings.kind,
            preconditioner="diagonal" if settings.adapt_diagonal else "identity",
            jitter_leapfrog=settings.jitter_leapfrog,
            step_size_jitter=settings.step_size_jitter,
            sampled_hyperparameters=bool(target.hyper_names),
        )
        if reason is not None:
            raise ValueError(reason)
        dtype = target.dtype
        self.settings = settings
        self.field_outputs = field_outputs
        self.target = target
        self.mesh = target.mesh
        self._shape = (settings.num_chains, *target.grid_shape)
        self._value_and_gradients = tf.function(target.value_and_gradients, autograph=False)
        self._micro = None
        if isinstance(settings.sampler_kind, MicrocanonicalKind):
            hyper = len(target.hyper_names)
            self._micro = ShardedMicrocanonical(
                settings.kind,
                target.value_and_gradients if hyper else target.value_and_gradient,
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
                num_scalar_parts=hyper,
            )
        else:
            if random != "counter":
                raise ValueError("random='philox' applies to kind mclmc / mams only")
            self._one_step = make_hmc_transition(
                target.value_and_gradients,
                self._shape,
                dtype,
                num_leapfrog_steps=settings.num_leapfrog_steps,
                mesh=self.mesh,
                jitter_leapfrog=settings.jitter_leapfrog,
                num_scalar_parts=len(target.hyper_names),
            )
        self._latent_moments = tf.function(
            lambda lw, x: _welford_update(lw, [tf.cast(p, tf.float64) for p in x]),
            autograph=False,
        )
        self._field_values = self._field_moments = None
        if field_outputs is not None:
            self._field_values, self._field_moments = self._make_field_stats()
        self.carry = self._carry = _ShardedCarry(self.mesh, target.grid_shape)
        self.chunk = self._run_chunk if self._micro is None else self._run_microcanonical_chunk

    # -- the ChunkRunner interface -----------------------------------------------------------
    def lp64(self, x_parts) -> tf.Tensor:
        """float64 ``[chains]`` at the carried state (carried, not recomputed)."""
        del x_parts
        return self._carry.read("results").target_log_prob

    def bootstrap(self, *args):
        """The results' structure (for packing a checkpoint's arrays)."""
        del args
        if self._micro is not None:
            return self._micro.template()
        grads = [0] * len(self.target.latent_names)
        if self.settings.adapt_diagonal:
            return ShardedWindowedHMCResults(0, grads, 0, 0, 0, 0, 0)
        return ShardedHMCResults(0, grads, 0, 0, 0)

    def scales_tensors(self, scales, dtype):
        """The windowed diagonal metric's scales on the mesh (``[1, ...]`` per part, the
        field's in slabs); None for the other metrics (maps of the target's latent)."""
        if not self.settings.adapt_diagonal:
            return None
        np_dtype = dtype.as_numpy_dtype
        return [self._carry.place(np.asarray(sc, np_dtype)[None]) for sc in scales]

    def restart_adaptation(self, rs: _RunState, scales: list[np.ndarray]) -> None:
        """A window's end (:meth:`Sampler._update_metric`): the new scales, and TFP's dual
        averaging restarted from the current step size for the rest of warm-up, as its
        bootstrap does on one device; the carried gradient (of the target's latent, not
        of the whitened one) needs no re-evaluation."""
        res = self._carry.read("results")
        step_size = np.asarray(_host(res.new_step_size), np.float64)
        zero = np.zeros((), np.float64)
        rs.scales, rs.scale_tensors = scales, None
        results = ShardedWindowedHMCResults(
            res.target_log_prob,
            list(res.grad_target_log_prob),
            step_size,
            zero,
            zero,
            np.asarray(rs.step, np.float64),
            step_size,
        )
        self._carry.load(results=results, lw=self._zero_latent_moments())

    def _zero_latent_moments(self):
        shapes = [self._shape[1:] if n == "field" else () for n in self.target.latent_names]
        return _zero_welford(shapes if self.settings.adapt_diagonal else [])

    def fresh_state(self, init_state: Sequence[np.ndarray]) -> _RunState:
        names = self.target.latent_names
        parts = [np.asarray(p) for p in init_state]
        if len(parts) != len(names):
            raise ValueError(f"initial state has {len(parts)} parts, expected {names}")
        np_dtype = self.target.dtype.as_numpy_dtype
        for name, p in zip(names, parts, strict=True):
            expected = self._shape if name == "field" else self._shape[:1]
            if p.shape != expected:
                raise ValueError(
                    f"initial state of {name!r} has shape {p.shape}, expected {expected}"
                )
            if not np.all(np.isfinite(p)):
                raise ValueError(f"initial state of {name!r} contains NaN or Inf")
        parts = [p.astype(np_dtype) for p in parts]
        xs = [self._carry.place(p) for p in parts]
        lp, grads = self._value_and_gradients(xs)
        reference = _host(lp)
        if not np.all(np.isfinite(reference)):
            raise ValueError("the log density is not finite at the initial state")
        fw = _zero_welford([self.target.grid_shape] if self.field_outputs else [()])
        if self._micro is not None:
            results = self._micro.bootstrap(xs, lp, list(grads), self._carry.place)
        else:
            zero = np.zeros((), np.float64)
            step_size = np.asarray(self.settings.step_size, np.float64)
            results = ShardedHMCResults(lp, list(grads), step_size, zero, zero)
            if self.settings.adapt_diagonal:
                results = ShardedWindowedHMCResults(*results, zero, step_size)
        self._carry.load(x=xs, results=results, fw=fw, lw=self._zero_latent_moments())
        # The identity metric of each part (the field's a view of its shape): what
        # tuned_parameters reads the dimension of the microcanonical kinds' step size from.
        ones = np.ones((), np_dtype)
        scales = [ones] * (len(parts) - 1) + [np.broadcast_to(ones, self.target.grid_shape)]
        return _RunState(step=0, scales=scales, reference=reference)

    def _run_chunk(self, scales, reference, delta, seed, start, num_steps, num_burnin):
        """``num_steps`` transitions from the carried state (as the driver's chunk)."""
        del reference, delta  # the log density is float64
        del num_burnin  # the mesh runs the fixed warm-up: settings.num_burnin_steps
        s = self.settings
        key = seed_int(seed.numpy())
        carry = self._carry
        x = list(carry.read("x"))
        res = carry.read("results")
        fw = carry.read("fw")
        lw = carry.read("lw")
        first = int(start.numpy())
        jitter = base_key(key, JITTER) if s.jitter_leapfrog else None
        inner = _MeshHMC(
            self._one_step,
            base_key(key, MOMENTUM),
            base_key(key, ACCEPT_HMC),
            jitter,
            s.num_leapfrog_steps,
            scales,  # None but for the windowed diagonal metric
        )
        # Where dual averaging last (re)started: 0 from s.step_size, or a window's end.
        restart, shrink = 0, s.step_size
        if s.adapt_diagonal:
            restart = int(_host(res.adaptation_start))
            shrink = float(_host(res.shrink_step_size))
        # TFP's dual averaging (as the single-device hmc's), run eagerly on the
        # replicated float64 scalars between the compiled mesh transitions.
        kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
            inner,
            num_adaptation_steps=s.num_burnin_steps - restart,
            target_accept_prob=tf.constant(
                s.target_accept_prob or default_target_accept_prob("hmc"), tf.float64
            ),
        )
        initial = tf.constant(shrink, tf.float64)
        chains = s.num_chains
        zeros = tf.zeros([chains], tf.float64)
        # TFP's own bootstrap from given inner results (no gradient evaluation; TFP
        # 0.25 keeps it a separate method for its windowed kernel), then the carried
        # adaptation state of this step.
        da = kernel._bootstrap_from_inner_results(
            x, _MeshHMCResults(res.target_log_prob, res.grad_target_log_prob, zeros, initial)
        )
        da = da._replace(
            step=tf.constant(first - restart, tf.int32),
            new_step_size=tf.constant(_host(res.new_step_size)),
            error_sum=[tf.constant(_host(res.error_sum))],
            log_averaging_step=[tf.constant(_host(res.log_averaging_step))],
        )
        names = ("lp", "energy", "energy_error", "is_accepted", "step_size", "n_steps")
        out = {name: [] for name in (*names, *self.target.hyper_names)}
        stats = {name: [] for name in self._field_names()}
        fields = []
        for i in range(int(num_steps.numpy())):
            step = first + i
            x, da = kernel.one_step(x, da, seed=step)
            r = da.inner_results
            values = [_host(v) for v in (r.target_log_prob, r.energy, r.energy_error)]
            values += [r.is_accepted, np.full(chains, float(r.step_size))]
            values.append(np.full(chains, r.num_leapfrog_steps, np.int32))
            for name, value in zip(names, values, strict=True):
                out[name].append(value)
            for name, value in zip(self.target.hyper_names, self._hyper_traces(x), strict=True):
                out[name].append(value)
            fw = self._field_step(x, fw, step, stats, fields)
            if s.adapt_diagonal and step < s.num_burnin_steps:  # the window's moments
                lw = self._latent_moments(lw, x)
        carry.assign("x", list(x))
        hyper = [da.new_step_size, da.error_sum[0], da.log_averaging_step[0]]
        r = da.inner_results
        results = ShardedHMCResults(
            r.target_log_prob,
            r.grad_target_log_prob,
            *(carry.place(np.asarray(_host(v), np.float64)) for v in hyper),
        )
        if s.adapt_diagonal:
            results = ShardedWindowedHMCResults(
                *results, res.adaptation_start, res.shrink_step_size
            )
        carry.assign("results", results)
        carry.assign("fw", fw)
        carry.assign("lw", lw)
        ee = np.stack(out["energy_error"])
        n = ee.shape[0]
        bufs = {
            "lp": np.stack(out["lp"]),
            "acceptance_rate": _acceptance(ee),
            "is_accepted": np.stack(out["is_accepted"]),
            "diverging": ~np.isfinite(ee) | (ee > MAX_ENERGY_ERROR),
            "energy": np.stack(out["energy"]),
            "step_size": np.stack(out["step_size"]),
            "n_steps": np.stack(out["n_steps"]),
            "tree_depth": np.zeros((n, chains), np.int32),
            "energy_error": ee,
        }
        bufs.update({name: np.stack(out[name]) for name in self.target.hyper_names})
        return self._chunk_outputs(bufs, stats, fields)

    def _hyper_traces(self, parts) -> list[np.ndarray]:
        """float64 ``[chains]`` of each hyperparameter's model latent (the single-device
        driver traces its parts ``[chains]`` as scalars)."""
        u = self.target.hyperparameters([tf.constant(_host(p)) for p in parts[:-1]])
        return [np.asarray(u[name], np.float64) for name in self.target.hyper_names]

    def _run_microcanonical_chunk(
        self, scales, reference, delta, seed, start, num_steps, num_burnin
    ):
        """``num_steps`` MCLMC / MAMS transitions from the carried state (as the driver's
        chunk): the tuner runs on the host between the compiled transitions."""
        del scales, reference, delta  # identity metric; the log density is float64
        del num_burnin  # the mesh runs the fixed warm-up: settings.num_burnin_steps
        carry = self._carry
        chain = self._micro.start(carry.read("x"), carry.read("results"), seed.numpy())
        fw = carry.read("fw")
        hypers = self.target.hyper_names
        out = {name: [] for name in (*STAT_NAMES, *hypers)}
        stats = {name: [] for name in self._field_names()}
        fields = []
        first = int(start.numpy())
        for i in range(int(num_steps.numpy())):
            step = first + i
            values = self._micro.one_step(chain, step)
            values.update(zip(hypers, self._hyper_traces(chain.x), strict=True))
            for name, trace in out.items():
                trace.append(values[name])
            fw = self._field_step(chain.x, fw, step, stats, fields)
        carry.assign("x", list(chain.x))
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
        is_moment = after >= 0 and after % field_stats_every(s, fo.store_fields) == 0
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
        def field_values(parts):
            delta = target.delta(parts)
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
