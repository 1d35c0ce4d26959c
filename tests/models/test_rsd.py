"""Plane-parallel redshift-space distortions (fieldhmc.models.rsd) against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import models
from fieldhmc.models.lpt import LagrangianPerturbation
from fieldhmc.models.lpt_galaxies import LPTGalaxyForward
from fieldhmc.models.rsd import kaiser_factor, line_of_sight, redshift_space_growth
from tests.models import lpt_reference as ref
from tests.models.test_lpt import GRIDS, random_field


@pytest.mark.parametrize(("grid_key", "los_axis"), [("even", -1), ("odd", 0), ("odd", 1)])
def test_redshift_space_displacement_matches_numpy(grid_key, los_axis):
    """q + D1 Psi1 + D2 Psi2 + (f1 D1 Psi1 + f2 D2 Psi2) . z z, per-chain parameters."""
    shape, box = GRIDS[grid_key]
    lpt = LagrangianPerturbation(models.Grid(shape, box))
    delta = random_field(shape, seed=7)
    d1, d2 = np.array([0.6, 0.9]), np.array([-0.15, -0.35])
    f1, f2 = np.array([0.75, 0.5]), np.array([1.5, 1.1])
    g1, g2 = redshift_space_growth(*(tf.constant(v) for v in (d1, d2, f1, f2)), los_axis=los_axis)
    disp = lpt(tf.constant(delta), g1, g2).numpy()
    expected = ref.redshift_space_displacement(delta, box, d1, d2, f1, f2, los_axis)
    np.testing.assert_allclose(disp, expected, atol=1e-13)
    # the line of sight moves, the other axes do not
    real = lpt(tf.constant(delta), tf.constant(d1), tf.constant(d2)).numpy()
    axis = line_of_sight(los_axis)
    others = [a for a in range(3) if a != axis]
    np.testing.assert_allclose(disp[:, others], real[:, others], atol=1e-14)
    assert np.abs(disp[:, axis] - real[:, axis]).max() > 0.05


def test_redshift_space_growth_values_and_float_parameters():
    g1, g2 = redshift_space_growth(0.5, -0.1, 0.8, 1.6, los_axis=1)
    np.testing.assert_allclose(g1.numpy(), [[0.5, 0.5 * 1.8, 0.5]], rtol=1e-15)
    np.testing.assert_allclose(g2.numpy(), [[-0.1, -0.1 * 2.6, -0.1]], rtol=1e-15)
    g1, g2 = redshift_space_growth(tf.constant([0.5, 0.6]), None, 0.8, None)
    assert g2 is None and g1.shape == (2, 3)
    for bad in (3, -4, 1.0, True):
        with pytest.raises(ValueError, match="los_axis"):
            line_of_sight(bad)


def test_kaiser_factor_matches_numpy():
    shape, box = GRIDS["odd"]
    grid = models.Grid(shape, box)
    d, b, f = np.array([0.6, 0.8]), np.array([1.5, 2.0]), np.array([0.7, 0.75])
    got = kaiser_factor(grid, tf.constant(d), tf.constant(b), tf.constant(f), los_axis=0).numpy()
    k = grid.kvec()
    k2 = sum(ka**2 for ka in k)
    with np.errstate(invalid="ignore"):
        mu2 = np.nan_to_num(k[0] ** 2 / k2)
    expected = d[:, None, None, None] * (b[:, None, None, None] + f[:, None, None, None] * mu2)
    np.testing.assert_allclose(got, expected, rtol=1e-14)
    assert got.shape == (2, *grid.modes_shape)


@pytest.mark.parametrize(("rate1", "b1"), [(0.9, 0.0), (0.0, 1.5), (0.9, 1.5)])
def test_small_amplitude_response_is_kaiser(rate1, b1):
    """Linear regime, 1LPT + RSD + Lagrangian b1, CIC: the measured response
    <delta_g delta*> / <|delta|^2> on the lowest modes (pooled by symmetry) against the
    lattice prediction (1/k^2) sum_a D_a k_a sin(k_a h_a) / h_a + b1 D (the CIC response of
    the displacement, averaged over its sign, as ZeldovichForward(lattice_offset=0)'s
    linear_gain, per axis; a particle on its cell centre paints its weight into its own
    cell), and against the
    Kaiser factor D (1 + b1 + f mu^2): the Eulerian linear bias is 1 + b1."""
    shape, box = (16, 16, 16), (128.0, 128.0, 128.0)
    grid = models.Grid(shape, box)
    fwd = LPTGalaxyForward(grid, order=1, rsd=rate1 > 0, deconvolve=False)
    rng = np.random.default_rng(1)
    delta = 1e-4 * rng.standard_normal((16, *shape))
    d1 = 0.8
    params = dict(growth1=d1, rate1=rate1, b1=b1, b2=0.0, bs2=0.0)
    evolved = fwd(tf.constant(delta), **params).numpy()
    dk = np.fft.rfftn(delta, axes=(1, 2, 3))
    ek = np.fft.rfftn(evolved, axes=(1, 2, 3))
    k = grid.kvec()
    h = np.asarray(box) / np.asarray(shape)
    k2 = sum(ka**2 for ka in k)
    growth = [d1, d1, d1 * (1 + rate1)]
    with np.errstate(invalid="ignore", divide="ignore"):
        lattice = sum(g * ka * np.sin(ka * ha) / ha for g, ka, ha in zip(growth, k, h, strict=True))
        lattice = lattice / k2 + b1 * d1
    low = (k2 > 0) & (k2 <= (2.5 * 2 * np.pi / 128.0) ** 2)
    groups = np.unique(np.round(lattice[low], 9), return_inverse=True)[1]
    cross = (ek * dk.conj()).real.sum(axis=0)[low]
    power = (np.abs(dk) ** 2).sum(axis=0)[low]
    measured = np.bincount(groups, cross) / np.bincount(groups, power)
    predicted = np.bincount(groups, lattice[low]) / np.bincount(groups)
    mu2 = np.bincount(groups, np.where(k2 > 0, k[2] ** 2 / np.where(k2 > 0, k2, 1), 0)[low])
    mu2 /= np.bincount(groups)
    # CIC paints a one-sided difference whose side follows each particle's displacement
    # sign; pooled over >= 16 x 16^3 particles the deviation from the mean is a few %
    np.testing.assert_allclose(measured, predicted, rtol=0.04)
    kaiser = d1 * (1 + b1 + rate1 * mu2)
    np.testing.assert_allclose(measured, kaiser, rtol=0.15)  # CIC's sin(kh)/kh at low k
    # the bias and the RSD boost are there: D (1 + b1) across the line of sight,
    # D (1 + b1 + f) along it (sin(kh)/kh >= 0.9 on these modes), D alone far below
    assert np.all(measured > 0.85 * d1 * (1 + b1))
    if rate1 > 0:
        along, across = mu2 > 0.99, mu2 < 0.01
        assert along.any() and across.any()
        assert np.all(measured[along] > 0.85 * d1 * (1 + b1 + rate1))
        assert np.all(measured[across] < 1.05 * d1 * (1 + b1))
