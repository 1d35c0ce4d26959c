"""``mams``: the Metropolis-adjusted microcanonical sampler (exact),
:mod:`fieldhmc.samplers.mclmc`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fieldhmc.samplers.kinds.base import KindOptions, target_accept_field
from fieldhmc.samplers.kinds.families import MicrocanonicalKind
from fieldhmc.samplers.kinds.mclmc import integrator_field, trajectory_length_field


class MamsOptions(KindOptions):
    kind: Literal["mams"] = "mams"
    trajectory_length: float = trajectory_length_field()
    integrator: Literal["minimal_norm", "leapfrog"] = integrator_field()
    target_accept_prob: float | None = target_accept_field(0.9)
    warmup_stop: Literal["converged", "fixed"] = Field(
        "converged",
        description="End warm-up when the tuner's estimates have converged (converged: "
        "each stage stops once its step size or variance estimate is stable, "
        "num_burnin_steps the maximum) or after num_burnin_steps transitions (fixed). "
        "A sharded (mesh) run always uses the fixed count.",
    )


class Mams(MicrocanonicalKind):
    name = "mams"
    description = "Metropolis-adjusted microcanonical sampler (exact; tunes step size and L itself)"
    options = MamsOptions
    default_target_accept_prob = 0.9  # arXiv:2503.01707
    mesh_note = (
        "mams, the configured Fourier-diagonal metric as a map of the latent, the "
        "integrator and staged tuner of fieldhmc.samplers.mclmc with mesh-wide float64 "
        "reductions (fieldhmc.samplers.sharded_mclmc)"
    )

    def kernel_class(self) -> type:
        from fieldhmc.samplers.mclmc import MetropolisAdjustedMicrocanonical

        return MetropolisAdjustedMicrocanonical

    def mean_integration_steps(self, step_size: float, trajectory_length: float) -> float:
        return max(trajectory_length / step_size, 1.0)


KIND = Mams()
