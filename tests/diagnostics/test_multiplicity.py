"""Multiplicity-aware field convergence and degenerate (stuck) chains.

The field tests use the shape of the issue: 4 chains x 200 draws x 32,768 quantities
(the modes of a 32³ grid minus k = 0: 32,767 real values). The warning's false-alarm
rate for converged chains is ``diag.FIELD_FALSE_ALARM`` = 1% by construction; the
default tests check it on fixed seeds and the per-mode p-values' calibration, the slow
test counts false alarms over many seeds.
"""

import json
import math

import numpy as np
import pytest
from scipy import stats

from fieldhmc import diagnostics as diag
from fieldhmc.diagnostics import multiplicity
from tests.test_diagnostics import ar1, healthy_stats, kbin_grid

GRID = (32, 32, 32)
NBINS = 27
CHAINS, DRAWS = 4, 200


@pytest.fixture(scope="module")
def kbins() -> np.ndarray:
    return kbin_grid(GRID, NBINS)


def gaussian_modes(
    rng: np.random.Generator, rho: float = 0.0, grid: tuple[int, int, int] = GRID
) -> np.ndarray:
    """Independent (AR(1) along the draws if rho != 0) complex Gaussian modes."""
    shape = (CHAINS, DRAWS, grid[0], grid[1], grid[2] // 2 + 1)
    if rho:
        return ar1(rng, rho, shape) + 1j * ar1(rng, rho, shape)
    return rng.normal(size=shape) + 1j * rng.normal(size=shape)


def field_warnings(out: dict) -> list[str]:
    return [w for w in diag.build_summary(field=out)["warnings"] if "field-mode" in w]


def converge(modes: np.ndarray, kbins: np.ndarray, grid: tuple[int, int, int] = GRID) -> dict:
    return diag.mode_convergence(modes, kbins, NBINS, grid, num_worst=2000)


# --------------------------------------------------------------------------------------
# Converged chains: no warning, calibrated p-values
# --------------------------------------------------------------------------------------


# Seed 0 of this generator raises a one-mode false alarm (p = 1.3e-7 against the BH bound
# 0.01 / 32767 = 3.1e-7): at a 1% false-alarm rate that happens. Seeds 1000-1019 (the
# population of the slow test below, iid) gave no alarm.
@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_independent_gaussian_draws_raise_no_field_warning(kbins, seed):
    out = converge(gaussian_modes(np.random.default_rng(seed)), kbins)
    assert out["overall"]["num_values"] == 32767
    # the single-quantity rule would flag hundreds of these converged modes
    assert out["overall"]["num_rhat_above"] > 100
    assert out["overall"]["num_flagged"] == 0
    assert field_warnings(out) == []


def test_pvalues_of_converged_modes_are_uniform():
    """Calibration in the tail the BH test uses: P(p < a) = a down to a = 1e-3, for
    independent, autocorrelated (ESS = N/4) and antithetic (ESS = 1.9 N) chains."""
    grid = (8, 32, 32)  # 8,176 values per case
    kbins = kbin_grid(grid, NBINS)
    flat_index, num_real = diag.modes._select_values(kbins, NBINS, grid)
    labels = diag.modes._value_labels(kbins, flat_index, NBINS)
    rng = np.random.default_rng(5)
    p = []
    for rho in (0.0, 0.6, -0.3):
        shape = (CHAINS, DRAWS) + grid[:2] + (grid[2] // 2 + 1,)
        modes = ar1(rng, rho, shape) + 1j * ar1(rng, rho, shape)
        stat, _ = diag.modes._mode_statistics(modes, flat_index, num_real, labels, NBINS, None)
        test = diag.modes._multiplicity_test(stat, labels, NBINS, (CHAINS, DRAWS), 0.01)
        p.append(test["p_value"])
    p = np.concatenate(p)
    for level in (0.1, 0.01, 0.001):
        expected = level * p.size
        observed = int((p < level).sum())
        # binomial 4-sigma band
        assert abs(observed - expected) < 4 * math.sqrt(expected) + 1, (level, observed, expected)


# --------------------------------------------------------------------------------------
# Unconverged chains: the warning fires and names the modes / the chain
# --------------------------------------------------------------------------------------


def test_one_chain_shifted_in_five_percent_of_modes_is_found(kbins):
    rng = np.random.default_rng(11)
    modes = gaussian_modes(rng)
    flat = modes.reshape(CHAINS, DRAWS, -1)
    shifted = rng.choice(flat.shape[-1], size=flat.shape[-1] // 20, replace=False)
    flat[3, :, shifted] += 0.3 * (1 + 1j)  # chain 3, 0.3 sd in real and imaginary parts
    out = converge(modes, kbins)
    flagged = out["flagged"]
    assert out["overall"]["num_flagged"] >= 30
    is_shifted = np.isin(
        [np.ravel_multi_index(e["index"], modes.shape[2:]) for e in flagged], shifted
    )
    assert is_shifted.mean() >= 0.95  # false discoveries stay near the 1% FDR
    (warning,) = field_warnings(out)
    assert flagged[0]["name"] in warning and "chain 3 is the outlier" in warning
    assert f"k-bin {flagged[0]['kbin']}" in warning


SMALL = (16, 16, 16)  # 4,095 values: the same code paths, a quarter of a second


def test_a_chain_that_barely_moves_is_found_and_named():
    rng = np.random.default_rng(12)
    modes = gaussian_modes(rng, grid=SMALL)
    modes[2] = modes[2, :1] + 0.05 * modes[2]  # chain 2 stays near its first draw
    out = converge(modes, kbin_grid(SMALL, NBINS), SMALL)
    assert out["overall"]["num_flagged"] > 0.9 * out["overall"]["num_values"]
    (warning,) = field_warnings(out)
    assert "chain 2 is the outlier" in warning


def test_a_frozen_chain_makes_every_mode_undefined():
    rng = np.random.default_rng(13)
    modes = gaussian_modes(rng, grid=SMALL)
    modes[1] = modes[1, :1]  # chain 1 never moves
    out = converge(modes, kbin_grid(SMALL, NBINS), SMALL)
    overall = out["overall"]
    assert overall["num_undefined"] == overall["num_values"]
    assert overall["frozen_per_chain"] == [0, overall["num_values"], 0, 0]
    assert math.isnan(overall["ess_bulk_median"]) and math.isnan(overall["r_hat_max"])
    (warning,) = field_warnings(out)
    assert "undefined for 4095 of 4095" in warning and "chain(s) 1 never move" in warning


# --------------------------------------------------------------------------------------
# The test's parts
# --------------------------------------------------------------------------------------


def test_benjamini_hochberg_known_example():
    p = np.array([0.01, 0.04, 0.03, 0.005, np.nan, 0.5])
    # sorted finite: 0.005 0.01 0.03 0.04 0.5 vs q i / 5 at q = 0.05: 0.01 0.02 0.03 0.04 0.05
    assert diag.benjamini_hochberg(p, 0.05).tolist() == [True, True, True, True, False, False]
    assert not diag.benjamini_hochberg(np.full(10, 0.2), 0.05).any()


def test_ratio_pvalue_matches_f_distribution():
    p = multiplicity.ratio_pvalue(np.array([2.0 * 3.0]), np.array([3.0]), 8, 100)
    assert p[0] == pytest.approx(stats.f.sf(2.0, 7, 8 * (100 / 3 - 1)))


def test_reference_quantile_is_what_converged_chains_exceed_one_percent_of_the_time():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(CHAINS, DRAWS, 20000))
    split = np.concatenate([x[:, : DRAWS // 2], x[:, DRAWS // 2 :]], axis=0)
    r_bulk = diag.convergence._rhat_basic(
        diag.convergence._z_scale(np.ascontiguousarray(split.transpose(2, 0, 1)))
    )
    q99 = multiplicity.rhat_reference_quantile(0.01, 1.0, 2 * CHAINS, DRAWS // 2)
    assert abs((r_bulk > q99).mean() - 0.01) < 4 * math.sqrt(0.01 * 0.99 / r_bulk.size)


# --------------------------------------------------------------------------------------
# Degenerate chains in the scalars and the headline
# --------------------------------------------------------------------------------------


def test_constant_chain_gives_undefined_ess_and_no_effective_samples():
    rng = np.random.default_rng(14)
    stats_ = healthy_stats(rng, chains=4, draws=200)
    stats_["lp"][2] = -1234.5  # chain 2 never moves
    posterior = {"log_amplitude": rng.normal(size=(4, 200))}
    posterior["log_amplitude"][2] = 0.3
    summary = diag.build_summary(posterior=posterior, sample_stats=stats_, scalars_method="numpy")
    for name in ("lp", "log_amplitude"):
        row = summary["scalars"][name]
        assert row["ess_bulk"] is None and row["ess_tail"] is None and row["r_hat"] is None
        assert row["frozen_chains"] == [2]
    eff = summary["efficiency"]
    assert eff["gradient_evals_per_ess"] is None and "never moves" in eff["no_effective_samples"]
    assert any("undefined" in w and "chain 2 never" in w for w in summary["warnings"])
    report = diag.format_report(json.loads(json.dumps(summary)))
    assert "gradient evaluations per effective sample: no effective samples" in report
    assert report.rstrip().splitlines()[-1].startswith("Verdict: NOT healthy")


def test_single_stuck_chain_run_reports_no_effective_samples():
    """The 256³ case of the issue: one chain, acceptance 0, lp varying only by round-off."""
    rng = np.random.default_rng(15)
    stats_ = healthy_stats(rng, chains=1, draws=20)
    stats_["acceptance_rate"][:] = 0.0
    stats_["lp"] = -3.1e7 + 7.6e-9 * rng.normal(size=(1, 20))
    stats_["n_steps"][:] = 8
    summary = diag.build_summary(sample_stats=stats_, scalars_method="numpy")
    assert summary["scalars"]["lp"]["ess_bulk"] is None
    assert summary["efficiency"]["no_effective_samples"].startswith("chain 0 stuck")
    assert summary["warnings"][0].startswith("chain 0 is stuck: mean acceptance 0.000")
    # today's code reported 8.0 gradient evaluations per effective sample here
    assert summary["efficiency"]["gradient_evals_per_ess"] is None


def test_constant_in_every_draw_is_fixed_not_stuck():
    """A structurally constant quantity (e.g. the imaginary part of a real mode) is no warning."""
    rng = np.random.default_rng(16)
    posterior = {"a": rng.normal(size=(4, 300)), "mode[4,4,4].imag": np.zeros((4, 300))}
    summary = diag.build_summary(posterior=posterior, scalars_method="numpy")
    assert summary["scalars"]["mode[4,4,4].imag"]["is_constant"] is True
    assert summary["warnings"] == []
    assert "constant in every draw (not sampled, not checked): mode[4,4,4].imag" in (
        diag.format_report(summary)
    )


# --------------------------------------------------------------------------------------
# Heavy statistics
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_false_alarm_rate_over_many_converged_runs(kbins):
    """30 converged runs (iid and autocorrelated): the 1% warning fires in at most 3."""
    rng = np.random.default_rng(100)
    alarms = 0
    for i in range(30):
        out = converge(gaussian_modes(rng, (0.0, 0.5, -0.3)[i % 3]), kbins)
        alarms += bool(field_warnings(out))
    # P(Binomial(30, 0.01) >= 4) = 2e-4
    assert alarms <= 3


def _tracked(x: np.ndarray) -> dict[str, np.ndarray]:
    """``(chain, draw, 2T)`` as the posterior's tracked-mode entries."""
    return {
        f"mode[0,0,{i // 2}].{'imag' if i % 2 else 'real'}": x[..., i] for i in range(x.shape[-1])
    }


def test_tracked_modes_are_tested_jointly_not_one_by_one():
    # The quickstart's shape: 8 tracked modes (16 values), 4 chains x 600 draws, ESS ~1000.
    # The single-quantity rule alone warned on converged chains in 7-9% of runs (a CI
    # quickstart run: R-hat 1.010 on one tracked mode, "NOT healthy"); the joint test is
    # calibrated at q = 1% (measured 0.9-1.0% over 1000-1500 runs; 4.4% with the mean
    # autocorrelation time alone, without its standard error).
    rng = np.random.default_rng(11)
    runs, single, joint = 300, 0, 0
    for _ in range(runs):
        x = ar1(rng, 0.4, (4, 600, 16))
        single += bool((diag.rhat(x) > 1.01).any())
        joint += bool(diag.summary.tracked_mode_test(_tracked(x))["flagged"])
    assert single >= 0.04 * runs, single  # the problem the joint test solves
    assert joint <= 0.02 * runs, joint  # Binomial(300, 0.01) exceeds 6 w.p. 3%


def test_tracked_mode_above_threshold_warns_only_if_flagged():
    rng = np.random.default_rng(5)
    for _ in range(200):  # converged chains where one value exceeds 1.01 by chance
        x = ar1(rng, 0.4, (4, 600, 16))
        if (diag.rhat(x) > 1.01).any() and not diag.summary.tracked_mode_test(_tracked(x))[
            "flagged"
        ]:
            break
    else:
        pytest.fail("no converged run with a tracked R-hat above 1.01 in 200 seeds")
    stats_ = healthy_stats(rng, chains=4, draws=600)
    out = diag.build_summary(posterior=_tracked(x), sample_stats=stats_, scalars_method="numpy")
    assert not [w for w in out["warnings"] if w.startswith("R-hat")], out["warnings"]
    assert out["tracked_modes_test"]["flagged"] == []
    # a chain shifted by half a standard deviation in one mode is flagged and warns
    x[1, :, 3] += 0.5
    out = diag.build_summary(posterior=_tracked(x), sample_stats=stats_, scalars_method="numpy")
    assert out["tracked_modes_test"]["flagged"] == ["mode[0,0,1].imag"]
    assert any("R-hat > 1.01" in w and "mode[0,0,1].imag" in w for w in out["warnings"])
    # lp keeps the single-quantity rule
    stats_["lp"][0] += 1.0
    out = diag.build_summary(posterior=_tracked(x), sample_stats=stats_, scalars_method="numpy")
    assert any("R-hat > 1.01" in w and "lp" in w for w in out["warnings"])
