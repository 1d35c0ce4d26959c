"""benchmarks/dense_params.py on an 8³ box (tiny counts): one row per preconditioner, the
min ESS over every parameter and the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fieldhmc import config as cfg
from fieldhmc import workflow
from fieldhmc.samplers import stateless_seed
from tests.load_script import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "dense_params.py"


@pytest.mark.slow
def test_rows_cover_the_parameters_and_the_field():
    bench = load_script(BENCH, "dense_params")
    argv = ["--config", str(ROOT / "configs" / "hierarchical_64.yaml"), "--grid", "8"]
    argv += ["--burnin", "40", "--results", "20", "--set", "sampler.max_tree_depth=4"]
    rows = bench.main(argv)
    assert set(rows) == {("fieldnuts", 0, "diagonal"), ("fieldnuts", 0, "dense_params")}
    for r in rows.values():
        assert set(r["param_ess"]) == {"log_amplitude", "index"}
        assert 0 < r["min_ess"] == min(r["field_min_ess"], *r["param_ess"].values())
        assert r["grads_per_min_ess"] == pytest.approx(r["grads"] / r["min_ess"])
    # conditional + Gaussian data: both windowed metrics start from the Laplace block of
    # (log A, n); the diagonal keeps it, dense_params adapts it in the windows
    config = cfg.load_config(
        ROOT / "configs" / "hierarchical_64.yaml", ["grid.shape=[8,8,8]", "sampler.seed=0"]
    )
    model = workflow.build_model(config)
    data = np.asarray(model.sample(seed=stateless_seed(config.data.seed))["data"])
    start = workflow._metric(config, model, data)[1]
    assert start is not None
    np.testing.assert_allclose(rows[("fieldnuts", 0, "diagonal")]["dense_factor"], start)
    factor = rows[("fieldnuts", 0, "dense_params")]["dense_factor"]
    assert factor.shape == (2, 2) and np.allclose(np.triu(factor, 1), 0)
    assert not np.allclose(factor, start)


@pytest.mark.slow
def test_fixed_at_truth_rows_sample_the_field_alone(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH.parent))  # it imports joint_inference.py
    bench = load_script(BENCH, "dense_params")
    argv = ["--config", str(ROOT / "configs" / "hierarchical_masked_64.yaml"), "--grid", "8"]
    argv += ["--burnin", "30", "--results", "20", "--preconditioners", "posterior"]
    argv += ["--set", "sampler.max_tree_depth=4"]  # a fieldnuts key: the config runs mams
    rows = bench.main([*argv, "--fixed-at-truth"])
    (r,) = rows.values()
    assert r["param_ess"] == {} and r["min_ess"] == r["field_min_ess"] > 0
