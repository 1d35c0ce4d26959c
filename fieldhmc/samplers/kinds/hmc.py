"""``hmc``: TFP's HMC, fixed or jittered trajectory length, dual-averaged step size."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fieldhmc.samplers.kinds.base import KindOptions, count, target_accept_field
from fieldhmc.samplers.kinds.families import MetropolisHmcKind


class HmcOptions(KindOptions):
    kind: Literal["hmc"] = "hmc"
    num_leapfrog_steps: int = count(16, "Leapfrog steps per trajectory (>= 1).", ge=1)
    jitter_leapfrog: bool = Field(
        False,
        strict=True,
        description="Draw the leapfrog count uniformly in [1, num_leapfrog_steps].",
    )
    target_accept_prob: float | None = target_accept_field(0.65)


class Hmc(MetropolisHmcKind):
    name = "hmc"
    description = "fixed-length HMC (optionally jittered)"
    options = HmcOptions
    runs_on_mesh = True
    field_at_proposal = True  # FieldHamiltonianMonteCarlo's leapfrog ends outside its loop
    mesh_note = (
        "hmc, the configured Fourier-diagonal metric as a map of the latent, fixed or "
        "jittered leapfrog steps, step size adapted in warm-up by TFP's dual averaging "
        "around the mesh transition (fieldhmc.samplers.sharded)"
    )

    def mesh_description(self, section):
        if section.preconditioner != "diagonal":
            return self.mesh_note
        return self.mesh_note.replace(
            "the configured Fourier-diagonal metric as a map of the latent",
            "the windowed diagonal metric as per-element scales of the latent",
        )

    def inner_kernel(self, target_log_prob_fn, options, *, step_size, num_adaptation_steps):
        from fieldhmc.samplers.kernels import (
            FieldHamiltonianMonteCarlo,
            JitteredHamiltonianMonteCarlo,
        )

        if options["jitter_leapfrog"]:
            return JitteredHamiltonianMonteCarlo(
                target_log_prob_fn,
                step_size=step_size,
                num_leapfrog_steps=options["num_leapfrog_steps"],
            )
        return FieldHamiltonianMonteCarlo(
            target_log_prob_fn,
            step_size=step_size,
            num_leapfrog_steps=options["num_leapfrog_steps"],
            store_parameters_in_results=True,
        )

    def gradients_per_transition(self, settings) -> float:
        n = settings.num_leapfrog_steps
        return (n + 1) / 2 if settings.jitter_leapfrog else float(n)


KIND = Hmc()
