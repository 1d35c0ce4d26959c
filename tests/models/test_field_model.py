"""FieldModel densities vs an independent NumPy implementation, gradients, XLA, sampling."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.models import PARAMETRIZATIONS
from fieldhmc.ops import rfft3d
from tests.models.conftest import LIKELIHOODS, build_model

NUM_CHAINS = 3


def _draw(model, seed=(1, 2)):
    draw = model.sample(seed=list(seed), sample_shape=NUM_CHAINS)
    data = draw["data"][0].numpy()
    latents = [draw[n] for n in model.latent_names]
    return draw, data, latents


def _hypers(model, draw, i):
    la = (
        float(draw["log_amplitude"][i])
        if "log_amplitude" in draw
        else model.fiducial["log_amplitude"]
    )
    n = float(draw["index"][i]) if "index" in draw else model.fiducial["index"]
    return la, n


@pytest.mark.parametrize("sampled", [False, True], ids=["fixed", "sampled"])
@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
@pytest.mark.parametrize("likelihood", LIKELIHOODS)
@pytest.mark.parametrize("grid_key", ["even", "odd"])
def test_log_prob_matches_numpy(grid_key, likelihood, parametrization, sampled):
    model, ref = build_model(grid_key, likelihood, parametrization, sampled)
    draw, data, latents = _draw(model)
    lp = model.target_log_prob_fn(data)(*latents)
    assert lp.dtype == tf.float64
    assert lp.shape == (NUM_CHAINS,)
    expected = [
        ref.log_prob(draw["field"][i].numpy(), data, *_hypers(model, draw, i))
        for i in range(NUM_CHAINS)
    ]
    np.testing.assert_allclose(lp.numpy(), expected, rtol=1e-10)
    # The TFP joint distribution and its pinned posterior agree.
    values = {n: draw[n] for n in model.latent_names}
    jd_lp = model.joint_distribution().log_prob(**values, data=tf.constant(data))
    np.testing.assert_allclose(jd_lp.numpy(), expected, rtol=1e-10)
    pinned = model.posterior(data).unnormalized_log_prob(*latents)
    np.testing.assert_allclose(pinned.numpy(), expected, rtol=1e-10)


@pytest.mark.parametrize("sampled", [False, True], ids=["fixed", "sampled"])
@pytest.mark.parametrize("likelihood", LIKELIHOODS)
@pytest.mark.parametrize("grid_key", ["even", "odd"])
def test_centred_and_noncentred_differ_by_the_jacobian(grid_key, likelihood, sampled):
    nc, ref = build_model(grid_key, likelihood, "noncentred", sampled)
    c, _ = build_model(grid_key, likelihood, "centred", sampled)
    draw, data, _ = _draw(nc, seed=(5, 6))
    v = draw["field"].numpy()
    mode_of_real = nc.packing.mode_of_real
    is_mean = (mode_of_real == 0).reshape(nc.grid.grid_shape)
    u, log_jac = np.empty_like(v), np.empty(NUM_CHAINS)
    for i in range(NUM_CHAINS):
        s = ref.signal_variance(*_hypers(nc, draw, i)).reshape(-1)[mode_of_real]
        var = np.where(is_mean, 1.0, s.reshape(nc.grid.grid_shape))
        u[i] = np.sqrt(var) * v[i]
        log_jac[i] = 0.5 * np.log(var).sum()
    hypers = [draw[n] for n in nc.hyper_names]
    lp_nc = nc.target_log_prob_fn(data)(*hypers, v).numpy()
    lp_c = c.target_log_prob_fn(data)(*hypers, u).numpy()
    np.testing.assert_allclose(lp_c + log_jac, lp_nc, rtol=1e-11)
    # Same fields, same data -> same delta.
    np.testing.assert_allclose(
        nc.field_from_latents(*hypers, v), c.field_from_latents(*hypers, u), atol=1e-12
    )


@pytest.mark.parametrize("sampled", [False, True], ids=["fixed", "sampled"])
@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
@pytest.mark.parametrize("likelihood", LIKELIHOODS)
def test_gradient_matches_directional_finite_difference(likelihood, parametrization, sampled):
    # float64 on a 5x4x3 grid: the central difference is accurate to ~1e-9.
    model, _ = build_model("tiny", likelihood, parametrization, sampled)
    _, data, latents = _draw(model, seed=(3, 4))
    target = model.target_log_prob_fn(data)
    rng = np.random.default_rng(0)
    direction = [tf.constant(rng.normal(size=x.shape)) for x in latents]
    with tf.GradientTape() as tape:
        tape.watch(latents)
        total = tf.reduce_sum(target(*latents))
    grads = tape.gradient(total, latents)
    analytic = sum(float(tf.reduce_sum(g * d)) for g, d in zip(grads, direction, strict=True))
    h = 1e-5
    plus = target(*[x + h * d for x, d in zip(latents, direction, strict=True)])
    minus = target(*[x - h * d for x, d in zip(latents, direction, strict=True)])
    numeric = float(tf.reduce_sum(plus - minus)) / (2 * h)
    assert abs(analytic - numeric) <= 1e-6 * (abs(analytic) + 1.0)


def test_hyperparameter_gradient_logs_no_complex_cast_warning(caplog):
    """The amplitude scales complex modes; a real-to-complex ``tf.cast`` there makes
    TF's Cast gradient log "casting complex64 to float32 ... discard the imaginary part"
    once per trace (it printed in every SBC worker). ``tf.complex`` has a real gradient."""
    import logging

    model, _ = build_model("tiny", "gaussian", "noncentred", sampled=True)
    _, data, latents = _draw(model)
    target = model.target_log_prob_fn(data)
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        with tf.GradientTape() as tape:
            tape.watch(latents)
            total = tf.reduce_sum(target(*latents))
        grads = tape.gradient(total, latents)
        tf.function(lambda *x: tf.gradients(tf.reduce_sum(target(*x)), x))(*latents)
    assert all(g is not None for g in grads)
    assert not [r for r in caplog.records if "casting" in r.getMessage()]


@pytest.mark.parametrize("grid_key", ["even", "odd"])
def test_gradient_gaussian_noncentred_matches_closed_form(grid_key):
    # d/dv log p = -v + T Q^T W (d - Q T v), Q = irfft_ortho . pack orthogonal.
    model, ref = build_model(grid_key, "gaussian_mask_map", "noncentred", False)
    _, data, latents = _draw(model)
    with tf.GradientTape() as tape:
        tape.watch(latents)
        total = tf.reduce_sum(model.target_log_prob_fn(data)(*latents))
    (grad,) = tape.gradient(total, latents)
    v = latents[0].numpy()
    la, n = model.fiducial["log_amplitude"], model.fiducial["index"]
    sqrt_s = np.sqrt(ref.signal_variance(la, n))
    weights = model.noise_weights
    expected = np.empty_like(v)
    for i in range(NUM_CHAINS):
        residual = weights * (data - ref.delta(v[i], la, n))
        modes = sqrt_s * np.fft.rfftn(residual, norm="ortho")
        expected[i] = -v[i] + model.packing.real_from_modes(tf.constant(modes)).numpy()
    np.testing.assert_allclose(grad.numpy(), expected, atol=1e-10)


@pytest.mark.parametrize(
    "likelihood,parametrization",
    [("gaussian_mask_map", "noncentred"), ("poisson_mask", "centred")],
)
def test_float32_under_xla_is_float64_finite_and_close(likelihood, parametrization):
    m32, _ = build_model("even", likelihood, parametrization, True, dtype=tf.float32)
    m64, _ = build_model("even", likelihood, parametrization, True, dtype=tf.float64)
    _, data, latents64 = _draw(m64)
    target32 = m32.target_log_prob_fn(data)

    @tf.function(jit_compile=True)
    def value_and_grad(*latents):
        with tf.GradientTape() as tape:
            tape.watch(latents)
            lp = target32(*latents)
        return lp, tape.gradient(lp, latents)

    latents32 = [tf.cast(x, tf.float32) for x in latents64]
    lp32, grads32 = value_and_grad(*latents32)
    assert lp32.dtype == tf.float64
    lp64 = m64.target_log_prob_fn(data)(*[tf.cast(x, tf.float64) for x in latents32])
    np.testing.assert_allclose(lp32.numpy(), lp64.numpy(), rtol=0, atol=1e-3)
    with tf.GradientTape() as tape:
        x64 = [tf.cast(x, tf.float64) for x in latents32]
        tape.watch(x64)
        lp = m64.target_log_prob_fn(data)(*x64)
    grads64 = tape.gradient(lp, x64)
    for g32, g64 in zip(grads32, grads64, strict=True):
        assert g32.dtype == tf.float32
        assert np.all(np.isfinite(g32.numpy()))
        scale = np.max(np.abs(g64.numpy()))
        np.testing.assert_allclose(g32.numpy(), g64.numpy(), atol=1e-4 * scale)


def test_graph_mode_equals_eager():
    model, _ = build_model("odd", "poisson_mask", "noncentred", True)
    _, data, latents = _draw(model)
    target = model.target_log_prob_fn(data)
    eager = target(*latents)
    graph = tf.function(target)(*latents)
    np.testing.assert_allclose(graph.numpy(), eager.numpy(), rtol=1e-13)


@pytest.mark.parametrize("likelihood", LIKELIHOODS)
def test_sample_shapes_seeds_and_masked_data(likelihood):
    model, _ = build_model("odd", likelihood, "centred", True, dtype=tf.float32)
    a = model.sample(seed=[9, 9], sample_shape=2)
    b = model.sample(seed=[9, 9], sample_shape=2)
    assert set(a) == {"log_amplitude", "index", "field", "delta", "data"}
    for name, shape in zip(model.latent_names, model.latent_event_shapes, strict=True):
        assert tuple(a[name].shape) == (2, *shape)
        assert a[name].dtype == tf.float32
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())
    assert tuple(a["data"].shape) == (2, *model.grid.grid_shape)
    np.testing.assert_allclose(
        a["delta"], model.field_from_latents(*(a[n] for n in model.latent_names)), atol=1e-6
    )
    np.testing.assert_allclose(np.mean(a["delta"].numpy(), axis=(1, 2, 3)), 0.0, atol=1e-6)
    masked = model.mask == 0
    assert np.all(a["data"].numpy()[:, masked] == 0)
    if likelihood.startswith("poisson"):
        counts = a["data"].numpy()
        assert np.all(counts >= 0) and np.all(counts == np.round(counts))
    single = model.sample(seed=[1, 1])
    assert tuple(single["field"].shape) == model.grid.grid_shape


def test_int_seeds_are_reproducible_in_eager_mode():
    # tfp.random.sanitize_seed(int) is stateful in eager mode (TFP 0.25): without
    # fieldhmc.seeds.as_stateless the second call below would draw different data.
    model, _ = build_model("odd", "gaussian", "noncentred", False, dtype=tf.float32)
    a, b = model.sample(seed=11), model.sample(seed=np.int64(11))
    np.testing.assert_array_equal(a["data"].numpy(), b["data"].numpy())
    assert not np.array_equal(a["data"].numpy(), model.sample(seed=12)["data"].numpy())
    x, y = model.init_latents("prior", 2, seed=3), model.init_latents("prior", 2, seed=3)
    np.testing.assert_array_equal(x[0].numpy(), y[0].numpy())
    with pytest.raises(ValueError, match="non-negative"):
        model.sample(seed=-1)


@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
@pytest.mark.parametrize("kind", ["prior", "zeros", "wiener", "posterior"])
def test_init_latents(kind, parametrization):
    model, _ = build_model("odd", "poisson_mask", parametrization, True, dtype=tf.float32)
    _, data, _ = _draw(model)
    init = model.init_latents(kind, 4, seed=[2, 3], data=data)
    jittered = model.init_latents(kind, 4, seed=[2, 3], data=data, jitter=0.1)
    for x, xj, shape in zip(init, jittered, model.latent_event_shapes, strict=True):
        assert tuple(x.shape) == (4, *shape) and x.dtype == tf.float32
        assert np.all(np.isfinite(x.numpy()))
        assert 0.02 < float(tf.math.reduce_std(xj - x)) < 0.5
    if kind != "prior":
        for name, x in zip(model.latent_names, init, strict=True):
            if name != "field":
                np.testing.assert_allclose(x.numpy(), model.fiducial[name], rtol=1e-6)
    if kind == "zeros":
        assert np.all(init[-1].numpy() == 0)
    if kind == "wiener":
        assert float(tf.reduce_max(tf.abs(init[-1]))) > 0
    if kind == "posterior":  # one draw per chain (the latent's mean-mode coordinate is 0)
        assert np.sum(tf.math.reduce_std(init[-1], axis=0).numpy() == 0) <= 1
    lp = model.target_log_prob_fn(data)(*init)
    assert np.all(np.isfinite(lp.numpy()))


def test_init_latents_bad_inputs():
    model, _ = build_model("odd", "gaussian", "noncentred", False)
    with pytest.raises(ValueError, match="init kind"):
        model.init_latents("bogus", 2, seed=1)
    for kind in ("wiener", "posterior"):
        with pytest.raises(ValueError, match="needs data"):
            model.init_latents(kind, 2, seed=1)
    with pytest.raises(ValueError, match="num_chains"):
        model.init_latents("zeros", 0, seed=1)


@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
def test_latents_from_field_inverts_field_from_latents(parametrization):
    model, _ = build_model("odd", "gaussian", parametrization, True)
    draw, _, latents = _draw(model)
    delta = model.field_from_latents(*latents)
    field = model.latents_from_field(
        delta, log_amplitude=draw["log_amplitude"], index=draw["index"]
    )
    expected = np.where(model._is_mean_coordinate, 0.0, draw["field"].numpy())
    np.testing.assert_allclose(field.numpy(), expected, atol=1e-10)


@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
@pytest.mark.parametrize("hyper", [False, True])
def test_modes_from_latents_is_the_rfft_of_the_field(parametrization, hyper):
    """The sampler's per-draw P(k) and tracked modes read modes_from_latents in place of
    rfft3d(field_from_latents): the same modes, on an odd grid and an even one (with its
    self-paired Nyquist planes), with sampled (log A, n) or not."""
    for grid_key in ("odd", "even"):
        model, _ = build_model(grid_key, "gaussian", parametrization, hyper)
        _, _, latents = _draw(model)
        expected = rfft3d(model.field_from_latents(*latents)).numpy()
        got = model.modes_from_latents(*latents).numpy()
        scale = np.abs(expected).max()
        np.testing.assert_allclose(got, expected, atol=1e-12 * scale)


@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
@pytest.mark.parametrize("hyper", [False, True])
def test_packed_modes_scale_packs_modes_from_latents(parametrization, hyper):
    """The per-draw P(k)'s shortcut: with nothing sampled but the field (and no data in
    the latent) the packed modes of modes_from_latents are the field latent times a
    fixed scale; otherwise there is no such scale (None), on odd and even grids."""
    for grid_key in ("odd", "even"):
        model, _ = build_model(grid_key, "gaussian", parametrization, hyper)
        scale = model.packed_modes_scale()
        if hyper or model.has_data_in_latent:
            assert scale is None
            continue
        _, _, latents = _draw(model)
        modes = model.modes_from_latents(*latents)
        expected = model.packing.real_from_modes(modes).numpy()
        got = (scale * latents[list(model.latent_names).index("field")]).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12 * np.abs(expected).max())


def test_wrong_number_of_latents():
    model, _ = build_model("odd", "gaussian", "noncentred", True)
    _, data, latents = _draw(model)
    with pytest.raises(ValueError, match="expected 3 latents"):
        model.target_log_prob_fn(data)(latents[-1])


def test_float32_joint_distribution_log_prob_agrees_with_target():
    model, _ = build_model("odd", "poisson_mask", "centred", True, dtype=tf.float32)
    draw, data, latents = _draw(model)
    jd_lp = model.joint_distribution().log_prob(
        **{n: draw[n] for n in model.latent_names}, data=tf.constant(data, tf.float32)
    )
    assert jd_lp.dtype == tf.float32
    target = model.target_log_prob_fn(data)(*latents)
    np.testing.assert_allclose(jd_lp.numpy(), target.numpy(), rtol=1e-5)


@pytest.mark.parametrize("parametrization", PARAMETRIZATIONS)
def test_poisson_precision_diag_uses_nbar_times_mean_mask(parametrization):
    model, ref = build_model("odd", "poisson_mask", parametrization, False)
    w = 3.0 * ref.likelihood["mask"].mean()
    assert model.noise_precision_mean == pytest.approx(w)
    s = ref.signal_variance(model.fiducial["log_amplitude"], model.fiducial["index"])
    s_real = s.reshape(-1)[model.packing.mode_of_real].reshape(model.grid.grid_shape)
    is_mean = model.packing.mode_of_real.reshape(model.grid.grid_shape) == 0
    diag = model.posterior_precision_diag()
    if parametrization == "noncentred":
        np.testing.assert_allclose(diag, 1.0 + s_real * w)
        np.testing.assert_allclose(model.prior_precision_diag(), 1.0)
    else:
        np.testing.assert_allclose(diag[~is_mean], 1.0 / s_real[~is_mean] + w)
        np.testing.assert_allclose(model.prior_precision_diag()[~is_mean], 1.0 / s_real[~is_mean])
    assert np.all(diag[is_mean] == 1.0)


@pytest.mark.parametrize("likelihood", ["gaussian_mask_map", "poisson_mask"])
@pytest.mark.parametrize("parametrization", ["noncentred", "conditional"])
def test_log_prob_and_field_is_the_call_and_the_field(likelihood, parametrization):
    """``PinnedTarget.log_prob_and_field``: the target's value and ``field_from_latents``
    from one evaluation (what mclmc's stored fields read), with sampled P(k) parameters;
    a model whose likelihood reads the modes (a forward model's ``from_modes``) makes no
    field and says so."""
    from fieldhmc import models
    from tests.models import user_forward
    from tests.models.conftest import make_power

    model, _ = build_model("even", likelihood, parametrization, sampled=True)
    draw = model.sample(seed=[3, 4], sample_shape=3)
    target = model.target_log_prob_fn(draw["data"][0])
    latents = model.init_latents("prior", 3, seed=[5, 6])
    assert target.computes_field
    lp, field = target.log_prob_and_field(*latents)
    np.testing.assert_allclose(lp.numpy(), target(*latents).numpy(), rtol=1e-12)
    np.testing.assert_allclose(
        field.numpy(), target.field_from_latents(*latents).numpy(), rtol=1e-12, atol=1e-12
    )
    grid = models.Grid((6, 6, 6), 60.0)
    forward = user_forward.biased_tracer_with_modes
    with_modes = models.ForwardFieldModel(
        grid,
        make_power(),
        models.GaussianLikelihood(grid, 0.3),
        forward,
        {"bias": 1.7, "smoothing_cells": 0.8},
        check_forward=False,
    )
    other = with_modes.target_log_prob_fn(with_modes.sample(seed=[5, 6])["data"])
    assert not other.computes_field
    with pytest.raises(ValueError, match="does not make the field"):
        other.log_prob_and_field(*with_modes.init_latents("prior", 2, seed=[7, 8]))
