"""Vectorised rank-normalised R-hat, ESS, MCSE and autocorrelation (ArviZ 0.23 conventions).

The estimators of Vehtari et al. (2021) [1]_, re-implemented with NumPy on chunks of
columns of ``(chain, draw, ...)`` arrays, so that millions of quantities take seconds.

References
----------
.. [1] A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner, "Rank-normalization,
   folding, and localization: An improved R-hat for assessing convergence of MCMC",
   Bayesian Analysis 16 (2021) 667, arXiv:1903.08008.
"""

import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

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
# autocovariance works on a zero-padded complex copy, so peak memory is ~10x this * 8 bytes
# per chunk in flight (see _WORKERS).
_CHUNK_ELEMENTS = 2**21


def _thread_count() -> int:
    """Usable cores (affinity mask), at most ``OMP_NUM_THREADS`` when that is set (Dask's
    worker processes set it to 1 by default: they already share the cores)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    limit = os.environ.get("OMP_NUM_THREADS", "")
    return min(cores, int(limit)) if limit.isdigit() and int(limit) > 0 else cores


#: Chunks computed at once, in threads: NumPy's sorts, its large ufuncs and SciPy's FFTs
#: release the GIL, so the rank and FFT estimators use every core. Chunks are then
#: ``_CHUNK_ELEMENTS / _WORKERS`` elements, so the working set stays the same.
_WORKERS = max(1, min(4, _thread_count()))


def _map_in_order(fn: Callable, items: Iterable, workers: int | None = None) -> Iterator:
    """``fn(*item)`` for each item, up to ``workers`` at a time in threads, in item order.

    Items are pulled from ``items`` in the calling thread (out-of-core slabs are read
    there), at most ``workers`` ahead of the result being handed back; results come
    back in the order of ``items``, so what the caller accumulates from them does not
    depend on the threads' timing.
    """
    workers = _WORKERS if workers is None else workers
    if workers <= 1:
        for item in items:
            yield fn(*item)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="fieldhmc-diagnostics") as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(fn, *item))
            if len(pending) >= workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _default_step(num_chains: int, num_draws: int) -> int:
    """Columns per chunk: :data:`_CHUNK_ELEMENTS` shared by the :data:`_WORKERS` in flight."""
    return max(1, _CHUNK_ELEMENTS // (_WORKERS * num_chains * num_draws))


# A chain's range below this times the quantity's magnitude counts as not moving.
_FROZEN_RTOL = 1e-9


# Internal layout: blocks are (column, chain, draw) C-contiguous, so that sorting and FFTs
# run along the last (contiguous) axis.


def _split_chains(x: np.ndarray) -> np.ndarray:
    """``(m, chain, draw) -> (m, 2 chain, draw // 2)``; the middle of odd chains is dropped."""
    n = x.shape[-1]
    half = n // 2
    return np.concatenate([x[..., :half], x[..., n - half :]], axis=1)


def _average_ranks(a: np.ndarray) -> np.ndarray:
    """1-based ranks along the last axis of a 2-D array, ties sharing their average rank.

    Same as ``scipy.stats.rankdata(method="average")`` row by row (rows containing NaN
    become NaN), but vectorised over rows: runs of equal sorted values are found on the
    flattened array (every row starts a run), so ties cost O(size) like the rest.
    """
    rows, size = a.shape
    order = np.argsort(a, axis=-1)
    row_index = np.arange(rows)[:, None]
    ordered = a[row_index, order]
    is_first = np.ones(a.shape, dtype=bool)
    is_first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    if is_first.all():  # no ties: ordinal ranks
        sorted_ranks = np.arange(1.0, size + 1.0)
    else:
        starts = np.flatnonzero(is_first)
        lengths = np.diff(starts, append=is_first.size)
        average = starts % size + 0.5 * (lengths - 1) + 1.0
        sorted_ranks = np.repeat(average, lengths).reshape(a.shape)
    ranks = np.empty(a.shape)
    ranks[row_index, order] = sorted_ranks
    return np.where(np.isnan(a).any(axis=-1, keepdims=True), np.nan, ranks)


def _z_scale(x: np.ndarray) -> np.ndarray:
    """Rank-normalise each column over all its ``chain * draw`` values.

    .. math:: z = \\Phi^{-1}\\!\\left(\\frac{r - 3/8}{S + 1/4}\\right)

    with :math:`r` the average rank among the :math:`S` values (Blom offset, as ArviZ).
    """
    m, c, n = x.shape
    ranks = _average_ranks(x.reshape(m, c * n))
    return special.ndtri((ranks - 0.375) / (c * n + 0.25)).reshape(m, c, n)


def _between_within(x: np.ndarray) -> np.ndarray:
    """Between- to within-chain variance ratio :math:`B/W` of each column of ``(m, chain, draw)``.

    With :math:`B = N\\,\\mathrm{var}(\bar\theta_j)` and :math:`W` the mean within-chain
    variance; about 1 (times the integrated autocorrelation time) for mixed chains.
    """
    n = x.shape[-1]
    between = n * x.mean(axis=-1).var(axis=-1, ddof=1)
    within = x.var(axis=-1, ddof=1).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return between / within


def _rhat_from_ratio(ratio: np.ndarray, n: int) -> np.ndarray:
    r""":math:`\hat R = \sqrt{(B/W + N - 1)/N}` for chains of ``n`` draws."""
    return np.sqrt((ratio + n - 1) / n)


def _rhat_basic(x: np.ndarray) -> np.ndarray:
    """Classic (non-split) potential scale reduction of each column of ``(m, chain, draw)``."""
    return _rhat_from_ratio(_between_within(x), x.shape[-1])


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
    With :math:`\\hat\rho_t` the multi-chain autocorrelation of [1]_ and pair sums
    :math:`P_k = \\hat\rho_{2k} + \\hat\rho_{2k+1}`, the truncation pair :math:`K` is the
    first :math:`k \\ge 1` with :math:`P_k \\le 0` (capped by the chain length), and

    .. math::
        \\hat\tau = -1 + 2 \\sum_{k<K} \\min_{j \\le k} P_j + \\hat\rho_{2K}\\,
        [P_K \\ge 0 \\lor \\hat\rho_{2K} > 0],
        \\qquad \\mathrm{ESS} = \frac{M N}{\\max(\\hat\tau, 1/\\log_{10}(M N))}

    for :math:`M` chains of :math:`N` draws.
    """
    return _ess_from_autocov(x, _autocov(x))


def _ess_from_autocov(x: np.ndarray, acov: np.ndarray) -> np.ndarray:
    """:func:`_ess_basic` given ``acov = _autocov(x)``."""
    _, c, n = x.shape
    with np.errstate(invalid="ignore"):
        value_range = np.ptp(x, axis=(1, 2))
    mean_var = acov[..., 0].mean(axis=-1) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if c > 1:
        var_plus = var_plus + x.mean(axis=-1).var(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (mean_var[:, None] - acov.mean(axis=1)) / var_plus[:, None]  # (m, n)
    rho[:, 0] = 1.0
    is_const = value_range < np.finfo(float).resolution
    ess = np.where(is_const, float(c * n), c * n / _geyer_tau(rho, c * n))
    return np.where(np.isnan(value_range), np.nan, ess)


def _geyer_tau(rho: np.ndarray, size: int) -> np.ndarray:
    """Integrated autocorrelation time from autocorrelations ``rho`` ``(m, n)`` (see above)."""
    m, n = rho.shape
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
    return np.maximum(-1.0 + 2.0 * pair_sum + last, 1.0 / np.log10(size))


def _frozen_chains(x: np.ndarray) -> np.ndarray:
    """``(m, chain)``: chains in which a column of ``(m, chain, draw)`` never changes.

    "Never changes" allows the round-off of a float64 log density re-centred between
    chunks: a range within the chain below ``_FROZEN_RTOL`` times the column's largest
    magnitude. A float32 quantity that moves at all changes by at least its resolution.
    """
    with np.errstate(invalid="ignore"):
        scale = np.max(np.abs(x), axis=(1, 2))
        return np.ptp(x, axis=-1) <= _FROZEN_RTOL * scale[:, None]


def frozen_chains(draws: ArrayLike) -> np.ndarray:
    """Which chains never move, per quantity.

    A chain whose draws of a quantity are all equal (a stuck sampler: acceptance 0, or a
    quantity that cannot change) carries no information about its spread, so R-hat, ESS
    and MCSE of that quantity are undefined (NaN) here, unlike ArviZ's convention of
    counting a constant quantity as ``chain * draw`` effective samples.

    Parameters
    ----------
    draws : array_like, shape (chain, draw, ...)

    Returns
    -------
    numpy.ndarray of bool, shape (chain, ...)
    """
    x = np.asarray(draws, dtype=float)
    if x.ndim < 2:
        raise ValueError(f"draws must have shape (chain, draw, ...), got {x.shape}")
    flat = np.moveaxis(x.reshape(x.shape[:2] + (-1,)), -1, 0)
    return _frozen_chains(flat).T.reshape((x.shape[0],) + x.shape[2:])


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


def _as_draws(draws: ArrayLike) -> ArrayLike:
    """``draws`` itself if it is stored out of core (has ``shape`` but is no ndarray).

    Such objects (an ``h5py.Dataset``, a view of one) are read in slabs by
    :func:`_column_blocks` instead of being loaded whole.
    """
    if not isinstance(draws, np.ndarray) and hasattr(draws, "shape") and hasattr(draws, "dtype"):
        return draws
    return np.asarray(draws)


def _column_blocks(draws: ArrayLike, step: int, sample_ndim: int = 2):
    """Yield ``(start, stop, block)`` over the flattened trailing (event) axes of ``draws``.

    ``block`` is ``draws[..., start:stop]`` with the ``sample_ndim`` leading axes kept and
    the event axes flattened (a view for an ndarray). For out-of-core draws (see
    :func:`_as_draws`) whole slabs of the first event axis are read, about ``step``
    columns at a time, so memory stays at one slab whatever the size of ``draws``.
    """
    lead = tuple(draws.shape[:sample_ndim])
    events = tuple(draws.shape[sample_ndim:])
    m = math.prod(events)
    if isinstance(draws, np.ndarray):
        flat = draws.reshape(lead + (m,))
        for start in range(0, m, step):
            yield start, min(start + step, m), flat[..., start : start + step]
        return
    if not events:
        yield 0, 1, np.asarray(draws[()]).reshape(lead + (1,))
        return
    plane = max(1, m // max(1, events[0]))
    per_read = max(1, step // plane)
    index = (slice(None),) * sample_ndim
    for p0 in range(0, events[0], per_read):
        p1 = min(p0 + per_read, events[0])
        slab = np.asarray(draws[index + (slice(p0, p1),)]).reshape(lead + (-1,))
        for s0 in range(0, slab.shape[-1], step):
            start = p0 * plane + s0
            yield start, start + min(step, slab.shape[-1] - s0), slab[..., s0 : s0 + step]


def _apply_columns(
    block_fn: Callable[[np.ndarray], np.ndarray],
    draws: ArrayLike,
    *,
    min_chains: int,
    chunk_size: int | None,
    num_outputs: int = 0,
) -> np.ndarray:
    """Apply ``block_fn`` to chunks of the flattened trailing axes of ``(chain, draw, ...)``.

    Each chunk is handed over as a contiguous ``(columns, chain, draw)`` array. ``draws``
    may be out of core (e.g. an ``h5py.Dataset``): it is then read in slabs.
    """
    x = _as_draws(draws)
    if x.ndim < 2:
        raise ValueError(f"draws must have shape (chain, draw, ...), got {x.shape}")
    c, n = x.shape[:2]
    trailing = tuple(x.shape[2:])
    m = math.prod(trailing)
    out_shape = ((num_outputs,) if num_outputs else ()) + (m,)
    out = np.full(out_shape, np.nan)
    if c < min_chains or n < 4 or m == 0:
        return out.reshape(out_shape[:-1] + trailing)
    step = chunk_size or _default_step(c, n)

    def compute(start, stop, cols):
        block = np.ascontiguousarray(cols.transpose(2, 0, 1), dtype=float)
        frozen = _frozen_chains(block).any(axis=-1)
        return start, stop, np.where(frozen, np.nan, block_fn(block))

    for start, stop, values in _map_in_order(compute, _column_blocks(x, step)):
        out[..., start:stop] = values
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
