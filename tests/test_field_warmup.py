"""``sampler.field_warmup``: a field-only warm-up with the sampled parameters held."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import workflow
from fieldhmc.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
HIERARCHICAL = ROOT / "configs" / "hierarchical_64.yaml"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


@pytest.mark.parametrize(
    ("path", "overrides", "fragment"),
    [
        (HIERARCHICAL, ["sampler.field_warmup=-1"], "sampler.field_warmup"),
        (QUICKSTART, ["sampler.field_warmup=10"], "none are sampled"),
    ],
)
def test_bad_field_warmup_is_a_config_error(path, overrides, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        load_config(path, overrides)
    assert "\n" not in str(err.value)


def test_field_warmup_moves_the_field_only_and_raises_the_log_density(caplog):
    """From a prior draw (a field far from what the data say), the run's initial state
    after 30 field-only transitions has every sampled parameter exactly where the plain
    initial state has it, a moved field and a higher log density in each chain."""
    overrides = [
        "grid.shape=[8,8,8]",
        "sampler.kind=hmc",
        "sampler.num_leapfrog_steps=4",
        "sampler.num_chains=2",
        "sampler.init=prior",
    ]
    config = load_config(HIERARCHICAL, [*overrides, "sampler.field_warmup=30"])
    model = workflow.build_model(config)
    data = workflow.obtain_data(config, model).data
    built = workflow.build(config, data, model=model)
    plain = load_config(HIERARCHICAL, [*overrides, "sampler.field_warmup=0"])
    start = [np.asarray(v) for v in workflow.initial_state(plain, built, data)]
    with caplog.at_level("INFO", logger="fieldhmc.workflow"):
        warmed = [np.asarray(v) for v in workflow.initial_state(config, built, data)]
    names = model.latent_names
    target = model.target_log_prob_fn(data)

    def lp(state):
        return np.asarray(target(*[tf.constant(v) for v in state]))

    j = names.index("field")
    for i, name in enumerate(names):
        if i != j:
            np.testing.assert_array_equal(warmed[i], start[i], err_msg=name)
    assert not np.allclose(warmed[j], start[j])
    assert np.all(lp(warmed) > lp(start))
    # 31 transitions (30 + the one draw) of 4 leapfrogs, 2 chains
    assert "field warm-up: 30 transitions with the sampled parameters held, 248 gradients" in (
        caplog.text
    )
