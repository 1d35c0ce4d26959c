"""benchmarks/driver_overhead.py runs on a tiny grid (slow: it compiles 2 kinds twice)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.load_script import load_script

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_script(ROOT / "benchmarks" / "driver_overhead.py", "driver_overhead")


@pytest.mark.slow
def test_driver_overhead_benchmark_runs(capsys):
    module = _module()
    argv = ["--grids", "8", "--kinds", "hmc", "mclmc", "--burnin", "10", "--repeats", "1"]
    out = module.main([*argv, "--scale", "0.01"])
    assert set(out) == {("hmc", 8), ("mclmc", 8)}
    for row in out.values():
        assert row["bare"] > 0 and row["driver"] > 0
        assert row["ratio"] == pytest.approx(row["driver"] / row["bare"])
    assert "driver/bare" in capsys.readouterr().out


def test_ratio_interval_covers_the_true_ratio_and_narrows():
    """The bootstrap interval of the paired ratios' median: on noisy pairs whose true ratio
    is 1.05 it contains 1.05, it narrows with more repeats, and a verdict is only given
    when the whole interval sits on one side of the target."""
    module = _module()
    rng = np.random.default_rng(1)
    widths = []
    for n in (7, 60):
        box = rng.uniform(0.8, 1.3, n)  # the box's speed, shared by a repeat's pair
        bare = box * rng.normal(1.0, 0.05, n)
        driver = 1.05 * box * rng.normal(1.0, 0.05, n)
        low, high = module.ratio_interval(driver, bare)
        assert low < 1.05 < high
        widths.append(high - low)
    assert widths[1] < 0.5 * widths[0]
    assert module.verdict(1.0, 1.09) == "shown met"
    assert module.verdict(1.11, 1.2) == "shown NOT met"
    assert module.verdict(1.05, 1.15) == "not shown either way"


def test_self_times_take_nested_events_out_of_their_parents():
    """A loop's self time is its duration less that of the operations inside it, nested
    at any depth; disjoint events of one name add up, and counts are per event."""
    module = _module()
    events = [
        ("while", 0, 100),  # holds a fusion (10), a conditional (30) with an fft (25) in it
        ("fusion", 5, 10),
        ("cond", 20, 30),
        ("fft", 22, 25),
        ("fusion", 120, 7),  # after the loop
        ("while", 130, 4),
    ]
    total, count = module.self_times(events)
    assert total == {"while": 100 - 10 - 30 + 4, "fusion": 17, "cond": 5, "fft": 25}
    assert sum(total.values()) == 100 + 7 + 4  # every picosecond once
    assert count == {"while": 2, "fusion": 2, "cond": 1, "fft": 1}
