"""Power spectra: values, P(0) = 0, batched TF hyperparameters, gradients, tables."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.models import PowerLaw, TabulatedPower, TurnoverPowerLaw
from tests.models.numpy_reference import power_law

K = np.array([0.0, 0.01, 0.05, 0.1, 0.3, 1.0])


def _spectra():
    return [
        PowerLaw(2000.0, -1.5, 0.1),
        TurnoverPowerLaw(800.0, 1.0, 0.1, k_turnover=0.03, turnover_index=4.0),
        TurnoverPowerLaw(800.0, 0.5, 0.2, k_turnover=0.05, turnover_index=3.0, k_cutoff=0.5),
        TabulatedPower(np.geomspace(1e-3, 2.0, 40), 1e4 * np.geomspace(1e-3, 2.0, 40) ** -1.2),
    ]


def test_power_law_values():
    p = PowerLaw(2000.0, -1.5, 0.1)
    np.testing.assert_allclose(p.numpy(K), power_law(K, np.log(2000.0), -1.5, 0.1))
    assert p.numpy(0.1) == pytest.approx(2000.0)
    assert p.numpy(0.0) == 0.0


def test_turnover_values_and_slopes():
    p = TurnoverPowerLaw(800.0, 1.0, 0.1, k_turnover=0.03, turnover_index=4.0, k_cutoff=2.0)
    ref = power_law(K, np.log(800.0), 1.0, 0.1, (0.03, 4.0, 2.0))
    np.testing.assert_allclose(p.numpy(K), ref, rtol=1e-13)
    assert p.numpy(0.1) == pytest.approx(800.0)
    q = TurnoverPowerLaw(800.0, 1.0, 0.1, k_turnover=0.03, turnover_index=4.0)
    k = np.array([1e-5, 2e-5, 10.0, 20.0])
    slopes = np.diff(np.log(q.numpy(k)))[[0, 2]] / np.log(2.0)
    np.testing.assert_allclose(slopes, [1.0, -3.0], atol=1e-3)


@pytest.mark.parametrize("power", _spectra(), ids=repr)
@pytest.mark.parametrize("k_as_tensor", [False, True], ids=["numpy_k", "tensor_k"])
def test_tf_matches_numpy_and_batches(power, k_as_tensor):
    k = tf.constant(K) if k_as_tensor else K
    np.testing.assert_allclose(power(k).numpy(), power.numpy(K), rtol=1e-12)
    log_a = tf.constant([power.log_amplitude, power.log_amplitude + 1.0], tf.float64)
    index = tf.constant([power.index, power.index - 0.5], tf.float64)
    out = power(k, log_amplitude=log_a, index=index)
    assert out.shape == (2, K.size) and out.dtype == tf.float64
    np.testing.assert_allclose(out[0], power.numpy(K), rtol=1e-12)
    expected = np.e * power.numpy(K) * np.where(K > 0, K / power.k_pivot, 1.0) ** -0.5
    np.testing.assert_allclose(out[1], expected, rtol=1e-12)
    # float32 hyperparameters give float32 output
    assert power(K, log_amplitude=tf.constant(1.0, tf.float32)).dtype == tf.float32


@pytest.mark.parametrize("power", _spectra(), ids=repr)
def test_gradients_are_finite_including_k0(power):
    log_a = tf.Variable([power.log_amplitude] * 3, dtype=tf.float64)
    index = tf.Variable([power.index] * 3, dtype=tf.float64)
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(power(K, log_amplitude=log_a, index=index))
    g_a, g_n = tape.gradient(total, [log_a, index])
    np.testing.assert_allclose(g_a.numpy(), power.numpy(K).sum(), rtol=1e-12)
    logk = np.log(np.where(K > 0, K / power.k_pivot, 1.0))
    np.testing.assert_allclose(g_n.numpy(), (power.numpy(K) * logk).sum(), rtol=1e-10)


def test_tabulated_log_log_interpolation(tmp_path):
    k = np.array([0.01, 0.1, 1.0])
    p = np.array([100.0, 1000.0, 10.0])
    path = tmp_path / "pk.txt"
    np.savetxt(path, np.column_stack([k, p]), header="k P")
    tab = TabulatedPower.from_file(path, k_pivot=0.1)
    assert tab.amplitude == pytest.approx(1000.0) and tab.index == 0.0
    np.testing.assert_allclose(tab.numpy(k), p, rtol=1e-12)
    # geometric midpoints: log-log linear
    mid = np.sqrt(k[:-1] * k[1:])
    np.testing.assert_allclose(tab.numpy(mid), np.sqrt(p[:-1] * p[1:]), rtol=1e-12)
    # power-law extrapolation with the end slopes
    np.testing.assert_allclose(tab.numpy([0.001, 10.0]), [10.0, 0.1], rtol=1e-12)
    np.testing.assert_allclose(
        tab(tf.constant([0.001, 0.0316, 10.0])), tab.numpy([0.001, 0.0316, 10.0])
    )
    assert tab.numpy(0.0) == 0.0


def test_tabulated_reproduces_power_law(tmp_path):
    k = np.geomspace(1e-3, 10.0, 7)
    path = tmp_path / "pl.dat"
    np.savetxt(path, np.column_stack([k, 5.0 * k**-2]))
    tab = TabulatedPower.from_file(path, k_pivot=0.3)
    kk = np.geomspace(2e-3, 5.0, 50)
    np.testing.assert_allclose(tab.numpy(kk), 5.0 * kk**-2, rtol=1e-12)


@pytest.mark.parametrize(
    "content,match",
    [
        ("0.1\n0.2\n", "2 columns"),
        ("0.1 1\n0.2 -1\n", "P\\(k\\) must be positive"),
        ("0.1 1\n0.2 0\n", "P\\(k\\) must be positive"),
        ("0.2 1\n0.1 2\n", "increasing"),
        ("0 1\n0.1 2\n", "k must be positive"),
        ("0.1 1\n", "length >= 2"),
        ("a b\n", "cannot read"),
    ],
)
def test_bad_tables(tmp_path, content, match):
    path = tmp_path / "bad.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        TabulatedPower.from_file(path)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(amplitude=-1.0, index=1.0), "amplitude must be positive"),
        (dict(amplitude=0.0, index=1.0), "amplitude must be positive"),
        (dict(amplitude=1.0, index=np.nan), "index must be finite"),
        (dict(amplitude=1.0, index=1.0, k_pivot=0.0), "k_pivot must be positive"),
    ],
)
def test_bad_power_law_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PowerLaw(**kwargs)
    with pytest.raises(ValueError, match=match):
        TurnoverPowerLaw(**kwargs)
