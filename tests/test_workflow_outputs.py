"""diagnose and plot on run directories that lost outputs, and on a non-cubic grid.

One small run (6x8x10 cells of 10 Mpc/h: its last k-bin is the Nyquist corner alone,
which is also a tracked mode) is shared; each test works on a copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import arviz as az
import numpy as np
import pytest

from fieldhmc import cli, workflow

ROOT = Path(__file__).resolve().parents[1]
SHRINK = [
    "grid.shape=[6,8,10]",
    "grid.box_size=[60.0,80.0,100.0]",
    "sampler.num_burnin_steps=20",
    "sampler.num_results=24",
    "sampler.chunk_size=12",
    "sampler.num_chains=2",
    "outputs.field_thin=2",
]
CORNER = "mode[3,4,5]"  # 2k = 0 mod n on every axis: real by Hermitian symmetry


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("outputs") / "run"
    argv = ["-q", "run", str(ROOT / "configs" / "quickstart.yaml"), "--out", str(out)]
    for item in SHRINK:
        argv += ["--set", item]
    assert cli.main(argv) == 0
    return out


@pytest.fixture
def run_copy(small_run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(small_run, out)
    return out


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_self_conjugate_tracked_mode_is_zero_by_symmetry(small_run):
    """The non-cubic grid's tracked Nyquist corner: its imaginary part is stored as
    exactly zero and is no sampled quantity (no row, no ESS/R-hat warning)."""
    idata = az.from_netcdf(small_run / "samples.nc")
    assert np.all(idata.posterior[f"{CORNER}.imag"].values == 0.0)
    assert np.std(idata.posterior[f"{CORNER}.real"].values) > 0
    summary = _summary(small_run)
    assert summary["zero_by_symmetry"] == [f"{CORNER}.imag"]
    assert f"{CORNER}.imag" not in summary["scalars"]
    assert f"{CORNER}.real" in summary["scalars"]
    assert not any(f"{CORNER}.imag" in w for w in summary["warnings"])
    report = (small_run / "report.txt").read_text()
    assert "zero by Hermitian symmetry" in report and f"{CORNER}.imag" in report


def test_report_shows_mode_counts_and_hides_single_mode_bins(small_run):
    summary = _summary(small_run)
    truth = summary["truth"]
    assert truth["num_modes"][-1] == 1 and truth["is_sparse"][-1] is True
    assert truth["min_modes"] == 10
    report = (small_run / "report.txt").read_text()
    table = report[report.index("Against truth") :].splitlines()
    assert "modes(±k)" in table[1].split()
    last = [line for line in table if line.startswith(str(len(truth["k"]) - 1) + " ")][0]
    cells = last.split()
    assert cells[2] == "1" and set(cells[3:]) == {"few"}  # count shown, T and r not
    assert "fewer than 10 modes" in report


def test_diagnose_without_fields_h5_keeps_the_last_full_diagnosis(run_copy, capsys):
    before = _summary(run_copy)
    assert before["field"] is not None and before["truth"]["coverage"] is not None
    field_warnings = before["warning_sections"]["field"]
    assert field_warnings  # 2 chains x 24 draws: the field's ESS is low
    (run_copy / "fields.h5").unlink()
    assert cli.main(["-q", "diagnose", str(run_copy)]) == 0
    after = _summary(run_copy)
    assert after["missing_outputs"] and "fields.h5 is missing" in after["missing_outputs"][0]
    assert after["warnings"][0] == after["missing_outputs"][0]
    # every earlier warning is still counted (marked), plus the missing file
    assert len(after["warnings"]) == len(before["warnings"]) + 1
    for w in field_warnings:
        assert any(x.startswith("(not recomputed") and x.endswith(w) for x in after["warnings"])
    assert after["healthy"] is False
    assert after["field"] == before["field"]
    assert after["truth"]["coverage"] == before["truth"]["coverage"]
    keys = {"field", "truth.coverage", "truth.cross_correlation"}
    assert set(after["carried_over"]["keys"]) == keys
    origin = after["carried_over"]["keys"]["field"]
    assert origin["diagnosed_at"] == before["metadata"]["diagnosed_at"]
    report = (run_copy / "report.txt").read_text()
    assert "INCOMPLETE RUN DIRECTORY: fields.h5 is missing" in report
    assert "NOT recomputed" in report and "Field convergence per k-bin" in report
    assert f"Verdict: NOT healthy ({len(after['warnings'])} warnings above" in report

    # diagnosed again, still without the file: the same, from the same origin
    assert cli.main(["-q", "diagnose", str(run_copy)]) == 0
    again = _summary(run_copy)
    assert again["warnings"] == after["warnings"]
    assert again["carried_over"]["keys"] == after["carried_over"]["keys"]


def test_diagnose_with_the_file_back_is_whole_again(run_copy, tmp_path):
    shutil.move(run_copy / "fields.h5", tmp_path / "fields.h5")
    workflow.diagnose(run_copy)
    shutil.move(tmp_path / "fields.h5", run_copy / "fields.h5")
    workflow.diagnose(run_copy)
    summary = _summary(run_copy)
    assert summary["carried_over"] is None and summary["missing_outputs"] == []
    assert not any(w.startswith("(not recomputed") for w in summary["warnings"])


def test_unreadable_fields_h5_and_missing_truth_are_warnings(run_copy):
    (run_copy / "fields.h5").write_bytes(b"\x89HDF\r\n")  # truncated
    (run_copy / "data" / "truth.npy").unlink()
    summary = workflow.diagnose(run_copy)
    missing = summary["missing_outputs"]
    assert len(missing) == 2
    assert missing[0].startswith("fields.h5 cannot be read")
    assert missing[1].startswith("data/truth.npy is missing")


def test_plot_sets_aside_the_plots_it_cannot_redraw(run_copy):
    plots = run_copy / "plots"
    assert (plots / "field_slices.png").exists() and (plots / "kbin_convergence.png").exists()
    (run_copy / "fields.h5").unlink()
    workflow.diagnose(run_copy)
    written = workflow.plot(run_copy)
    names = {p.name for p in plots.glob("*.png")}
    assert names == {p.name for p in written}
    assert "field_slices.png" not in names and "kbin_convergence.png" not in names
    stale = plots / "stale"
    assert (stale / "field_slices.png").exists() and (stale / "kbin_convergence.png").exists()
    readme = (stale / "README.txt").read_text()
    assert "field_slices.png: not redrawn: fields.h5 is missing" in readme
    assert "kbin_convergence.png: not redrawn: summary.json could not recompute" in readme
