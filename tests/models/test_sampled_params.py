"""Sampled forward-model parameters: priors, unconstrained coordinates, plumbing, CLI."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from scipy import integrate, special, stats

from fieldhmc import models
from tests.models import user_forward

ROOT = Path(__file__).resolve().parents[2]

PRIORS = {
    "normal": models.NormalPrior(1.2, 0.3),
    "truncated_both": models.TruncatedNormalPrior(1.0, 0.4, low=0.5, high=1.3),
    "truncated_low": models.TruncatedNormalPrior(1.5, 0.5, low=0.0),
    "truncated_high": models.TruncatedNormalPrior(-0.2, 1.0, high=0.3),
    "truncated_tail": models.TruncatedNormalPrior(0.0, 1.0, low=3.0, high=6.0),
    "uniform": models.UniformPrior(0.5, 1.5),
}


def _reference_log_density_u(prior, u: np.ndarray) -> np.ndarray:
    """NumPy/SciPy: log p_theta(T(u)) + log|T'(u)|, T written independently here."""
    lo, hi = prior.low, prior.high
    if math.isfinite(lo) and math.isfinite(hi):
        s = special.expit(u)
        theta = lo + (hi - lo) * s
        log_jac = np.log((hi - lo) * s * (1.0 - s))
    elif math.isfinite(lo):
        theta, log_jac = lo + np.exp(u), u
    elif math.isfinite(hi):
        theta, log_jac = hi - np.exp(u), u
    else:
        theta, log_jac = u, np.zeros_like(u)
    if isinstance(prior, models.UniformPrior):
        ref = stats.uniform(lo, hi - lo)
    elif isinstance(prior, models.TruncatedNormalPrior):
        ref = stats.truncnorm((lo - prior.loc) / prior.scale, (hi - prior.loc) / prior.scale,
                              loc=prior.loc, scale=prior.scale)  # fmt: skip
    else:
        ref = stats.norm(prior.loc, prior.scale)
    return ref.logpdf(theta) + log_jac, ref


@pytest.mark.parametrize("key", list(PRIORS))
def test_latent_log_density_matches_scipy_and_integrates_to_one(key):
    prior = PRIORS[key]
    u = np.linspace(-4.0, 4.0, 41) if prior.is_bounded else np.linspace(0.0, 2.5, 41)
    ref, _ = _reference_log_density_u(prior, u)
    got = prior.log_prob_latent(tf.constant(u, tf.float64)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)
    # the joint model's (TFP) latent distribution has the same density
    tfp_lp = prior.latent_distribution(tf.float64, "p").log_prob(u).numpy()
    np.testing.assert_allclose(tfp_lp, ref, rtol=1e-8, atol=1e-8)
    # the Jacobian is exact: the latent density integrates to 1 over the real line
    mass, _ = integrate.quad(
        lambda x: math.exp(float(prior.log_prob_latent(tf.constant([x], tf.float64))[0])),
        -np.inf,
        np.inf,
        limit=200,
    )
    assert abs(mass - 1.0) < 1e-6
    # the transform round-trips and the fiducial value lies inside the support
    theta = prior.physical_np(u)
    np.testing.assert_allclose(prior.unconstrained_np(theta), u, atol=1e-8)
    np.testing.assert_allclose(prior.physical(tf.constant(u)).numpy(), theta, rtol=1e-12)
    assert prior.low < prior.fiducial < prior.high


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: models.NormalPrior(0.0, 0.0), "scale must be positive"),
        (lambda: models.NormalPrior(np.nan, 1.0), "loc must be finite"),
        (lambda: models.TruncatedNormalPrior(1.0, 1.0, low=2.0, high=1.0), "out of order"),
        (lambda: models.TruncatedNormalPrior(1.0, 1.0), "needs a finite low or high"),
        (lambda: models.TruncatedNormalPrior(0.0, 1e-3, low=100.0), "hold no mass"),
        (lambda: models.UniformPrior(1.0, 1.0), "out of order"),
        (lambda: models.UniformPrior(0.0, np.inf), "high must be finite"),
    ],
)
def test_bad_priors_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# --- a Zel'dovich model with growth and bias sampled --------------------------------------
GRID = models.Grid((8, 8, 8), 64.0)
POWER = models.PowerLaw(1000.0, -1.5, 0.1)
GROWTH = models.UniformPrior(0.6, 1.4)
BIAS = models.TruncatedNormalPrior(1.5, 0.4, low=0.5)


def _zeldovich_model(dtype=tf.float64, parametrization="noncentred", **priors):
    priors = priors or {"growth": GROWTH, "bias": BIAS}
    return models.GaussianFieldModel(
        GRID,
        POWER,
        0.2,
        forward=models.ZeldovichForward(GRID),
        forward_params=priors,
        parametrization=parametrization,
        dtype=dtype,
    )


@pytest.fixture(scope="module")
def za_model():
    return _zeldovich_model()


def test_latent_order_fiducials_and_physical_values(za_model):
    assert za_model.latent_names == ("growth", "bias", "field")
    assert za_model.param_names == ("growth", "bias") and za_model.power_hyper_names == ()
    assert za_model.fiducial["growth"] == 1.0 and za_model.fiducial["bias"] == 1.5
    zeros = za_model.init_latents("zeros", 2, seed=[1, 2])
    _, hp = za_model._unpack(zeros)
    np.testing.assert_allclose(hp["growth"].numpy(), [1.0, 1.0])
    np.testing.assert_allclose(hp["bias"].numpy(), [1.5, 1.5])
    phys = za_model.physical_parameters({"growth": np.array([-30.0, 0.0]), "bias": [-40.0, 0.0]})
    assert 0.6 <= phys["growth"].min() and phys["bias"].min() >= 0.5  # never outside


@pytest.mark.parametrize(
    "parametrization", ["noncentred", "centred", "conditional", "conditional_scale"]
)
def test_target_is_prior_with_jacobian_plus_the_fixed_parameter_model(parametrization):
    """target(u_D, u_b, x) == log p_u(u_D) + log p_u(u_b) (SciPy) + the target of the model
    with D and b fixed at T(u) (the pre-existing code path), one chain at a time. For the
    conditional parametrisations this also checks that the surrogate's linear response
    (D b times the Zel'dovich gain) reads the physical values of the sampled D and b."""
    model = _zeldovich_model(parametrization=parametrization)
    draw = model.sample(seed=[3, 4])
    latents = model.init_latents("prior", 2, seed=[5, 6])
    got = model.target_log_prob_fn(draw["data"])(*latents).numpy()
    if not model.is_conditional:  # the TFP model has no data-dependent latent
        joint = model.joint_distribution().log_prob(*latents, tf.stack([draw["data"]] * 2))
        np.testing.assert_allclose(joint.numpy(), got, rtol=1e-10)
    for c in range(2):
        u_d, u_b = float(latents[0][c]), float(latents[1][c])
        d, b = GROWTH.physical_np(u_d), BIAS.physical_np(u_b)
        fixed = models.GaussianFieldModel(
            GRID,
            POWER,
            0.2,
            forward=models.ZeldovichForward(GRID, growth=float(d), bias=float(b)),
            parametrization=parametrization,
            dtype=tf.float64,
        )
        base = fixed.target_log_prob_fn(draw["data"])(latents[2][c : c + 1]).numpy()[0]
        prior = (
            _reference_log_density_u(GROWTH, np.array(u_d))[0]
            + _reference_log_density_u(BIAS, np.array(u_b))[0]
        )
        np.testing.assert_allclose(got[c], base + prior, rtol=1e-9)


def test_gradients_are_finite_and_match_finite_differences(za_model):
    data = za_model.sample(seed=[7, 8])["data"]
    target = za_model.target_log_prob_fn(data)
    latents = [tf.constant(v) for v in za_model.init_latents("prior", 2, seed=[9, 10])]
    with tf.GradientTape() as tape:
        tape.watch(latents)
        lp = tf.reduce_sum(target(*latents))
    grads = tape.gradient(lp, latents)
    assert all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)
    for i in (0, 1):  # growth, bias (per chain)
        for c in range(2):
            h = 1e-5
            step = tf.one_hot(c, 2, dtype=tf.float64) * h
            up = [v + step if j == i else v for j, v in enumerate(latents)]
            down = [v - step if j == i else v for j, v in enumerate(latents)]
            fd = (target(*up)[c] - target(*down)[c]).numpy() / (2 * h)
            np.testing.assert_allclose(grads[i][c].numpy(), fd, rtol=1e-6, atol=1e-6)
    # and along a random direction of the field (the forward model's own gradient)
    v = tf.random.stateless_normal(latents[2].shape, [1, 1], dtype=tf.float64)
    h = 1e-6
    fd = (
        tf.reduce_sum(target(latents[0], latents[1], latents[2] + h * v))
        - tf.reduce_sum(target(latents[0], latents[1], latents[2] - h * v))
    ).numpy() / (2 * h)
    np.testing.assert_allclose(tf.reduce_sum(grads[2] * v).numpy(), fd, rtol=1e-6)


def test_prior_draws_follow_the_stated_priors(za_model):
    """KS tests of init_latents('prior') and joint_distribution draws (physical values)
    against SciPy's distributions; the mean's z-score too."""
    n = 4000
    inits = za_model.init_latents("prior", n, seed=[11, 12])
    joint = za_model.joint_distribution().sample(n, seed=[13, 14])
    for latent in (inits[:2], (joint.growth, joint.bias)):
        values = za_model.physical_parameters(
            {"growth": latent[0].numpy(), "bias": latent[1].numpy()}
        )
        for name, prior in (("growth", GROWTH), ("bias", BIAS)):
            ref = prior.scipy()
            assert stats.kstest(values[name], ref.cdf).pvalue > 1e-3, name
            z = (values[name].mean() - ref.mean()) / (ref.std() / math.sqrt(n))
            assert abs(z) < 4.0, (name, z)


def test_the_user_function_receives_chain_tensors():
    user_forward.CALLS.clear()
    model = models.GaussianFieldModel(
        GRID,
        POWER,
        0.3,
        forward=user_forward.records_its_params,
        forward_params={"bias": models.NormalPrior(2.0, 0.1), "offset": 0.25},
        dtype=tf.float32,
    )
    assert model.latent_names == ("bias", "field")
    user_forward.CALLS.clear()
    latents = model.init_latents("prior", 3, seed=[1, 2])
    data = model.sample(seed=[3, 4])["data"]
    user_forward.CALLS.clear()
    model.target_log_prob_fn(data)(*latents)
    (bias, offset), *_ = user_forward.CALLS
    assert isinstance(bias, tf.Tensor) and bias.shape == (3,) and bias.dtype == tf.float32
    np.testing.assert_array_equal(bias.numpy(), latents[0].numpy())  # Normal: u == theta
    assert offset == 0.25  # a fixed parameter is passed as given
    # predict and the data simulation pass the sampled values too
    user_forward.CALLS.clear()
    delta = model.field_from_latents(*latents)
    model.predict(delta, {"bias": tf.constant([1.0, 2.0, 3.0])})
    assert user_forward.CALLS[0][0].shape == (3,)


def test_a_sampled_parameter_the_function_ignores_is_refused():
    with pytest.raises(models.ForwardModelError, match="does not depend on the sampled parameter"):
        models.GaussianFieldModel(
            GRID,
            POWER,
            0.3,
            forward=user_forward.ignores_its_bias,
            forward_params={"bias": models.NormalPrior(1.0, 0.1)},
        )


def test_zeldovich_per_chain_growth_and_bias_equal_the_fixed_models():
    delta = tf.random.stateless_normal([2, *GRID.grid_shape], [2, 3], dtype=tf.float64) * 0.5
    growth, bias = tf.constant([0.7, 1.3], tf.float64), tf.constant([1.1, 2.0], tf.float64)
    za = models.ZeldovichForward(GRID, smoothing=3.0)
    batched = za(delta, growth=growth, bias=bias).numpy()
    from_modes = za.from_modes(tf.signal.rfft3d(delta), growth=growth, bias=bias).numpy()
    gains = za.linear_gain_fn(growth=growth, bias=bias).numpy()
    assert gains.shape == (2, *GRID.modes_shape) and gains.dtype == np.float64
    for c in range(2):
        fixed = models.ZeldovichForward(
            GRID, growth=float(growth[c]), smoothing=3.0, bias=float(bias[c])
        )
        expected = fixed(delta[c : c + 1]).numpy()[0]
        np.testing.assert_allclose(batched[c], expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(from_modes[c], expected, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(gains[c], fixed.linear_gain, rtol=1e-14)
    np.testing.assert_array_equal(za.linear_gain_fn().numpy(), za.linear_gain)
    # the bias multiplies the prediction; growth 0 gives zero
    unbiased = models.ZeldovichForward(GRID, growth=0.9)(delta).numpy()
    biased = models.ZeldovichForward(GRID, growth=0.9, bias=2.5)(delta).numpy()
    np.testing.assert_allclose(biased, 2.5 * unbiased, rtol=1e-14)


def test_forward_params_merge_fixed_and_sampled(za_model):
    params = za_model._forward_params({"growth": tf.constant([0.8, 0.9], tf.float64)})
    assert set(params) == {"growth", "bias"}
    assert params["bias"].numpy() == 1.5  # missing from hp: the fiducial value
    assert params["growth"].shape == (2,) and params["growth"].dtype == tf.float64
    np.testing.assert_allclose(za_model.linear_gain, za_model.forward.linear_gain_fn(
        growth=1.0, bias=1.5).numpy())  # fmt: skip


# --- config and CLI ---------------------------------------------------------------------
BAD_CONFIGS = {
    "model.forward.growth.prior.scale": "{kind: zeldovich, growth: {sample: true, prior: "
    "{kind: normal, loc: 1.0, scale: 0.0}}}",
    "model.forward.bias.prior.high": "{kind: zeldovich, bias: {sample: true, prior: "
    "{kind: truncated_normal, loc: 1.0, scale: 0.5, low: 2.0, high: 1.0}}}",
    "model.forward.bias.prior.high ": "{kind: zeldovich, bias: {sample: true, prior: "
    "{kind: uniform, low: 1.0, high: 1.0}}}",
    "model.forward.growth.prior.loc": "{kind: zeldovich, growth: {sample: true, prior: "
    "{kind: normal, loc: .nan, scale: 1.0}}}",
    "model.forward.bias.prior.low": "{kind: zeldovich, bias: {sample: true, prior: "
    "{kind: truncated_normal, loc: 0.0, scale: 0.001, low: 100.0}}}",
    "model.forward.params.gain": '{kind: python, target: "tests.models.user_forward:'
    'biased_tracer", params: {gain: {sample: true, prior: {kind: normal, loc: 1, scale: 1}}}}',
    "model.forward.params.bias.prior.high": '{kind: python, target: "tests.models.user_forward:'
    'biased_tracer", params: {bias: {sample: true, prior: {kind: uniform, low: 2, high: 1}}}}',
}


def _config_text(forward: str) -> str:
    return textwrap.dedent(
        f"""
        grid: {{shape: [8, 8, 8], box_size: 64.0}}
        model:
          forward: {forward}
          likelihood: {{kind: gaussian, sigma: 0.3}}
        data: {{source: simulate, seed: 1}}
        sampler: {{kind: hmc, num_chains: 2, num_burnin_steps: 10, num_results: 12,
                   num_leapfrog_steps: 4, chunk_size: 6}}
        outputs: {{store_fields: true, field_thin: 2, tracked_modes: 2}}
        """
    )


def test_bad_input_exits_2_in_one_line_before_tensorflow(tmp_path):
    """In a fresh interpreter: each bad config fails validate and run with exit 2, one
    line naming the key, in under 2 CPU s, and TensorFlow is never imported."""
    files = []
    for i, (key, forward) in enumerate(BAD_CONFIGS.items()):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(_config_text(forward))
        files.append((key.strip(), str(path)))
    script = textwrap.dedent(
        f"""
        import sys, time
        from fieldhmc import cli
        for key, path in {files!r}:
            for command in (["validate", path], ["run", path, "--out", path + ".out"]):
                # CPU seconds, not wall: a loaded box stretches the wall time, and
                # importing TensorFlow alone takes ~5 CPU s
                start = time.process_time()
                code = cli.main(command)
                seconds = time.process_time() - start
                assert code == 2, (key, code)
                assert seconds < 2.0, (key, seconds)
        assert "tensorflow" not in sys.modules
        print("no-tensorflow")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "no-tensorflow" in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 * len(files), lines
    for (key, _), line in zip([item for item in files for _ in range(2)], lines, strict=True):
        assert line.startswith(f"config error: {key}: "), (key, line)
    assert "does not accept the sampled parameter 'gain'" in lines[-4]
    assert not any(Path(p + ".out").exists() for _, p in files)


def test_config_forms_round_trip_and_name_order(tmp_path):
    from fieldhmc.config import config_from_dict

    forward = {
        "kind": "zeldovich",
        "growth": {"sample": True, "prior": {"kind": "uniform", "low": 0.5, "high": 1.5}},
        "bias": {"prior": {"kind": "truncated_normal", "loc": 1.5, "scale": 0.3, "low": 0.0}},
    }
    config = config_from_dict(
        {"model": {"forward": forward, "hyperparameters": {"index": {"sample": True}}}}, tmp_path
    )
    assert config.model.sampled_parameter_names == ("index", "growth", "bias")
    assert config_from_dict(config.to_dict(), tmp_path) == config
    assert "sampling index+growth+bias" in config.summary()
    fixed = dict(forward, growth=0.9, bias={**forward["bias"], "sample": False})
    config = config_from_dict({"model": {"forward": fixed}}, tmp_path)
    assert config.model.sampled_parameter_names == ()
    from fieldhmc import workflow

    model = workflow.build_model(config)
    assert model.latent_names == ("field",)
    assert (model.forward.growth, model.forward.bias) == (0.9, 1.5)  # bias: the prior's loc


def test_cli_run_exports_physical_values_and_reports_them(tmp_path):
    """8³ Zel'dovich run with growth (uniform) and bias (truncated Normal) sampled: samples.nc
    holds their physical values (inside the bounds), the report and trace plot list them."""
    import arviz as az

    from fieldhmc import cli

    forward = (
        "{kind: zeldovich, growth: {sample: true, prior: {kind: uniform, low: 0.6, high: 1.4}}, "
        "bias: {sample: true, prior: {kind: truncated_normal, loc: 1.5, scale: 0.4, low: 0.5}}}"
    )
    path = tmp_path / "za.yaml"
    path.write_text(_config_text(forward))
    out = tmp_path / "run"
    assert cli.main(["-q", "run", str(path), "--out", str(out)]) == 0
    idata = az.from_netcdf(str(out / "samples.nc"))
    growth = idata.posterior["growth"].values
    bias = idata.posterior["bias"].values
    assert growth.shape == (2, 12) and ((growth > 0.6) & (growth < 1.4)).all()
    assert (bias > 0.5).all()
    from fieldhmc.samplers import read_traces

    u = read_traces(out / "traces.h5")["growth"].reshape(-1)  # the traces hold the latents
    np.testing.assert_allclose(np.sort(GROWTH.physical_np(u)), np.sort(growth.reshape(-1)), 1e-6)
    report = (out / "report.txt").read_text()
    assert "growth" in report and "bias" in report
    assert (out / "plots" / "traces.png").exists() and (out / "plots" / "corner.png").exists()


@pytest.mark.parametrize("parametrization", ["conditional", "conditional_scale"])
def test_xla_gradient_of_sampled_parameters_is_finite_under_the_conditional_forms(
    parametrization,
):
    """Compiled with XLA (as the sampler runs it), the gradient with respect to the
    sampled D and b equals the eager one: sqrt(w) at the mean mode (w = 0) gave NaN for
    both under XLA, so every transition diverged (float32, the field latent at zero)."""
    model = _zeldovich_model(dtype=tf.float32, parametrization=parametrization)
    data = model.sample(seed=[3, 4])["data"]
    target = model.target_log_prob_fn(data)
    latents = [tf.cast(v, tf.float32) for v in model.init_latents("zeros", 2, seed=[5, 6])]

    def value_and_gradient(*x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            lp = target(*x)
        return lp, tape.gradient(lp, x)

    eager = value_and_gradient(*latents)
    compiled = tf.function(value_and_gradient, jit_compile=True)(*latents)
    for got, want in zip(compiled[1], eager[1], strict=True):
        assert np.all(np.isfinite(got.numpy()))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
