"""Comparisons with the truth and analytic references: P(k), T(k), r(k), coverage, Wiener z."""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from fieldhmc.diagnostics.convergence import _CHUNK_ELEMENTS, _as_draws, _column_blocks

#: Fewest modes (counting k and -k, as ``power.nc``'s ``nmodes``) for which a k-bin's
#: T(k) and r(k) are shown. With N modes the binned power of one field scatters by
#: sqrt(2/N) and r(k) of unrelated fields by 1/sqrt(N), 0.45 and 0.32 at N = 10; with
#: one mode (the Nyquist corner of an even grid) |r| = 1 whatever the fields.
MIN_MODES_PER_BIN = 10


def cross_power(
    field_a: ArrayLike,
    kbin_index: ArrayLike,
    nbins: int,
    *,
    field_b: ArrayLike | None = None,
    box_size: float | Sequence[float] | None = None,
) -> np.ndarray:
    """Binned auto- or cross-power spectrum of real fields (NumPy, for diagnostics).

    .. math::
        P_{ab}(k_b) = \\frac{V}{N^2}
        \\frac{\\sum_{\\mathbf k \\in b} w_{\\mathbf k}\\,
        \\mathrm{Re}[\\tilde a_{\\mathbf k} \\tilde b^*_{\\mathbf k}]}
        {\\sum_{\\mathbf k \\in b} w_{\\mathbf k}},
        \\qquad \\tilde a = \\mathrm{rfftn}(a)\\ \\text{(unnormalised)},

    with Hermitian weights :math:`w = 1` on the :math:`k_z = 0` plane (and the Nyquist plane
    for even ``n2``), 2 elsewhere, :math:`N` the number of cells and :math:`V` the box volume.

    Parameters
    ----------
    field_a : array_like, shape (..., n0, n1, n2)
        Real field(s); leading axes (e.g. chain, draw) are kept.
    kbin_index : array_like of int, shape (n0, n1, n2 // 2 + 1)
        k-bin of each mode, -1 to exclude.
    nbins : int
    field_b : array_like, shape broadcastable to ``field_a``, optional
        Second field for the cross-spectrum; default ``field_a`` (auto-spectrum).
    box_size : float or 3 floats, optional
        Box side(s) in Mpc/h. If given, P is in (Mpc/h)^3; otherwise :math:`V/N^2 = 1`
        (only ratios such as T(k) and r(k) are meaningful).

    Returns
    -------
    numpy.ndarray, shape (..., nbins)
        NaN for empty bins.
    """
    fa = _rfft3(field_a)
    fb = fa if field_b is None else _rfft3(field_b)
    grid = (*fa.shape[-3:-1], np.shape(field_a)[-1])
    kbins = np.asarray(kbin_index)
    w_last = np.full(kbins.shape[-1], 2.0)
    w_last[0] = 1.0
    if grid[2] % 2 == 0:
        w_last[-1] = 1.0
    # Weighted bin sums with bincount, one k_x plane at a time: a dense (modes x bins)
    # one-hot matrix would be 15 GB at 256³ (8.5M modes x 220 bins in float64), and
    # whole-grid products, masks and labels were ~10 fields more than the transforms.
    batch = np.broadcast_shapes(fa.shape[:-3], fb.shape[:-3])
    sums = np.zeros((math.prod(batch), nbins))
    norm = np.zeros(nbins)
    for i in range(grid[0]):
        lab = kbins[i]
        valid = (lab >= 0) & (lab < nbins)
        labels = lab[valid]
        w = np.broadcast_to(w_last, lab.shape)[valid]
        prod = (fa[..., i, :, :] * fb[..., i, :, :].conj()).real  # (..., n1, m)
        rows = np.broadcast_to(prod, (*batch, *lab.shape))[..., valid].reshape(-1, labels.size)
        for r, row in enumerate(rows):
            sums[r] += np.bincount(labels, weights=w * row, minlength=nbins)
        norm += np.bincount(labels, weights=w, minlength=nbins)
    with np.errstate(divide="ignore", invalid="ignore"):
        power = (sums / norm).reshape((*batch, nbins))
    if box_size is not None:
        side = np.broadcast_to(np.asarray(box_size, dtype=float), (3,))
        power = power * float(np.prod(side)) / float(np.prod(grid)) ** 2
    return power


def _rfft3(x: ArrayLike) -> np.ndarray:
    """``numpy.fft.rfftn`` over the last three axes, complex128, without a float64 copy
    of ``x``: the last two axes one plane at a time, then the first one slab at a time."""
    x = np.asarray(x)
    n0, n1, n2 = x.shape[-3:]
    out = np.empty((*x.shape[:-1], n2 // 2 + 1), np.complex128)
    for i in range(n0):
        plane = np.fft.rfft(x[..., i, :, :].astype(float), axis=-1)
        out[..., i, :, :] = np.fft.fft(plane, axis=-2)
    for j in range(n1):
        out[..., :, j, :] = np.fft.fft(out[..., :, j, :], axis=-2)
    return out


def transfer_function(power: ArrayLike, power_truth: ArrayLike) -> np.ndarray:
    """Transfer function :math:`T(k) = \\sqrt{P(k) / P_\\mathrm{true}(k)}`.

    Parameters
    ----------
    power : array_like, shape (..., nbins)
        Posterior power, e.g. per-draw spectra ``(chain, draw, nbins)`` or the spectrum of
        the posterior mean, in (Mpc/h)^3.
    power_truth : array_like, shape (nbins,)
        Power of the true field, same units.

    Returns
    -------
    numpy.ndarray, shape (..., nbins)
        NaN where either power is non-positive.
    """
    p = np.asarray(power, dtype=float)
    t = np.asarray(power_truth, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = p / t
    return np.sqrt(np.where((p >= 0) & (t > 0), ratio, np.nan))


def cross_correlation(power_cross: ArrayLike, power_a: ArrayLike, power_b: ArrayLike) -> np.ndarray:
    """Cross-correlation coefficient :math:`r(k) = P_\\times / \\sqrt{P_a P_b}`.

    Parameters
    ----------
    power_cross : array_like, shape (..., nbins)
        Cross-spectrum of fields a and b (e.g. posterior mean and truth).
    power_a, power_b : array_like, shape (..., nbins)
        Auto-spectra of a and b.

    Returns
    -------
    numpy.ndarray
        In [-1, 1] for consistent inputs; NaN where an auto-power is non-positive.
    """
    x = np.asarray(power_cross, dtype=float)
    denom = np.asarray(power_a, dtype=float) * np.asarray(power_b, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0, x / np.sqrt(np.where(denom > 0, denom, 1.0)), np.nan)


def coverage(
    draws_or_intervals: ArrayLike | Mapping[float, tuple[ArrayLike, ArrayLike]],
    truth: ArrayLike,
    probs: Sequence[float] = (0.5, 0.68, 0.95),
    *,
    labels: ArrayLike | None = None,
    num_labels: int | None = None,
    sample_ndim: int = 2,
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """Fraction of truth values inside central posterior intervals.

    For calibrated posteriors and truths drawn from the prior, the coverage of the
    :math:`p` interval is :math:`p` (up to correlations between elements).

    Parameters
    ----------
    draws_or_intervals : array_like or mapping
        Either posterior draws of shape ``(chain, draw, *truth.shape)`` (the first
        ``sample_ndim`` axes are samples; equal-tailed intervals are computed), or a mapping
        ``prob -> (lower, upper)`` of arrays shaped like ``truth``.
    truth : array_like
        True values (a field, modes' real parts, hyperparameters...).
    probs : sequence of float, default (0.5, 0.68, 0.95)
        Central interval probabilities (ignored when intervals are given).
    labels : array_like of int, shape truth.shape, optional
        Group label per element (e.g. k-bin, or mask > 0.5) for per-group coverage;
        negative labels are ignored.
    num_labels : int, optional
        Number of groups (default ``labels.max() + 1``).
    sample_ndim : int, default 2
        Number of leading sample axes in ``draws``.
    chunk_size : int, optional
        Elements per chunk for the quantiles (default: ~2M values per chunk), so that
        large field draws are never copied whole.

    Returns
    -------
    dict
        ``probs`` (list), ``coverage`` (array, one per prob), ``num_elements``, and
        ``per_label`` (array (num_labels, len(probs))) when ``labels`` is given.
    """
    t = np.asarray(truth)
    if not np.issubdtype(t.dtype, np.floating):
        t = t.astype(float)
    flat_t = t.reshape(-1)
    lab = num = None
    if labels is not None:
        lab = np.asarray(labels)
        lab = lab.astype(np.intp, copy=False) if lab.shape == t.shape else lab.astype(int)
        lab = np.broadcast_to(lab, t.shape).reshape(-1)
        num = int(lab.max()) + 1 if num_labels is None else int(num_labels)
    # Counted block by block: no (probs x elements) array of bounds or of hits exists
    # (at 256³ those were ~20 fields of float64); sums of 0/1 are exact, so the
    # fractions are those of the whole at once.
    hits: np.ndarray | None = None
    inside_count: np.ndarray | None = None
    label_count = np.zeros(num or 0)

    def count(start: int, stop: int, bounds) -> None:
        nonlocal hits, inside_count
        tb = flat_t[start:stop]
        inside = np.stack([(lo <= tb) & (tb <= hi) for lo, hi in bounds], axis=-1)
        block_count = inside.sum(axis=0)
        inside_count = block_count if inside_count is None else inside_count + block_count
        if lab is not None:
            lb = lab[start:stop]
            ok = (lb >= 0) & (lb < num)
            label_count[:] += np.bincount(lb[ok], minlength=num)[:num]
            block_hits = np.stack(
                [
                    np.bincount(lb[ok], weights=inside[ok, i], minlength=num)[:num]
                    for i in range(len(bounds))
                ],
                axis=-1,
            )
            hits = block_hits if hits is None else hits + block_hits

    if isinstance(draws_or_intervals, Mapping):
        probs = [float(p) for p in draws_or_intervals]
        count(
            0,
            flat_t.size,
            [
                (np.asarray(lo, float).reshape(-1), np.asarray(hi, float).reshape(-1))
                for lo, hi in draws_or_intervals.values()
            ],
        )
    else:
        d = _as_draws(draws_or_intervals)  # an h5py.Dataset (view) is read in slabs
        if tuple(d.shape[sample_ndim:]) != t.shape:
            raise ValueError(f"draws shape {d.shape} does not end with truth shape {t.shape}")
        probs = [float(p) for p in probs]
        qs = [q for p in probs for q in ((1.0 - p) / 2.0, (1.0 + p) / 2.0)]
        # Quantiles in chunks of elements: no float64 copy of all draws (field draws
        # can be most of the machine's memory). Flattening only the event axes keeps a
        # view of e.g. a (draw, chain) -> (chain, draw) swapaxes.
        num_samples = math.prod(d.shape[:sample_ndim])
        step = chunk_size or max(1, _CHUNK_ELEMENTS // max(1, num_samples))
        for start, stop, cols in _column_blocks(d, step, sample_ndim):
            # astype makes the one (contiguous) copy; the reshape is then a view
            block = cols.astype(float).reshape(num_samples, -1)
            quant = np.quantile(block, qs, axis=0)
            count(start, stop, [(quant[2 * i], quant[2 * i + 1]) for i in range(len(probs))])
    out: dict[str, Any] = {
        "probs": probs,
        "coverage": inside_count / flat_t.size,
        "num_elements": int(flat_t.size),
    }
    if lab is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            out["per_label"] = hits / label_count[:, None]
        out["per_label_count"] = label_count.astype(int)
    return out


def wiener_zscores(
    sample_mean: ArrayLike,
    sample_var: ArrayLike,
    ess: ArrayLike,
    ref_mean: ArrayLike,
    ref_var: ArrayLike,
) -> dict[str, Any]:
    """Standardised errors of posterior moments against an analytic (Wiener) posterior.

    .. math::
        z_\\mu = \\frac{\\bar x - \\mu}{\\sqrt{\\sigma^2 / \\mathrm{ESS}}}, \\qquad
        z_{\\sigma^2} = \\frac{s^2 - \\sigma^2}{\\sigma^2 \\sqrt{2 / \\mathrm{ESS}}},

    where :math:`\\mu, \\sigma^2` are the reference posterior mean and variance. The variance
    z-score uses the Gaussian result :math:`\\mathrm{Var}(s^2) \\approx 2\\sigma^4/n` with the
    bulk ESS in place of :math:`n` (an approximation). For a correct sampler both are
    approximately standard normal; ``rms`` should be near 1.

    Parameters
    ----------
    sample_mean, sample_var : array_like, same shape
        Sample mean and variance of each element (e.g. real/imag parts of modes).
    ess : array_like, broadcastable
        Effective sample size per element (e.g. from :func:`ess_bulk`).
    ref_mean, ref_var : array_like, broadcastable
        Analytic posterior mean and variance.

    Returns
    -------
    dict
        ``z_mean``, ``z_var`` (arrays, not written to summary.json) and ``summary``:
        ``{"mean": stats, "var": stats}`` with stats ``{"num", "rms", "max_abs",
        "fraction_above_3"}`` (expected: rms 1, fraction 0.0027).
    """
    m = np.asarray(sample_mean, dtype=float)
    v = np.asarray(sample_var, dtype=float)
    n_eff = np.asarray(ess, dtype=float)
    mu = np.asarray(ref_mean, dtype=float)
    var = np.asarray(ref_var, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        z_mean = (m - mu) / np.sqrt(var / n_eff)
        z_var = (v - var) / (var * np.sqrt(2.0 / n_eff))

    def describe(z: np.ndarray) -> dict[str, float]:
        finite = z[np.isfinite(z)]
        if finite.size == 0:
            return {"num": 0, "rms": math.nan, "max_abs": math.nan, "fraction_above_3": math.nan}
        return {
            "num": int(finite.size),
            "rms": float(np.sqrt(np.mean(finite**2))),
            "max_abs": float(np.max(np.abs(finite))),
            "fraction_above_3": float(np.mean(np.abs(finite) > 3.0)),
        }

    return {
        "z_mean": z_mean,
        "z_var": z_var,
        "summary": {"mean": describe(z_mean), "var": describe(z_var)},
    }


def variance_bias(
    draws: ArrayLike, ref_mean: ArrayLike, ref_var: ArrayLike, *, columns: ArrayLike | None = None
) -> dict[str, float]:
    """Squared bias of the posterior variances against a Gaussian reference, MC noise removed.

    .. math::
        b^2 = \\frac{1}{d} \\sum_i \\frac{(\\hat m_i - \\sigma_i^2)^2
        - \\widehat{\\mathrm{Var}}[\\hat m_i]}{2 \\sigma_i^4},
        \\qquad \\hat m_i = \\overline{(x_i - \\mu_i)^2},

    the bias measure of Robnik et al. (arXiv:2412.08876), which an unadjusted kernel
    tuned to an energy-error variance per dimension keeps below that variance. The noise
    term is the spread of the :math:`C` chains' own :math:`\\hat m_{i,c}` over :math:`C`
    (``ddof=1``): unbiased for independent chains of one length whatever their
    autocorrelation, where an ESS-based term is not. Replicated MCLMC runs on the 8³
    Gaussian posterior (``benchmarks/mcse_calibration.py``) put the rank-normalised bulk
    ESS of the squares 1.2x (L at its moment value) to 1.4x (4x that) above their true
    ESS; on the sharded tight-tolerance test (1e-4) that term read :math:`b^2` 1.3e-4
    where the chains' spread reads 0 within 4e-5.

    Parameters
    ----------
    draws : array_like, shape (chain, draw, ...)
        At least two independent chains, past warm-up.
    ref_mean, ref_var : array_like, broadcastable to ``draws.shape[2:]``
        The reference posterior mean and variance (of the ``columns`` if given).
    columns : array_like of int, optional
        Flat indices into ``draws.shape[2:]``: only these coordinates, read a block at a
        time (no copy of ``draws``).

    Returns
    -------
    dict
        ``b2``, ``se`` (its standard error over the coordinates) and ``rel``, the mean
        relative variance error :math:`\\overline{\\hat m_i / \\sigma_i^2 - 1}`.
    """
    x = np.asarray(draws)
    if x.ndim < 3 or x.shape[0] < 2:
        raise ValueError(
            f"variance_bias needs draws of shape (chain >= 2, draw, ...), got {x.shape}"
        )
    chains = x.shape[0]
    x = x.reshape(chains, x.shape[1], -1)
    cols = np.arange(x.shape[-1]) if columns is None else np.asarray(columns).reshape(-1)
    var = np.broadcast_to(np.asarray(ref_var, dtype=float), cols.shape)
    mu = np.broadcast_to(np.asarray(ref_mean, dtype=float), cols.shape)
    rel, noise = np.empty(cols.size), np.empty(cols.size)
    for lo in range(0, cols.size, 1 << 14):  # column blocks: float64 copies stay small
        j = slice(lo, lo + (1 << 14))
        block = x[..., cols[j]] if columns is not None else x[..., j]
        per_chain = np.mean((block - mu[j]) ** 2, axis=1) / var[j]  # chain, column
        rel[j] = per_chain.mean(axis=0) - 1.0
        noise[j] = per_chain.var(axis=0, ddof=1) / chains
    terms = 0.5 * (rel**2 - noise)
    return {
        "b2": float(np.mean(terms)),
        "se": float(np.std(terms) / np.sqrt(terms.size)),
        "rel": float(np.mean(rel)),
    }


def truth_comparison(
    k: ArrayLike,
    power_truth: ArrayLike,
    *,
    power_draws: ArrayLike | None = None,
    power_mean: ArrayLike | None = None,
    power_cross: ArrayLike | None = None,
    coverage_result: Mapping[str, Any] | None = None,
    num_modes: ArrayLike | None = None,
    min_modes: int = MIN_MODES_PER_BIN,
) -> dict[str, Any]:
    """Compare a synthetic run with its true field.

    Parameters
    ----------
    k : array_like, shape (nbins,)
        Bin centres in h/Mpc.
    power_truth : array_like, shape (nbins,)
        P(k) of the true field in (Mpc/h)^3.
    power_draws : array_like, shape (chain, draw, nbins), optional
        P(k) of each posterior draw; gives :math:`T(k)` median and 68% band (draws of a
        correct posterior scatter around :math:`T = 1`).
    power_mean : array_like, shape (nbins,), optional
        P(k) of the posterior-mean field (Wiener-like suppression: :math:`T < 1` where noisy).
    power_cross : array_like, shape (nbins,), optional
        Cross-spectrum of posterior mean and truth; with ``power_mean`` gives :math:`r(k)`.
    coverage_result : mapping, optional
        Output of :func:`coverage`, copied in.
    num_modes : array_like, shape (nbins,), optional
        Modes per bin, counting :math:`\\mathbf k` and :math:`-\\mathbf k`
        (``KBins.num_modes``).
    min_modes : int, default :data:`MIN_MODES_PER_BIN`
        Bins with fewer modes are ``is_sparse``: their T(k) and r(k) are computed but
        not shown in the report or plot (too few modes to estimate them).

    Returns
    -------
    dict
        ``k``, ``transfer_median``, ``transfer_lo``, ``transfer_hi`` (16/84%),
        ``transfer_mean_field``, ``cross_correlation`` (arrays or None), ``coverage``,
        ``num_modes`` and ``is_sparse`` (per bin, or None) and ``min_modes``.
    """
    out: dict[str, Any] = {
        "k": np.asarray(k, dtype=float),
        "transfer_median": None,
        "transfer_lo": None,
        "transfer_hi": None,
        "transfer_mean_field": None,
        "cross_correlation": None,
        "coverage": None if coverage_result is None else dict(coverage_result),
        "num_modes": None if num_modes is None else np.asarray(num_modes, dtype=float),
        "is_sparse": None if num_modes is None else np.asarray(num_modes) < min_modes,
        "min_modes": int(min_modes),
    }
    if power_draws is not None:
        pd_ = np.asarray(power_draws, dtype=float)
        t = transfer_function(pd_.reshape(-1, pd_.shape[-1]), power_truth)
        with np.errstate(invalid="ignore"):
            lo, med, hi = np.nanquantile(t, [0.16, 0.5, 0.84], axis=0)
        out.update(transfer_lo=lo, transfer_median=med, transfer_hi=hi)
    if power_mean is not None:
        out["transfer_mean_field"] = transfer_function(power_mean, power_truth)
        if power_cross is not None:
            out["cross_correlation"] = cross_correlation(power_cross, power_mean, power_truth)
    return out
