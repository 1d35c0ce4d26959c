"""Your own data (issue 27): NaN in masked voxels is ignored, end to end."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from fieldhmc import workflow
from fieldhmc.config import config_from_dict

SHAPE = (8, 10, 12)  # non-cubic, even and odd-free sizes as a user's grid would be


def _files(d: Path, masked_value: float) -> None:
    rng = np.random.default_rng(3)
    mask = np.ones(SHAPE)
    mask[2:5] = 0
    mask[:, :, 7] = 0
    data = rng.normal(size=SHAPE)
    sigma = rng.uniform(0.5, 2.0, size=SHAPE)
    data[mask == 0] = masked_value
    sigma[mask == 0] = masked_value if np.isnan(masked_value) else 1.0
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / "mask.npy", mask)
    np.save(d / "data.npy", data.astype(np.float32))
    np.save(d / "sigma.npy", sigma)


def _raw() -> dict:
    return {
        "grid": {"shape": list(SHAPE), "box_size": [40.0, 50.0, 60.0]},
        "model": {
            "likelihood": {
                "kind": "masked_gaussian",
                "sigma_map": "sigma.npy",
                "mask": {"file": "mask.npy"},
            }
        },
        "data": {"source": "file", "path": "data.npy"},
        "sampler": {
            "num_chains": 2,
            "num_burnin_steps": 10,
            "num_results": 10,
            "num_leapfrog_steps": 3,
            "chunk_size": 10,
        },
        "outputs": {"field_thin": 5, "tracked_modes": 2},
    }


def _config(d: Path):
    return config_from_dict(_raw(), d)


def _draws(root: Path) -> dict[str, np.ndarray]:
    with h5py.File(root / "traces.h5", "r") as f:
        return {k: f[k][()] for k in f}


def test_nan_in_masked_voxels_gives_the_same_target_as_zeros(tmp_path):
    """Fast: the model a run builds from NaN-masked files has the same data, sigma map,
    log density and gradient as the one built from zeros there (hence the same draws)."""
    import tensorflow as tf

    targets = {}
    for label, value in (("nan", np.nan), ("zero", 0.0)):
        d = tmp_path / label
        _files(d, value)
        config = _config(d)
        model = workflow.build_model(config)
        data = workflow.obtain_data(config, model).data
        targets[label] = (data, np.asarray(model.sigma), model.target_log_prob_fn(data))
    np.testing.assert_array_equal(targets["nan"][0], targets["zero"][0])
    np.testing.assert_array_equal(targets["nan"][1], targets["zero"][1])
    state = tf.random.stateless_normal((2, *SHAPE), seed=[1, 2], dtype=tf.float32)
    values = {}
    for label, (_, _, target_fn) in targets.items():
        with tf.GradientTape() as tape:
            tape.watch(state)
            lp = target_fn(state)
        values[label] = (lp.numpy(), tape.gradient(lp, state).numpy())
    assert np.isfinite(values["nan"][0]).all()
    np.testing.assert_array_equal(values["nan"][0], values["zero"][0])
    np.testing.assert_array_equal(values["nan"][1], values["zero"][1])


@pytest.mark.slow
def test_nan_in_masked_voxels_gives_the_same_draws_as_zeros(tmp_path):
    runs = {}
    for label, value in (("nan", np.nan), ("zero", 0.0)):
        d = tmp_path / label
        _files(d, value)
        runs[label] = workflow.run(_config(d), d / "run", progress=False, plots=False).root
    nan_run, zero_run = _draws(runs["nan"]), _draws(runs["zero"])
    assert sorted(nan_run) == sorted(zero_run)
    for name in zero_run:
        np.testing.assert_array_equal(nan_run[name], zero_run[name], err_msg=name)
    # the run directory keeps the data as the likelihood saw them: masked voxels 0
    stored = np.load(runs["nan"] / "data" / "data.npy")
    mask = np.load(runs["nan"] / "data" / "mask.npy")
    assert np.isfinite(stored).all() and (stored[mask == 0] == 0).all()
    np.testing.assert_array_equal(stored, np.load(runs["zero"] / "data" / "data.npy"))
    sigma = np.load(runs["nan"] / "data" / "sigma_map.npy")
    np.testing.assert_array_equal(sigma, np.load(runs["zero"] / "data" / "sigma_map.npy"))


def test_nan_in_observed_voxels_after_a_generated_mask_names_the_key(tmp_path):
    """A generated mask is only known once the models build it (TensorFlow): the data's
    values are then checked there, with the same one-line error naming data.path."""
    d = tmp_path / "gen"
    _files(d, 0.0)
    data = np.load(d / "data.npy")
    data[0, 0, 0] = np.nan
    np.save(d / "data.npy", data)
    raw = _raw()
    raw["model"]["likelihood"]["mask"] = {"generate": {"kind": "slab", "fraction": 0.2}}
    config = config_from_dict(raw, d)  # shape and dtype checked, values deferred
    from fieldhmc.config import ConfigError

    with pytest.raises(ConfigError, match=r"^config error: data\.path: NaN or Inf at 1 "):
        workflow.run(config, d / "run", progress=False, plots=False)
    assert not (d / "run").exists()
