"""Priors of the power-spectrum hyperparameters (``log_amplitude``, ``index``).

Sampled hyperparameters are unconstrained reals with Normal priors; a
hyperparameter without a prior is fixed at the power spectrum's fiducial value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from fieldhmc.models.power import HYPERPARAMETER_NAMES

__all__ = ["NormalPrior", "check_hyper_priors"]


@dataclasses.dataclass(frozen=True)
class NormalPrior:
    """:math:`\\theta \\sim \\mathcal N(\\mathrm{loc}, \\mathrm{scale}^2)`.

    Parameters
    ----------
    loc : float
        Mean (units of the hyperparameter: ``log_amplitude`` is
        :math:`\\ln[P(k_p) / (\\mathrm{Mpc}/h)^3]`, ``index`` is dimensionless).
    scale : float
        Standard deviation, > 0.
    """

    loc: float
    scale: float

    def __post_init__(self):
        loc, scale = float(self.loc), float(self.scale)
        if not math.isfinite(loc):
            raise ValueError(f"prior loc must be finite, got {loc}")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"prior scale must be positive and finite, got {scale}")
        object.__setattr__(self, "loc", loc)
        object.__setattr__(self, "scale", scale)

    def log_prob(self, value: float) -> float:
        """Log density (NumPy/Python float64)."""
        z = (value - self.loc) / self.scale
        return -0.5 * z * z - math.log(self.scale) - 0.5 * math.log(2.0 * math.pi)


def check_hyper_priors(
    hyper_priors: Mapping[str, NormalPrior | tuple[float, float]] | None,
) -> dict[str, NormalPrior]:
    """Validate ``{name: NormalPrior or (loc, scale)}``; return them in sampling order.

    Raises
    ------
    ValueError
        For a name other than ``"log_amplitude"`` / ``"index"`` or a bad prior.
    """
    if not hyper_priors:
        return {}
    unknown = set(hyper_priors) - set(HYPERPARAMETER_NAMES)
    if unknown:
        raise ValueError(
            f"unknown hyperparameter(s) {sorted(unknown)}; expected a subset of "
            f"{HYPERPARAMETER_NAMES}"
        )
    out = {}
    for name in HYPERPARAMETER_NAMES:
        if name in hyper_priors:
            prior = hyper_priors[name]
            if not isinstance(prior, NormalPrior):
                try:
                    loc, scale = prior
                except (TypeError, ValueError) as err:
                    raise ValueError(
                        f"prior of {name} must be a NormalPrior or (loc, scale), got {prior!r}"
                    ) from err
                prior = NormalPrior(loc, scale)
            out[name] = prior
    return out
