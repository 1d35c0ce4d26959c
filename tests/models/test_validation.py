"""Bad inputs raise a ValueError that names the problem."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.models import (
    GaussianFieldModel,
    Grid,
    LognormalPoissonModel,
    NormalPrior,
    PowerLaw,
    TabulatedPower,
    TurnoverPowerLaw,
)

GRID = Grid((8, 8, 8), 100.0)
POWER = PowerLaw(500.0, -1.0, 0.1)


def _gaussian(**kwargs):
    args = dict(sigma=0.5, mask=None)
    args.update(kwargs)
    return GaussianFieldModel(GRID, POWER, args.pop("sigma"), args.pop("mask"), **args)


@pytest.mark.parametrize(
    "data,match",
    [
        (np.zeros((8, 8, 9)), r"^data has shape \(8, 8, 9\), expected grid shape \(8, 8, 8\)$"),
        (np.zeros((2, 8, 8, 8)), r"data has shape \(2, 8, 8, 8\)"),
        (
            np.where(np.arange(512).reshape(8, 8, 8) == 5, np.nan, 0.0),
            r"data contains 1 non-finite",
        ),
        (np.full((8, 8, 8), np.inf), r"data contains 512 non-finite"),
    ],
)
def test_bad_data(data, match):
    model = _gaussian()
    for call in (
        model.target_log_prob_fn,
        model.posterior,
        model.posterior_precision_diag,
        lambda d: model.init_latents("wiener", 1, 0, d),
    ):
        with pytest.raises(ValueError, match=match):
            call(data)


@pytest.mark.parametrize(
    "sigma,mask,match",
    [
        (-0.5, None, "sigma has negative values"),
        (np.where(np.arange(512).reshape(8, 8, 8) == 3, -1.0, 1.0), None, "negative"),
        (0.0, None, "sigma is zero at 512 observed voxels"),
        (np.nan, None, "sigma contains NaN"),
        (np.ones((8, 8)), None, r"sigma has shape \(8, 8\)"),
        (np.inf, None, "sigma must be finite at observed voxels"),
        (1.0, np.zeros((8, 8, 8)), "mask is all zeros"),
        (1.0, np.full((8, 8, 8), 0.5), "mask must contain only 0 and 1"),
        (1.0, np.ones((8, 8, 7)), r"mask has shape \(8, 8, 7\)"),
    ],
)
def test_bad_gaussian_noise(sigma, mask, match):
    with pytest.raises(ValueError, match=match):
        _gaussian(sigma=sigma, mask=mask)


def test_sigma_map_may_be_infinite_where_masked():
    mask = np.ones((8, 8, 8))
    mask[0] = 0
    sigma = np.where(mask > 0, 0.5, np.inf)
    model = _gaussian(sigma=sigma, mask=mask)
    assert model.num_observed == 448


@pytest.mark.parametrize(
    "mean_density,mask,data,match",
    [
        (0.0, None, None, "mean_density must be positive"),
        (1.0, -np.ones((8, 8, 8)), None, r"mask values must be in \[0, 1\]"),
        (1.0, np.zeros((8, 8, 8)), None, "mask is all zeros"),
        (1.0, None, -np.ones((8, 8, 8)), "must be non-negative integers; found -1.0"),
        (1.0, None, np.full((8, 8, 8), 0.5), "must be non-negative integers; found 0.5"),
    ],
)
def test_bad_poisson_inputs(mean_density, mask, data, match):
    with pytest.raises(ValueError, match=match):
        model = LognormalPoissonModel(GRID, POWER, mean_density, mask)
        model.target_log_prob_fn(data)


@pytest.mark.parametrize(
    "make_power,match",
    [
        (lambda: PowerLaw(-1.0, 1.0), "amplitude must be positive"),
        (lambda: TabulatedPower([0.1, 1.0], [1.0, -1.0]), r"P\(k\) must be positive"),
        # positive in float64, underflows to 0 in float32 at the grid's k
        (
            lambda: TurnoverPowerLaw(1.0, 0.0, 0.1, k_turnover=1.0, k_cutoff=0.04),
            r"P\(k\) must be positive and finite for k > 0",
        ),
    ],
)
def test_non_positive_power(make_power, match):
    with pytest.raises(ValueError, match=match):
        GaussianFieldModel(GRID, make_power(), 1.0, dtype=tf.float32)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(parametrization="whitened"), "parametrization must be one of"),
        (
            dict(hyper_priors={"amplitude": (0.0, 1.0)}),
            r"unknown hyperparameter\(s\) \['amplitude'\]",
        ),
        (dict(hyper_priors={"index": (0.0, -1.0)}), "prior scale must be positive"),
        (dict(hyper_priors={"index": "wide"}), "NormalPrior or"),
        (dict(dtype=tf.int32), "dtype must be float32 or float64"),
    ],
)
def test_bad_model_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _gaussian(**kwargs)


def test_normal_prior_validation():
    with pytest.raises(ValueError, match="loc must be finite"):
        NormalPrior(np.inf, 1.0)
    assert NormalPrior(0.0, 2.0).log_prob(0.0) == pytest.approx(-np.log(2.0 * np.sqrt(2 * np.pi)))


def test_float32_underflow_is_caught_but_float64_is_fine():
    power = TurnoverPowerLaw(1.0, 0.0, 0.1, k_turnover=1.0, k_cutoff=0.04)
    GaussianFieldModel(GRID, power, 1.0, dtype=tf.float64)
    with pytest.raises(ValueError, match="in float32"):
        GaussianFieldModel(GRID, power, 1.0, dtype=tf.float32)
