"""Simulation-based calibration statistics: ranks, uniformity tests, ECDF bands.

Pure NumPy/SciPy, data in and data out. A calibrated inference pipeline, run on data
simulated from the prior, places the true value of any quantity :math:`f(\\theta, d)`
uniformly among :math:`L` posterior draws of it: the rank

.. math:: r = \\#\\{\\,l : f(\\theta^{(l)}, d) < f(\\theta^\\ast, d)\\,\\}

is uniform on :math:`\\{0, \\dots, L\\}` [1]_. Two tests of that per quantity, over
:math:`N` realisations:

* **chi-square** on :math:`B` rank bins (contiguous, near-equal widths; expected
  counts :math:`N w_b / (L + 1)`), :math:`B - 1` degrees of freedom;
* **ECDF** (graphical) test of [2]_: the ECDF of the ranks at :math:`z_i = i/(L+1)`,
  :math:`i = 1 \\dots L`, is :math:`\\mathrm{Bin}(N, z_i)/N` under uniformity (exactly,
  for discrete ranks). The statistic is the smallest two-sided pointwise tail
  probability,

  .. math:: \\gamma = \\min_i 2 \\min\\{F_{N,z_i}(N\\hat F_i),\\; 1 - F_{N,z_i}(N\\hat F_i - 1)\\},

  its null distribution is simulated (fixed seed, so the p-value is reproducible),
  and the simultaneous :math:`1-\\alpha` band is the pointwise binomial band at the
  level :math:`\\gamma_\\alpha` whose null exceedance probability is :math:`\\alpha`.

Ranks of ties are not randomised: the quantities fieldhmc ranks are continuous.

References
----------
.. [1] S. Talts, M. Betancourt, D. Simpson, A. Vehtari, A. Gelman, "Validating
   Bayesian inference algorithms with simulation-based calibration" (2018),
   arXiv:1804.06788.
.. [2] T. Säilynoja, P.-C. Bürkner, A. Vehtari, "Graphical test for discrete
   uniformity and its applications in goodness-of-fit evaluation and multiple sample
   comparison", Statistics and Computing 32, 32 (2022), arXiv:2103.10522.
.. [3] M. Modrák, A. H. Moon, S. Kim, P. Bürkner, N. Huurre, K. Faltejsková,
   A. Gelman, A. Vehtari, "Simulation-based calibration checking for Bayesian
   computation: the choice of test quantities shapes sensitivity" (2023),
   arXiv:2211.02383 (why the log likelihood is a useful quantity to rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = [
    "EcdfBand",
    "UniformityTest",
    "bonferroni",
    "chi_square_test",
    "ecdf_band",
    "ecdf_test",
    "rank_bins",
    "ranks",
    "thinned_indices",
    "uniformity_tests",
]

#: Null simulations for the ECDF test (p-values resolve to ~1/NUM_SIMULATIONS).
NUM_SIMULATIONS = 4000


def ranks(draws: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Rank of the truth among posterior draws, per quantity.

    Parameters
    ----------
    draws : np.ndarray
        ``[L, *quantity_shape]`` posterior draws (any real dtype).
    truth : np.ndarray
        ``[*quantity_shape]`` true values.

    Returns
    -------
    np.ndarray
        int64 ``[*quantity_shape]`` in ``0..L``: the number of draws below the truth.
    """
    draws = np.asarray(draws)
    truth = np.asarray(truth)
    if draws.shape[1:] != truth.shape:
        raise ValueError(f"draws {draws.shape} and truth {truth.shape} do not align")
    if not (np.isfinite(draws).all() and np.isfinite(truth).all()):
        raise ValueError("draws or truth contain NaN or Inf")
    return (draws < truth[None]).sum(axis=0).astype(np.int64)


def thinned_indices(num_available: int, num_draws: int) -> np.ndarray:
    """``num_draws`` evenly spaced indices into ``num_available`` draws (int64)."""
    if not 1 <= num_draws <= num_available:
        raise ValueError(f"need 1 <= num_draws <= {num_available} (got {num_draws})")
    return np.floor(np.arange(num_draws) * (num_available / num_draws)).astype(np.int64)


def rank_bins(num_draws: int, num_realisations: int, num_bins: int | None = None) -> np.ndarray:
    """Edges ``[B + 1]`` of contiguous rank bins over ``0..L`` (bin b is [e_b, e_{b+1})).

    Default ``B``: as many bins as keep 5 expected counts per bin (at least 2, at most
    ``L + 1`` and 20).
    """
    values = num_draws + 1
    if num_bins is None:
        num_bins = int(np.clip(num_realisations // 5, 2, min(values, 20)))
    if not 2 <= num_bins <= values:
        raise ValueError(f"num_bins must lie in 2..{values} (got {num_bins})")
    return np.unique(np.round(np.linspace(0, values, num_bins + 1)).astype(np.int64))


@dataclass(frozen=True)
class UniformityTest:
    """Statistic and p-value of one test, per quantity (``[Q]`` float64 each)."""

    statistic: np.ndarray
    pvalue: np.ndarray


def _check_ranks(rank_array: np.ndarray, num_draws: int) -> np.ndarray:
    r = np.asarray(rank_array)
    if r.ndim == 1:
        r = r[:, None]
    if r.ndim != 2 or r.shape[0] < 1:
        raise ValueError(f"ranks must be [realisations, quantities] (got shape {r.shape})")
    if r.min() < 0 or r.max() > num_draws:
        raise ValueError(f"ranks must lie in 0..{num_draws} (got {r.min()}..{r.max()})")
    return r.astype(np.int64)


def chi_square_test(
    rank_array: np.ndarray, num_draws: int, num_bins: int | None = None
) -> UniformityTest:
    """Pearson chi-square test of uniform ranks on contiguous bins.

    Parameters
    ----------
    rank_array : np.ndarray
        int ``[N, Q]`` ranks in ``0..L`` (or ``[N]``).
    num_draws : int
        ``L``, posterior draws per realisation.
    num_bins : int, optional
        See :func:`rank_bins`.
    """
    r = _check_ranks(rank_array, num_draws)
    n = r.shape[0]
    edges = rank_bins(num_draws, n, num_bins)
    expected = n * np.diff(edges) / (num_draws + 1)
    counts = np.stack(
        [np.histogram(r[:, q], bins=edges)[0] for q in range(r.shape[1])], axis=-1
    )  # [B, Q]; numpy's last bin is closed, and edges[-1] = L + 1 > any rank
    stat = ((counts - expected[:, None]) ** 2 / expected[:, None]).sum(axis=0)
    return UniformityTest(stat, stats.chi2.sf(stat, len(edges) - 2))


def _gamma_statistic(cum_counts: np.ndarray, n: int, z: np.ndarray) -> np.ndarray:
    """min_i of the two-sided binomial tail probability of ``cum_counts[..., i]``."""
    lower = stats.binom.cdf(cum_counts, n, z)
    upper = stats.binom.sf(cum_counts - 1, n, z)
    return np.minimum(1.0, 2.0 * np.minimum(lower, upper)).min(axis=-1)


def _null_gamma(n: int, num_draws: int, num_simulations: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = num_draws + 1
    counts = rng.multinomial(n, np.full(values, 1.0 / values), size=num_simulations)
    cum = np.cumsum(counts, axis=-1)[:, :-1]  # [M, L]: #(r < i) for i = 1..L
    z = np.arange(1, values) / values
    return _gamma_statistic(cum, n, z)


def _cumulative_counts(r: np.ndarray, num_draws: int) -> np.ndarray:
    """``[Q, L]``: #(ranks < i) for i = 1..L, per quantity."""
    values = num_draws + 1
    counts = np.stack([np.bincount(r[:, q], minlength=values) for q in range(r.shape[1])])
    return np.cumsum(counts, axis=-1)[:, :-1]


def ecdf_test(
    rank_array: np.ndarray,
    num_draws: int,
    num_simulations: int = NUM_SIMULATIONS,
    seed: int = 0,
) -> UniformityTest:
    """The ECDF (gamma-statistic) test of [2]_ for uniform discrete ranks.

    Returns the statistic :math:`\\gamma` (small = far from uniform) and its p-value
    :math:`P_0(\\gamma_0 \\le \\gamma)`, from ``num_simulations`` exact null draws.
    """
    if num_draws < 1:
        raise ValueError(f"num_draws must be >= 1 (got {num_draws})")
    r = _check_ranks(rank_array, num_draws)
    n = r.shape[0]
    z = np.arange(1, num_draws + 1) / (num_draws + 1)
    gamma = _gamma_statistic(_cumulative_counts(r, num_draws), n, z)
    null = np.sort(_null_gamma(n, num_draws, num_simulations, seed))
    below = np.searchsorted(null, gamma, side="right")  # #(null <= gamma)
    return UniformityTest(gamma, (below + 1.0) / (num_simulations + 1.0))


@dataclass(frozen=True)
class EcdfBand:
    """Simultaneous band for the ECDF of uniform ranks.

    Attributes
    ----------
    z : np.ndarray
        ``[L]`` evaluation points :math:`i/(L+1)`.
    lower, upper : np.ndarray
        ``[L]`` band for the ECDF at ``z`` (fractions in [0, 1]); subtract ``z`` for
        the ECDF-difference plot.
    alpha : float
        Simultaneous level: under uniformity the whole ECDF stays inside with
        probability about ``1 - alpha``.
    """

    z: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    alpha: float


def ecdf_band(
    num_realisations: int,
    num_draws: int,
    alpha: float = 0.05,
    num_simulations: int = NUM_SIMULATIONS,
    seed: int = 0,
) -> EcdfBand:
    """Simultaneous ``1 - alpha`` band for the ECDF of ``N`` uniform ranks in ``0..L``."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1) (got {alpha})")
    n = int(num_realisations)
    null = _null_gamma(n, num_draws, num_simulations, seed)
    gamma = float(np.quantile(null, alpha))
    z = np.arange(1, num_draws + 1) / (num_draws + 1)
    lower = stats.binom.ppf(gamma / 2, n, z) / n
    upper = stats.binom.ppf(1 - gamma / 2, n, z) / n
    return EcdfBand(z, lower, upper, alpha)


def uniformity_tests(
    rank_array: np.ndarray, num_draws: int, num_bins: int | None = None, seed: int = 0
) -> dict[str, UniformityTest]:
    """Both tests: ``{"chi_square": ..., "ecdf": ...}``."""
    return {
        "chi_square": chi_square_test(rank_array, num_draws, num_bins),
        "ecdf": ecdf_test(rank_array, num_draws, seed=seed),
    }


def bonferroni(pvalues: np.ndarray) -> float:
    """Family-wise p-value of several tests: ``min(1, m * min p)`` (any dependence)."""
    p = np.asarray(pvalues, np.float64).ravel()
    if p.size == 0:
        raise ValueError("no p-values")
    return float(min(1.0, p.size * p.min()))
