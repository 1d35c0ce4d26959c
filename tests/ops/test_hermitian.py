"""Hermitian packing: an orthonormal bijection between N reals and a Hermitian half-spectrum."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import ops

SHAPES = [(4, 6, 8), (5, 7, 9), (4, 5, 6), (3, 4, 5), (2, 2, 2), (1, 3, 1), (4, 4, 1), (8,), (3, 6)]


def _weights(shape):
    return ops.hermitian_weights(shape[-1], tf.float64).numpy()


@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_norm_and_exact_hermitian(shape):
    rng = np.random.default_rng(0)
    packing = ops.HermitianPacking(shape)
    v = rng.standard_normal((3, *shape))
    z = packing.modes_from_real(tf.constant(v))
    assert tuple(z.shape) == (3, *packing.modes_shape)
    np.testing.assert_allclose(packing.real_from_modes(z).numpy(), v, atol=1e-13)
    # sum_k w_k |Z_k|^2 = |v|^2
    norm_z = np.sum(_weights(shape) * np.abs(z.numpy()) ** 2, axis=tuple(range(1, z.ndim)))
    np.testing.assert_allclose(norm_z, np.sum(v**2, axis=tuple(range(1, v.ndim))), rtol=1e-12)
    # Exactly Hermitian: it is the rfft of the real field it synthesises.
    rank = len(shape)
    x = ops.irfftn(z, rank, fft_length=shape, norm="ortho")
    np.testing.assert_allclose(ops.rfftn(x, rank, norm="ortho").numpy(), z.numpy(), atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_unit_variance_on_every_bin(shape):
    """Each bin's real and imaginary coefficients have unit total variance; self-
    conjugate bins are real. Exact, from the tables (no sampling)."""
    packing = ops.HermitianPacking(shape)
    n = int(np.prod(shape))
    eye = tf.eye(n, dtype=tf.float64)
    z = packing.modes_from_real(tf.reshape(eye, (n, *shape))).numpy().reshape(n, -1)
    variance = np.sum(np.abs(z) ** 2, axis=0)  # E|Z_k|^2 for v ~ N(0, I)
    np.testing.assert_allclose(variance, 1.0, rtol=1e-12)
    # Each real coordinate lands in the bin mode_of_real says (and only tied partners).
    owner = np.argmax(np.abs(z) > 0, axis=1)
    np.testing.assert_array_equal(owner, np.minimum(owner, packing.mode_of_real))


@pytest.mark.parametrize("shape", [(4, 6, 8), (5, 7, 9), (3, 4, 5), (2, 2, 2), (4, 4, 1)])
def test_synthesis_is_orthogonal(shape):
    packing = ops.HermitianPacking(shape)
    n = int(np.prod(shape))
    v = tf.reshape(tf.eye(n, dtype=tf.float64), (n, *shape))
    q = ops.irfft3d(packing.modes_from_real(v), shape, norm="ortho").numpy().reshape(n, n)
    np.testing.assert_allclose(q @ q.T, np.eye(n), atol=1e-12)


@pytest.mark.parametrize("shape", [(4, 6, 8), (5, 7, 9), (1, 3, 1)])
def test_real_from_modes_is_weighted_adjoint_and_projects(shape):
    rng = np.random.default_rng(1)
    packing = ops.HermitianPacking(shape)
    half = packing.modes_shape
    v = rng.standard_normal(shape)
    y = rng.standard_normal(half) + 1j * rng.standard_normal(half)  # not Hermitian
    mv = packing.modes_from_real(tf.constant(v)).numpy()
    lhs = np.sum(_weights(shape) * (np.conj(y) * mv).real)
    rhs = np.sum(v * packing.real_from_modes(tf.constant(y)).numpy())
    np.testing.assert_allclose(lhs, rhs, rtol=1e-12)
    # real_from_modes(y) repacked is the Hermitian projection of y.
    repacked = packing.modes_from_real(packing.real_from_modes(tf.constant(y))).numpy()
    want = ops.hermitian_project(tf.constant(y), shape).numpy()
    self_conj_imag = np.fft.rfftn(np.fft.irfftn(want, s=shape), s=shape)
    np.testing.assert_allclose(repacked, self_conj_imag, atol=1e-12)


def test_packing_gradients_both_ways():
    shape = (4, 5, 6)
    rng = np.random.default_rng(2)
    packing = ops.HermitianPacking(shape)
    v = tf.constant(rng.standard_normal(shape))
    with tf.GradientTape() as tape:
        tape.watch(v)
        loss = tf.reduce_sum(ops.irfft3d(packing.modes_from_real(v), shape, norm="ortho") ** 2)
    # Orthogonal synthesis: d|x|^2/dv = 2 v.
    np.testing.assert_allclose(tape.gradient(loss, v).numpy(), 2 * v.numpy(), atol=1e-12)
    z = packing.modes_from_real(v)
    with tf.GradientTape() as tape:
        tape.watch(z)
        loss = tf.reduce_sum(packing.real_from_modes(z) ** 2)
    assert np.all(np.isfinite(tape.gradient(loss, z).numpy()))


@pytest.mark.parametrize("shape", [(4, 6, 8), (5, 7, 9), (3, 4, 5), (1, 3, 1), (4, 4, 1), (3, 6)])
def test_modes_from_real_gradient_is_the_dense_adjoint(shape):
    """The custom gradient of modes_from_real is the transpose of its dense Jacobian
    (reverse mode, eager and XLA) and forward mode gives the Jacobian itself."""
    packing = ops.HermitianPacking(shape)
    n = int(np.prod(shape))
    eye = tf.reshape(tf.eye(n, dtype=tf.float64), (n, *shape))
    z = packing.modes_from_real(eye).numpy().reshape(n, -1)  # row j: column j of J
    jac = np.concatenate([z.real, z.imag], axis=1)  # [n reals] x [re, im of each bin]
    rng = np.random.default_rng(5)
    y = rng.standard_normal(packing.modes_shape) + 1j * rng.standard_normal(packing.modes_shape)
    y_flat = np.concatenate([y.real.ravel(), y.imag.ravel()])
    expected = (jac @ y_flat).reshape(shape)  # J^T y in the (Re, Im) real inner product

    def vjp(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            out = packing.modes_from_real(v)
            loss = tf.reduce_sum(tf.math.real(out) * y.real + tf.math.imag(out) * y.imag)
        return tape.gradient(loss, v)

    v = tf.constant(rng.standard_normal(shape))
    np.testing.assert_allclose(vjp(v).numpy(), expected, atol=1e-12)
    xla = tf.function(vjp, jit_compile=True)
    np.testing.assert_allclose(xla(v).numpy(), expected, atol=1e-12)
    tangent = tf.constant(rng.standard_normal(shape))
    with tf.autodiff.ForwardAccumulator(v, tangent) as acc:
        out = packing.modes_from_real(v)
    jvp = acc.jvp(out).numpy().ravel()
    t_flat = tangent.numpy().ravel()
    np.testing.assert_allclose(jvp.real, t_flat @ jac[:, : z.shape[1]], atol=1e-12)
    np.testing.assert_allclose(jvp.imag, t_flat @ jac[:, z.shape[1] :], atol=1e-12)


def test_functional_forms_and_float32():
    rng = np.random.default_rng(3)
    v = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    z = ops.modes_from_real(v, (3, 4, 5))
    assert z.dtype == tf.complex64
    np.testing.assert_allclose(ops.real_from_modes(z, (3, 4, 5)).numpy(), v, atol=1e-6)


def test_packing_inside_xla():
    packing = ops.HermitianPacking((4, 4, 5))

    @tf.function(jit_compile=True)
    def f(v):
        return packing.real_from_modes(packing.modes_from_real(v))

    v = tf.random.stateless_normal((2, 4, 4, 5), seed=[1, 2])
    np.testing.assert_allclose(f(v).numpy(), v.numpy(), atol=1e-6)


def test_bad_grid_shape():
    with pytest.raises(ValueError, match="grid_shape"):
        ops.HermitianPacking((4, 0, 4))
