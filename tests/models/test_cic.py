"""CIC paint/readout: NumPy reference, dot-product adjoint, exact gradients, XLA."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.models import cic_paint, cic_readout
from fieldhmc.models.cic import _paint_flat

SHAPES = [(8, 8, 8), (5, 6, 7)]


def _positions(shape, batch=2, num=40, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    # spread over several periods, negative too: wrapping is part of the test
    pos = rng.uniform(-1.5, 1.5, size=(batch, num, 3)) * np.asarray(shape)
    return pos.astype(dtype)


def paint_np(pos, weights, shape):
    """Reference: loop over particles and the 8 corners."""
    out = np.zeros((pos.shape[0], *shape))
    for b, p in itertools.product(range(pos.shape[0]), range(pos.shape[1])):
        base = np.floor(pos[b, p])
        frac = pos[b, p] - base
        for e in itertools.product((0, 1), repeat=3):
            w = np.prod([f if ea else 1 - f for f, ea in zip(frac, e, strict=True)])
            idx = tuple(int(base[a] + e[a]) % shape[a] for a in range(3))
            out[(b, *idx)] += weights[b, p] * w
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_paint_matches_numpy_and_conserves_mass(shape):
    pos = _positions(shape)
    w = np.random.default_rng(1).uniform(0.5, 2.0, size=pos.shape[:2])
    rho = cic_paint(tf.constant(pos), tf.constant(w), shape).numpy()
    np.testing.assert_allclose(rho, paint_np(pos, w, shape), atol=1e-12)
    np.testing.assert_allclose(rho.sum(axis=(1, 2, 3)), w.sum(axis=1), rtol=1e-13)
    # particles on cell centres paint exactly one cell each
    grid = np.stack(np.meshgrid(*map(np.arange, shape), indexing="ij"), -1).reshape(1, -1, 3)
    on = cic_paint(tf.constant(grid, tf.float64), None, shape).numpy()
    np.testing.assert_allclose(on, 1.0, atol=1e-14)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_readout_is_the_adjoint_of_paint(shape, dtype):
    """<paint(x, m), g> == <m, readout(g, x)> for random m, g."""
    tol = 1e-5 if dtype == tf.float32 else 1e-13
    for seed in range(3):
        rng = np.random.default_rng(seed + 10)
        pos = tf.constant(_positions(shape, seed=seed), dtype)
        m = tf.constant(rng.standard_normal(pos.shape[:2]), dtype)
        g = tf.constant(rng.standard_normal((pos.shape[0], *shape)), dtype)
        lhs = tf.reduce_sum(cic_paint(pos, m, shape) * g)
        rhs = tf.reduce_sum(m * cic_readout(g, pos))
        np.testing.assert_allclose(float(lhs), float(rhs), rtol=tol)


def _grads(fn, *xs):
    with tf.GradientTape() as tape:
        for x in xs:
            tape.watch(x)
        y = fn(*xs)
    return y, tape.gradient(y, list(xs))


@pytest.mark.parametrize("shape", SHAPES)
def test_custom_gradients_equal_tensorflow_autodiff(shape):
    """Our registered gradients vs TF's own gradients of scatter/gather (float64)."""
    rng = np.random.default_rng(3)
    pos = tf.constant(_positions(shape))
    m = tf.constant(rng.standard_normal(pos.shape[:2]))
    g = tf.constant(rng.standard_normal((2, *shape)))

    def ours(p, w):
        return tf.reduce_sum(cic_paint(p, w, shape) * g)

    def autodiff(p, w):
        return tf.reduce_sum(_paint_flat(tf.unstack(p, axis=-1), w, shape) * g)

    _, (gp, gw) = _grads(ours, pos, m)
    _, (ap, aw) = _grads(autodiff, pos, m)
    np.testing.assert_allclose(gp.numpy(), ap.numpy(), atol=1e-12)
    np.testing.assert_allclose(gw.numpy(), aw.numpy(), atol=1e-12)

    def ours_readout(f, p):
        return tf.reduce_sum(cic_readout(f, p) * m)

    def autodiff_readout(f, p):
        # readout = transpose of paint: differentiate <paint(p, m), f> instead
        return tf.reduce_sum(_paint_flat(tf.unstack(p, axis=-1), m, shape) * f)

    _, (gf, gp2) = _grads(ours_readout, g, pos)
    _, (af, ap2) = _grads(autodiff_readout, g, pos)
    np.testing.assert_allclose(gf.numpy(), af.numpy(), atol=1e-12)
    np.testing.assert_allclose(gp2.numpy(), ap2.numpy(), atol=1e-12)


def test_position_gradient_matches_finite_differences():
    """CIC is piecewise linear: central differences are exact away from cell faces."""
    shape = (5, 6, 7)
    rng = np.random.default_rng(4)
    pos = _positions(shape, seed=4)
    m = tf.constant(rng.standard_normal(pos.shape[:2]))
    g = tf.constant(rng.standard_normal((2, *shape)))

    def loss(p):
        return tf.reduce_sum(cic_paint(p, m, shape) * g)

    _, (grad,) = _grads(loss, tf.constant(pos))
    eps = 1e-6
    for _ in range(4):
        v = rng.standard_normal(pos.shape)
        fd = (float(loss(tf.constant(pos + eps * v))) - float(loss(tf.constant(pos - eps * v)))) / (
            2 * eps
        )
        np.testing.assert_allclose(np.sum(grad.numpy() * v), fd, rtol=1e-7)


def test_paint_and_gradient_under_xla_equal_eager():
    shape = (8, 8, 8)
    pos = tf.constant(_positions(shape, dtype=np.float32))
    m = tf.ones(pos.shape[:2])
    g = tf.constant(np.random.default_rng(5).standard_normal((2, *shape)), tf.float32)

    def vg(p):
        with tf.GradientTape() as tape:
            tape.watch(p)
            y = tf.reduce_sum(cic_paint(p, m, shape) * g) + tf.reduce_sum(cic_readout(g, p))
        return y, tape.gradient(y, p)

    eager = vg(pos)
    xla = tf.function(vg, jit_compile=True)(pos)
    np.testing.assert_allclose(xla[0].numpy(), eager[0].numpy(), rtol=1e-5)
    np.testing.assert_allclose(xla[1].numpy(), eager[1].numpy(), atol=1e-4)


def test_bad_shapes():
    with pytest.raises(ValueError, match="positions must be"):
        cic_paint(tf.zeros([2, 3]), None, (4, 4, 4))
    with pytest.raises(ValueError, match="grid_shape"):
        cic_paint(tf.zeros([1, 2, 3]), None, (4, 4))
