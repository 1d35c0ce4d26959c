"""Periodic box geometry: k-vectors of the rfft half-space, Hermitian weights, k-bins.

A real field on ``grid_shape = (n0, n1, n2)`` cells of a periodic box of side
lengths ``box_size = (L0, L1, L2)`` (Mpc/h) has ``N = n0 n1 n2`` cells of volume
``V / N`` with ``V = L0 L1 L2``. Its real FFT (:func:`fieldhmc.ops.rfft3d`) lives
on the half-spectrum ``(n0, n1, n2 // 2 + 1)`` with wave vectors

.. math::

    k_i = \\frac{2\\pi}{L_i}\\, m_i, \\qquad
    m_{0,1} \\in \\mathrm{fftfreq}(n_{0,1}) \\cdot n_{0,1}, \\quad
    m_2 \\in \\{0, \\dots, \\lfloor n_2/2 \\rfloor\\}

in h/Mpc, and each stored bin stands for :math:`w_k` modes of the full spectrum
(:func:`fieldhmc.ops.hermitian_weights`: 1 on the ``kz = 0`` plane and, for even
``n2``, the ``kz = n2/2`` plane; 2 elsewhere).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = ["Grid", "KBins"]


class KBins(NamedTuple):
    """A binning of the half-spectrum in :math:`|k|`.

    Attributes
    ----------
    index : np.ndarray
        int32 ``[n0, n1, n2 // 2 + 1]``: the bin of every half-spectrum mode;
        ``-1`` for ``k = 0`` and for modes outside ``[edges[0], edges[-1])``.
    edges : np.ndarray
        float64 ``[num_bins + 1]``, h/Mpc, increasing. Bin ``i`` is
        ``edges[i] <= |k| < edges[i + 1]``.
    k : np.ndarray
        float64 ``[num_bins]``, h/Mpc: the mean :math:`|k|` of the modes in each bin,
        weighted by the Hermitian weights (the midpoint of the edges for an empty bin).
    num_modes : np.ndarray
        float64 ``[num_bins]``: :math:`\\sum_{k \\in \\text{bin}} w_k`, the number of
        modes of the *full* spectrum in the bin (``k`` and ``-k`` counted separately).
    """

    index: np.ndarray
    edges: np.ndarray
    k: np.ndarray
    num_modes: np.ndarray

    @property
    def num_bins(self) -> int:
        """Number of bins."""
        return int(self.k.shape[0])


def _as_triple(value, name: str, kind: type) -> tuple:
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = np.repeat(arr, 3)
    if arr.shape != (3,):
        raise ValueError(f"{name} must be a scalar or have 3 entries, got {value!r}")
    return tuple(kind(a) for a in arr)


@dataclasses.dataclass(frozen=True)
class Grid:
    """A frozen description of a periodic 3D box and its Fourier half-space.

    Parameters
    ----------
    grid_shape : int or sequence of 3 int
        ``(n0, n1, n2)`` cells per axis; need not be cubic, odd sizes allowed.
    box_size : float or sequence of 3 float
        Side lengths ``(L0, L1, L2)`` in Mpc/h (a scalar gives a cube).

    Notes
    -----
    Derived arrays (``kvec``, ``kmag``, ``kbins``) are NumPy float64, recomputed
    on each call: nothing is cached.

    Examples
    --------
    >>> grid = Grid((8, 8, 9), 100.0)
    >>> grid.modes_shape
    (8, 8, 5)
    """

    grid_shape: tuple[int, int, int]
    box_size: tuple[float, float, float]

    def __post_init__(self):
        shape = _as_triple(self.grid_shape, "grid_shape", int)
        if any(n < 1 for n in shape) or not np.all(
            np.asarray(self.grid_shape) == np.round(np.asarray(self.grid_shape))
        ):
            raise ValueError(f"grid_shape must be 3 positive integers, got {self.grid_shape!r}")
        box = _as_triple(self.box_size, "box_size", float)
        if not all(math.isfinite(b) and b > 0 for b in box):
            raise ValueError(f"box_size must be positive and finite, got {self.box_size!r}")
        object.__setattr__(self, "grid_shape", shape)
        object.__setattr__(self, "box_size", box)

    # --- sizes -------------------------------------------------------------------
    @property
    def num_cells(self) -> int:
        """``N = n0 n1 n2``."""
        return math.prod(self.grid_shape)

    @property
    def volume(self) -> float:
        """``V = L0 L1 L2`` in (Mpc/h)^3."""
        return math.prod(self.box_size)

    @property
    def cell_volume(self) -> float:
        """``V / N`` in (Mpc/h)^3."""
        return self.volume / self.num_cells

    @property
    def modes_shape(self) -> tuple[int, int, int]:
        """Half-spectrum shape ``(n0, n1, n2 // 2 + 1)``."""
        n0, n1, n2 = self.grid_shape
        return (n0, n1, n2 // 2 + 1)

    @property
    def fundamental(self) -> np.ndarray:
        """Fundamental wavenumbers ``2 pi / L_i`` per axis, float64 ``[3]``, h/Mpc."""
        return 2.0 * np.pi / np.asarray(self.box_size)

    @property
    def nyquist(self) -> np.ndarray:
        """Nyquist wavenumbers ``pi n_i / L_i`` per axis, float64 ``[3]``, h/Mpc."""
        return np.pi * np.asarray(self.grid_shape) / np.asarray(self.box_size)

    # --- Fourier space -------------------------------------------------------------
    def kvec(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Wave-vector components of the half-spectrum, broadcastable.

        Returns
        -------
        tuple of np.ndarray
            float64 arrays of shapes ``[n0, 1, 1]``, ``[1, n1, 1]``,
            ``[1, 1, n2 // 2 + 1]`` in h/Mpc, matching the bin order of
            :func:`fieldhmc.ops.rfft3d` (negative frequencies after the positive
            ones on the first two axes).
        """
        (n0, n1, n2), (l0, l1, l2) = self.grid_shape, self.box_size
        k0 = 2.0 * np.pi * np.fft.fftfreq(n0, d=l0 / n0)
        k1 = 2.0 * np.pi * np.fft.fftfreq(n1, d=l1 / n1)
        k2 = 2.0 * np.pi * np.fft.rfftfreq(n2, d=l2 / n2)
        return k0[:, None, None], k1[None, :, None], k2[None, None, :]

    def kmag(self) -> np.ndarray:
        """:math:`|k|` on the half-spectrum, float64 ``[n0, n1, n2 // 2 + 1]``, h/Mpc."""
        k0, k1, k2 = self.kvec()
        return np.sqrt(k0**2 + k1**2 + k2**2)

    def hermitian_weights(self) -> np.ndarray:
        """Hermitian weights :math:`w_k` broadcast to ``modes_shape`` (float64)."""
        n2 = self.grid_shape[2]
        kz = np.arange(n2 // 2 + 1)
        w = np.where((kz == 0) | ((n2 % 2 == 0) & (kz == n2 // 2)), 1.0, 2.0)
        return np.broadcast_to(w, self.modes_shape).copy()

    def default_kbin_edges(self) -> np.ndarray:
        """Edges at half-integer multiples of the smallest fundamental.

        .. math:: e_i = (i + \\tfrac12)\\, k_f, \\qquad k_f = 2\\pi / \\max_i L_i,

        from :math:`k_f / 2` up to the first edge above the largest :math:`|k|` of
        the grid, so every mode except ``k = 0`` is binned and bin ``i`` is centred
        on :math:`(i + 1) k_f`.
        """
        kf = float(self.fundamental.min())
        kmax = float(self.kmag().max())
        num_bins = max(1, int(np.floor(kmax / kf - 0.5)) + 1)
        return kf * (np.arange(num_bins + 1) + 0.5)

    def kbins(self, edges: Sequence[float] | np.ndarray | None = None) -> KBins:
        """Bin the half-spectrum in :math:`|k|`.

        Parameters
        ----------
        edges : array-like, optional
            Increasing bin edges in h/Mpc, at least 2. Default
            :meth:`default_kbin_edges` (fundamental spacing).

        Returns
        -------
        KBins
            Bin index per mode (``-1``: ``k = 0`` or outside the edges), edges, mean
            :math:`|k|` per bin and mode counts :math:`\\sum w_k`.
        """
        if edges is None:
            edges = self.default_kbin_edges()
        edges = np.asarray(edges, dtype=np.float64)
        if edges.ndim != 1 or edges.size < 2:
            raise ValueError(f"k-bin edges must be a 1D array of >= 2 values, got {edges!r}")
        if not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0):
            raise ValueError("k-bin edges must be finite and strictly increasing")
        kmag = self.kmag()
        index = np.searchsorted(edges, kmag, side="right") - 1
        outside = (index < 0) | (index >= edges.size - 1) | (kmag == 0)
        index = np.where(outside, -1, index).astype(np.int32)
        w = self.hermitian_weights()
        num_bins = edges.size - 1
        sel = index >= 0
        num_modes = np.bincount(index[sel], weights=w[sel], minlength=num_bins)
        ksum = np.bincount(index[sel], weights=(w * kmag)[sel], minlength=num_bins)
        mid = 0.5 * (edges[:-1] + edges[1:])
        with np.errstate(invalid="ignore", divide="ignore"):
            k = np.where(num_modes > 0, ksum / np.maximum(num_modes, 1e-300), mid)
        return KBins(index=index, edges=edges, k=k, num_modes=num_modes)

    # --- validation ------------------------------------------------------------------
    def check_field(self, value, name: str, *, allow_batch: bool = False) -> np.ndarray:
        """Return ``value`` as a float64 array of the grid's shape, or raise ``ValueError``.

        Parameters
        ----------
        value : array-like
            Real values ``[n0, n1, n2]`` (``[..., n0, n1, n2]`` if ``allow_batch``).
        name : str
            Used in the error message, e.g. ``"data"``.
        allow_batch : bool
            Accept leading batch axes.
        """
        arr = np.asarray(value, dtype=np.float64)
        trailing = arr.shape[-3:] if arr.ndim >= 3 else arr.shape
        ok = trailing == self.grid_shape and (allow_batch or arr.ndim == 3)
        if not ok:
            raise ValueError(f"{name} has shape {arr.shape}, expected grid shape {self.grid_shape}")
        bad = ~np.isfinite(arr)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"{name} contains {int(bad.sum())} non-finite values (NaN/Inf), "
                f"first at index {where}"
            )
        return arr
