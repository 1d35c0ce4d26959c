"""Shared small models for tests/models (8^3 even and 7x6x5 odd grids)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.models import (
    GaussianFieldModel,
    Grid,
    LognormalPoissonModel,
    NormalPrior,
    TurnoverPowerLaw,
    make_mask,
)
from tests.models.numpy_reference import ReferenceModel, power_law

GRIDS = {
    "even": ((8, 8, 8), (100.0, 100.0, 100.0)),
    "odd": ((7, 6, 5), (70.0, 90.0, 55.0)),
    "tiny": ((5, 4, 3), (40.0, 30.0, 35.0)),
}
LIKELIHOODS = ("gaussian", "gaussian_mask_map", "poisson_mask")
POWER = dict(amplitude=400.0, index=0.5, k_pivot=0.1, k_turnover=0.06, turnover_index=3.0)
HYPER_PRIORS = {"log_amplitude": NormalPrior(np.log(400.0), 0.5), "index": NormalPrior(0.5, 0.3)}


def make_power() -> TurnoverPowerLaw:
    return TurnoverPowerLaw(**POWER)


def reference_power(k, log_amplitude, index):
    turnover = (POWER["k_turnover"], POWER["turnover_index"], None)
    return power_law(k, log_amplitude, index, POWER["k_pivot"], turnover)


def build_model(
    grid_key: str,
    likelihood: str,
    parametrization: str = "noncentred",
    sampled: bool = False,
    dtype=tf.float64,
):
    """Return ``(model, reference)`` for the named configuration."""
    grid_shape, box = GRIDS[grid_key]
    grid = Grid(grid_shape, box)
    priors = HYPER_PRIORS if sampled else None
    rng = np.random.default_rng(7)
    if likelihood == "gaussian":
        lik = dict(kind="gaussian", sigma=0.4, mask=None)
        model = GaussianFieldModel(
            grid,
            make_power(),
            0.4,
            parametrization=parametrization,
            hyper_priors=priors,
            dtype=dtype,
        )
    elif likelihood == "gaussian_mask_map":
        mask = make_mask(grid, "sphere", 0.3, seed=3)
        sigma = rng.uniform(0.2, 0.8, size=grid_shape)
        lik = dict(kind="gaussian", sigma=sigma, mask=mask)
        model = GaussianFieldModel(
            grid,
            make_power(),
            sigma,
            mask,
            parametrization=parametrization,
            hyper_priors=priors,
            dtype=dtype,
        )
    elif likelihood == "poisson_mask":
        mask = make_mask(grid, "slab", 0.25, seed=4) * rng.uniform(0.5, 1.0, size=grid_shape)
        lik = dict(kind="poisson", mean_density=3.0, mask=mask)
        model = LognormalPoissonModel(
            grid,
            make_power(),
            3.0,
            mask,
            parametrization=parametrization,
            hyper_priors=priors,
            dtype=dtype,
        )
    else:
        raise KeyError(likelihood)
    ref_priors = {k: (v.loc, v.scale) for k, v in (priors or {}).items()}
    reference = ReferenceModel(grid_shape, box, reference_power, parametrization, lik, ref_priors)
    return model, reference


@pytest.fixture(scope="module")
def model_factory():
    return build_model
