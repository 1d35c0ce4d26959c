"""Convergence, sampler-health and truth-comparison diagnostics for fieldhmc runs.

Everything here is plain NumPy/SciPy and returns data; nothing prints or plots.
The CLI turns :func:`build_summary` into ``summary.json`` and prints :func:`format_report`.

What comes from where
---------------------
* Scalars (hyperparameters, log prob, tracked modes): ArviZ (``az.summary``) computes the
  rank-normalised split-:math:`\\hat R`, bulk/tail ESS and MCSE [1]_. ArviZ is imported
  lazily: it takes ~1.5 s to import and pulls in ``matplotlib.pyplot``.
* Whole fields (up to millions of modes): :func:`rhat`, :func:`ess_bulk`, :func:`ess_tail`,
  :func:`mcse_mean` and :func:`mcse_sd` are vectorised NumPy re-implementations of the same
  estimators (ArviZ 0.23 conventions, equal to ``az.rhat`` / ``az.ess`` / ``az.mcse`` to
  round-off), working on chunks of columns of ``(chain, draw, ...)`` arrays. ``az.summary``
  needs ~3 s per 2,000 parameters, i.e. tens of minutes for a 128³ field.
* TFP's ``tfp.mcmc.effective_sample_size`` and ``potential_scale_reduction`` are neither
  rank-normalised nor split, and have no tail ESS; they are not used here.

Conventions
-----------
Chains and draws are indexed from 0, like ArviZ's ``chain``/``draw`` coordinates, so
"chain 2" is ``array[2]``. Thresholds follow Stan/ArviZ: :math:`\\hat R > 1.01`, ESS below
100 per chain, E-BFMI below 0.3 [2]_.

References
----------
.. [1] A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner, "Rank-normalization,
   folding, and localization: An improved R-hat for assessing convergence of MCMC",
   Bayesian Analysis 16 (2021) 667, arXiv:1903.08008.
.. [2] M. Betancourt, "Diagnosing Suboptimal Cotangent Disintegrations in Hamiltonian
   Monte Carlo", arXiv:1604.00695.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy import fft as sp_fft
from scipy import special
from scipy.fft import next_fast_len

__all__ = [
    "autocorrelation",
    "build_summary",
    "coverage",
    "cross_correlation",
    "cross_power",
    "ess_bulk",
    "ess_tail",
    "field_convergence",
    "format_report",
    "mcse_mean",
    "mcse_sd",
    "mode_convergence",
    "rhat",
    "sampler_health",
    "summarize_scalars",
    "to_jsonable",
    "transfer_function",
    "truth_comparison",
    "wiener_zscores",
]

#: Default :math:`\hat R` above which a quantity is flagged (Vehtari et al. 2021).
RHAT_THRESHOLD = 1.01
#: Default minimum bulk/tail ESS per chain (Stan warns below 100 per chain).
MIN_ESS_PER_CHAIN = 100.0
#: Default E-BFMI below which a chain is flagged (Betancourt 2016).
EBFMI_THRESHOLD = 0.3

# Elements per chunk (chain * draw * columns) in the vectorised estimators: the FFT
# autocovariance works on a zero-padded complex copy, so peak memory is ~10x this * 8 bytes.
_CHUNK_ELEMENTS = 2**21


# --------------------------------------------------------------------------------------
# Vectorised rank-normalised R-hat / ESS / MCSE (ArviZ 0.23 conventions)
# --------------------------------------------------------------------------------------


# Internal layout: blocks are (column, chain, draw) C-contiguous, so that sorting and FFTs
# run along the last (contiguous) axis.


def _split_chains(x: np.ndarray) -> np.ndarray:
    """``(m, chain, draw) -> (m, 2 chain, draw // 2)``; the middle of odd chains is dropped."""
    n = x.shape[-1]
    half = n // 2
    return np.concatenate([x[..., :half], x[..., n - half :]], axis=1)


def _average_ranks(a: np.ndarray) -> np.ndarray:
    """1-based ranks along the last axis, ties sharing their average rank.

    Same as ``scipy.stats.rankdata(method="average")`` row by row (rows containing NaN
    become NaN), but vectorised over rows.
    """
    size = a.shape[-1]
    order = np.argsort(a, axis=-1)
    ordered = np.take_along_axis(a, order, axis=-1)
    position = np.broadcast_to(np.arange(size), a.shape)
    is_first = np.ones(a.shape, dtype=bool)
    is_first[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    if is_first.all():  # no ties: ordinal ranks
        sorted_ranks = position + 1.0
    else:
        is_last = np.ones(a.shape, dtype=bool)
        is_last[..., :-1] = is_first[..., 1:]
        first = np.maximum.accumulate(np.where(is_first, position, 0), axis=-1)
        last = np.minimum.accumulate(np.where(is_last, position, size - 1)[..., ::-1], axis=-1)
        sorted_ranks = 0.5 * (first + last[..., ::-1]) + 1.0
    ranks = np.empty(a.shape)
    np.put_along_axis(ranks, order, sorted_ranks, axis=-1)
    return np.where(np.isnan(a).any(axis=-1, keepdims=True), np.nan, ranks)


def _z_scale(x: np.ndarray) -> np.ndarray:
    """Rank-normalise each column over all its ``chain * draw`` values.

    .. math:: z = \\Phi^{-1}\\!\\left(\\frac{r - 3/8}{S + 1/4}\\right)

    with :math:`r` the average rank among the :math:`S` values (Blom offset, as ArviZ).
    """
    m, c, n = x.shape
    ranks = _average_ranks(x.reshape(m, c * n))
    return special.ndtri((ranks - 0.375) / (c * n + 0.25)).reshape(m, c, n)


def _rhat_basic(x: np.ndarray) -> np.ndarray:
    """Classic (non-split) potential scale reduction of each column of ``(m, chain, draw)``."""
    n = x.shape[-1]
    between = n * x.mean(axis=-1).var(axis=-1, ddof=1)
    within = x.var(axis=-1, ddof=1).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((between / within + n - 1) / n)


def _autocov(x: np.ndarray) -> np.ndarray:
    """Biased (1/n) autocovariance at every lag along the last axis (zero-padded FFT)."""
    n = x.shape[-1]
    nfft = next_fast_len(2 * n, real=True)
    spec = sp_fft.rfft(x - x.mean(axis=-1, keepdims=True), n=nfft, axis=-1)
    power = spec.real**2 + spec.imag**2
    return sp_fft.irfft(power, n=nfft, axis=-1)[..., :n] / n


def _ess_basic(x: np.ndarray) -> np.ndarray:
    """ESS of each column of ``(m, chain, draw)`` (no splitting, no ranking).

    Geyer's initial positive and initial monotone sequence estimators of the integrated
    autocorrelation time, computed for all columns at once; identical to ArviZ's ``_ess``.

    Notes
    -----
    With :math:`\\hat\\rho_t` the multi-chain autocorrelation of [1]_ and pair sums
    :math:`P_k = \\hat\\rho_{2k} + \\hat\\rho_{2k+1}`, the truncation pair :math:`K` is the
    first :math:`k \\ge 1` with :math:`P_k \\le 0` (capped by the chain length), and

    .. math::
        \\hat\\tau = -1 + 2 \\sum_{k<K} \\min_{j \\le k} P_j + \\hat\\rho_{2K}\\,
        [P_K \\ge 0 \\lor \\hat\\rho_{2K} > 0],
        \\qquad \\mathrm{ESS} = \\frac{M N}{\\max(\\hat\\tau, 1/\\log_{10}(M N))}

    for :math:`M` chains of :math:`N` draws.
    """
    m, c, n = x.shape
    size = c * n
    with np.errstate(invalid="ignore"):
        value_range = np.ptp(x, axis=(1, 2))
    is_nan = np.isnan(value_range)
    is_const = value_range < np.finfo(float).resolution

    acov = _autocov(x)
    mean_var = acov[..., 0].mean(axis=-1) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if c > 1:
        var_plus = var_plus + x.mean(axis=-1).var(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (mean_var[:, None] - acov.mean(axis=1)) / var_plus[:, None]  # (m, n)
    rho[:, 0] = 1.0

    kmax = max((n - 1) // 2 - 1, 0)
    pairs = rho[:, 0 : 2 * kmax + 2 : 2] + rho[:, 1 : 2 * kmax + 2 : 2]  # P_0 .. P_kmax
    if kmax >= 1:
        nonpos = pairs[:, 1:] <= 0.0
        first = np.where(nonpos.any(axis=-1), nonpos.argmax(axis=-1) + 1, kmax)
    else:
        first = np.zeros(m, dtype=int)
    big_k = np.where(pairs[:, 0] > 0.0, first, 0)
    cummin = np.minimum.accumulate(pairs[:, :kmax], axis=-1)
    used = np.arange(kmax)[None, :] < big_k[:, None]
    pair_sum = np.where(used, cummin, 0.0).sum(axis=-1)
    rho_even = np.take_along_axis(rho, 2 * big_k[:, None], axis=-1)[:, 0]
    pair_k = np.take_along_axis(pairs, big_k[:, None], axis=-1)[:, 0]
    last = np.where((pair_k >= 0.0) | (rho_even > 0.0), rho_even, 0.0)
    last = np.where(big_k == 0, 1.0, last)
    tau = np.maximum(-1.0 + 2.0 * pair_sum + last, 1.0 / np.log10(size))
    ess = np.where(is_const, float(size), size / tau)
    return np.where(is_nan, np.nan, ess)


def _folded_rhat(split: np.ndarray) -> np.ndarray:
    """Tail R-hat: split-R-hat of rank-normalised :math:`|\\theta - \\mathrm{median}|`."""
    median = np.median(split, axis=(1, 2), keepdims=True)
    return _rhat_basic(_z_scale(np.abs(split - median)))


def _rhat_rank_block(x: np.ndarray) -> np.ndarray:
    split = _split_chains(x)
    return np.maximum(_rhat_basic(_z_scale(split)), _folded_rhat(split))


def _ess_bulk_block(x: np.ndarray) -> np.ndarray:
    return _ess_basic(_z_scale(_split_chains(x)))


def _ess_quantile_block(x: np.ndarray, prob: float) -> np.ndarray:
    m, c, n = x.shape
    q = np.quantile(x.reshape(m, c * n), prob, axis=-1)  # "linear" = R type 7, as ArviZ
    out = _ess_basic(_split_chains((x <= q[:, None, None]).astype(float)))
    return np.where(np.isnan(q), np.nan, out)


def _ess_tail_block(x: np.ndarray, prob: float = 0.05) -> np.ndarray:
    return np.minimum(_ess_quantile_block(x, prob), _ess_quantile_block(x, 1.0 - prob))


def _mcse_mean_block(x: np.ndarray) -> np.ndarray:
    m = x.shape[0]
    sd = x.reshape(m, -1).std(axis=-1, ddof=1)
    return sd / np.sqrt(_ess_basic(_split_chains(x)))


def _mcse_sd_block(x: np.ndarray) -> np.ndarray:
    sq = (x - x.mean(axis=(1, 2), keepdims=True)) ** 2
    ess = _ess_basic(_split_chains(sq))
    evar = sq.mean(axis=(1, 2))
    varvar = ((sq**2).mean(axis=(1, 2)) - evar**2) / ess
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(varvar / evar / 4.0)


def _convergence_block(x: np.ndarray) -> np.ndarray:
    """Stacked ``[rhat, ess_bulk]``, sharing the rank-normalised split chains."""
    split = _split_chains(x)
    z = _z_scale(split)
    return np.stack([np.maximum(_rhat_basic(z), _folded_rhat(split)), _ess_basic(z)])


def _apply_columns(
    block_fn: Callable[[np.ndarray], np.ndarray],
    draws: ArrayLike,
    *,
    min_chains: int,
    chunk_size: int | None,
    num_outputs: int = 0,
) -> np.ndarray:
    """Apply ``block_fn`` to chunks of the flattened trailing axes of ``(chain, draw, ...)``.

    Each chunk is handed over as a contiguous ``(columns, chain, draw)`` array.
    """
    x = np.asarray(draws)
    if x.ndim < 2:
        raise ValueError(f"draws must have shape (chain, draw, ...), got {x.shape}")
    c, n = x.shape[:2]
    trailing = x.shape[2:]
    flat = x.reshape(c, n, -1)
    m = flat.shape[2]
    out_shape = ((num_outputs,) if num_outputs else ()) + (m,)
    out = np.full(out_shape, np.nan)
    if c < min_chains or n < 4 or m == 0:
        return out.reshape(out_shape[:-1] + trailing)
    step = chunk_size or max(1, _CHUNK_ELEMENTS // (c * n))
    for start in range(0, m, step):
        stop = min(start + step, m)
        block = np.ascontiguousarray(flat[:, :, start:stop].transpose(2, 0, 1), dtype=float)
        out[..., start:stop] = block_fn(block)
    return out.reshape(out_shape[:-1] + trailing)


def rhat(draws: ArrayLike, *, chunk_size: int | None = None) -> np.ndarray:
    """Rank-normalised split-:math:`\\hat R` for every trailing element of ``draws``.

    The maximum of the bulk (rank-normalised) and tail (folded, rank-normalised)
    split-:math:`\\hat R` of Vehtari et al. (2021) [1]_; equal to ``az.rhat(method="rank")``.

    Parameters
    ----------
    draws : array_like, shape (chain, draw, ...)
        Real float draws. Needs at least 2 chains and 4 draws, else NaN.
    chunk_size : int, optional
        Columns processed at a time (bounds memory); default ~2M elements per chunk.

    Returns
    -------
    numpy.ndarray, shape draws.shape[2:]
        :math:`\\hat R` (0-d array for scalar input). NaN for constant or NaN columns.

    References
    ----------
    .. [1] Vehtari et al., arXiv:1903.08008.
    """
    return _apply_columns(_rhat_rank_block, draws, min_chains=2, chunk_size=chunk_size)


def ess_bulk(draws: ArrayLike, *, chunk_size: int | None = None) -> np.ndarray:
    """Bulk effective sample size (rank-normalised split chains) per trailing element.

    Equal to ``az.ess(method="bulk")`` [1]_.

    Parameters
    ----------
    draws : array_like, shape (chain, draw, ...)
        Real float draws; at least 4 draws per chain, else NaN.
    chunk_size : int, optional
        Columns processed at a time.

    Returns
    -------
    numpy.ndarray, shape draws.shape[2:]
        Bulk ESS in draws (``chain * draw`` for independent draws; may exceed it for
        anticorrelated chains).

    References
    ----------
    .. [1] Vehtari et al., arXiv:1903.08008.
    """
    return _apply_columns(_ess_bulk_block, draws, min_chains=1, chunk_size=chunk_size)


def ess_tail(draws: ArrayLike, *, prob: float = 0.05, chunk_size: int | None = None) -> np.ndarray:
    """Tail effective sample size per trailing element.

    The minimum of the ESS of the indicators :math:`I(\\theta \\le q_{p})` and
    :math:`I(\\theta \\le q_{1-p})` on split chains; equal to ``az.ess(method="tail")`` [1]_.

    Parameters
    ----------
    draws : array_like, shape (chain, draw, ...)
        Real float draws; at least 4 draws per chain, else NaN.
    prob : float, default 0.05
        Lower tail probability :math:`p`.
    chunk_size : int, optional
        Columns processed at a time.

    Returns
    -------
    numpy.ndarray, shape draws.shape[2:]

    References
    ----------
    .. [1] Vehtari et al., arXiv:1903.08008.
    """

    def block(x: np.ndarray) -> np.ndarray:
        return _ess_tail_block(x, prob)

    return _apply_columns(block, draws, min_chains=1, chunk_size=chunk_size)


def mcse_mean(draws: ArrayLike, *, chunk_size: int | None = None) -> np.ndarray:
    """Monte Carlo standard error of the posterior mean per trailing element.

    :math:`\\mathrm{sd}/\\sqrt{\\mathrm{ESS}_\\mathrm{mean}}` with the (non-ranked) split-chain
    ESS; equal to ``az.mcse(method="mean")``.

    Parameters
    ----------
    draws : array_like, shape (chain, draw, ...)
    chunk_size : int, optional

    Returns
    -------
    numpy.ndarray, shape draws.shape[2:]
        In the units of ``draws``.
    """
    return _apply_columns(_mcse_mean_block, draws, min_chains=1, chunk_size=chunk_size)


def mcse_sd(draws: ArrayLike, *, chunk_size: int | None = None) -> np.ndarray:
    """Monte Carlo standard error of the posterior standard deviation per trailing element.

    Equal to ``az.mcse(method="sd")`` (ArviZ 0.23: delta method on the split-chain ESS of
    the squared deviations).

    Parameters
    ----------
    draws : array_like, shape (chain, draw, ...)
    chunk_size : int, optional

    Returns
    -------
    numpy.ndarray, shape draws.shape[2:]
    """
    return _apply_columns(_mcse_sd_block, draws, min_chains=1, chunk_size=chunk_size)


def autocorrelation(draws: ArrayLike, *, max_lag: int | None = None) -> np.ndarray:
    """Per-chain autocorrelation function along the draw axis.

    Parameters
    ----------
    draws : array_like, shape (chain, draw, ...)
    max_lag : int, optional
        Largest lag returned (default ``draw - 1``).

    Returns
    -------
    numpy.ndarray, shape (chain, max_lag + 1, ...)
        :math:`\\rho_t` with :math:`\\rho_0 = 1`; NaN for constant chains.
    """
    x = np.asarray(draws, dtype=float)
    if x.ndim < 2:
        raise ValueError(f"draws must have shape (chain, draw, ...), got {x.shape}")
    acov = np.moveaxis(_autocov(np.moveaxis(x, 1, -1)), -1, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        acf = acov / acov[:, :1]
    n = x.shape[1]
    last = n - 1 if max_lag is None else min(int(max_lag), n - 1)
    return acf[:, : last + 1]


# --------------------------------------------------------------------------------------
# Scalars
# --------------------------------------------------------------------------------------


def summarize_scalars(
    posterior: Mapping[str, ArrayLike],
    *,
    var_names: Sequence[str] | None = None,
    method: Literal["arviz", "numpy"] = "arviz",
) -> dict[str, dict[str, float]]:
    """Posterior summary and convergence diagnostics of scalar quantities.

    Parameters
    ----------
    posterior : mapping of str to array_like, each shape (chain, draw)
        Hyperparameters (``log_amplitude``, ...), log prob (``lp``) and tracked modes
        (``mode[3,1,2].real``, ...).
    var_names : sequence of str, optional
        Subset (and order) of names to summarise; default all.
    method : {"arviz", "numpy"}, default "arviz"
        ``"arviz"`` uses ``az.summary`` for R-hat/ESS/MCSE; ``"numpy"`` uses the vectorised
        equivalents in this module (same numbers, much faster for thousands of quantities).

    Returns
    -------
    dict
        ``name -> {"mean", "sd", "q5", "median", "q95", "mcse_mean", "mcse_sd",
        "ess_bulk", "ess_tail", "r_hat"}`` as Python floats (NaN when undefined, e.g.
        R-hat of a single chain).
    """
    names = list(posterior) if var_names is None else list(var_names)
    arrays = {}
    for name in names:
        a = np.asarray(posterior[name], dtype=float)
        if a.ndim != 2:
            raise ValueError(f"posterior[{name!r}] must have shape (chain, draw), got {a.shape}")
        arrays[name] = a
    if not arrays:
        return {}
    stacked = np.stack([arrays[n] for n in names], axis=-1)  # (chain, draw, q)
    flat = stacked.reshape(-1, len(names))
    quantiles = np.quantile(flat, [0.05, 0.5, 0.95], axis=0)
    if method == "arviz":
        import arviz as az  # lazy: slow import that also imports matplotlib.pyplot

        dataset = az.convert_to_dataset({n: arrays[n] for n in names})
        table = az.summary(dataset, kind="diagnostics", round_to="none")
        diag = {
            col: np.array([float(table.loc[n, col]) for n in names])
            for col in ("mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "r_hat")
        }
    elif method == "numpy":
        diag = {
            "mcse_mean": mcse_mean(stacked),
            "mcse_sd": mcse_sd(stacked),
            "ess_bulk": ess_bulk(stacked),
            "ess_tail": ess_tail(stacked),
            "r_hat": rhat(stacked),
        }
    else:
        raise ValueError(f"method must be 'arviz' or 'numpy', got {method!r}")
    out: dict[str, dict[str, float]] = {}
    for i, name in enumerate(names):
        row = {
            "mean": float(flat[:, i].mean()),
            "sd": float(flat[:, i].std(ddof=1)) if flat.shape[0] > 1 else math.nan,
            "q5": float(quantiles[0, i]),
            "median": float(quantiles[1, i]),
            "q95": float(quantiles[2, i]),
        }
        row.update({key: float(values[i]) for key, values in diag.items()})
        out[name] = row
    return out


# --------------------------------------------------------------------------------------
# Fields
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Sampler health
# --------------------------------------------------------------------------------------


def _ebfmi(energy: np.ndarray) -> np.ndarray:
    """E-BFMI per chain, ArviZ/Stan convention.

    .. math::
        \\mathrm{E\\text{-}BFMI} = \\frac{\\frac{1}{N-1}\\sum_{n=1}^{N-1}(E_n - E_{n-1})^2}
        {\\frac{1}{N-1}\\sum_{n=0}^{N-1}(E_n - \\bar E)^2}
    """
    num = np.square(np.diff(energy, axis=1)).mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / energy.var(axis=1, ddof=1)


def _suggest_target(target: float) -> float:
    return round(min(0.99, 1.0 - (1.0 - target) / 2.0), 3)


def _plural(n: int, word: str) -> str:
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


def sampler_health(
    sample_stats: Mapping[str, ArrayLike],
    target_accept_prob: float,
    max_tree_depth: int | None = None,
    *,
    ebfmi_threshold: float = EBFMI_THRESHOLD,
    acceptance_tolerance: float = 0.1,
) -> dict[str, Any]:
    """HMC/NUTS health checks in Stan's conventions, with plain-language warnings.

    Parameters
    ----------
    sample_stats : mapping of str to array_like, each shape (chain, draw)
        Post-warm-up sampler statistics: ``acceptance_rate``, ``diverging`` (bool),
        ``energy`` (Hamiltonian :math:`H`, Stan sign), ``step_size``, ``n_steps``
        (leapfrog steps = gradient evaluations per iteration), and for NUTS ``tree_depth``
        (or ``reach_max_depth``, bool). Missing keys skip the corresponding check.
    target_accept_prob : float
        Target of the step-size adaptation.
    max_tree_depth : int, optional
        NUTS maximum tree depth; transitions with ``tree_depth >= max_tree_depth`` are
        saturated (the trajectory was cut short).
    ebfmi_threshold : float, default 0.3
        Chains with E-BFMI below this are flagged [2]_.
    acceptance_tolerance : float, default 0.1
        Flag chains whose mean acceptance differs from the target by more than this.

    Returns
    -------
    dict
        ``num_chains``, ``num_draws``, ``target_accept_prob``,
        ``divergences`` ``{"total", "per_chain", "iterations": [[draw, ...] per chain]}``,
        ``ebfmi`` (per chain), ``acceptance`` ``{"mean", "per_chain"}``,
        ``step_size`` ``{"per_chain", "min", "max", "is_constant"}``,
        ``tree_depth`` ``{"max_tree_depth", "mean_per_chain", "max_observed",
        "num_saturated_per_chain", "fraction_saturated"}``,
        ``gradient_evals`` ``{"total", "per_chain", "mean_per_draw"}``, and ``warnings``
        (list of str). Absent inputs give None entries.

    References
    ----------
    .. [2] Betancourt, arXiv:1604.00695.
    """
    arrays = {key: np.asarray(value) for key, value in sample_stats.items()}
    shapes = {a.shape for a in arrays.values()}
    if any(len(s) != 2 for s in shapes):
        raise ValueError(f"sample_stats arrays must be (chain, draw), got shapes {shapes}")
    c, n = next(iter(arrays.values())).shape if arrays else (0, 0)
    warnings: list[str] = []
    out: dict[str, Any] = {
        "num_chains": c,
        "num_draws": n,
        "target_accept_prob": float(target_accept_prob),
        "divergences": None,
        "ebfmi": None,
        "acceptance": None,
        "step_size": None,
        "tree_depth": None,
        "gradient_evals": None,
        "warnings": warnings,
    }

    if "diverging" in arrays:
        div = arrays["diverging"].astype(bool)
        per_chain = div.sum(axis=1)
        out["divergences"] = {
            "total": int(per_chain.sum()),
            "per_chain": [int(v) for v in per_chain],
            "iterations": [[int(i) for i in np.flatnonzero(row)] for row in div],
        }
        suggestion = _suggest_target(target_accept_prob)
        for chain, count in enumerate(per_chain):
            if count:
                warnings.append(
                    f"{_plural(int(count), 'divergent transition')} after warm-up in chain "
                    f"{chain} — consider target_accept_prob {suggestion:g} (smaller steps) "
                    "or reparametrising; divergent draws may be biased"
                )

    if "energy" in arrays and n >= 2:
        ebfmi = _ebfmi(arrays["energy"].astype(float))
        out["ebfmi"] = [float(v) for v in ebfmi]
        low = [(chain, value) for chain, value in enumerate(ebfmi) if value < ebfmi_threshold]
        if low:
            which = ", ".join(f"{value:.2f} in chain {chain}" for chain, value in low)
            warnings.append(
                f"E-BFMI below {ebfmi_threshold:g} ({which}) — momentum resampling explores "
                "the energy levels poorly; improve the preconditioner (mass matrix) or "
                "reparametrise"
            )

    if "acceptance_rate" in arrays:
        acc = arrays["acceptance_rate"].astype(float).mean(axis=1)
        out["acceptance"] = {"mean": float(acc.mean()), "per_chain": [float(v) for v in acc]}
        for chain, value in enumerate(acc):
            if value < target_accept_prob - acceptance_tolerance:
                warnings.append(
                    f"mean acceptance {value:.2f} in chain {chain} is well below "
                    f"target_accept_prob {target_accept_prob:.2f} — step-size adaptation "
                    "may not have converged; consider a longer warm-up"
                )
            elif value > target_accept_prob + acceptance_tolerance:
                warnings.append(
                    f"mean acceptance {value:.2f} in chain {chain} is well above "
                    f"target_accept_prob {target_accept_prob:.2f} — the step size is "
                    "smaller than needed (slow mixing); check the step-size adaptation"
                )

    if "step_size" in arrays:
        eps = arrays["step_size"].astype(float)
        lo, hi = eps.min(axis=1), eps.max(axis=1)
        constant = np.all(hi - lo <= 1e-6 * np.abs(hi))
        out["step_size"] = {
            "per_chain": [float(v) for v in eps.mean(axis=1)],
            "min": float(eps.min()),
            "max": float(eps.max()),
            "is_constant": bool(constant),
        }
        if not constant:
            warnings.append(
                "step size changes after warm-up — adaptation should stop before the "
                "draws that are kept, otherwise the chain is not a valid Markov chain"
            )

    depth = arrays.get("tree_depth")
    if depth is not None or "reach_max_depth" in arrays:
        if "reach_max_depth" in arrays:
            saturated = arrays["reach_max_depth"].astype(bool)
        elif max_tree_depth is not None:
            saturated = depth >= max_tree_depth
        else:
            saturated = None
        info: dict[str, Any] = {
            "max_tree_depth": None if max_tree_depth is None else int(max_tree_depth),
            "mean_per_chain": None
            if depth is None
            else [float(v) for v in depth.astype(float).mean(axis=1)],
            "max_observed": None if depth is None else int(depth.max()),
            "num_saturated_per_chain": None,
            "fraction_saturated": None,
        }
        if saturated is not None:
            sat = saturated.sum(axis=1)
            info["num_saturated_per_chain"] = [int(v) for v in sat]
            info["fraction_saturated"] = float(saturated.mean())
            hit = [(chain, int(count)) for chain, count in enumerate(sat) if count]
            if hit:
                limit = "" if max_tree_depth is None else f" {max_tree_depth}"
                which = ", ".join(
                    f"{count} ({100.0 * count / n:.1f}%) in chain {chain}" for chain, count in hit
                )
                warnings.append(
                    f"transitions that hit max_tree_depth{limit}: {which} — trajectories are "
                    "cut short; raise max_tree_depth or improve the preconditioner"
                )
        out["tree_depth"] = info

    if "n_steps" in arrays:
        steps = arrays["n_steps"].astype(float)
        per_chain = steps.sum(axis=1)
        out["gradient_evals"] = {
            "total": float(per_chain.sum()),
            "per_chain": [float(v) for v in per_chain],
            "mean_per_draw": float(steps.mean()),
        }
    return out


# --------------------------------------------------------------------------------------
# Against truth and analytic references
# --------------------------------------------------------------------------------------


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
    a = np.asarray(field_a, dtype=float)
    grid = a.shape[-3:]
    fa = np.fft.rfftn(a, axes=(-3, -2, -1))
    fb = fa if field_b is None else np.fft.rfftn(np.asarray(field_b, float), axes=(-3, -2, -1))
    kbins = np.asarray(kbin_index).astype(int)
    weights = np.full(kbins.shape, 2.0)
    weights[..., 0] = 1.0
    if grid[2] % 2 == 0:
        weights[..., -1] = 1.0
    valid = (kbins >= 0) & (kbins < nbins)
    labels = kbins[valid]
    w = weights[valid]
    prod = (fa * fb.conj()).real[..., valid]  # (..., m)
    onehot = np.zeros((labels.size, nbins))
    onehot[np.arange(labels.size), labels] = w
    norm = onehot.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        power = (prod @ onehot) / norm
    if box_size is not None:
        side = np.broadcast_to(np.asarray(box_size, dtype=float), (3,))
        power = power * float(np.prod(side)) / float(np.prod(grid)) ** 2
    return power


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
    t = np.asarray(truth, dtype=float)
    if isinstance(draws_or_intervals, Mapping):
        probs = [float(p) for p in draws_or_intervals]
        bounds = [
            (np.asarray(lo, float), np.asarray(hi, float)) for lo, hi in draws_or_intervals.values()
        ]
    else:
        d = np.asarray(draws_or_intervals)
        if d.shape[sample_ndim:] != t.shape:
            raise ValueError(f"draws shape {d.shape} does not end with truth shape {t.shape}")
        probs = [float(p) for p in probs]
        qs = [q for p in probs for q in ((1.0 - p) / 2.0, (1.0 + p) / 2.0)]
        # Quantiles in chunks of elements: no float64 copy of all draws (field draws
        # can be most of the machine's memory). Flattening only the event axes keeps a
        # view of e.g. a (draw, chain) -> (chain, draw) swapaxes.
        events = d.reshape(d.shape[:sample_ndim] + (-1,))
        num_samples = math.prod(d.shape[:sample_ndim])
        step = chunk_size or max(1, _CHUNK_ELEMENTS // max(1, num_samples))
        quant = np.empty((len(qs), t.size))
        for start in range(0, t.size, step):
            # astype makes the one (contiguous) copy; the reshape is then a view
            block = events[..., start : start + step].astype(float).reshape(num_samples, -1)
            quant[:, start : start + step] = np.quantile(block, qs, axis=0)
        quant = quant.reshape((len(qs),) + t.shape)
        bounds = [(quant[2 * i], quant[2 * i + 1]) for i in range(len(probs))]
    inside = np.stack([(lo <= t) & (t <= hi) for lo, hi in bounds], axis=-1)
    inside = inside.reshape(-1, len(probs)).astype(float)
    out: dict[str, Any] = {
        "probs": probs,
        "coverage": inside.mean(axis=0),
        "num_elements": int(inside.shape[0]),
    }
    if labels is not None:
        lab = np.broadcast_to(np.asarray(labels).astype(int), t.shape).reshape(-1)
        num = int(lab.max()) + 1 if num_labels is None else int(num_labels)
        ok = (lab >= 0) & (lab < num)
        counts = np.bincount(lab[ok], minlength=num)[:num].astype(float)
        hits = np.stack(
            [
                np.bincount(lab[ok], weights=inside[ok, i], minlength=num)[:num]
                for i in range(len(probs))
            ],
            axis=-1,
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            out["per_label"] = hits / counts[:, None]
        out["per_label_count"] = counts.astype(int)
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


def truth_comparison(
    k: ArrayLike,
    power_truth: ArrayLike,
    *,
    power_draws: ArrayLike | None = None,
    power_mean: ArrayLike | None = None,
    power_cross: ArrayLike | None = None,
    coverage_result: Mapping[str, Any] | None = None,
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

    Returns
    -------
    dict
        ``k``, ``transfer_median``, ``transfer_lo``, ``transfer_hi`` (16/84%),
        ``transfer_mean_field``, ``cross_correlation`` (arrays or None), ``coverage``.
    """
    out: dict[str, Any] = {
        "k": np.asarray(k, dtype=float),
        "transfer_median": None,
        "transfer_lo": None,
        "transfer_hi": None,
        "transfer_mean_field": None,
        "cross_correlation": None,
        "coverage": None if coverage_result is None else dict(coverage_result),
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


# --------------------------------------------------------------------------------------
# Summary and report
# --------------------------------------------------------------------------------------


def to_jsonable(obj: Any) -> Any:
    """Convert nested NumPy/Python data to JSON-serialisable plain types.

    Arrays become (nested) lists, NumPy scalars Python scalars, and non-finite floats
    ``None`` (JSON has no NaN/inf).
    """
    if isinstance(obj, Mapping):
        return {str(key): to_jsonable(value) for key, value in obj.items()}
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        value = float(obj)
        return value if math.isfinite(value) else None
    if obj is None or isinstance(obj, str):
        return obj
    raise TypeError(f"cannot convert {type(obj).__name__} to JSON")


def _name_list(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _scalar_warnings(
    scalars: Mapping[str, Mapping[str, float]],
    num_chains: int,
    rhat_threshold: float,
    min_ess_per_chain: float,
) -> list[str]:
    warnings = []
    min_ess = min_ess_per_chain * max(num_chains, 1)
    bad_rhat = [
        (name, row["r_hat"])
        for name, row in scalars.items()
        if row["r_hat"] is not None
        and not math.isnan(row["r_hat"])
        and row["r_hat"] > rhat_threshold
    ]
    if bad_rhat:
        bad_rhat.sort(key=lambda item: -item[1])
        warnings.append(
            f"R-hat > {rhat_threshold:g} for {_plural(len(bad_rhat), 'quantity')} "
            f"(worst {bad_rhat[0][1]:.3f}: {_name_list([n for n, _ in bad_rhat])}) — chains "
            "have not mixed; run longer, check for multimodality or stuck chains"
        )
    for key, what in (
        ("ess_bulk", "posterior means and medians"),
        ("ess_tail", "credible intervals and tail quantiles"),
    ):
        low = [
            (name, row[key])
            for name, row in scalars.items()
            if row[key] is not None and not math.isnan(row[key]) and row[key] < min_ess
        ]
        if low:
            low.sort(key=lambda item: item[1])
            label = "bulk" if key == "ess_bulk" else "tail"
            warnings.append(
                f"{label} ESS below {min_ess:g} ({min_ess_per_chain:g} per chain) for "
                f"{_plural(len(low), 'quantity')} (lowest {low[0][1]:.0f}: "
                f"{_name_list([n for n, _ in low])}) — {what} are unreliable; run longer"
            )
    return warnings


def build_summary(
    *,
    posterior: Mapping[str, ArrayLike] | None = None,
    sample_stats: Mapping[str, ArrayLike] | None = None,
    target_accept_prob: float = 0.8,
    max_tree_depth: int | None = None,
    field: Mapping[str, Any] | None = None,
    truth: Mapping[str, Any] | None = None,
    wiener: Mapping[str, Any] | None = None,
    scalars_method: Literal["arviz", "numpy"] = "arviz",
    rhat_threshold: float = RHAT_THRESHOLD,
    min_ess_per_chain: float = MIN_ESS_PER_CHAIN,
    coverage_tolerance: float = 0.1,
    wiener_rms_tolerance: float = 0.25,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the machine-readable run summary (``summary.json``).

    Parameters
    ----------
    posterior : mapping of str to (chain, draw) arrays, optional
        Hyperparameters and tracked modes.
    sample_stats : mapping of str to (chain, draw) arrays, optional
        Sampler statistics (see :func:`sampler_health`); ``lp`` is summarised as a scalar.
    target_accept_prob : float, default 0.8
    max_tree_depth : int, optional
        NUTS only.
    field : mapping, optional
        Output of :func:`field_convergence` / :func:`mode_convergence`.
    truth : mapping, optional
        Output of :func:`truth_comparison`.
    wiener : mapping, optional
        Output of :func:`wiener_zscores` (only its ``summary`` is stored).
    scalars_method : {"arviz", "numpy"}, default "arviz"
        Backend of :func:`summarize_scalars`.
    rhat_threshold : float, default 1.01
    min_ess_per_chain : float, default 100
    coverage_tolerance : float, default 0.1
        Warn when a coverage differs from its nominal probability by more than this.
    wiener_rms_tolerance : float, default 0.25
        Warn when the rms of the Wiener z-scores differs from 1 by more than this.
    metadata : mapping, optional
        Free-form run information copied into ``summary["metadata"]``.

    Returns
    -------
    dict
        JSON-serialisable (plain lists/floats, ``None`` for NaN) with keys ``metadata``,
        ``num_chains``, ``num_draws``, ``thresholds``, ``scalars``, ``sampler``,
        ``efficiency`` (``gradient_evals_per_ess`` = total leapfrog steps / min bulk-or-tail
        ESS over the scalars, and which quantity attains the min), ``field``, ``truth``,
        ``wiener`` and ``warnings`` (list of plain-language strings: sampler health first,
        then scalars, field, truth and Wiener checks).
    """
    warnings: list[str] = []
    scalar_inputs: dict[str, ArrayLike] = {}
    if posterior is not None:
        scalar_inputs.update(posterior)
    if sample_stats is not None and "lp" in sample_stats:
        scalar_inputs.setdefault("lp", sample_stats["lp"])
    shapes = [np.shape(v) for v in scalar_inputs.values()]
    if sample_stats:
        shapes += [np.shape(v) for v in sample_stats.values()]
    num_chains, num_draws = shapes[0][:2] if shapes else (0, 0)

    sampler = None
    if sample_stats is not None:
        sampler = sampler_health(sample_stats, target_accept_prob, max_tree_depth)
        warnings += sampler["warnings"]

    scalars = summarize_scalars(scalar_inputs, method=scalars_method) if scalar_inputs else {}
    warnings += _scalar_warnings(scalars, num_chains, rhat_threshold, min_ess_per_chain)

    efficiency = None
    if sampler is not None and sampler["gradient_evals"] is not None:
        total = sampler["gradient_evals"]["total"]
        candidates = [
            (row[key], name, key)
            for name, row in scalars.items()
            for key in ("ess_bulk", "ess_tail")
            if not math.isnan(row[key])
        ]
        efficiency = {
            "total_gradient_evals": total,
            "gradient_evals_per_ess": None,
            "min_ess": None,
            "min_ess_quantity": None,
        }
        if candidates:
            min_ess, name, key = min(candidates)
            efficiency.update(
                gradient_evals_per_ess=total / min_ess if min_ess > 0 else math.nan,
                min_ess=min_ess,
                min_ess_quantity=f"{key} of {name}",
            )

    field_out = None
    if field is not None:
        field_out = {key: value for key, value in field.items()}
        overall = field["overall"]
        if overall["num_rhat_above"]:
            worst = field["worst_r_hat"][0] if field["worst_r_hat"] else None
            detail = (
                f" (worst {worst['r_hat']:.3f} at {worst['name']}, k-bin {worst['kbin']})"
                if worst and math.isfinite(worst["r_hat"])
                else ""
            )
            warnings.append(
                f"R-hat > {field['rhat_threshold']:g} (or undefined) for "
                f"{overall['num_rhat_above']} of {overall['num_values']} field-mode "
                f"components{detail} — the field has not converged in those modes"
            )
        min_field_ess = min_ess_per_chain * max(field["num_chains"], 1)
        ess_min = overall["ess_bulk_min"]
        if not math.isnan(ess_min) and ess_min < min_field_ess:
            worst = field["worst_ess_bulk"][0]
            warnings.append(
                f"bulk ESS of field modes down to {ess_min:.0f} (< {min_field_ess:g}) at "
                f"{worst['name']}, k-bin {worst['kbin']} — field means in those modes are "
                "noisy; run longer or thin less"
            )

    truth_out = None
    if truth is not None:
        truth_out = dict(truth)
        cov = truth.get("coverage")
        if cov is not None:
            for p, c in zip(cov["probs"], np.asarray(cov["coverage"]), strict=True):
                if abs(c - p) > coverage_tolerance:
                    verdict = "too narrow (overconfident)" if c < p else "too wide"
                    warnings.append(
                        f"{100 * p:.0f}% posterior intervals cover the truth "
                        f"{100 * c:.0f}% of the time — the posterior looks {verdict}"
                    )

    wiener_out = None
    if wiener is not None:
        wiener_out = dict(wiener.get("summary", wiener))
        for key, label in (("mean", "means"), ("var", "variances")):
            stats_ = wiener_out.get(key)
            if stats_ and stats_["num"] and abs(stats_["rms"] - 1.0) > wiener_rms_tolerance:
                warnings.append(
                    f"posterior {label} disagree with the analytic Wiener posterior: rms "
                    f"z-score {stats_['rms']:.2f} (expected 1), "
                    f"{100 * stats_['fraction_above_3']:.1f}% beyond 3σ (expected 0.3%)"
                )

    summary = {
        "metadata": dict(metadata) if metadata is not None else {},
        "num_chains": int(num_chains),
        "num_draws": int(num_draws),
        "thresholds": {
            "r_hat": rhat_threshold,
            "min_ess_per_chain": min_ess_per_chain,
            "ebfmi": EBFMI_THRESHOLD,
        },
        "scalars": scalars,
        "sampler": sampler,
        "efficiency": efficiency,
        "field": field_out,
        "truth": truth_out,
        "wiener": wiener_out,
        "warnings": warnings,
    }
    return to_jsonable(summary)


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return format(value, spec)
    return str(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-align the first column, right-align the rest."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(w) for cell, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


def format_report(summary: Mapping[str, Any]) -> str:
    """Human-readable report of a :func:`build_summary` dict (aligned tables + warnings).

    Parameters
    ----------
    summary : mapping
        Output of :func:`build_summary` (or the same dict loaded back from JSON).

    Returns
    -------
    str
        Multi-line text; the caller prints or saves it.
    """
    lines = ["fieldhmc diagnostics", "===================="]
    lines.append(
        f"{summary.get('num_chains', 0)} chains x {summary.get('num_draws', 0)} draws "
        "after warm-up (chains numbered from 0)"
    )

    scalars = summary.get("scalars") or {}
    if scalars:
        lines += ["", "Scalars"]
        headers = ["name", "mean", "sd", "q5", "q95", "mcse_mean", "ess_bulk", "ess_tail", "r_hat"]
        rows = [
            [
                name,
                _fmt(r["mean"], ".4g"),
                _fmt(r["sd"], "#.3g"),
                _fmt(r["q5"], ".4g"),
                _fmt(r["q95"], ".4g"),
                _fmt(r["mcse_mean"], ".2g"),
                _fmt(r["ess_bulk"], ".0f"),
                _fmt(r["ess_tail"], ".0f"),
                _fmt(r["r_hat"], ".3f"),
            ]
            for name, r in scalars.items()
        ]
        lines += _table(headers, rows)

    sampler = summary.get("sampler")
    if sampler:
        lines += ["", "Sampler health"]
        c = sampler["num_chains"]

        def per_chain(section: Any, key: str | None, spec: str) -> list[str]:
            if section is None:
                return ["-"] * c
            values = section if key is None else section.get(key)
            if values is None:
                return ["-"] * c
            return [_fmt(v, spec) for v in values]

        accept = per_chain(sampler["acceptance"], "per_chain", ".2f")
        step = per_chain(sampler["step_size"], "per_chain", ".3g")
        div = per_chain(sampler["divergences"], "per_chain", "d")
        ebfmi = per_chain(sampler["ebfmi"], None, ".2f")
        depth = sampler.get("tree_depth")
        mean_depth = per_chain(depth, "mean_per_chain", ".1f")
        sat = per_chain(depth, "num_saturated_per_chain", "d")
        grads = per_chain(sampler["gradient_evals"], "per_chain", ".0f")
        rows = [
            [str(i), accept[i], step[i], div[i], ebfmi[i], mean_depth[i], sat[i], grads[i]]
            for i in range(c)
        ]
        lines += _table(
            [
                "chain",
                "accept",
                "step_size",
                "divergent",
                "E-BFMI",
                "tree_depth",
                "saturated",
                "grad_evals",
            ],
            rows,
        )
        lines.append(f"target_accept_prob {sampler['target_accept_prob']:.2f}")
    efficiency = summary.get("efficiency")
    if efficiency and efficiency.get("gradient_evals_per_ess") is not None:
        lines.append(
            f"gradient evaluations per effective sample: "
            f"{efficiency['gradient_evals_per_ess']:.1f} "
            f"(min ESS {efficiency['min_ess']:.0f}, {efficiency['min_ess_quantity']})"
        )

    field = summary.get("field")
    if field:
        lines += ["", "Field convergence per k-bin (real and imaginary parts of each mode)"]
        kb = field["kbins"]
        nb = len(kb["num_modes"])
        k = field.get("k")
        rows = [
            [
                str(b),
                _fmt(k[b], ".3g") if k is not None else "-",
                _fmt(kb["num_modes"][b]),
                _fmt(kb["r_hat_median"][b], ".3f"),
                _fmt(kb["r_hat_max"][b], ".3f"),
                _fmt(kb["ess_bulk_min"][b], ".0f"),
                _fmt(kb["ess_bulk_median"][b], ".0f"),
                _fmt(kb["num_rhat_above"][b]),
            ]
            for b in range(nb)
        ]
        lines += _table(
            [
                "bin",
                "k [h/Mpc]",
                "modes",
                "r_hat_med",
                "r_hat_max",
                "ess_min",
                "ess_med",
                f"r_hat>{field['rhat_threshold']:g}",
            ],
            rows,
        )
        for key, title in (("worst_r_hat", "largest R-hat"), ("worst_ess_bulk", "lowest ESS")):
            entries = field.get(key) or []
            if entries:
                shown = ", ".join(
                    f"{e['name']} (bin {e['kbin']}, R-hat {_fmt(e['r_hat'], '.3f')}, "
                    f"ESS {_fmt(e['ess_bulk'], '.0f')})"
                    for e in entries[:5]
                )
                lines.append(f"modes with {title}: {shown}")
        vox = field.get("voxels")
        if vox:
            lines.append(
                f"voxels: R-hat median {_fmt(vox['r_hat_median'], '.3f')}, max "
                f"{_fmt(vox['r_hat_max'], '.3f')}; bulk ESS min "
                f"{_fmt(vox['ess_bulk_min'], '.0f')}, median "
                f"{_fmt(vox['ess_bulk_median'], '.0f')}"
            )

    truth = summary.get("truth")
    if truth:
        lines += ["", "Against truth"]
        cols = [
            ("transfer_median", "T(k) draws"),
            ("transfer_lo", "T 16%"),
            ("transfer_hi", "T 84%"),
            ("transfer_mean_field", "T mean field"),
            ("cross_correlation", "r(k)"),
        ]
        present = [(key, label) for key, label in cols if truth.get(key) is not None]
        k = truth.get("k") or []
        if present and k:
            rows = [
                [str(b), _fmt(k[b], ".3g")] + [_fmt(truth[key][b], ".3f") for key, _ in present]
                for b in range(len(k))
            ]
            lines += _table(["bin", "k [h/Mpc]"] + [label for _, label in present], rows)
        cov = truth.get("coverage")
        if cov:
            shown = ", ".join(
                f"{100 * p:.0f}%: {_fmt(c, '.3f')}"
                for p, c in zip(cov["probs"], cov["coverage"], strict=True)
            )
            lines.append(f"coverage of the truth (nominal: observed) {shown}")

    wiener = summary.get("wiener")
    if wiener:
        lines += ["", "Against the analytic Wiener posterior (z-scores, expected rms 1)"]
        rows = [
            [
                label,
                _fmt(s.get("num")),
                _fmt(s.get("rms"), ".2f"),
                _fmt(s.get("max_abs"), ".2f"),
                _fmt(s.get("fraction_above_3"), ".4f"),
            ]
            for label, s in (("mean", wiener.get("mean")), ("variance", wiener.get("var")))
            if s
        ]
        lines += _table(["moment", "n", "rms", "max|z|", "frac |z|>3"], rows)

    warnings = summary.get("warnings") or []
    lines.append("")
    if warnings:
        lines.append(f"Warnings ({len(warnings)})")
        lines += [f"  ! {w}" for w in warnings]
    else:
        lines.append("No warnings.")
    return "\n".join(lines) + "\n"
