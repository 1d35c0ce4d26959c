"""Every plot function runs on small synthetic data and writes a readable PNG."""

import matplotlib

matplotlib.use("Agg")

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from fieldhmc import diagnostics as diag  # noqa: E402
from fieldhmc import plotting  # noqa: E402

CHAINS, DRAWS = 3, 120
GRID = (12, 12, 12)
BOX = 300.0


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


@pytest.fixture
def posterior(rng) -> dict[str, np.ndarray]:
    walk = np.cumsum(rng.normal(scale=0.2, size=(CHAINS, DRAWS)), axis=1)
    return {
        "log_amplitude": rng.normal(0.5, 0.1, size=(CHAINS, DRAWS)),
        "index": rng.normal(-1.5, 0.2, size=(CHAINS, DRAWS)) + 0.3 * walk,
        "mode[3,1,2].real": rng.normal(size=(CHAINS, DRAWS)),
    }


@pytest.fixture
def diverging() -> np.ndarray:
    div = np.zeros((CHAINS, DRAWS), dtype=bool)
    div[1, [10, 60]] = True
    return div


@pytest.fixture
def spectra(rng):
    """k in h/Mpc and power spectra in (Mpc/h)^3 of a toy power law with noise."""
    k = np.geomspace(0.03, 0.3, 10)
    p_true = 2e4 * (k / 0.1) ** -1.5
    noise = 3e3
    wiener = p_true**2 / (p_true + noise)
    draws = p_true * (1 + 0.1 * rng.normal(size=(CHAINS, DRAWS, k.size)))
    p_mean = wiener * (1 + 0.02 * rng.normal(size=k.size))
    p_cross = np.sqrt(p_mean * p_true) * np.sqrt(p_true / (p_true + noise))
    return {
        "k": k,
        "power_draws": draws,
        "power_truth": p_true * (1 + 0.05 * rng.normal(size=k.size)),
        "power_data": p_true + noise,
        "power_input": 2e4 * (np.geomspace(0.02, 0.4, 50) / 0.1) ** -1.5,
        "k_input": np.geomspace(0.02, 0.4, 50),
        "power_wiener": wiener,
        "power_mean": p_mean,
        "power_cross": p_cross,
    }


@pytest.fixture
def fields(rng):
    truth = rng.normal(size=GRID)
    mask = np.ones(GRID)
    mask[:, :4, :] = 0.0  # unobserved slab
    data = (truth + 0.5 * rng.normal(size=GRID)) * mask
    mean = 0.8 * truth * (0.5 + 0.5 * mask)
    std = 0.4 + 0.6 * (1 - mask)
    return {"truth": truth, "data": data, "mask": mask, "mean": mean, "std": std}


def save(obj: Axes | Figure, path: Path) -> Figure:
    fig = obj if isinstance(obj, Figure) else obj.figure
    fig.savefig(path, dpi=80)
    assert path.exists()
    assert path.stat().st_size > 8_000, "PNG suspiciously small"
    with path.open("rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    return fig


def labelled_axes(fig: Figure) -> list[Axes]:
    """Plot axes (not colour bars) that are switched on."""
    return [ax for ax in fig.axes if ax.axison and ax.get_label() != "<colorbar>"]


def assert_all_labelled(fig: Figure) -> None:
    axes = labelled_axes(fig)
    assert axes
    for ax in axes:
        assert ax.get_ylabel().strip(), f"axes without y label: {ax.get_title()!r}"
    assert any(ax.get_xlabel().strip() for ax in axes)
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            assert ax.get_ylabel().strip() or ax.get_xlabel().strip(), "unlabelled colour bar"


def test_trace_single_axes(tmp_path, posterior, diverging):
    ax = plotting.plot_trace(posterior["index"], diverging=diverging, label="index")
    assert isinstance(ax, Axes)
    assert ax.get_xlabel() == "iteration after warm-up"
    assert ax.get_ylabel() == "index"
    labels = ax.get_legend_handles_labels()[1]
    assert "divergent (2)" in labels and "chain 2" in labels
    save(ax, tmp_path / "trace.png")


def test_trace_and_rank_figure(tmp_path, posterior, diverging):
    fig = plotting.plot_traces(posterior, diverging=diverging)
    assert isinstance(fig, Figure)
    assert len(labelled_axes(fig)) == 2 * len(posterior)
    assert_all_labelled(fig)
    save(fig, tmp_path / "traces.png")


def test_rank_plot_on_given_axes(tmp_path, posterior):
    fig = Figure()
    ax = fig.add_subplot()
    out = plotting.plot_rank(posterior["log_amplitude"], ax, label="log_amplitude")
    assert out is ax
    assert ax.get_xlabel() and ax.get_ylabel()
    save(fig, tmp_path / "rank.png")


def test_power_spectrum(tmp_path, spectra):
    keys = ("power_truth", "power_data", "power_input", "k_input", "power_wiener")
    ax = plotting.plot_power_spectrum(
        spectra["k"], spectra["power_draws"], **{k: spectra[k] for k in keys}
    )
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "Mpc" in ax.get_xlabel() and "Mpc" in ax.get_ylabel()
    labels = ax.get_legend_handles_labels()[1]
    for label in ("posterior median", "posterior 68%", "posterior 95%", "truth", "data"):
        assert label in labels
    save(ax, tmp_path / "power.png")


def test_power_summary_with_transfer_and_correlation(tmp_path, spectra):
    fig = plotting.plot_power_summary(**spectra)
    axes = labelled_axes(fig)
    assert len(axes) == 3
    assert_all_labelled(fig)
    assert "T(k)" in axes[1].get_ylabel() and "r(k)" in axes[2].get_ylabel()
    save(fig, tmp_path / "power_summary.png")


def test_power_summary_without_truth_is_one_panel(tmp_path, spectra):
    fig = plotting.plot_power_summary(spectra["k"], spectra["power_draws"])
    assert len(labelled_axes(fig)) == 1
    save(fig, tmp_path / "power_only.png")


def test_transfer_and_correlation_single(tmp_path, spectra):
    k = spectra["k"]
    t = diag.transfer_function(spectra["power_draws"], spectra["power_truth"])
    ax = plotting.plot_transfer_function(k, t, transfer_mean_field=np.sqrt(0.5) * np.ones_like(k))
    bottom, top = ax.get_ylim()
    assert bottom == 0 and 1.0 < top <= 3.0
    save(ax, tmp_path / "transfer.png")
    r = diag.cross_correlation(
        spectra["power_cross"], spectra["power_mean"], spectra["power_truth"]
    )
    ax = plotting.plot_cross_correlation(k, r)
    assert ax.get_ylim()[1] == pytest.approx(1.05)
    save(ax, tmp_path / "corr.png")


@pytest.mark.parametrize("box_size", [None, BOX])
def test_field_slices(tmp_path, fields, box_size):
    fig = plotting.plot_field_slices(
        fields["mean"],
        fields["std"],
        truth=fields["truth"],
        data=fields["data"],
        mask=fields["mask"],
        box_size=box_size,
    )
    axes = labelled_axes(fig)
    titles = [ax.get_title() for ax in axes]
    assert titles == ["truth", "data", "posterior mean", "posterior std", "standardized residual"]
    assert_all_labelled(fig)
    if box_size is not None:
        assert "Mpc" in axes[0].get_xlabel()
    assert "masked" in axes[1].get_legend_handles_labels()[1] or axes[1].get_legend() is not None
    save(fig, tmp_path / f"slices_{box_size}.png")


def test_field_slices_mean_only(tmp_path, fields):
    fig = plotting.plot_field_slices(fields["mean"], axis=0, index=3)
    assert len(labelled_axes(fig)) == 1
    save(fig, tmp_path / "slice_mean.png")


def test_autocorrelation(tmp_path, posterior):
    ax = plotting.plot_autocorrelation(posterior, max_lag=40)
    assert ax.get_xlabel().startswith("lag") and ax.get_ylabel()
    assert len(ax.get_lines()) >= len(posterior)
    save(ax, tmp_path / "acf.png")


def test_corner(tmp_path, posterior):
    names = ["log_amplitude", "index"]
    fig = plotting.plot_corner(posterior, var_names=names, truths={"log_amplitude": 0.5})
    axes = labelled_axes(fig)
    assert len(axes) == 3  # lower triangle incl. diagonal
    assert {ax.get_xlabel() for ax in axes} >= set(names)
    save(fig, tmp_path / "corner.png")


def test_kbin_convergence_from_diagnostics_and_json(tmp_path, rng):
    nbins = 4
    n = 8
    k1 = np.fft.fftfreq(n) * n
    kz = np.arange(n // 2 + 1)
    kk = np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + kz[None, None, :] ** 2)
    kbins = np.minimum(np.floor(kk).astype(int) - 1, nbins - 1)
    kbins[0, 0, 0] = -1
    draws = rng.normal(size=(2, 30, n, n, n))
    k = 2 * np.pi / BOX * np.arange(1.5, 1.5 + nbins)
    out = diag.field_convergence(draws, kbins, nbins, k=k, include_voxels=False)
    fig = plotting.plot_kbin_convergence(out)
    assert_all_labelled(fig)
    assert "Mpc" in labelled_axes(fig)[-1].get_xlabel()
    save(fig, tmp_path / "kbins.png")
    # the same plot from the JSON form of summary["field"], with None entries
    summary = diag.build_summary(field=out)
    summary["field"]["kbins"]["ess_bulk_min"][0] = None
    fig = plotting.plot_kbin_convergence(summary["field"])
    save(fig, tmp_path / "kbins_json.png")
    # a chain shifted in every mode: the flagged bins are marked
    draws[1] += rng.normal(size=(n, n, n))
    shifted = diag.field_convergence(draws, kbins, nbins, k=k, include_voxels=False)
    assert sum(shifted["kbins"]["num_flagged"]) > 0
    labels = labelled_axes(plotting.plot_kbin_convergence(shifted))[0].get_legend_handles_labels()
    assert "bin with flagged modes" in labels[1]
    assert "bin with flagged modes" not in labelled_axes(fig)[0].get_legend_handles_labels()[1]


def test_kbin_convergence_draws_chains_that_never_moved(tmp_path):
    # every draw rejected: R-hat and ESS are NaN in every bin, and only the k axis is set
    nan = [float("nan")] * 3
    field = {
        "kbins": {
            "r_hat_median": nan,
            "r_hat_max": nan,
            "ess_bulk_min": nan,
            "ess_bulk_median": nan,
        },
        "k": [0.1, 0.2, 0.3],
        "num_chains": 2,
    }
    fig = plotting.plot_kbin_convergence(field)
    save(fig, tmp_path / "kbins_stuck.png")  # drawing raised on a log axis with no data
    assert labelled_axes(fig)[-1].get_xscale() == "log"


def test_plotting_import_does_not_choose_backend_or_import_tensorflow():
    code = (
        "import sys, matplotlib, fieldhmc.plotting\n"
        "assert 'tensorflow' not in sys.modules\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
        "assert matplotlib.rcParams._get_backend_or_none() is None\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
