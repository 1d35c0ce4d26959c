"""Survey masks on a periodic grid: slab, sphere or random voxels, seeded, NumPy.

A mask is float64 ``[n0, n1, n2]`` with 1 for an observed voxel and 0 for a masked
one. ``fraction`` is the *masked* fraction; the number of masked voxels (or planes
for a slab) is rounded to the nearest integer.
"""

from __future__ import annotations

import numpy as np

from fieldhmc.models.grid import Grid

__all__ = ["MASK_KINDS", "make_mask"]

MASK_KINDS: tuple[str, ...] = ("slab", "sphere", "random")


def make_mask(grid: Grid, kind: str, fraction: float, seed: int, axis: int = 0) -> np.ndarray:
    """Make a seeded binary survey mask.

    Parameters
    ----------
    grid : Grid
        The box.
    kind : {"slab", "sphere", "random"}
        * ``"slab"``: ``round(fraction * n_axis)`` consecutive planes normal to
          ``axis``, starting at a random plane, wrapping periodically;
        * ``"sphere"``: the ``round(fraction * N)`` voxels nearest (periodic physical
          distance) to a uniformly random centre — a ball of that volume;
        * ``"random"``: ``round(fraction * N)`` voxels chosen uniformly without
          replacement.
    fraction : float
        Masked fraction in ``[0, 1)``.
    seed : int
        Seed of a ``numpy.random.default_rng``.
    axis : int
        Slab normal (``"slab"`` only).

    Returns
    -------
    np.ndarray
        float64 ``[n0, n1, n2]`` of 0 (masked) and 1 (observed); at least one voxel
        is observed.

    Raises
    ------
    ValueError
        For an unknown kind, a fraction outside ``[0, 1)``, or a mask with no
        observed voxel.
    """
    if kind not in MASK_KINDS:
        raise ValueError(f"mask kind must be one of {MASK_KINDS}, got {kind!r}")
    fraction = float(fraction)
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"masked fraction must be in [0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    shape = grid.grid_shape
    n = grid.num_cells
    mask = np.ones(shape, dtype=np.float64)
    if kind == "slab":
        if axis not in (0, 1, 2):
            raise ValueError(f"slab axis must be 0, 1 or 2, got {axis}")
        planes = int(round(fraction * shape[axis]))
        start = int(rng.integers(shape[axis]))
        idx = (start + np.arange(planes)) % shape[axis]
        index = [slice(None)] * 3
        index[axis] = idx
        mask[tuple(index)] = 0.0
    elif kind == "sphere":
        count = int(round(fraction * n))
        centre = rng.uniform(0.0, 1.0, size=3) * np.asarray(grid.box_size)
        dist2 = np.zeros(shape)
        for ax in range(3):
            cell = grid.box_size[ax] / shape[ax]
            x = (np.arange(shape[ax]) + 0.5) * cell - centre[ax]
            x = x - grid.box_size[ax] * np.round(x / grid.box_size[ax])
            dist2 = dist2 + (x**2).reshape([-1 if a == ax else 1 for a in range(3)])
        order = np.argsort(dist2, axis=None, kind="stable")
        mask.reshape(-1)[order[:count]] = 0.0
    else:  # random
        count = int(round(fraction * n))
        mask.reshape(-1)[rng.choice(n, size=count, replace=False)] = 0.0
    if not mask.any():
        raise ValueError(f"mask is all zeros ({kind}, fraction {fraction}): no voxel is observed")
    return mask
