"""2LPT (fieldhmc.models.lpt) against an independent NumPy 2LPT and an analytic case."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import models
from fieldhmc.models.lpt import LagrangianPerturbation
from tests.models import lpt_reference as ref

GRIDS = {"even": ((8, 8, 8), (80.0, 80.0, 80.0)), "odd": ((7, 6, 5), (70.0, 66.0, 40.0))}


def random_field(grid_shape, num_chains=2, seed=0, scale=0.3):
    """White noise with a nonzero mean mode (the k = 0 convention is part of the test)."""
    rng = np.random.default_rng(seed)
    return scale * rng.standard_normal((num_chains, *grid_shape))


@pytest.mark.parametrize("grid_key", GRIDS)
def test_source_and_displacement_match_numpy(grid_key):
    """delta2 and D1 Psi1 + D2 Psi2 (per-chain growths) against the NumPy 2LPT."""
    shape, box = GRIDS[grid_key]
    lpt = LagrangianPerturbation(models.Grid(shape, box))
    delta = random_field(shape)
    fields = lpt.fields(tf.constant(delta))
    np.testing.assert_allclose(fields.delta.numpy(), delta, atol=1e-14)
    np.testing.assert_allclose(
        fields.delta2.numpy(), ref.second_order_source(delta, box), atol=1e-13
    )
    d1, d2 = np.array([0.7, 1.1]), np.array([-0.2, -0.5])
    disp = lpt.displacement(fields, tf.constant(d1), tf.constant(d2)).numpy()
    psi1, psi2 = ref.lpt_components(delta, box)
    expected = d1[:, None, None, None, None] * psi1 + d2[:, None, None, None, None] * psi2
    assert np.abs(expected).max() > 0.1  # a displacement of a tenth of a cell at least
    np.testing.assert_allclose(disp, expected, atol=1e-13)
    # 1LPT and Python-float growths
    first = lpt.displacement(fields, 0.7).numpy()
    np.testing.assert_allclose(first, 0.7 * psi1, atol=1e-13)
    # the second-order term is not the first-order one rescaled
    assert np.abs(psi2 - psi1 * (psi2 * psi1).sum() / (psi1**2).sum()).max() > 1e-2


def test_from_modes_equals_from_delta_and_float32_agrees():
    shape, box = GRIDS["odd"]
    lpt = LagrangianPerturbation(models.Grid(shape, box))
    delta = random_field(shape, seed=3)
    via_delta = lpt(tf.constant(delta), 0.9, -0.3).numpy()
    via_modes = lpt.displacement(
        lpt.fields_from_modes(tf.signal.rfft3d(tf.constant(delta))), 0.9, -0.3
    ).numpy()
    np.testing.assert_allclose(via_modes, via_delta, atol=1e-14)
    single = lpt(tf.constant(delta, tf.float32), 0.9, -0.3)
    assert single.dtype == tf.float32
    np.testing.assert_allclose(single.numpy(), via_delta, atol=1e-5)


def test_two_orthogonal_plane_waves():
    """delta = A cos(a x) + B cos(b y): phi_xx = A cos(a x), phi_yy = B cos(b y), so
    delta2 = A B cos(a x) cos(b y) and, with Psi2 = -i k / k^2 delta2_k,
    Psi2 = (A B / 2) sum_{+-} (a, +-b, 0) / (a^2 + b^2) sin(a x +- b y); a single plane wave
    has no second-order displacement."""
    shape, box = (16, 12, 6), (160.0, 90.0, 60.0)
    lpt = LagrangianPerturbation(models.Grid(shape, box))
    x, y, _ = np.meshgrid(
        *[np.arange(n) * ell / n for n, ell in zip(shape, box, strict=True)], indexing="ij"
    )
    a, b = 2 * np.pi * 2 / box[0], 2 * np.pi * 1 / box[1]
    amp_a, amp_b = 0.4, -0.3
    delta = amp_a * np.cos(a * x) + amp_b * np.cos(b * y)
    fields = lpt.fields(tf.constant(delta[None]))
    np.testing.assert_allclose(
        fields.delta2.numpy()[0], amp_a * amp_b * np.cos(a * x) * np.cos(b * y), atol=1e-14
    )
    psi2 = lpt.displacement(fields, 0.0, 1.0).numpy()[0]  # D1 = 0, D2 = 1: Psi2 in cells
    cell = np.asarray(box) / np.asarray(shape)
    expected = np.zeros((3, *shape))
    for sign in (1, -1):
        kvec = np.array([a, sign * b, 0.0])
        phase = np.sin(a * x + sign * b * y)
        expected += 0.5 * amp_a * amp_b * (kvec / (a**2 + b**2))[:, None, None, None] * phase
    np.testing.assert_allclose(psi2 * cell[:, None, None, None], expected, atol=1e-13)
    plane = lpt.fields(tf.constant((amp_a * np.cos(a * x))[None]))
    np.testing.assert_allclose(plane.delta2.numpy(), 0.0, atol=1e-14)


def test_chains_are_independent_and_growth_shapes_are_checked():
    shape, box = GRIDS["even"]
    lpt = LagrangianPerturbation(models.Grid(shape, box))
    delta = random_field(shape, num_chains=3, seed=5)
    d1, d2 = tf.constant([0.5, 0.8, 1.0]), tf.constant([-0.1, -0.3, -0.4])
    batched = lpt(tf.constant(delta), d1, d2).numpy()
    for i in range(3):
        alone = lpt(tf.constant(delta[i : i + 1]), d1[i : i + 1], d2[i : i + 1]).numpy()
        np.testing.assert_allclose(batched[i], alone[0], atol=1e-14)
    with pytest.raises(ValueError, match="growth"):
        lpt(tf.constant(delta), tf.zeros([3, 3, 1], tf.float64))
    with pytest.raises(ValueError, match="Grid"):
        LagrangianPerturbation((8, 8, 8))


@pytest.mark.parametrize(("growth2", "kernel"), [(-3 / 7, "2lpt"), (0.0, "za")])
def test_second_order_density_is_the_perturbation_theory_kernel(growth2, kernel):
    """Einstein-de Sitter (D1 = 1, D2 = -3/7): 2LPT is exact to second order, so the
    Eulerian density of two plane waves eps [cos(k1.q) + cos(k2.q)] has the mode
    delta_E(k1 + k2) = eps^2 F2(k1, k2) / 2 with the SPT kernel
    F2 = 5/7 + mu/2 (k1/k2 + k2/k1) + 2/7 mu^2; with D2 = 0 (Zel'dovich) the kernel is
    F2_ZA = F2 - 3/14 (1 - mu^2). delta_E(k) = (1/N) sum_q exp(-i k.x(q)) is the particles'
    exact Fourier transform (no mass assignment). k1 = (2, 0, 0), k2 = (1, 1, 0) (x k_f):
    F2 = 45/28, F2_ZA = 3/2; the third order vanishes at k1 + k2, the fourth is eps^2 relative.
    """
    n = 16
    lpt = LagrangianPerturbation(models.Grid((n, n, n), float(n)))
    q = np.stack(np.meshgrid(*[np.arange(n)] * 3, indexing="ij")).astype(float)
    kf = 2 * np.pi / n
    k1, k2 = kf * np.array([2.0, 0, 0]), kf * np.array([1.0, 1, 0])
    eps = 1e-2
    delta = eps * (np.cos(np.tensordot(k1, q, 1)) + np.cos(np.tensordot(k2, q, 1)))
    x = q + lpt(tf.constant(delta[None]), 1.0, growth2).numpy()[0]
    measured = np.exp(-1j * np.tensordot(k1 + k2, x, 1)).mean() / (eps**2 / 2)
    mu = k1 @ k2 / np.linalg.norm(k1) / np.linalg.norm(k2)
    ratio = np.linalg.norm(k1) / np.linalg.norm(k2)
    f2 = 5 / 7 + mu / 2 * (ratio + 1 / ratio) + 2 / 7 * mu**2
    expected = f2 if kernel == "2lpt" else f2 - 3 / 14 * (1 - mu**2)
    np.testing.assert_allclose(f2, 45 / 28, rtol=1e-14)
    np.testing.assert_allclose(measured, expected, rtol=1e-3)
