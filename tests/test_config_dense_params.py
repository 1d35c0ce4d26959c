"""``sampler.preconditioner: dense_params``: what the config accepts, what it refuses (one
line naming the key, exit 2, before TensorFlow), and the driver settings it makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fieldhmc import cli
from fieldhmc.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
HIERARCHICAL = ROOT / "configs" / "hierarchical_64.yaml"
GALAXY = ROOT / "configs" / "galaxy_clustering_16.yaml"
DENSE = "sampler.preconditioner=dense_params"
NUTS = "sampler.kind=fieldnuts"  # hierarchical_64.yaml runs mams


def test_dense_params_is_accepted_with_two_or_more_sampled_parameters():
    assert load_config(HIERARCHICAL, [NUTS, DENSE]).sampler.preconditioner == "dense_params"
    assert load_config(GALAXY, [DENSE]).sampler.preconditioner == "dense_params"


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (
            ["model.hyperparameters.index.sample=false"],
            "sampler.preconditioner",
            "needs >= 2 of them (got 1); use diagonal",
        ),
        (
            [
                "model.hyperparameters.index.sample=false",
                "model.hyperparameters.log_amplitude.sample=false",
            ],
            "sampler.preconditioner",
            "(got 0)",
        ),
        (["sampler.kind=mams"], "preconditioner", "dense_params (windowed adaptation) does not"),
        (["sampler.kind=mclmc"], "preconditioner", "mclmc's own tuning"),
    ],
)
def test_dense_params_refusals(overrides, key, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(HIERARCHICAL, [NUTS, DENSE, *overrides])
    message = str(info.value)
    assert key in message and fragment in message, message
    assert "\n" not in message.strip()


def test_dense_params_on_a_mesh_is_refused():
    sharded = ROOT / "configs" / "distributed" / "sharded_32.yaml"
    with pytest.raises(ConfigError, match="sampler.preconditioner=dense_params: the mesh"):
        load_config(
            sharded,
            [
                "sampler.kind=hmc",
                DENSE,
                "model.hyperparameters.log_amplitude.sample=true",
                "model.hyperparameters.index.sample=true",
            ],
        )


def test_cli_validate_exits_2_in_one_line(capsys):
    sets = [NUTS, DENSE, "model.hyperparameters.index.sample=false"]
    status = cli.main(["validate", str(HIERARCHICAL), *[a for s in sets for a in ("--set", s)]])
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dense_params" in err, err


def test_workflow_settings():
    from fieldhmc import workflow

    settings = workflow._settings(load_config(GALAXY, [DENSE]))
    assert settings.adapt_diagonal and settings.adapt_dense_params
    settings = workflow._settings(load_config(GALAXY))
    assert settings.adapt_diagonal and not settings.adapt_dense_params
