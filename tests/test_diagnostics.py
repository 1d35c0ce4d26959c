"""Tests for fieldhmc.diagnostics on synthetic chains with known properties."""

import json
import math
import os
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
import pytest
from scipy import signal

from fieldhmc import diagnostics as diag

# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def ar1(rng: np.random.Generator, rho: float, shape: tuple[int, ...]) -> np.ndarray:
    """Stationary unit-variance AR(1) chains along axis 1 of ``shape`` (chain, draw, ...)."""
    noise = rng.normal(size=shape)
    start = rng.normal(size=(shape[0], 1) + shape[2:])
    zi = rho * start
    out, _ = signal.lfilter([math.sqrt(1.0 - rho**2)], [1.0, -rho], noise, axis=1, zi=zi)
    return out


def kbin_grid(grid_shape: tuple[int, int, int], nbins: int) -> np.ndarray:
    """Integer |k| bins (in units of the fundamental) of the half-spectrum; k = 0 excluded."""
    n0, n1, n2 = grid_shape
    k0 = np.fft.fftfreq(n0) * n0
    k1 = np.fft.fftfreq(n1) * n1
    k2 = np.arange(n2 // 2 + 1)
    kk = np.sqrt(k0[:, None, None] ** 2 + k1[None, :, None] ** 2 + k2[None, None, :] ** 2)
    bins = np.minimum(np.floor(kk).astype(int) - 1, nbins - 1)
    bins[0, 0, 0] = -1
    return bins


def healthy_stats(rng: np.random.Generator, chains: int = 4, draws: int = 200) -> dict:
    return {
        "lp": rng.normal(size=(chains, draws)),
        "acceptance_rate": rng.uniform(0.7, 0.9, size=(chains, draws)),
        "diverging": np.zeros((chains, draws), dtype=bool),
        "energy": rng.normal(size=(chains, draws)),
        "step_size": np.full((chains, draws), 0.05),
        "n_steps": np.full((chains, draws), 10),
        "tree_depth": np.full((chains, draws), 3),
    }


def pathological_chains(rng: np.random.Generator, chains: int, draws: int) -> np.ndarray:
    """Columns with assorted pathologies: AR(1) of many rho, shifted chains, ties, constant."""
    rhos = np.linspace(-0.8, 0.95, 12)
    x = np.stack([ar1(rng, r, (chains, draws)) for r in rhos], axis=-1)
    x[:, :, 0] += np.arange(chains)[:, None] * 2.0  # chains disagree
    x[:, :, 1] = np.round(x[:, :, 1])  # heavy ties
    x[:, :, 2] = 3.0  # constant
    x[:, :, 3] = np.exp(2.0 * x[:, :, 3])  # skewed
    return x


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240611)


# --------------------------------------------------------------------------------------
# Vectorised estimators equal ArviZ
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("chains", "draws"), [(4, 200), (3, 101), (2, 9), (1, 60)])
def test_vectorised_estimators_match_arviz(rng, chains, draws):
    az = pytest.importorskip("arviz")
    x = pathological_chains(rng, chains, draws)
    ds = az.convert_to_dataset({"x": x})
    with np.errstate(all="ignore"):
        pairs = {
            "rhat": (diag.rhat(x), az.rhat(ds)["x"].values),
            "ess_bulk": (diag.ess_bulk(x), az.ess(ds, method="bulk")["x"].values),
            "ess_tail": (diag.ess_tail(x), az.ess(ds, method="tail")["x"].values),
            "mcse_mean": (diag.mcse_mean(x), az.mcse(ds, method="mean")["x"].values),
            "mcse_sd": (diag.mcse_sd(x), az.mcse(ds, method="sd")["x"].values),
        }
    # A column with a chain that never moves (the constant column 2) is undefined here;
    # ArviZ counts a constant quantity as chain * draw effective samples.
    degenerate = diag.frozen_chains(x).any(axis=0)
    assert degenerate.tolist() == [i == 2 for i in range(x.shape[-1])]
    for name, (mine, ref) in pairs.items():
        np.testing.assert_allclose(
            mine[~degenerate], ref[~degenerate], rtol=1e-6, atol=0, equal_nan=True, err_msg=name
        )
        assert np.isnan(mine[degenerate]).all(), name


def test_field_mode_diagnostics_match_arviz_on_subset(rng):
    az = pytest.importorskip("arviz")
    grid = (6, 6, 6)
    fields = ar1(rng, 0.6, (3, 40) + grid)
    out = diag.field_convergence(fields, kbin_grid(grid, 4), 4, num_worst=5)
    modes = np.fft.rfftn(fields, axes=(-3, -2, -1))
    for entry in out["worst_r_hat"] + out["worst_ess_bulk"]:
        i, j, l = entry["index"]
        values = getattr(modes[:, :, i, j, l], entry["part"])
        ds = az.convert_to_dataset({"m": values})
        assert entry["r_hat"] == pytest.approx(float(az.rhat(ds)["m"]), rel=1e-6)
        assert entry["ess_bulk"] == pytest.approx(float(az.ess(ds)["m"]), rel=1e-6)


def test_chunking_does_not_change_results(rng):
    x = rng.normal(size=(2, 50, 37))
    np.testing.assert_allclose(diag.rhat(x, chunk_size=5), diag.rhat(x))
    np.testing.assert_allclose(diag.ess_bulk(x, chunk_size=1), diag.ess_bulk(x))


def test_trailing_shape_and_scalar_output(rng):
    x = rng.normal(size=(4, 30, 2, 3))
    assert diag.rhat(x).shape == (2, 3)
    assert diag.ess_tail(x).shape == (2, 3)
    assert diag.ess_bulk(x[..., 0, 0]).shape == ()
    with pytest.raises(ValueError, match="chain, draw"):
        diag.rhat(np.zeros(10))


# --------------------------------------------------------------------------------------
# Known properties
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_iid_normal_rhat_one_and_ess_near_n(rng, dtype):
    chains, draws, columns = 4, 500, 100
    x = rng.normal(size=(chains, draws, columns)).astype(dtype)
    n = chains * draws
    r = diag.rhat(x)
    assert np.all(np.abs(r - 1.0) < 0.01)
    ratio = diag.ess_bulk(x) / n
    # ESS/n of i.i.d. draws scatters by ~0.04 per column; test the mean with its MCSE.
    assert abs(ratio.mean() - 1.0) < 5 * ratio.std() / math.sqrt(columns) + 0.02
    tail = diag.ess_tail(x) / n
    assert abs(tail.mean() - 1.0) < 0.1
    # MCSE of the mean ~ sd / sqrt(n)
    np.testing.assert_allclose(diag.mcse_mean(x).mean(), 1 / math.sqrt(n), rtol=0.05)


@pytest.mark.parametrize("rho", [0.5, 0.9, -0.3])
def test_ar1_ess_matches_analytic(rng, rho):
    chains, draws, columns = 4, 1000, 40
    x = ar1(rng, rho, (chains, draws, columns))
    expected = chains * draws * (1 - rho) / (1 + rho)
    ess = diag.ess_bulk(x)
    scatter = ess.std() / math.sqrt(columns)
    # the estimator is slightly biased upward for strong correlation: allow 5%
    assert abs(ess.mean() - expected) < 5 * scatter + 0.05 * expected


def test_stuck_chain_is_flagged(rng):
    x = rng.normal(size=(4, 300))
    stuck = x.copy()
    stuck[2] = 0.7  # one chain never moves
    shifted = x.copy()
    shifted[1] += 1.5  # one chain explores a different mode
    assert diag.rhat(x) < 1.01
    assert np.isnan(diag.rhat(stuck)) and np.isnan(diag.ess_bulk(stuck))  # never moves
    assert diag.rhat(shifted) > 1.1
    summary = diag.build_summary(posterior={"good": x, "shifted": shifted}, scalars_method="numpy")
    assert any("R-hat > 1.01" in w and "shifted" in w for w in summary["warnings"])
    assert summary["scalars"]["shifted"]["r_hat"] > 1.1


def test_tail_rhat_catches_scale_difference(rng):
    # same location, different scale: the bulk R-hat misses it, the folded one does not
    x = rng.normal(size=(4, 1000))
    x[0] *= 3.0
    assert diag.rhat(x) > 1.05


def test_autocorrelation_of_ar1(rng):
    x = ar1(rng, 0.7, (2, 4000))
    acf = diag.autocorrelation(x, max_lag=3)
    assert acf.shape == (2, 4)
    np.testing.assert_allclose(acf[:, 0], 1.0)
    np.testing.assert_allclose(acf.mean(0), 0.7 ** np.arange(4), atol=0.05)


# --------------------------------------------------------------------------------------
# Scalars
# --------------------------------------------------------------------------------------


def test_summarize_scalars_arviz_and_numpy_agree(rng):
    posterior = {
        "log_amplitude": ar1(rng, 0.3, (4, 100)),
        "mode[3,1,2].real": rng.normal(size=(4, 100)),
    }
    a = diag.summarize_scalars(posterior, method="arviz")
    b = diag.summarize_scalars(posterior, method="numpy")
    for name in posterior:
        for key in ("mean", "sd", "mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "r_hat"):
            assert a[name][key] == pytest.approx(b[name][key], rel=1e-6), (name, key)
    assert a["log_amplitude"]["q5"] < a["log_amplitude"]["median"] < a["log_amplitude"]["q95"]


def test_summarize_scalars_rejects_bad_shapes():
    with pytest.raises(ValueError, match="chain, draw"):
        diag.summarize_scalars({"x": np.zeros(10)})
    with pytest.raises(ValueError, match="method"):
        diag.summarize_scalars({"x": np.zeros((2, 10))}, method="tfp")


# --------------------------------------------------------------------------------------
# Sampler health
# --------------------------------------------------------------------------------------


def test_divergences_counted_with_iterations(rng):
    stats = healthy_stats(rng)
    stats["diverging"][2, [3, 40, 199]] = True
    stats["diverging"][0, 7] = True
    health = diag.sampler_health(stats, target_accept_prob=0.8)
    div = health["divergences"]
    assert div["total"] == 4
    assert div["per_chain"] == [1, 0, 3, 0]
    assert div["iterations"] == [[7], [], [3, 40, 199], []]
    assert (
        "3 divergent transitions after warm-up in chain 2 — consider target_accept_prob 0.9"
        in " ".join(health["warnings"])
    )
    assert any(
        w.startswith("1 divergent transition after warm-up in chain 0") for w in health["warnings"]
    )


def test_ebfmi_of_known_energy_series(rng):
    draws = 100
    alternating = np.tile([0.0, 1.0], draws // 2)
    # diffs^2 = 1 everywhere; var(ddof=1) = 0.25 n / (n - 1)
    random_walk = np.cumsum(rng.normal(size=draws))
    stats = healthy_stats(rng, chains=2, draws=draws)
    stats["energy"] = np.stack([alternating, random_walk])
    health = diag.sampler_health(stats, target_accept_prob=0.8)
    assert health["ebfmi"][0] == pytest.approx(4.0 * (draws - 1) / draws)
    assert health["ebfmi"][1] < 0.3
    assert any("E-BFMI below 0.3" in w and "chain 1" in w for w in health["warnings"])
    assert not any("chain 0" in w for w in health["warnings"] if "E-BFMI" in w)
    az = pytest.importorskip("arviz")
    np.testing.assert_allclose(health["ebfmi"], az.bfmi(stats["energy"]))


def test_iid_energy_gives_ebfmi_near_two(rng):
    stats = healthy_stats(rng, chains=1, draws=20000)
    health = diag.sampler_health(stats, target_accept_prob=0.8)
    assert health["ebfmi"][0] == pytest.approx(2.0, abs=0.1)


def test_tree_depth_acceptance_and_step_size_checks(rng):
    stats = healthy_stats(rng, chains=2, draws=50)
    stats["tree_depth"][1, :10] = 6
    stats["acceptance_rate"][0] = 0.4
    stats["step_size"][1, 25:] = 0.07
    health = diag.sampler_health(stats, target_accept_prob=0.8, max_tree_depth=6)
    assert health["tree_depth"]["num_saturated_per_chain"] == [0, 10]
    assert health["tree_depth"]["fraction_saturated"] == pytest.approx(0.1)
    text = " ".join(health["warnings"])
    assert "max_tree_depth 6" in text and "10 (20.0%) in chain 1" in text
    assert "mean acceptance 0.40 in chain 0 is well below target_accept_prob 0.80" in text
    assert "step size changes after warm-up" in text
    assert health["step_size"]["is_constant"] is False
    assert health["gradient_evals"]["total"] == 2 * 50 * 10


def test_failed_mclmc_step_tuning_is_reported(rng):
    """Var[dE]/d far above the tolerance (the hierarchical config under the prior metric:
    1.1e3 against 5e-4) is a FAILED tuner in the warnings and NOT met in the report's
    tuning line; within 2x it is neither."""
    dim, tolerance = 512, 5e-4
    posterior = {"a": rng.normal(size=(2, 200))}
    meta = {"sampler": "mclmc", "adjusted": False, "bias_tolerance": tolerance}
    for scale, failed in ((np.sqrt(1.1e3 * dim), True), (np.sqrt(tolerance * dim), False)):
        stats = {"energy_error": scale * rng.normal(size=(2, 200))}
        summary = diag.build_summary(
            posterior=posterior,
            sample_stats=stats,
            dimension=dim,
            desired_energy_var=tolerance,
            scalars_method="numpy",
            metadata=meta,
        )
        report = diag.format_report(summary)
        assert any("tuner FAILED" in w for w in summary["warnings"]) is failed
        assert ("NOT met" in report) is failed
        assert ("within 2x of it" in report) is not failed
        assert ("Verdict: NOT healthy" in report) is failed


def test_healthy_run_has_no_sampler_warnings(rng):
    health = diag.sampler_health(healthy_stats(rng), target_accept_prob=0.8, max_tree_depth=10)
    assert health["warnings"] == []
    assert health["divergences"]["total"] == 0


# --------------------------------------------------------------------------------------
# Fields
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("grid", [(6, 6, 6), (5, 6, 7), (4, 5, 8)])
def test_mode_convergence_counts_each_real_dof_once(rng, grid):
    nbins = 3
    fields = rng.normal(size=(2, 20) + grid)
    kbins = kbin_grid(grid, nbins)
    out = diag.field_convergence(fields, kbins, nbins, include_voxels=False)
    # a real field of N cells has N real degrees of freedom; k = 0 is excluded
    assert out["overall"]["num_values"] == int(np.prod(grid)) - 1
    assert out["kbins"]["num_values"].sum() == int(np.prod(grid)) - 1
    assert np.all(np.isfinite(out["kbins"]["r_hat_median"]))


def test_stuck_mode_found_among_worst(rng):
    grid = (8, 8, 8)
    nbins = 4
    fields = rng.normal(size=(4, 60) + grid)
    modes = np.fft.rfftn(fields, axes=(-3, -2, -1))
    modes[1, :, 2, 3, 1] += 40.0  # chain 1 sits elsewhere in one mode (real part)
    fields = np.fft.irfftn(modes, s=grid, axes=(-3, -2, -1))
    kbins = kbin_grid(grid, nbins)
    out = diag.field_convergence(fields, kbins, nbins, k=[0.1, 0.2, 0.3, 0.4])
    worst = out["worst_r_hat"][0]
    assert worst["name"] == "mode[2,3,1].real"
    assert worst["kbin"] == kbins[2, 3, 1]
    assert worst["r_hat"] > 1.2
    assert out["kbins"]["r_hat_max"][worst["kbin"]] == pytest.approx(worst["r_hat"])
    assert out["voxels"]["num_values"] == 512
    summary = diag.build_summary(field=out)
    assert any("mode[2,3,1].real" in w for w in summary["warnings"])


def test_field_convergence_accepts_float32(rng):
    grid = (4, 4, 6)
    fields = rng.normal(size=(2, 40) + grid)
    kbins = kbin_grid(grid, 2)
    a = diag.field_convergence(fields, kbins, 2)
    b = diag.field_convergence(fields.astype(np.float32), kbins, 2)
    # Rank statistics agree up to how rounding breaks the near-tie of the two values
    # closest to the median in the folded (tail) R-hat.
    np.testing.assert_allclose(b["kbins"]["r_hat_median"], a["kbins"]["r_hat_median"], rtol=0.02)
    np.testing.assert_allclose(b["kbins"]["ess_bulk_min"], a["kbins"]["ess_bulk_min"], rtol=1e-3)
    assert b["voxels"]["r_hat_max"] == pytest.approx(a["voxels"]["r_hat_max"], rel=0.02)


def test_field_convergence_memory_stays_near_one_copy_of_float32_draws(rng):
    # The modes are computed in single precision: NumPy's rfftn (float64 input copy,
    # complex128 modes) peaked at 6.8x the draws' bytes here; scipy's keeps ~1.6x.
    grid = (16, 16, 16)
    fields = rng.normal(size=(4, 20) + grid).astype(np.float32)
    kbins = kbin_grid(grid, 2)
    tracemalloc.start()
    try:
        diag.field_convergence(fields, kbins, 2, chunk_size=64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * fields.nbytes


def test_stuck_voxel_found(rng):
    grid = (4, 4, 4)
    fields = rng.normal(size=(3, 40) + grid)
    fields[0, :, 1, 2, 3] = 5.0
    out = diag.field_convergence(fields, kbin_grid(grid, 2), 2, num_worst=3)
    assert out["voxels"]["worst_r_hat"][0]["index"] == [1, 2, 3]


def test_threaded_chunks_give_the_serial_results_bit_for_bit(rng, monkeypatch):
    """Chunks are computed in threads but handed back in order: every statistic, the
    k-bin sums accumulated from them included, is the serial one exactly."""
    from fieldhmc.diagnostics import convergence, modes

    grid = (8, 8, 8)
    fields = rng.normal(size=(3, 24) + grid).astype(np.float32)
    fields[1] += 1.0 * rng.normal(size=grid).astype(np.float32)  # something to flag
    kbins = kbin_grid(grid, 3)
    threads = set()
    map_in_order = convergence._map_in_order

    def watched(fn, items, workers=None):
        for out in map_in_order(fn, items, workers):
            threads.update(t.name for t in threading.enumerate())
            yield out

    monkeypatch.setattr(convergence, "_WORKERS", 1)
    serial = diag.field_convergence(fields, kbins, 3, chunk_size=16)
    monkeypatch.setattr(convergence, "_WORKERS", 2)
    monkeypatch.setattr(convergence, "_map_in_order", watched)
    monkeypatch.setattr(modes, "_map_in_order", watched)
    threaded = diag.field_convergence(fields, kbins, 3, chunk_size=16)
    assert any(name.startswith("fieldhmc-diagnostics") for name in threads)
    assert serial["overall"]["num_flagged"] > 0
    np.testing.assert_equal(threaded, serial)


def test_field_convergence_validates_shapes(rng):
    with pytest.raises(ValueError, match="kbin_index"):
        diag.field_convergence(rng.normal(size=(2, 8, 4, 4, 4)), np.zeros((4, 4, 4), int), 2)


# --------------------------------------------------------------------------------------
# Against truth
# --------------------------------------------------------------------------------------


@pytest.fixture
def truth_field(rng):
    grid = (8, 8, 8)
    return rng.normal(size=grid), kbin_grid(grid, 5), 5


def test_transfer_and_correlation_equal_one_for_exact_mean(truth_field):
    truth, kbins, nbins = truth_field
    p = diag.cross_power(truth, kbins, nbins, box_size=100.0)
    px = diag.cross_power(truth, kbins, nbins, field_b=truth, box_size=100.0)
    np.testing.assert_allclose(diag.transfer_function(p, p), 1.0)
    np.testing.assert_allclose(diag.cross_correlation(px, p, p), 1.0)


def test_known_linear_filter(truth_field):
    truth, kbins, nbins = truth_field
    gain = np.array([0.9, 0.5, -0.3, 0.2, 1.4])
    modes = np.fft.rfftn(truth)
    filtered = np.fft.irfftn(
        modes * np.where(kbins >= 0, gain[kbins], 0.0), s=truth.shape, axes=(0, 1, 2)
    )
    pt = diag.cross_power(truth, kbins, nbins)
    pf = diag.cross_power(filtered, kbins, nbins)
    px = diag.cross_power(filtered, kbins, nbins, field_b=truth)
    np.testing.assert_allclose(diag.transfer_function(pf, pt), np.abs(gain), rtol=1e-10)
    np.testing.assert_allclose(diag.cross_correlation(px, pf, pt), np.sign(gain), rtol=1e-10)


def test_partially_correlated_field_has_known_r(rng, truth_field):
    truth, kbins, nbins = truth_field
    theta = np.array([0.1, 0.5, 0.9, 1.2, 1.5])
    ft = np.fft.rfftn(truth)
    fn = np.fft.rfftn(rng.normal(size=truth.shape))
    w = np.full(kbins.shape, 2.0)
    w[..., 0] = 1.0
    w[..., -1] = 1.0  # n2 = 8 is even: Nyquist plane self-conjugate
    ok = kbins >= 0

    def bin_dot(a, b):
        return np.bincount(kbins[ok], weights=(w * (a * b.conj()).real)[ok], minlength=nbins)

    # Gram-Schmidt per bin: noise orthogonal to truth with the same power
    fn = fn - np.where(ok, (bin_dot(fn, ft) / bin_dot(ft, ft))[kbins], 0) * ft
    fn = fn * np.where(ok, np.sqrt(bin_dot(ft, ft) / bin_dot(fn, fn))[kbins], 0)
    mixed = np.where(ok, np.cos(theta)[kbins], 0) * ft + np.where(ok, np.sin(theta)[kbins], 0) * fn
    mean = np.fft.irfftn(mixed, s=truth.shape, axes=(0, 1, 2))
    pt = diag.cross_power(truth, kbins, nbins)
    pm = diag.cross_power(mean, kbins, nbins)
    px = diag.cross_power(mean, kbins, nbins, field_b=truth)
    np.testing.assert_allclose(diag.transfer_function(pm, pt), 1.0, rtol=1e-8)
    np.testing.assert_allclose(diag.cross_correlation(px, pm, pt), np.cos(theta), atol=1e-8)


@pytest.mark.parametrize("grid", [(6, 6, 6), (5, 4, 7)])
def test_cross_power_parseval_and_units(rng, grid):
    box = (200.0, 150.0, 100.0)
    field = rng.normal(size=grid)
    kbins = np.zeros((grid[0], grid[1], grid[2] // 2 + 1), dtype=int)
    kbins[0, 0, 0] = -1
    p = diag.cross_power(field, kbins, 1, box_size=box)
    # one bin with every k != 0: Hermitian weights make it the full-spectrum mean, so by
    # Parseval P = V / N^2 * (N sum x^2 - (sum x)^2) / (N - 1)
    n = field.size
    expected = np.prod(box) / n**2 * (n * np.sum(field**2) - field.sum() ** 2) / (n - 1)
    assert p[0] == pytest.approx(expected, rel=1e-12)


def test_coverage_of_calibrated_posterior(rng):
    shape = (40, 50)
    truth = rng.normal(size=shape)
    draws = rng.normal(size=(2, 200) + shape)  # posterior = prior, truth drawn from it
    out = diag.coverage(draws, truth, probs=(0.68, 0.95))
    n = truth.size
    for p, c in zip(out["probs"], out["coverage"], strict=True):
        assert abs(c - p) < 4 * math.sqrt(p * (1 - p) / n) + 0.01
    # overconfident posterior under-covers
    narrow = diag.coverage(0.3 * draws, truth, probs=(0.68,))
    assert narrow["coverage"][0] < 0.4
    labels = (np.arange(shape[0])[:, None] >= 20).astype(int) * np.ones(shape, int)
    per = diag.coverage(draws, truth, probs=(0.68,), labels=labels)
    assert per["per_label"].shape == (2, 1)
    assert per["per_label_count"].tolist() == [1000, 1000]


def test_coverage_works_in_chunks_without_copying_the_draws(rng):
    grid = (16, 16, 16)
    stored = rng.normal(size=(20, 4) + grid).astype(np.float32)  # as on disk: draw, chain
    draws = np.swapaxes(stored, 0, 1)
    truth = rng.normal(size=grid)
    whole = diag.coverage(draws.astype(float), truth)
    tracemalloc.start()
    try:
        chunked = diag.coverage(draws, truth, chunk_size=64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(chunked["coverage"], whole["coverage"])
    # A float64 copy of all draws alone would be 2x their bytes.
    assert peak < 0.5 * stored.nbytes


def test_coverage_from_intervals():
    truth = np.array([0.0, 1.0, 2.0, 3.0])
    intervals = {0.9: (np.full(4, 0.5), np.full(4, 2.5))}
    out = diag.coverage(intervals, truth)
    assert out["probs"] == [0.9]
    assert out["coverage"][0] == pytest.approx(0.5)


def test_wiener_zscores(rng):
    m, draws = 2000, 400
    ref_mean = rng.normal(size=m)
    ref_var = rng.uniform(0.5, 2.0, size=m)
    samples = ref_mean + np.sqrt(ref_var) * rng.normal(size=(draws, m))
    out = diag.wiener_zscores(samples.mean(0), samples.var(0, ddof=1), draws, ref_mean, ref_var)
    assert out["summary"]["mean"]["rms"] == pytest.approx(1.0, abs=0.1)
    assert out["summary"]["var"]["rms"] == pytest.approx(1.0, abs=0.1)
    biased = diag.wiener_zscores(
        samples.mean(0) + 0.2, 0.5 * samples.var(0, ddof=1), draws, ref_mean, ref_var
    )
    assert biased["summary"]["mean"]["rms"] > 2
    summary = diag.build_summary(wiener=biased)
    assert sum("Wiener" in w for w in summary["warnings"]) == 2
    assert "z_mean" not in summary["wiener"]


@pytest.mark.parametrize("rho", [0.0, 0.9, -0.5])
@pytest.mark.parametrize("scale", [1.0, 1.02])
def test_variance_bias_removes_the_noise_of_autocorrelated_chains(rng, rho, scale):
    """b^2 of stationary AR(1) chains (slow, fast and antithetic) whose sd is ``scale``
    times the reference's: z-tested against the exact 0.5 (scale^2 - 1)^2. The noise of
    rho = 0.9 (ESS per draw 0.05) is ~10x b^2 at scale 1.02, so an iid correction fails."""
    shape = (4, 1000, 1500)
    ref_mean = rng.normal(size=shape[2:])
    ref_var = rng.uniform(0.5, 2.0, size=shape[2:])
    draws = ref_mean + scale * np.sqrt(ref_var) * ar1(rng, rho, shape)
    out = diag.variance_bias(draws, ref_mean, ref_var)
    exact = 0.5 * (scale**2 - 1.0) ** 2
    assert abs(out["b2"] - exact) < 4 * out["se"], (out, exact)
    assert out["rel"] == pytest.approx(scale**2 - 1.0, abs=0.02 if rho == 0.9 else 0.006)
    if scale > 1:
        assert out["b2"] - 4 * out["se"] > 0.3 * exact, out  # resolved, not noise


def test_variance_bias_needs_two_chains(rng):
    with pytest.raises(ValueError, match="chain >= 2"):
        diag.variance_bias(rng.normal(size=(1, 100, 5)), 0.0, 1.0)


def test_truth_comparison_of_exact_posterior(rng, truth_field):
    truth, kbins, nbins = truth_field
    draws = rng.normal(size=(2, 30) + truth.shape)
    k = np.linspace(0.05, 0.45, nbins)
    out = diag.truth_comparison(
        k,
        diag.cross_power(truth, kbins, nbins),
        power_draws=diag.cross_power(draws, kbins, nbins),
        power_mean=diag.cross_power(truth, kbins, nbins),
        power_cross=diag.cross_power(truth, kbins, nbins, field_b=truth),
    )
    assert np.all(out["transfer_lo"] < out["transfer_median"])
    assert np.all(out["transfer_median"] < out["transfer_hi"])
    np.testing.assert_allclose(out["cross_correlation"], 1.0)
    np.testing.assert_allclose(out["transfer_mean_field"], 1.0)


# --------------------------------------------------------------------------------------
# Summary and report
# --------------------------------------------------------------------------------------


def test_build_summary_is_json_and_report_is_readable(rng, truth_field):
    truth, kbins, nbins = truth_field
    stats = healthy_stats(rng, chains=4, draws=120)
    stats["diverging"][2, [5, 6, 90]] = True
    posterior = {"log_amplitude": rng.normal(size=(4, 120)), "index": ar1(rng, 0.3, (4, 120))}
    fields = rng.normal(size=(4, 20) + truth.shape)
    field = diag.field_convergence(fields, kbins, nbins, k=np.linspace(0.05, 0.45, nbins))
    k = np.linspace(0.05, 0.45, nbins)
    truth_out = diag.truth_comparison(
        k,
        diag.cross_power(truth, kbins, nbins),
        power_draws=diag.cross_power(fields, kbins, nbins),
        coverage_result=diag.coverage(fields, truth),
    )
    summary = diag.build_summary(
        posterior=posterior,
        sample_stats=stats,
        target_accept_prob=0.8,
        max_tree_depth=10,
        field=field,
        truth=truth_out,
        metadata={"config": "quickstart"},
    )
    text = json.dumps(summary, allow_nan=False)
    assert json.loads(text) == summary
    assert set(summary["scalars"]) == {"log_amplitude", "index", "lp"}
    eff = summary["efficiency"]
    assert eff["total_gradient_evals"] == 4 * 120 * 10
    assert eff["gradient_evals_per_ess"] == pytest.approx(4800 / eff["min_ess"])
    assert summary["warnings"][0].startswith("3 divergent transitions after warm-up in chain 2")

    report = diag.format_report(summary)
    assert "ess_bulk" in report and "r_hat" in report and "E-BFMI" in report
    assert "log_amplitude" in report and "k [h/Mpc]" in report
    assert "Warnings (" in report
    assert (
        "3 divergent transitions after warm-up in chain 2 — consider target_accept_prob 0.9"
        in report
    )
    # the report also works on the JSON round trip
    assert diag.format_report(json.loads(text)) == report
    # table columns are aligned: every row of the scalar table has the same width
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Scalars")) + 1
    header, rule = lines[start], lines[start + 1]
    assert len(rule) == len(header)


def test_nan_becomes_null_and_clean_run_reports_no_warnings(rng):
    posterior = {"a": rng.normal(size=(1, 2000))}  # one chain: R-hat undefined
    summary = diag.build_summary(posterior=posterior, scalars_method="numpy")
    assert summary["scalars"]["a"]["r_hat"] is None
    json.dumps(summary, allow_nan=False)
    assert summary["warnings"] == [] and summary["healthy"] is True
    report = diag.format_report(summary)
    assert "No warnings." in report
    assert report.rstrip().splitlines()[-1] == "Verdict: healthy (no warnings)"


def test_to_jsonable_types():
    data = {1: np.array([1.0, np.nan, np.inf]), "b": (np.int64(3), np.bool_(True)), "c": None}
    assert diag.to_jsonable(data) == {"1": [1.0, None, None], "b": [3, True], "c": None}
    with pytest.raises(TypeError):
        diag.to_jsonable({"x": object()})


def test_import_is_light():
    """diagnostics imports neither TensorFlow nor matplotlib (ArviZ is lazy)."""
    code = (
        "import sys, fieldhmc.diagnostics\n"
        "bad = [m for m in ('tensorflow', 'matplotlib', 'arviz') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
