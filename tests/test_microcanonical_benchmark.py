"""benchmarks/microcanonical.py: the BlackJAX peer rows and the shipped-config mode, 8³."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SMALL = ["--grid", "8", "--chains", "2", "--bias-coordinates", "8", "--max-depth", "4"]
SMALL += ["--burnin", "10", "--results", "10", "--leapfrog", "4"]
SMALL += ["--burnin-mclmc", "40", "--results-mclmc", "40", "--burnin-mams", "40"]
SMALL += ["--results-mams", "20"]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # it imports sampling.py and nuts_field.py
    spec = importlib.util.spec_from_file_location("microcanonical", BENCH / "microcanonical.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_blackjax_rows_run_on_the_masked_target(bench):
    pytest.importorskip("blackjax", reason="the peers extra is not installed")
    kinds = ["mclmc", "bj-mclmc", "mams", "bj-mams"]
    out = bench.main([*SMALL, "--masks", "slab", "--kinds", *kinds, "--speed-steps", "4"])
    rows = out["slab"]
    speed = out["speed"]["slab"]  # bare, in the driver, BlackJAX: ms per gradient
    assert set(speed) == {*kinds, "mclmc driver", "mams driver"}
    assert all(v > 0 for v in speed.values())
    assert list(rows) == kinds
    for r in rows.values():
        assert r["grads"] > 0 and r["warmup_grads"] > 0 and r["min_ess"] > 0
        assert r["ms_per_gradient"] > 0 and np.isfinite(r["rel_var_err"])
    # Both tuners were asked for the same bias; both unadjusted chains move.
    assert np.isfinite(rows["bj-mclmc"]["eevpd"]) and rows["bj-mclmc"]["eevpd"] > 0
    assert 0.0 < rows["bj-mams"]["accept"] <= 1.0


@pytest.mark.slow
def test_config_mode_includes_the_hyperparameters(bench):
    config = str(ROOT / "configs" / "hierarchical_64.yaml")
    out = bench.main([*SMALL, "--config", config, "--kinds", "mclmc", "fieldnuts"])
    rows = out["config"]
    assert list(rows) == ["fieldnuts", "mclmc"]  # fieldnuts first: the reference
    assert rows["fieldnuts"]["rel_var_err"] == pytest.approx(0.0, abs=1e-6)  # float32 draws
    for r in rows.values():
        assert 0 < r["min_ess"] <= r["hyper_min_ess"]  # the minimum covers A and n too
        assert r["grads"] > 0
