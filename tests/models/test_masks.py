"""Survey masks."""

from __future__ import annotations

import numpy as np
import pytest

from fieldhmc.models import MASK_KINDS, Grid, make_mask

GRID = Grid((10, 8, 7), (100.0, 80.0, 70.0))


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.9])
def test_fraction_binary_and_seeded(kind, fraction):
    mask = make_mask(GRID, kind, fraction, seed=11)
    assert mask.shape == GRID.grid_shape and mask.dtype == np.float64
    assert set(np.unique(mask)) <= {0.0, 1.0}
    n = GRID.num_cells if kind != "slab" else GRID.grid_shape[0]
    masked = (mask == 0).sum() if kind != "slab" else (mask == 0).all(axis=(1, 2)).sum()
    assert masked == round(fraction * n)
    np.testing.assert_array_equal(mask, make_mask(GRID, kind, fraction, seed=11))
    if fraction > 0:
        assert not np.array_equal(mask, make_mask(GRID, kind, fraction, seed=12))


def test_slab_is_contiguous_planes_and_sphere_is_compact():
    slab = make_mask(GRID, "slab", 0.3, seed=1, axis=2)
    planes = np.flatnonzero((slab == 0).all(axis=(0, 1)))
    assert len(planes) == 2 and (np.diff(planes) == 1).all() or set(planes) == {0, 6}
    sphere = make_mask(GRID, "sphere", 0.2, seed=1)

    # a ball is much more compact than random voxels: count masked-masked neighbours
    def neighbours(m):
        z = m == 0
        return sum((z & np.roll(z, 1, axis=a)).sum() for a in range(3))

    assert neighbours(sphere) > 2 * neighbours(make_mask(GRID, "random", 0.2, seed=1))


@pytest.mark.parametrize(
    "kind,fraction,match",
    [("donut", 0.1, "kind"), ("random", 1.0, r"\[0, 1\)"), ("slab", -0.1, r"\[0, 1\)")],
)
def test_bad_mask_arguments(kind, fraction, match):
    with pytest.raises(ValueError, match=match):
        make_mask(GRID, kind, fraction, seed=0)


def test_all_masked_is_rejected():
    with pytest.raises(ValueError, match="all zeros"):
        make_mask(Grid((2, 2, 2), 1.0), "random", 0.99, seed=0)
