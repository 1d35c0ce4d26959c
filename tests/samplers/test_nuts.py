"""Tests of `fieldhmc.samplers.nuts.StanNUTS`.

Statistical tests use fixed seeds but thresholds derived from the null
distribution of the statistic (stated in each test), not tuned on a seed.
Chains start from exact draws of the target, so they are stationary from the
first step and per-chain averages are independent across chains: the
across-chain spread of per-chain averages gives each estimate's Monte Carlo
standard error (MCSE), and ``z = (estimate - truth) / MCSE`` is approximately
Student-t with ``chains - 1`` degrees of freedom.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
import tensorflow_probability as tfp

from fieldhmc.samplers import nuts
from fieldhmc.samplers.nuts import StanNUTS, StanNUTSResults, _Metric
from tests.load_script import load_script

REPO = pathlib.Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------
# Reference: a line-by-line NumPy transcription of Stan's base_nuts transition
# (stan-dev/stan src/stan/mcmc/hmc/nuts/base_nuts.hpp, after PR #2800).
# --------------------------------------------------------------------------


def stan_reference(grad_fn, log_prob_fn, x0, p0, inv_metric, eps, forward, max_depth, max_dh=1e3):
    """Tree depth, leapfrog count, summed Metropolis probability and divergence.

    ``forward[j]`` is the direction of doubling ``j``.  These four outputs do not
    depend on the multinomial draws, so they must agree exactly with `StanNUTS`
    fed the same momentum and directions.
    """

    def sharp(p):
        return inv_metric @ p

    def hamiltonian(x, p):
        return -log_prob_fn(x) + 0.5 * p @ sharp(p)

    state = {"n_leapfrog": 0, "sum_metro": 0.0, "divergent": False}
    h0 = hamiltonian(x0, p0)

    def criterion(ps_minus, ps_plus, rho):
        return ps_plus @ rho > 0 and ps_minus @ rho > 0

    def build_tree(z, depth, sign):
        if depth == 0:
            x, p = z
            p = p + 0.5 * sign * eps * grad_fn(x)
            x = x + sign * eps * sharp(p)
            p = p + 0.5 * sign * eps * grad_fn(x)
            state["n_leapfrog"] += 1
            h = hamiltonian(x, p)
            if np.isnan(h):
                h = np.inf
            if h - h0 > max_dh:
                state["divergent"] = True
            state["sum_metro"] += 1.0 if h0 - h > 0 else np.exp(h0 - h)
            ps = sharp(p)
            return not state["divergent"], (x, p), p.copy(), p, p, ps, ps
        valid, z, rho_init, p_beg, p_init_end, ps_beg, ps_init_end = build_tree(z, depth - 1, sign)
        if not valid:
            return False, z, None, None, None, None, None
        valid, z, rho_final, p_final_beg, p_end, ps_final_beg, ps_end = build_tree(
            z, depth - 1, sign
        )
        if not valid:
            return False, z, None, None, None, None, None
        rho = rho_init + rho_final
        ok = criterion(ps_beg, ps_end, rho)
        ok &= criterion(ps_beg, ps_final_beg, rho_init + p_final_beg)
        ok &= criterion(ps_init_end, ps_end, rho_final + p_init_end)
        return ok, z, rho, p_beg, p_end, ps_beg, ps_end

    z_fwd = z_bck = (x0, p0)
    ps0 = sharp(p0)
    p_fwd_fwd = p_fwd_bck = p_bck_fwd = p_bck_bck = p0
    ps_fwd_fwd = ps_fwd_bck = ps_bck_fwd = ps_bck_bck = ps0
    rho = p0.copy()
    depth = 0
    while depth < max_depth:
        if forward[depth]:
            rho_bck, p_bck_fwd, ps_bck_fwd = rho, p_fwd_fwd, ps_fwd_fwd
            valid, z_fwd, rho_fwd, p_fwd_bck, p_fwd_fwd, ps_fwd_bck, ps_fwd_fwd = build_tree(
                z_fwd, depth, 1.0
            )
        else:
            rho_fwd, p_fwd_bck, ps_fwd_bck = rho, p_bck_bck, ps_bck_bck
            valid, z_bck, rho_bck, p_bck_fwd, p_bck_bck, ps_bck_fwd, ps_bck_bck = build_tree(
                z_bck, depth, -1.0
            )
        if not valid:
            break
        depth += 1
        rho = rho_bck + rho_fwd
        ok = criterion(ps_bck_bck, ps_fwd_fwd, rho)
        ok &= criterion(ps_bck_bck, ps_fwd_bck, rho_bck + p_fwd_bck)
        ok &= criterion(ps_bck_fwd, ps_fwd_fwd, rho_fwd + p_bck_fwd)
        if not ok:
            break
    return depth, state["n_leapfrog"], state["sum_metro"], state["divergent"]


def _replay_randomness(seed, x, inverse_mass, max_depth):
    """The momentum and doubling directions `StanNUTS.one_step` draws from ``seed``.

    White-box: mirrors the order of `one_step`'s seed splits.
    """
    momentum_seed, _, loop_seed = tfp.random.split_seed(seed, n=3)
    p0 = _Metric(inverse_mass, [x], 1).sample_momentum([x], momentum_seed)[0].numpy()
    forward, s = [], loop_seed
    for _ in range(max_depth):
        s, step_seed = tfp.random.split_seed(s)
        direction_seed, _, _ = tfp.random.split_seed(step_seed, n=3)
        u = tf.random.stateless_uniform(
            [x.shape[0]], seed=direction_seed, dtype=x.dtype, alg="philox"
        )
        forward.append((u > 0.5).numpy())
    return p0, np.stack(forward, axis=1)


def _correlated_precision(dim, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(dim, dim))
    return a @ a.T / dim + 0.2 * np.eye(dim)


@pytest.mark.parametrize("metric", ["identity", "diag", "dense"])
def test_matches_stan_reference_exactly(metric):
    """Tree depth, leapfrog count, accept stat and divergence equal Stan's, transition by
    transition, including subtrees stopped by the extra U-turn checks and divergences."""
    dim, chains, max_depth = 5, 6, 7
    precision = _correlated_precision(dim)
    covariance = np.linalg.inv(precision)
    if metric == "identity":
        inv_metric, inverse_mass = np.eye(dim), None
    elif metric == "diag":
        inv_metric = np.diag(np.diag(covariance))
        inverse_mass = tf.constant(np.diag(covariance))
    else:
        inv_metric = 0.8 * covariance + 0.05 * np.eye(dim)
        inverse_mass = tf.linalg.LinearOperatorFullMatrix(
            inv_metric, is_self_adjoint=True, is_positive_definite=True
        )
    q = tf.constant(precision)

    def log_prob(x):
        return -0.5 * tf.einsum("ci,ij,cj->c", x, q, x)

    kernel = StanNUTS(log_prob, 0.1, max_tree_depth=max_depth, inverse_mass=inverse_mass)
    step = tf.function(kernel.one_step)  # graph mode draws the same stream as eager
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(chains, dim)))
    results = kernel.bootstrap_results(x)
    num_checked = num_divergent = 0
    # Small, resonance-prone and divergent step sizes (relative to this target's scales).
    for eps in [0.15, 0.45, 1.0, 2.5, 6.0]:
        results = results._replace(step_size=tf.constant(eps, tf.float64))
        for t in range(5):
            seed = tf.constant([t, int(eps * 100)], tf.int32)
            p0, forward = _replay_randomness(seed, x, inverse_mass, max_depth)
            x_new, new_results = step(x, results, seed)
            for c in range(chains):
                expected = stan_reference(
                    lambda z: -precision @ z,
                    lambda z: -0.5 * z @ precision @ z,
                    x.numpy()[c],
                    p0[c],
                    inv_metric,
                    eps,
                    forward[c],
                    max_depth,
                )
                n = int(new_results.num_leapfrog_steps[c])
                got = (
                    int(new_results.tree_depth[c]),
                    n,
                    float(new_results.accept_prob[c]) * n,
                    bool(new_results.is_divergent[c]),
                )
                assert got[:2] == expected[:2], (metric, eps, t, c, got, expected)
                np.testing.assert_allclose(got[2], expected[2], rtol=1e-8, atol=1e-12)
                assert got[3] == expected[3]
                num_checked += 1
                num_divergent += got[3]
            x, results = x_new, new_results
    assert num_checked == 5 * 5 * chains
    assert num_divergent > 0  # the divergence path was exercised


# --------------------------------------------------------------------------
# Target conservation
# --------------------------------------------------------------------------

_SCALES = np.linspace(0.5, 3.0, 8)
_NUM_EXACT = 4000


def _conservation_statistics(whitened):
    """Per-coordinate KS p-values vs N(0, 1) and z-scores of the second moment.

    For ``n`` exact N(0, 1) draws, ``mean(z**2)`` has standard deviation
    ``sqrt(2 / n)``.  With n = 4000 this detects a 5 % error in a scale (a 10 %
    error in the second moment, z = 4.5); the KS test detects location shifts
    of about 0.09 sd and 15 % scale errors at the per-coordinate level 1e-4.
    """
    n = whitened.shape[0]
    p_values = [scipy.stats.kstest(whitened[:, k], "norm").pvalue for k in range(whitened.shape[1])]
    z_second = (np.mean(whitened**2, axis=0) - 1.0) / np.sqrt(2.0 / n)
    return np.array(p_values), z_second


def _assert_still_target(whitened):
    p_values, z_second = _conservation_statistics(whitened)
    # Family-wise false alarm rate about 1e-3 over 8 coordinates x 2 statistics.
    assert p_values.min() > 1e-3 / 16, p_values
    assert np.abs(z_second).max() < 4.0, z_second


@pytest.fixture(scope="module")
def exact_gaussian_draws():
    x = tf.random.stateless_normal([_NUM_EXACT, _SCALES.size], seed=[11, 12], dtype=tf.float64)
    return x * _SCALES


def _diagonal_log_prob(x):
    return -0.5 * tf.reduce_sum((x / _SCALES) ** 2, axis=-1)


@pytest.mark.parametrize(
    "inverse_mass, step_size",
    [(None, 0.9), ("dense", 0.6)],
    ids=["identity", "dense"],
)
def test_target_conservation(exact_gaussian_draws, inverse_mass, step_size):
    """Exact draws, one (aggressive) transition each: still exactly the target."""
    if inverse_mass == "dense":
        rng = np.random.default_rng(3)
        a = rng.normal(size=(_SCALES.size,) * 2)
        dense = np.diag(_SCALES**2) + 0.3 * a @ a.T / _SCALES.size
        inverse_mass = tf.linalg.LinearOperatorFullMatrix(
            dense, is_self_adjoint=True, is_positive_definite=True
        )
    kernel = StanNUTS(_diagonal_log_prob, step_size, max_tree_depth=8, inverse_mass=inverse_mass)
    x0 = exact_gaussian_draws
    step = tf.function(kernel.one_step, jit_compile=True)
    x1, results = step(x0, kernel.bootstrap_results(x0), tf.constant([5, 6]))
    accept = float(tf.reduce_mean(results.accept_prob))
    assert 0.3 < accept < 0.95  # a step size that actually moves, with visible errors
    assert float(tf.reduce_mean(tf.cast(results.is_accepted, tf.float64))) > 0.5
    _assert_still_target(x1.numpy() / _SCALES)


def test_conservation_check_has_power(exact_gaussian_draws):
    """The same statistics reject a transition that inflates one scale by 5 %."""
    biased = exact_gaussian_draws.numpy() / _SCALES
    biased[:, 3] *= 1.05
    with pytest.raises(AssertionError):
        _assert_still_target(biased)


# --------------------------------------------------------------------------
# Moments by MCSE-scaled z-tests
# --------------------------------------------------------------------------


def _z_scores(per_chain, truth):
    """z of the mean of per-chain estimates ``[chains, ...]`` against ``truth``."""
    chains = per_chain.shape[0]
    mcse = per_chain.std(axis=0, ddof=1) / np.sqrt(chains)
    return (per_chain.mean(axis=0) - truth) / mcse


def _assert_z_scores_standard(z, family_alpha=1e-3):
    """Every |z| below the Bonferroni bound of the t(63) distribution, and the z's as a
    sample consistent with unit variance (chi-square test on sum z**2)."""
    z = np.ravel(z)
    bound = scipy.stats.t.isf(family_alpha / (2 * z.size), df=63)
    assert np.abs(z).max() < bound, (np.round(z, 2), bound)
    chi2 = float(np.sum(z**2))
    assert chi2 < scipy.stats.chi2.isf(family_alpha, df=z.size), (chi2, z.size)


def _run_chains(kernel, x0, num_results, seed):
    @tf.function(jit_compile=True)
    def run(x, seed):
        return tfp.mcmc.sample_chain(
            num_results,
            x,
            kernel=kernel,
            seed=seed,
            trace_fn=lambda _, r: (r.num_leapfrog_steps, r.is_divergent),
        )

    return run(x0, tf.constant(seed))


_CHAINS = 64


def test_correlated_gaussian_moments():
    """2-d Gaussian, scales (1, 10), correlation 0.95: identity, diagonal and dense metric
    (and dense with step-size jitter); 20 z-scores of first and second moments."""
    cov = np.array([[1.0, 0.95 * 10.0], [0.95 * 10.0, 100.0]])
    precision = tf.constant(np.linalg.inv(cov))
    chol = np.linalg.cholesky(cov)

    def log_prob(x):
        return -0.5 * tf.einsum("ci,ij,cj->c", x, precision, x)

    dense = tf.linalg.LinearOperatorFullMatrix(cov, is_self_adjoint=True, is_positive_definite=True)
    configs = {
        "identity": dict(step_size=0.15),
        "diag": dict(step_size=0.15, inverse_mass=tf.constant(np.diag(cov))),
        "dense": dict(step_size=0.8, inverse_mass=dense),
        "dense+jitter": dict(step_size=0.8, inverse_mass=dense, step_size_jitter=0.5),
    }
    rng = np.random.default_rng(7)
    x0 = tf.constant(rng.normal(size=(_CHAINS, 2)) @ chol.T)
    all_z = []
    for i, (name, kwargs) in enumerate(configs.items()):
        kernel = StanNUTS(log_prob, max_tree_depth=8, **kwargs)
        draws, (steps, divergent) = _run_chains(kernel, x0, 150, [21, i])
        draws = draws.numpy()  # [draws, chains, 2]
        assert not divergent.numpy().any(), name
        second = np.einsum("nci,ncj->ncij", draws, draws)[..., [0, 0, 1], [0, 1, 1]]
        per_chain = np.concatenate([draws.mean(axis=0), second.mean(axis=0)], axis=-1)
        truth = np.array([0.0, 0.0, cov[0, 0], cov[0, 1], cov[1, 1]])
        z = _z_scores(per_chain, truth)
        all_z.append(z)
        if name == "identity":
            identity_steps = float(steps.numpy().mean())
        if name == "dense":
            dense_steps = float(steps.numpy().mean())
    _assert_z_scores_standard(np.stack(all_z))
    # The metric matters: whitened, trajectories are several times shorter.
    assert dense_steps < identity_steps / 4


def test_hierarchical_moments_list_state():
    """Eight-schools-like normal hierarchy with known group scale (funnel-free, Gaussian
    posterior), state ``[mu (scalar event), theta ([8] event)]``: per-part diagonal metric
    and a joint dense `LinearOperator` metric over both parts; 36 z-scores."""
    y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    tau, mu_scale = 5.0, 10.0
    # Joint Gaussian posterior of (mu, theta): precision Q, mean Q^-1 b.
    q = np.zeros((9, 9))
    q[0, 0] = 1 / mu_scale**2 + 8 / tau**2
    q[0, 1:] = q[1:, 0] = -1 / tau**2
    q[1:, 1:] = np.diag(1 / tau**2 + 1 / sigma**2)
    b = np.concatenate([[0.0], y / sigma**2])
    cov = np.linalg.inv(q)
    mean = cov @ b

    def log_prob(mu, theta):
        lp = -0.5 * (mu / mu_scale) ** 2
        lp += -0.5 * tf.reduce_sum(((theta - mu[:, None]) / tau) ** 2, axis=-1)
        lp += -0.5 * tf.reduce_sum(((y - theta) / sigma) ** 2, axis=-1)
        return lp

    rng = np.random.default_rng(8)
    exact = mean + rng.normal(size=(_CHAINS, 9)) @ np.linalg.cholesky(cov).T
    x0 = [tf.constant(exact[:, 0]), tf.constant(exact[:, 1:])]
    configs = {
        "per-part diag": dict(
            step_size=0.6,
            inverse_mass=[tf.constant(cov[0, 0]), tf.constant(np.diag(cov)[1:])],
        ),
        "joint dense": dict(
            step_size=0.8,
            inverse_mass=tf.linalg.LinearOperatorFullMatrix(
                cov, is_self_adjoint=True, is_positive_definite=True
            ),
        ),
    }
    all_z = []
    for i, (name, kwargs) in enumerate(configs.items()):
        kernel = StanNUTS(log_prob, max_tree_depth=8, **kwargs)
        (mu, theta), (_, divergent) = _run_chains(kernel, x0, 150, [31, i])
        assert not divergent.numpy().any(), name
        draws = np.concatenate([mu.numpy()[..., None], theta.numpy()], axis=-1)
        per_chain = np.concatenate(
            [draws.mean(axis=0), ((draws - mean) ** 2).mean(axis=0)], axis=-1
        )
        truth = np.concatenate([mean, np.diag(cov)])
        all_z.append(_z_scores(per_chain, truth))
    _assert_z_scores_standard(np.stack(all_z))


# --------------------------------------------------------------------------
# No pathological resonance
# --------------------------------------------------------------------------

_STEP_SIZES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
_BLACKJAX_ROW = (63, 168, 31, 29, 15, 15, 15, 7)  # BlackJAX 1.7, D = 512, measured elsewhere


def _iid_log_prob(x):
    return -0.5 * tf.reduce_sum(x * x, axis=-1)


def _mean_leapfrogs(make_kernel, steps_of, step_sizes, dim=512, chains=4, num_results=100):
    @tf.function(jit_compile=True)
    def run(x, step_size, seed):
        return tfp.mcmc.sample_chain(
            num_results,
            x,
            kernel=make_kernel(step_size),
            seed=seed,
            trace_fn=lambda _, r: steps_of(r),
        )[1]

    x0 = tf.random.stateless_normal([chains, dim], seed=[1, 2])
    return np.array(
        [
            float(np.mean(run(x0, tf.constant(eps), tf.constant([3, 4])).numpy()))
            for eps in step_sizes
        ]
    )


def test_no_resonance_on_iid_gaussian():
    """Mean leapfrogs per transition on iid N(0, I), D = 512, 4 chains x 100 steps, max
    depth 10: within 1.25x of BlackJAX's (extra-check) row at every step size, while
    TFP 0.25's NUTS spikes at 0.2 and 0.4."""
    ours = _mean_leapfrogs(
        lambda eps: StanNUTS(_iid_log_prob, eps, max_tree_depth=10),
        lambda r: r.num_leapfrog_steps,
        _STEP_SIZES,
    )
    assert np.all(ours <= 1.25 * np.array(_BLACKJAX_ROW)), ours
    tfp_row = _mean_leapfrogs(
        lambda eps: tfp.mcmc.NoUTurnSampler(_iid_log_prob, eps, max_tree_depth=10),
        lambda r: r.leapfrogs_taken,
        (0.2, 0.4),
    )
    ours_at = ours[[_STEP_SIZES.index(0.2), _STEP_SIZES.index(0.4)]]
    assert np.all(tfp_row > 4 * ours_at), (tfp_row, ours_at)


@pytest.mark.slow
def test_no_resonance_full_tfp_row():
    """The whole sweep for TFP beside ours and ours with jitter (the table of
    benchmarks/nuts_resonance.py).  Jitter draws smaller steps too, so its row is only
    required to stay within 2x of the unjittered one (no resonance of its own)."""
    tfp_row = _mean_leapfrogs(
        lambda eps: tfp.mcmc.NoUTurnSampler(_iid_log_prob, eps, max_tree_depth=10),
        lambda r: r.leapfrogs_taken,
        _STEP_SIZES,
    )
    ours = _mean_leapfrogs(
        lambda eps: StanNUTS(_iid_log_prob, eps, max_tree_depth=10),
        lambda r: r.num_leapfrog_steps,
        _STEP_SIZES,
    )
    jittered = _mean_leapfrogs(
        lambda eps: StanNUTS(_iid_log_prob, eps, max_tree_depth=10, step_size_jitter=0.3),
        lambda r: r.num_leapfrog_steps,
        _STEP_SIZES,
    )
    assert np.all(ours <= 1.25 * np.array(_BLACKJAX_ROW)), ours
    assert np.all(jittered <= 2 * ours), (jittered, ours)
    spikes = tfp_row[[_STEP_SIZES.index(0.2), _STEP_SIZES.index(0.4)]]
    assert np.all(spikes > 300), tfp_row


# --------------------------------------------------------------------------
# Composition with TFP's step-size adaptation
# --------------------------------------------------------------------------


def test_dual_averaging_keeps_metric_under_xla():
    """`DualAveragingStepSizeAdaptation(StanNUTS(...))` in `sample_chain` under XLA with
    the default hooks; the wrapper rebuilds its inner kernel from `parameters`, and the
    metric must survive: with it the anisotropic target is whitened."""
    scales = np.logspace(-2.0, 0.0, 16)
    variance = tf.constant(scales**2, tf.float32)

    def log_prob(x):
        return -0.5 * tf.reduce_sum(x**2 / variance, axis=-1)

    def adapt(inverse_mass):
        kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
            StanNUTS(log_prob, 0.1, max_tree_depth=10, inverse_mass=inverse_mass),
            num_adaptation_steps=150,
        )
        assert kernel.inner_kernel.inverse_mass is inverse_mass

        @tf.function(jit_compile=True)
        def run(x, seed):
            return tfp.mcmc.sample_chain(
                100,
                x,
                kernel=kernel,
                num_burnin_steps=200,
                seed=seed,
                trace_fn=lambda _, r: (
                    r.inner_results.step_size,
                    r.inner_results.tree_depth,
                    r.inner_results.accept_prob,
                ),
            )

        x0 = tf.random.stateless_normal([8, 16], seed=[1, 1]) * scales.astype(np.float32)
        draws, (step_size, depth, accept) = run(x0, tf.constant([2, 3]))
        return draws.numpy(), float(step_size[-1]), depth.numpy().mean(), accept.numpy().mean()

    draws, eps_metric, depth_metric, accept_metric = adapt(variance)
    _, eps_identity, depth_identity, accept_identity = adapt(None)
    assert eps_metric > 10 * eps_identity
    assert depth_metric < depth_identity - 2
    for accept in (accept_metric, accept_identity):  # target_accept_prob 0.75
        assert 0.6 < accept < 0.92
    assert np.all(np.isfinite(draws))


# --------------------------------------------------------------------------
# Contract, structure, modes, seeds
# --------------------------------------------------------------------------


def test_public_names():
    assert set(nuts.__all__) == {"NoUTurnSampler", "StanNUTS", "StanNUTSResults"}
    assert nuts.NoUTurnSampler is StanNUTS  # the name the kernel builder imports


def test_bootstrap_and_result_fields():
    kernel = StanNUTS(_iid_log_prob, 0.3)
    x = tf.random.stateless_normal([3, 4], seed=[0, 0])
    results = kernel.bootstrap_results(x)
    assert isinstance(results, StanNUTSResults)
    np.testing.assert_allclose(results.target_log_prob, _iid_log_prob(x))
    np.testing.assert_allclose(results.grads_target_log_prob[0], -x)
    assert kernel.is_calibrated
    assert set(kernel.parameters) == {
        "target_log_prob_fn",
        "step_size",
        "max_tree_depth",
        "inverse_mass",
        "step_size_jitter",
        "max_energy_error",
        "name",
    }
    assert type(kernel)(**kernel.parameters).parameters == kernel.parameters
    x1, r1 = kernel.one_step(x, results, seed=tf.constant([1, 2]))
    assert x1.shape == x.shape
    for field in ["log_accept_ratio", "accept_prob", "is_divergent", "energy"]:
        assert getattr(r1, field).shape == (3,)
    assert r1.tree_depth.dtype == tf.int32 and r1.num_leapfrog_steps.dtype == tf.int32
    np.testing.assert_allclose(np.exp(r1.log_accept_ratio), r1.accept_prob, rtol=1e-6)
    assert np.all((0 <= r1.accept_prob.numpy()) & (r1.accept_prob.numpy() <= 1))
    np.testing.assert_array_equal(r1.seed, [1, 2])
    np.testing.assert_allclose(r1.target_log_prob, _iid_log_prob(x1), rtol=1e-6)
    np.testing.assert_allclose(r1.grads_target_log_prob[0], -x1, rtol=1e-6)
    # Stan sign: H = -log p(x) + K(p) >= -log p(x).
    assert np.all(r1.energy.numpy() >= -r1.target_log_prob.numpy() - 1e-6)


def test_energy_is_stans_hamiltonian():
    """At stationarity on iid N(0, I_D) with -log p = |x|^2 / 2, E[H] = D/2 + D/2 = D."""
    dim, chains = 16, 512
    kernel = StanNUTS(_iid_log_prob, 0.5)
    x0 = tf.random.stateless_normal([chains, dim], seed=[4, 4])
    _, results = tf.function(kernel.one_step, jit_compile=True)(
        x0, kernel.bootstrap_results(x0), tf.constant([1, 1])
    )
    energy = results.energy.numpy()
    z = (energy.mean() - dim) / (energy.std(ddof=1) / np.sqrt(chains))
    assert abs(z) < 4.0, z


@pytest.mark.parametrize("structure", ["list", "tuple", "tensor"])
def test_state_structure_is_preserved(structure):
    def log_prob(a, b):
        return -0.5 * (tf.reduce_sum(a**2, axis=[-2, -1]) + b**2)

    a = tf.random.stateless_normal([2, 3, 4], seed=[0, 1])
    b = tf.random.stateless_normal([2], seed=[0, 2])
    if structure == "tensor":
        kernel = StanNUTS(lambda x: log_prob(x, tf.zeros_like(x[:, 0, 0])), 0.4)
        state = a
    else:
        kernel = StanNUTS(log_prob, [0.4, 0.2], inverse_mass=[tf.ones([3, 4]), None])
        state = [a, b] if structure == "list" else (a, b)
    new_state, results = kernel.one_step(state, kernel.bootstrap_results(state), seed=[3, 3])
    if structure == "tensor":
        assert isinstance(new_state, tf.Tensor) and new_state.shape == a.shape
    else:
        assert type(new_state) is type(state)
        assert [s.shape for s in new_state] == [a.shape, b.shape]
        assert len(results.grads_target_log_prob) == 2


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_eager_equals_graph_and_xla_runs(dtype):
    kernel = StanNUTS(_iid_log_prob, 0.4, max_tree_depth=6)
    x = tf.cast(tf.random.stateless_normal([5, 3], seed=[5, 5]), dtype)
    results = kernel.bootstrap_results(x)
    seed = tf.constant([7, 7])
    eager = kernel.one_step(x, results, seed)
    graph = tf.function(kernel.one_step)(x, results, seed)
    xla = tf.function(kernel.one_step, jit_compile=True)(x, results, seed)
    tf.nest.map_structure(np.testing.assert_array_equal, eager, graph)
    assert xla[0].dtype == dtype and np.all(np.isfinite(xla[0].numpy()))
    assert np.all(xla[1].num_leapfrog_steps.numpy() >= 1)


def test_seeds_are_stateless_and_reproducible():
    kernel = StanNUTS(_iid_log_prob, 0.4, max_tree_depth=6)
    x = tf.random.stateless_normal([4, 3], seed=[5, 6])
    results = kernel.bootstrap_results(x)
    step = tf.function(kernel.one_step, jit_compile=True)
    first = step(x, results, tf.constant([1, 2]))[0].numpy()
    again = step(x, results, tf.constant([1, 2]))[0].numpy()
    other = step(x, results, tf.constant([1, 3]))[0].numpy()
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)


def test_divergence_is_flagged_and_state_kept():
    """A step far beyond the stability limit diverges at the first leaf: the subtree is
    rejected, the chain stays put, depth 0, one leapfrog."""
    kernel = StanNUTS(_iid_log_prob, 10.0)
    x = tf.random.stateless_normal([4, 50], seed=[8, 8])
    x1, results = kernel.one_step(x, kernel.bootstrap_results(x), seed=[1, 1])
    assert np.all(results.is_divergent.numpy())
    np.testing.assert_array_equal(x1, x)
    np.testing.assert_array_equal(results.tree_depth, 0)
    np.testing.assert_array_equal(results.num_leapfrog_steps, 1)
    assert not np.any(results.is_accepted.numpy())


def test_max_tree_depth_caps_the_trajectory():
    kernel = StanNUTS(_iid_log_prob, 1e-3, max_tree_depth=3)
    x = tf.random.stateless_normal([2, 3], seed=[9, 9])
    _, results = kernel.one_step(x, kernel.bootstrap_results(x), seed=[1, 1])
    np.testing.assert_array_equal(results.tree_depth, 3)
    np.testing.assert_array_equal(results.num_leapfrog_steps, 7)


def test_step_size_jitter_scales_the_step_per_chain():
    """One leapfrog from x = 0 on N(0, 1) moves by exactly eps_c * p0: with jitter j,
    eps_c / eps spreads over [1 - j, 1 + j]; without, it is 1."""
    x = tf.zeros([512, 1], tf.float64)
    seed = tf.constant([4, 2])
    p0, _ = _replay_randomness(seed, x, None, 1)
    ratios = {}
    for jitter in (0.0, 0.5):
        kernel = StanNUTS(_iid_log_prob, 0.3, max_tree_depth=1, step_size_jitter=jitter)
        x1, results = kernel.one_step(x, kernel.bootstrap_results(x), seed)
        moved = results.is_accepted.numpy()
        assert moved.mean() > 0.5
        ratios[jitter] = np.abs(x1.numpy()[moved, 0] / p0[moved, 0]) / 0.3
    np.testing.assert_allclose(ratios[0.0], 1.0, rtol=1e-12)
    assert ratios[0.5].min() >= 0.5 - 1e-12 and ratios[0.5].max() <= 1.5 + 1e-12
    assert abs(ratios[0.5].std() - 1 / np.sqrt(12)) < 0.05  # uniform over [0.5, 1.5]


def test_invalid_arguments():
    with pytest.raises(ValueError, match="max_tree_depth"):
        StanNUTS(_iid_log_prob, 0.1, max_tree_depth=0)
    with pytest.raises(ValueError, match="step_size_jitter"):
        StanNUTS(_iid_log_prob, 0.1, step_size_jitter=1.0)
    with pytest.raises(ValueError, match="is_self_adjoint"):
        StanNUTS(_iid_log_prob, 0.1, inverse_mass=tf.linalg.LinearOperatorFullMatrix(np.eye(2)))
    kernel = StanNUTS(lambda a, b: _iid_log_prob(a) + _iid_log_prob(b), [0.1, 0.2, 0.3])
    x = [tf.zeros([2, 3]), tf.zeros([2, 3])]
    with pytest.raises(ValueError, match="step_size"):
        kernel.bootstrap_results(x)
    kernel = StanNUTS(
        lambda a, b: _iid_log_prob(a) + _iid_log_prob(b), 0.1, inverse_mass=[tf.ones([3])]
    )
    with pytest.raises(ValueError, match="inverse_mass"):
        kernel.one_step(x, kernel.bootstrap_results(x), seed=[1, 1])


# --------------------------------------------------------------------------
# The benchmark script
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_benchmark_script_runs_on_tiny_sizes():
    path = REPO / "benchmarks" / "nuts_resonance.py"
    module = load_script(path, "nuts_resonance")
    out = module.main(
        ["--dim", "16", "--steps", "3", "--field-size", "8", "--speed-steps", "2", "--repeats", "1"]
    )
    assert set(out["resonance"]) >= {"TFP 0.25 NUTS", "StanNUTS"}
    assert len(out["speed"]) == 6


@pytest.mark.slow
def test_field_benchmark_script_runs_on_tiny_sizes(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # it imports sampling.py
    module = load_script(REPO / "benchmarks" / "nuts_field.py", "nuts_field")
    out = module.main(
        ["--n", "8", "--chains", "2", "--speed-steps", "2", "--repeats", "1"]
        + ["--burnin", "10", "--results", "10", "--max-depth", "4", "--no-peers"]
        + ["--target-accept", "0.7"]
    )
    assert len(out["speed"]) == 2 and all(v > 0 for v in out["speed"].values())
    assert set(out["ess"]) == {"fieldnuts", "nuts"}
    assert all(r["grads_per_ess"] > 0 for r in out["ess"].values())
