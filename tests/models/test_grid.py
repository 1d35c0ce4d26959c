"""Grid geometry, k-vectors, Hermitian weights and k-binning."""

from __future__ import annotations

import numpy as np
import pytest

from fieldhmc.models import Grid
from fieldhmc.ops import hermitian_weights
from tests.models.numpy_reference import kmag_full, kmag_half

SHAPES = [((8, 8, 8), 100.0), ((7, 6, 5), (70.0, 90.0, 55.0)), ((6, 9, 4), (50.0, 50.0, 80.0))]


@pytest.mark.parametrize("shape,box", SHAPES)
def test_sizes_and_kvectors(shape, box):
    grid = Grid(shape, box)
    box3 = np.broadcast_to(box, 3)
    assert grid.grid_shape == shape
    assert grid.box_size == tuple(float(b) for b in box3)
    assert grid.num_cells == np.prod(shape)
    assert grid.volume == pytest.approx(np.prod(box3))
    assert grid.cell_volume == pytest.approx(np.prod(box3) / np.prod(shape))
    assert grid.modes_shape == (shape[0], shape[1], shape[2] // 2 + 1)
    np.testing.assert_allclose(grid.kmag(), kmag_half(shape, box3), rtol=1e-14)
    np.testing.assert_allclose(grid.fundamental, 2 * np.pi / box3)
    # The rfft half-space holds every |k| of the full spectrum.
    full = np.sort(np.unique(np.round(kmag_full(shape, box3), 10)))
    half = np.sort(np.unique(np.round(grid.kmag(), 10)))
    np.testing.assert_allclose(full, half)


@pytest.mark.parametrize("shape,box", SHAPES)
def test_hermitian_weights_count_full_spectrum(shape, box):
    grid = Grid(shape, box)
    w = grid.hermitian_weights()
    assert w.shape == grid.modes_shape
    np.testing.assert_array_equal(w[0, 0], np.asarray(hermitian_weights(shape[2], "float64")))
    assert w.sum() == grid.num_cells


@pytest.mark.parametrize("shape,box", SHAPES)
def test_default_kbins_cover_every_nonzero_mode(shape, box):
    grid = Grid(shape, box)
    bins = grid.kbins()
    kmag = grid.kmag()
    assert bins.index.shape == grid.modes_shape
    assert bins.index[0, 0, 0] == -1
    assert np.all(bins.index[kmag > 0] >= 0)
    assert bins.num_modes.sum() == grid.num_cells - 1
    np.testing.assert_allclose(np.diff(bins.edges), grid.fundamental.min())
    assert bins.edges[0] == pytest.approx(0.5 * grid.fundamental.min())
    full = bins.num_modes > 0
    assert np.all(bins.k[full] >= bins.edges[:-1][full])
    assert np.all(bins.k[full] < bins.edges[1:][full])
    # k is the Hermitian-weighted mean |k| of the modes in the bin
    w = grid.hermitian_weights()
    i = int(np.argmax(bins.num_modes))
    sel = bins.index == i
    assert bins.k[i] == pytest.approx((w * kmag)[sel].sum() / w[sel].sum())


def test_custom_kbins_exclude_outside_and_handle_empty():
    grid = Grid((8, 8, 8), 100.0)
    kf = grid.fundamental[0]
    bins = grid.kbins([0.5 * kf, 1.5 * kf, 1.6 * kf, 2.5 * kf])
    assert bins.num_bins == 3
    assert bins.num_modes[1] == 0  # no |k| in [1.5, 1.6) kf
    assert bins.k[1] == pytest.approx(1.55 * kf)
    assert bins.num_modes[0] == 6 + 12  # |k| = kf (6 modes) and sqrt(2) kf (12)
    assert np.all(bins.index[grid.kmag() >= 2.5 * kf] == -1)


@pytest.mark.parametrize(
    "edges,match",
    [([1.0], "at least|>= 2"), ([0.1, 0.1, 0.2], "increasing"), ([0.1, np.nan], "finite")],
)
def test_bad_kbin_edges(edges, match):
    with pytest.raises(ValueError, match=match):
        Grid((4, 4, 4), 10.0).kbins(edges)


@pytest.mark.parametrize(
    "shape,box,match",
    [
        ((8, 8), 1.0, "grid_shape"),
        ((8, 0, 8), 1.0, "grid_shape"),
        ((8, 8, 8), -1.0, "box_size"),
        ((8, 8, 8), (1.0, np.inf, 1.0), "box_size"),
    ],
)
def test_bad_grid(shape, box, match):
    with pytest.raises(ValueError, match=match):
        Grid(shape, box)


def test_grid_is_frozen_and_hashable():
    grid = Grid((4, 4, 4), 10.0)
    assert grid == Grid([4, 4, 4], [10.0, 10.0, 10.0])
    assert hash(grid) == hash(Grid((4, 4, 4), 10.0))
    with pytest.raises(AttributeError):
        grid.box_size = (1.0, 1.0, 1.0)


def test_check_field_messages():
    grid = Grid((8, 8, 8), 10.0)
    with pytest.raises(
        ValueError, match=r"data has shape \(8, 8, 9\), expected grid shape \(8, 8, 8\)"
    ):
        grid.check_field(np.zeros((8, 8, 9)), "data")
    bad = np.zeros((8, 8, 8))
    bad[1, 2, 3] = np.inf
    with pytest.raises(ValueError, match=r"non-finite.*\(1, 2, 3\)"):
        grid.check_field(bad, "data")
    assert grid.check_field(np.zeros((2, 8, 8, 8)), "x", allow_batch=True).shape == (2, 8, 8, 8)
