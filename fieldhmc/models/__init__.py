"""k-grids, power spectra, TFP joint distributions, likelihoods and exact references.

Layout (one concept per module):

* :mod:`~fieldhmc.models.grid` -- :class:`Grid` (box, k-vectors, Hermitian weights,
  k-bins);
* :mod:`~fieldhmc.models.power` -- :class:`PowerLaw`, :class:`TurnoverPowerLaw`,
  :class:`TabulatedPower`;
* :mod:`~fieldhmc.models.power_estimator` -- :func:`measure_power` (TF, batched),
  :func:`measure_cross_power`, :func:`measure_power_np`, :func:`power_of_modes` (of
  ``rfft3d`` modes);
* :mod:`~fieldhmc.models.masks` -- :func:`make_mask`;
* :mod:`~fieldhmc.models.field_model` -- :class:`FieldModel` (prior, parametrisation,
  the sampler interface);
* :mod:`~fieldhmc.models.forward` -- :class:`ForwardFieldModel`, the extension point:
  prior + your forward model + a likelihood (:mod:`~fieldhmc.models.likelihoods`:
  :class:`GaussianLikelihood`, :class:`LognormalPoissonLikelihood`);
  :mod:`~fieldhmc.models.gaussian` and :mod:`~fieldhmc.models.poisson` -- the
  identity-forward instances :class:`GaussianFieldModel`, :class:`LognormalPoissonModel`;
* :mod:`~fieldhmc.models.zeldovich` -- :class:`ZeldovichForward` (1LPT + CIC,
  :mod:`~fieldhmc.models.cic`);
* :mod:`~fieldhmc.models.lpt` (:class:`LagrangianPerturbation`, 2LPT),
  :mod:`~fieldhmc.models.rsd` (redshift space), :mod:`~fieldhmc.models.lagrangian_bias`
  and their composition :class:`LPTGalaxyForward` (:mod:`~fieldhmc.models.lpt_galaxies`;
  ``docs/lpt-forward.md``), and with the growth from :math:`\\Omega_m`
  :class:`GalaxyClusteringForward` (:mod:`~fieldhmc.models.galaxy_clustering`,
  ``model.forward.kind: lpt``; its prior
  :class:`~fieldhmc.models.cosmology.CosmologicalPower`, ``docs/cosmology.md``);
* :mod:`~fieldhmc.models.wiener_solver`, :mod:`~fieldhmc.models.wiener` -- the
  Wiener filter and exact Gaussian posteriors.
"""

from fieldhmc.models.cic import cic_deconvolve, cic_paint, cic_paint_lattice, cic_readout
from fieldhmc.models.field_model import (
    CONDITIONAL_PARAMETRIZATIONS,
    INIT_KINDS,
    PARAMETRIZATIONS,
    FieldModel,
    PinnedTarget,
    RepinnableTarget,
)
from fieldhmc.models.forward import (
    ForwardFieldModel,
    ForwardModelError,
    check_forward_fn,
    load_forward_target,
)
from fieldhmc.models.galaxy_clustering import GalaxyClusteringForward
from fieldhmc.models.gaussian import GaussianFieldModel
from fieldhmc.models.grid import Grid, KBins
from fieldhmc.models.lagrangian_bias import lagrangian_bias_weights
from fieldhmc.models.likelihoods import (
    GaussianLikelihood,
    Likelihood,
    LognormalPoissonLikelihood,
)
from fieldhmc.models.lpt import LagrangianPerturbation, LPTFields
from fieldhmc.models.lpt_galaxies import LPTGalaxyForward
from fieldhmc.models.masks import MASK_KINDS, make_mask
from fieldhmc.models.poisson import LognormalPoissonModel
from fieldhmc.models.power import (
    HYPERPARAMETER_NAMES,
    PowerLaw,
    PowerSpectrum,
    TabulatedPower,
    TurnoverPowerLaw,
)
from fieldhmc.models.power_estimator import (
    PackedSpectrum,
    PowerSpectrumEstimate,
    expected_binned_power,
    measure_cross_power,
    measure_power,
    measure_power_np,
    power_of_modes,
)
from fieldhmc.models.priors import (
    PRIOR_KINDS,
    NormalPrior,
    ScalarPrior,
    TruncatedNormalPrior,
    UniformPrior,
    make_prior,
)
from fieldhmc.models.reduction import reduce_sum_float64
from fieldhmc.models.rsd import kaiser_factor, redshift_space_growth
from fieldhmc.models.wiener import (
    DensePosterior,
    WienerPosterior,
    WienerVariance,
    dense_posterior,
    wiener_posterior,
    wiener_variance,
)
from fieldhmc.models.wiener_solver import CGResult, conjugate_gradient, wiener_filter_mean
from fieldhmc.models.zeldovich import ZeldovichForward

__all__ = [
    "HYPERPARAMETER_NAMES",
    "INIT_KINDS",
    "MASK_KINDS",
    "CONDITIONAL_PARAMETRIZATIONS",
    "PARAMETRIZATIONS",
    "PRIOR_KINDS",
    "PinnedTarget",
    "CGResult",
    "DensePosterior",
    "FieldModel",
    "ForwardFieldModel",
    "ForwardModelError",
    "RepinnableTarget",
    "ScalarPrior",
    "GaussianFieldModel",
    "GaussianLikelihood",
    "Grid",
    "KBins",
    "LPTFields",
    "LPTGalaxyForward",
    "LagrangianPerturbation",
    "Likelihood",
    "LognormalPoissonLikelihood",
    "LognormalPoissonModel",
    "NormalPrior",
    "PackedSpectrum",
    "PowerLaw",
    "PowerSpectrum",
    "PowerSpectrumEstimate",
    "TabulatedPower",
    "TruncatedNormalPrior",
    "TurnoverPowerLaw",
    "UniformPrior",
    "WienerPosterior",
    "WienerVariance",
    "ZeldovichForward",
    "GalaxyClusteringForward",
    "check_forward_fn",
    "cic_deconvolve",
    "cic_paint",
    "cic_paint_lattice",
    "cic_readout",
    "conjugate_gradient",
    "dense_posterior",
    "expected_binned_power",
    "kaiser_factor",
    "lagrangian_bias_weights",
    "load_forward_target",
    "make_mask",
    "make_prior",
    "measure_cross_power",
    "measure_power",
    "measure_power_np",
    "power_of_modes",
    "redshift_space_growth",
    "reduce_sum_float64",
    "wiener_filter_mean",
    "wiener_posterior",
    "wiener_variance",
]
