"""``snaper``: TFP's SNAPER-HMC, trajectory length and a diagonal mass matrix adapted
across chains (>= 2 chains). Its inner kernel adapts a metric of its own, so the
energy of its statistics (unit kinetic energy of the whitened coordinates) and its
E-BFMI are approximate."""

from __future__ import annotations

from typing import Literal

from fieldhmc.samplers.kinds.base import KindOptions, target_accept_field
from fieldhmc.samplers.kinds.families import MetropolisHmcKind


class SnaperOptions(KindOptions):
    kind: Literal["snaper"] = "snaper"
    target_accept_prob: float | None = target_accept_field(0.65)


class Snaper(MetropolisHmcKind):
    name = "snaper"
    description = "ensemble trajectory-length and metric adaptation (SNAPER, >= 2 chains)"
    options = SnaperOptions
    min_chains = 2
    tunes_own_metric = True
    inner_kernel_adapts = True

    def inner_kernel(self, target_log_prob_fn, options, *, step_size, num_adaptation_steps):
        import tensorflow_probability as tfp

        return tfp.experimental.mcmc.SNAPERHamiltonianMonteCarlo(
            target_log_prob_fn,
            step_size=step_size,
            num_adaptation_steps=num_adaptation_steps,
            num_mala_steps=min(100, num_adaptation_steps // 4),
        )


KIND = Snaper()
