"""benchmarks/joint_inference.py on an 8³ box (tiny counts): rows, ESS over theta and delta."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.load_script import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SMALL = ["--grid", "8", "--chains", "2", "--max-depth", "4", "--burnin", "20"]
SMALL += ["--results", "20", "--burnin-mams", "40", "--results-mams", "20"]


@pytest.mark.slow
def test_rows_cover_theta_and_the_field(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # it imports microcanonical.py
    bench = load_script(BENCH / "joint_inference.py", "joint_inference")
    argv = [*SMALL, "--config", str(ROOT / "configs" / "hierarchical_64.yaml")]
    rows = bench.main([*argv, "--kinds", "fieldnuts", "mams", "--parametrisations", "conditional"])
    assert set(rows) == {
        ("conditional", "sample", "fieldnuts", 0),
        ("conditional", "sample", "mams", 0),
    }
    for r in rows.values():
        assert 0 < r["min_ess"] == min(r["hyper_min_ess"], r["field_min_ess"])
        assert r["grads_per_min_ess"] == pytest.approx(r["grads"] / r["min_ess"])
        assert np.isfinite(r["rel_var_err"])
    rows = bench.main([*argv, "--kinds", "hmc", "--no-sampled", "--fixed"])
    # one fixed row, in --fixed-parametrisation's default (conditional)
    assert list(rows) == [("conditional", "fixed", "hmc", 0)]
    assert np.isnan(rows[("conditional", "fixed", "hmc", 0)]["hyper_min_ess"])


def test_fixed_rows_fix_the_hyperparameters_that_drew_the_data(monkeypatch):
    """The fixed-hyperparameter baseline is the same data's field posterior at the P(k)
    that drew it, not at the config's fiducial P(k) (a prior draw away from it)."""
    from fieldhmc import config as cfg
    from fieldhmc import workflow

    monkeypatch.syspath_prepend(str(BENCH))
    bench = load_script(BENCH / "joint_inference.py", "joint_inference")
    path = str(ROOT / "configs" / "hierarchical_64.yaml")
    data, truth = bench.simulated_truth(path, ["grid.shape=[8,8,8]"])
    assert set(truth) == {"log_amplitude", "index"}
    fiducial = cfg.load_config(path, ["grid.shape=[8,8,8]"]).model.power
    assert abs(truth["log_amplitude"] - np.log(fiducial.amplitude)) > 0.1  # a prior draw
    config = cfg.load_config(path, ["grid.shape=[8,8,8]", *bench.fixed_overrides(truth)])
    model = workflow.build_model(config)
    assert model.hyper_names == ()
    grid = model.grid
    k = grid.kmag()
    power = np.zeros_like(k)
    pos = k > 0
    kp = config.model.power.k_pivot
    power[pos] = np.exp(truth["log_amplitude"]) * (k[pos] / kp) ** truth["index"]
    expected = power * grid.num_cells / grid.volume
    np.testing.assert_allclose(model.signal_variance_np(), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="no fixed value"):
        bench.fixed_overrides({"Omega_m": 0.3})
