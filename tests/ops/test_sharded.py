"""Slab-decomposed sharded FFTs (fieldhmc.ops.sharded) on 4 virtual CPU devices.

The computations run once, in a subprocess (``tests/ops/sharded_cases.py``), because
the virtual devices must exist before TensorFlow initialises; these tests assert
its results.
"""

from __future__ import annotations

import pytest

from tests.dtensor_subprocess import default_results, run_json
from tests.ops.sharded_cases import CASES, DEFAULT, DTYPES

TOL = {"float32": 1e-6, "float64": 1e-12}
IDS = [
    pytest.param(i, id=i, marks=() if i in DEFAULT else pytest.mark.slow)
    for i in (f"{c[0]}-{d}" for c in CASES for d in DTYPES)
]
U = "unsharded"


@pytest.fixture(scope="module")
def results():
    return default_results()["ops"]


@pytest.fixture(scope="module")
def every_result():
    return run_json("tests.ops.sharded_cases", "--all", timeout=1800)


@pytest.fixture
def case_results(request, case):
    """The default subprocess's results for a default case, else the ``--all`` run's."""
    name = "results" if case in DEFAULT else "every_result"
    return request.getfixturevalue(name)[case]


@pytest.mark.parametrize("case", IDS)
def test_values_match_numpy_rfftn_and_irfftn(case_results, case):
    r = case_results
    tol = TOL[case.rsplit("-", 1)[1]]
    assert r["rfft_value"] < tol
    assert r["irfft_value"] < tol  # random, non-Hermitian input: numpy's c2r convention


@pytest.mark.parametrize("case", IDS)
def test_dot_product_adjoint(case_results, case):
    tol = TOL[case.rsplit("-", 1)[1]]
    assert case_results["rfft_adjoint"] < tol
    assert case_results["irfft_adjoint"] < tol


@pytest.mark.parametrize("case", IDS)
def test_gradients_match_single_device_ops(case_results, case):
    tol = TOL[case.rsplit("-", 1)[1]]
    assert case_results["rfft_grad_vs_ops"] < tol
    assert case_results["irfft_grad_vs_ops"] < tol


@pytest.mark.parametrize("case", IDS)
def test_layouts_and_dtypes(case_results, case):
    r = case_results
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


def test_dtensor_scatter_into_a_slab_field_replicates_it(results):
    """TF 2.21's DTensor computes tf.tensor_scatter_nd_add into a slab-sharded field
    replicated: a whole field on every device. This is why ``mesh_support`` refuses the
    particle-mesh forward models (their CIC paint is such a scatter); if this fails, a
    scatter keeps the slabs and the refusal should be revisited."""
    extras = results["extras"]
    assert extras["scatter_error"] == 0.0  # the values are right...
    assert extras["scatter_specs"] == [U, U, U, U]  # ...on a replicated layout


def test_mesh_must_divide_n0_and_n1(results):
    assert "must divide n0 and n1" in results["extras"]["bad_mesh_error"]


@pytest.mark.parametrize("shape", [(2, 6, 4, 8), (1, 5, 6, 7), (1, 4, 3, 1)])
def test_local_projection_commutes_with_the_n0_transform(shape):
    """irfft3d projects the self-paired planes after the n0 transform, along n1 only
    (locally); that equals the 3-D projection of fieldhmc.ops before it. Plain tensors:
    the helper is the same code the DTensor path runs."""
    import numpy as np
    import tensorflow as tf

    from fieldhmc.ops import hermitian_project
    from fieldhmc.ops.sharded import _hermitian_project_n1

    n0, n1, n2 = shape[1:]
    m = n2 // 2 + 1
    rng = np.random.default_rng(0)
    z = rng.standard_normal((*shape[:3], m)) + 1j * rng.standard_normal((*shape[:3], m))
    z = tf.constant(z)

    def ifft_n0(t):
        return tf.transpose(tf.signal.ifft(tf.transpose(t, [0, 2, 3, 1])), [0, 3, 1, 2])

    local = _hermitian_project_n1(ifft_n0(z), n1, n2).numpy()
    full = ifft_n0(hermitian_project(z, (n0, n1, n2), rank=3)).numpy()
    np.testing.assert_allclose(local, full, rtol=0, atol=1e-13)
    # and it is not a no-op on this input (the test can fail)
    assert np.max(np.abs(local - ifft_n0(z).numpy())) > 1e-3


def test_make_mesh_after_tensorflow_started_is_one_clear_error():
    import tensorflow as tf

    from fieldhmc.ops.sharded import make_mesh

    tf.constant(1.0) + 1.0  # devices are initialised (they are, in a test session)
    assert make_mesh(1).num_local_devices() == 1  # what exists is fine
    with pytest.raises(ValueError, match="TensorFlow has initialised its devices already"):
        make_mesh(4)
    with pytest.raises(ValueError, match="devices must be 'cpu' or 'gpu'"):
        make_mesh(2, "tpu")
