"""Convergence of whole fields: R-hat and ESS of every Fourier mode, per k-bin, and voxels.

Which modes count as not converged is decided by the multiplicity-aware test of
:mod:`fieldhmc.diagnostics.multiplicity`, not by the single-quantity 1.01 rule.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import fft as sp_fft

from fieldhmc.diagnostics import multiplicity
from fieldhmc.diagnostics.convergence import (
    RHAT_THRESHOLD,
    _apply_columns,
    _as_draws,
    _autocov,
    _between_within,
    _column_blocks,
    _convergence_block,
    _default_step,
    _ess_from_autocov,
    _frozen_chains,
    _map_in_order,
    _rhat_from_ratio,
    _split_chains,
    _z_scale,
)
from fieldhmc.diagnostics.multiplicity import FIELD_FALSE_ALARM


def self_conjugate_mask(grid_shape: Sequence[int]) -> np.ndarray:
    """Which half-spectrum modes are their own conjugate partner (purely real).

    Mode :math:`\\mathbf k = (i, j, l)` of a real field is self-conjugate when
    :math:`-\\mathbf k \\equiv \\mathbf k`, i.e. :math:`2k_a \\equiv 0 \\pmod{n_a}` on every
    axis: :math:`k_a = 0`, or :math:`k_a = n_a/2` for even :math:`n_a`. There are 8 on a
    grid with all sizes even, 1 (:math:`k = 0`) with all odd, on any shape; their
    imaginary part is zero by Hermitian symmetry (round-off of a float32 FFT aside), so
    it is never a sampled quantity.

    Parameters
    ----------
    grid_shape : sequence of 3 int
        Real-space grid ``(n0, n1, n2)``.

    Returns
    -------
    numpy.ndarray of bool, shape (n0, n1, n2 // 2 + 1)
    """
    axes = [np.arange(n) for n in grid_shape[:2]] + [np.arange(int(grid_shape[2]) // 2 + 1)]
    per_axis = [(2 * k) % int(n) == 0 for k, n in zip(axes, grid_shape, strict=True)]
    return per_axis[0][:, None, None] & per_axis[1][None, :, None] & per_axis[2][None, None, :]


def is_self_conjugate(index: Sequence[int], grid_shape: Sequence[int]) -> bool:
    """Whether half-spectrum mode ``index = (i, j, l)`` is self-conjugate
    (:math:`2k \\equiv 0 \\bmod n` on every axis; see :func:`self_conjugate_mask`)."""
    return all((2 * int(k)) % int(n) == 0 for k, n in zip(index, grid_shape, strict=True))


def _independent_mode_masks(grid_shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the half-spectrum keeping one mode of each conjugate pair.

    On the self-paired planes (:math:`k_z = 0` and, for even ``n2``, the Nyquist plane)
    mode :math:`(i, j)` equals the conjugate of :math:`(-i, -j)`; the real part keeps the
    lexicographically smaller of the two, the imaginary part additionally drops the
    self-conjugate modes (:func:`self_conjugate_mask`: purely real).
    """
    n0, n1, n2 = (int(n) for n in grid_shape)
    nh = n2 // 2 + 1
    keep_real = np.ones((n0, n1, nh), dtype=bool)
    i = np.arange(n0)[:, None]
    j = np.arange(n1)[None, :]
    flat = i * n1 + j
    partner = ((-i) % n0) * n1 + (-j) % n1
    planes = [0] + ([n2 // 2] if n2 % 2 == 0 else [])
    for plane in planes:
        keep_real[:, :, plane] = flat <= partner
    return keep_real, keep_real & ~self_conjugate_mask(grid_shape)


def _group_stats(
    values: np.ndarray,
    labels: np.ndarray,
    nbins: int,
    reducers: Mapping[str, Callable],
    order: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Apply NaN-aware reducers to ``values`` grouped by integer ``labels`` in [0, nbins).

    ``order``, if given, is ``np.argsort(labels, kind="stable")`` (shared between calls).
    """
    if order is None:
        order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(nbins + 1))
    sorted_values = values[order]
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
    num = min(num, score.size)
    if num == 0:
        return np.zeros(0, dtype=int)
    neg_key = np.negative(score) if largest else score.copy()  # one float64 per value
    neg_key[np.isnan(neg_key)] = -np.inf
    idx = np.argpartition(neg_key, num - 1)[:num]
    return idx[np.argsort(neg_key[idx], kind="stable")]


_STAT_ROWS = ("r_hat", "ess_bulk", "ratio_bulk", "ratio_tail", "tau_bulk", "tau_tail")


def _batch_ratio(x: np.ndarray, num_batches: int) -> np.ndarray:
    """Within-chain analogue of :math:`B/W`: batch means of one chain against each other.

    Each chain of ``(m, chain, draw)`` is cut into ``num_batches`` batches of
    :math:`L` draws; :math:`L\\,\\overline{\\mathrm{var}}(\text{batch means}) / W`
    estimates the autocorrelation time at length :math:`L` and, unlike the ESS, does not
    see a shift or a stuck chain (only differences within each chain enter).
    """
    m, c, n = x.shape
    size = n // num_batches
    means = x[..., : size * num_batches].reshape(m, c, num_batches, size).mean(axis=-1)
    within = x.var(axis=-1, ddof=1).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return size * means.var(axis=-1, ddof=1).mean(axis=-1) / within


def _batch_tau(x: np.ndarray) -> np.ndarray:
    """Expected :math:`B/W` of converged chains like ``x``, from within-chain batches.

    Batch-mean estimates at lengths :math:`N/2` and :math:`N/4` are extrapolated to the
    chain length :math:`N` (their bias, from autocorrelation across batch boundaries and
    the finite length, falls like :math:`1/L`): :math:`\tau_N \approx \tau_{N/2} +
    (\tau_{N/2} - \tau_{N/4})/2`.
    """
    half, quarter = _batch_ratio(x, 2), _batch_ratio(x, 4)
    return half + 0.5 * (half - quarter)


def _mode_block(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column statistics of ``(m, chain, draw)`` for the multiplicity-aware test.

    Returns the rows :data:`_STAT_ROWS` as a ``(6, m)`` array (NaN for columns with a
    frozen chain) and the ``(m, chain)`` frozen-chain mask. ``r_hat`` and ``ess_bulk``
    equal :func:`~fieldhmc.diagnostics.rhat` and :func:`~fieldhmc.diagnostics.ess_bulk`;
    ``tau_*`` are the per-column :func:`_batch_tau` of the bulk and tail values, which
    are averaged over modes into the reference scale of ``ratio_*``.
    """
    split = _split_chains(x)
    n = split.shape[-1]
    z = _z_scale(split)
    folded = _z_scale(np.abs(split - np.median(split, axis=(1, 2), keepdims=True)))
    ratio_bulk = _between_within(z)
    ratio_tail = _between_within(folded)
    r_hat = np.maximum(_rhat_from_ratio(ratio_bulk, n), _rhat_from_ratio(ratio_tail, n))
    ess = _ess_from_autocov(z, _autocov(z))
    out = np.stack([r_hat, ess, ratio_bulk, ratio_tail, _batch_tau(z), _batch_tau(folded)])
    frozen = _frozen_chains(x)
    out[:, frozen.any(axis=1)] = np.nan
    return out, frozen


def _check_modes(
    modes: ArrayLike, kbin_index: ArrayLike, grid_shape: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    modes = _as_draws(modes)  # an h5py.Dataset is read in slabs, not loaded whole
    grid_shape = tuple(int(n) for n in grid_shape)
    half_shape = (grid_shape[0], grid_shape[1], grid_shape[2] // 2 + 1)
    if modes.ndim != 5 or tuple(modes.shape[2:]) != half_shape:
        raise ValueError(f"modes must have shape (chain, draw, {half_shape}), got {modes.shape}")
    kbins = np.asarray(kbin_index)
    if kbins.dtype.kind not in "iu":
        kbins = kbins.astype(int)
    if kbins.shape != half_shape:
        raise ValueError(f"kbin_index must have shape {half_shape}, got {kbins.shape}")
    return modes, kbins, half_shape


def _select_values(
    kbins: np.ndarray, nbins: int, grid_shape: Sequence[int]
) -> tuple[np.ndarray, int]:
    """Flat half-spectrum index of every independent real value, real parts first.

    Returns the ascending flat indices of the real parts followed by those of the
    imaginary parts (the smallest integer type that holds them: 4 bytes per value up to
    2³¹ modes) and the number of real parts: value ``t`` is a real part iff
    ``t < num_real``.
    """
    keep_real, keep_imag = _independent_mode_masks(grid_shape)
    valid = (kbins >= 0) & (kbins < nbins)
    dtype = np.int32 if keep_real.size < 2**31 else np.int64
    sel_real = np.flatnonzero(keep_real & valid).astype(dtype)
    sel_imag = np.flatnonzero(keep_imag & valid).astype(dtype)
    return np.concatenate([sel_real, sel_imag]), int(sel_real.size)


def _value_labels(kbins: np.ndarray, flat_index: np.ndarray, nbins: int) -> np.ndarray:
    """k-bin of each selected value, in the smallest integer type holding ``nbins``."""
    dtype = np.int16 if nbins < 2**15 else np.int32
    return kbins.reshape(-1)[flat_index].astype(dtype)


def _part_slices(flat_index: np.ndarray, num_real: int):
    """``(part, offset, ascending flat indices)`` of the real and the imaginary parts."""
    return (("real", 0, flat_index[:num_real]), ("imag", num_real, flat_index[num_real:]))


def _mode_statistics(
    modes: np.ndarray,
    flat_index: np.ndarray,
    num_real: int,
    labels: np.ndarray,
    nbins: int,
    chunk_size: int | None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """:func:`_mode_block` over all selected values, one block of consecutive modes at a time.

    Each block is read once for both parts (in slabs when ``modes`` is out of core, see
    :func:`~fieldhmc.diagnostics.convergence._column_blocks`), then its selected values.
    Only what the test needs per value is kept (``r_hat``, ``ess_bulk``, ``ratio_bulk``,
    ``ratio_tail``: 4 float64); the autocorrelation estimates ``tau_*`` enter only as
    their k-bin sums and counts (``tau_bulk_sums``, ``tau_bulk_counts``, ... of shape
    ``(nbins,)``, finite values only), and the frozen-chain mask only as the number of
    frozen values per chain (returned, shape ``(chain,)``). ``farthest`` holds, per value,
    the chain whose mean is farthest from the others' (:func:`_farthest_chain`, one byte
    per value for up to 127 chains), so that the flagged values' outlier chains need no
    second read of ``modes``.
    """
    c, n = modes.shape[:2]
    m = flat_index.size
    keep = ("r_hat", "ess_bulk", "ratio_bulk", "ratio_tail")
    out = {key: np.full(m, np.nan) for key in keep}
    for key in ("tau_bulk", "tau_tail"):
        out[key + "_sums"] = np.zeros(nbins)
        out[key + "_counts"] = np.zeros(nbins, dtype=np.int64)
    out["farthest"] = np.zeros(m, dtype=np.int8 if c < 2**7 else np.int32)
    frozen_per_chain = np.zeros(c, dtype=np.int64)
    rows = {key: _STAT_ROWS.index(key) for key in (*keep, "tau_bulk", "tau_tail")}
    step = chunk_size or _default_step(c, n)
    parts = _part_slices(flat_index, num_real)

    def compute(lo, hi, cols):
        results = []
        for part, offset, sel in parts:
            a, b = np.searchsorted(sel, [lo, hi])
            if a < b:
                values = getattr(cols[:, :, sel[a:b] - lo], part)
                block = np.ascontiguousarray(values.transpose(2, 0, 1), dtype=float)
                stats, frozen = _mode_block(block)
                results.append(
                    (slice(offset + a, offset + b), stats, frozen, _farthest_chain(block))
                )
        return results

    blocks = _column_blocks(modes, step) if n >= 4 else ()
    for results in _map_in_order(compute, blocks):
        for where, stats, frozen, farthest in results:
            for key in keep:
                out[key][where] = stats[rows[key]]
            out["farthest"][where] = farthest
            block_labels = labels[where]
            for key in ("tau_bulk", "tau_tail"):
                tau = stats[rows[key]]
                finite = np.isfinite(tau)
                out[key + "_sums"] += np.bincount(
                    block_labels[finite], weights=tau[finite], minlength=nbins
                )[:nbins]
                out[key + "_counts"] += np.bincount(block_labels[finite], minlength=nbins)[:nbins]
            frozen_per_chain += frozen.sum(axis=0)
    if c < 2:  # one chain: no between-chain comparison
        for key in ("r_hat", "ratio_bulk", "ratio_tail"):
            out[key] = np.full(m, np.nan)
    return out, frozen_per_chain


#: Values per piece when the p-values are computed (bounds SciPy's temporaries).
_PVALUE_CHUNK = 1 << 14


def _multiplicity_test(
    stats: Mapping[str, np.ndarray],
    labels: np.ndarray,
    nbins: int,
    shape: tuple[int, int],
    false_alarm: float,
) -> dict[str, Any]:
    """p-values against converged chains and Benjamini–Hochberg flags (see multiplicity).

    ``stats`` as returned by :func:`_mode_statistics`; the p-values are computed in pieces
    of :data:`_PVALUE_CHUNK` values (float64, one per value).
    """
    c, n = shape
    split = (2 * c, n // 2)
    tau_bulk = multiplicity.reference_tau_from_sums(
        stats["tau_bulk_sums"], stats["tau_bulk_counts"]
    )
    tau_tail = multiplicity.reference_tau_from_sums(
        stats["tau_tail_sums"], stats["tau_tail_counts"]
    )
    counts = stats["tau_bulk_counts"].sum()
    tau_all = float(stats["tau_bulk_sums"].sum() / counts) if counts else math.nan
    ratio_bulk, ratio_tail = stats["ratio_bulk"], stats["ratio_tail"]
    p = np.empty(ratio_bulk.size)
    for lo in range(0, p.size, _PVALUE_CHUNK):
        s = slice(lo, lo + _PVALUE_CHUNK)
        lab = labels[s]
        p[s] = multiplicity.rhat_pvalue(
            ratio_bulk[s], ratio_tail[s], tau_bulk[lab], tau_tail[lab], *split
        )
    return {
        "p_value": p,
        "flagged": multiplicity.benjamini_hochberg(p, false_alarm),
        "tau_ref": tau_bulk,
        "tau_all": tau_all,
        "r_hat_q99": multiplicity.rhat_reference_quantile(0.01, tau_all, *split),
    }


def _kbin_table(
    stats: Mapping[str, np.ndarray],
    test: Mapping[str, Any],
    labels: np.ndarray,
    num_real: int,
    nbins: int,
    rhat_threshold: float,
) -> dict[str, np.ndarray]:
    r_hat, ess = stats["r_hat"], stats["ess_bulk"]
    order = np.argsort(labels, kind="stable")
    per_bin = _group_stats(
        r_hat,
        labels,
        nbins,
        {"r_hat_min": np.min, "r_hat_median": np.median, "r_hat_max": np.max},
        order,
    )
    per_bin.update(
        _group_stats(
            ess, labels, nbins, {"ess_bulk_min": np.min, "ess_bulk_median": np.median}, order
        )
    )
    del order
    per_bin["tau_ref"] = test["tau_ref"]

    def count(mask: np.ndarray, lab: np.ndarray = labels) -> np.ndarray:
        return np.bincount(lab[mask], minlength=nbins)[:nbins]

    per_bin["num_values"] = np.bincount(labels, minlength=nbins)[:nbins]
    per_bin["num_modes"] = np.bincount(labels[:num_real], minlength=nbins)[:nbins]
    per_bin["num_rhat_above"] = count(r_hat > rhat_threshold)
    per_bin["num_flagged"] = count(test["flagged"])
    per_bin["num_undefined"] = count(np.isnan(ess))
    return per_bin


def _farthest_chain(block: np.ndarray) -> np.ndarray:
    """Per column of a ``(column, chain, draw)`` block: the chain whose mean is farthest.

    Distance of each chain's mean from the mean of the other chains', in units of the
    pooled draw sd; a single stuck or shifted chain is then the farthest in most of the
    values it spoils. Zero for one chain.
    """
    c = block.shape[1]
    if c < 2:
        return np.zeros(block.shape[0], dtype=int)
    means = block.mean(axis=2)
    others = (means.sum(axis=1, keepdims=True) - means) / (c - 1)
    distance = np.abs(means - others) / (block.std(axis=(1, 2))[:, None] + 1e-300)
    return np.argmax(distance, axis=1)


def _outlier_chains(farthest: np.ndarray, idx: np.ndarray, num_chains: int) -> list[int]:
    """How often each chain is the farthest (:func:`_farthest_chain`) over the values ``idx``."""
    if num_chains < 2 or idx.size == 0:
        return [0] * num_chains
    return np.bincount(farthest[idx], minlength=num_chains).tolist()


def _describe_modes(
    idx: np.ndarray,
    flat_index: np.ndarray,
    num_real: int,
    labels: np.ndarray,
    half_shape: tuple[int, int, int],
    columns: Mapping[str, np.ndarray],
) -> list[dict[str, Any]]:
    entries = []
    for t in idx:
        ijl = [int(v) for v in np.unravel_index(flat_index[t], half_shape)]
        part = "real" if t < num_real else "imag"
        entry = {
            "name": f"mode[{ijl[0]},{ijl[1]},{ijl[2]}].{part}",
            "index": ijl,
            "part": part,
            "kbin": int(labels[t]),
        }
        entry.update({key: float(values[t]) for key, values in columns.items()})
        entries.append(entry)
    return entries


def mode_convergence(
    modes: ArrayLike,
    kbin_index: ArrayLike,
    nbins: int,
    grid_shape: Sequence[int],
    *,
    k: ArrayLike | None = None,
    num_worst: int = 10,
    rhat_threshold: float = RHAT_THRESHOLD,
    false_alarm: float = FIELD_FALSE_ALARM,
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """R-hat and bulk ESS of every stored Fourier mode, tested together, per k-bin.

    The real and imaginary parts of each independent mode are treated as separate
    scalars. Redundant conjugate partners on the self-conjugate planes and the identically
    zero imaginary parts of self-conjugate modes are skipped, as are modes with
    ``kbin_index < 0`` (e.g. :math:`k = 0`). A mode is *flagged* when its R-hat is larger
    than converged chains of the same shape and autocorrelation give, by the
    Benjamini–Hochberg test of :mod:`fieldhmc.diagnostics.multiplicity` at level
    ``false_alarm``; a mode with a chain that never moves has undefined R-hat and ESS.

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
        Number of worst modes listed (largest R-hat, smallest ESS, most significant).
    rhat_threshold : float, default 1.01
        Only for the informative count ``num_rhat_above`` (and plots): the single-quantity
        rule, which is not used to decide convergence of many modes.
    false_alarm : float, default 0.01
        Probability that a converged run flags any mode (BH level).
    chunk_size : int, optional
        Columns per chunk for the vectorised estimators.

    Returns
    -------
    dict
        ``num_chains``, ``num_draws``, ``grid_shape``, ``k`` (or None), ``rhat_threshold``,
        ``false_alarm``; ``kbins``: dict of (nbins,) arrays ``num_modes`` (independent
        complex modes), ``num_values`` (real scalars), ``r_hat_min``, ``r_hat_median``,
        ``r_hat_max``, ``ess_bulk_min``, ``ess_bulk_median``, ``tau_ref``,
        ``num_rhat_above``, ``num_flagged``, ``num_undefined``; ``overall``: dict with
        ``num_values``, ``r_hat_max``, ``r_hat_median``, ``ess_bulk_min``,
        ``ess_bulk_median``, ``num_rhat_above``, ``num_flagged``, ``num_undefined``,
        ``tau_ref`` (reference autocorrelation time of all modes), ``r_hat_q99`` (the bulk
        R-hat 1% of converged modes exceed),
        ``frozen_per_chain`` (number of values in which each chain never moves),
        ``outlier_chain_counts`` (per chain: in how many flagged values its mean is the
        farthest from the other chains');
        ``worst_r_hat``, ``worst_ess_bulk`` and ``flagged`` (most significant first):
        lists of ``{"name", "index" [i, j, l], "part", "kbin", "r_hat", "ess_bulk",
        "p_value"}``.
    """
    modes, kbins, half_shape = _check_modes(modes, kbin_index, grid_shape)
    c, n = modes.shape[:2]
    flat_index, num_real = _select_values(kbins, nbins, grid_shape)
    labels = _value_labels(kbins, flat_index, nbins)
    del kbins
    stats, frozen_per_chain = _mode_statistics(
        modes, flat_index, num_real, labels, nbins, chunk_size
    )
    test = _multiplicity_test(stats, labels, nbins, (c, n), false_alarm)
    del stats["ratio_bulk"], stats["ratio_tail"]  # only the p-values needed them
    per_bin = _kbin_table(stats, test, labels, num_real, nbins, rhat_threshold)
    columns = {"r_hat": stats["r_hat"], "ess_bulk": stats["ess_bulk"], "p_value": test["p_value"]}

    def describe(idx: np.ndarray) -> list[dict[str, Any]]:
        return _describe_modes(idx, flat_index, num_real, labels, half_shape, columns)

    flagged = np.flatnonzero(test["flagged"])
    most_significant = flagged[np.argsort(test["p_value"][flagged], kind="stable")[:num_worst]]
    ess = stats["ess_bulk"]
    return {
        "num_chains": c,
        "num_draws": n,
        "grid_shape": list(grid_shape),
        "k": None if k is None else np.asarray(k, dtype=float),
        "rhat_threshold": rhat_threshold,
        "false_alarm": false_alarm,
        "kbins": per_bin,
        "overall": {
            "num_values": int(ess.size),
            "r_hat_max": _nanreduce(np.max, stats["r_hat"]),
            "r_hat_median": _nanreduce(np.median, stats["r_hat"]),
            "ess_bulk_min": _nanreduce(np.min, ess),
            "ess_bulk_median": _nanreduce(np.median, ess),
            "num_rhat_above": int(per_bin["num_rhat_above"].sum()),
            "num_flagged": int(flagged.size),
            "num_undefined": int(np.isnan(ess).sum()),
            "tau_ref": test["tau_all"],
            "r_hat_q99": test["r_hat_q99"],
            "frozen_per_chain": [int(v) for v in frozen_per_chain],
            "outlier_chain_counts": _outlier_chains(stats["farthest"], flagged, c),
        },
        "worst_r_hat": describe(_worst(stats["r_hat"], num_worst, largest=True)) if c >= 2 else [],
        "worst_ess_bulk": describe(_worst(ess, num_worst, largest=False)),
        "flagged": describe(most_significant),
    }


def _nanreduce(fn: Callable, values: np.ndarray) -> float:
    finite = values[~np.isnan(values)]
    return float(fn(finite)) if finite.size else math.nan


def _voxel_convergence(
    x: np.ndarray, num_worst: int, rhat_threshold: float, chunk_size: int | None
) -> dict[str, Any]:
    c = x.shape[0]
    both = _apply_columns(_convergence_block, x, min_chains=1, chunk_size=chunk_size, num_outputs=2)
    r_vox = both[0].reshape(-1) if c >= 2 else np.full(both[0].size, np.nan)
    e_vox = both[1].reshape(-1)

    def describe(idx: np.ndarray) -> list[dict[str, Any]]:
        return [
            {
                "index": [int(v) for v in np.unravel_index(t, x.shape[2:])],
                "r_hat": float(r_vox[t]),
                "ess_bulk": float(e_vox[t]),
            }
            for t in idx
        ]

    return {
        "num_values": int(r_vox.size),
        "r_hat_max": _nanreduce(np.max, r_vox),
        "r_hat_median": _nanreduce(np.median, r_vox),
        "ess_bulk_min": _nanreduce(np.min, e_vox),
        "ess_bulk_median": _nanreduce(np.median, e_vox),
        "num_rhat_above": int((r_vox > rhat_threshold).sum()),
        "num_undefined": int(np.isnan(e_vox).sum()),
        "worst_r_hat": describe(_worst(r_vox, num_worst, largest=True)) if c >= 2 else [],
        "worst_ess_bulk": describe(_worst(e_vox, num_worst, largest=False)),
    }


def _spool_modes(x):
    """Half-spectrum modes of out-of-core draws, one draw at a time, into a temporary file.

    Returns the open ``h5py.File`` (closing it deletes the file) and its
    ``(chain, draw, n0, n1, n2 // 2 + 1)`` dataset, read back in slabs by
    :func:`mode_convergence`: memory stays at a few fields whatever the number of draws
    (the modes of all draws are about one copy of the draws: on disk, not in memory).
    """
    import tempfile

    import h5py

    c, n = x.shape[:2]
    grid = tuple(x.shape[2:])
    ctype = np.result_type(np.dtype(x.dtype), np.complex64)
    handle = tempfile.TemporaryFile(prefix="fieldhmc-modes-")
    spool = h5py.File(handle, "w")
    modes = spool.create_dataset("modes", (c, n, grid[0], grid[1], grid[2] // 2 + 1), ctype)
    for j in range(c):
        for d in range(n):
            modes[j, d] = sp_fft.rfftn(np.asarray(x[j, d]), workers=-1)
    return spool, modes


def field_convergence(
    field_draws: ArrayLike,
    kbin_index: ArrayLike,
    nbins: int,
    *,
    k: ArrayLike | None = None,
    num_worst: int = 10,
    include_voxels: bool = True,
    rhat_threshold: float = RHAT_THRESHOLD,
    false_alarm: float = FIELD_FALSE_ALARM,
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
        Also compute R-hat/bulk ESS of every voxel (summarised over the grid; voxels are
        mixtures of all modes, so they are reported but not tested).
    rhat_threshold : float, default 1.01
        Informative counts only, see :func:`mode_convergence`.
    false_alarm : float, default 0.01
        See :func:`mode_convergence`.
    chunk_size : int, optional

    Returns
    -------
    dict
        As :func:`mode_convergence`, plus ``voxels`` (when ``include_voxels``):
        ``{"num_values", "r_hat_max", "r_hat_median", "ess_bulk_min", "ess_bulk_median",
        "num_rhat_above", "num_undefined", "worst_r_hat": [{"index", "r_hat",
        "ess_bulk"}], ...}``.
    """
    x = _as_draws(field_draws)
    if x.ndim != 5:
        raise ValueError(f"field_draws must have shape (chain, draw, n0, n1, n2), got {x.shape}")
    spool = None
    if isinstance(x, np.ndarray):
        # scipy keeps single precision (complex64 modes for float32 draws, half of
        # NumPy's complex128) and uses both cores.
        modes = sp_fft.rfftn(x, axes=(-3, -2, -1), workers=-1)
    else:
        spool, modes = _spool_modes(x)
    out = mode_convergence(
        modes,
        kbin_index,
        nbins,
        x.shape[2:],
        k=k,
        num_worst=num_worst,
        rhat_threshold=rhat_threshold,
        false_alarm=false_alarm,
        chunk_size=chunk_size,
    )
    del modes
    if spool is not None:
        spool.close()
    if include_voxels:
        out["voxels"] = _voxel_convergence(x, num_worst, rhat_threshold, chunk_size)
    return out
