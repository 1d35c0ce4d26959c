"""Kernel builders: HMC, NUTS, ChEES, our NUTS with step-size adaptation; MCLMC, MAMS.

Preconditioning is done by *whitening*, not by a momentum distribution: the
kernel runs on :math:`u = x / s` with the per-coordinate scale :math:`s = M^{-1/2}`
(a diagonal metric :math:`M`), whose target is
:math:`\\log p(s \\odot u)` (plus a constant Jacobian). An identity metric on
:math:`u` is the metric :math:`M` on :math:`x`, for every kernel alike -- TFP's
HMC, NUTS, the ChEES trajectory-length adaptation and our own NUTS. This also
side-steps a TFP 0.25 bug: ``tfp.experimental.mcmc.PreconditionedNoUTurnSampler``
keeps ``momentum_distribution`` outside ``self._parameters``, so wrapping it in
``DualAveragingStepSizeAdaptation`` (which rebuilds the inner kernel from
``parameters``) silently drops the mass matrix (see
``tests/samplers/test_kernels.py::test_tfp_pnuts_drops_its_metric_when_wrapped``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import tensorflow as tf
import tensorflow_probability as tfp
from tensorflow.python.ops import gen_stateless_random_ops_v2, random_ops_util
from tensorflow_probability.python.internal import samplers as tfp_samplers
from tensorflow_probability.python.mcmc import hmc as tfp_hmc
from tensorflow_probability.python.mcmc.internal import leapfrog_integrator as leapfrog_impl
from tensorflow_probability.python.mcmc.internal import util as mcmc_util

from fieldhmc.models.reduction import reduce_sum_float64, reduce_sum_squares_float64
from fieldhmc.samplers import threefry

__all__ = [
    "EndPointTap",
    "FieldHamiltonianMonteCarlo",
    "FrozenStepSize",
    "JitteredHamiltonianMonteCarlo",
    "StepStats",
    "dual_averaging_step_size",
    "expand_results",
    "kinetic_energy_change",
    "leapfrog",
    "slim_results",
    "metropolis_results",
    "metropolis_step_stats",
    "standard_normal",
    "whiten",
]

MAX_ENERGY_ERROR = 1000.0  # Stan's divergence threshold on the energy error


def whiten(
    target_log_prob_fn: Callable[..., tf.Tensor],
    scales: Sequence[tf.Tensor],
    reference: tf.Tensor,
    dtype: tf.DType,
    with_aux: bool = False,
) -> Callable[..., tf.Tensor]:
    """Target on whitened coordinates ``u = x / scale``, shifted and cast.

    Parameters
    ----------
    target_log_prob_fn : callable
        ``(*x_parts) -> log p`` with a leading chain axis, in float64 (so that a
        sum of millions of float32 terms keeps its last digits).
    scales : sequence of Tensor
        Per-part scales broadcasting against each part (``M^{-1/2}``).
    reference : Tensor
        ``[chains]`` float64 offset subtracted before the cast to ``dtype``: the
        Metropolis ratio needs differences of log densities of order 1 whose
        absolute values are of order N; float32 keeps them once the offset (the
        log density at the start of the chunk) is removed.
    dtype : tf.DType
        The state dtype; the returned log density has it too (TFP requires it).
    with_aux : bool
        ``target_log_prob_fn`` returns ``(log p, aux)``; so does the whitened target
        (``aux`` as it is).
    """

    def fn(*u_parts):
        x_parts = [u * s for u, s in zip(u_parts, scales, strict=True)]
        out = target_log_prob_fn(*x_parts)
        lp, aux = out if with_aux else (out, None)
        lp = tf.cast(tf.cast(lp, tf.float64) - reference, dtype)
        return (lp, aux) if with_aux else lp

    return fn


@tf.autograph.experimental.do_not_convert
def standard_normal(shape, seed, dtype: tf.DType = tf.float32) -> tf.Tensor:
    r"""Standard-normal draws by inversion of 24 random bits per value (float32).

    .. math:: z = \pm\, \Phi^{-1}(p), \qquad p = (2k + 1)\, 2^{-25}, \quad
              k \in \{0, \dots, 2^{23} - 1\},

    with :math:`k` 23 bits and the sign one more bit of one 32-bit Philox word, so
    :math:`p \in (0, 1/2)` is exact in float32: the draws are the normal quantiles of
    :math:`2^{24}` equally likely levels, exactly symmetric (largest :math:`|z|` = 5.42).
    ``tf.math.ndtri`` is Cephes' in eager mode (relative error below 1e-6) and
    :math:`\sqrt 2\, \mathrm{erf}^{-1}(2p - 1)` under XLA (below 6e-6, both against
    float64; ``tests/samplers/test_kernels.py``). Under XLA:CPU this costs about half of
    ``tf.random.stateless_normal`` (Box--Muller: a logarithm, a sine and a cosine per
    pair), which cost about two gradients of the Gaussian model once per HMC transition
    (measurements in ``benchmarks/README.md``, ``scaling.py``). Other dtypes take TFP
    HMC's own draw
    (``tfp.random``'s ``samplers.normal``), so float64 runs are unchanged.

    A static shape ``[..., n1, n2]`` of rank >= 3 with :math:`4 \mid n_1 n_2` is drawn
    one ``[n1, n2]`` slab at a time (``tf.map_fn``; each slab's Philox counter starts
    :math:`n_1 n_2 / 4` blocks further), with the same values as one draw of the whole
    shape: under XLA neither the 32-bit words nor the inverse-CDF intermediates exist
    at full size (each was another field per chain), nor the counters that XLA hoists
    out of the sampling loop (0.75 field per chain for the whole chunk). Eagerly, Eigen's
    scalar and vector ``ndtri`` may differ in the last bit at slab ends.

    Parameters
    ----------
    shape : sequence of int or int Tensor
    seed : int Tensor [2]
        Stateless seed.
    dtype : tf.DType
        float32 (inversion) or float64 (TFP's draw).

    Returns
    -------
    tf.Tensor
        ``shape`` of ``dtype``.
    """
    dtype = tf.as_dtype(dtype)
    if dtype != tf.float32:
        return tfp_samplers.normal(shape, dtype=dtype, seed=seed)  # TFP HMC's own draw
    key, counter, alg = random_ops_util.get_key_counter_alg(seed, "philox")
    static = tf.get_static_value(tf.convert_to_tensor(shape, tf.int32))
    if static is None or len(static) < 3 or (int(static[-2]) * int(static[-1])) % 4:
        return threefry.normal_of_bits(_philox_bits(shape, key, counter, alg, 0))
    rows, size = math.prod(static[:-2].tolist()), int(static[-2]) * int(static[-1])

    def slab(i):
        return threefry.normal_of_bits(_philox_bits([size], key, counter, alg, i * (size // 4)))

    z = tf.map_fn(slab, tf.range(rows, dtype=tf.int64), fn_output_signature=tf.float32)
    return tf.reshape(z, static)


@tf.autograph.experimental.do_not_convert
def _philox_bits(shape, key, counter, alg, skip) -> tf.Tensor:
    """Philox words of ``tf.random.stateless_uniform(..., dtype=tf.uint32)`` starting
    ``skip`` 128-bit blocks (4 words each) into its stream: the low 64 bits of the
    counter advance by ``skip``, with the carry into the high 64 bits."""
    skip = tf.cast(skip, tf.uint64)
    low = counter[0] + skip
    high = counter[1] + tf.cast(low < counter[0], tf.uint64)
    return gen_stateless_random_ops_v2.stateless_random_uniform_full_int_v2(
        shape, key, tf.stack([low, high]), alg, dtype=tf.uint32
    )


def kinetic_energy_change(initial_momentum, final_momentum) -> tf.Tensor:
    r""":math:`\tfrac12 \sum p_0^2 - \tfrac12 \sum p_1^2` per chain, in float64.

    TFP 0.25's HMC (``hmc._compute_log_acceptance_correction``) takes the two sums of
    squares in the state dtype: at 256³ each is :math:`\approx 8 \times 10^6`, where the
    float32 spacing is 1, so the Metropolis log ratio is off by up to ~0.5 (by ~4 at
    512³). Here each sum is taken on its own, exactly per term
    (:func:`fieldhmc.models.reduction.reduce_sum_squares_float64`: the square of a
    float32 value is exact in float64), so the difference carries only float64 rounding
    (:math:`\sim 10^{-8}` at 512³). Each sum needs one momentum only: under XLA the
    initial one is reduced right after the draw, and the initial momentum is not kept
    alive through the trajectory (one field per chain less at the compiled step's
    peak than forming :math:`(p_0 - p_1)(p_0 + p_1)` at its end). Parts of at most
    :data:`MIN_SEPARATE_SUM_SIZE` coordinates per chain (scalars, small vectors) keep
    the terms :math:`(p_0 - p_1)(p_0 + p_1)` reduced in float64, so the draws of such
    states are unchanged.

    Parameters
    ----------
    initial_momentum, final_momentum : sequence of tf.Tensor
        Momentum parts ``[chains, ...]``.

    Returns
    -------
    tf.Tensor
        ``[chains]`` in the momenta's dtype.
    """
    return _kinetic_energy_change(initial_momentum, final_momentum, None)


#: Momentum parts with more coordinates per chain than this are summed on their own
#: (:func:`kinetic_energy_change`); smaller ones, whose initial momentum costs nothing to
#: keep, as :math:`(p_0 - p_1)(p_0 + p_1)` (the draws of such states are unchanged).
MIN_SEPARATE_SUM_SIZE = 4096


def _is_large(p) -> bool:
    return p.shape[1:].is_fully_defined() and math.prod(p.shape[1:]) > MIN_SEPARATE_SUM_SIZE


def _kinetic_float64(momentum_parts) -> tf.Tensor | float:
    """Sum of the squared large momentum parts per chain, in float64 (``[chains, ...]``)."""
    return sum(
        reduce_sum_squares_float64(p, event_ndims=p.shape.rank - 1)
        for p in momentum_parts
        if _is_large(p)
    )


def _kinetic_energy_change(initial_momentum, final_momentum, initial_sum) -> tf.Tensor:
    """:func:`kinetic_energy_change` given ``_kinetic_float64(initial_momentum)`` (or None)."""
    if initial_sum is None:
        initial_sum = _kinetic_float64(initial_momentum)
    total = 0.0
    for p0, p1 in zip(initial_momentum, final_momentum, strict=True):
        if not _is_large(p0):
            terms = (p0 - p1) * (p0 + p1)
            total = total + reduce_sum_float64(terms, event_ndims=terms.shape.rank - 1)
    if any(_is_large(p) for p in initial_momentum):
        total = total + (initial_sum - _kinetic_float64(final_momentum))
    return tf.cast(0.5 * total, initial_momentum[0].dtype)


def leapfrog(
    target_fn, step_sizes, num_steps, momentum_parts, state_parts, target, grad_parts
) -> tuple[list, list, tf.Tensor, list]:
    """TFP 0.25's ``SimpleLeapfrogIntegrator`` (the same operations in the same order)
    with its last step out of the ``tf.while_loop``: the target's last evaluation, at
    the proposal, is traced in the caller's graph, where an :class:`EndPointTap` can
    hand on what it computed (the driver's field outputs read the proposal's field
    there instead of transforming the new state again). ``num_steps >= 1``.

    Returns ``(momentum, state, target, grads)`` at the trajectory's end, as TFP's.
    """
    with tf.name_scope("leapfrog_integrate"):
        return _leapfrog(
            target_fn, step_sizes, num_steps, momentum_parts, state_parts, target, grad_parts
        )


def _leapfrog(target_fn, step_sizes, num_steps, momentum_parts, state_parts, target, grad_parts):
    [momentum_parts, state_parts, target, grad_parts] = leapfrog_impl.process_args(
        target_fn, momentum_parts, state_parts, target, grad_parts
    )

    def velocity(half_momentum_parts):
        return half_momentum_parts

    def one_step(*args):
        return leapfrog_impl._one_step(target_fn, step_sizes, velocity, *args)

    half = [
        v + leapfrog_impl._multiply(0.5 * eps, g, dtype=v.dtype)
        for v, eps, g in zip(momentum_parts, step_sizes, grad_parts, strict=True)
    ]
    _, half, state_parts, target, grad_parts = tf.while_loop(
        cond=lambda i, *_: i < num_steps - 1,
        body=lambda i, *args: [i + 1, *one_step(*args)],
        loop_vars=[tf.zeros_like(num_steps, name="iter"), half, state_parts, target, grad_parts],
    )
    half, state_parts, target, grad_parts = one_step(half, state_parts, target, grad_parts)
    momentum = [
        v - leapfrog_impl._multiply(0.5 * eps, g, dtype=v.dtype)
        for v, eps, g in zip(half, step_sizes, grad_parts, strict=True)
    ]
    return momentum, state_parts, target, grad_parts


class EndPointTap:
    """A target ``(*parts) -> (log p, aux)`` called as ``(*parts) -> log p``, which keeps
    the ``aux`` of its last evaluation.

    A kernel built on it evaluates it as usual; after the kernel's ``one_step``,
    :meth:`read` gives the ``aux`` of the step's last evaluation if that was traced in
    the caller's graph (for :class:`FieldHamiltonianMonteCarlo`, the proposal's:
    :func:`leapfrog`), else None (an evaluation inside a loop's or a conditional's own
    graph cannot be read outside it).
    """

    def __init__(self, target_fn: Callable[..., tuple[tf.Tensor, tf.Tensor]]):
        self.target_fn = target_fn
        self._aux = None

    def __call__(self, *parts):
        lp, self._aux = self.target_fn(*parts)
        return lp

    def read(self):
        aux = self._aux
        if aux is None or tf.executing_eagerly():
            return aux
        return aux if aux.graph is tf.compat.v1.get_default_graph() else None


class _FieldUncalibratedHMC(tfp.mcmc.UncalibratedHamiltonianMonteCarlo):
    """TFP 0.25's uncalibrated HMC step with, for float32 states, :func:`standard_normal`
    momenta and the kinetic energy change of :func:`kinetic_energy_change`; otherwise
    TFP's code (``UncalibratedHamiltonianMonteCarlo.one_step``, without shard axes), and
    exactly TFP's step for float64 states. Its integrator is :func:`leapfrog` (TFP's, the
    last step out of the loop), so ``num_leapfrog_steps`` must be at least 1."""

    def one_step(self, current_state, previous_kernel_results, seed=None):
        with tf.name_scope(mcmc_util.make_name(self.name, "hmc", "one_step")):
            if self._store_parameters_in_results:
                step_size = previous_kernel_results.step_size
                num_leapfrog_steps = previous_kernel_results.num_leapfrog_steps
            else:
                step_size = self.step_size
                num_leapfrog_steps = self.num_leapfrog_steps
            [state_parts, step_sizes, target_log_prob, grad_parts] = tfp_hmc._prepare_args(
                self.target_log_prob_fn,
                current_state,
                step_size,
                previous_kernel_results.target_log_prob,
                previous_kernel_results.grads_target_log_prob,
                maybe_expand=True,
                state_gradients_are_stopped=self.state_gradients_are_stopped,
            )
            seed = tfp_samplers.sanitize_seed(seed)
            seeds = list(tfp_samplers.split_seed(seed, n=len(state_parts)))
            momentum_parts = [
                standard_normal(tf.shape(x), s, x.dtype)
                for s, x in zip(seeds, state_parts, strict=True)
            ]
            is_float32 = all(x.dtype == tf.float32 for x in state_parts)
            initial_target_log_prob = target_log_prob
            if is_float32 and any(_is_large(p) for p in momentum_parts):
                initial_kinetic = _kinetic_float64(momentum_parts)
                # A data dependency of the trajectory on the initial kinetic energy (adds
                # an exact zero: the draws are bounded, so it is finite): XLA then sums
                # it before the leapfrog loop and frees the initial momentum, instead of
                # fusing the sum with the final one after the loop (one field per chain
                # live through the whole trajectory).
                initial_target_log_prob += tf.cast(0.0 * initial_kinetic, target_log_prob.dtype)
            next_momentum, next_state, next_target_log_prob, next_grads = leapfrog(
                self.target_log_prob_fn,
                step_sizes,
                num_leapfrog_steps,
                momentum_parts,
                state_parts,
                initial_target_log_prob,
                grad_parts,
            )
            if self.state_gradients_are_stopped:
                next_state = [tf.stop_gradient(x) for x in next_state]
            if is_float32:
                correction = _kinetic_energy_change(
                    momentum_parts,
                    next_momentum,
                    initial_kinetic if any(_is_large(p) for p in momentum_parts) else None,
                )
            else:  # float64 sums already: TFP's, so float64 draws stay bit-identical
                correction = tfp_hmc._compute_log_acceptance_correction(
                    momentum_parts, next_momentum, tf.rank(target_log_prob)
                )
            results = previous_kernel_results._replace(
                log_acceptance_correction=correction,
                target_log_prob=next_target_log_prob,
                grads_target_log_prob=next_grads,
                initial_momentum=momentum_parts,
                final_momentum=next_momentum,
                seed=seed,
            )
            is_list = mcmc_util.is_list_like(current_state)
            return (next_state if is_list else next_state[0]), results


class FieldHamiltonianMonteCarlo(tfp.mcmc.HamiltonianMonteCarlo):
    """``tfp.mcmc.HamiltonianMonteCarlo`` whose inner step is :class:`_FieldUncalibratedHMC`:
    float32 momenta by inversion (:func:`standard_normal`) and the Metropolis kinetic
    term summed in float64 (:func:`kinetic_energy_change`). Same arguments, results
    and wrappers as TFP's kernel."""

    def __init__(self, target_log_prob_fn, step_size, num_leapfrog_steps, **kwargs):
        if isinstance(num_leapfrog_steps, int) and num_leapfrog_steps < 1:
            raise ValueError(f"num_leapfrog_steps must be >= 1, got {num_leapfrog_steps}")
        super().__init__(target_log_prob_fn, step_size, num_leapfrog_steps, **kwargs)
        inner = self._impl.inner_kernel
        self._impl = tfp.mcmc.MetropolisHastings(
            inner_kernel=_FieldUncalibratedHMC(**inner.parameters)
        )


class JitteredHamiltonianMonteCarlo(FieldHamiltonianMonteCarlo):
    """HMC whose number of leapfrog steps is drawn uniformly from ``[1, L]`` per step.

    The draw is shared by all chains of the batch (one while-loop) and is made from
    the step's own seed, so runs stay reproducible. TFP's HMC reads the number of
    steps from the kernel results (``store_parameters_in_results=True``), which is
    where this kernel puts the draw.
    """

    def __init__(self, target_log_prob_fn, step_size, num_leapfrog_steps, **kwargs):
        # TFP wrappers re-create kernels from ``parameters``: accept all of HMC's.
        kwargs["store_parameters_in_results"] = True
        super().__init__(
            target_log_prob_fn,
            step_size=step_size,
            num_leapfrog_steps=num_leapfrog_steps,
            **kwargs,
        )

    def one_step(self, current_state, previous_kernel_results, seed=None):
        draw_seed, seed = tfp.random.split_seed(seed)
        num_steps = tf.random.stateless_uniform(
            [], draw_seed, minval=1, maxval=self.num_leapfrog_steps + 1, dtype=tf.int32
        )
        accepted = previous_kernel_results.accepted_results._replace(num_leapfrog_steps=num_steps)
        previous_kernel_results = previous_kernel_results._replace(accepted_results=accepted)
        return super().one_step(current_state, previous_kernel_results, seed=seed)


class FrozenStepSize(tfp.mcmc.TransitionKernel):
    """A ``DualAveragingStepSizeAdaptation`` kernel after its adaptation, without it.

    Once its ``num_adaptation_steps`` are done, TFP's wrapper still computes the
    dual-averaging update every transition and then discards it (``tf.where`` on the
    step count keeps ``new_step_size`` and ``log_averaging_step``), except the running
    ``error_sum``, which nothing reads after adaptation. This kernel does what the
    wrapper's transition then amounts to: set the inner kernel's step size to the
    results' ``new_step_size``, step the inner kernel with the same seed, count the step.
    Same results structure, bit-identical draws, step sizes and statistics;
    ``error_sum`` keeps its end-of-warm-up value. The driver's post-warm-up program
    runs it (:meth:`fieldhmc.samplers.kinds.SamplerKind.sampling_kernel`).

    Parameters
    ----------
    adaptive_kernel : tfp.mcmc.DualAveragingStepSizeAdaptation
        Its results (``bootstrap_results``) and inner kernel are used.
    """

    def __init__(self, adaptive_kernel):
        self._adaptive = adaptive_kernel
        self._parameters = {"adaptive_kernel": adaptive_kernel}

    @property
    def parameters(self):
        return self._parameters

    @property
    def inner_kernel(self):
        return self._adaptive.inner_kernel

    @property
    def is_calibrated(self) -> bool:
        return self._adaptive.is_calibrated

    def bootstrap_results(self, init_state):
        return self._adaptive.bootstrap_results(init_state)

    def one_step(self, current_state, previous_kernel_results, seed=None):
        r = previous_kernel_results
        inner = self._adaptive.step_size_setter_fn(r.inner_results, r.new_step_size)
        kwargs = {} if seed is None else {"seed": seed}
        state, inner = self._adaptive.inner_kernel.one_step(current_state, inner, **kwargs)
        return state, r._replace(inner_results=inner, step=r.step + 1)


class StepStats(NamedTuple):
    """Per-step, per-chain statistics in Stan's vocabulary (before the offset is added)."""

    target_log_prob: tf.Tensor  # shifted (see whiten), state dtype
    acceptance_rate: tf.Tensor
    is_accepted: tf.Tensor
    diverging: tf.Tensor
    energy: tf.Tensor  # H = -log p + K, Stan's sign, with the shifted log p
    step_size: tf.Tensor
    n_steps: tf.Tensor  # gradient evaluations this step
    tree_depth: tf.Tensor  # 0 for fixed-length kinds
    energy_error: tf.Tensor  # H(end) - H(start) of the proposal; NaN for the NUTS kinds


def _kinetic(momentum_parts) -> tf.Tensor:
    """Unit kinetic energy per chain; for float32 the float64 sum of
    :func:`kinetic_energy_change`, which XLA then computes once for both."""
    if all(p.dtype == tf.float32 for p in momentum_parts) and all(map(_is_large, momentum_parts)):
        return tf.cast(0.5 * _kinetic_float64(momentum_parts), tf.float32)
    return sum(
        0.5 * tf.reduce_sum(tf.square(p), axis=tf.range(1, tf.rank(p))) for p in momentum_parts
    )


def dual_averaging_step_size(results) -> tf.Tensor:
    """The step size ``DualAveragingStepSizeAdaptation`` uses next (first part's)."""
    step_size = results.new_step_size
    return step_size[0] if isinstance(step_size, (list, tuple)) else step_size


def metropolis_step_stats(results, previous_target_log_prob: tf.Tensor) -> StepStats:
    """:class:`StepStats` of dual-averaged HMC with TFP's Metropolis-Hastings results.

    The energy is :math:`-\\log p(x_{t-1}) + K(p_0)` at the start of the trajectory
    with the unit kinetic energy of the whitened coordinates. Divergence is an energy
    error above :data:`MAX_ENERGY_ERROR` (Stan's rule) or a non-finite ratio.
    """
    step_size = dual_averaging_step_size(results)
    mh = metropolis_results(results)
    lp = mh.accepted_results.target_log_prob
    chains = tf.shape(lp)[0]
    lar = mh.log_accept_ratio
    accept = tf.exp(
        tf.minimum(tf.where(tf.math.is_nan(lar), -tf.constant(float("inf"), lar.dtype), lar), 0.0)
    )
    proposed = mh.proposed_results
    energy = -previous_target_log_prob + _kinetic(proposed.initial_momentum)
    diverging = tf.logical_or(~tf.math.is_finite(lar), lar < -MAX_ENERGY_ERROR)
    n_steps = tf.cast(proposed.num_leapfrog_steps, tf.int32)
    return StepStats(
        target_log_prob=lp,
        acceptance_rate=accept,
        is_accepted=mh.is_accepted,
        diverging=diverging,
        energy=energy,
        step_size=tf.broadcast_to(tf.cast(step_size, lp.dtype), [chains]),
        n_steps=tf.broadcast_to(n_steps, [chains]),
        tree_depth=tf.zeros([chains], tf.int32),
        energy_error=-lar,
    )


def metropolis_results(results):
    """The Metropolis-Hastings results nested inside wrapper results (HMC kinds)."""
    while not hasattr(results, "accepted_results"):
        results = results.inner_results
    return results


def _map_metropolis(results, fn):
    """Apply ``fn`` to the Metropolis-Hastings results inside wrapper results, if any."""
    if hasattr(results, "accepted_results"):
        return fn(results)
    if hasattr(results, "inner_results"):
        return results._replace(inner_results=_map_metropolis(results.inner_results, fn))
    return results  # NUTS kinds, microcanonical kinds: nothing the next step skips


def _placeholder(t):
    """A scalar zero in place of a field-sized tensor (rank >= 2: ``[chains, ...]``)."""
    if t is None or not hasattr(t, "shape") or t.shape.rank is None or t.shape.rank < 2:
        return t
    return tf.zeros([], t.dtype)


def slim_results(results):
    """Kernel results without the field-sized members the next step never reads.

    TFP's Metropolis-Hastings results (the HMC kinds: ``hmc``, ``chees``, ``snaper``)
    carry, per chain, the proposed state, the proposal's gradient and both momenta,
    and the accepted momenta, besides the accepted gradient: seven state-sized
    tensors of which the next ``one_step`` reads only the gradient
    (``MetropolisHastings.one_step`` reads ``accepted_results`` alone, and
    ``UncalibratedHamiltonianMonteCarlo.one_step`` reads its ``target_log_prob``,
    ``grads_target_log_prob``, ``step_size`` and ``num_leapfrog_steps``; the accepted
    momenta only enter a ``choose`` whose result is dropped again). Carried through
    the compiled chunk's loop, passed in and returned, and checkpointed, they were
    ~12 field-sized buffers per chain. Here every tensor of rank >= 2 in
    ``proposed_state``, ``proposed_results`` and the accepted momenta becomes a scalar
    zero (rank-1 ``[chains]`` members stay, so ``target_log_prob`` shifts still
    apply); :func:`expand_results` restores the shapes ``one_step`` needs. Per-step
    statistics (:func:`step_stats`) are taken from the full results before slimming.
    Draws are unchanged: nothing the next step reads is dropped.
    """

    def slim(mh):
        acc = mh.accepted_results
        updates = {
            name: tf.nest.map_structure(_placeholder, getattr(acc, name))
            for name in ("initial_momentum", "final_momentum")
            if hasattr(acc, name)
        }
        return mh._replace(
            accepted_results=acc._replace(**updates),
            proposed_state=tf.nest.map_structure(_placeholder, mh.proposed_state),
            proposed_results=tf.nest.map_structure(_placeholder, mh.proposed_results),
        )

    return _map_metropolis(results, slim)


def expand_results(results):
    """Inverse of :func:`slim_results` for ``one_step``: accepted momenta alias the gradient.

    The values are never read (see :func:`slim_results`); they only need the shapes
    of the state parts for TFP's ``choose`` between proposed and accepted results.
    The proposed members stay placeholders: ``one_step`` does not read them.
    """

    def expand(mh):
        acc = mh.accepted_results
        grads = acc.grads_target_log_prob
        updates = {
            name: list(grads) if isinstance(grads, (list, tuple)) else grads
            for name in ("initial_momentum", "final_momentum")
            if hasattr(acc, name)
        }
        return mh._replace(accepted_results=acc._replace(**updates))

    return _map_metropolis(results, expand)


def shift_target_log_prob(results, delta: tf.Tensor):
    """Add ``delta`` to every ``target_log_prob`` field in a nest of kernel results.

    Used when the float64 reference offset of :func:`whiten` changes between
    chunks, so the results stay consistent with the new shifted target.
    """
    if hasattr(results, "_fields"):
        updates = {}
        for name in results._fields:
            value = getattr(results, name)
            if name == "target_log_prob" and value is not None:
                updates[name] = value + tf.cast(delta, value.dtype)
            elif hasattr(value, "_fields"):
                updates[name] = shift_target_log_prob(value, delta)
        return results._replace(**updates)
    return results
