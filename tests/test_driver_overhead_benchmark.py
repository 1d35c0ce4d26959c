"""benchmarks/driver_overhead.py runs on a tiny grid (slow: it compiles 2 kinds twice)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_driver_overhead_benchmark_runs(capsys):
    spec = importlib.util.spec_from_file_location(
        "driver_overhead", ROOT / "benchmarks" / "driver_overhead.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--grids", "8", "--kinds", "hmc", "mclmc", "--burnin", "10", "--repeats", "1"]
    out = module.main([*argv, "--scale", "0.01"])
    assert set(out) == {("hmc", 8), ("mclmc", 8)}
    for row in out.values():
        assert row["bare"] > 0 and row["driver"] > 0
        assert row["ratio"] == pytest.approx(row["driver"] / row["bare"])
    assert "driver/bare" in capsys.readouterr().out
