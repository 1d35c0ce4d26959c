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
            {"sampler__preconditioner": "posterior"},
            "distribution: the sharded sampler needs sampler.preconditioner=identity",
        ),
        (
            {"model__parametrisation": "centred"},
            "needs model.parametrisation=noncentred",
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


def test_distribution_needs_hmc():
    raw = _with(sampler__kind="nuts")
    for key in ("num_leapfrog_steps", "jitter_leapfrog"):
        raw["sampler"].pop(key)
    with pytest.raises(ConfigError, match="the sharded sampler needs sampler.kind=hmc"):
        config_from_dict(raw, ROOT)


def _fieldhmc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fieldhmc", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_cli_runs_the_sharded_sampler_through_the_driver(tmp_path):
    """``fieldhmc run`` with distribution (the CLI makes 4 virtual CPUs itself) writes
    the normal run directory; ``fieldhmc resume --num-results`` extends it on the mesh."""
    import h5py

    out = tmp_path / "run"
    sets = ["grid.shape=[8,8,8]", "sampler.num_results=6", "sampler.num_burnin_steps=2"]
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
