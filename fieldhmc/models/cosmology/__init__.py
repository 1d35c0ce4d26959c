"""Cosmology building blocks: flat LCDM background and growth, the E&H linear P(k).

One concept per module:

* :mod:`~fieldhmc.models.cosmology.parameters` -- :class:`FixedCosmology`
  (:math:`\\Omega_b, h, n_s, T_\\mathrm{CMB}`; :data:`PLANCK18`), :func:`check_cosmology`
  (Python values, ``ValueError`` naming the parameter), :func:`clip_to_support` and
  :func:`in_support` (tensors);
* :mod:`~fieldhmc.models.cosmology.background` -- :func:`hubble_rate` :math:`E(a)`,
  :func:`matter_density` :math:`\\Omega_m(a)`;
* :mod:`~fieldhmc.models.cosmology.growth` -- :func:`growth_factors`
  (:math:`D_1, f_1, D_2, f_2` by RK4, batched, differentiable in :math:`\\Omega_m`);
* :mod:`~fieldhmc.models.cosmology.transfer` -- :func:`eisenstein_hu_transfer`
  (with and without wiggles);
* :mod:`~fieldhmc.models.cosmology.linear_power` -- :func:`sigma_r_squared`,
  :func:`linear_power` and :class:`EisensteinHuPower` (:math:`\\sigma_8`-normalised);
* :mod:`~fieldhmc.models.cosmology.power_spectrum` -- :class:`CosmologicalPower`, the
  same as a field prior (:class:`~fieldhmc.models.PowerSpectrum`, sampled
  :math:`\\Omega_m, \\sigma_8`).

Units: :math:`k` in h/Mpc, :math:`P` in (Mpc/h)^3, lengths in Mpc/h. See
``docs/cosmology.md``.
"""

from fieldhmc.models.cosmology.background import hubble_rate, matter_density
from fieldhmc.models.cosmology.growth import GROWTH_NORMALIZATIONS, GrowthFactors, growth_factors
from fieldhmc.models.cosmology.linear_power import (
    COSMOLOGY_PARAMETER_NAMES,
    EisensteinHuPower,
    linear_power,
    sigma_r_squared,
)
from fieldhmc.models.cosmology.parameters import (
    PLANCK18,
    FixedCosmology,
    check_cosmology,
    clip_to_support,
    in_support,
)
from fieldhmc.models.cosmology.power_spectrum import CosmologicalPower
from fieldhmc.models.cosmology.transfer import eisenstein_hu_transfer

__all__ = [
    "COSMOLOGY_PARAMETER_NAMES",
    "GROWTH_NORMALIZATIONS",
    "CosmologicalPower",
    "PLANCK18",
    "EisensteinHuPower",
    "FixedCosmology",
    "GrowthFactors",
    "check_cosmology",
    "clip_to_support",
    "eisenstein_hu_transfer",
    "growth_factors",
    "hubble_rate",
    "in_support",
    "linear_power",
    "matter_density",
    "sigma_r_squared",
]
