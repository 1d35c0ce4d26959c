"""Vectorised rank-normalised R-hat, ESS, MCSE and autocorrelation (ArviZ 0.23 conventions).

The estimators of Vehtari et al. (2021) [1]_, re-implemented with NumPy on chunks of
columns of ``(chain, draw, ...)`` arrays, so that millions of quantities take seconds.

References
----------
.. [1] A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner, "Rank-normalization,
   folding, and localization: An improved R-hat for assessing convergence of MCMC",
   Bayesian Analysis 16 (2021) 667, arXiv:1903.08008.
"""

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy import fft as sp_fft
from scipy import special
from scipy.fft import next_fast_len

#: Default :math:`\hat R` above which a quantity is flagged (Vehtari et al. 2021).
RHAT_THRESHOLD = 1.01
#: Default minimum bulk/tail ESS per chain (Stan warns below 100 per chain).
MIN_ESS_PER_CHAIN = 100.0

# Elements per chunk (chain * draw * columns) in the vectorised estimators: the FFT
# autocovariance works on a zero-padded complex copy, so peak memory is ~10x this * 8 bytes.
_CHUNK_ELEMENTS = 2**21


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
