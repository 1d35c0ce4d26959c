"""The Gaussian model's target and HMC with the field sharded over 4 virtual CPUs.

Computations run in a subprocess (``tests/samplers/sharded_cases.py``) that makes
the virtual devices before TensorFlow initialises; these tests assert its results.
"""

from __future__ import annotations

import pytest

from tests.dtensor_subprocess import default_results, run_json


@pytest.fixture(scope="module")
def results():
    return default_results()["samplers"]


@pytest.fixture(scope="module")
def slow_results():
    return run_json("tests.samplers.sharded_cases", "--slow", timeout=1800)


@pytest.mark.parametrize("case", ["unmasked-float32", "masked-float64"])
def test_sharded_target_equals_the_models_target(results, case):
    """log p(xi) on 4 devices == model.target_log_prob_fn(data)(x(xi)), gradient too."""
    r = results["target"][case]
    assert r["lp_dtype"] == "float64"
    tol = 1e-12 if case.endswith("float64") else 1e-6
    assert r["lp_rel"] < tol
    assert r["grad_rel"] < tol


def test_four_device_hmc_reproduces_the_single_device_draws_float64(results):
    r = results["repro"]["float64"]
    assert r["same_accepts"]
    assert 0.3 < r["accept_rate"] < 1.0  # the run moved and was tested
    assert r["max_draw_diff"] < 1e-12 * r["draw_scale"] * 100
    assert r["max_lp_diff"] < 1e-9


@pytest.mark.slow
def test_four_device_hmc_reproduces_the_single_device_draws_float32(slow_results):
    r = slow_results["repro"]["float32"]
    assert r["same_accepts"]
    assert r["max_draw_diff"] < 1e-5 * r["draw_scale"]


@pytest.mark.slow
@pytest.mark.parametrize("masked", ["unmasked", "masked"])
def test_sharded_hmc_passes_the_wiener_ztest(slow_results, masked):
    """Every latent's posterior mean and variance (8³, dense reference), MCSE-scaled."""
    r = slow_results[masked]
    assert r["p"] > 1e-3 and r["max_abs_z"] < 4.5, r
