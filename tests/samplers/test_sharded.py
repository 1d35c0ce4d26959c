"""The Gaussian and lognormal-Poisson models' targets, HMC (bare and driver-run; also with
sampled power-spectrum hyperparameters), MCLMC and MAMS sharded over 4 virtual CPUs.

Computations run in a subprocess (``tests/samplers/sharded_cases.py``) that makes
the virtual devices before TensorFlow initialises; these tests assert its results.
"""

from __future__ import annotations

import pytest

from tests.dtensor_subprocess import default_results, run_json
from tests.samplers.sharded_cases import SHARDED_BIAS_TOLERANCES


@pytest.fixture(scope="module")
def results():
    return default_results()["samplers"]


@pytest.fixture(scope="module")
def slow_results():
    return run_json("tests.samplers.sharded_cases", "--slow", timeout=1800)


@pytest.mark.parametrize("case", ["unmasked-float32", "masked-float64"])
def test_sharded_target_equals_the_models_target(results, case):
    """log p(xi) on 4 devices == model.target_log_prob_fn(data)(x(xi)), gradient too."""
    r = results["target"][case]
    assert r["lp_dtype"] == "float64"
    tol = 1e-12 if case.endswith("float64") else 1e-6
    assert r["lp_rel"] < tol
    assert r["grad_rel"] < tol


def test_posterior_preconditioned_target_is_the_identity_target_at_a_v(results):
    """The posterior-preconditioned mesh target at v == the identity target at xi = A v
    (A = irfft(c_k rfft), applied in NumPy), its gradient == A (that gradient), and
    model_latent / latent_from_model are the map and its inverse."""
    r = results["target"]["masked-float64-posterior"]
    assert r["lp_dtype"] == "float64"
    assert r["lp_rel"] < 1e-12 and r["grad_rel"] < 1e-12
    assert r["latent_diff"] < 1e-12 and r["roundtrip_diff"] < 1e-12
    assert r["metric_min"] < 0.95  # the metric is not the identity


@pytest.mark.parametrize("kind", ["hmc-jitter", pytest.param("mams", marks=pytest.mark.slow)])
def test_posterior_preconditioned_mesh_transitions_keep_exact_draws_exact(request, kind):
    """256 exact Wiener-posterior draws (masked 8³) as 4-device chains, 3 transitions
    with the posterior preconditioner (HMC with a jittered number of leapfrog steps,
    MAMS): every latent's mean and variance still match the exact posterior (z-scores
    with the known ESS = 256, chi-square p and max |z|). A prior term without the
    Hermitian weights fails it (p = 0, max |z| = 13)."""
    fixture = "results" if kind == "hmc-jitter" else "slow_results"  # mams: slow only
    r = request.getfixturevalue(fixture)["conservation"][kind]
    assert r["moved"] > 0.5 and 0.3 < r["accept_rate"] <= 1.0, r
    assert r["p"] > 1e-3 and r["max_abs_z"] < 4.5, r
    if kind == "hmc-jitter":
        assert len(r["n_steps"]) > 1 and set(r["n_steps"]) <= set(range(1, 6)), r


def test_driver_run_on_four_devices_reproduces_the_single_device_run_float64(results):
    """The chunked driver (ShardedSampler) on 4 devices == on plain tensors of one
    device: accept/reject decisions, adapted step size, state, log density, per-draw
    power and tracked modes, stored field draws and running mean, to float64 rounding
    (the step size adapts on the acceptance probabilities, which carry the 1e-13
    rounding difference of the two layouts' sums into the later steps)."""
    r = results["driver"]["repro"]
    assert r["num_draws"] == 4 and r["num_fields"] == 2
    for name in ("lp", "energy", "power", "tracked_real", "step_size", "n_steps"):
        assert name in r["names"]
    assert r["same_accepts"]
    assert 0.2 < r["accept_rate"] < 1.0  # the run moved and was tested
    assert r["step_sizes"][0] != 0.1  # warm-up adapted it
    assert r["max_state_diff"] < 1e-11 * r["state_scale"]
    assert r["max_lp_diff"] < 1e-9
    assert r["max_power_rel"] < 1e-9
    assert r["max_tracked_diff"] < 1e-9
    assert r["max_field_diff"] < 1e-11 * r["state_scale"]
    assert r["max_mean_diff"] < 1e-11


def test_driver_run_equals_the_bare_transition_loop(results):
    """Chunking, checkpoints and storage do not change the chain (same seed, no
    warm-up, so the step size stays fixed as in the bare loop)."""
    r = results["driver"]["repro"]
    assert 0.2 < r["bare_accept_rate"] < 1.0
    assert r["bare_state_diff"] == 0.0
    assert r["bare_lp_diff"] == 0.0


def test_sharded_driver_resume_is_bit_identical(results):
    """Killed in warm-up and again in sampling, resumed each time from the (gathered,
    re-sharded) checkpoint: traces, stored fields and final state equal bit for bit."""
    r = results["driver"]["resume"]
    assert r["interrupted_steps"] == [3, 6] and r["complete"]
    assert r["num_draws"] == 4
    assert r["traces_identical"]
    assert r["fields_identical"]
    assert r["state_identical"]


@pytest.mark.parametrize("case", ["masked-posterior-noncentred", "masked-identity-conditional"])
def test_sharded_target_with_sampled_hyperparameters_equals_the_models_target(results, case):
    """(log A, n) sampled: the 4-device target at random parts (whitened hyperparameters,
    masked data; the posterior-metric non-centred field latent, or the conditional latent
    delta = mu(theta) + sqrt(w(theta)) Z) == model.target_log_prob_fn at their model
    latents, float64, and every part's gradient == the model's mapped by the chain rule."""
    r = results["hyper"]["target"][case]
    assert r["names"] == ["log_amplitude", "index", "field"]
    assert r["lp_dtype"] == "float64" and r["lp_rel"] < 1e-12
    assert len(r["grad_rel"]) == 3 and max(r["grad_rel"]) < 1e-12, r["grad_rel"]


@pytest.mark.parametrize(
    "kind", ["hmc", *(pytest.param(k, marks=pytest.mark.slow) for k in ("mams", "mclmc"))]
)
def test_sharded_driver_with_sampled_hyperparameters_reproduces_one_device(request, kind):
    """(log A, n) sampled through the driver -- jittered HMC (4 warm-up steps adapting the
    step size, 4 draws, chunks of 3) or mams / mclmc (12 tuning steps through every stage,
    4 draws, chunks of 5): 4 devices == plain tensors of one device (same accept decisions
    and step counts, every part of the state, the hyperparameter traces, lp, energy error,
    P(k), stored fields and tuned parameters to rounding); the hyperparameters are traced
    as the model's latents; a run killed twice and resumed is bit-identical."""
    if kind == "hmc":
        r = request.getfixturevalue("results")["hyper"]["driver"][kind]
    else:  # slow: the no-hyperparameter mclmc / mams runs are in the default set
        r = request.getfixturevalue("slow_results")["hyper_driver"][kind]
    assert {"log_amplitude", "index", "lp", "power"} <= set(r["names"]) and r["num_draws"] == 4
    assert r["same_accepts"] and r["same_n_steps"]
    if kind == "mclmc":
        assert r["accept_rate"] == 1.0 and r["n_steps"] == [2]
    else:
        assert 0.2 < r["accept_rate"] < 1.0 and len(r["n_steps"]) > 1, r
    assert r["hyper_moved"] > 0 and r["hyper_trace_is_model_latent"]
    assert max(r["max_state_diff"]) < 1e-9 and r["max_hyper_trace_diff"] < 1e-9, r
    assert r["max_lp_diff"] < 1e-8 and r["max_energy_error_diff"] < 1e-9, r
    assert r["max_power_rel"] < 1e-9 and r["max_field_diff"] < 1e-9, r
    tuned_1, tuned_4 = r["tuned_1"], r["tuned_4"]
    assert tuned_1.keys() == tuned_4.keys()
    for name, value in tuned_1.items():
        assert abs(tuned_4[name] / value - 1.0) < 1e-9, (name, tuned_1, tuned_4)
    if kind != "hmc":
        assert tuned_4["dimension"] == 514  # the field's 512 and log A, n
    resume = r["resume"]
    assert resume["interrupted_steps"] == ([3, 6] if kind == "hmc" else [5, 12])
    assert resume["complete"] and resume["tuned_identical"]
    assert resume["traces_identical"] and resume["fields_identical"] and resume["state_identical"]


@pytest.mark.parametrize(
    "case",
    ["posterior-noncentred-fixed", "identity-conditional-sampled"],
)
def test_sharded_poisson_target_equals_the_models_target(results, case):
    """Lognormal-Poisson counts (8³, a completeness in [0.3, 1] with a masked slab): the
    4-device target at random parts == model.target_log_prob_fn at their model latents,
    float64, value and every part's gradient (fixed P(k) with the posterior metric; (log A,
    n) sampled with the conditional latent and its Gaussian-approximation surrogate)."""
    r = results["poisson"]["target"][case]
    assert r["lp_dtype"] == "float64" and r["finite"]
    assert r["lp_rel"] < 1e-10, r
    expected = ["field"] if case.endswith("fixed") else ["log_amplitude", "index", "field"]
    assert r["names"] == expected
    assert len(r["grad_rel"]) == len(expected) and max(r["grad_rel"]) < 1e-10, r


@pytest.mark.slow
def test_sharded_target_with_sampled_cosmology_equals_the_models_target(slow_results):
    """Omega_m and sigma8 of the Eisenstein-Hu P(k) sampled (the power on the distinct
    |k|, gathered by the |k| index sharded as the spectrum), posterior metric: the
    4-device target at random parts == model.target_log_prob_fn at their model latents,
    float64, value and every part's gradient."""
    r = slow_results["cosmology"]["target"]
    assert r["names"] == ["Omega_m", "sigma8", "field"]
    assert r["lp_dtype"] == "float64" and r["lp_rel"] < 1e-10, r
    assert len(r["grad_rel"]) == 3 and max(r["grad_rel"]) < 1e-10, r


@pytest.mark.slow
def test_sharded_driver_with_sampled_cosmology_reproduces_one_device(slow_results):
    """Omega_m and sigma8 sampled through the driver (jittered HMC, posterior metric, 4
    warm-up steps, 4 draws, chunks of 3): 4 devices == plain tensors of one device."""
    r = slow_results["cosmology"]["driver"]
    assert {"Omega_m", "sigma8", "lp", "power"} <= set(r["names"]) and r["num_draws"] == 4
    assert r["same_accepts"] and r["same_n_steps"]
    assert 0.0 < r["accept_rate"] < 1.0 and r["hyper_moved"] > 0, r
    assert max(r["max_state_diff"]) < 1e-9 and r["max_hyper_trace_diff"] < 1e-9, r
    assert r["max_lp_rel"] < 1e-10 and r["max_power_rel"] < 1e-9, r
    assert r["max_field_diff"] < 1e-9, r


def test_sharded_poisson_with_the_diagonal_metric_reproduces_one_device_and_resumes(results):
    """Lognormal-Poisson counts, (log A, n) sampled, the windowed diagonal metric (jittered
    HMC, one slow window in 40 warm-up steps, then the step-size adaptation restarted)
    through the driver: 4 devices == plain tensors of one device (accept decisions, step
    counts, adapted scales, step sizes, state, lp, P(k), stored fields; measured 5e-13,
    6e-13, 1e-11, 8e-14 relative, 1e-10 for P(k): the layouts' rounding of the float64
    sums carried by 40 steps of adaptation), the scales adapted per element, and a run
    killed before, inside and after the window and resumed each time is bit-identical."""
    r = results["poisson"]["driver"]
    assert {"log_amplitude", "index", "lp", "power"} <= set(r["names"]) and r["num_draws"] == 4
    assert r["windows"] == [[6, 36]]
    assert r["same_accepts"] and r["same_n_steps"]
    assert 0.1 < r["accept_rate"] < 1.0, r  # the run moved and was tested
    assert r["field_scale_ptp"] > 0.1 and all(abs(v - 1.0) > 1e-3 for v in r["hyper_scales"]), r
    assert max(r["scales_rel"]) < 1e-9 and r["step_size_rel"] < 1e-9, r
    assert max(r["max_state_diff"]) < 1e-8 and r["max_lp_rel"] < 1e-10, r
    assert r["max_power_rel"] < 1e-8 and r["max_field_diff"] < 1e-8, r
    resume = r["resume"]
    assert resume["interrupted_steps"] == [5, 35, 40] and resume["complete"]
    assert resume["traces_identical"] and resume["fields_identical"]
    assert resume["state_identical"] and resume["scales_identical"]


MICRO = ["mclmc", "mams"]
_TUNED = ("step_size", "trajectory_length")


@pytest.mark.parametrize("kind", MICRO)
def test_sharded_microcanonical_on_four_devices_reproduces_one_device(results, kind):
    """ShardedSampler running mclmc / mams (12 tuning steps through every stage of the
    tuner, then 4 draws) on 4 devices == on plain tensors of one device, float64: the
    per-step traces, the tuned step size and L, the state, P(k), stored field draws and
    the running mean to rounding (counter-based draws do not depend on the mesh)."""
    r = results["microcanonical"][kind]["repro"]
    assert r["num_draws"] == 4 and r["num_fields"] == 2
    for name in ("lp", "energy_error", "step_size", "n_steps", "power", "tracked_real"):
        assert name in r["names"]
    assert r["same_accepts"] and r["same_n_steps"]
    tuned_1, tuned_4 = r["tuned_1"], r["tuned_4"]
    assert abs(tuned_4["step_size"] - 0.3) > 0.1  # it tuned (initial 0.3 and 1.0)
    assert abs(tuned_4["trajectory_length"] - 1.0) > 0.1
    for name in _TUNED:
        assert abs(tuned_4[name] / tuned_1[name] - 1.0) < 1e-11, (name, tuned_1, tuned_4)
    assert r["step_size_rel"] < 1e-11
    assert r["max_state_diff"] < 1e-11 * r["state_scale"]
    assert r["max_lp_diff"] < 1e-9
    assert r["max_energy_error_diff"] < 1e-9
    assert r["max_power_rel"] < 1e-9
    assert r["max_field_diff"] < 1e-11 * r["state_scale"]
    assert r["max_mean_diff"] < 1e-11
    if kind == "mclmc":
        assert r["accept_rate"] == 1.0 and set(r["n_steps"]) == {2}  # minimal norm: 2 grads
        assert r["field_moments_draws"] == 4  # moments every 5th draw (field_stats_every)
    else:
        assert 0.2 < r["accept_rate"] < 1.0  # Metropolis-tested
        assert len(set(r["n_steps"])) > 1  # randomised trajectory length
        assert r["field_moments_draws"] == 16


def test_sharded_recorded_coordinates_are_the_kernels(results):
    """Stage 3's coordinate subset picked on 4 devices (a segment sum over slabs, stride
    8 at 16³) is exactly ``mclmc._subset``'s."""
    assert results["microcanonical"]["subset_equal"]


@pytest.mark.parametrize("kind", MICRO)
def test_sharded_microcanonical_resume_is_bit_identical(results, kind):
    """Killed in the tuner's moment stage (step 5), in its autocorrelation / final dual
    averaging stage (10) and in sampling (15), resumed each time from the gathered
    checkpoint (host tuning state, moments, recorded coordinates): traces, stored
    fields, final state and tuned parameters equal the uninterrupted run bit for bit."""
    r = results["microcanonical"][kind]["resume"]
    assert r["interrupted_steps"] == [5, 10, 15] and r["complete"]
    assert r["traces_identical"]
    assert r["fields_identical"]
    assert r["state_identical"]
    assert r["tuned_identical"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", MICRO)
def test_sharded_microcanonical_is_the_unsharded_kernel(slow_results, kind):
    """The sharded code on plain tensors with the unsharded kernels' Philox draws ==
    the unsharded driver running ``fieldhmc.samplers.mclmc`` (XLA) on the same target,
    float64, 12 tuning steps + 4 draws: same accept decisions and trajectory lengths,
    step size and L to 1e-10 (a float32-rounded parameter in the kernel gave 2e-7), the
    state and traces to rounding: the mesh path runs the kernel's own tuner and
    integrator."""
    r = slow_results["microcanonical_unsharded"][kind]
    assert r["same_accepts"] and r["same_n_steps"]
    assert abs(r["tuned"]["step_size"] - 0.3) > 0.1  # it tuned
    for name in _TUNED:
        assert r["tuned_rel"][name] < 1e-10, r["tuned_rel"]
    assert r["step_size_rel"] < 1e-10
    assert r["max_state_diff"] < 1e-9 * r["state_scale"]
    assert r["max_lp_diff"] < 1e-8
    assert r["max_energy_error_diff"] < 1e-9
    if kind == "mams":
        assert r["max_accept_rate_diff"] < 1e-10


@pytest.mark.slow
@pytest.mark.parametrize("masked", ["unmasked", "masked"])
def test_driver_run_sharded_mams_passes_the_wiener_ztest(slow_results, masked):
    """Sharded MAMS (4 devices, 200 tuning steps, 400 draws x 4 chains, 8³): every
    latent's posterior mean and variance, MCSE-scaled z-scores vs the dense posterior."""
    r = slow_results["mams"][masked]
    assert r["p"] > 1e-3 and r["max_abs_z"] < 4.5, r
    assert 0.5 < r["accept_rate"] < 1.0, r


@pytest.mark.slow
def test_sharded_mclmc_bias_is_within_its_tolerance_and_shrinks(slow_results):
    """Sharded, tuned MCLMC (4 devices, 8³ unmasked, 2000 draws x 4 chains): the squared
    variance bias b^2 (MC noise removed, arXiv:2412.08876) is below the tuner's
    Var[dE]/d at a loose and a tight tolerance (``SHARDED_BIAS_TOLERANCES``), measurable
    at the loose one and smaller at the tight one, and MCLMC shrinks the variances (the
    checks of ``test_posterior.py``'s unsharded test)."""
    loose_tol, tight_tol = SHARDED_BIAS_TOLERANCES
    loose, tight = (slow_results["mclmc_bias"][str(t)] for t in SHARDED_BIAS_TOLERANCES)
    msg = f"{loose} {tight}"
    assert loose["b2"] < loose_tol and tight["b2"] < tight_tol, msg
    assert loose["b2"] - loose["se"] > 0.1 * loose_tol, msg
    assert tight["b2"] + 2 * tight["se"] < 0.5 * (loose["b2"] - 2 * loose["se"]), msg
    assert loose["rel"] < tight["rel"] < 0.0, msg


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hmc", "mams"])
@pytest.mark.parametrize("masked", ["unmasked", "masked"])
def test_sharded_posterior_preconditioner_passes_the_wiener_ztest(slow_results, kind, masked):
    """The posterior preconditioner on 4 devices (8³, 400 draws x 4 chains after warm-up
    or tuning), every latent's posterior mean and variance vs the dense posterior."""
    r = slow_results["posterior"][f"{kind}-{masked}"]
    assert r["p"] > 1e-3 and r["max_abs_z"] < 4.5, r


@pytest.mark.slow
@pytest.mark.parametrize("masked", ["unmasked", "masked"])
def test_sharded_diagonal_metric_passes_the_wiener_ztest(slow_results, masked):
    """The windowed diagonal metric on 4 devices (HMC, 150 warm-up steps with one slow
    window, 400 draws x 4 chains): every latent's posterior mean and variance vs the
    dense posterior."""
    r = slow_results["diagonal_ztest"][masked]
    assert r["p"] > 1e-3 and r["max_abs_z"] < 4.5, r


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hmc", "mams", "mclmc", "hmc-conditional"])
def test_sharded_kernels_with_sampled_hyperparameters_match_the_exact_posterior(slow_results, kind):
    """Jittered HMC, MAMS and MCLMC on 4 devices with (log A, n) sampled next to the
    non-centred field (8³, 4 chains; hmc 300 warm-up steps + 400 draws, mams 200 + 300,
    mclmc 200 + 1000): theta's mean and variance and every field coordinate's against the
    exact posterior of ``test_conditional_posterior.py`` (quadrature over theta, mixed
    Wiener posterior), MCSE-scaled z-scores as there; ``hmc-conditional``: hmc on the
    conditional latent with the Fisher widths of (log A, n) as their metric (the
    single-device test's setup). With hmc, a prior on n five times too narrow (z = -13
    for theta's variance) or the hyperprior left out of the target (|z| up to 13) fails."""
    r = slow_results["hyper_posterior"][kind]
    assert max(abs(z) for z in r["z_theta"]) < 4.0, r
    assert r["field_ok"], r["field_msg"]
    if kind != "mclmc":
        assert 0.5 < r["accept_rate"] <= 1.0 and len(r["n_steps"]) > 1, r


@pytest.mark.slow
def test_four_device_hmc_reproduces_the_single_device_draws_float32(slow_results):
    r = slow_results["repro"]["float32"]
    assert r["same_accepts"]
    assert r["max_draw_diff"] < 1e-5 * r["draw_scale"]


@pytest.mark.slow
@pytest.mark.parametrize("masked", ["unmasked", "masked"])
def test_driver_run_sharded_hmc_passes_the_wiener_ztest(slow_results, masked):
    """Every voxel's posterior mean and variance of delta from the driver-run 4-device
    chain's stored draws (8³, 400 draws x 4 chains, dense reference), MCSE-scaled."""
    r = slow_results[masked]
    assert r["p"] > 1e-3 and r["max_abs_z"] < 4.5, r


_WHILE_LOOP_OVER_SLAB_FFT = """
import numpy as np, tensorflow as tf
from fieldhmc.ops import sharded as sh
mesh = sh.make_mesh(4)
x = sh.shard(np.ones((1, 8, 8, 8)), sh.slab_layout(mesh))

@tf.function(autograph=False)
def f(u):
    def body(i, u):
        return i + 1, sh.irfft3d(sh.rfft3d(u, mesh), mesh, fft_length=(8, 8, 8))
    return tf.while_loop(lambda i, _: i < 2, body, (tf.constant(0), u))[1]

print(float(np.sum(sh.gather(f(x)))))
"""


@pytest.mark.slow
def test_dtensor_while_loop_over_the_slab_fft_still_crashes():
    """Why the sharded chunk loops in Python over a compiled transition: in TF 2.21 a
    DTensor tf.while_loop whose body runs the slab transforms segfaults (no upstream
    issue found). When this fails, TensorFlow runs it and the chunk could become one
    compiled while loop (fieldhmc/samplers/sharded.py module docs)."""
    import os
    import subprocess
    import sys

    from tests.dtensor_subprocess import ROOT

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _WHILE_LOOP_OVER_SLAB_FFT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, f"the while loop ran: {proc.stdout[-200:]}"
    assert proc.returncode == -11, proc.stderr[-2000:]  # SIGSEGV, not a Python error
