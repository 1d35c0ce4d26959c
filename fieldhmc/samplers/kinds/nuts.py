"""``nuts``: TFP's NUTS (the pre-2019 U-turn check, see issue #7)."""

from __future__ import annotations

from typing import Literal

from fieldhmc.samplers.kinds.base import KindOptions, count, target_accept_field
from fieldhmc.samplers.kinds.families import NutsFamilyKind


def tree_depth_field():
    return count(10, "Maximum NUTS tree depth, 1..15.", ge=1, le=15)


class NutsOptions(KindOptions):
    kind: Literal["nuts"] = "nuts"
    max_tree_depth: int = tree_depth_field()
    target_accept_prob: float | None = target_accept_field(0.8)


class Nuts(NutsFamilyKind):
    name = "nuts"
    description = "TFP NUTS"
    options = NutsOptions

    def inner_kernel(self, target_log_prob_fn, options, *, step_size, num_adaptation_steps):
        import tensorflow_probability as tfp

        return tfp.mcmc.NoUTurnSampler(
            target_log_prob_fn, step_size=step_size, max_tree_depth=options["max_tree_depth"]
        )

    def tree_stats(self, inner, target_log_prob):
        """TFP reports -H as ``energy`` and no depth: the depth of a tree of n leapfrogs
        is ceil(log2(n + 1))."""
        import tensorflow as tf

        n_steps = tf.cast(inner.leapfrogs_taken, tf.int32)
        dtype = target_log_prob.dtype
        depth = tf.math.ceil(
            tf.math.log(tf.cast(n_steps, dtype) + 1.0) / tf.math.log(tf.constant(2.0, dtype))
        )
        return -inner.energy, n_steps, inner.has_divergence, tf.cast(depth, tf.int32)


KIND = Nuts()
