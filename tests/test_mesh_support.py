"""What a run on a DTensor mesh supports: one statement, one-line reasons."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fieldhmc.mesh_support import mesh_support


@pytest.mark.parametrize("kind", ["hmc", "mclmc", "mams"])
@pytest.mark.parametrize("preconditioner", ["identity", "prior", "posterior", "diagonal"])
def test_supported_combinations(kind, preconditioner):
    assert mesh_support(kind, preconditioner=preconditioner) is None
    assert mesh_support(kind, preconditioner=preconditioner, jitter_leapfrog=True) is None


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"kind": "fieldnuts"}, "sampler.kind=fieldnuts"),
        ({"kind": "chees"}, "sampler.kind=chees"),
        ({"kind": "hmc", "preconditioner": "dense"}, "sampler.preconditioner=dense"),
        ({"kind": "fieldnuts", "step_size_jitter": 0.1}, "sampler.kind=fieldnuts"),
        ({"kind": "mams", "likelihood": "MyLikelihood"}, "model.likelihood.kind=MyLikelihood"),
        ({"kind": "hmc", "forward_model": True}, "model.forward"),
        ({"kind": "hmc", "parametrisation": "centred"}, "model.parametrisation=centred"),
    ],
)
def test_refusals_are_one_line_naming_the_setting(kwargs, named):
    reason = mesh_support(**kwargs)
    assert reason is not None and "\n" not in reason
    assert named in reason and reason.startswith("not on a mesh: ")


@pytest.mark.parametrize("kind", ["hmc", "mclmc", "mams"])
@pytest.mark.parametrize("preconditioner", ["identity", "prior", "posterior"])
def test_the_mesh_kinds_take_sampled_hyperparameters(kind, preconditioner):
    reason = mesh_support(kind, preconditioner=preconditioner, sampled_hyperparameters=True)
    assert reason is None
    for parametrisation in ("conditional", "conditional_scale"):
        reason = mesh_support(kind, sampled_hyperparameters=True, parametrisation=parametrisation)
        assert reason is None
    reason = mesh_support(kind, sampled_hyperparameters=True, sampled_cosmology=True)
    assert reason is None  # Omega_m, sigma8 of the Eisenstein-Hu P(k)


@pytest.mark.parametrize("kind", ["hmc", "mclmc", "mams"])
@pytest.mark.parametrize("likelihood", ["gaussian", "masked_gaussian", "lognormal_poisson"])
def test_the_mesh_takes_the_shipped_likelihoods(kind, likelihood):
    assert mesh_support(kind, likelihood=likelihood) is None
    assert mesh_support(kind, likelihood=likelihood, sampled_hyperparameters=True) is None


def test_step_size_jitter_is_refused_with_fieldnuts_and_ignored_elsewhere_as_on_one_device():
    """``step_size_jitter`` is an option of fieldnuts only, whose tree the mesh does not
    run (the refusal names the kind and why); the single-device driver ignores it for
    the other kinds, and so does the mesh."""
    reason = mesh_support("fieldnuts", step_size_jitter=0.2)
    assert reason is not None and "tf.while_loop" in reason
    assert mesh_support("hmc", step_size_jitter=0.2) is None


def test_mesh_support_does_not_import_tensorflow():
    """The config validation can ask it before TensorFlow starts."""
    code = "import sys, fieldhmc.mesh_support; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_mesh_sampler_and_target_refuse_with_the_same_reason():
    import numpy as np
    import tensorflow as tf

    from fieldhmc import models
    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.samplers import SamplerSettings
    from fieldhmc.samplers.sharded import ShardedSampler

    grid = models.Grid((8, 8, 8), 100.0)
    model = models.GaussianFieldModel(
        grid, models.PowerLaw(1000.0, -1.5, 0.1), sigma=2.0, dtype=tf.float64
    )
    data = np.zeros(grid.grid_shape)
    with pytest.raises(ValueError, match="sampler.preconditioner=dense"):
        ShardedGaussianTarget(model, data, None, preconditioner="dense")
    target = ShardedGaussianTarget(model, data, None)
    settings = SamplerSettings(kind="fieldnuts", num_chains=2, step_size_jitter=0.1)
    with pytest.raises(ValueError, match=r"^not on a mesh: sampler.kind=fieldnuts"):
        ShardedSampler(target, settings)
