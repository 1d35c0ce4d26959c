"""Slab-decomposed sharded FFTs (fieldhmc.ops.sharded) on 4 virtual CPU devices.

The computations run once, in a subprocess (``tests/ops/sharded_cases.py``), because
the virtual devices must exist before TensorFlow initialises; these tests assert
its results.
"""

from __future__ import annotations

import pytest

from tests.dtensor_subprocess import default_results
from tests.ops.sharded_cases import CASES, DTYPES

TOL = {"float32": 1e-6, "float64": 1e-12}
IDS = [f"{c[0]}-{d}" for c in CASES for d in DTYPES]
U = "unsharded"


@pytest.fixture(scope="module")
def results():
    return default_results()["ops"]


@pytest.mark.parametrize("case", IDS)
def test_values_match_numpy_rfftn_and_irfftn(results, case):
    r = results[case]
    tol = TOL[case.rsplit("-", 1)[1]]
    assert r["rfft_value"] < tol
    assert r["irfft_value"] < tol  # random, non-Hermitian input: numpy's c2r convention


@pytest.mark.parametrize("case", IDS)
def test_dot_product_adjoint(results, case):
    tol = TOL[case.rsplit("-", 1)[1]]
    assert results[case]["rfft_adjoint"] < tol
    assert results[case]["irfft_adjoint"] < tol


@pytest.mark.parametrize("case", IDS)
def test_gradients_match_single_device_ops(results, case):
    tol = TOL[case.rsplit("-", 1)[1]]
    assert results[case]["rfft_grad_vs_ops"] < tol
    assert results[case]["irfft_grad_vs_ops"] < tol


@pytest.mark.parametrize("case", IDS)
def test_layouts_and_dtypes(results, case):
    r = results[case]
    assert r["spectrum_specs"] == [U, U, "x", U]
    assert r["field_specs"] == [U, "x", U, U]
    assert r["spectrum_dtype"] == ("complex64" if case.endswith("float32") else "complex128")


def test_dtensor_alltoall_bug_still_present(results):
    """TF 2.21's DTensorAllToAll (tensorflow/tensorflow#60075) scrambles
    [c, n0/P, n1, m] -> [c, n0, n1/P, m]; exchanging axes 0 and 1 is right. The
    transforms rely on the latter. If this fails, TF fixed it: drop the transposes."""
    extras = results["extras"]
    assert extras["naive_alltoall_error"] > 1.0
    assert extras["leading_axis_alltoall_error"] == 0.0


def test_mesh_must_divide_n0_and_n1(results):
    assert "must divide n0 and n1" in results["extras"]["bad_mesh_error"]
