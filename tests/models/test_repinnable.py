"""FieldModel.log_likelihood_fn and RepinnableTarget (one compiled target, many data sets)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tests.models.conftest import LIKELIHOODS, build_model


def _two_data_sets(model):
    a = model.sample(seed=[1, 2], sample_shape=3)
    b = model.sample(seed=[3, 4])
    return a, a["data"][0].numpy(), b["data"].numpy()


@pytest.mark.parametrize("likelihood", LIKELIHOODS)
def test_log_likelihood_carries_all_the_data_dependence(likelihood):
    model, ref = build_model("even", likelihood, "noncentred", True)
    draw, data1, data2 = _two_data_sets(model)
    latents = [draw[n] for n in model.latent_names]
    hp = {n: draw[n] for n in model.hyper_names}
    delta = draw["delta"]
    lik1 = model.log_likelihood_fn(data1)(delta, **hp).numpy()
    lik2 = model.log_likelihood_fn(data2)(delta, **hp).numpy()
    lp1 = model.target_log_prob_fn(data1)(*latents).numpy()
    lp2 = model.target_log_prob_fn(data2)(*latents).numpy()
    assert lik1.shape == (3,) and np.all(np.isfinite(lik1))
    np.testing.assert_allclose(lp1 - lp2, lik1 - lik2, rtol=1e-9, atol=1e-6)
    if likelihood == "gaussian":
        sigma = np.broadcast_to(ref.likelihood["sigma"], data1.shape)
        expected = [stats.norm.logpdf(data1, d, sigma).sum() for d in delta.numpy()]
        np.testing.assert_allclose(lik1, expected, rtol=1e-9)
    with pytest.raises(ValueError, match="hyperparameters"):
        model.log_likelihood_fn(data1)(delta)


@pytest.mark.parametrize("likelihood", LIKELIHOODS)
def test_repinned_target_equals_a_fresh_one_without_retracing(likelihood):
    model, _ = build_model("even", likelihood, "noncentred", True)
    draw, data1, data2 = _two_data_sets(model)
    latents = [draw[n] for n in model.latent_names]
    target = model.repinnable_target_log_prob_fn(data1)
    # XLA (as in the sampler) for one likelihood; graph mode for the others (cheaper).
    compiled = tf.function(target, jit_compile=likelihood == "gaussian", autograph=False)
    np.testing.assert_allclose(
        compiled(*latents).numpy(), model.target_log_prob_fn(data1)(*latents).numpy(), rtol=1e-6
    )
    target.pin(data2)
    np.testing.assert_allclose(
        compiled(*latents).numpy(), model.target_log_prob_fn(data2)(*latents).numpy(), rtol=1e-6
    )
    assert compiled.experimental_get_tracing_count() == 1
    with pytest.raises(ValueError):
        target.pin(data2[:4])
