"""Convergence of whole fields: R-hat and ESS of every Fourier mode, per k-bin, and voxels."""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import fft as sp_fft

from fieldhmc.diagnostics.convergence import (
    _CHUNK_ELEMENTS,
    RHAT_THRESHOLD,
    _apply_columns,
    _convergence_block,
)


def _independent_mode_masks(grid_shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the half-spectrum keeping one mode of each conjugate pair.

    On the self-conjugate planes (:math:`k_z = 0` and, for even ``n2``, the Nyquist plane)
    mode :math:`(i, j)` equals the conjugate of :math:`(-i, -j)`; the real part keeps the
    lexicographically smaller of the two, the imaginary part additionally drops the
    self-conjugate modes (purely real: :math:`k=0` and Nyquist corners).
    """
    n0, n1, n2 = (int(n) for n in grid_shape)
    nh = n2 // 2 + 1
    keep_real = np.ones((n0, n1, nh), dtype=bool)
    keep_imag = np.ones((n0, n1, nh), dtype=bool)
    i = np.arange(n0)[:, None]
    j = np.arange(n1)[None, :]
    flat = i * n1 + j
    partner = ((-i) % n0) * n1 + (-j) % n1
    planes = [0] + ([n2 // 2] if n2 % 2 == 0 else [])
    for plane in planes:
        keep_real[:, :, plane] = flat <= partner
        keep_imag[:, :, plane] = flat < partner
    return keep_real, keep_imag


def _group_stats(
    values: np.ndarray, labels: np.ndarray, nbins: int, reducers: Mapping[str, Callable]
) -> dict[str, np.ndarray]:
    """Apply NaN-aware reducers to ``values`` grouped by integer ``labels`` in [0, nbins)."""
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    sorted_values = values[order]
    bounds = np.searchsorted(sorted_labels, np.arange(nbins + 1))
    out = {name: np.full(nbins, np.nan) for name in reducers}
    for b in range(nbins):
        group = sorted_values[bounds[b] : bounds[b + 1]]
        group = group[~np.isnan(group)]
        if group.size:
            for name, fn in reducers.items():
                out[name][b] = fn(group)
    return out


def _worst(score: np.ndarray, num: int, *, largest: bool) -> np.ndarray:
    """Indices of the ``num`` worst entries; NaN counts as worst (e.g. a frozen mode)."""
    key = np.where(np.isnan(score), np.inf, score if largest else -score)
    num = min(num, key.size)
    if num == 0:
        return np.zeros(0, dtype=int)
    idx = np.argpartition(-key, num - 1)[:num]
    return idx[np.argsort(-key[idx], kind="stable")]


def mode_convergence(
    modes: ArrayLike,
    kbin_index: ArrayLike,
    nbins: int,
    grid_shape: Sequence[int],
    *,
    k: ArrayLike | None = None,
    num_worst: int = 10,
    rhat_threshold: float = RHAT_THRESHOLD,
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """R-hat and bulk ESS of every stored Fourier mode, summarised per k-bin.

    The real and imaginary parts of each independent mode are treated as separate
    scalars. Redundant conjugate partners on the self-conjugate planes and the identically
    zero imaginary parts of self-conjugate modes are skipped, as are modes with
    ``kbin_index < 0`` (e.g. :math:`k = 0`).

    Parameters
    ----------
    modes : array_like, complex, shape (chain, draw, n0, n1, n2 // 2 + 1)
        Half-spectrum draws, ``numpy.fft.rfftn(field, axes=(-3, -2, -1))`` convention.
    kbin_index : array_like of int, shape (n0, n1, n2 // 2 + 1)
        k-bin of each mode in ``[0, nbins)``; ``-1`` excludes the mode.
    nbins : int
        Number of k-bins.
    grid_shape : sequence of 3 int
        Real-space grid ``(n0, n1, n2)`` (needed to tell whether ``n2`` is even).
    k : array_like, shape (nbins,), optional
        Bin centres in h/Mpc, copied into the output for reports and plots.
    num_worst : int, default 10
        Number of worst modes listed (largest R-hat, smallest ESS).
    rhat_threshold : float, default 1.01
        Modes with R-hat above this (or NaN) are counted as not converged.
    chunk_size : int, optional
        Columns per chunk for the vectorised estimators.

    Returns
    -------
    dict
        ``num_chains``, ``num_draws``, ``grid_shape``, ``k`` (or None), ``rhat_threshold``;
        ``kbins``: dict of (nbins,) arrays ``num_modes`` (independent complex modes),
        ``num_values`` (real scalars), ``r_hat_min``, ``r_hat_median``, ``r_hat_max``,
        ``ess_bulk_min``, ``ess_bulk_median``, ``num_rhat_above``; ``overall``: dict with
        ``num_values``, ``r_hat_max``, ``ess_bulk_min``, ``ess_bulk_median``,
        ``num_rhat_above``; ``worst_r_hat`` and ``worst_ess_bulk``: lists of
        ``{"name", "index" [i, j, l], "part", "kbin", "r_hat", "ess_bulk"}``.
    """
    modes = np.asarray(modes)
    grid_shape = tuple(int(n) for n in grid_shape)
    half_shape = (grid_shape[0], grid_shape[1], grid_shape[2] // 2 + 1)
    if modes.ndim != 5 or modes.shape[2:] != half_shape:
        raise ValueError(f"modes must have shape (chain, draw, {half_shape}), got {modes.shape}")
    kbins = np.asarray(kbin_index).astype(int)
    if kbins.shape != half_shape:
        raise ValueError(f"kbin_index must have shape {half_shape}, got {kbins.shape}")
    c, n = modes.shape[:2]
    keep_real, keep_imag = _independent_mode_masks(grid_shape)
    valid = (kbins >= 0) & (kbins < nbins)
    sel_real = np.flatnonzero(keep_real & valid)
    sel_imag = np.flatnonzero(keep_imag & valid)

    flat = modes.reshape(c, n, -1)
    step = chunk_size or max(1, _CHUNK_ELEMENTS // (c * n))
    results = []
    for part, sel in (("real", sel_real), ("imag", sel_imag)):
        both = np.full((2, sel.size), np.nan)
        if n >= 4:
            for start in range(0, sel.size, step):  # gather one chunk of modes at a time
                values = getattr(flat[:, :, sel[start : start + step]], part)
                both[:, start : start + step] = _convergence_block(
                    np.ascontiguousarray(values.transpose(2, 0, 1), dtype=float)
                )
        results.append(both)
    r_hat_all = np.concatenate([results[0][0], results[1][0]])
    ess_all = np.concatenate([results[0][1], results[1][1]])
    flat_index = np.concatenate([sel_real, sel_imag])
    parts = np.array(["real"] * sel_real.size + ["imag"] * sel_imag.size)
    labels = kbins.reshape(-1)[flat_index]
    if c < 2:
        r_hat_all = np.full_like(r_hat_all, np.nan)

    above = ~(r_hat_all <= rhat_threshold) if c >= 2 else np.zeros(r_hat_all.shape, bool)
    per_bin = _group_stats(
        r_hat_all,
        labels,
        nbins,
        {"r_hat_min": np.min, "r_hat_median": np.median, "r_hat_max": np.max},
    )
    per_bin.update(
        _group_stats(ess_all, labels, nbins, {"ess_bulk_min": np.min, "ess_bulk_median": np.median})
    )
    per_bin["num_values"] = np.bincount(labels, minlength=nbins)[:nbins]
    per_bin["num_modes"] = np.bincount(kbins.reshape(-1)[sel_real], minlength=nbins)[:nbins]
    per_bin["num_rhat_above"] = np.bincount(labels, weights=above, minlength=nbins)[:nbins].astype(
        int
    )

    def describe(idx: np.ndarray) -> list[dict[str, Any]]:
        entries = []
        for t in idx:
            ijl = [int(v) for v in np.unravel_index(flat_index[t], half_shape)]
            entries.append(
                {
                    "name": f"mode[{ijl[0]},{ijl[1]},{ijl[2]}].{parts[t]}",
                    "index": ijl,
                    "part": str(parts[t]),
                    "kbin": int(labels[t]),
                    "r_hat": float(r_hat_all[t]),
                    "ess_bulk": float(ess_all[t]),
                }
            )
        return entries

    finite_ess = ess_all[~np.isnan(ess_all)]
    return {
        "num_chains": c,
        "num_draws": n,
        "grid_shape": list(grid_shape),
        "k": None if k is None else np.asarray(k, dtype=float),
        "rhat_threshold": rhat_threshold,
        "kbins": per_bin,
        "overall": {
            "num_values": int(r_hat_all.size),
            "r_hat_max": _nanreduce(np.max, r_hat_all),
            "ess_bulk_min": _nanreduce(np.min, ess_all),
            "ess_bulk_median": float(np.median(finite_ess)) if finite_ess.size else math.nan,
            "num_rhat_above": int(above.sum()),
        },
        "worst_r_hat": describe(_worst(r_hat_all, num_worst, largest=True)) if c >= 2 else [],
        "worst_ess_bulk": describe(_worst(ess_all, num_worst, largest=False)),
    }


def _nanreduce(fn: Callable, values: np.ndarray) -> float:
    finite = values[~np.isnan(values)]
    return float(fn(finite)) if finite.size else math.nan


def field_convergence(
    field_draws: ArrayLike,
    kbin_index: ArrayLike,
    nbins: int,
    *,
    k: ArrayLike | None = None,
    num_worst: int = 10,
    include_voxels: bool = True,
    rhat_threshold: float = RHAT_THRESHOLD,
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """Convergence of whole-field draws: per-k-bin summary of all modes, plus voxels.

    Parameters
    ----------
    field_draws : array_like, float, shape (chain, draw, n0, n1, n2)
        Real-space field draws (typically thinned). The half-spectrum modes are computed
        once with ``scipy.fft.rfftn`` in the draws' precision (complex64 for float32
        draws: about one extra copy of the draws in memory); the statistics are then
        computed in chunks of ~2M values.
    kbin_index : array_like of int, shape (n0, n1, n2 // 2 + 1)
        k-bin of each half-spectrum mode; ``-1`` excludes it.
    nbins : int
        Number of k-bins.
    k : array_like, shape (nbins,), optional
        Bin centres in h/Mpc.
    num_worst : int, default 10
        Worst modes (and voxels) listed.
    include_voxels : bool, default True
        Also compute R-hat/bulk ESS of every voxel (summarised over the grid).
    rhat_threshold : float, default 1.01
    chunk_size : int, optional

    Returns
    -------
    dict
        As :func:`mode_convergence`, plus ``voxels`` (when ``include_voxels``):
        ``{"num_values", "r_hat_max", "r_hat_median", "ess_bulk_min", "ess_bulk_median",
        "num_rhat_above", "worst_r_hat": [{"index", "r_hat", "ess_bulk"}], ...}``.
    """
    x = np.asarray(field_draws)
    if x.ndim != 5:
        raise ValueError(f"field_draws must have shape (chain, draw, n0, n1, n2), got {x.shape}")
    # scipy keeps single precision (complex64 modes for float32 draws, half of NumPy's
    # complex128) and uses both cores.
    modes = sp_fft.rfftn(x, axes=(-3, -2, -1), workers=-1)
    out = mode_convergence(
        modes,
        kbin_index,
        nbins,
        x.shape[2:],
        k=k,
        num_worst=num_worst,
        rhat_threshold=rhat_threshold,
        chunk_size=chunk_size,
    )
    del modes
    if include_voxels:
        c = x.shape[0]
        both = _apply_columns(
            _convergence_block, x, min_chains=1, chunk_size=chunk_size, num_outputs=2
        )
        r_vox = both[0].reshape(-1) if c >= 2 else np.full(both[0].size, np.nan)
        e_vox = both[1].reshape(-1)
        above = ~(r_vox <= rhat_threshold) if c >= 2 else np.zeros(r_vox.shape, bool)

        def describe(idx: np.ndarray) -> list[dict[str, Any]]:
            return [
                {
                    "index": [int(v) for v in np.unravel_index(t, x.shape[2:])],
                    "r_hat": float(r_vox[t]),
                    "ess_bulk": float(e_vox[t]),
                }
                for t in idx
            ]

        out["voxels"] = {
            "num_values": int(r_vox.size),
            "r_hat_max": _nanreduce(np.max, r_vox),
            "r_hat_median": _nanreduce(np.median, r_vox),
            "ess_bulk_min": _nanreduce(np.min, e_vox),
            "ess_bulk_median": _nanreduce(np.median, e_vox),
            "num_rhat_above": int(above.sum()),
            "worst_r_hat": describe(_worst(r_vox, num_worst, largest=True)) if c >= 2 else [],
            "worst_ess_bulk": describe(_worst(e_vox, num_worst, largest=False)),
        }
    return out
