"""SBC statistics (fieldhmc.sbc): ranks, chi-square and ECDF tests, bands.

Calibration of the tests is checked on many independent sets of exactly uniform
ranks at once, with binomial z-tests on the rejection rate.
"""

import numpy as np
import pytest

from fieldhmc import sbc


def _z(k: int, n: int, p: float) -> float:
    return (k - n * p) / np.sqrt(n * p * (1 - p))


def test_ranks_count_draws_below_truth():
    draws = np.array([[0.0, 5.0], [1.0, 6.0], [2.0, 7.0]])  # [L=3, Q=2]
    assert sbc.ranks(draws, np.array([1.5, 10.0])).tolist() == [2, 3]
    assert sbc.ranks(draws, np.array([-1.0, 5.5])).tolist() == [0, 1]
    with pytest.raises(ValueError, match="NaN"):
        sbc.ranks(draws, np.array([np.nan, 0.0]))
    with pytest.raises(ValueError, match="align"):
        sbc.ranks(draws, np.zeros(3))


def test_thinned_indices_and_bins():
    assert sbc.thinned_indices(10, 5).tolist() == [0, 2, 4, 6, 8]
    edges = sbc.rank_bins(19, 40)  # 20 rank values, 8 bins of 2.5 -> rounded edges
    assert edges[0] == 0 and edges[-1] == 20 and len(edges) == 9
    with pytest.raises(ValueError, match="num_bins"):
        sbc.rank_bins(3, 100, num_bins=5)


@pytest.mark.parametrize("num_realisations,num_draws", [(20, 20), (100, 9)])
def test_tests_hold_their_level_under_uniformity(num_realisations, num_draws):
    rng = np.random.default_rng(1)
    q = 600  # independent quantities, each a fresh uniform rank set
    r = rng.integers(0, num_draws + 1, size=(num_realisations, q))
    for name, test in sbc.uniformity_tests(r, num_draws).items():
        p = test.pvalue
        assert p.shape == (q,) and np.all((p > 0) & (p <= 1))
        # Discrete statistics are conservative: the rate may fall below alpha, not above.
        for alpha in (0.05, 0.2):
            z = _z(int((p < alpha).sum()), q, alpha)
            assert z < 3.5, (name, alpha, z)
            assert z > -8, (name, alpha, z)  # not degenerate (never rejecting)


def test_tests_reject_overdispersed_and_biased_ranks():
    rng = np.random.default_rng(2)
    n, num_draws = 40, 20
    # Overconfident posterior: ranks pile up at both ends; biased: shifted up.
    ends = np.where(rng.random((n, 50)) < 0.5, 0, num_draws)
    uniform = rng.integers(0, num_draws + 1, (n, 50))
    u_shaped = np.where(rng.random((n, 50)) < 0.6, ends, uniform)
    biased = np.minimum(rng.integers(0, num_draws + 1, (n, 50)) + 8, num_draws)
    for r in (u_shaped, biased):
        tests = sbc.uniformity_tests(r, num_draws)
        assert np.mean(tests["chi_square"].pvalue < 0.01) > 0.9
        assert np.mean(tests["ecdf"].pvalue < 0.01) > 0.9


def test_ecdf_band_is_simultaneous():
    rng = np.random.default_rng(3)
    n, num_draws, alpha = 30, 15, 0.1
    band = sbc.ecdf_band(n, num_draws, alpha=alpha)
    assert np.all(band.lower <= band.z) and np.all(band.upper >= band.z)
    m = 2000
    r = rng.integers(0, num_draws + 1, size=(m, n))
    ecdf = np.stack([np.cumsum(np.bincount(x, minlength=num_draws + 1))[:-1] / n for x in r])
    outside = np.any((ecdf < band.lower - 1e-12) | (ecdf > band.upper + 1e-12), axis=1)
    # Discreteness makes the band conservative; it must not be anti-conservative.
    z = _z(int(outside.sum()), m, alpha)
    assert -6 < z < 3.5, z


def test_bonferroni():
    assert sbc.bonferroni([0.01, 0.5, 0.2]) == pytest.approx(0.03)
    assert sbc.bonferroni([0.9, 0.8]) == 1.0
