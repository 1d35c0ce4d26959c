"""Config of the galaxy-clustering model (issue 29): model.power kind eisenstein_hu,
model.forward kind lpt, likelihood shot_noise; every unphysical value or prior support is
one line naming the key, exit 2, before TensorFlow."""

from __future__ import annotations

from pathlib import Path

import pytest

from fieldhmc import cli
from fieldhmc.config import config_from_dict, dump_yaml, load_config
from tests.cli_subprocess import run_bad_then_good

ROOT = Path(__file__).resolve().parents[1]
GALAXY = ROOT / "configs" / "galaxy_clustering_64.yaml"


def test_shipped_galaxy_configs_resolve() -> None:
    for name in ("galaxy_clustering_64.yaml", "galaxy_clustering_16.yaml"):
        config = load_config(ROOT / "configs" / name)
        model = config.model
        assert model.power.kind == "eisenstein_hu"
        assert (model.power.omega_b, model.power.h, model.power.n_s) == (0.049, 0.6766, 0.9665)
        assert model.power.amplitude is None and model.power.index is None
        assert model.forward.kind == "lpt" and model.forward.bias == "lagrangian"
        assert (model.forward.order, model.forward.a_obs, model.forward.los_axis) == (2, 0.5, 2)
        assert model.likelihood.shot_noise.nbar == 1e-3 and model.likelihood.sigma is None
        assert model.parametrisation == "conditional"
        assert model.sampled_parameter_names == ("Omega_m", "sigma8", "b1", "b2", "bs2", "bnabla2")
        assert config_from_dict(config.to_dict(), Path("/nonexistent")) == config
    big = load_config(GALAXY)
    assert big.grid.shape == (64, 64, 64) and big.grid.box_size == (320.0, 320.0, 320.0)


def test_fixed_cosmology_and_biases() -> None:
    config = config_from_dict(
        {
            "model": {
                "power": {"kind": "eisenstein_hu", "omega_m": 0.3, "sigma8": 0.8},
                "forward": {"kind": "lpt", "rsd": False, "params": {"b1": 1.2}},
                "likelihood": {"shot_noise": {"nbar": 2e-3}},
            }
        },
        ".",
    )
    assert config.model.sampled_parameter_names == ()
    assert config.model.forward.params == {"b1": 1.2}
    assert config.model.forward.deconvolve is True
    matter = config_from_dict(
        {
            "model": {
                "power": {"kind": "eisenstein_hu"},
                "forward": {"kind": "lpt", "bias": "none"},
            }
        },
        ".",
    )
    assert matter.model.forward.bias == "none"


_TN = {"kind": "truncated_normal", "loc": 0.3, "scale": 0.2}

BAD = {
    "omega_m_below_omega_b": (
        {"power": {"kind": "eisenstein_hu", "omega_m": 0.04}},
        "model.power.omega_m: must be in (Omega_b, 1]",
    ),
    "omega_m_above_1": (
        {"power": {"kind": "eisenstein_hu", "omega_m": 1.2}},
        "model.power.omega_m: must be in (Omega_b, 1]",
    ),
    "omega_m_at_omega_b": (
        {"power": {"kind": "eisenstein_hu", "omega_m": 0.05, "omega_b": 0.05}},
        "model.power.omega_m: must be in (Omega_b, 1]",
    ),
    "sigma8_zero": (
        {"power": {"kind": "eisenstein_hu", "sigma8": 0.0}},
        "model.power.sigma8: must be positive",
    ),
    "sigma8_negative": (
        {"power": {"kind": "eisenstein_hu", "sigma8": -0.8}},
        "model.power.sigma8: must be positive",
    ),
    "omega_m_prior_low_reaches_omega_b": (
        {
            "power": {
                "kind": "eisenstein_hu",
                "omega_m": {"sample": True, "prior": {**_TN, "low": 0.04, "high": 1.0}},
            }
        },
        "model.power.omega_m.prior: its support reaches omega_m <= 0.049",
    ),
    "omega_m_prior_high_above_1": (
        {
            "power": {
                "kind": "eisenstein_hu",
                "omega_m": {"sample": True, "prior": {**_TN, "low": 0.1, "high": 1.5}},
            }
        },
        "model.power.omega_m.prior: its support reaches omega_m > 1.0",
    ),
    "omega_m_normal_prior": (
        {
            "power": {
                "kind": "eisenstein_hu",
                "omega_m": {"sample": True, "prior": {"kind": "normal", "loc": 0.3, "scale": 0.1}},
            }
        },
        "model.power.omega_m.prior: its support reaches omega_m <= 0.049",
    ),
    "sigma8_prior_low_zero": (
        {
            "power": {
                "kind": "eisenstein_hu",
                "sigma8": {"sample": True, "prior": {**_TN, "loc": 0.8, "low": 0.0}},
            }
        },
        "model.power.sigma8.prior: its support reaches sigma8 <= 0.0",
    ),
    "sigma8_uniform_prior_negative": (
        {
            "power": {
                "kind": "eisenstein_hu",
                "sigma8": {"sample": True, "prior": {"kind": "uniform", "low": -1, "high": 2}},
            }
        },
        "model.power.sigma8.prior: its support reaches sigma8 <= 0.0",
    ),
    "a_obs_zero": (
        {"power": {"kind": "eisenstein_hu"}, "forward": {"kind": "lpt", "a_obs": 0.0}},
        "model.forward.a_obs: must be in (0, 1] (got 0.0)",
    ),
    "a_obs_above_1": (
        {"power": {"kind": "eisenstein_hu"}, "forward": {"kind": "lpt", "a_obs": 1.5}},
        "model.forward.a_obs: must be in (0, 1] (got 1.5)",
    ),
    "unknown_sampled_parameter": (
        {
            "power": {"kind": "eisenstein_hu"},
            "forward": {
                "kind": "lpt",
                "params": {
                    "b3": {"sample": True, "prior": {"kind": "normal", "loc": 0, "scale": 1}}
                },
            },
        },
        "model.forward.params.b3: the lpt forward model has no sampled parameter 'b3'",
    ),
    "bias_parameter_without_bias": (
        {
            "power": {"kind": "eisenstein_hu"},
            "forward": {"kind": "lpt", "bias": "none", "params": {"b1": 1.0}},
        },
        "model.forward.params.b1: the lpt forward model has no parameter 'b1'",
    ),
    "lpt_needs_eisenstein_hu": (
        {"forward": {"kind": "lpt"}},
        "model.forward.kind: lpt takes its growth from Omega_m",
    ),
    "log_amplitude_with_eisenstein_hu": (
        {
            "power": {"kind": "eisenstein_hu"},
            "hyperparameters": {"log_amplitude": {"sample": True}},
        },
        "model.hyperparameters.log_amplitude.sample: cannot sample",
    ),
    "amplitude_with_eisenstein_hu": (
        {"power": {"kind": "eisenstein_hu", "amplitude": 100.0}},
        "model.power.amplitude: only used when",
    ),
    "omega_m_with_power_law": (
        {"power": {"kind": "power_law", "omega_m": 0.3}},
        "model.power.omega_m: only used when model.power.kind=eisenstein_hu",
    ),
    "shot_noise_and_sigma": (
        {"likelihood": {"kind": "gaussian", "sigma": 1.0, "shot_noise": {"nbar": 1e-3}}},
        "model.likelihood.sigma: give either sigma or shot_noise, not both",
    ),
    "shot_noise_nbar_zero": (
        {"likelihood": {"kind": "gaussian", "shot_noise": {"nbar": 0.0}}},
        "model.likelihood.shot_noise.nbar",
    ),
    "shot_noise_with_poisson": (
        {"likelihood": {"kind": "lognormal_poisson", "shot_noise": {"nbar": 1e-3}}},
        "model.likelihood.shot_noise: only used when",
    ),
    "lpt_bias_number": (
        {"power": {"kind": "eisenstein_hu"}, "forward": {"kind": "lpt", "bias": 1.5}},
        "model.forward.bias: must be lagrangian or none for kind=lpt",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_galaxy_config_is_one_line_exit_2(case, tmp_path, capsys) -> None:
    model, expected = BAD[case]
    path = tmp_path / "bad.yaml"
    path.write_text(dump_yaml({"grid": {"shape": [8, 8, 8], "box_size": 320.0}, "model": model}))
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"config error: {expected}"), err[0]


def test_bad_galaxy_config_before_tensorflow(tmp_path) -> None:
    """In a fresh interpreter: the checks above import no TensorFlow."""
    path = tmp_path / "bad.yaml"
    model, expected = BAD["omega_m_prior_low_reaches_omega_b"]
    path.write_text(dump_yaml({"model": model}))
    result = run_bad_then_good(path, GALAXY, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "no-tensorflow" in result.stdout
    assert result.stderr.strip().splitlines()[0].startswith(f"config error: {expected}")
    assert not (tmp_path / "out").exists()


def test_sampled_cosmology_counts_as_sampled_power() -> None:
    """Sampled Omega_m / sigma8 are sampled P(k) parameters for the sampler-section rules:
    the default metric is the prior's, init wiener is refused, and a mesh takes them."""
    from fieldhmc.config import ConfigError

    raw = {
        "model": {
            "power": {
                "kind": "eisenstein_hu",
                "sigma8": {
                    "sample": True,
                    "prior": {"kind": "uniform", "low": 0.5, "high": 1.1},
                },
            },
            "likelihood": {"sigma": 1.0},
        }
    }
    config = config_from_dict(raw, ".")
    assert config.model.samples_power and config.sampler.preconditioner == "prior"
    with pytest.raises(ConfigError, match="wiener needs fixed hyperparameters"):
        config_from_dict({**raw, "sampler": {"init": "wiener"}}, ".")
    meshed = config_from_dict(
        {**raw, "distribution": {"mesh": [2]}, "grid": {"shape": [8, 8, 8]}}, "."
    )
    assert meshed.model.samples_power and meshed.distribution.mesh == (2,)
