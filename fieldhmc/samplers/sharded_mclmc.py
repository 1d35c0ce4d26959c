r"""MCLMC and MAMS with the state sharded over a DTensor mesh (for the mesh chunk runner).

Nothing here is a second implementation of :mod:`fieldhmc.samplers.mclmc`: the
isokinetic integrator (:func:`~fieldhmc.samplers.mclmc.integrator_step`), the velocity
update and refresh, the integration-step count and both staged tuners
(``MicrocanonicalLangevin._tune`` / ``MetropolisAdjustedMicrocanonical._tune``, with
the autocorrelation time) are that module's, called

* with :func:`~fieldhmc.samplers.mclmc.dot64` as the reduction: every field-sized dot
  product is a global float64 sum (DTensor inserts the all-reduce);
* between compiled DTensor steps instead of inside one XLA program (DTensor programs
  are not XLA-compiled, and a DTensor ``tf.while_loop`` over the slab transforms
  segfaults TF 2.21, see :mod:`fieldhmc.samplers.sharded`): one compiled MCLMC
  transition, or for MAMS one compiled integrator step called :math:`N` times;
* with the tuners' scalar state in float64 tensors, run eagerly, and their three
  field-sized operations (:class:`~fieldhmc.samplers.mclmc.TunerFieldOps`) compiled
  for the mesh (:func:`mesh_field_ops`: the recorded coordinates are picked by a
  segment sum);
* with random numbers from a :class:`~fieldhmc.samplers.counter_random.CounterDraws`
  (mesh-invariant). :class:`PhiloxDraws` draws instead exactly what the single-device
  kernels draw (plain tensors only): with it the mesh path reproduces
  ``fieldhmc.samplers.mclmc`` run by the single-device driver, tuning included
  (float64, to rounding), which is how the mesh path is tested.

References
----------
.. [1] J. Robnik, G. B. De Luca, E. Silverstein and U. Seljak, "Microcanonical
   Hamiltonian Monte Carlo", JMLR 24 (2023), arXiv:2212.08549.
.. [2] J. Robnik, R. Cohn-Gordon and U. Seljak, "Metropolis adjusted microcanonical
   Hamiltonian Monte Carlo", arXiv:2503.01707 (2025).
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

from fieldhmc.samplers import kinds
from fieldhmc.samplers import mclmc as mc
from fieldhmc.samplers.counter_random import CounterDraws, global_index, seed_int
from fieldhmc.samplers.kinds.families import MicrocanonicalKind
from fieldhmc.samplers.reductions import host, replicate

__all__ = [
    "TUNING_NAMES",
    "PhiloxDraws",
    "ShardedMicrocanonical",
    "ShardedMicrocanonicalResults",
    "mesh_field_ops",
]

# The tuner's scalars (mclmc.MicrocanonicalTuning without its field-sized members).
TUNING_NAMES = mc.MicrocanonicalTuning._fields[:9]


class ShardedMicrocanonicalResults(NamedTuple):
    """What the mesh chunk carries between chunks (and the checkpoint stores).

    Attributes
    ----------
    target_log_prob : tf.Tensor
        float64 ``[chains]`` at the current state.
    grads_target_log_prob : list of tf.Tensor
        Its gradient per part (the field's ``[chains, *grid]`` in slabs).
    velocity : list of tf.Tensor or tf.Tensor
        MCLMC's unit velocity (jointly per chain) per part; a scalar for MAMS (which
        draws a fresh one every transition).
    step_size, trajectory_length : tf.Tensor
        float64 scalars :math:`\\epsilon`, :math:`L` (BlackJAX units) of the next
        transition.
    tuning : tf.Tensor
        float64 ``[9]``, the tuner's scalars (:data:`TUNING_NAMES`).
    mean, m2 : list of tf.Tensor
        Step-size-weighted per-chain moments per part (state dtype, the field's in slabs)
        while the moment stage can still use them, scalars afterwards.
    buffer : tf.Tensor
        float64 ``[n3, chains, K]`` recorded coordinates of stage 3 (a scalar after it).
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


class PhiloxDraws:
    """The single-device kernels' own draws (plain tensors only): the driver's
    ``stateless_fold_in(seed, step)`` split as ``MicrocanonicalLangevin.one_step`` and
    ``MetropolisAdjustedMicrocanonical.one_step`` split it.

    The draws are made by XLA-compiled functions, as in the single-device driver's
    chunk: XLA's uniforms are not TensorFlow's for the same seed. The algorithms are
    the kernels' (``mclmc._normal`` for refreshes, ``mclmc._rng_alg``: Threefry; the class and the
    ``random="philox"`` option keep the name of the one they used first).
    The ``noise`` of a normal is therefore the normal field itself.
    """

    def __init__(self, seed: tf.Tensor, shape: tuple[int, ...], dtype: tf.DType):
        self._seed = tf.convert_to_tensor(seed)
        self._shape = shape
        compile_fn = tf.function(jit_compile=True, autograph=False)
        self._normal = compile_fn(  # velocities: mc._unit_vector's draw
            lambda s: tf.random.stateless_normal(shape, seed=s, dtype=dtype, alg=mc._rng_alg())
        )
        self._refresh_normal = compile_fn(lambda s: mc._normal(shape, s, dtype))
        self._uniform = compile_fn(
            lambda s, n: tf.random.stateless_uniform(n, seed=s, dtype=dtype, alg=mc._rng_alg())
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

        self._seeds = compile_fn(seeds)
        self._first = compile_fn(
            lambda: tfp.random.split_seed(tf.constant([0, 0], tf.int32), n=1)[0]
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
        return self._refresh_normal(self._of(step, "refresh"))

    def nan_velocity(self, step: int) -> tf.Tensor:
        return self._normal(self._of(step, "nan"))

    def velocity(self, step: int) -> tf.Tensor:
        return self._normal(self._of(step, "velocity"))

    def length_uniform(self, step: int) -> tf.Tensor:
        return tf.cast(self._uniform(self._of(step, "length"), []), tf.float64)

    def accept_uniform(self, step: int) -> tf.Tensor:
        return tf.cast(self._uniform(self._of(step, "accept"), [self._shape[0]]), tf.float64)

    def normal(self, noise: tf.Tensor) -> tf.Tensor:
        return noise

    def normals(self, noise: tf.Tensor) -> list[tf.Tensor]:
        return [noise]


def _dropped(t) -> bool:
    """A field-sized tuner member the tuner no longer reads (stored as scalars)."""
    if t is None:
        return True
    return all(p.shape.rank == 0 for p in (t if isinstance(t, list | tuple) else [t]))


def mesh_field_ops(shape: tuple[int, ...], dtype: tf.DType, mesh, num_scalar_parts: int = 0):
    """The staged tuners' field-sized operations for a state of ``num_scalar_parts`` parts
    ``[chains]`` and a field ``[chains, n0, n1, n2]`` in x-slabs on ``mesh`` (or plain
    tensors): compiled DTensor functions called eagerly from ``_tune``, their scalar
    inputs and outputs plain float64 tensors. The moments and the buffer are skipped once
    the tuner dropped them (:meth:`ShardedMicrocanonical.one_step`) and the moments while
    their weight is zero (which changes nothing).

    Returns
    -------
    (TunerFieldOps, field_subset, K)
        The operations (``record`` picks ``mclmc._subset``'s coordinates of the parts
        concatenated per chain, scalars first), the compiled ``x -> [chains, K]`` pick of
        the field's recorded coordinates, and ``K``.
    """
    chains, n0, n1, n2 = shape
    m = int(num_scalar_parts)
    dim = m + n0 * n1 * n2
    k = min(dim, mc._ESS_COORDINATES)
    stride = max(1, dim // k)
    num_recorded = len(range(0, dim, stride)[:k])
    # the scalar parts' columns of the pick: part j is flat coordinate j of a chain
    scalar_columns = {j: j // stride for j in range(m) if j % stride == 0 and j // stride < k}

    @tf.function(autograph=False)
    def subset_ids(index):
        # flat index j * stride -> j (j < K), every other cell -> K: mclmc._subset's picks
        flat = tf.squeeze(tf.cast(index, tf.int64), axis=0) + m
        q = flat // stride
        keep = (flat % stride == 0) & (q < num_recorded)
        return tf.where(keep, tf.cast(q, tf.int32), tf.constant(num_recorded, tf.int32))

    ids = subset_ids(global_index((1, n0, n1, n2), mesh))

    @tf.function(autograph=False)
    def field_subset(x):
        picked = tf.math.unsorted_segment_sum(tf.transpose(x, [1, 2, 3, 0]), ids, k + 1)
        return tf.transpose(picked[:num_recorded])  # [chains, K]

    def subset(parts):
        """Host ``[chains, K]`` of the recorded coordinates of the parts (or the field)."""
        parts = [parts] if tf.is_tensor(parts) else list(parts)
        row = host(field_subset(parts[-1]))
        for j, column in scalar_columns.items():
            row[:, column] = host(parts[j])
        return row

    @tf.function(autograph=False)
    def update(means, m2s, xs, frac, weight):
        new_means, new_m2s = [], []
        for mean, m2, x in zip(means, m2s, xs, strict=True):
            d = x - mean
            new_mean = mean + tf.cast(frac, dtype) * d
            new_means.append(new_mean)
            new_m2s.append(m2 + tf.cast(weight, dtype) * d * (x - new_mean))
        return new_means, new_m2s

    @tf.function(autograph=False)
    def variance(means, m2s, w):
        # the field's sum first: without scalar parts the total is what it always was
        total = None
        for mean, m2 in zip(means[::-1], m2s[::-1], strict=True):
            within = tf.reduce_mean(tf.cast(m2, tf.float64), axis=0) / w
            between = tf.math.reduce_variance(tf.cast(mean, tf.float64), axis=0)
            part = tf.reduce_sum(within + between)
            total = part if total is None else total + part
        return total

    def moments(tuning, x, weight):
        total = tuning.weight + weight
        if _dropped(tuning.mean) or float(weight) == 0.0:
            return tuning._replace(weight=total)
        one = tf.ones_like(total)
        frac = tf.where(total > 0, weight / tf.where(total > 0, total, one), 0.0 * one)
        mean, m2 = update(list(tuning.mean), list(tuning.m2), list(x), frac, weight)
        return tuning._replace(weight=total, mean=mean, m2=m2)

    def total_variance(tuning):
        if _dropped(tuning.mean):
            return tf.constant(np.nan, tf.float64)
        w = tf.where(tuning.weight > 0, tuning.weight, tf.ones_like(tuning.weight))
        return tf.constant(host(variance(list(tuning.mean), list(tuning.m2), w)))

    def record(tuning, x, index):
        if _dropped(tuning.buffer):
            return tuning
        return mc.write_buffer_row(tuning, tf.constant(subset(x)), index)

    return mc.TunerFieldOps(moments, total_variance, record), field_subset, num_recorded


def _check_random(random: str, mesh, num_scalar_parts: int) -> None:
    if random not in ("counter", "philox"):
        raise ValueError(f"random must be 'counter' or 'philox', got {random!r}")
    if random == "philox" and mesh is not None:
        raise ValueError("random='philox' (the single-device kernels' draws) needs mesh=None")
    if random == "philox" and num_scalar_parts:
        raise ValueError("random='philox' draws the field alone (no scalar parts)")


def _of_parts(value_and_gradient_fn: Callable, num_scalar_parts: int) -> Callable:
    """``parts -> (lp, grads)``: the callable itself with scalar parts, else the field's
    ``x -> (lp, g)`` on the one-part list."""
    if num_scalar_parts:
        return value_and_gradient_fn

    def of_parts(parts):
        lp, g = value_and_gradient_fn(parts[0])
        return lp, [g]

    return of_parts


@dataclass
class _Chain:
    """A chunk's working state: device tensors and the tuner's float64 scalars."""

    x: list
    lp: tf.Tensor
    grad: list
    velocity: list | None
    eps: tf.Tensor
    length: tf.Tensor
    tuning: mc.MicrocanonicalTuning
    draws: object


class ShardedMicrocanonical:
    """The MCLMC / MAMS transition and staged tuner of :mod:`fieldhmc.samplers.mclmc` on
    a (possibly sharded) state: ``num_scalar_parts`` parts ``[chains]`` (sampled
    hyperparameters, replicated), then the field ``[chains, n0, n1, n2]``.

    Parameters
    ----------
    kind : {"mclmc", "mams"}
    value_and_gradient_fn : callable
        ``x -> (log p float64 [chains], grad like x)`` of the field alone; with
        ``num_scalar_parts`` ``parts -> (log p, [grad like part, ...])`` of the list.
    shape : tuple of int
        The field's ``(chains, n0, n1, n2)``.
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
        :class:`~fieldhmc.samplers.counter_random.CounterDraws` (mesh-invariant) or
        :class:`PhiloxDraws` (the single-device kernels' draws; ``mesh`` must be None,
        the field alone).
    num_scalar_parts : int
        Parts ``[chains]`` before the field.
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
        num_scalar_parts: int = 0,
    ):
        spec = kinds.get(kind)
        if not isinstance(spec, MicrocanonicalKind):
            raise ValueError(f"kind must be a microcanonical kind, got {kind!r}")
        _check_random(random, mesh, num_scalar_parts)
        self.kind = kind
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtype
        self.mesh = mesh
        self.random = random
        self.num_scalar_parts = int(num_scalar_parts)
        self.dim = math.prod(self.shape[1:]) + self.num_scalar_parts
        root_d = math.sqrt(self.dim)
        self.field_ops, self._subset_fn, self.num_recorded = mesh_field_ops(
            self.shape, dtype, mesh, self.num_scalar_parts
        )
        # The single-device kernel, for its tuner (_tune), stages and parameters; its
        # scalars are float64 here whatever the state dtype.
        self.kernel = spec.kernel_class()(
            None,
            step_size=tf.constant(step_size * root_d, tf.float64),
            trajectory_length=tf.constant(trajectory_length * root_d, tf.float64),
            num_adaptation_steps=int(num_adaptation_steps),
            integrator=integrator,
            desired_energy_var=desired_energy_var,
            target_accept_prob=target_accept_prob,
            field_ops=self.field_ops,
        )
        self._langevin = isinstance(self.kernel, mc.MicrocanonicalLangevin)  # unadjusted
        self.num_adaptation_steps = int(num_adaptation_steps)
        self.stage_ends = self.kernel.stage_ends
        self.gradients_per_step = self.kernel.gradients_per_step
        self.buffer_steps = max(self.stage_ends[2] - self.stage_ends[1], 1)
        self._vg = _of_parts(value_and_gradient_fn, self.num_scalar_parts)
        self._draws_template = (
            PhiloxDraws(np.zeros(2, np.int32), self.shape, dtype)
            if random == "philox"
            else CounterDraws(0, self.shape, dtype, mesh, self.num_scalar_parts)
        )
        self._compile(integrator)

    # -- compiled pieces ---------------------------------------------------------------------
    def _compile(self, integrator: str):
        integrate = mc.integrator_step(self._vg, integrator, self.dim, mc.dot64)

        # Normals of every part from a chunk's noise tensor: the template's (draws of
        # another seed share its global indices; the seed is in the noise).
        normals = self._draws_template.normals

        def unit(noise):
            return mc._normalize(normals(noise), mc.dot64)

        @tf.function(autograph=False)
        def mclmc_step(x, u, g, lp, eps, nu, noise):
            x1, u1, lp1, g1, dk = integrate(x, u, g, eps)
            u1 = mc.partial_refresh(u1, normals(noise), nu, mc.dot64)
            energy_change = dk - lp1 + lp
            finite = mc._all_finite(x1) & tf.math.is_finite(lp1)
            finite = finite & tf.math.is_finite(energy_change)
            return (
                mc._select(finite, x1, x),
                u1,
                mc._select(finite, g1, g),
                tf.where(finite, lp1, lp),
                tf.where(finite, energy_change, tf.zeros_like(energy_change)),
                finite,
            )

        @tf.function(autograph=False)
        def mams_integrate(x, u, g, eps, dk):
            x, u, lp, g, d = integrate(x, u, g, eps)
            return x, u, lp, g, dk + d

        @tf.function(autograph=False)
        def mams_finish(x, lp, lp0, dk):
            energy_change = dk - lp + lp0
            finite = mc._all_finite(x) & tf.math.is_finite(lp)
            return energy_change, finite & tf.math.is_finite(energy_change)

        @tf.function(autograph=False)
        def mams_select(accepted, x, x0, g, g0, lp, lp0):
            return (
                mc._select(accepted, x, x0),
                mc._select(accepted, g, g0),
                tf.where(accepted, lp, lp0),
            )

        self._unit_velocity = tf.function(unit, autograph=False)
        self._replace_velocity = tf.function(
            lambda u, finite, noise: mc._select(finite, u, unit(noise)), autograph=False
        )
        self._mclmc_step = mclmc_step
        self._mams_integrate = mams_integrate
        self._mams_finish = mams_finish
        self._mams_select = mams_select

    def _subset(self, x):
        """Stage 3's recorded field coordinates ``[chains, K]`` of the field ``x`` (==
        ``mclmc._subset`` without scalar parts)."""
        return self._subset_fn(x)

    def _draws(self, seed) -> object:
        """The draws of a run with the driver's ``seed`` (int32 ``[2]``)."""
        if self.random == "philox":
            return self._draws_template.with_seed(np.asarray(seed, np.int32))
        return self._draws_template.with_seed(seed_int(np.asarray(seed)))

    def _place(self, value):
        return replicate(tf.constant(value), self.mesh)

    # -- state -------------------------------------------------------------------------------
    @property
    def _part_shapes(self) -> list[tuple[int, ...]]:
        return [self.shape[:1]] * self.num_scalar_parts + [self.shape]

    def template(self) -> ShardedMicrocanonicalResults:
        """The results' structure (for packing a checkpoint's arrays)."""
        parts = [0] * len(self._part_shapes)
        return ShardedMicrocanonicalResults(
            0, parts, parts if self._langevin else 0, 0, 0, 0, parts, parts, 0
        )

    def bootstrap(self, x: list, lp: tf.Tensor, grad: list, place) -> ShardedMicrocanonicalResults:
        """Results at a fresh state (parts ``x`` and their gradients; ``place``: host array
        -> its layout on the mesh); the tuner's initial state is ``mclmc``'s bootstrap's."""
        zero = np.zeros((), self.dtype.as_numpy_dtype)
        if self._langevin:
            draws = self._draws(np.zeros(2, np.int32))
            velocity = self._unit_velocity(draws.initial_velocity())
        else:
            velocity = place(zero)
        eps = self.kernel.parameters["step_size"]
        tuning = dict.fromkeys(TUNING_NAMES, 0.0)
        tuning.update(
            step_size_max=math.inf,
            log_step_size=float(tf.math.log(eps)),
            da_step=1.0,
            mu=float(tf.math.log(10.0 * eps)),
        )
        adapting = self.num_adaptation_steps > 0
        moments_needed = adapting and self.stage_ends[1] - self.stage_ends[0] > 0
        moments = [np.zeros(sh, zero.dtype) if moments_needed else zero for sh in self._part_shapes]
        buffer = np.zeros((self.buffer_steps, self.shape[0], self.num_recorded))
        return ShardedMicrocanonicalResults(
            target_log_prob=lp,
            grads_target_log_prob=grad,
            velocity=velocity,
            step_size=place(eps.numpy()),
            trajectory_length=place(self.kernel.parameters["trajectory_length"].numpy()),
            tuning=place(np.array([tuning[n] for n in TUNING_NAMES], np.float64)),
            mean=[place(m) for m in moments],
            m2=[place(m) for m in moments],
            buffer=place(buffer if adapting else np.zeros((), np.float64)),
        )

    def start(self, x: list, results: ShardedMicrocanonicalResults, seed) -> _Chain:
        """A chunk's working state from the carried parts ``x`` and results."""
        scalars = [tf.constant(v) for v in host(results.tuning)]
        buffer = host(results.buffer)
        tuning = mc.MicrocanonicalTuning(
            *scalars,
            mean=list(results.mean),
            m2=list(results.m2),
            buffer=tf.constant(buffer),
        )
        return _Chain(
            x=list(x),
            lp=results.target_log_prob,
            grad=list(results.grads_target_log_prob),
            velocity=results.velocity if self._langevin else None,
            eps=tf.constant(host(results.step_size)),
            length=tf.constant(host(results.trajectory_length)),
            tuning=tuning,
            draws=self._draws(seed),
        )

    def results(self, chain: _Chain, place) -> ShardedMicrocanonicalResults:
        """The carried results of a chunk's final working state."""
        zero = np.zeros((), self.dtype.as_numpy_dtype)
        tun = chain.tuning

        def placed(parts):
            return [p if tf.is_tensor(p) else place(p) for p in parts]

        return ShardedMicrocanonicalResults(
            target_log_prob=chain.lp,
            grads_target_log_prob=chain.grad,
            velocity=chain.velocity if chain.velocity is not None else place(zero),
            step_size=place(chain.eps.numpy()),
            trajectory_length=place(chain.length.numpy()),
            tuning=place(np.array([float(getattr(tun, n)) for n in TUNING_NAMES], np.float64)),
            mean=placed(tun.mean),
            m2=placed(tun.m2),
            buffer=place(host(tun.buffer)),
        )

    # -- one transition ----------------------------------------------------------------------
    def one_step(self, chain: _Chain, step: int) -> dict:
        """Advance ``chain`` by the transition of global step ``step``; its statistics.

        Returns the per-chain traces of :func:`fieldhmc.samplers.kernels.step_stats` for
        the microcanonical kinds (``lp`` in float64, ``step_size`` as
        :math:`\\epsilon / \\sqrt d` after the tuner's update).
        """
        if self._langevin:
            stats, statistic, finite = self._mclmc(chain, step)
        else:
            stats, statistic, finite = self._mams(chain, step)
        if step < self.num_adaptation_steps:  # mclmc's _maybe_tune
            r = mc.MicrocanonicalResults(*[None] * len(mc.MicrocanonicalResults._fields))._replace(
                step=tf.constant(step, tf.int32),
                step_size=chain.eps,
                trajectory_length=chain.length,
                tuning=chain.tuning,
                # the scalar parts' gradients (the stiff-scalar step limit), plain tensors
                grads_target_log_prob=[
                    tf.constant(host(g)) if len(g.shape) == 1 else g for g in chain.grad
                ],
            )
            x = list(chain.x)
            chain.eps, chain.length, tuning = self.kernel._tune(r, x, statistic, finite, self.dim)
            zero = np.zeros((), self.dtype.as_numpy_dtype)
            if step >= self.stage_ends[1] - 1:  # the moments are not read again
                dropped = [self._place(zero) for _ in x]
                tuning = tuning._replace(mean=dropped, m2=list(dropped))
            if step >= self.stage_ends[2] - 1:
                tuning = tuning._replace(buffer=tf.zeros([], tf.float64))
            chain.tuning = tuning
        chains = self.shape[0]
        stats["step_size"] = np.full(chains, float(chain.eps) / math.sqrt(self.dim))
        stats["energy"] = np.full(chains, np.nan)
        stats["tree_depth"] = np.zeros(chains, np.int32)
        return stats

    def _mclmc(self, chain: _Chain, step: int):
        eps, d = chain.eps, chain.draws
        nu = mc.refresh_scale(eps, chain.length, self.dim)
        x, u, g, lp, energy_change, finite = self._mclmc_step(
            chain.x, chain.velocity, chain.grad, chain.lp, eps, nu, d.refresh(step)
        )
        finite_h = host(finite)
        if not finite_h.all():
            u = self._replace_velocity(u, finite, d.nan_velocity(step))
        chain.x, chain.velocity, chain.grad, chain.lp = x, u, g, lp
        ec = host(energy_change)
        chains = self.shape[0]
        stats = {
            "lp": host(lp),
            "acceptance_rate": np.full(chains, np.nan),
            "is_accepted": finite_h,
            "diverging": ~finite_h | (ec > mc.MAX_ENERGY_ERROR),
            "n_steps": np.full(chains, self.gradients_per_step, np.int32),
            "energy_error": ec,
        }
        return stats, tf.constant(ec), tf.constant(finite_h)

    def _mams(self, chain: _Chain, step: int):
        eps, d = chain.eps, chain.draws
        n = int(mc.num_integration_steps(chain.length / eps, d.length_uniform(step)))
        x, u, g = chain.x, self._unit_velocity(d.velocity(step)), chain.grad
        dk = replicate(tf.zeros([self.shape[0]], tf.float64), self.mesh)
        lp = chain.lp
        for _ in range(n):
            x, u, lp, g, dk = self._mams_integrate(x, u, g, eps, dk)
        energy_change, finite = self._mams_finish(x, lp, chain.lp, dk)
        ec, finite_t = tf.constant(host(energy_change)), tf.constant(host(finite))
        # mclmc.MetropolisAdjustedMicrocanonical.one_step's test, on the replicated scalars
        log_accept = tf.where(finite_t, -ec, tf.constant(-np.inf, tf.float64))
        accepted = tf.math.log(d.accept_uniform(step)) < log_accept
        chain.x, chain.grad, chain.lp = self._mams_select(
            replicate(accepted, self.mesh), x, chain.x, g, chain.grad, lp, chain.lp
        )
        accept_prob = tf.exp(tf.minimum(log_accept, 0.0))
        finite_h = finite_t.numpy()
        stats = {
            "lp": host(chain.lp),
            "acceptance_rate": accept_prob.numpy(),
            "is_accepted": accepted.numpy(),
            "diverging": ~finite_h | (ec.numpy() > mc.MAX_ENERGY_ERROR),
            "n_steps": np.full(self.shape[0], n * self.gradients_per_step, np.int32),
            "energy_error": tf.where(finite_t, ec, 0.0).numpy(),
        }
        return stats, accept_prob, finite_t
