"""``chees``: TFP's ChEES trajectory-length adaptation around HMC (>= 2 chains)."""

from __future__ import annotations

from typing import Literal

from fieldhmc.samplers.kinds.base import KindOptions, target_accept_field
from fieldhmc.samplers.kinds.families import MetropolisHmcKind


class CheesOptions(KindOptions):
    kind: Literal["chees"] = "chees"
    target_accept_prob: float | None = target_accept_field(0.65)


class Chees(MetropolisHmcKind):
    name = "chees"
    description = "ensemble trajectory-length adaptation (ChEES, >= 2 chains)"
    options = CheesOptions
    min_chains = 2
    tunes_own_metric = True
    inner_kernel_adapts = True

    def inner_kernel(self, target_log_prob_fn, options, *, step_size, num_adaptation_steps):
        import tensorflow_probability as tfp

        inner = tfp.mcmc.HamiltonianMonteCarlo(
            target_log_prob_fn, step_size=step_size, num_leapfrog_steps=1
        )
        return tfp.experimental.mcmc.GradientBasedTrajectoryLengthAdaptation(
            inner, num_adaptation_steps=num_adaptation_steps
        )


KIND = Chees()
