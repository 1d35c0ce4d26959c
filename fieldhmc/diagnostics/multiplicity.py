"""Convergence checks for many quantities at once (field modes, k-bins).

The single-quantity rule :math:`\\hat R > 1.01` [1]_ cannot be applied to tens of
thousands of modes: with a few hundred draws per chain a perfectly mixed mode exceeds
1.01 a fair fraction of the time, and the largest of 32,768 always does. Instead each
mode's :math:`\\hat R` is compared with its distribution for converged chains of the
same shape and autocorrelation, and the modes are tested together with a
false-discovery-rate procedure whose false-alarm rate for a converged run is stated.

The rule
--------
:math:`\\hat R` is the larger of the bulk and tail (folded) split-:math:`\\hat R`, each
:math:`\\sqrt{(B/W + N - 1)/N}` for :math:`M` split chains of :math:`N` draws. For
converged chains with integrated autocorrelation time :math:`\\tau`, the chain means
are independent and normal with variance :math:`\\tau\\sigma^2/N`, so

.. math::
    \\frac{B/W}{\\tau} \\sim F\\bigl(M - 1,\\; M (N/\\tau - 1)\\bigr)

approximately. :math:`\\tau` is estimated within chains only (which a shifted or stuck
chain does not change, unlike the ESS): from the spread of batch means inside each
chain, at batch lengths :math:`N/2` and :math:`N/4` extrapolated to :math:`N`, averaged
over the modes of the k-bin (over all modes if the bin has fewer than
:data:`MIN_VALUES_PER_BIN`), so that a minority of bad modes cannot hide itself. Each
mode gets the p-value :math:`p = \\min(1, 2\\min(p_\\mathrm{bulk}, p_\\mathrm{tail}))`
and the modes whose p-values pass the Benjamini–Hochberg step-up test at level
:math:`q` [2]_ are flagged.
If every mode is converged (and the modes are independent, as for a whitened
posterior), a warning is raised with probability at most :math:`q` (Simes' theorem);
if some are not, at most a fraction :math:`q` of the flagged modes are false alarms.

References
----------
.. [1] A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner, "Rank-normalization,
   folding, and localization: An improved R-hat for assessing convergence of MCMC",
   Bayesian Analysis 16 (2021) 667, arXiv:1903.08008.
.. [2] Y. Benjamini, Y. Hochberg, "Controlling the false discovery rate: a practical and
   powerful approach to multiple testing", J. R. Stat. Soc. B 57 (1995) 289.
"""

import math

import numpy as np
from scipy import stats

#: Probability that a converged run raises the field-convergence warning (BH level q).
FIELD_FALSE_ALARM = 0.01
#: k-bins with fewer real values than this take the autocorrelation time of all modes.
MIN_VALUES_PER_BIN = 64


def reference_tau(tau: np.ndarray, labels: np.ndarray, nbins: int) -> np.ndarray:
    """Per-k-bin reference scale of :math:`B/W`: the mean of the modes' estimates.

    Parameters
    ----------
    tau : numpy.ndarray, shape (m,)
        Per-value within-chain (batch-means) estimate of the :math:`B/W` that converged
        chains give (NaN where undefined); noisy per value, precise once averaged.
    labels : numpy.ndarray of int, shape (m,)
        k-bin of each value in ``[0, nbins)``.
    nbins : int

    Returns
    -------
    numpy.ndarray, shape (nbins,)
        Bin mean, or the mean over all values for bins with fewer than
        :data:`MIN_VALUES_PER_BIN` finite values (NaN if none is finite).
    """
    finite = np.isfinite(tau)
    counts = np.bincount(labels[finite], minlength=nbins)[:nbins]
    sums = np.bincount(labels[finite], weights=tau[finite], minlength=nbins)[:nbins]
    return reference_tau_from_sums(sums, counts)


def reference_tau_from_sums(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """:func:`reference_tau` from per-bin sums and counts of the finite estimates.

    For statistics accumulated block by block (no per-value array of ``tau`` kept).

    Parameters
    ----------
    sums, counts : numpy.ndarray, shape (nbins,)
        Sum and number of the finite per-value estimates in each k-bin.

    Returns
    -------
    numpy.ndarray, shape (nbins,)
        As :func:`reference_tau`.
    """
    total = counts.sum()
    overall = float(sums.sum() / total) if total else math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(counts >= MIN_VALUES_PER_BIN, sums / counts, overall)


def ratio_pvalue(ratio: np.ndarray, tau: np.ndarray, num_chains: int, num_draws: int) -> np.ndarray:
    """P(B/W at least this large) for converged split chains with autocorrelation ``tau``.

    Parameters
    ----------
    ratio : numpy.ndarray
        Between/within variance ratio of ``num_chains`` split chains of ``num_draws``.
    tau : numpy.ndarray, broadcastable
        Reference integrated autocorrelation time (in draws).
    num_chains, num_draws : int
        Split chains :math:`M` and draws per split chain :math:`N`.

    Returns
    -------
    numpy.ndarray
        Upper-tail probability of :math:`F(M - 1, M(N/\\tau - 1))` at ``ratio / tau``.
    """
    tau = np.maximum(tau, 1e-3)
    dfd = np.maximum(num_chains * (num_draws / tau - 1.0), 1.0)
    with np.errstate(invalid="ignore"):
        return stats.f.sf(ratio / tau, num_chains - 1, dfd)


def rhat_pvalue(
    ratio_bulk: np.ndarray,
    ratio_tail: np.ndarray,
    tau_bulk: np.ndarray,
    tau_tail: np.ndarray,
    num_chains: int,
    num_draws: int,
) -> np.ndarray:
    """p-value of :math:`\\hat R = \\max(\\hat R_\\mathrm{bulk}, \\hat R_\\mathrm{tail})`.

    Bonferroni over the two: :math:`\\min(1, 2 \\min(p_\\mathrm{bulk}, p_\\mathrm{tail}))`.
    Arguments as :func:`ratio_pvalue`; NaN where any input is NaN.
    """
    p_bulk = ratio_pvalue(ratio_bulk, tau_bulk, num_chains, num_draws)
    p_tail = ratio_pvalue(ratio_tail, tau_tail, num_chains, num_draws)
    return np.minimum(1.0, 2.0 * np.minimum(p_bulk, p_tail))


def benjamini_hochberg(pvalues: np.ndarray, q: float = FIELD_FALSE_ALARM) -> np.ndarray:
    """Benjamini–Hochberg step-up test: which p-values are discoveries at level ``q``.

    NaN p-values are never discoveries and do not count towards the number of tests.

    Parameters
    ----------
    pvalues : numpy.ndarray, shape (m,)
    q : float, default 0.01
        False discovery rate; also the false-alarm probability when every null holds.

    Returns
    -------
    numpy.ndarray of bool, shape (m,)
    """
    p = np.asarray(pvalues, dtype=float)
    flagged = np.zeros(p.shape, dtype=bool)
    num_tests = int(np.count_nonzero(np.isfinite(p)))
    if num_tests == 0:
        return flagged
    # Every threshold q k / m is at most q, so only p <= q can pass; they are also the
    # smallest p-values, so their ranks among themselves are their ranks among all
    # (sorting only them gives the same flags without a sort of all m p-values).
    candidates = np.flatnonzero(p <= q)
    order = candidates[np.argsort(p[candidates], kind="stable")]
    passes = p[order] <= q * np.arange(1, order.size + 1) / num_tests
    if passes.any():
        flagged[order[: np.flatnonzero(passes)[-1] + 1]] = True
    return flagged


def rhat_reference_quantile(prob: float, tau: float, num_chains: int, num_draws: int) -> float:
    """Bulk :math:`\\hat R` that converged split chains exceed with probability ``prob``.

    For the report: e.g. ``prob = 0.01`` gives the value 1% of converged modes exceed.
    Arguments as :func:`ratio_pvalue` (scalars).
    """
    if not (math.isfinite(tau) and num_chains >= 2 and num_draws >= 2):
        return math.nan
    dfd = max(num_chains * (num_draws / max(tau, 1e-3) - 1.0), 1.0)
    ratio = tau * float(stats.f.isf(prob, num_chains - 1, dfd))
    return math.sqrt((ratio + num_draws - 1.0) / num_draws)
