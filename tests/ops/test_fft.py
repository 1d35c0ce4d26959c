"""Real FFTs: forward values, exact adjoints, higher-order and forward-mode derivatives."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import ops

SHAPES_3D = [(4, 6, 8), (5, 7, 9), (4, 5, 6), (3, 4, 5), (2, 2, 2), (1, 3, 1), (4, 4, 1)]
NORMS = ["backward", "ortho", "forward"]
RTOL = {np.float64: 1e-10, np.float32: 1e-4}
CDTYPE = {np.float64: np.complex128, np.float32: np.complex64}
RANK_SHAPES = {1: [(8,), (9,), (1,)], 2: [(4, 6), (5, 7), (3, 2)], 3: SHAPES_3D}


def _axes(rank):
    return tuple(range(-rank, 0))


def _half(shape):
    return (*shape[:-1], shape[-1] // 2 + 1)


def _rel_err(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def _dense_irfft(shape, norm):
    """Real-linear map (Re Z, Im Z) -> x as a dense [N, 2M] matrix, built with NumPy."""
    mshape, rank = _half(shape), len(shape)
    m = int(np.prod(mshape))
    cols = []
    for part in (1.0, 1j):
        for j in range(m):
            z = np.zeros(m, complex)
            z[j] = part
            x = np.fft.irfftn(z.reshape(mshape), s=shape, axes=_axes(rank), norm=norm)
            cols.append(x.reshape(-1))
    return np.stack(cols, axis=1)


def _dense_rfft(shape, norm):
    """x -> (Re X, Im X) as a dense [2M, N] matrix, built with NumPy."""
    n, rank = int(np.prod(shape)), len(shape)
    cols = []
    for j in range(n):
        x = np.zeros(n)
        x[j] = 1.0
        big_x = np.fft.rfftn(x.reshape(shape), axes=_axes(rank), norm=norm).reshape(-1)
        cols.append(np.concatenate([big_x.real, big_x.imag]))
    return np.stack(cols, axis=1)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_forward_values_match_numpy(rank, norm, dtype):
    rng = np.random.default_rng(0)
    for shape in RANK_SHAPES[rank]:
        x = rng.standard_normal((2, 3, *shape)).astype(dtype)
        got = ops.rfftn(x, rank, norm=norm).numpy()
        want = np.fft.rfftn(x.astype(np.float64), axes=_axes(rank), norm=norm)
        assert got.dtype == CDTYPE[dtype]
        assert _rel_err(got, want) < RTOL[dtype]
        back = ops.irfftn(got, rank, fft_length=shape, norm=norm).numpy()
        want_back = np.fft.irfftn(want, s=shape, axes=_axes(rank), norm=norm)
        assert back.dtype == dtype
        assert _rel_err(back, want_back) < RTOL[dtype]


def test_named_wrappers_and_default_lengths():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6, 8))
    np.testing.assert_allclose(ops.rfft3d(x).numpy(), np.fft.rfftn(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ops.rfft2d(x).numpy(), np.fft.rfft2(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ops.rfft(x).numpy(), np.fft.rfft(x), rtol=1e-12, atol=1e-12)
    z = np.fft.rfftn(x)
    # Default fft_length is NumPy's: 2 (m - 1) on the last axis.
    np.testing.assert_allclose(ops.irfft3d(z).numpy(), np.fft.irfftn(z), atol=1e-12)
    np.testing.assert_allclose(ops.irfft(z, 8).numpy(), np.fft.irfft(z, 8), atol=1e-12)
    np.testing.assert_allclose(
        ops.irfft2d(z, (6, 8)).numpy(), np.fft.irfft2(z, s=(6, 8)), atol=1e-12
    )


@pytest.mark.parametrize("fft_length", [(4, 6, 8), (3, 8, 5), (6, 4, 9)])
def test_fft_length_crops_and_pads_every_axis(fft_length):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 6, 7))
    got = ops.rfft3d(x, fft_length=fft_length).numpy()
    np.testing.assert_allclose(got, np.fft.rfftn(x, s=fft_length, axes=(-3, -2, -1)), atol=1e-11)
    z = np.fft.rfftn(x, axes=(-3, -2, -1))
    got = ops.irfft3d(z, fft_length=fft_length).numpy()
    want = np.fft.irfftn(z, s=fft_length, axes=(-3, -2, -1))
    np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("norm", NORMS)
def test_irfft_gradient_equals_dense_jacobian_transpose(rank, norm):
    """grad_Z = J_re^T g + i J_im^T g with J built by NumPy, for every parity mix."""
    rng = np.random.default_rng(3)
    for shape in RANK_SHAPES[rank]:
        jac = _dense_irfft(shape, norm)
        m = jac.shape[1] // 2
        z = rng.standard_normal((2, *_half(shape))) + 1j * rng.standard_normal((2, *_half(shape)))
        g = rng.standard_normal((2, *shape))
        z_t = tf.constant(z)
        with tf.GradientTape() as tape:
            tape.watch(z_t)
            loss = tf.reduce_sum(ops.irfftn(z_t, rank, fft_length=shape, norm=norm) * g)
        got = tape.gradient(loss, z_t).numpy().reshape(2, -1)
        want = g.reshape(2, -1) @ jac
        want = want[:, :m] + 1j * want[:, m:]
        assert _rel_err(got, want) < 1e-10, shape


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("norm", NORMS)
def test_rfft_gradient_equals_dense_jacobian_transpose(rank, norm):
    rng = np.random.default_rng(4)
    for shape in RANK_SHAPES[rank]:
        jac = _dense_rfft(shape, norm)
        x = tf.constant(rng.standard_normal((2, *shape)))
        big_g = rng.standard_normal((2, *_half(shape))) + 1j * rng.standard_normal(
            (2, *_half(shape))
        )
        with tf.GradientTape() as tape:
            tape.watch(x)
            big_x = ops.rfftn(x, rank, norm=norm)
            loss = tf.reduce_sum(
                tf.math.real(big_x) * big_g.real + tf.math.imag(big_x) * big_g.imag
            )
        got = tape.gradient(loss, x).numpy().reshape(2, -1)
        flat_g = big_g.reshape(2, -1)
        want = np.concatenate([flat_g.real, flat_g.imag], axis=1) @ jac
        assert _rel_err(got, want) < 1e-10, shape


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("norm", NORMS)
def test_dot_product_adjoint_identity(dtype, norm):
    """<A x, y> = <x, A^T y>, with A^T taken from autodiff, for irfft3d and rfft3d."""
    rng = np.random.default_rng(5)
    for shape in SHAPES_3D:
        half = _half(shape)
        z = (rng.standard_normal(half) + 1j * rng.standard_normal(half)).astype(CDTYPE[dtype])
        y = rng.standard_normal(shape).astype(dtype)
        z_t = tf.constant(z)
        with tf.GradientTape() as tape:
            tape.watch(z_t)
            ax = ops.irfft3d(z_t, fft_length=shape, norm=norm)
        at_y = tape.gradient(ax, z_t, output_gradients=tf.constant(y)).numpy()
        lhs = np.sum(ax.numpy().astype(np.float64) * y)
        rhs = np.sum(z.real * at_y.real + z.imag * at_y.imag, dtype=np.float64)
        assert abs(lhs - rhs) <= RTOL[dtype] * (abs(lhs) + np.linalg.norm(y) + 1), shape


def test_classic_mistake_is_wrong():
    """The naive ``rfft3d(dy)`` is not the gradient of irfft3d: it misses w / N."""
    shape = (4, 6, 8)
    rng = np.random.default_rng(6)
    z = tf.constant(np.fft.rfftn(rng.standard_normal(shape)))
    g = rng.standard_normal(shape)
    with tf.GradientTape() as tape:
        tape.watch(z)
        loss = tf.reduce_sum(ops.irfft3d(z, shape) * g)
    right = tape.gradient(loss, z).numpy()
    naive = np.fft.rfftn(g)
    w = np.array([1, 2, 2, 2, 1])
    np.testing.assert_allclose(right, naive * w / np.prod(shape), atol=1e-12)
    assert not np.allclose(right, naive)


def test_raw_tf_signal_ops_are_differentiable_after_import():
    x = tf.constant(np.random.default_rng(7).standard_normal((3, 4, 5)))
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(tf.abs(tf.signal.rfft3d(x)) ** 2)
    assert tape.gradient(loss, x) is not None
    assert ops.register_gradients() == {"RFFT3D": False, "IRFFT3D": False}  # idempotent


def _nonlinear_loss(x, norm):
    big_x = ops.rfft3d(x, norm=norm)
    power = tf.math.real(big_x * tf.math.conj(big_x))
    weights = tf.cast(tf.range(tf.shape(power)[-1]) + 1, x.dtype)
    back = ops.irfft3d(big_x * tf.cast(weights, big_x.dtype), tf.shape(x)[-3:], norm=norm)
    return tf.reduce_sum(power * weights) + tf.reduce_sum(tf.sin(back) * x)


@pytest.mark.parametrize("shape", [(4, 5, 6), (3, 4, 5)])
@pytest.mark.parametrize("norm", ["backward", "ortho"])
def test_hessian_vector_product_matches_finite_differences(shape, norm):
    rng = np.random.default_rng(8)
    x0 = rng.standard_normal(shape)
    v = rng.standard_normal(shape)

    def grad(x):
        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = _nonlinear_loss(x, norm)
        return tape.gradient(loss, x)

    x = tf.constant(x0)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            loss = _nonlinear_loss(x, norm)
        g = inner.gradient(loss, x)
        gv = tf.reduce_sum(g * v)
    hvp = outer.gradient(gv, x).numpy()
    eps = 1e-5
    fd = (grad(x0 + eps * v).numpy() - grad(x0 - eps * v).numpy()) / (2 * eps)
    assert _rel_err(hvp, fd) < 1e-6


def test_second_derivative_of_irfft_through_both_gradients():
    """d/dZ of (grad_Z of a nonlinear loss) exercises the rfft3d gradient inside it."""
    shape = (4, 6, 5)
    rng = np.random.default_rng(9)
    half = _half(shape)
    z0 = rng.standard_normal(half) + 1j * rng.standard_normal(half)
    dz = rng.standard_normal(half) + 1j * rng.standard_normal(half)

    def loss_fn(z):
        return tf.reduce_sum(ops.irfft3d(z, shape) ** 4)

    def grad(z):
        z = tf.constant(z)
        with tf.GradientTape() as tape:
            tape.watch(z)
            loss = loss_fn(z)
        return tape.gradient(loss, z).numpy()

    z = tf.constant(z0)
    with tf.GradientTape() as outer:
        outer.watch(z)
        with tf.GradientTape() as inner:
            inner.watch(z)
            loss = loss_fn(z)
        g = inner.gradient(loss, z)
        # Directional second derivative: <grad, dz> in the real inner product.
        gv = tf.reduce_sum(tf.math.real(g) * dz.real + tf.math.imag(g) * dz.imag)
    hvp = outer.gradient(gv, z).numpy()
    eps = 1e-6
    fd = (grad(z0 + eps * dz) - grad(z0 - eps * dz)) / (2 * eps)
    assert _rel_err(hvp, fd) < 1e-6


@pytest.mark.parametrize("shape", [(4, 6, 8), (5, 7, 9), (3, 4, 5)])
@pytest.mark.parametrize("norm", NORMS)
def test_forward_mode_matches_dense_jacobian(shape, norm):
    rng = np.random.default_rng(10)
    half = _half(shape)
    z = tf.constant(rng.standard_normal(half) + 1j * rng.standard_normal(half))
    t = rng.standard_normal(half) + 1j * rng.standard_normal(half)
    with tf.autodiff.ForwardAccumulator(z, tf.constant(t)) as acc:
        x = ops.irfft3d(z, shape, norm=norm)
    got = acc.jvp(x).numpy().reshape(-1)
    jac = _dense_irfft(shape, norm)
    want = jac @ np.concatenate([t.real.reshape(-1), t.imag.reshape(-1)])
    assert _rel_err(got, want) < 1e-10

    xr = tf.constant(rng.standard_normal(shape))
    tr = rng.standard_normal(shape)
    with tf.autodiff.ForwardAccumulator(xr, tf.constant(tr)) as acc:
        big_x = ops.rfft3d(xr, norm=norm)
    got = acc.jvp(big_x).numpy().reshape(-1)
    want = _dense_rfft(shape, norm) @ tr.reshape(-1)
    m = got.size
    assert _rel_err(got, want[:m] + 1j * want[m:]) < 1e-10


def test_forward_over_reverse_hvp():
    """Forward-mode over a reverse-mode gradient: the Hessian-vector product JAX-style."""
    shape = (4, 5, 6)
    rng = np.random.default_rng(11)
    x = tf.constant(rng.standard_normal(shape))
    v = tf.constant(rng.standard_normal(shape))
    with tf.autodiff.ForwardAccumulator(x, v) as acc:
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = _nonlinear_loss(x, "ortho")
        g = tape.gradient(loss, x)
    fwd = acc.jvp(g).numpy()
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            loss = _nonlinear_loss(x, "ortho")
        gv = tf.reduce_sum(inner.gradient(loss, x) * v)
    rev = outer.gradient(gv, x).numpy()
    assert _rel_err(fwd, rev) < 1e-10


@pytest.fixture(scope="module")
def compiled_value_and_grads():
    def f(x, z, g):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, z])
            a = tf.reduce_sum(tf.abs(ops.rfft3d(x, norm="ortho")) ** 2 * 0.5)
            b = tf.reduce_sum(ops.irfft3d(z, fft_length=[3, 4, 5]) * g)
        return a, b, tape.gradient(a, x), tape.gradient(b, z)

    return {
        "eager": f,
        "graph": tf.function(f),
        "xla": tf.function(f, jit_compile=True),
    }


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_eager_graph_and_xla_agree(compiled_value_and_grads, dtype):
    rng = np.random.default_rng(12)
    x = tf.constant(rng.standard_normal((2, 3, 4, 5)).astype(dtype))
    z = tf.constant(np.fft.rfftn(rng.standard_normal((2, 3, 4, 5)), axes=(1, 2, 3)), CDTYPE[dtype])
    g = tf.constant(rng.standard_normal((2, 3, 4, 5)).astype(dtype))
    results = {k: [t.numpy() for t in f(x, z, g)] for k, f in compiled_value_and_grads.items()}
    for mode in ("graph", "xla"):
        for got, want in zip(results[mode], results["eager"], strict=True):
            assert _rel_err(got, want) < RTOL[dtype], mode
    # Parseval with ortho: the gradient of ||rfft(x)||^2 / 2 is only the identity
    # after the Hermitian weights are accounted for; here just check it is finite.
    assert np.all(np.isfinite(results["xla"][2]))


def test_dynamic_fft_length_in_gradient():
    """fft_length fed as a tensor of unknown value (as forward mode traces it)."""

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, None, None], tf.float64),
            tf.TensorSpec([3], tf.int32),
        ]
    )
    def grad_fn(x, n):
        with tf.GradientTape() as tape:
            tape.watch(x)
            big_x = tf.signal.rfft3d(x, n)
            y = tf.signal.irfft3d(big_x * tf.cast(2.0, big_x.dtype), n)
            loss = tf.reduce_sum(y * tf.sin(x))
        return tape.gradient(loss, x)

    rng = np.random.default_rng(13)
    for shape in [(4, 5, 6), (3, 4, 5)]:
        x = rng.standard_normal(shape)
        got = grad_fn(tf.constant(x), tf.constant(shape, tf.int32)).numpy()
        with tf.GradientTape() as tape:
            xt = tf.constant(x)
            tape.watch(xt)
            loss = tf.reduce_sum(2 * xt * tf.sin(xt))
        want = tape.gradient(loss, xt).numpy()
        assert _rel_err(got, want) < 1e-10


def test_hermitian_projection_is_a_noop_on_cpu():
    """CPU c2r reads only the Hermitian part of the self-paired planes."""
    rng = np.random.default_rng(14)
    for shape in SHAPES_3D:
        half = _half(shape)
        g = tf.constant(rng.standard_normal(half) + 1j * rng.standard_normal(half))
        projected = ops.hermitian_project(g, shape)
        np.testing.assert_allclose(
            ops.irfft3d(g, shape).numpy(), ops.irfft3d(projected, shape).numpy(), atol=1e-13
        )
        # ... and it really projects: applied twice changes nothing more, and the
        # result is what rfft of a real field gives back.
        again = ops.hermitian_project(projected, shape)
        np.testing.assert_allclose(again.numpy(), projected.numpy(), atol=1e-13)
        roundtrip = ops.rfft3d(ops.irfft3d(projected, shape))
        w = ops.hermitian_weights(shape[-1], tf.float64).numpy()
        plane = w == 1
        np.testing.assert_allclose(
            roundtrip.numpy()[..., plane], projected.numpy()[..., plane], atol=1e-12
        )


@pytest.mark.parametrize(
    ("n", "want"), [(8, [1, 2, 2, 2, 1]), (9, [1, 2, 2, 2, 2]), (1, [1]), (2, [1, 1])]
)
def test_hermitian_weights_follow_parity_not_half_length(n, want):
    np.testing.assert_array_equal(ops.hermitian_weights(n, tf.int32).numpy(), want)
    np.testing.assert_array_equal(ops.hermitian_weights([3, 4, n], tf.int32).numpy(), want)


def test_bad_arguments_raise_clear_errors():
    x = tf.zeros((4, 4, 4))
    with pytest.raises(ValueError, match="norm"):
        ops.rfft3d(x, norm="unitary")
    with pytest.raises(ValueError, match="rank"):
        ops.rfftn(x, rank=4)
    with pytest.raises(ValueError, match="at least 3 axes"):
        ops.rfft3d(tf.zeros((4, 4)))
    with pytest.raises(ValueError, match="fft_length"):
        ops.rfft3d(x, fft_length=[4, 4])
    with pytest.raises(ValueError, match="positive"):
        ops.irfft3d(tf.zeros((4, 4, 3), tf.complex64), fft_length=[4, 0, 4])
    with pytest.raises(TypeError, match="complex"):
        ops.irfft3d(x)
    with pytest.raises(TypeError, match="real"):
        ops.rfft3d(tf.zeros((4, 4, 4), tf.complex64))


@pytest.mark.parametrize(
    ("in_shape", "fft_length"),
    [((7,), (5,)), ((5,), (8,)), ((4, 7), (6, 5)), ((4, 6, 7), (3, 8, 5)), ((3, 5, 4), (4, 4, 7))],
)
def test_gradients_with_cropping_and_padding(in_shape, fft_length):
    """Both adjoints when fft_length differs from the input's shape (crop / zero-pad)."""
    rank = len(in_shape)
    rng = np.random.default_rng(15)
    n_in = int(np.prod(in_shape))
    jac = []
    for j in range(n_in):
        e = np.zeros(n_in)
        e[j] = 1
        col = np.fft.rfftn(e.reshape(in_shape), s=fft_length, axes=_axes(rank)).reshape(-1)
        jac.append(np.concatenate([col.real, col.imag]))
    jac = np.stack(jac, 1)
    x = tf.constant(rng.standard_normal(in_shape))
    half = _half(fft_length)
    big_g = rng.standard_normal(half) + 1j * rng.standard_normal(half)
    with tf.GradientTape() as tape:
        tape.watch(x)
        big_x = ops.rfftn(x, rank, fft_length=fft_length)
        loss = tf.reduce_sum(tf.math.real(big_x) * big_g.real + tf.math.imag(big_x) * big_g.imag)
    got = tape.gradient(loss, x).numpy().reshape(-1)
    want = np.concatenate([big_g.real.reshape(-1), big_g.imag.reshape(-1)]) @ jac
    assert _rel_err(got, want) < 1e-10

    # irfft whose input half-spectrum is larger/smaller than fft_length asks for.
    z_shape = _half(in_shape)
    m = int(np.prod(z_shape))
    jac = []
    for part in (1.0, 1j):
        for j in range(m):
            e = np.zeros(m, complex)
            e[j] = part
            jac.append(np.fft.irfftn(e.reshape(z_shape), s=fft_length, axes=_axes(rank)).ravel())
    jac = np.stack(jac, 1)
    z = tf.constant(rng.standard_normal(z_shape) + 1j * rng.standard_normal(z_shape))
    g = rng.standard_normal(fft_length)
    with tf.GradientTape() as tape:
        tape.watch(z)
        loss = tf.reduce_sum(ops.irfftn(z, rank, fft_length=fft_length) * g)
    got = tape.gradient(loss, z).numpy().reshape(-1)
    want = g.reshape(-1) @ jac
    assert _rel_err(got, want[:m] + 1j * want[m:]) < 1e-10


def test_registered_gradients_handle_mismatched_fft_length_in_raw_ops():
    """Raw tf.signal calls crop/pad inside the op; the registered gradients follow."""
    rng = np.random.default_rng(16)
    x = rng.standard_normal((2, 4, 6, 7))
    fft_length = [3, 8, 5]
    big_g = rng.standard_normal((2, 3, 8, 3)) + 1j * rng.standard_normal((2, 3, 8, 3))
    grads = []
    for fn in (tf.signal.rfft3d, ops.rfft3d):
        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            big_x = fn(xt, fft_length)
            loss = tf.reduce_sum(tf.math.real(big_x * np.conj(big_g)))
        grads.append(tape.gradient(loss, xt).numpy())
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-12)
    z = np.fft.rfftn(x, axes=(-3, -2, -1))
    g = rng.standard_normal((2, *fft_length))
    grads = []
    for fn in (tf.signal.irfft3d, ops.irfft3d):
        zt = tf.constant(z)
        with tf.GradientTape() as tape:
            tape.watch(zt)
            loss = tf.reduce_sum(fn(zt, fft_length) * g)
        grads.append(tape.gradient(loss, zt).numpy())
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-12)
