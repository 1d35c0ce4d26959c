"""The dense metric of the scalar parameters (``adapt_dense_params``, or a fixed
``dense_factor``): the window's estimate, the model <-> kernel coordinate map, sampling a
correlated target, resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.diagnostics import ess_bulk
from fieldhmc.samplers import dense_metric
from fieldhmc.samplers.driver import Sampler, SamplerSettings, _welford_update, _zero_welford
from fieldhmc.samplers.storage import H5TraceSink, MemorySink, read_traces
from tests.samplers.test_driver import _assert_standard_normal, _zscores

# Three scalar parameters, strongly correlated (0.95 and -0.8), of different widths, and a
# 16-d vector part of unit-free widths: the target the dense block is for.
P_SD = np.array([0.5, 2.0, 0.1])
P_CORR = np.array([[1.0, 0.95, -0.8], [0.95, 1.0, -0.7], [-0.8, -0.7, 1.0]])
P_COV = P_CORR * np.outer(P_SD, P_SD)
P_MU = np.array([1.0, -2.0, 0.3])
P_PREC = np.linalg.inv(P_COV)
V_SD = np.geomspace(0.2, 3.0, 16)


def correlated_target(v, a, b, c):
    """N(P_MU, P_COV) over (a, b, c) times independent N(0, V_SD^2) over v; float64."""
    theta = tf.stack([tf.cast(p, tf.float64) for p in (a, b, c)], -1) - P_MU
    quad = tf.einsum("ci,ij,cj->c", theta, tf.constant(P_PREC), theta)
    z = tf.cast(v, tf.float64) / V_SD
    return -0.5 * quad - 0.5 * tf.reduce_sum(z**2, axis=-1)


NAMES = ["v", "a", "b", "c"]


def _init(chains=4, seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((chains, V_SD.size)).astype(np.float32),
        *[(P_MU[i] + 0.1 * rng.standard_normal(chains)).astype(np.float32) for i in range(3)],
    ]


def _sampler(**kw):
    settings = SamplerSettings(
        **{
            "kind": "hmc",
            "num_chains": 4,
            "num_burnin_steps": 300,
            "num_results": 400,
            "num_leapfrog_steps": 8,
            "jitter_leapfrog": True,
            "chunk_size": 100,
            "adapt_diagonal": True,
            "adapt_dense_params": True,
            **kw,
        }
    )
    scales = [np.ones(V_SD.size, np.float32), *[np.float32(1.0)] * 3]
    return Sampler(correlated_target, settings, NAMES, scales)


# -- the window's estimate and the coordinate map --------------------------------------------
def test_window_estimate_is_the_regularised_pooled_covariance():
    """Welford over steps of 4 chains equals NumPy's covariance of all the draws, and the
    factor reproduces Stan's regularised covariance: S L L^T S."""
    rng = np.random.default_rng(3)
    draws = rng.multivariate_normal(P_MU, P_COV, size=(60, 4))  # step, chain, p
    acc = _zero_welford([(3,)])  # the driver's diagonal moments alongside: the same count
    mean, com = dense_metric.zero_block_moments(3)
    for step in draws:
        mean, com = dense_metric.welford_block_update(acc[0], mean, com, tf.constant(step))
        acc = _welford_update(acc, [tf.constant(step)])
    n = float(acc[0])
    np.testing.assert_allclose(np.diag(com), acc[2], rtol=1e-12)
    assert n == 240
    flat = draws.reshape(-1, 3)
    np.testing.assert_allclose(mean, flat.mean(0), rtol=1e-12)
    cov = np.cov(flat, rowvar=False)
    np.testing.assert_allclose(np.asarray(com) / (n - 1), cov, rtol=1e-10)
    scales, factor = dense_metric.dense_window_estimate(n, np.asarray(com))
    expected = (n / (n + 5)) * cov + 1e-3 * (5 / (n + 5)) * np.eye(3)
    rebuilt = np.outer(scales, scales) * (factor @ factor.T)
    np.testing.assert_allclose(rebuilt, expected, rtol=1e-12)
    assert np.allclose(np.triu(factor, 1), 0.0)
    # 240 draws: the correlations within a few of their standard errors (~0.02-0.05)
    np.testing.assert_allclose(factor @ factor.T, P_CORR, atol=0.15)


def test_block_map_round_trips_and_whitens():
    """x -> u -> x is the identity (TF and NumPy, float32 and float64); the map of the
    exact factor takes N(P_MU, P_COV) draws to unit covariance."""
    scales = np.sqrt(np.diag(P_COV))
    factor = np.linalg.cholesky(P_CORR)
    rng = np.random.default_rng(4)
    x = rng.multivariate_normal(P_MU, P_COV, size=20000)
    for dtype in (np.float32, np.float64):
        parts = [np.ones((5, 2), dtype), *[x[:5, i].astype(dtype) for i in range(3)]]
        w = [parts[0], *[parts[1 + i] / scales[i].astype(dtype) for i in range(3)]]
        u_tf = dense_metric.unmix([tf.constant(p) for p in w], tf.constant(factor), (1, 2, 3))
        u_np = dense_metric.unmix_numpy(w, factor, (1, 2, 3))
        for a, b in zip(u_tf, u_np, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_allclose(a.numpy(), b, rtol=1e-5 if dtype == np.float32 else 1e-12)
        back = dense_metric.mix(u_tf, tf.constant(factor), (1, 2, 3))
        back_np = dense_metric.mix_numpy(u_np, factor, (1, 2, 3))
        for a, b, c in zip(back, back_np, w, strict=True):
            tol = 1e-5 if dtype == np.float32 else 1e-12
            np.testing.assert_allclose(a.numpy(), c, rtol=tol, atol=tol)
            np.testing.assert_allclose(b, c, rtol=tol, atol=tol)
    u = dense_metric.unmix_numpy(list((x / scales).T), factor, (0, 1, 2))
    np.testing.assert_allclose(np.cov(np.stack(u)), np.eye(3), atol=0.05)


def test_sampler_maps_match_the_numpy_maps():
    """The driver's in-graph ``x -> u`` (chunk start) and ``u -> x`` (kernel target, traces)
    and its host-side ``x -> u`` (bootstrap at a window's end) are one map."""
    sampler = _sampler()
    scales = [V_SD.astype(np.float32), *np.sqrt(np.diag(P_COV)).astype(np.float32)]
    factor = np.linalg.cholesky(P_CORR)
    metric = sampler._scales_tensors(scales, tf.float32, factor)
    x = _init(seed=5)
    u_host = sampler._to_u(x, scales, factor)
    u_graph = sampler._to_u_fn(metric)([tf.constant(p) for p in x])
    for a, b in zip(u_host, u_graph, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-6, atol=2e-6)
    back = sampler._to_x_fn(metric)(u_graph)
    for a, b in zip(back, x, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=2e-6, atol=2e-6)


def test_option_rules():
    with pytest.raises(ValueError, match="set adapt_diagonal too"):
        SamplerSettings(adapt_dense_params=True)
    with pytest.raises(ValueError, match="mclmc's own tuning"):
        SamplerSettings(kind="mclmc", adapt_diagonal=True, adapt_dense_params=True)
    settings = SamplerSettings(adapt_diagonal=True, adapt_dense_params=True)
    with pytest.raises(ValueError, match="needs >= 2 scalar parts"):
        Sampler(lambda v, a: a, settings, ["v", "a"], [np.ones(3), np.float32(1.0)])


# -- sampling ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dense_run(tmp_path_factory):
    sampler = _sampler()
    sink = MemorySink()
    summary = sampler.run(sink, tmp_path_factory.mktemp("dense"), _init(), progress=False)
    return sampler, sink.stacked_traces(), summary


@pytest.mark.slow
def test_dense_block_samples_the_correlated_target(dense_run):
    """Draws of (a, b, c) whitened by the exact covariance, y = C^{-1/2}(theta - mu): the
    means, variances and cross-moments of y (independent under the target, so their
    z-scores are too) by MCSE z-scores."""
    _, traces, summary = dense_run
    assert summary.complete
    theta = np.stack([traces[n] for n in ("a", "b", "c")], -1)  # draw, chain, 3
    y = np.linalg.solve(np.linalg.cholesky(P_COV), (theta - P_MU)[..., None])[..., 0]
    z = _zscores(y, np.zeros(3), np.ones(3))
    cross = np.stack([y[..., i] * y[..., j] for i, j in ((0, 1), (0, 2), (1, 2))], -1)
    post = np.moveaxis(cross, 0, 1)  # chain, draw, 3; each product has mean 0, variance 1
    z_cross = post.mean(axis=(0, 1)) / np.sqrt(1.0 / ess_bulk(post))
    _assert_standard_normal(np.concatenate([z, z_cross]))


@pytest.mark.slow
def test_dense_factor_recovers_the_correlation(dense_run):
    """The last window's factor: L L^T within 0.1 of the target's correlation, and the
    block's scales within 30% of its widths."""
    _, _, summary = dense_run
    factor = summary.dense_factor
    np.testing.assert_allclose(factor @ factor.T, P_CORR, atol=0.1)
    block = np.array([summary.scales[i] for i in (1, 2, 3)])
    assert np.all(np.abs(block / P_SD - 1) < 0.3), block / P_SD


# -- resume ---------------------------------------------------------------------------------
def _resume_sampler():
    return _sampler(seed=9, num_burnin_steps=120, num_results=40, chunk_size=40)


def _run(sampler, tmp_path: Path, max_chunks=None, resume=False):
    sink = H5TraceSink(tmp_path / "traces.h5")
    init = None if resume else _init()
    return sampler.run(
        sink, tmp_path / "checkpoint", init, progress=False, max_chunks=max_chunks, resume=resume
    )


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The uninterrupted run, its sampler (which then runs the killed runs: a sampler runs
    many times without retracing) and a second sampler that resumes them, as a new process
    would."""
    path = tmp_path_factory.mktemp("full")
    sampler = _resume_sampler()
    return path, _run(sampler, path), sampler, _resume_sampler()


@pytest.mark.parametrize("max_chunks", [3, 5], ids=["inside_window", "after_window"])
def test_resume_inside_and_after_a_window_is_bit_identical(full_run, tmp_path, max_chunks):
    """Chunks [0, 18), [18, 40), [40, 80), [80, 108), [108, 120), ...: killed at step 80
    (inside the only window, 18-108) or at 120 (after its dense update), resumed by
    another sampler: the same bytes, and the same dense factor. The checkpoint holds 11
    windowed-moment arrays (lw0..lw10; a resume read them in string order, lw10 before
    lw2, and failed for any model of >= 5 parts inside a window, diagonal included)."""
    full_path, full, sampler, resumer = full_run
    partial = _run(sampler, tmp_path, max_chunks=max_chunks)
    assert not partial.complete
    resumed = _run(resumer, tmp_path, resume=True)
    assert resumed.complete
    t_full = read_traces(full_path / "traces.h5")
    t_res = read_traces(tmp_path / "traces.h5")
    assert t_full.keys() == t_res.keys()
    for name in t_full:
        assert t_full[name].tobytes() == t_res[name].tobytes(), name
    for a, b in zip(full.latent_state, resumed.latent_state, strict=True):
        assert a.tobytes() == b.tobytes()
    assert full.dense_factor.tobytes() == resumed.dense_factor.tobytes()
    assert not np.allclose(full.dense_factor, np.eye(3))  # the window did update it


def test_resume_refuses_a_checkpoint_of_the_other_metric(full_run):
    full_path = full_run[0]
    diagonal = Sampler(
        correlated_target,
        SamplerSettings(
            kind="hmc", num_burnin_steps=120, num_results=40, chunk_size=40, adapt_diagonal=True
        ),
        NAMES,
        [np.ones(V_SD.size, np.float32), *[np.float32(1.0)] * 3],
    )
    with pytest.raises(ValueError, match="holds a dense parameter metric"):
        diagonal.run(MemorySink(), full_path / "checkpoint", resume=True, progress=False)


# -- a fixed factor (the posterior metric's Fisher block) ------------------------------------
def _fixed_sampler(factor):
    settings = SamplerSettings(
        kind="hmc",
        num_chains=4,
        num_burnin_steps=150,
        num_results=400,
        num_leapfrog_steps=8,
        jitter_leapfrog=True,
        chunk_size=550,
        seed=3,
    )
    scales = [V_SD.astype(np.float32), *P_SD.astype(np.float32)]
    return Sampler(correlated_target, settings, NAMES, scales, dense_factor=factor)


@pytest.fixture(scope="module")
def fixed_runs(tmp_path_factory):
    """The exact metric (marginal widths, the correlation's factor) fixed, and the same
    widths without the factor: one run each."""
    out = {}
    for name, factor in (("dense", np.linalg.cholesky(P_CORR)), ("diagonal", None)):
        sampler = _fixed_sampler(factor)
        sink = MemorySink()
        path = tmp_path_factory.mktemp(name)
        summary = sampler.run(sink, path, _init(), progress=False)
        out[name] = (sink.stacked_traces(), summary)
    return out


def test_fixed_factor_samples_the_target_and_stays_fixed(fixed_runs):
    """With the exact factor the block is white to the kernel: the draws match the target
    (MCSE z-scores of y = C^{-1/2}(theta - mu)), the factor is the given one at the end,
    and the tuned step is several times the diagonal metric's, which must resolve the
    narrow direction of the 0.95 correlation (eigenvalue 0.03 of the correlation)."""
    traces, summary = fixed_runs["dense"]
    assert summary.complete
    np.testing.assert_array_equal(summary.dense_factor, np.linalg.cholesky(P_CORR))
    theta = np.stack([traces[n] for n in ("a", "b", "c")], -1)
    y = np.linalg.solve(np.linalg.cholesky(P_COV), (theta - P_MU)[..., None])[..., 0]
    _assert_standard_normal(_zscores(y, np.zeros(3), np.ones(3)))
    _, diagonal = fixed_runs["diagonal"]
    assert diagonal.dense_factor is None
    step_dense, step_diag = summary.tuned["step_size"], diagonal.tuned["step_size"]
    assert step_dense > 2.0 * step_diag, (step_dense, step_diag)


def test_fixed_factor_rules():
    settings = SamplerSettings()
    scales = [np.ones(3), np.float32(1.0), np.float32(1.0)]
    target = lambda v, a, b: a + b  # noqa: E731
    with pytest.raises(ValueError, match="lower-triangular"):
        Sampler(target, settings, ["v", "a", "b"], scales, dense_factor=np.ones((2, 2)))
    with pytest.raises(ValueError, match="lower-triangular"):
        Sampler(target, settings, ["v", "a", "b"], scales, dense_factor=np.eye(3))
    with pytest.raises(ValueError, match="positive diagonal"):
        Sampler(target, settings, ["v", "a", "b"], scales, dense_factor=-np.eye(2))
    with pytest.raises(ValueError, match="dense_factor needs >= 2 scalar parts"):
        Sampler(target, settings, ["v", "a", "b"], scales[:2], dense_factor=np.eye(1))


def test_set_metric_replaces_the_start_metric_and_checks_it():
    sampler = _fixed_sampler(np.linalg.cholesky(P_CORR))
    scales = [np.full(V_SD.size, 2.0, np.float32), *np.float32([1.0, 2.0, 3.0])]
    sampler.set_metric(scales, np.eye(3))
    np.testing.assert_array_equal(sampler._initial_dense_factor, np.eye(3))
    assert [float(s) for s in sampler.initial_scales[1:]] == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="shapes differ"):
        sampler.set_metric(scales[:2])
    with pytest.raises(ValueError, match="lower-triangular"):
        sampler.set_metric(scales, np.ones((3, 3)))
    plain = Sampler(correlated_target, SamplerSettings(), NAMES, scales)
    with pytest.raises(ValueError, match="no dense block"):
        plain.set_metric(scales, np.eye(3))


def test_fixed_factor_survives_the_windowed_diagonal(tmp_path):
    """A fixed factor with ``adapt_diagonal`` (windowed scales, no dense adaptation): the
    windows update the scales and keep the factor."""
    factor = np.linalg.cholesky(P_CORR)
    settings = SamplerSettings(
        kind="hmc",
        num_chains=4,
        num_burnin_steps=120,
        num_results=10,
        num_leapfrog_steps=4,
        chunk_size=130,
        adapt_diagonal=True,
    )
    scales = [np.ones(V_SD.size, np.float32), *P_SD.astype(np.float32)]
    sampler = Sampler(correlated_target, settings, NAMES, scales, dense_factor=factor)
    summary = sampler.run(MemorySink(), tmp_path, _init(), progress=False)
    assert summary.complete
    np.testing.assert_array_equal(summary.dense_factor, factor)
    assert not np.allclose(summary.scales[0], 1.0)  # the window did update the scales
