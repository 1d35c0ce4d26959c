"""What kinds of one family share: dual-averaged step size, Metropolis-adjusted HMC
results, NUTS trees, the self-tuning microcanonical kernels.

TensorFlow is imported inside the methods (the config imports the kinds without it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from fieldhmc.samplers.kinds.base import SamplerKind

__all__ = ["DualAveragedKind", "MetropolisHmcKind", "MicrocanonicalKind", "NutsFamilyKind"]


class DualAveragedKind(SamplerKind):
    """``DualAveragingStepSizeAdaptation`` around the kind's :meth:`inner_kernel`."""

    default_target_accept_prob = 0.65
    #: The inner kernel adapts as well (ChEES, SNAPER): the post-warm-up program keeps
    #: the whole kernel, tuners and all.
    inner_kernel_adapts = False

    def inner_kernel(
        self,
        target_log_prob_fn: Callable[..., Any],
        options: Mapping[str, Any],
        *,
        step_size: Any,
        num_adaptation_steps: int,
    ) -> Any:
        raise NotImplementedError

    def build_kernel(
        self, target_log_prob_fn, options, *, step_size, num_adaptation_steps, dimension
    ):
        import tensorflow as tf
        import tensorflow_probability as tfp

        inner = self.inner_kernel(
            target_log_prob_fn,
            options,
            step_size=step_size,
            num_adaptation_steps=num_adaptation_steps,
        )
        dtype = step_size.dtype if hasattr(step_size, "dtype") else tf.float32
        return tfp.mcmc.DualAveragingStepSizeAdaptation(
            inner,
            num_adaptation_steps=num_adaptation_steps,
            target_accept_prob=tf.cast(self.target_accept(options), dtype),
        )

    def sampling_kernel(self, kernel):
        """:class:`~fieldhmc.samplers.kernels.FrozenStepSize` around the dual-averaging
        kernel (unless the inner kernel adapts too)."""
        if self.inner_kernel_adapts:
            return kernel
        from fieldhmc.samplers.kernels import FrozenStepSize

        return FrozenStepSize(kernel)

    def tuned_parameters(self, results, scales) -> dict[str, Any]:
        import numpy as np

        step = results.new_step_size
        step = step[0] if isinstance(step, (list, tuple)) else step
        return {"step_size": float(np.mean(np.asarray(step)))}


class MetropolisHmcKind(DualAveragedKind):
    """HMC proposals with TFP's Metropolis-Hastings results (``hmc``, ``chees``,
    ``snaper``): stats from the accepted and proposed results."""

    def step_stats(self, results, previous_target_log_prob):
        from fieldhmc.samplers.kernels import metropolis_step_stats

        return metropolis_step_stats(results, previous_target_log_prob)

    def target_log_prob_of(self, results):
        from fieldhmc.samplers.kernels import metropolis_results

        return metropolis_results(results).accepted_results.target_log_prob


class NutsFamilyKind(DualAveragedKind):
    """NUTS trees (``nuts``, ``fieldnuts``): energy, gradients, divergence and depth
    from the tree (:meth:`tree_stats`); no energy error of a single proposal."""

    mesh_refusal = (
        "its trajectory is a data-dependent tf.while_loop, and a DTensor while loop over the "
        "slab FFTs segfaults TensorFlow 2.21 (a host-driven tree is not implemented)"
    )

    default_target_accept_prob = 0.8
    stat_names = (*SamplerKind.stat_names, "tree_depth")

    def tree_stats(self, inner, target_log_prob) -> tuple[Any, Any, Any, Any]:
        """``(energy, n_steps, diverging, tree_depth)`` of the inner NUTS results."""
        raise NotImplementedError

    def step_stats(self, results, previous_target_log_prob):
        import tensorflow as tf

        from fieldhmc.samplers.kernels import StepStats, dual_averaging_step_size

        inner = results.inner_results
        lp = inner.target_log_prob
        chains = tf.shape(lp)[0]
        energy, n_steps, diverging, depth = self.tree_stats(inner, lp)
        step_size = dual_averaging_step_size(results)
        return StepStats(
            target_log_prob=lp,
            acceptance_rate=tf.exp(tf.minimum(inner.log_accept_ratio, 0.0)),
            is_accepted=tf.broadcast_to(inner.is_accepted, [chains]),
            diverging=diverging,
            energy=energy,
            step_size=tf.broadcast_to(tf.cast(step_size, lp.dtype), [chains]),
            n_steps=tf.broadcast_to(n_steps, [chains]),
            tree_depth=tf.broadcast_to(depth, [chains]),
            energy_error=tf.fill([chains], tf.constant(float("nan"), lp.dtype)),
        )

    def target_log_prob_of(self, results):
        return results.inner_results.target_log_prob


class MicrocanonicalKind(SamplerKind):
    """The isokinetic kernels of :mod:`fieldhmc.samplers.mclmc` (``mclmc``, ``mams``):
    they tune step size and ``L`` themselves (no wrapper, no windowed metric).

    ``step_size`` and ``trajectory_length`` are given in units of :math:`\\sqrt d`: the
    kernel starts at ``step_size * sqrt(d)`` and ``trajectory_length * sqrt(d)``, so that
    ``step_size`` reads like an HMC step (a step moves the whitened state by about
    ``step_size * sqrt(d)`` in both).
    """

    tunes_own_metric = True
    runs_on_mesh = True
    is_adjusted = True
    stat_names = ("lp", "acceptance_rate", "diverging", "step_size", "n_steps", "energy_error")

    def kernel_class(self) -> type:
        raise NotImplementedError

    def build_kernel(
        self, target_log_prob_fn, options, *, step_size, num_adaptation_steps, dimension
    ):
        extra = {}
        if "warmup_stop" in options:
            extra["warmup_stop"] = options["warmup_stop"]
        if "desired_energy_var" in options:
            extra["desired_energy_var"] = options["desired_energy_var"]
        if self.default_target_accept_prob is not None:
            extra["target_accept_prob"] = self.target_accept(options)
        root_d = math.sqrt(dimension)
        return self.kernel_class()(
            target_log_prob_fn,
            step_size=step_size * root_d,
            trajectory_length=options["trajectory_length"] * root_d,
            num_adaptation_steps=num_adaptation_steps,
            integrator=options["integrator"],
            **extra,
        )

    def sampling_kernel(self, kernel):
        """``kernel`` with no adaptation steps: the step size and ``L`` of the results,
        no tuning stages (their per-chain moments pass through untouched)."""
        return kernel.copy(num_adaptation_steps=0)

    def stops_warmup_early(self, options) -> bool:
        return options.get("warmup_stop") == "converged"

    def warmup_end(self, results):
        """``tuning.stage_start`` once the tuner's four stages are done, else -1."""
        import tensorflow as tf

        tuning = results.tuning
        return tf.where(tuning.stage >= 4, tuning.stage_start, -1)

    def step_stats(self, results, previous_target_log_prob):
        """Acceptance only for the adjusted kind (NaN otherwise), no Hamiltonian energy
        (E-BFMI does not apply to isokinetic dynamics); the step size as
        :math:`\\epsilon / \\sqrt d`."""
        import tensorflow as tf

        from fieldhmc.samplers.kernels import StepStats

        lp = results.target_log_prob
        chains = tf.shape(lp)[0]
        dim = sum(math.prod(g.shape[1:]) for g in results.grads_target_log_prob)
        nan = tf.fill([chains], tf.constant(float("nan"), lp.dtype))
        accept = tf.exp(tf.minimum(results.log_accept_ratio, 0.0)) if self.is_adjusted else nan
        return StepStats(
            target_log_prob=lp,
            acceptance_rate=accept,
            is_accepted=results.is_accepted,
            diverging=results.is_divergent,
            energy=nan,
            step_size=tf.fill([chains], results.step_size / math.sqrt(dim)),
            n_steps=tf.broadcast_to(results.num_gradient_evaluations, [chains]),
            tree_depth=tf.zeros([chains], tf.int32),
            energy_error=results.energy_change,
        )

    def target_log_prob_of(self, results):
        return results.target_log_prob

    def tuned_parameters(self, results, scales) -> dict[str, Any]:
        """:math:`\\epsilon / \\sqrt d` and :math:`L / \\sqrt d`, with the absolute
        (BlackJAX-unit) values alongside."""
        import numpy as np

        dim = sum(int(np.prod(np.shape(sc))) for sc in scales)
        eps = float(np.asarray(results.step_size))
        length = float(np.asarray(results.trajectory_length))
        return {
            "step_size": eps / math.sqrt(dim),
            "trajectory_length": length / math.sqrt(dim),
            "step_size_absolute": eps,
            "trajectory_length_absolute": length,
            "dimension": dim,
            "mean_integration_steps": self.mean_integration_steps(eps, length),
        }

    def mean_integration_steps(self, step_size: float, trajectory_length: float) -> float:
        """Integrator steps per transition at the tuned step size and ``L``."""
        return 1.0

    def summary_metadata(self, section) -> dict[str, Any]:
        return {
            "adjusted": self.is_adjusted,
            "bias_tolerance": getattr(section, "desired_energy_var", None),
        }
