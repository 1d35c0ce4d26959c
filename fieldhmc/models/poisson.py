"""Gaussian-field prior with lognormal-Poisson counts (a galaxy-count model).

.. math::

    \\rho_x = \\bar n\\, \\exp\\!\\left(\\mu_x - \\tfrac12 \\sigma^2_\\delta\\right),
    \\qquad c_x \\sim \\mathrm{Poisson}(m_x \\rho_x), \\qquad
    \\mu = F(\\delta) \\ (\\text{default } \\mu = \\delta),

with :math:`\\sigma^2_\\delta = \\frac1V\\sum_{k\\,\\text{full}} P(k)` the prior
variance of :math:`\\delta(x)` (so :math:`E[\\rho] = \\bar n` for the identity forward
model; it depends on the hyperparameters when they are sampled) and
:math:`m_x \\in [0, 1]` the completeness. The model is a
:class:`~fieldhmc.models.forward.ForwardFieldModel` with a
:class:`~fieldhmc.models.likelihoods.LognormalPoissonLikelihood` (which states how
the log-likelihood is evaluated in float64). The posterior has no closed form.

References
----------
1. Coles & Jones (1991), "A lognormal model for the cosmological mass distribution".
2. Kitaura, Jasche & Metcalf (2010), "Recovering the non-linear density field from
   the galaxy distribution with a Poisson-lognormal filter", arXiv:0911.1407.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from fieldhmc.models.forward import ForwardFieldModel
from fieldhmc.models.grid import Grid
from fieldhmc.models.likelihoods import LognormalPoissonLikelihood
from fieldhmc.models.power import PowerSpectrum
from fieldhmc.models.priors import NormalPrior

__all__ = ["LognormalPoissonModel"]


class LognormalPoissonModel(ForwardFieldModel):
    """Gaussian random field with lognormal-Poisson count data.

    Parameters
    ----------
    grid : Grid
    power : PowerSpectrum
    mean_density : float
        :math:`\\bar n > 0`, the mean number of objects per voxel (a physical number
        density times the cell volume ``V / N``).
    mask : array-like, optional
        Completeness ``grid_shape`` in ``[0, 1]``; 0 = unobserved.
    forward, forward_params, check_forward
        Forward model (default: the identity); see :class:`ForwardFieldModel`.
    parametrization, hyper_priors, dtype
        See :class:`~fieldhmc.models.FieldModel`.
    """

    def __init__(
        self,
        grid: Grid,
        power: PowerSpectrum,
        mean_density: float,
        mask=None,
        *,
        forward: Callable[..., tf.Tensor] | None = None,
        forward_params: Mapping[str, Any] | None = None,
        check_forward: bool | None = None,
        parametrization: str = "noncentred",
        hyper_priors: Mapping[str, NormalPrior | tuple[float, float]] | None = None,
        dtype: tf.DType = tf.float32,
    ):
        likelihood = LognormalPoissonLikelihood(grid, mean_density, mask)
        super().__init__(
            grid,
            power,
            likelihood,
            forward,
            forward_params,
            check_forward=check_forward,
            parametrization=parametrization,
            hyper_priors=hyper_priors,
            dtype=dtype,
        )
        self.mean_density = likelihood.mean_density
        self._observed = likelihood.observed
        self._expected = likelihood.expected
