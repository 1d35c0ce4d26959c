"""SBC and sweeps on Dask (fieldhmc.sweep, fieldhmc.distributed, the CLI).

One LocalCluster of 2 worker processes serves the module. The model is the
hierarchical Gaussian of configs/hierarchical_64.yaml (log amplitude and index sampled
with the field) at 8³ with a short jittered HMC, so that a realisation costs ~1 s once
a worker has compiled its sampler.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from fieldhmc import config as cfg
from fieldhmc import distributed, sweep
from fieldhmc.cli import main

ROOT = Path(__file__).resolve().parents[1]
HIERARCHICAL = ROOT / "configs" / "hierarchical_64.yaml"
SMALL = [
    "grid.shape=[8,8,8]",
    "sampler.kind=hmc",
    "sampler.max_tree_depth=null",
    "sampler.num_leapfrog_steps=8",
    "sampler.jitter_leapfrog=true",
    "sampler.preconditioner=posterior",
    "sampler.num_chains=2",
    "sampler.num_burnin_steps=100",
    "sampler.num_results=100",
    "sampler.chunk_size=100",
    "outputs.field_thin=10",  # L = 10 draws x 2 chains = 20 ranked draws
    "outputs.tracked_modes=4",
]
NUM_REALISATIONS = 20


def small_config(*extra: str) -> cfg.Config:
    return cfg.load_config(HIERARCHICAL, [*SMALL, *extra])


@pytest.fixture(scope="module")
def client():
    with distributed.open_client(num_workers=2, threads_per_worker=1) as c:
        yield c


@pytest.fixture(scope="module")
def reference(client, tmp_path_factory):
    out = tmp_path_factory.mktemp("sbc") / "ref"
    result = sweep.run_sbc(small_config(), out, NUM_REALISATIONS, client, progress=False)
    assert not result.failures
    return result


def test_sbc_ranks_every_quantity_and_does_not_reject(reference):
    ds = reference.dataset
    names = [str(n) for n in ds.quantity.values]
    num_bins = len(ds.k.values[np.isfinite(ds.k.values)])
    assert names[:3] == ["log_amplitude", "index", "log_likelihood"]
    assert [n for n in names if n.startswith("power[")] == [f"power[{b}]" for b in range(num_bins)]
    assert num_bins >= 5
    assert sum(n.startswith("mode[") and n.endswith(".real") for n in names) == 4
    assert ds["rank"].shape == (NUM_REALISATIONS, len(names))
    assert ds.attrs["num_draws"] == 20
    assert int(ds["rank"].min()) >= 0 and int(ds["rank"].max()) <= 20
    # Every quantity varies across realisations (none is identically 0 like the
    # imaginary part of a self-paired mode would be).
    assert np.all(ds["rank"].std("realisation").values > 0)
    # The correct sampler: no test rejects at family-wise level 1%.
    assert ds.attrs["p_family"] > 0.01, str(reference.out_dir / "sbc_report.txt")
    # Written outputs: the dataset, the report, the plots, one run directory each.
    out = reference.out_dir
    on_disk = xr.open_dataset(out / "sbc.nc", engine="h5netcdf")
    np.testing.assert_array_equal(on_disk["rank"].values, ds["rank"].values)
    on_disk.close()
    assert "family-wise p" in (out / "sbc_report.txt").read_text()
    for kind in ("ranks", "ecdf"):
        for group in ("hyperparameters", "power", "modes"):
            assert (out / "plots" / f"sbc_{kind}_{group}.png").stat().st_size > 1000
    run0 = out / "realisations" / "r0000"
    for name in ("config.yaml", "samples.nc", "power.nc", "fields.h5", "data/truth.npy"):
        assert (run0 / name).exists(), name
    seeds = ds["data_seed"].values
    assert len(set(seeds.tolist())) == NUM_REALISATIONS


def test_sbc_resume_skips_finished_realisations(reference, client):
    result = sweep.run_sbc(
        small_config(), reference.out_dir, 3, client, progress=False, plots=False
    )
    assert result.skipped == ["r0000", "r0001", "r0002"] and not result.failures
    assert result.dataset.sizes["realisation"] == NUM_REALISATIONS  # all finished ones
    with pytest.raises(ValueError, match="different config"):
        sweep.run_sbc(
            small_config("sampler.num_results=50"), reference.out_dir, 3, client, progress=False
        )


def _fail_on_odd(x: int) -> int:
    if x % 2:
        raise RuntimeError(f"odd input {x}\nsecond line")
    return 10 * x


def test_worker_kill_at_shutdown_is_not_a_user_warning(caplog):
    """The nanny's "still alive after 4.0 seconds, killing" at cluster close (all
    results written) goes to DEBUG; any other nanny warning still shows."""
    import logging

    nanny = logging.getLogger("distributed.nanny")
    with caplog.at_level(logging.WARNING):
        with distributed._quiet_worker_kill():
            nanny.warning("Worker process still alive after 4.0 seconds, killing")
            nanny.warning("Worker process died unexpectedly")
        nanny.warning("Worker process still alive after 4.0 seconds, killing")
    messages = [r.getMessage() for r in caplog.records if r.name == "distributed.nanny"]
    assert messages == [
        "Worker process died unexpectedly",
        "Worker process still alive after 4.0 seconds, killing",
    ]


def test_run_jobs_lists_failures_with_their_error_line(client):
    outcome = distributed.run_jobs(
        client, _fail_on_odd, [0, 1, 2, 3], ["a", "b", "c", "d"], progress=False
    )
    assert outcome.results == {"a": 0, "c": 20}
    assert [(f.label, f.error) for f in outcome.failures] == [
        ("b", "RuntimeError: odd input 1 second line"),
        ("d", "RuntimeError: odd input 3 second line"),
    ] or sorted((f.label, f.error) for f in outcome.failures) == [
        ("b", "RuntimeError: odd input 1 second line"),
        ("d", "RuntimeError: odd input 3 second line"),
    ]


def test_cli_sweep_gathers_a_table(reference, client, tmp_path):
    """Two data seeds x 2 sampler seeds; the workers' compiled sampler serves all four."""
    config = tmp_path / "h8.yaml"
    cfg.write_yaml(small_config().to_dict(), config)
    out = tmp_path / "sweep"
    argv = ["sweep", str(config), "--set", "data.seed=1,2", "--seeds", "2"]
    assert main([*argv, "--out", str(out), "--scheduler", client.scheduler.address]) == 0
    import pandas as pd

    table = pd.read_csv(out / "sweep.csv", index_col="run")
    assert list(table.index) == ["p000-s00", "p000-s01", "p001-s00", "p001-s01"]
    assert table["data.seed"].tolist() == [1, 1, 2, 2]
    assert table["seed"].tolist() == [0, 1, 0, 1]
    assert np.isfinite(table["seconds"]).all() and len(table.columns) > 10
    with xr.open_dataset(out / "sweep.nc", engine="h5netcdf") as ds:
        assert ds.sizes["run"] == 4
    assert (out / "runs" / "p001-s01" / "summary.json").exists()
    assert (out / "sweep_failures.txt").read_text() == ""
    # A second call resumes: nothing is rerun.
    assert main([*argv, "--out", str(out), "--scheduler", client.scheduler.address]) == 0


def test_sweep_points_grid_and_errors():
    points = sweep.sweep_points(
        HIERARCHICAL, ["sampler.num_results=10,20", "grid.shape=[8,8,8],[16,16,16]"], 2
    )
    assert len(points) == 8
    assert points[0].config.sampler.seed == 0 and points[1].config.sampler.seed == 1
    assert points[-1].config.grid.shape == (16, 16, 16)
    with pytest.raises(cfg.ConfigError, match="seeds"):
        sweep.sweep_points(HIERARCHICAL, ["sampler.seed=1,2"], 1)
    with pytest.raises(cfg.ConfigError, match="sampler.num_results"):
        sweep.sweep_points(HIERARCHICAL, ["sampler.num_results=10,-1"], 1)


def _pid_of_running(out: Path, last: str, timeout: float = 120.0) -> tuple[str, int]:
    """Realisation ``last`` once it has started (not finished), and its worker's PID.

    (The last one: the other, warm worker then redoes it, while the killed worker's
    restarted process -- which would compile afresh -- finds nothing left to do.)
    """
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        for rdir in [out / "realisations" / last]:
            attempts = rdir / sweep.ATTEMPTS
            if attempts.exists() and not (rdir / sweep.SBC_MARKER).exists():
                lines = attempts.read_text().splitlines()
                if lines:
                    return rdir.name, json.loads(lines[-1])["pid"]
        time.sleep(0.01)
    raise AssertionError("no realisation started")


def test_killed_worker_realisation_is_redone_identically(reference, client, tmp_path):
    """SIGKILL the worker running the last realisation; Dask reruns it elsewhere."""
    out = tmp_path / "killed"
    n = 4
    box = {}
    thread = threading.Thread(
        target=lambda: box.setdefault(
            "result", sweep.run_sbc(small_config(), out, n, client, progress=False)
        )
    )
    thread.start()
    label, pid = _pid_of_running(out, last=f"r{n - 1:04d}")
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=300)
    assert not thread.is_alive()
    result = box["result"]
    assert not result.failures
    attempts = (out / "realisations" / label / sweep.ATTEMPTS).read_text().splitlines()
    pids = [json.loads(line)["pid"] for line in attempts]
    assert len(pids) >= 2 and pids[0] == pid and pids[-1] != pid
    ref = reference.dataset.isel(realisation=slice(0, n))
    np.testing.assert_array_equal(result.dataset["rank"].values, ref["rank"].values)
    np.testing.assert_array_equal(
        result.dataset["posterior_mean"].values, ref["posterior_mean"].values
    )


@pytest.fixture
def external_scheduler(tmp_path):
    """A `dask scheduler` and one `dask worker` as subprocesses on 127.0.0.1."""
    dask = Path(sys.executable).parent / "dask"
    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, **distributed.worker_environment(1)}
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                [str(dask), "scheduler", "--host", "127.0.0.1", "--port", "0"]
                + ["--no-dashboard", "--scheduler-file", str(scheduler_file)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        t_end = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < t_end:
            time.sleep(0.05)
        time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:")
        procs.append(
            subprocess.Popen(
                [str(dask), "worker", address, "--host", "127.0.0.1", "--nworkers", "1"]
                + ["--nthreads", "1", "--no-dashboard", "--memory-limit", "0"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        yield address
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_cli_sbc_on_external_scheduler_matches_local_cluster(
    reference, external_scheduler, tmp_path, capsys
):
    out = tmp_path / "ext"
    config = tmp_path / "h8.yaml"
    cfg.write_yaml(small_config().to_dict(), config)
    argv = ["sbc", str(config), "--realisations", "2", "--out", str(out)]
    assert main([*argv, "--scheduler", external_scheduler, "--no-plots"]) == 0
    assert "family-wise p" in capsys.readouterr().out
    with xr.open_dataset(out / "sbc.nc", engine="h5netcdf") as ds:
        ref = reference.dataset.isel(realisation=slice(0, 2))
        np.testing.assert_array_equal(ds["rank"].values, ref["rank"].values)
        np.testing.assert_array_equal(ds["truth"].values, ref["truth"].values)
    pids = {
        json.loads((out / "realisations" / f"r{i:04d}" / "sbc.json").read_text())["pid"]
        for i in range(2)
    }
    assert len(pids) == 1  # all on the one external worker


def test_cli_sbc_errors_are_one_line_before_any_cluster(tmp_path, capsys, monkeypatch):
    config = tmp_path / "h8.yaml"
    cfg.write_yaml(small_config().to_dict(), config)
    out = str(tmp_path / "x")
    argv = ["sbc", str(config), "--realisations", "2", "--out", out]
    assert main([*argv, "--set", "outputs.store_fields=false"]) == 2
    assert "store_fields" in capsys.readouterr().err
    assert main([*argv, "--simulate-set", "grid.shape=[4,4,4]"]) == 2
    assert "grid.shape" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fieldhmc[distributed]" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_sbc_rejects_a_miscalibrated_likelihood(client, tmp_path):
    """Simulate with sigma 30% above the fit's: the posterior is overconfident.

    Power is estimated by subsampling the realisations: the fraction of random subsets
    of 20 whose family-wise p-value is below 1%.
    """
    n = 40
    result = sweep.run_sbc(
        small_config(),
        tmp_path / "off",
        n,
        client,
        simulate_config=small_config("model.likelihood.sigma=2.6"),
        progress=False,
    )
    ds = result.dataset
    assert not result.failures
    assert ds.attrs["p_family"] < 0.01
    from fieldhmc import sbc

    rng = np.random.default_rng(0)
    ranks = ds["rank"].values
    power = {}
    for size in (5, 10, 20):
        rejected = []
        for _ in range(200):
            sub = ranks[rng.choice(n, size, replace=False)]
            tests = sbc.uniformity_tests(sub, int(ds.attrs["num_draws"]))
            p_all = np.concatenate([t.pvalue for t in tests.values()])
            rejected.append(sbc.bonferroni(p_all) < 0.01)
        power[size] = float(np.mean(rejected))
    print(f"power at family-wise alpha=0.01 by number of realisations: {power}")
    assert power[20] > 0.8
