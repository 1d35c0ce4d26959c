"""The ``distribution`` config section and the sharded ``fieldhmc run`` path."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fieldhmc.config import ConfigError, config_from_dict, load_config, read_yaml

ROOT = Path(__file__).resolve().parents[1]
# Not in configs/ itself: the shipped-config tests run those in-process on one device.
SHARDED = ROOT / "configs" / "distributed" / "sharded_32.yaml"


def _with(**sections):
    raw = copy.deepcopy(read_yaml(SHARDED))
    for dotted, value in sections.items():
        section, key = dotted.split("__")
        raw.setdefault(section, {})[key] = value
    return raw


def test_shipped_sharded_config():
    config = load_config(SHARDED)
    assert config.distribution.mesh == (4,)
    assert config.distribution.devices == "cpu"
    assert config_from_dict(config.to_dict(), Path("/nonexistent")) == config


def test_no_distribution_by_default():
    assert load_config(ROOT / "configs" / "quickstart.yaml").distribution is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"distribution__mesh": [3]}, "distribution.mesh: 3 devices must divide grid.shape[0]"),
        ({"distribution__mesh": [0]}, "distribution.mesh: value error, must be a positive"),
        ({"distribution__mesh": [2, 2]}, "distribution.mesh: tuple should have at most 1 item"),
        ({"distribution__devices": "tpu"}, "distribution.devices: must be 'cpu' or 'gpu'"),
        ({"sampler__step_size": -1.0}, "sampler.step_size"),
        (
            {"model__parametrisation": "centred"},
            "distribution: not on a mesh: model.parametrisation=centred",
        ),
    ],
)
def test_bad_distribution_is_one_config_error(change, message):
    raw = _with(**change)
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, ROOT)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def _with_kind(kind: str, **sections) -> dict:
    raw = _with(sampler__kind=kind, **sections)
    if kind != "hmc":
        for key in ("num_leapfrog_steps", "jitter_leapfrog"):
            raw["sampler"].pop(key)
    return raw


@pytest.mark.parametrize("kind", ["nuts", "fieldnuts", "chees"])
def test_distribution_refuses_other_kinds(kind):
    raw = _with_kind(kind)
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, ROOT)
    text = str(info.value)
    assert f"not on a mesh: sampler.kind={kind}: the mesh runs hmc, mclmc, mams" in text
    assert "\n" not in text


@pytest.mark.parametrize("preconditioner", ["prior", "posterior", "diagonal"])
def test_distribution_takes_the_fourier_diagonal_metrics_and_jitter(preconditioner):
    raw = _with(sampler__preconditioner=preconditioner, sampler__jitter_leapfrog=True)
    config = config_from_dict(raw, ROOT)
    assert config.sampler.preconditioner == preconditioner


@pytest.mark.parametrize("kind", ["mclmc", "mams"])
def test_distribution_accepts_the_microcanonical_kinds(kind):
    """kind mclmc / mams with distribution validate (ShardedSampler runs them), with
    their tuning options and the Fourier-diagonal metrics; the windowed diagonal one is
    refused."""
    config = config_from_dict(_with_kind(kind, sampler__trajectory_length=1.5), ROOT)
    assert config.sampler.kind == kind and config.distribution.mesh == (4,)
    assert config.sampler.trajectory_length == 1.5
    config = config_from_dict(_with_kind(kind, sampler__preconditioner="posterior"), ROOT)
    assert config.sampler.preconditioner == "posterior"
    with pytest.raises(ConfigError, match="does not combine with|not on a mesh"):
        config_from_dict(_with_kind(kind, sampler__preconditioner="diagonal"), ROOT)


_SAMPLED = {"log_amplitude": {"sample": True, "prior_scale": 1.0}, "index": {"sample": True}}


def _with_hyperparameters(kind: str = "hmc", **sections) -> dict:
    raw = _with_kind(kind, **sections)
    raw["model"]["hyperparameters"] = copy.deepcopy(_SAMPLED)
    raw["sampler"]["init"] = "prior"
    return raw


@pytest.mark.parametrize("kind", ["hmc", "mclmc", "mams"])
@pytest.mark.parametrize("preconditioner", ["identity", "prior", "posterior"])
def test_distribution_takes_sampled_hyperparameters(kind, preconditioner):
    raw = _with_hyperparameters(kind, sampler__preconditioner=preconditioner)
    config = config_from_dict(raw, ROOT)
    assert config.model.samples_power and config.distribution.mesh == (4,)


@pytest.mark.parametrize("parametrisation", ["conditional", "conditional_scale"])
def test_distribution_takes_the_conditional_parametrisations(parametrisation):
    raw = _with_hyperparameters(
        model__parametrisation=parametrisation, sampler__preconditioner="posterior"
    )
    config = config_from_dict(raw, ROOT)
    assert config.model.parametrisation == parametrisation


def _with_poisson(**sections) -> dict:
    raw = _with(**sections)
    raw["model"]["likelihood"] = {"kind": "lognormal_poisson", "nbar": 3.0}
    return raw


@pytest.mark.parametrize("preconditioner", ["identity", "prior", "posterior"])
def test_distribution_takes_the_poisson_likelihood(preconditioner):
    config = config_from_dict(_with_poisson(sampler__preconditioner=preconditioner), ROOT)
    assert config.model.likelihood.kind == "lognormal_poisson"
    assert config.distribution.mesh == (4,)


@pytest.mark.parametrize("preconditioner", ["posterior", "diagonal"])
def test_summary_names_the_mesh_metric(preconditioner):
    from fieldhmc.workflow import _distribution_note

    config = config_from_dict(_with_poisson(sampler__preconditioner=preconditioner), ROOT)
    note = _distribution_note(config)["distribution"]["sampler"]
    diagonal = preconditioner == "diagonal"
    assert ("windowed diagonal metric as per-element scales" in note) == diagonal
    assert ("Fourier-diagonal metric as a map" in note) == (not diagonal)


def test_distribution_takes_sampled_cosmological_parameters():
    raw = _with(sampler__preconditioner="posterior")
    tn = {"kind": "truncated_normal", "loc": 0.3111, "scale": 0.2, "low": 0.05, "high": 1.0}
    raw["model"]["power"] = {
        "kind": "eisenstein_hu",
        "omega_m": {"sample": True, "prior": tn},
        "sigma8": 0.8102,
    }
    raw["sampler"]["init"] = "prior"
    config = config_from_dict(raw, ROOT)
    assert config.model.sampled_parameter_names == ("Omega_m",)
    assert config.distribution.mesh == (4,)


def _fieldhmc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fieldhmc", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _run_small(raw: dict, tmp_path: Path, num_burnin_steps: int = 10) -> Path:
    """``fieldhmc run`` of ``raw`` at 8³ (10 warm-up + 6 draws, chunks of 4, every 2nd
    field stored); asserts it exits 0 and writes the usual run directory."""
    import yaml

    raw["grid"]["shape"] = [8, 8, 8]
    raw["sampler"].update(num_results=6, num_burnin_steps=num_burnin_steps, chunk_size=4)
    raw["outputs"] = {"directory": str(tmp_path / "unused"), "field_thin": 2}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    proc = _fieldhmc("run", str(path), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("traces.h5", "fields.h5", "samples.nc", "power.nc", "report.txt"):
        assert (out / name).exists(), name
    return out


@pytest.mark.slow
def test_cli_runs_the_sharded_sampler_through_the_driver(tmp_path):
    """``fieldhmc run`` with distribution (the CLI makes 4 virtual CPUs itself) writes
    the normal run directory; ``fieldhmc resume --num-results`` extends it on the mesh."""
    import h5py

    out = tmp_path / "run"
    # 10 warm-up steps: after 2, dual averaging left a step size (2.13) that rejected
    # every draw, and `fieldhmc resume` then failed plotting the all-rejected chains.
    sets = ["grid.shape=[8,8,8]", "sampler.num_results=6", "sampler.num_burnin_steps=10"]
    sets += ["sampler.chunk_size=4", "outputs.field_thin=2"]
    proc = _fieldhmc("run", str(SHARDED), "--out", str(out), *sum((["--set", v] for v in sets), []))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("traces.h5", "fields.h5", "samples.nc", "power.nc", "report.txt"):
        assert (out / name).exists(), name
    assert (out / "plots" / "traces.png").exists()
    assert (out / "plots" / "power_spectrum.png").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metadata"]["distribution"]["mesh"] == [4]
    with h5py.File(out / "traces.h5", "r") as f:
        assert f["lp"].shape == (6, 4)
        assert np.all(np.isfinite(f["power"][()]))
    with h5py.File(out / "fields.h5", "r") as f:
        assert f["draws"].shape == (3, 4, 8, 8, 8)
        assert np.all(np.isfinite(f["mean"][()]))
    proc = _fieldhmc("resume", str(out), "--num-results", "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with h5py.File(out / "traces.h5", "r") as f:
        assert f["lp"].shape == (10, 4)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mclmc", "mams"])
def test_cli_runs_sharded_microcanonical_kinds(tmp_path, kind):
    """``fieldhmc run`` with distribution and kind mclmc / mams (8³, 4 virtual CPUs):
    the usual run directory, the tuned step size and L in samples.nc's attributes, and
    ``fieldhmc resume --num-results`` extends it."""
    import h5py

    raw = _with_kind(kind)
    out = _run_small(raw, tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    meta = summary["metadata"]
    assert meta["distribution"]["mesh"] == [4]
    assert meta["distribution"]["sampler"].startswith(kind)
    tuned = meta["tuning"]["tuned"]
    assert tuned["dimension"] == 512 and tuned["step_size"] != raw["sampler"]["step_size"]
    with h5py.File(out / "traces.h5", "r") as f:
        assert f["lp"].shape == (6, 4)
        assert np.all(np.isfinite(f["energy_error"][()]))
    proc = _fieldhmc("resume", str(out), "--num-results", "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with h5py.File(out / "traces.h5", "r") as f:
        assert f["lp"].shape == (10, 4)


@pytest.mark.slow
def test_cli_runs_sharded_hmc_with_sampled_hyperparameters(tmp_path):
    """``fieldhmc run`` with distribution and log A, n sampled (8³, jittered HMC, prior
    metric, 4 virtual CPUs): the hyperparameters in samples.nc as on one device, and
    ``fieldhmc resume --num-results`` extends the run on the mesh."""
    import h5py
    import xarray as xr

    raw = _with_hyperparameters(sampler__preconditioner="prior", sampler__jitter_leapfrog=True)
    out = _run_small(raw, tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metadata"]["distribution"]["mesh"] == [4]
    posterior = xr.open_dataset(out / "samples.nc", group="posterior")
    for name in ("log_amplitude", "index"):
        values = posterior[name].values
        assert values.shape == (4, 6) and np.all(np.isfinite(values)), name
        assert np.ptp(values) > 0, name
    proc = _fieldhmc("resume", str(out), "--num-results", "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with h5py.File(out / "traces.h5", "r") as f:
        assert f["lp"].shape == (10, 4) and f["log_amplitude"].shape == (10, 4)


@pytest.mark.slow
@pytest.mark.parametrize("preconditioner", ["posterior", "diagonal"])
def test_cli_runs_sharded_poisson(tmp_path, preconditioner):
    """``fieldhmc run`` with distribution and lognormal-Poisson counts (8³, jittered HMC,
    the posterior metric, or the windowed diagonal one with 24 warm-up steps: one window,
    3 to 22; 4 virtual CPUs): the usual run directory with finite traces, and ``fieldhmc
    resume --num-results`` extends it on the mesh."""
    import h5py

    raw = _with_poisson(sampler__preconditioner=preconditioner, sampler__jitter_leapfrog=True)
    out = _run_small(raw, tmp_path, num_burnin_steps=24 if preconditioner == "diagonal" else 10)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metadata"]["distribution"]["mesh"] == [4]
    described = "windowed diagonal" in summary["metadata"]["distribution"]["sampler"]
    assert described == (preconditioner == "diagonal")
    with h5py.File(out / "traces.h5", "r") as f:
        assert f["lp"].shape == (6, 4) and np.all(np.isfinite(f["lp"][()]))
        assert np.all(np.isfinite(f["power"][()]))
    proc = _fieldhmc("resume", str(out), "--num-results", "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with h5py.File(out / "traces.h5", "r") as f:
        assert f["lp"].shape == (10, 4)
