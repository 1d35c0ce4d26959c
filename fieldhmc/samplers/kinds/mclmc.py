"""``mclmc``: unadjusted microcanonical Langevin MC (biased by design; the step size is
tuned to ``desired_energy_var``), :mod:`fieldhmc.samplers.mclmc`."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from fieldhmc.samplers.kinds.base import KindOptions, finite
from fieldhmc.samplers.kinds.families import MicrocanonicalKind

#: Field statistics (the field from the latents, its P(k), the tracked modes, the
#: running moments) cost about this many model gradients per transition ...
FIELD_STATS_GRADIENTS = 1.0
#: ... and may cost at most this fraction of a transition's gradients.
FIELD_STATS_BUDGET = 0.1


def trajectory_length_field():
    return finite(
        1.0, "Initial momentum decoherence length L / sqrt(d) (> 0), tuned during burn-in.", gt=0
    )


def integrator_field():
    return Field(
        "minimal_norm",
        description="Isokinetic integrator: minimal_norm (2nd-order McLachlan/Omelyan, 2 "
        "gradients per step, BlackJAX's default) or leapfrog.",
    )


class MclmcOptions(KindOptions):
    kind: Literal["mclmc"] = "mclmc"
    trajectory_length: float = trajectory_length_field()
    integrator: Literal["minimal_norm", "leapfrog"] = integrator_field()
    desired_energy_var: float = finite(
        5e-4,
        "Bias tolerance: the energy-error variance per dimension Var[dE]/d the step size "
        "is tuned to (> 0; BlackJAX's default 5e-4); for Gaussian targets it bounds the "
        "squared relative bias of the variances (arXiv:2412.08876).",
        gt=0,
        lt=1,
    )


class Mclmc(MicrocanonicalKind):
    name = "mclmc"
    description = (
        "unadjusted microcanonical Langevin MC (biased by design, step tuned to "
        "desired_energy_var; tunes step size and L itself)"
    )
    options = MclmcOptions
    is_adjusted = False
    stat_names = ("lp", "diverging", "step_size", "n_steps", "energy_error")
    mesh_note = (
        "mclmc, the configured Fourier-diagonal metric as a map of the latent, the "
        "integrator and staged tuner of fieldhmc.samplers.mclmc with mesh-wide float64 "
        "reductions (fieldhmc.samplers.sharded_mclmc)"
    )

    def kernel_class(self) -> type:
        from fieldhmc.samplers.mclmc import MicrocanonicalLangevin

        return MicrocanonicalLangevin

    def gradients_per_transition(self, settings) -> float:
        """One integrator step: 2 gradients (minimal norm) or 1 (leapfrog)."""
        return 2.0 if settings.integrator == "minimal_norm" else 1.0

    def field_stats_every(self, settings) -> int:
        """``ceil(FIELD_STATS_GRADIENTS / (FIELD_STATS_BUDGET * gradients per
        transition))``: 5 with the minimal-norm integrator, 10 with leapfrog."""
        gradients = self.gradients_per_transition(settings)
        return max(1, math.ceil(FIELD_STATS_GRADIENTS / (FIELD_STATS_BUDGET * gradients)))


KIND = Mclmc()
