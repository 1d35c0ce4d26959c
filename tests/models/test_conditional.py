"""The conditional parametrisations (``conditional``, ``conditional_scale``) against NumPy."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from fieldhmc.models import ForwardFieldModel, GaussianLikelihood, Grid
from fieldhmc.ops import HermitianPacking, rfft3d
from tests.models.conftest import HYPER_PRIORS, LIKELIHOODS, build_model, make_power

CONDITIONAL = ("conditional", "conditional_scale")


def surrogate_np(reference, model, data, log_amplitude, index, gain=1.0):
    """NumPy ``(s, w, mu)`` of the surrogate, half-spectrum, from the likelihood's
    definition (mask, sigma map or Poisson rate), independently of the model code."""
    lik = reference.likelihood
    shape = reference.grid_shape
    mask = np.ones(shape) if lik.get("mask") is None else lik["mask"]
    if lik["kind"] == "gaussian":
        sigma = np.broadcast_to(lik["sigma"], shape)
        weights = np.where(mask > 0, 1.0 / np.where(mask > 0, sigma, 1.0) ** 2, 0.0)
        weighted = weights * np.where(mask > 0, data, 0.0)
    else:  # Poisson counts: W = nbar m, W d_eff = c - nbar m on observed voxels
        weights = lik["mean_density"] * mask
        weighted = np.where(mask > 0, data - weights, 0.0)
    wbar = weights.mean()
    s = reference.signal_variance(log_amplitude, index)
    w = 1.0 / (1.0 / np.where(s > 0, s, 1.0) + gain**2 * wbar)
    w = np.where(s > 0, w, 0.0)
    mu = w * gain * np.fft.rfftn(weighted, norm="ortho")
    if model.parametrization == "conditional_scale":
        mu = np.zeros_like(mu)
    return s, w, mu


def conditional_log_prob_np(reference, model, field, data, log_amplitude, index):
    """Reference log density of a conditional latent, over the real coordinates:
    :math:`y_j = \\mu_j + \\sqrt{w_{k(j)}} x_j \\sim \\mathcal N(0, s_{k(j)})` plus the
    Jacobian :math:`\\frac12 \\sum_j \\ln w_{k(j)}`; the mean coordinate standard normal."""
    packing = HermitianPacking(reference.grid_shape)
    s, w, mu = surrogate_np(reference, model, data, log_amplitude, index)
    j = packing.mode_of_real
    is_mean = j == 0
    mu_real = packing.real_from_modes(tf.constant(mu)).numpy().reshape(-1)
    x = field.reshape(-1)
    y = mu_real + np.sqrt(w.reshape(-1)[j]) * x
    lp = stats.norm.logpdf(x[is_mean]).sum()
    lp += stats.norm.logpdf(y[~is_mean], 0.0, np.sqrt(s.reshape(-1)[j][~is_mean])).sum()
    lp += 0.5 * np.log(w.reshape(-1)[j][~is_mean]).sum()
    # likelihood and hyperprior: the non-centred reference at the same delta
    x_nc = np.where(is_mean, 0.0, y / np.sqrt(np.where(is_mean, 1.0, s.reshape(-1)[j])))
    reference = copy.copy(reference)
    reference.parametrization = "noncentred"
    nc = reference.log_prob(x_nc.reshape(field.shape), data, log_amplitude, index)
    return lp + nc - stats.norm.logpdf(x_nc).sum()


@pytest.fixture(scope="module", params=[(g, lik) for g in ("even", "odd") for lik in LIKELIHOODS])
def case(request):
    grid_key, likelihood = request.param
    nc, _ = build_model(grid_key, likelihood, "noncentred", True)
    draw = nc.sample(seed=[1, 2], sample_shape=2)
    return grid_key, likelihood, draw


@pytest.mark.parametrize("parametrization", CONDITIONAL)
def test_log_density_matches_numpy(case, parametrization):
    """Target = NumPy reference over the real coordinates (prior of delta, Jacobian
    1/2 sum log w, likelihood), for every likelihood, batched hyperparameters."""
    grid_key, likelihood, draw = case
    model, ref = build_model(grid_key, likelihood, parametrization, True)
    data = draw["data"][0].numpy()
    la, ix = draw["log_amplitude"].numpy(), draw["index"].numpy()
    x = np.random.default_rng(0).standard_normal((2, *model.grid.grid_shape))
    lp = model.target_log_prob_fn(data)(tf.constant(la), tf.constant(ix), tf.constant(x))
    expected = [conditional_log_prob_np(ref, model, x[i], data, la[i], ix[i]) for i in range(2)]
    np.testing.assert_allclose(lp.numpy(), expected, rtol=1e-10)


@pytest.mark.parametrize("parametrization", CONDITIONAL)
def test_latents_round_trip_and_change_of_variables(case, parametrization):
    """latents_from_field inverts the target's field_from_latents; the conditional and
    non-centred targets at the same (theta, delta) differ by the log-Jacobian
    -1/2 sum_j ln(1 + s R^2 W) (independent of delta)."""
    grid_key, likelihood, draw = case
    model, ref = build_model(grid_key, likelihood, parametrization, True)
    nc, _ = build_model(grid_key, likelihood, "noncentred", True)
    data = draw["data"][0].numpy()
    hp = {n: draw[n] for n in model.hyper_names}
    delta = draw["delta"]
    x = model.latents_from_field(delta, data=data, **hp)
    target = model.target_log_prob_fn(data)
    back = target.field_from_latents(hp["log_amplitude"], hp["index"], x)
    np.testing.assert_allclose(back.numpy(), delta.numpy(), atol=1e-10)
    # the driver's P(k) and tracked modes read these, in place of rfft3d(field)
    modes = target.modes_from_latents(hp["log_amplitude"], hp["index"], x).numpy()
    expected = rfft3d(back).numpy()
    np.testing.assert_allclose(modes, expected, atol=1e-12 * np.abs(expected).max())
    lp = target(hp["log_amplitude"], hp["index"], x).numpy()
    lp_nc = nc.target_log_prob_fn(data)(hp["log_amplitude"], hp["index"], draw["field"]).numpy()
    packing = HermitianPacking(model.grid.grid_shape)
    j = packing.mode_of_real[packing.mode_of_real != 0]
    for i in range(2):
        s, w, _ = surrogate_np(ref, model, data, hp["log_amplitude"][i], hp["index"][i])
        log_jac = 0.5 * np.log(w.reshape(-1)[j] / s.reshape(-1)[j]).sum()
        # the non-centred draw's mean coordinate is free, the conditional one is 0
        x0 = draw["field"].numpy()[i].reshape(-1)[packing.mode_of_real == 0]
        np.testing.assert_allclose(lp[i] - lp_nc[i], log_jac + 0.5 * np.sum(x0**2), rtol=1e-9)


def test_conditional_latent_needs_the_data():
    model, _ = build_model("even", "gaussian", "conditional", True)
    draw = model.sample(seed=[3, 4])
    latents = [draw[n][None] for n in model.latent_names]
    with pytest.raises(ValueError, match="given the data"):
        model.field_from_latents(*latents)
    with pytest.raises(ValueError, match="needs data"):
        model.latents_from_field(draw["delta"])
    with pytest.raises(ValueError, match="no joint distribution"):
        model.joint_distribution()
    # the drawn latent is the conditional one: the target maps it to the drawn delta
    target = model.target_log_prob_fn(draw["data"].numpy())
    np.testing.assert_allclose(
        target.field_from_latents(*latents).numpy()[0], draw["delta"].numpy(), atol=1e-10
    )
    # the scale-only form needs no data
    scale_only, _ = build_model("even", "gaussian", "conditional_scale", True)
    scale_only.field_from_latents(*latents)


def test_repinned_target_moves_the_field_map_without_retracing():
    """SBC re-pins one compiled sampler: the mean term follows the pinned data."""
    model, _ = build_model("even", "gaussian_mask_map", "conditional", True)
    a, b = model.sample(seed=[5, 6]), model.sample(seed=[7, 8])
    latents = [a[n][None] for n in model.latent_names]
    target = model.repinnable_target_log_prob_fn(a["data"].numpy())
    field_fn = tf.function(target.field_from_latents, jit_compile=True, autograph=False)
    lp_fn = tf.function(target, jit_compile=True, autograph=False)
    for data in (a["data"].numpy(), b["data"].numpy()):
        target.pin(data)
        fresh = model.target_log_prob_fn(data)
        np.testing.assert_allclose(
            field_fn(*latents).numpy(), fresh.field_from_latents(*latents).numpy(), atol=1e-10
        )
        np.testing.assert_allclose(lp_fn(*latents).numpy(), fresh(*latents).numpy(), rtol=1e-10)
    assert field_fn.experimental_get_tracing_count() == 1
    assert lp_fn.experimental_get_tracing_count() == 1


def test_float32_xla_gradient_is_finite_and_matches_float64():
    m32, _ = build_model("even", "gaussian_mask_map", "conditional", True, dtype=tf.float32)
    m64, _ = build_model("even", "gaussian_mask_map", "conditional", True, dtype=tf.float64)
    draw = m64.sample(seed=[9, 1], sample_shape=3)
    data = draw["data"][0].numpy()
    outs = []
    for m in (m32, m64):
        target = m.target_log_prob_fn(data)

        @tf.function(jit_compile=True, autograph=False)
        def value_and_grad(*latents, target=target):
            with tf.GradientTape() as tape:
                tape.watch(latents)
                lp = target(*latents)
            return lp, tape.gradient(lp, latents)

        outs.append(value_and_grad(*(tf.cast(draw[n], m.dtype) for n in m.latent_names)))
    (lp32, g32), (lp64, g64) = outs
    assert lp32.dtype == tf.float64
    np.testing.assert_allclose(lp32.numpy(), lp64.numpy(), rtol=1e-5)
    for a, b in zip(g32, g64, strict=True):
        assert np.all(np.isfinite(a.numpy()))
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-3, atol=2e-3)


class _LinearBias:
    """``mu = b delta`` with its linear response given as a function of ``b``."""

    def __call__(self, delta, bias):
        # tf.constant, not tf.cast, of a Python float: the cast goes through float32
        bias = tf.cast(bias, delta.dtype) if tf.is_tensor(bias) else tf.constant(bias, delta.dtype)
        return bias * delta

    def linear_gain_fn(self, bias):
        bias = tf.cast(bias, tf.float64) if tf.is_tensor(bias) else tf.constant(bias, tf.float64)
        return tf.reshape(bias, [-1, 1, 1, 1])


@pytest.mark.parametrize("parametrization", CONDITIONAL)
def test_linear_response_from_the_forward_model(parametrization):
    """R_k = b through ``linear_gain_fn(**_forward_params(hp))``: the target equals the
    NumPy reference with gain b, and the fixed-``linear_gain`` path gives the same."""
    grid = Grid((8, 8, 8), (100.0, 100.0, 100.0))
    bias = 1.7
    lik = GaussianLikelihood(grid, 0.4)
    common = dict(parametrization=parametrization, hyper_priors=HYPER_PRIORS, dtype=tf.float64)
    model = ForwardFieldModel(grid, make_power(), lik, _LinearBias(), {"bias": bias}, **common)
    fixed_forward = _LinearBias()
    fixed_forward.linear_gain_fn = None  # the fixed-gain branch
    fixed_forward.linear_gain = bias
    fixed = ForwardFieldModel(grid, make_power(), lik, fixed_forward, {"bias": bias}, **common)
    _, ref = build_model("even", "gaussian", parametrization, True)
    draw = model.sample(seed=[2, 3], sample_shape=2)
    data = draw["data"][0].numpy()
    latents = [draw[n] for n in model.latent_names]
    lp = model.target_log_prob_fn(data)(*latents).numpy()
    np.testing.assert_allclose(fixed.target_log_prob_fn(data)(*latents).numpy(), lp, rtol=1e-12)
    # reference: the conditional latent's prior with gain b, the likelihood of b delta
    la, ix = draw["log_amplitude"].numpy(), draw["index"].numpy()
    packing = HermitianPacking(grid.grid_shape)
    j = packing.mode_of_real
    for i in range(2):
        s = ref.signal_variance(la[i], ix[i])
        w = np.where(s > 0, s / (1.0 + s * bias**2 / 0.16), 0.0)
        mu = w * bias * np.fft.rfftn(data / 0.16, norm="ortho")
        if parametrization == "conditional_scale":
            mu = 0 * mu
        z = packing.modes_from_real(tf.constant(latents[-1][i])).numpy()
        modes = mu + np.sqrt(w) * z
        delta = np.fft.irfftn(modes, s=grid.grid_shape, norm="ortho")
        y = packing.real_from_modes(tf.constant(modes)).numpy().reshape(-1)
        x = latents[-1][i].numpy().reshape(-1)
        m = j != 0
        expected = (
            stats.norm.logpdf(x[~m]).sum()
            + stats.norm.logpdf(y[m], 0.0, np.sqrt(s.reshape(-1)[j[m]])).sum()
            + 0.5 * np.log(w.reshape(-1)[j[m]]).sum()
            + stats.norm.logpdf(data, bias * delta, 0.4).sum()
            + sum(
                stats.norm.logpdf(v[i], HYPER_PRIORS[n].loc, HYPER_PRIORS[n].scale)
                for n, v in (("log_amplitude", la), ("index", ix))
            )
        )
        np.testing.assert_allclose(lp[i], expected, rtol=1e-10)


def test_default_parametrisations_are_unchanged_by_the_data_constants():
    """noncentred / centred targets carry no surrogate constants (bit-identical paths)."""
    for par in ("noncentred", "centred"):
        model, _ = build_model("even", "gaussian", par, True)
        data = model.sample(seed=[1, 1])["data"].numpy()
        assert "surrogate_re" not in model.target_log_prob_fn(data)._data_constants()


def test_latent_wiener_references_refuse_the_conditional_latent():
    """wiener/dense posteriors in latent coordinates assume a data-free latent: refused."""
    from fieldhmc.models import dense_posterior

    grid = Grid((4, 4, 4), (50.0, 50.0, 50.0))
    lik = GaussianLikelihood(grid, 0.4)
    model = ForwardFieldModel(
        grid, make_power(), lik, parametrization="conditional", dtype=tf.float64
    )
    with pytest.raises(ValueError, match="latent depends on the data"):
        dense_posterior(model, np.zeros(grid.grid_shape))


def test_init_posterior_is_the_conditional_draw_in_every_parametrisation():
    """``init_latents("posterior")`` with a forward model whose parameters are sampled
    (the float32 galaxy model at 8³): the fiducial parameters, and the same delta from the
    same seed as the ``conditional`` latent's white-noise draw, mapped to each latent."""
    from fieldhmc import config as cfg
    from fieldhmc import workflow

    path = Path(__file__).resolve().parents[2] / "configs" / "galaxy_clustering_16.yaml"
    models = {
        par: workflow.build_model(
            cfg.load_config(path, ["grid.shape=[8,8,8]", f"model.parametrisation={par}"])
        )
        for par in ("conditional", "noncentred", "centred")
    }
    data = models["conditional"].sample(seed=[4, 2])["data"].numpy()

    def init_delta(model):
        init = model.init_latents("posterior", 3, seed=[7, 1], data=data)
        target = model.target_log_prob_fn(data)
        assert np.all(np.isfinite(target(*init).numpy()))
        hyper = {n: x.numpy() for n, x in zip(model.latent_names, init, strict=True)}
        return hyper, target.field_from_latents(*init).numpy()

    ref_model = models.pop("conditional")
    ref_hyper, expected = init_delta(ref_model)
    assert np.std(expected) > 0
    for name in ref_model.hyper_names:
        fiducial = ref_model.fiducial[name]
        if ref_model.hyper_priors[name].is_bounded:
            fiducial = float(ref_model.hyper_priors[name].unconstrained_np(fiducial))
        np.testing.assert_allclose(ref_hyper[name], fiducial, rtol=1e-6)
    for model in models.values():
        hyper, delta = init_delta(model)
        assert model.hyper_names == ref_model.hyper_names
        for name in model.hyper_names:
            np.testing.assert_array_equal(hyper[name], ref_hyper[name])
        np.testing.assert_allclose(delta, expected, atol=1e-5 * np.abs(expected).max())
