"""benchmarks/joint_inference.py on an 8³ box (tiny counts): rows, ESS over theta and delta."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SMALL = ["--grid", "8", "--chains", "2", "--max-depth", "4", "--burnin", "20"]
SMALL += ["--results", "20", "--burnin-mams", "40", "--results-mams", "20"]


@pytest.mark.slow
def test_rows_cover_theta_and_the_field(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # it imports microcanonical.py
    spec = importlib.util.spec_from_file_location("joint_inference", BENCH / "joint_inference.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
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
    assert list(rows) == [("noncentred", "fixed", "hmc", 0)]
    assert np.isnan(rows[("noncentred", "fixed", "hmc", 0)]["hyper_min_ess"])
