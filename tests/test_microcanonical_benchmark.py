"""benchmarks/microcanonical.py: the BlackJAX peer rows (several seeds, seconds per ESS,
ours / peer ratios), the chunk clock and the shipped-config mode, 8³."""

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
    kinds = ["mclmc", "bj-mclmc", "mams", "bj-mams", "fieldnuts", "bj-nuts"]
    seeds = [1, 2]
    argv = [*SMALL, "--masks", "slab", "--kinds", *kinds, "--speed-steps", "4"]
    out = bench.main([*argv, "--seeds", *map(str, seeds)])
    rows = out["slab"]
    speed = out["speed"]["slab"]  # bare, in the driver, BlackJAX: ms per gradient
    assert set(speed) == {"mclmc", "bj-mclmc", "mams", "bj-mams", "mclmc driver", "mams driver"}
    assert all(v > 0 for v in speed.values())
    assert list(rows) == kinds
    for runs in rows.values():
        assert [r["seed"] for r in runs] == seeds
        for r in runs:
            assert r["grads"] > 0 and r["warmup_grads"] > 0 and r["min_ess"] > 0
            assert r["ms_per_gradient"] > 0 and np.isfinite(r["rel_var_err"])
            assert r["warmup_seconds"] > 0 and r["sampling_seconds"] > 0
            assert r["median_ess"] >= r["min_ess"]
            for ess in ("min", "median"):
                alone, with_warmup = r[f"s_per_{ess}_ess"], r[f"s_per_{ess}_ess_all"]
                assert alone == pytest.approx(r["sampling_seconds"] / r[f"{ess}_ess"])
                assert with_warmup == pytest.approx(
                    (r["warmup_seconds"] + r["sampling_seconds"]) / r[f"{ess}_ess"]
                )
    # The seeds are different runs (not one run printed twice).
    assert rows["mclmc"][0]["min_ess"] != rows["mclmc"][1]["min_ess"]
    assert rows["bj-nuts"][0]["grads"] != rows["bj-nuts"][1]["grads"]
    ratios = out["ratios"]["slab"]
    for ours, theirs in (("mclmc", "bj-mclmc"), ("mams", "bj-mams"), ("fieldnuts", "bj-nuts")):
        got = ratios[(ours, theirs, "s_per_min_ess_all")]
        want = [
            a["s_per_min_ess_all"] / b["s_per_min_ess_all"]
            for a, b in zip(rows[ours], rows[theirs], strict=True)
        ]
        assert got == pytest.approx(want)
        assert len(ratios[(ours, theirs, "s_per_median_ess")]) == len(seeds)
    assert len(ratios[("mams", "fieldnuts", "warmup_grads")]) == len(seeds)
    # Both tuners were asked for the same bias; both unadjusted chains move.
    assert np.isfinite(rows["bj-mclmc"][0]["eevpd"]) and rows["bj-mclmc"][0]["eevpd"] > 0
    assert 0.0 < rows["bj-mams"][0]["accept"] <= 1.0
    assert 0.0 < rows["bj-nuts"][0]["accept"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mclmc", "fieldnuts"])
def test_chunk_clock_leaves_the_draws_as_they_were(bench, kind):
    """The clock compiles each chunk program by a call of zero transitions first; the
    run must draw exactly what it draws without the clock."""
    from sampling import build

    args = bench.argparse.Namespace(
        chains=2, burnin=10, results=10, burnin_mclmc=20, results_mclmc=20, thin_mclmc=2,
        burnin_mams=20, results_mams=10, thin_mams=1, desired_energy_var=5e-4, leapfrog=4,
        max_depth=4, chunk_size=7, seeds=[3],
    )  # fmt: skip
    model, data = build(8, True)
    problem = bench.gaussian_problem(model, data, args.chains)
    draws = []
    for clocked in (False, True):
        sampler = bench.make_sampler(problem, kind, args)
        if clocked:
            clock = bench.ChunkClock(sampler)
        sink = bench.MemorySink()
        with bench.tempfile.TemporaryDirectory() as d:
            summary = sampler.run(sink, Path(d), problem.init, progress=False, seed=3)
        draws.append((sink.stacked_fields(), summary.latent_state[0], summary.field_mean))
    np.testing.assert_array_equal(draws[0][0], draws[1][0])
    np.testing.assert_array_equal(draws[0][1], draws[1][1])
    np.testing.assert_array_equal(draws[0][2], draws[1][2])
    assert clock.seconds["warmup"] > 0 and clock.seconds["sampling"] > 0


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
