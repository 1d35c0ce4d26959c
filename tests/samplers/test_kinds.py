"""The kind registry: each kind declared once and asked by the config and the driver."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import numpy as np
import pytest

from fieldhmc import config as cfg
from fieldhmc.samplers import kinds


def test_config_sections_are_the_registered_kinds():
    field = cfg.Config.model_fields["sampler"]
    tags = [get_args(m.model_fields["kind"].annotation)[0] for m in get_args(field.annotation)]
    assert tags == list(kinds.KINDS)
    for kind in kinds.all_kinds():
        section = cfg.config_from_dict({"sampler": {"kind": kind.name}}, ".").sampler
        own = set(type(section).model_fields) - set(cfg._SamplerCommon.model_fields)
        assert own == set(kind.option_names), kind.name
        assert section.sampler_kind is kind


@pytest.mark.parametrize("kind", kinds.all_kinds(), ids=lambda k: k.name)
def test_config_and_driver_apply_the_same_rules(kind):
    from fieldhmc.samplers import SamplerSettings

    chains = max(1, kind.min_chains - 1)
    raw = {"sampler": {"kind": kind.name, "num_chains": chains}}
    settings = dict(kind=kind.name, num_chains=chains)
    if kind.min_chains > 1:
        with pytest.raises(cfg.ConfigError, match="sampler.num_chains: .*needs >= 2"):
            cfg.config_from_dict(raw, ".")
        with pytest.raises(ValueError, match="needs >= 2"):
            SamplerSettings(**settings)
        raw["sampler"]["num_chains"] = settings["num_chains"] = kind.min_chains
    raw["sampler"]["preconditioner"] = "diagonal"
    if kind.tunes_own_metric:
        with pytest.raises(cfg.ConfigError, match="sampler.preconditioner: diagonal"):
            cfg.config_from_dict(raw, ".")
        with pytest.raises(ValueError, match="diagonal"):
            SamplerSettings(**settings, adapt_diagonal=True)
    else:
        cfg.config_from_dict(raw, ".")
        SamplerSettings(**settings, adapt_diagonal=True)


def test_an_option_of_another_kind_names_the_kinds_that_take_it():
    for option in ("num_leapfrog_steps", "max_tree_depth", "trajectory_length"):
        owners = kinds.names_where(lambda k, o=option: o in k.option_names)
        other = next(k for k in kinds.KINDS if k not in owners)
        with pytest.raises(cfg.ConfigError, match=f"only used when .*{owners[-1]}"):
            cfg.config_from_dict({"sampler": {"kind": other, option: 3}}, ".")
        # null is accepted and means "not given"
        section = cfg.config_from_dict({"sampler": {"kind": other, option: None}}, ".").sampler
        assert not hasattr(section, option)


def test_registry_and_config_import_without_tensorflow():
    code = (
        "import sys; from fieldhmc import config; from fieldhmc.samplers import kinds; "
        "config.config_from_dict({'sampler': {'kind': 'mams'}}, '.'); "
        "print('tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("kind", kinds.all_kinds(), ids=lambda k: k.name)
def test_every_kind_builds_steps_and_reports_its_stats(kind):
    """Eagerly, on a 2 x 3 standard normal: the kernel of the registered kind steps, its
    stats have one value per chain and its exported stat names are StepStats fields."""
    import tensorflow as tf

    from fieldhmc.samplers import SamplerSettings
    from fieldhmc.samplers.kernels import StepStats

    settings = SamplerSettings(kind=kind.name, num_chains=2, num_burnin_steps=4)
    options = {**settings.kind_options, "num_leapfrog_steps": 2, "max_tree_depth": 2}
    options = {k: v for k, v in options.items() if k in kind.option_names}

    def target(x):
        return -0.5 * tf.reduce_sum(tf.square(x), axis=-1)

    kernel = kind.build_kernel(
        target, options, step_size=tf.constant(0.3), num_adaptation_steps=4, dimension=3
    )
    x = tf.zeros([2, 3])
    results = kernel.bootstrap_results(x)
    x, results = kernel.one_step(x, results, seed=tf.constant([1, 2], tf.int32))
    stats = kind.step_stats(results, kind.target_log_prob_of(results))
    assert isinstance(stats, StepStats)
    assert stats.n_steps.shape == [2] and stats.step_size.shape == [2]
    assert set(kind.stat_names) - {"lp"} <= set(StepStats._fields)
    np.testing.assert_allclose(kind.target_log_prob_of(results), target(x), rtol=1e-6)
    assert "step_size" in kind.tuned_parameters(results, [np.ones(3)])
