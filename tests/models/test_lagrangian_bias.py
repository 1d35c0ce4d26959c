"""Lagrangian bias weights (fieldhmc.models.lagrangian_bias) against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import models
from fieldhmc.models.lagrangian_bias import lagrangian_bias_weights, shear_squared
from fieldhmc.models.lpt import LagrangianPerturbation
from tests.models import lpt_reference as ref
from tests.models.test_lpt import GRIDS, random_field

BIASES = {
    "b1": np.array([0.8, 1.4]),
    "b2": np.array([0.3, -0.5]),
    "bs2": np.array([-0.4, 0.2]),
    "bnabla2": np.array([2.0, -5.0]),  # (Mpc/h)^2
}


@pytest.mark.parametrize("grid_key", GRIDS)
def test_weights_match_numpy(grid_key):
    shape, box = GRIDS[grid_key]
    lpt = LagrangianPerturbation(models.Grid(shape, box))
    delta = random_field(shape, seed=11)
    d1 = np.array([0.6, 0.9])
    fields = lpt.fields(tf.constant(delta))
    params = {k: tf.constant(v) for k, v in BIASES.items()}
    weights = lagrangian_bias_weights(lpt, fields, tf.constant(d1), **params).numpy()
    expected = ref.bias_weights(delta, box, d1, *BIASES.values())
    np.testing.assert_allclose(weights, expected, atol=1e-13)
    # each term is there: dropping one changes the weights by O(0.1)
    for name in ("b2", "bs2", "bnabla2"):
        partial = dict(params, **{name: None})
        other = lagrangian_bias_weights(lpt, fields, tf.constant(d1), **partial).numpy()
        assert np.abs(other - weights).max() > 0.02, name
    # the mean weight is 1 + b1 D1 <delta> (the quadratic terms are box-mean free)
    mean = delta.mean(axis=(1, 2, 3))
    np.testing.assert_allclose(
        weights.mean(axis=(1, 2, 3)), 1 + BIASES["b1"] * d1 * mean, atol=1e-13
    )


def test_shear_squared_is_the_traceless_tidal_tensor_squared():
    """s^2 = 2/3 delta^2 - 2 delta2 equals s_ij s_ij from the NumPy tidal tensor."""
    shape, box = GRIDS["odd"]
    lpt = LagrangianPerturbation(models.Grid(shape, box))
    delta = random_field(shape, seed=12)
    phi = ref.tidal_tensor(delta, box)
    trace = phi[0, 0] + phi[1, 1] + phi[2, 2]
    expected = sum((phi[i, j] - (i == j) * trace / 3) ** 2 for i in range(3) for j in range(3))
    got = shear_squared(lpt.fields(tf.constant(delta))).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-13)
    assert np.all(got >= -1e-14)


def test_python_float_parameters_and_float32():
    shape, box = GRIDS["even"]
    lpt = LagrangianPerturbation(models.Grid(shape, box))
    delta = random_field(shape, seed=13)
    got = lagrangian_bias_weights(
        lpt, lpt.fields(tf.constant(delta, tf.float32)), 0.7, 1.0, 0.2, -0.3, 1.5
    )
    assert got.dtype == tf.float32
    expected = ref.bias_weights(delta, box, [0.7], [1.0], [0.2], [-0.3], [1.5])
    np.testing.assert_allclose(got.numpy(), expected, atol=2e-6)
