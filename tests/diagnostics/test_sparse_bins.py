"""k-bins with few modes: counts shown, T(k) and r(k) not (the Nyquist corner alone)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fieldhmc import diagnostics as diag  # noqa: E402
from fieldhmc import plotting  # noqa: E402


@pytest.fixture
def spectra():
    """Five bins; the last holds one mode (T = 2.5 and r = -1 there, as in the issue)."""
    rng = np.random.default_rng(4)
    k = np.array([0.06, 0.12, 0.18, 0.24, 0.3])
    num_modes = np.array([6.0, 32.0, 80.0, 120.0, 1.0])
    truth = 1e3 * (k / 0.1) ** -1.5
    draws = truth * (1 + 0.1 * rng.normal(size=(2, 30, k.size)))
    draws[..., -1] *= 6.25  # T = 2.5 in the single-mode bin
    mean = 0.8 * truth
    cross = np.sqrt(mean * truth) * np.array([0.9, 0.9, 0.8, 0.7, -1.0])
    # the keywords plot_power_summary and truth_comparison share
    shared = {"power_mean": mean, "power_cross": cross, "num_modes": num_modes}
    return {"k": k, "truth": truth, "draws": draws, "num_modes": num_modes, "shared": shared}


def test_truth_comparison_marks_bins_with_few_modes(spectra):
    out = diag.truth_comparison(
        spectra["k"], spectra["truth"], power_draws=spectra["draws"], **spectra["shared"]
    )
    assert diag.MIN_MODES_PER_BIN == out["min_modes"] == 10
    np.testing.assert_array_equal(out["is_sparse"], [True, False, False, False, True])
    assert out["cross_correlation"][-1] == pytest.approx(-1.0)  # still computed, kept
    report = diag.format_report(diag.build_summary(truth=out))
    table = report[report.index("Against truth") :].splitlines()
    assert table[1].split()[:4] == ["bin", "k", "[h/Mpc]", "modes(±k)"]
    rows = {line.split()[0]: line.split() for line in table[3:8]}
    assert rows["4"][2] == "1" and set(rows["4"][3:]) == {"few"}
    assert rows["0"][2] == "6" and set(rows["0"][3:]) == {"few"}
    assert rows["2"][2] == "80" and "few" not in rows["2"]
    assert "-1.000" not in report and "2.500" not in report
    assert "few: fewer than 10 modes in the bin" in report


def test_report_without_mode_counts_is_unchanged(spectra):
    out = diag.truth_comparison(spectra["k"], spectra["truth"], power_draws=spectra["draws"])
    report = diag.format_report(diag.build_summary(truth=out))
    assert "modes" not in report[report.index("Against truth") :].splitlines()[1]


def test_power_summary_shows_counts_and_leaves_out_sparse_bins(spectra, tmp_path):
    fig = plotting.plot_power_summary(
        spectra["k"], spectra["draws"], power_truth=spectra["truth"], **spectra["shared"]
    )
    axes = [ax for ax in fig.axes if ax.axison]
    assert len(axes) == 4 and axes[-1].get_ylabel() == "modes per bin"
    counts = axes[-1].lines[0].get_ydata()
    np.testing.assert_array_equal(counts, spectra["num_modes"])
    shown = spectra["k"][1:4]
    for ax in axes[:3]:  # P, T and r: drawn on the bins with >= 10 modes only
        curves = [line for line in ax.lines if len(line.get_xdata()) > 2]
        assert curves and all(np.array_equal(c.get_xdata(), shown) for c in curves)
    marks = [line for line in axes[1].lines if line.get_linestyle() == ":"]
    assert sorted(line.get_xdata()[0] for line in marks) == [0.06, 0.3]
    r = [line for line in axes[2].lines if np.array_equal(line.get_xdata(), shown)][0]
    assert np.all(r.get_ydata() > 0)  # the r = -1 of the single mode is not drawn
    fig.savefig(tmp_path / "power.png", dpi=60)
