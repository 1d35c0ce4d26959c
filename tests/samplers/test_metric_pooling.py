"""The windowed diagonal metric pooled over |k| shells (samplers/metric_pooling.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.samplers.driver import Sampler, SamplerSettings, windowed_scales
from fieldhmc.samplers.metric_pooling import shrink_to_groups
from fieldhmc.samplers.storage import MemorySink


def _reference(var, count, groups):
    """The positive-part James-Stein estimate, one group at a time (plain loops)."""
    v = np.asarray(var, np.float64).ravel()
    g = np.asarray(groups).ravel()
    out = v.copy()
    for label in set(g.tolist()):
        idx = [i for i in range(v.size) if g[i] == label]
        if len(idx) < 2:
            continue
        vals = v[idx]
        mean = sum(vals) / len(vals)
        spread = sum((x - mean) ** 2 for x in vals) / (len(vals) - 1)
        noise = 2.0 * mean**2 / (count - 1.0)
        lam = 1.0 if spread == 0 else min(1.0, noise / spread)
        for i in idx:
            out[i] = mean + (1.0 - lam) * (v[i] - mean)
    return out.reshape(np.shape(var))


def test_matches_a_loop_reference():
    rng = np.random.default_rng(0)
    var = rng.gamma(3.0, 1.0, size=(4, 5, 6))
    groups = rng.integers(0, 7, size=(4, 5, 6))
    groups[0, 0, 0] = 99  # a group of one is kept
    got = shrink_to_groups(var, 40.0, groups)
    np.testing.assert_allclose(got, _reference(var, 40.0, groups), rtol=1e-12)
    assert got[0, 0, 0] == var[0, 0, 0]


def _window_estimates(rng, true_var, n):
    """Variance estimates of ``n`` iid Gaussian draws per coordinate."""
    x = rng.standard_normal((n, true_var.size)) * np.sqrt(true_var)
    return x.var(axis=0, ddof=1)


def test_equal_variances_are_pooled_and_unequal_ones_kept():
    """A group whose true variances are equal (its spread is sampling noise) is pulled to
    its mean: the error falls by most of the way to the pooled estimate's. A group whose
    true variances differ by 4x keeps them: shrinking would bias every one."""
    rng = np.random.default_rng(1)
    n, size = 100, 200
    equal = np.full(size, 2.0)
    unequal = np.repeat([0.5, 2.0], size // 2)
    true = np.concatenate([equal, unequal])
    groups = np.repeat([0, 1], size)
    est = _window_estimates(rng, true, n)
    got = shrink_to_groups(est, n, groups)
    err_raw = np.sqrt(np.mean((est[:size] / equal - 1) ** 2))
    err_pooled = np.sqrt(np.mean((got[:size] / equal - 1) ** 2))
    assert err_raw > 0.1  # sqrt(2 / n) = 0.14
    assert err_pooled < 0.5 * err_raw
    # the unequal group: each half stays near its own variance
    halves = got[size:].reshape(2, -1).mean(axis=1)
    np.testing.assert_allclose(halves, [0.5, 2.0], rtol=0.1)


def test_bad_groups_are_refused():
    with pytest.raises(ValueError, match="3 labels for 4 variances"):
        shrink_to_groups(np.ones(4), 10.0, np.zeros(3, int))


def test_windowed_scales_pool_only_the_parts_with_groups():
    rng = np.random.default_rng(2)
    count = 50.0
    x = [np.zeros((2, 8), np.float32), np.zeros((2,), np.float32)]
    m2 = [rng.gamma(4.0, 1.0, 8) * (count - 1), np.float64(3.0 * (count - 1))]
    lw = [np.float64(count), np.zeros(8), m2[0], np.float64(0.0), m2[1]]
    groups = [np.repeat([0, 1], 4), None]
    plain = windowed_scales(x, lw)
    pooled = windowed_scales(x, lw, groups)
    var = m2[0] / (count - 1)
    shrunk = shrink_to_groups(var, count, groups[0])
    expect = np.sqrt((count / (count + 5)) * shrunk + 1e-3 * 5 / (count + 5))
    np.testing.assert_allclose(pooled[0], expect, rtol=1e-6)
    assert pooled[1] == plain[1]
    assert np.std(pooled[0][:4]) < np.std(plain[0][:4])


GROUP_SD = np.repeat(np.array([0.1, 0.5, 2.0], np.float32), 16)


def test_the_driver_pools_the_adapted_metric(tmp_path):
    """Three groups of 16 equal variances, the metric starting 1.5x too wide (a prior
    metric's start): the adapted scales' spread within each group, relative to its true
    scale, is smaller with the groups than without. Both runs of a seed see the same
    draws in the one window (75 + 25 + 50 transitions), so their ratio is the shrinkage
    alone: 1 without it; with it 0.60-0.87 over 12 seeds (medians 0.70 and 0.73 with
    TFP's leapfrog and ours, whose float32 draws round differently), the draws'
    autocorrelation tripling the spread over independent draws' noise. The mean of four
    seeds' ratios (spread ~0.035 about ~0.72) is tested against 0.85."""

    def target(x):
        return -0.5 * tf.reduce_sum(tf.cast((x / GROUP_SD) ** 2, tf.float64), axis=-1)

    settings = SamplerSettings(
        kind="hmc",
        num_chains=4,
        num_burnin_steps=150,
        num_results=1,
        num_leapfrog_steps=8,
        jitter_leapfrog=True,
        chunk_size=151,
        seed=3,
        adapt_diagonal=True,
    )
    # one compiled sampler for every run: the groups act on the host, at a window's end
    sampler = Sampler(target, settings, ["x"], [1.5 * GROUP_SD])
    init = np.random.default_rng(0).standard_normal((4, GROUP_SD.size)).astype(np.float32)

    def spread(scales):
        return np.std(np.log(scales.reshape(3, 16) / GROUP_SD.reshape(3, 16)), axis=1).mean()

    ratios = []
    for seed in range(4):
        sampler.metric_groups = None
        plain = sampler.run(MemorySink(), tmp_path / f"p{seed}", [init], progress=False, seed=seed)
        sampler.metric_groups = [np.repeat([0, 1, 2], 16)]
        pooled = sampler.run(MemorySink(), tmp_path / f"g{seed}", [init], progress=False, seed=seed)
        ratios.append(spread(pooled.scales[0]) / spread(plain.scales[0]))
    assert np.mean(ratios) < 0.85, ratios


def test_metric_groups_must_match_the_parts():
    settings = SamplerSettings(kind="hmc", num_chains=2, adapt_diagonal=True)
    with pytest.raises(ValueError, match="1 entries for 2 parts"):
        Sampler(lambda x, h: x, settings, ["x", "h"], [1.0, 1.0], metric_groups=[None])


@pytest.mark.parametrize("grid_key", ["even", "odd"])
def test_model_groups_are_the_modes_distinct_wavenumbers(grid_key):
    """FieldModel.metric_groups: two field coordinates share a label exactly when their
    modes' |k| are equal (NumPy wavenumbers, rounded to 1e-9 h/Mpc), the mean mode's
    coordinate is alone, the scalar parameters are not pooled."""
    from fieldhmc.ops import HermitianPacking
    from tests.models.conftest import GRIDS, build_model

    model, _ = build_model(grid_key, "gaussian", "noncentred", True)
    groups = model.metric_groups()
    assert len(groups) == len(model.latent_names)
    for name, g in zip(model.latent_names, groups, strict=True):
        assert (g is None) == (name != "field")
    labels = groups[model.latent_names.index("field")].ravel()
    shape, box = GRIDS[grid_key]
    k = [2 * np.pi * np.fft.fftfreq(n, d=length / n) for n, length in zip(shape, box, strict=True)]
    k[2] = np.abs(k[2][: shape[2] // 2 + 1])
    kmag = np.sqrt(k[0][:, None, None] ** 2 + k[1][None, :, None] ** 2 + k[2][None, None, :] ** 2)
    kj = np.round(kmag.ravel()[np.asarray(HermitianPacking(shape).mode_of_real)], 9)
    same_label = labels[:, None] == labels[None, :]
    same_k = kj[:, None] == kj[None, :]
    np.testing.assert_array_equal(same_label, same_k)
    assert np.sum(labels == labels[kj == 0][0]) == 1
