"""``fieldnuts``: fieldhmc's NUTS with Stan's corrected U-turn criterion
(:mod:`fieldhmc.samplers.nuts`), optionally with a jittered step size."""

from __future__ import annotations

from typing import Literal

from fieldhmc.samplers.kinds.base import KindOptions, finite, target_accept_field
from fieldhmc.samplers.kinds.families import NutsFamilyKind
from fieldhmc.samplers.kinds.nuts import tree_depth_field


class FieldNutsOptions(KindOptions):
    kind: Literal["fieldnuts"] = "fieldnuts"
    max_tree_depth: int = tree_depth_field()
    step_size_jitter: float = finite(
        0.0, "Relative step-size jitter per step, in [0, 1).", ge=0, lt=1
    )
    target_accept_prob: float | None = target_accept_field(0.8)


class FieldNuts(NutsFamilyKind):
    name = "fieldnuts"
    description = "fieldhmc's corrected NUTS"
    options = FieldNutsOptions

    def inner_kernel(self, target_log_prob_fn, options, *, step_size, num_adaptation_steps):
        from fieldhmc.samplers.nuts import NoUTurnSampler

        return NoUTurnSampler(
            target_log_prob_fn,
            step_size=step_size,
            max_tree_depth=options["max_tree_depth"],
            step_size_jitter=options["step_size_jitter"],
        )

    def tree_stats(self, inner, target_log_prob):
        import tensorflow as tf

        return (
            inner.energy,
            tf.cast(inner.num_leapfrog_steps, tf.int32),
            inner.is_divergent,
            tf.cast(inner.tree_depth, tf.int32),
        )


KIND = FieldNuts()
