"""Binned power-spectrum estimator: normalisation, TF vs NumPy, cross-spectra, cosmic variance."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from fieldhmc.models import (
    GaussianFieldModel,
    Grid,
    PackedSpectrum,
    PowerLaw,
    TurnoverPowerLaw,
    expected_binned_power,
    measure_cross_power,
    measure_power,
    measure_power_np,
    power_of_modes,
)
from fieldhmc.ops import rfft3d

GRIDS = [Grid((8, 8, 8), 100.0), Grid((7, 6, 5), (70.0, 90.0, 55.0))]


@pytest.mark.parametrize("m", [(1, 0, 0), (0, 2, 1), (1, 1, 0), (0, 0, 2)])
def test_plane_wave_has_the_expected_power(m):
    # delta = A cos(k.x): |F_{+-k}| = A N / 2, so sum_bin w |F|^2 = A^2 N^2 / 2 and
    # P_bin = V / N^2 * A^2 N^2 / 2 / num_modes.
    grid = Grid((8, 8, 6), (80.0, 60.0, 50.0))
    x = np.meshgrid(*[np.arange(n) / n for n in grid.grid_shape], indexing="ij")
    amp = 0.7
    field = amp * np.cos(2 * np.pi * sum(mi * xi for mi, xi in zip(m, x, strict=True)))
    k = np.sqrt(sum((2 * np.pi * mi / ell) ** 2 for mi, ell in zip(m, grid.box_size, strict=True)))
    bins = grid.kbins()
    est = measure_power_np(field, grid, bins)
    b = int(np.searchsorted(bins.edges, k, side="right") - 1)
    expected = np.zeros(bins.num_bins)
    expected[b] = grid.volume * amp**2 / 2 / bins.num_modes[b]
    np.testing.assert_allclose(est.power, expected, atol=1e-12 * expected[b])
    np.testing.assert_allclose(measure_power(field, grid, bins).power.numpy(), expected, atol=1e-9)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("grid", GRIDS, ids=["even", "odd"])
def test_tf_matches_numpy_batched_and_xla(grid, dtype):
    rng = np.random.default_rng(1)
    fields = rng.normal(size=(2, 3, *grid.grid_shape))
    ref = measure_power_np(fields, grid)
    est = measure_power(tf.constant(fields, dtype), grid)
    assert est.power.shape == (2, 3, ref.k.size) and est.power.dtype == dtype
    rtol = 1e-5 if dtype == tf.float32 else 1e-12
    np.testing.assert_allclose(est.power.numpy(), ref.power, rtol=rtol)
    np.testing.assert_array_equal(est.num_modes, ref.num_modes)
    compiled = tf.function(lambda f: measure_power(f, grid).power, jit_compile=True)
    np.testing.assert_allclose(compiled(tf.constant(fields, dtype)).numpy(), ref.power, rtol=rtol)
    # unbatched
    single = measure_power(tf.constant(fields[0, 0], dtype), grid).power
    np.testing.assert_allclose(single.numpy(), ref.power[0, 0], rtol=rtol)
    # of the modes (what the sampler's per-draw P(k) reads)
    of_modes = power_of_modes(rfft3d(tf.constant(fields, dtype)), grid).power
    assert of_modes.dtype == dtype
    np.testing.assert_allclose(of_modes.numpy(), ref.power, rtol=rtol)


@pytest.mark.parametrize("grid", GRIDS, ids=["even", "odd"])
def test_cross_power(grid):
    rng = np.random.default_rng(2)
    a = rng.normal(size=(3, *grid.grid_shape))
    b = rng.normal(size=grid.grid_shape)
    auto = measure_power_np(a, grid).power
    np.testing.assert_allclose(measure_cross_power(a, a, grid).power.numpy(), auto, rtol=1e-12)
    np.testing.assert_allclose(
        measure_cross_power(a, -2.0 * a, grid).power.numpy(), -2.0 * auto, rtol=1e-12
    )
    cross_tf = measure_cross_power(a, b, grid).power.numpy()  # broadcasts b
    cross_np = measure_power_np(a, grid, field_b=np.broadcast_to(b, a.shape)).power
    np.testing.assert_allclose(cross_tf, cross_np, rtol=1e-10, atol=1e-12)
    # P_{a+b} = P_a + P_b + 2 P_ab
    total = measure_power_np(a + b, grid).power
    parts = auto + measure_power_np(b, grid).power + 2 * cross_np
    np.testing.assert_allclose(total, parts, rtol=1e-10)


@pytest.mark.parametrize(
    "grid,power",
    [
        (Grid((16, 16, 16), 200.0), PowerLaw(3000.0, -1.0, 0.1)),
        (
            Grid((15, 12, 13), (150.0, 120.0, 160.0)),
            TurnoverPowerLaw(2000.0, 1.0, 0.1, k_turnover=0.05, turnover_index=4.0),
        ),
    ],
    ids=["cubic_even", "odd_noncubic"],
)
def test_simulated_power_matches_input_within_cosmic_variance(grid, power):
    num_real = 8
    model = GaussianFieldModel(grid, power, sigma=1.0, dtype=tf.float64)
    delta = model.sample(seed=[4, 2], sample_shape=num_real)["delta"]
    est = measure_power(delta, grid)
    mean, var = expected_binned_power(power.numpy(grid.kmag()), grid)
    measured = est.power.numpy().mean(axis=0)
    ok = est.num_modes > 0
    chi2 = float(np.sum((measured[ok] - mean[ok]) ** 2 / (var[ok] / num_real)))
    dof = int(ok.sum())
    # two-sided: neither a biased mean/normalisation nor a wrong variance passes
    assert 1e-3 < stats.chi2.cdf(chi2, dof) < 1 - 1e-3, (chi2, dof)


def test_expected_binned_power_of_constant_spectrum():
    grid = Grid((8, 8, 8), 100.0)
    bins = grid.kbins()
    mean, var = expected_binned_power(np.full(grid.modes_shape, 5.0), grid, bins)
    np.testing.assert_allclose(mean, 5.0)
    np.testing.assert_allclose(var, 2 * 25.0 / bins.num_modes)


def test_bad_field_shape():
    grid = GRIDS[0]
    with pytest.raises(ValueError, match="expected"):
        measure_power(tf.zeros((8, 8, 9)), grid)
    with pytest.raises(ValueError, match=r"field has shape \(8, 8, 9\)"):
        measure_power_np(np.zeros((8, 8, 9)), grid)
    with pytest.raises(ValueError, match=r"modes must be complex \[\.\.\., \*\(8, 8, 5\)\]"):
        power_of_modes(tf.zeros((8, 8, 8), tf.complex64), grid)
    with pytest.raises(ValueError, match="modes must be complex"):
        power_of_modes(tf.zeros((8, 8, 5)), grid)


@pytest.mark.parametrize("grid", [*GRIDS, Grid((6, 5, 8), (60.0, 50.0, 80.0))])
def test_packed_spectrum_matches_numpy(grid):
    """P(k) and modes read from the packed modes (a segment sum of squares; at most two
    reals per mode) equal NumPy's estimator and ``rfftn``, on odd and even grids, with
    modes on the self-paired planes that own no real of their own (their partner does)."""
    fields = np.random.default_rng(3).normal(size=(3, *grid.grid_shape))
    n0, n1, n2 = grid.grid_shape
    tracked = np.array(
        [[1, 2, 1], [1, 2, 0], [(-1) % n0, (-2) % n1, 0], [0, 0, 0], [1, 0, n2 // 2]]
    )
    packed = PackedSpectrum(grid, grid.kbins(), tracked)
    y = packed.of_field(tf.constant(fields))
    expected = np.stack([measure_power_np(f, grid).power for f in fields])
    np.testing.assert_allclose(packed.power(y).numpy(), expected, rtol=1e-12)
    modes = np.fft.rfftn(fields, axes=(1, 2, 3))[:, tracked[:, 0], tracked[:, 1], tracked[:, 2]]
    np.testing.assert_allclose(
        packed.tracked(y).numpy(), modes, rtol=0, atol=1e-12 * np.abs(modes).max()
    )
