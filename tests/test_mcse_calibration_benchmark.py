"""benchmarks/mcse_calibration.py: its estimators on chains of known autocorrelation, and
(slow) the replicated MCLMC runs it is for."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import signal

from tests.load_script import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_script(ROOT / "benchmarks" / "mcse_calibration.py", "mcse_calibration")


def test_every_estimator_is_calibrated_on_ar1_chains(bench):
    """Stationary AR(1) chains (rho 0.5: reversible, no oscillation), 16 groups of 4:
    every estimator's empirical / predicted variance is 1 within its noise (~0.03), and
    the true ESS is the AR(1)'s (1 - rho) / (1 + rho) per draw for the mean. Except the
    rank-normalised bulk ESS of the squares, which reads high (1.15 at this seed): it is
    the ESS of the squares' ranks, not of their mean (ArviZ uses the non-ranked ESS for
    a mean's MCSE), which is why :func:`fieldhmc.diagnostics.variance_bias` takes none."""
    rng = np.random.default_rng(0)
    rho, shape = 0.5, (64, 500, 256)
    noise = rng.normal(size=shape)
    zi = rho * rng.normal(size=(shape[0], 1, shape[2]))
    z, _ = signal.lfilter([math.sqrt(1 - rho**2)], [1.0, -rho], noise, axis=1, zi=zi)
    out = bench.calibrate(z, 4)
    for name in ("x", "sq"):
        for estimator in bench.ESTIMATORS:
            if (name, estimator) != ("sq", "bulk"):
                assert out[name][estimator] == pytest.approx(1.0, abs=0.12), (name, out[name])
    assert out["sq"]["bulk"] > 1.05, out["sq"]
    assert out["x"]["emp_ess"] == pytest.approx(2000 / 3, rel=0.12), out["x"]


@pytest.mark.slow
def test_the_chains_spread_is_calibrated_on_mclmc(bench, capsys):
    """MCLMC at the moment L and 4x it (the default run, ~80 s): the chains' spread,
    variance_bias' noise term, predicts the variance over the replicated groups of both
    the means and the squares; and the replication sees an estimator's error: at 4x the
    L the means' Geyer ESS reads low (their autocorrelation oscillates)."""
    out = bench.main([])
    for length, res in out.items():
        for name in ("x", "sq"):
            assert res[name]["chains"] == pytest.approx(1.0, abs=0.1), (length, name, res)
    assert out[3.88]["x"]["bulk"] < 0.5, out[3.88]
    assert "empirical / predicted" in capsys.readouterr().out
