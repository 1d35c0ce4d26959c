"""The galaxy-clustering model (issue 29): E&H prior with sampled Omega_m and sigma8,
2LPT + RSD + Lagrangian bias + CIC with the growth from the sampled Omega_m, Gaussian shot
noise, the conditional parametrisation with the lattice model's linear response.

* the whole log density's gradient (float64) against central finite differences along
  random directions and with respect to every sampled parameter;
* the pieces it is made of against independent references: the growth plumbed into the
  forward model (growth_factors at the sampled Omega_m), the prior's s_k(theta) (the E&H
  spectrum at those values), the linear response (measured on the forward model);
* outside the physical domain: log density -inf, every gradient finite, and an HMC chain
  started at the edge rejects the proposals that leave it, never NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from fieldhmc import models
from fieldhmc.models.cosmology import (
    PLANCK18,
    CosmologicalPower,
    growth_factors,
    linear_power,
)
from fieldhmc.models.galaxy_clustering import GalaxyClusteringForward
from tests.load_script import load_script

SHAPE = (8, 8, 8)
BOX = 320.0
NBAR = 1e-3
PARAMS = ("Omega_m", "sigma8", "b1", "b2", "bs2", "bnabla2")
# RK4 steps of the growth: few, so eager and graph-mode evaluations stay quick (what is
# tested here does not depend on the integration's accuracy; test_cosmology does that)
STEPS = 16


def _priors():
    tn, normal = models.TruncatedNormalPrior, models.NormalPrior
    hyper = {"Omega_m": tn(0.3111, 0.2, 0.05, 1.0), "sigma8": tn(0.8102, 0.2, 0.05)}
    forward = {
        "b1": normal(1.0, 0.5),
        "b2": normal(0.0, 2.0),
        "bs2": normal(0.0, 2.0),
        "bnabla2": normal(0.0, 2.0),
    }
    return hyper, forward


def _model(parametrization="conditional", hyper=None, dtype=tf.float64):
    grid = models.Grid(SHAPE, BOX)
    power = CosmologicalPower(0.3111, 0.8102)
    forward = GalaxyClusteringForward(
        grid, a_obs=0.5, omega_m=0.3111, los_axis=2, num_growth_steps=STEPS
    )
    default_hyper, forward_priors = _priors()
    sigma = 1.0 / np.sqrt(NBAR * grid.volume / grid.num_cells)
    return models.GaussianFieldModel(
        grid,
        power,
        sigma,
        forward=forward,
        forward_params=forward_priors,
        hyper_priors=default_hyper if hyper is None else hyper,
        parametrization=parametrization,
        dtype=dtype,
    )


@pytest.fixture(scope="module")
def conditional():
    """A float64 conditional model, its data, target and a prior draw (eager: a
    tf.function's first call takes ~25 s to build here, an eager call under 1 s)."""
    model = _model()
    draw = model.sample(seed=3)
    target = model.target_log_prob_fn(draw["data"])
    latents = tuple(draw[n][None] for n in model.latent_names)
    with tf.GradientTape() as tape:
        tape.watch(latents)
        lp = target(*latents)
    grads = tape.gradient(lp, latents)
    return model, draw, target, (lp, grads), latents


def test_latents_and_plumbing(conditional):
    model, *_ = conditional
    assert model.latent_names == (*PARAMS, "field")
    assert model.power_hyper_names == ("Omega_m", "sigma8")
    assert model.param_names == ("b1", "b2", "bs2", "bnabla2")
    assert model.forward_power_names == ("Omega_m",)


def test_gradient_matches_finite_differences_along_random_directions(conditional):
    _, _, fn, (_, grads), latents = conditional
    rng = np.random.default_rng(0)
    h = 1e-6
    for _ in range(3):
        direction = [rng.standard_normal(np.shape(x)) for x in latents]
        plus = [x + h * d for x, d in zip(latents, direction, strict=True)]
        minus = [x - h * d for x, d in zip(latents, direction, strict=True)]
        fd = (float(fn(*plus)[0]) - float(fn(*minus)[0])) / (2 * h)
        exact = sum(float(np.sum(g * d)) for g, d in zip(grads, direction, strict=True))
        assert fd == pytest.approx(exact, rel=1e-5), (fd, exact)


@pytest.mark.parametrize("name", PARAMS)
def test_gradient_wrt_each_sampled_parameter(conditional, name):
    model, _, fn, (_, grads), latents = conditional
    i = model.latent_names.index(name)
    h = 1e-6
    plus, minus = list(latents), list(latents)
    plus[i] = latents[i] + h
    minus[i] = latents[i] - h
    fd = (float(fn(*plus)[0]) - float(fn(*minus)[0])) / (2 * h)
    exact = float(grads[i][0])
    assert np.isfinite(exact) and exact != 0.0
    assert fd == pytest.approx(exact, rel=1e-5, abs=1e-6), (name, fd, exact)


def test_forward_growth_follows_the_sampled_omega_m():
    """The prediction at a sampled Omega_m is the LPT model with growth_factors at that
    Omega_m (normalised today, at a_obs), and the prior's s_k is linear_power there."""
    grid = models.Grid(SHAPE, BOX)
    forward = GalaxyClusteringForward(
        grid, a_obs=0.5, omega_m=0.3111, los_axis=2, b1=0.7, num_growth_steps=STEPS
    )
    modes = tf.signal.rfft3d(
        tf.random.stateless_normal([2, *SHAPE], [1, 2], dtype=tf.float64) * 0.5
    )
    omega_m = tf.constant([0.2, 0.45], tf.float64)
    got = forward.from_modes(modes, Omega_m=omega_m)
    for c in range(2):
        g = growth_factors(float(omega_m[c]), 0.5, "today", STEPS)
        want = forward.lpt.from_modes(
            modes[c : c + 1],
            growth1=float(g.d1),
            growth2=float(g.d2),
            rate1=float(g.f1),
            rate2=float(g.f2),
            b1=0.7,
            b2=0.0,
            bs2=0.0,
        )
        np.testing.assert_allclose(got[c].numpy(), want[0].numpy(), rtol=1e-8, atol=1e-10)
    # the surrogate's linear response at per-chain Omega_m, b1, bnabla2 (b2, bs2 are second
    # order) against the forward model's, measured: the part odd in a small field eps*delta
    biases = {
        "b1": tf.constant([0.7, 1.5], tf.float64),
        "b2": tf.constant([0.4, -0.3], tf.float64),
        "bs2": tf.constant([-0.5, 0.2], tf.float64),
        "bnabla2": tf.constant([4.0, -3.0], tf.float64),
    }
    gain = forward.linear_gain_fn(Omega_m=omega_m, **biases).numpy()
    eps = 1e-6
    odd = forward.from_modes(eps * modes, Omega_m=omega_m, **biases) - forward.from_modes(
        -eps * modes, Omega_m=omega_m, **biases
    )
    measured = np.fft.rfftn(odd.numpy(), axes=(1, 2, 3)) / (2 * eps)
    scale = np.abs(measured).max()
    np.testing.assert_allclose(measured / scale, gain * modes.numpy() / scale, atol=1e-7)
    # the prior's s_k(theta) on the grid
    model = _model()
    c = model._constants(power_terms=True)
    hp = {"Omega_m": omega_m, "sigma8": tf.constant([0.7, 0.9], tf.float64)}
    s = model._signal_variance(hp, c).numpy()
    want = linear_power(grid.kmag(), omega_m, hp["sigma8"]).numpy()
    np.testing.assert_allclose(s, want * grid.num_cells / grid.volume, rtol=1e-12)


def test_forward_is_differentiable_at_the_initial_lattice():
    """Issue 29: the galaxy model's particles start half a cell off the nodes, so its
    response to a small field is linear (odd in eps) and the target's gradient has no
    jump where a displacement changes sign. From the nodes (lattice_offset=0) the even
    part was 0.4 of the odd one at every amplitude, and the chains' step size collapsed
    (benchmarks/README.md)."""
    grid = models.Grid(SHAPE, BOX)
    forward = GalaxyClusteringForward(
        grid, los_axis=2, b1=1.0, b2=0.5, bs2=-0.5, num_growth_steps=STEPS
    )
    delta = tf.random.stateless_normal([1, *SHAPE], [4, 5], dtype=tf.float64)
    for eps in (1e-3, 1e-6):
        plus, minus = forward(eps * delta).numpy(), forward(-eps * delta).numpy()
        even, odd = np.linalg.norm(plus + minus), np.linalg.norm(plus - minus)
        assert even < 10 * eps * odd, (eps, even / odd)


def test_growth_table_interpolates_the_integration():
    """The cubic Hermite table of D1, D2, f1, f2 in Omega_m against growth_factors (the
    same integration) off the nodes, ends included, and its derivative against central
    differences of growth_factors."""
    grid = models.Grid(SHAPE, BOX)
    forward = GalaxyClusteringForward(grid, a_obs=0.5, num_growth_steps=STEPS)
    rng = np.random.default_rng(1)
    omega = np.asarray([PLANCK18.omega_b + 1e-6, 0.05, 0.3111, 0.999999, 1.0])
    omega = np.concatenate([omega, rng.uniform(PLANCK18.omega_b, 1.0, 40)])
    x = tf.constant(omega, tf.float64)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        got = forward.growth(x)
    want = growth_factors(x, 0.5, "today", STEPS)
    eps = 1e-6
    inner = np.clip(omega, PLANCK18.omega_b + eps, 1.0 - eps)
    plus = growth_factors(tf.constant(inner + eps), 0.5, "today", STEPS)
    minus = growth_factors(tf.constant(inner - eps), 0.5, "today", STEPS)
    for key, attr in zip(
        ("growth1", "growth2", "rate1", "rate2"), ("d1", "d2", "f1", "f2"), strict=True
    ):
        w = getattr(want, attr).numpy()
        np.testing.assert_allclose(got[key].numpy(), w, rtol=1e-8, err_msg=key)
        slope = tape.gradient(got[key], x).numpy()
        fd = (getattr(plus, attr).numpy() - getattr(minus, attr).numpy()) / (2 * eps)
        np.testing.assert_allclose(slope, fd, rtol=1e-5, err_msg=key)


def test_hyper_posterior_scales_are_positive_latent_scales():
    scales = _model().hyper_posterior_scales()
    assert set(scales) == {"Omega_m", "sigma8"}
    assert all(np.isfinite(v) and v > 0 for v in scales.values())


def _out_of_support_case():
    """Normal priors on Omega_m and sigma8 (the Python API allows them; configs do not):
    a chain there can leave Omega_b < Omega_m <= 1, sigma8 > 0."""
    normal = models.NormalPrior
    model = _model(hyper={"Omega_m": normal(0.3, 0.2), "sigma8": normal(0.8, 0.3)})
    draw = model.sample(seed=5)
    target = model.target_log_prob_fn(draw["data"])
    latents = list(model.init_latents("zeros", 5, seed=1))
    # inside, Omega_m < Omega_b, Omega_m > 1, sigma8 < 0, sigma8 = 0
    latents[0] = tf.constant([0.3, PLANCK18.omega_b - 0.01, 1.2, 0.3, 0.3], tf.float64)
    latents[1] = tf.constant([0.8, 0.8, 0.8, -0.2, 0.0], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(latents)
        lp = target(*latents)
    grads = tape.gradient(lp, latents)
    lp = lp.numpy()
    assert np.isfinite(lp[0])
    assert np.all(lp[1:] == -np.inf)
    for g in grads:
        assert np.all(np.isfinite(g.numpy()))
    return target, latents, lp


def test_out_of_support_is_minus_inf_with_finite_gradients():
    _out_of_support_case()


@pytest.mark.slow
def test_out_of_support_compiled_with_xla_is_the_same():
    target, latents, lp = _out_of_support_case()

    @tf.function(jit_compile=True)
    def value_and_gradient(*x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = target(*x)
        return value, tape.gradient(value, x)

    value, grads = value_and_gradient(*latents)
    value = value.numpy()
    np.testing.assert_array_equal(np.isfinite(value), np.isfinite(lp))
    np.testing.assert_allclose(value[0], lp[0], rtol=1e-12)
    assert np.all(value[1:] == -np.inf)
    for g in grads:
        assert np.all(np.isfinite(g.numpy()))


@pytest.mark.slow
def test_hmc_chain_at_the_edge_rejects_leaving_the_support():
    """HMC started at Omega_m just above Omega_b with a step that crosses it: the proposals
    outside are rejected, the states stay inside, nothing is NaN."""
    normal = models.NormalPrior
    model = _model(
        parametrization="noncentred",
        hyper={"Omega_m": normal(0.1, 0.5), "sigma8": normal(0.8, 0.3)},
    )
    draw = model.sample(seed=6)
    target = model.target_log_prob_fn(draw["data"])
    init = list(model.init_latents("zeros", 4, seed=2))
    init[0] = tf.fill([4], tf.constant(PLANCK18.omega_b + 1e-3, tf.float64))
    step = [tf.constant(0.05, tf.float64)] + [tf.constant(1e-3, tf.float64)] * (len(init) - 1)
    kernel = tfp.mcmc.HamiltonianMonteCarlo(target, step_size=step, num_leapfrog_steps=3)

    @tf.function
    def run():
        return tfp.mcmc.sample_chain(
            8,
            init,
            kernel=kernel,
            trace_fn=lambda _, r: (r.is_accepted, r.proposed_state[0]),
            seed=[4, 2],
        )

    states, (accepted, proposed) = run()
    omega = states[0].numpy()
    assert np.all(np.isfinite(omega)) and np.all(omega > PLANCK18.omega_b)
    for part in states:
        assert np.all(np.isfinite(part.numpy()))
    outside = proposed.numpy() <= PLANCK18.omega_b
    assert outside.any(), "the test needs proposals outside the support"
    assert not np.any(accepted.numpy()[outside])


def test_forward_rejects_unphysical_construction_and_unknown_parameters():
    grid = models.Grid(SHAPE, BOX)
    with pytest.raises(ValueError, match="scale factor"):
        GalaxyClusteringForward(grid, a_obs=1.5)
    with pytest.raises(ValueError, match="Omega_m"):
        GalaxyClusteringForward(grid, omega_m=0.04)
    with pytest.raises(ValueError, match="Omega_m"):
        CosmologicalPower(omega_m=0.04)
    with pytest.raises(ValueError, match="sigma8"):
        CosmologicalPower(sigma8=0.0)
    forward = GalaxyClusteringForward(grid, bias=None)
    modes = tf.zeros([1, *grid.modes_shape], tf.complex128)
    with pytest.raises(ValueError, match="no parameter"):
        forward.from_modes(modes, b1=tf.constant([1.0], tf.float64))
    # the forward model's fixed Omega_m must be the prior's fiducial one
    with pytest.raises(ValueError, match="differs"):
        models.GaussianFieldModel(
            grid,
            CosmologicalPower(0.3),
            1.0,
            forward=GalaxyClusteringForward(grid, omega_m=0.31),
        )


def test_white_noise_likelihood_reads_the_predicted_modes_one_fft_pair_fewer():
    """With a scalar sigma and no mask the galaxy model's likelihood takes the forward
    model's modes (Parseval) instead of its real-space output: the log density and its
    gradient equal the real-space path's (float64, to rounding), and the compiled value
    and gradient perform 12 transforms each way per chain, not 13 (the deconvolved
    prediction's irfft3d and its adjoint are gone)."""
    from pathlib import Path

    from fieldhmc import config as cfg
    from fieldhmc import workflow
    from fieldhmc.samplers import stateless_seed

    root = Path(__file__).resolve().parents[2]
    config = cfg.load_config(
        root / "configs" / "galaxy_clustering_16.yaml", ["grid.shape=[8,8,8]", "precision=float64"]
    )
    fourier = workflow.build_model(config)
    real = workflow.build_model(config)
    assert fourier._likelihood_from_modes
    real._likelihood_from_modes = False  # the real-space path of the same model
    data = np.asarray(workflow.obtain_data(config, fourier).data)
    latents = [tf.constant(v) for v in fourier.init_latents("prior", 2, seed=stateless_seed(3))]

    def value_and_gradient(model):
        target = model.target_log_prob_fn(data)

        def vg(*x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                lp = target(*x)
            return lp, tape.gradient(lp, x)

        return vg

    lp_f, g_f = value_and_gradient(fourier)(*latents)
    lp_r, g_r = value_and_gradient(real)(*latents)
    np.testing.assert_allclose(lp_f.numpy(), lp_r.numpy(), rtol=1e-12)
    for a, b in zip(g_f, g_r, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-9 * np.abs(b).max())
    bench = load_script(root / "benchmarks" / "lpt_forward.py", "lpt_bench")
    # (the real-space path's 13 are test_lpt_galaxies' forward-model count)
    compiled = tf.function(value_and_gradient(fourier), jit_compile=True)
    hlo = compiled.experimental_get_compiler_ir(*latents)(stage="hlo")
    assert bench.count_fft_fields(hlo, num_chains=2) == {"RFFT": 12, "IRFFT": 12}
