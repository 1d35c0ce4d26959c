"""Cosmology building blocks against an independent NumPy/SciPy reference and CCL's table.

References: ``tests/models/cosmology_reference.py`` (E&H from the paper, sigma(R) by
``quad``, growth by ``solve_ivp`` and the Heath integral) and CCL's published E&H
benchmark table (``tests/models/data/ccl_model1_pk_eh.txt``).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import tensorflow as tf
from scipy.special import hyp2f1

from fieldhmc.models import Grid
from fieldhmc.models.cosmology import (
    PLANCK18,
    EisensteinHuPower,
    FixedCosmology,
    check_cosmology,
    eisenstein_hu_transfer,
    growth_factors,
    hubble_rate,
    in_support,
    linear_power,
    matter_density,
    sigma_r_squared,
)
from tests.models import cosmology_reference as ref

OMEGA_M = np.array([0.2, 0.3111, 0.45])
SIGMA8 = np.array([0.7, 0.8102, 0.95])
K = np.concatenate([[0.0], np.geomspace(1e-4, 20.0, 61)])
CCL_TABLE = pathlib.Path(__file__).parent / "data" / "ccl_model1_pk_eh.txt"
CCL_MODEL1 = FixedCosmology(omega_b=0.05, h=0.7, n_s=0.96, t_cmb=2.725)


def _f64(x):
    return tf.constant(np.asarray(x, dtype=np.float64))


def _reference_shape(omega_m, fixed, wiggles, convention="paper"):
    def shape(k):
        t = ref.eh_transfer(k, omega_m, fixed.omega_b, fixed.h, fixed.t_cmb, wiggles, convention)
        return k**fixed.n_s * t**2

    return shape


# --------------------------------------------------------------------------- transfer


@pytest.mark.parametrize("wiggles", [True, False], ids=["wiggles", "no_wiggles"])
def test_transfer_matches_paper_formulas_batched(wiggles):
    out = eisenstein_hu_transfer(K, _f64(OMEGA_M), PLANCK18, wiggles).numpy()
    assert out.shape == (OMEGA_M.size, K.size)
    fx = PLANCK18
    for row, om in zip(out, OMEGA_M, strict=True):
        expected = ref.eh_transfer(K[1:], om, fx.omega_b, fx.h, fx.t_cmb, wiggles)
        np.testing.assert_allclose(row[1:], expected, rtol=1e-12)
        assert row[0] == 1.0  # the k -> 0 limit
    # T -> 1 continuously
    np.testing.assert_allclose(out[:, 1], 1.0, atol=1e-3)


def test_ccl_table_reproduced():
    """Published numbers: CCL's E&H benchmark (CosmoMAD), Omega_m = 0.3, sigma8 = 0.8."""
    table = np.loadtxt(CCL_TABLE)
    k, p_wig, p_nowig = table.T
    # the reference in the authors' code convention reproduces the table to its digits
    p_hu, _ = ref.linear_power(k, 0.3, 0.8, 0.05, 0.7, 0.96, 2.725, True, "hu_code")
    np.testing.assert_allclose(p_hu, p_wig, rtol=1.5e-5)
    # ours follows the paper as printed: <= 4e-4 from it (z_eq vs 1 + z_eq, R_d)
    ours = EisensteinHuPower(0.3, 0.8, fixed=CCL_MODEL1)
    np.testing.assert_allclose(ours.numpy(k), p_wig, rtol=5e-4)
    # the no-wiggle form has no such ambiguity
    ours_nw = EisensteinHuPower(0.3, 0.8, fixed=CCL_MODEL1, wiggles=False)
    np.testing.assert_allclose(ours_nw.numpy(k), p_nowig, rtol=2e-6)


# --------------------------------------------------------------------------- sigma8


@pytest.mark.parametrize("wiggles", [True, False], ids=["wiggles", "no_wiggles"])
def test_sigma8_quadrature_matches_quad(wiggles):
    ours = sigma_r_squared(_f64(OMEGA_M[[0, 2]]), 8.0, PLANCK18, wiggles).numpy()
    for value, om in zip(ours, OMEGA_M[[0, 2]], strict=True):
        expected = ref.sigma_r_squared(_reference_shape(om, PLANCK18, wiggles))
        np.testing.assert_allclose(value, expected, rtol=1e-6)


def test_linear_power_normalised_to_sigma8():
    """P(k) matches the reference, and its top-hat variance at 8 Mpc/h is sigma8^2."""
    p = linear_power(K, _f64(OMEGA_M), _f64(SIGMA8)).numpy()
    assert p.shape == (3, K.size)
    np.testing.assert_array_equal(p[:, 0], 0.0)
    fx = PLANCK18
    for row, om, s8 in zip(p, OMEGA_M, SIGMA8, strict=True):
        expected, _ = ref.linear_power(K[1:], om, s8, fx.omega_b, fx.h, fx.n_s, fx.t_cmb)
        np.testing.assert_allclose(row[1:], expected, rtol=1e-6)

    # sigma(8) of our P by quad: our amplitude (P / its k^n T^2 shape) times the quad
    # variance of the shape, for the middle cosmology
    shape = _reference_shape(OMEGA_M[1], fx, True)
    amplitude = p[1, 1:] / shape(K[1:])
    np.testing.assert_allclose(amplitude, amplitude[0], rtol=1e-12)
    sigma8 = np.sqrt(amplitude[0] * ref.sigma_r_squared(shape))
    np.testing.assert_allclose(sigma8, SIGMA8[1], rtol=1e-6)


def test_power_at_a_scales_with_growth():
    p1 = linear_power(K, _f64(OMEGA_M), 0.8).numpy()
    pa = linear_power(K, _f64(OMEGA_M), 0.8, a=_f64(0.5)).numpy()
    d1 = ref.growth_heath
    ratio = np.array([(d1(om, 0.5) / d1(om, 1.0))[0] ** 2 for om in OMEGA_M])
    np.testing.assert_allclose(pa[:, 1:], p1[:, 1:] * ratio[:, None], rtol=1e-7)


# --------------------------------------------------------------------------- growth

GROWTH_OM = np.array([0.15, 0.3111, 0.5, 1.0])
GROWTH_A = np.array([0.02, 0.25, 0.5, 1.0])


@pytest.fixture(scope="module")
def growth_matter():
    # [om, 1] against [a]: a batched [4, 4] evaluation
    return growth_factors(_f64(GROWTH_OM[:, None]), _f64(GROWTH_A))


def test_growth_matches_solve_ivp(growth_matter):
    for i, om in enumerate(GROWTH_OM):
        expected = ref.growth_ode(om, GROWTH_A)
        for name, got, want in zip(("D1", "f1", "D2", "f2"), growth_matter, expected, strict=True):
            np.testing.assert_allclose(got.numpy()[i], want, rtol=1e-6, err_msg=name)


def test_growth_d1_matches_heath_and_hypergeometric(growth_matter):
    for i, om in enumerate(GROWTH_OM):
        np.testing.assert_allclose(growth_matter.d1[i], ref.growth_heath(om, GROWTH_A), rtol=1e-7)
        # closed form of flat LCDM: D1 = a 2F1(1/3, 1; 11/6; -(Omega_L/Omega_m) a^3)
        exact = GROWTH_A * hyp2f1(1 / 3, 1, 11 / 6, -(1 - om) / om * GROWTH_A**3)
        np.testing.assert_allclose(growth_matter.d1[i], exact, rtol=1e-7)


def test_growth_limits_and_conventions(growth_matter):
    d1, f1, d2, f2 = (t.numpy() for t in growth_matter)
    # Einstein-de Sitter (last row) is exact: D1 = a, D2 = -3/7 a^2
    np.testing.assert_allclose(d1[-1], GROWTH_A, rtol=1e-12)
    np.testing.assert_allclose(d2[-1], -3 / 7 * GROWTH_A**2, rtol=1e-12)
    np.testing.assert_allclose(f1[-1], 1.0, rtol=1e-12)
    np.testing.assert_allclose(f2[-1], 2.0, rtol=1e-12)
    # early times: D1 -> a, D2 -> -3/7 D1^2 (negative)
    np.testing.assert_allclose(d1[:, 0], GROWTH_A[0], rtol=1e-5)
    np.testing.assert_allclose(d2[:, 0] / d1[:, 0] ** 2, -3 / 7, rtol=1e-5)
    assert np.all(d2 < 0)
    # f1 ~ Omega_m(a)^0.55 (Linder 2005; 2% at Omega_m(a) = 0.15), f2 ~ 2 Omega_m(a)^(6/11)
    om_a = matter_density(_f64(GROWTH_OM[:, None]), _f64(GROWTH_A)).numpy()
    np.testing.assert_allclose(f1, om_a**0.55, rtol=2.5e-2)
    np.testing.assert_allclose(f2, 2 * om_a ** (6 / 11), rtol=3e-2)
    # Lambda suppresses growth: D1(1) < 1 for Omega_m < 1
    assert np.all(d1[:-1, -1] < 1.0)


def test_growth_today_normalisation(growth_matter):
    today = growth_factors(_f64(GROWTH_OM[:, None]), _f64(GROWTH_A), "today")
    d1_1 = growth_matter.d1.numpy()[:, -1:]
    np.testing.assert_allclose(today.d1, growth_matter.d1.numpy() / d1_1, rtol=1e-13)
    np.testing.assert_allclose(today.d2, growth_matter.d2.numpy() / d1_1**2, rtol=1e-13)
    np.testing.assert_allclose(today.f1, growth_matter.f1, rtol=1e-13)
    np.testing.assert_allclose(today.f2, growth_matter.f2, rtol=1e-13)
    np.testing.assert_allclose(today.d1.numpy()[:, -1], 1.0, rtol=1e-14)


def test_background():
    om, a = 0.3, np.array([0.25, 0.5, 1.0])
    e = np.sqrt(om / a**3 + 1 - om)
    np.testing.assert_allclose(hubble_rate(om, _f64(a)), e, rtol=1e-14)
    np.testing.assert_allclose(matter_density(om, _f64(a)), om / a**3 / e**2, rtol=1e-14)


# --------------------------------------------------------------------------- gradients


@tf.function
def _growth_value_and_grads(om):
    """Stacked copies of om, one per output, so one backward pass gives every dG/dOm."""
    stacked = tf.stack([om] * 4)
    with tf.GradientTape() as tape:
        tape.watch(stacked)
        g = growth_factors(stacked, 0.5, "today")
        total = sum(tf.reduce_sum(v[i]) for i, v in enumerate(g))
    return tf.stack([v[i] for i, v in enumerate(g)]), tape.gradient(total, stacked)


@tf.function
def _growth_values(om):
    return tf.stack(list(growth_factors(om, 0.5, "today")))


def test_growth_gradients_match_finite_differences():
    om = np.array([0.25, 0.3111, 0.4])
    _, grads = _growth_value_and_grads(_f64(om))
    eps = 1e-5
    plus, minus = _growth_values(_f64(om + eps)), _growth_values(_f64(om - eps))
    fd = (plus - minus).numpy() / (2 * eps)
    for i, name in enumerate(("D1", "f1", "D2", "f2")):
        np.testing.assert_allclose(grads[i], fd[i], rtol=1e-7, err_msg=name)


@tf.function
def _power_value_and_grads(k, om, s8, a):
    """P at each k with its own copy of (om, s8): d P(k_j)/d(om, s8) per chain in one pass."""
    num_k = k.shape[0]
    oms, s8s = tf.stack([om] * num_k), tf.stack([s8] * num_k)
    with tf.GradientTape() as tape:
        tape.watch([oms, s8s])
        p = linear_power(k, oms, s8s, a)  # [num_k, chains, num_k]
        diag = tf.stack([p[j, :, j] for j in range(num_k)])
        total = tf.reduce_sum(diag)
    return diag, tape.gradient(total, [oms, s8s])


@tf.function
def _power_values(k, om, s8, a):
    return linear_power(k, om, s8, a)


@pytest.mark.parametrize("a", [1.0, 0.5], ids=["a1", "a0.5"])
def test_power_gradients_match_finite_differences(a):
    k = _f64([0.01, 0.05, 0.1, 0.2, 0.5])
    om, s8, a_t = np.array([0.28, 0.35]), np.array([0.75, 0.85]), _f64(a)
    diag, (g_om, g_s8) = _power_value_and_grads(k, _f64(om), _f64(s8), a_t)
    eps = 1e-6
    fd_om = (
        _power_values(k, _f64(om + eps), _f64(s8), a_t)
        - _power_values(k, _f64(om - eps), _f64(s8), a_t)
    ).numpy() / (2 * eps)
    fd_s8 = (
        _power_values(k, _f64(om), _f64(s8 + eps), a_t)
        - _power_values(k, _f64(om), _f64(s8 - eps), a_t)
    ).numpy() / (2 * eps)
    np.testing.assert_allclose(g_om, fd_om.transpose(1, 0), rtol=1e-6)
    np.testing.assert_allclose(g_s8, fd_s8.transpose(1, 0), rtol=1e-7)
    np.testing.assert_allclose(g_s8, 2 * diag / s8, rtol=1e-12)


def test_xla_compiles_batched_over_chains():
    grid = Grid((8, 8, 8), (320.0, 320.0, 320.0))
    kmag = grid.kmag()

    @tf.function(jit_compile=True)
    def value_and_grads(om, s8):
        with tf.GradientTape() as tape:
            tape.watch([om, s8])
            p = linear_power(kmag, om, s8, tf.constant(0.5, tf.float64))
            g = growth_factors(om, tf.constant(0.5, tf.float64), "today")
            total = tf.reduce_sum(tf.math.log(p + 1.0)) + tf.reduce_sum(g.f1 + g.d2)
        return p, g.d1, tape.gradient(total, [om, s8])

    om, s8 = _f64([0.25, 0.3111, 0.4, 0.33]), _f64([0.8, 0.8102, 0.7, 0.9])
    p, d1, (g_om, g_s8) = value_and_grads(om, s8)
    assert p.shape == (4,) + kmag.shape
    np.testing.assert_allclose(p, linear_power(kmag, om, s8, _f64(0.5)), rtol=1e-10)
    np.testing.assert_allclose(d1, growth_factors(om, 0.5, "today").d1, rtol=1e-12)
    assert np.all(np.isfinite(g_om)) and np.all(np.isfinite(g_s8))


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(omega_m=0.049), "Omega_m"),
        (dict(omega_m=0.03), "Omega_m"),
        (dict(omega_m=1.2), "Omega_m"),
        (dict(omega_m=float("nan")), "Omega_m"),
        (dict(sigma8=0.0), "sigma8"),
        (dict(sigma8=-0.5), "sigma8"),
        (dict(a=0.0), "scale factor a"),
        (dict(a=1.5), "scale factor a"),
    ],
)
def test_unphysical_python_values_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        EisensteinHuPower(**kwargs)
    with pytest.raises(ValueError, match=name):
        check_cosmology(**kwargs)
    args = dict(omega_m=0.3, sigma8=0.8, a=1.0) | kwargs
    with pytest.raises(ValueError, match=name):
        linear_power(K, args["omega_m"], args["sigma8"], args["a"])


def test_unphysical_growth_and_fixed_parameters_raise():
    with pytest.raises(ValueError, match="Omega_m"):
        growth_factors(1.5, 0.5)
    with pytest.raises(ValueError, match="scale factor a"):
        growth_factors(0.3, 0.0)
    with pytest.raises(ValueError, match="normalization"):
        growth_factors(0.3, 0.5, "unity")
    with pytest.raises(ValueError, match="Omega_b"):
        FixedCosmology(omega_b=0.0)
    with pytest.raises(ValueError, match="h must"):
        FixedCosmology(h=-0.7)
    with pytest.raises(ValueError, match="k must"):
        EisensteinHuPower().numpy([-0.1, 0.1])


@tf.function
def _masked_target(om, s8, a):
    with tf.GradientTape() as tape:
        tape.watch([om, s8])
        p = linear_power(K, om, s8, a)
        g = growth_factors(om, a)
        log_p = tf.reduce_sum(tf.math.log(p[:, 1:]), axis=-1) + g.f1 + g.d2
        ok = in_support(om, s8, a)
        target = tf.where(ok, log_p, tf.constant(-np.inf, tf.float64))
        total = tf.reduce_sum(tf.where(ok, target, tf.zeros_like(target)))
    return p, log_p, ok, target, tape.gradient(total, [om, s8])


def test_tensor_values_outside_support_stay_finite_and_mask():
    """A chain outside the domain gets finite values and gradients; the mask gives -inf."""
    om = _f64([0.01, 0.3, 1.7, -2.0, 0.3, 0.3, 0.3])
    s8 = _f64([0.8, -0.3, 0.8, 0.8, 0.0, 0.8, 0.8])
    a = _f64([0.5, 0.5, 0.5, 0.5, 0.5, 1.3, 0.5])
    p, log_p, ok, target, grads = _masked_target(om, s8, a)
    np.testing.assert_array_equal(ok.numpy(), [False] * 6 + [True])
    assert np.all(np.isfinite(p.numpy())) and np.all(np.isfinite(log_p.numpy()))
    assert all(np.all(np.isfinite(gr.numpy())) for gr in grads)
    np.testing.assert_array_equal(target.numpy()[:6], -np.inf)
    assert np.isfinite(target.numpy()[6]) and np.all(grads[0].numpy()[:6] == 0)
    assert in_support(_f64(0.3), _f64(0.8), _f64(1.0)).numpy()
    assert not in_support(_f64(np.nan), _f64(0.8)).numpy()


# --------------------------------------------------------------------------- object


def test_power_object_on_a_grid():
    grid = Grid((8, 6, 5), (320.0, 240.0, 200.0))
    kmag = grid.kmag()
    power = EisensteinHuPower()
    assert power.parameter_names == ("Omega_m", "sigma8")
    assert power.fiducial == {"Omega_m": 0.3111, "sigma8": 0.8102}
    fid = power.numpy(kmag)
    assert fid.shape == kmag.shape and fid[0, 0, 0] == 0.0 and np.all(fid.ravel()[1:] > 0)
    batched = power(kmag, omega_m=_f64([0.3111, 0.3]), sigma8=_f64([0.8102, 0.8]))
    assert batched.shape == (2,) + kmag.shape
    np.testing.assert_allclose(batched[0], fid, rtol=1e-13)
    np.testing.assert_allclose(power(tf.constant(kmag)), fid, rtol=1e-13)
    half = EisensteinHuPower(a=0.5)
    d = growth_factors(0.3111, 0.5, "today").d1.numpy()
    np.testing.assert_allclose(half.numpy(kmag), fid * d**2, rtol=1e-13)
    assert "EisensteinHuPower(omega_m=0.3111" in repr(power)
    # NumPy parameters are checked elementwise and batched like tensors
    arrays = linear_power(kmag, np.array([0.3111, 0.3]), np.array([0.8102, 0.8]))
    np.testing.assert_allclose(arrays, batched, rtol=1e-13)
    with pytest.raises(ValueError, match="sigma8"):
        linear_power(kmag, np.array([0.3111, 0.3]), np.array([0.8102, -0.8]))
