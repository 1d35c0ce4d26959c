"""The scripts users copy run on tiny grids (numpyro-style: main(argv))."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.load_script import load_script

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--set",
    "grid.shape=[8,8,8]",
    "--set",
    "sampler.num_burnin_steps=30",
    "--set",
    "sampler.num_results=40",
    "--set",
    "sampler.num_chains=2",
    "--set",
    "outputs.field_thin=1",
]


def _load(name):
    return load_script(ROOT / "scripts" / f"{name}.py", name)


@pytest.mark.parametrize("name", ["fit_synthetic", "compare_wiener"])
def test_script_runs(name, tmp_path, capsys):
    config = str(ROOT / "configs" / "quickstart.yaml")
    assert _load(name).main([config, "--out", str(tmp_path / "run"), *TINY]) == 0
    out = capsys.readouterr().out
    assert "k [h/Mpc]" in out
    assert (tmp_path / "run" / "summary.json").exists()


def test_compare_wiener_refuses_poisson(tmp_path):
    with pytest.raises(SystemExit):
        _load("compare_wiener").main(
            [str(ROOT / "configs" / "lognormal_poisson_64.yaml"), "--out", str(tmp_path / "run")]
        )


@pytest.mark.slow
def test_microcanonical_benchmark_runs_on_a_tiny_grid(monkeypatch):

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))  # it imports sampling.py
    module = load_script(bench / "microcanonical.py", "microcanonical")
    small = ["--burnin", "10", "--results", "10", "--burnin-mclmc", "30", "--results-mclmc", "20"]
    small += ["--burnin-mams", "30", "--results-mams", "10", "--max-depth", "4", "--leapfrog", "4"]
    argv = ["--grid", "8", "--chains", "2", "--bias-coordinates", "8", "--no-peers", *small]
    out = module.main(argv)  # --no-peers: our kernels, with or without the extra
    assert set(out) == {"none", "slab", "ratios"} and set(out["ratios"]) == {"none", "slab"}
    for mask in ("none", "slab"):
        assert set(out[mask]) == {"mclmc", "mams", "fieldnuts"}  # hmc on request
        for runs in out[mask].values():
            for r in runs:  # one per seed
                assert r["grads"] > 0 and r["warmup_grads"] > 0 and r["min_ess"] > 0
                assert r["min_ess_sq"] > 0 and r["b2"] == r["b2"]  # not NaN


@pytest.mark.slow
def test_run_hashes_are_reproducible_and_see_a_changed_figure(tmp_path):
    """Two runs of one config hash alike; a changed summary figure changes the hash."""
    import json

    run_hashes = _load("run_hashes")
    for out in ("a", "b"):
        assert run_hashes.main(["--out", str(tmp_path / out), "--only", "quickstart"]) == 0
    rows = [(tmp_path / o / "hashes.tsv").read_text() for o in ("a", "b")]
    assert rows[0] == rows[1]
    assert "failed" not in rows[0]
    summary = tmp_path / "a" / "quickstart" / "summary.json"
    before = run_hashes.hash_run(summary.parent)
    data = json.loads(summary.read_text())
    data["num_draws"] += 1
    summary.write_text(json.dumps(data))
    assert run_hashes.hash_run(summary.parent)["summary"] != before["summary"]


def test_run_hashes_reads_a_run_without_a_posterior_group(tmp_path):
    """ArviZ writes no posterior group when nothing is tracked or sampled; the draws
    hash is then that of the sample stats alone, and still sees a changed stat."""
    import json

    import arviz as az
    import numpy as np

    run_hashes = _load("run_hashes")
    (tmp_path / "summary.json").write_text(json.dumps({"num_draws": 3}))
    lp = np.arange(6.0).reshape(2, 3)
    hashes = []
    for value in (lp, lp + 1):
        az.from_dict(sample_stats={"lp": value}).to_netcdf(str(tmp_path / "samples.nc"))
        hashes.append(run_hashes.hash_run(tmp_path))
    assert hashes[0]["fields"] == "-" and hashes[0]["summary"] == hashes[1]["summary"]
    assert hashes[0]["draws"] != hashes[1]["draws"]


def test_code_metrics_counts_kind_comparisons_long_functions_and_cycles(tmp_path):
    """On a made-up package: literal and constant kind comparisons, a 61-line function,
    a two-module import cycle; a lowercase variable named ``kind`` is not a constant."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        'from pkg.b import helper\nMICRO = ("mclmc", "mams")\nkind = "hmc"\n'
        'def f(k):\n    if k == "fieldnuts":\n        return 1\n'
        "    if k in MICRO:\n        return 2\n    return k == kind\n"
    )
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (pkg / "b.py").write_text(
        "from pkg.a import MICRO\ndef helper(k):\n" + body + "    return k not in MICRO\n"
    )
    m = _load("code_metrics").measure(pkg)
    assert sorted(m["kind_comparisons"]) == [("pkg/a.py", 5), ("pkg/a.py", 7), ("pkg/b.py", 63)]
    assert m["functions_over_60"] == [("pkg/b.py", "helper", 62)]
    assert m["import_cycles"] == [["pkg.a", "pkg.b"]]


def test_code_metrics_counts_registry_constants_and_keeps_the_registry_apart(tmp_path):
    """A constant selected from the kind registry (``names_where(...)``) is a kind
    constant; comparisons inside ``samplers/kinds/`` are the registry's own."""
    pkg = tmp_path / "pkg"
    (pkg / "samplers" / "kinds").mkdir(parents=True)
    for d in (pkg, pkg / "samplers", pkg / "samplers" / "kinds"):
        (d / "__init__.py").write_text("")
    (pkg / "samplers" / "kinds" / "reg.py").write_text(
        "MICRO = names_where(lambda k: k.is_micro)\ndef f(k):\n    return k == 'mams'\n"
    )
    (pkg / "c.py").write_text(
        "from pkg.samplers.kinds.reg import MICRO\ndef g(k):\n    return k in MICRO\n"
    )
    metrics = _load("code_metrics")
    m = metrics.measure(pkg)
    assert sorted(m["kind_comparisons"]) == [("pkg/c.py", 3), ("pkg/samplers/kinds/reg.py", 3)]
    assert m["kind_comparisons_outside_registry"] == [("pkg/c.py", 3)]
