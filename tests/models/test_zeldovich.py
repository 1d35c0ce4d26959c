"""The Zel'dovich (1LPT) + CIC forward model: identities, float64 gradient check, XLA;
against an independent NumPy displacement and paint, from sites on and off the nodes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import models
from tests.models.test_cic import paint_np

GRIDS = {"even": ((8, 8, 8), (80.0, 80.0, 80.0)), "odd": ((7, 6, 5), (70.0, 66.0, 40.0))}
POWER = models.PowerLaw(2000.0, -1.5, 0.1)


def _delta(grid, num_chains=2, seed=(1, 2), dtype=tf.float64):
    model = models.GaussianFieldModel(grid, POWER, 1.0, dtype=dtype)
    return model.field_from_latents(*model.init_latents("prior", num_chains, seed=list(seed)))


def _site_phase(shape, offset):
    """exp(2 pi i offset m / n) per axis on the rfft half-spectrum (m signed; its real
    part cos(pi offset) on the Nyquist plane): rfftn(delta) times it is the modes of
    delta translated by -offset cells, its values at the sites q + offset."""
    freqs = [np.fft.fftfreq(shape[0]), np.fft.fftfreq(shape[1]), np.fft.rfftfreq(shape[2])]
    per_axis = [
        np.where(np.abs(f) == 0.5, np.cos(2 * np.pi * offset * f), np.exp(2j * np.pi * offset * f))
        for f in freqs
    ]
    return per_axis[0][:, None, None] * per_axis[1][None, :, None] * per_axis[2][None, None, :]


def _displacement_np(delta, box, growth, offset):
    """1LPT displacement in cells at the sites q + offset, [B, 3, n0, n1, n2]:
    irfft(i D k_a / k^2 delta_k phase) / h_a, i k_a 0 on an even axis' Nyquist frequency."""
    shape = delta.shape[1:]
    cell = np.asarray(box, float) / np.asarray(shape)
    freqs = [np.fft.fftfreq(shape[0]), np.fft.fftfreq(shape[1]), np.fft.rfftfreq(shape[2])]
    k = [2 * np.pi * f / h for f, h in zip(freqs, cell, strict=True)]
    k = [k[0][:, None, None], k[1][None, :, None], k[2][None, None, :]]
    k2 = sum(ka**2 for ka in k)
    inv_k2 = np.where(k2 > 0, 1.0 / np.where(k2 > 0, k2, 1.0), 0.0)
    modes = np.fft.rfftn(delta, axes=(1, 2, 3)) * _site_phase(shape, offset)
    disp = []
    for a in range(3):
        derivative = np.where(np.abs(freqs[a]) == 0.5, 0.0, 1.0).reshape(k[a].shape) * k[a]
        psi = np.fft.irfftn(1j * growth * derivative * inv_k2 * modes, s=shape, axes=(1, 2, 3))
        disp.append(psi / cell[a])
    return np.stack(disp, axis=1)


@pytest.mark.parametrize("offset", [0.5, 0.0])
@pytest.mark.parametrize("grid_key", GRIDS)
def test_displacement_divergence_is_minus_growth_delta(grid_key, offset):
    """Spectral -div(Psi) = D delta at the sites (delta's modes times the phase to the
    sites) on every mode off the Nyquist planes; Psi equals the NumPy displacement."""
    grid = models.Grid(*GRIDS[grid_key])
    growth = 0.8
    fwd = models.ZeldovichForward(grid, growth=growth, lattice_offset=offset)
    delta = _delta(grid).numpy()
    disp = fwd.displacement(tf.constant(delta)).numpy()  # cells
    np.testing.assert_allclose(
        disp, _displacement_np(delta, grid.box_size, growth, offset), atol=1e-12
    )
    k = grid.kvec()
    cell = np.asarray(grid.box_size) / np.asarray(grid.grid_shape)
    div = sum(
        1j * k[a] * np.fft.rfftn(disp[:, a] * cell[a], axes=(1, 2, 3)) for a in range(3)
    )  # [B, n0, n1, m]
    target = growth * np.fft.rfftn(delta, axes=(1, 2, 3)) * _site_phase(grid.grid_shape, offset)
    keep = np.ones(grid.modes_shape, bool)
    for a, n in enumerate(grid.grid_shape):
        if n % 2 == 0:
            index = [slice(None)] * 3
            index[a] = n // 2
            keep[tuple(index)] = False
    scale = np.abs(target).max()
    np.testing.assert_allclose(-div[:, keep] / scale, target[:, keep] / scale, atol=1e-12)
    # displacement is real-valued and mean-free
    np.testing.assert_allclose(disp.mean(axis=(2, 3, 4)), 0.0, atol=1e-12)


@pytest.mark.parametrize("offset", [0.5, 0.0])
@pytest.mark.parametrize("grid_key", GRIDS)
def test_forward_is_paint_of_displaced_particles(grid_key, offset):
    """delta_e = CIC(q + offset + Psi) - 1 against the NumPy displacement and paint (the
    default sites are half a cell off the nodes); mass conserved; D = 0 gives 0."""
    grid = models.Grid(*GRIDS[grid_key])
    fwd = models.ZeldovichForward(grid, growth=1.3, lattice_offset=offset)
    assert models.ZeldovichForward(grid).lattice_offset == 0.5
    delta = _delta(grid)
    disp = _displacement_np(delta.numpy(), grid.box_size, 1.3, offset)
    q = np.stack(np.meshgrid(*map(np.arange, grid.grid_shape), indexing="ij")) + offset
    pos = np.moveaxis(q[None] + disp, 1, -1).reshape(2, -1, 3)
    expected = paint_np(pos, np.ones(pos.shape[:2]), grid.grid_shape) - 1.0
    evolved = fwd(delta).numpy()
    np.testing.assert_allclose(evolved, expected, atol=1e-12)
    np.testing.assert_allclose(evolved.sum(axis=(1, 2, 3)), 0.0, atol=1e-10)
    zero = models.ZeldovichForward(grid, growth=0.0, lattice_offset=offset)(delta).numpy()
    np.testing.assert_allclose(zero, 0.0, atol=1e-14)


def test_smoothing_multiplies_the_modes_by_a_gaussian():
    grid = models.Grid(*GRIDS["even"])
    raw = models.ZeldovichForward(grid, 1.0)(_delta(grid)).numpy()
    smooth = models.ZeldovichForward(grid, 1.0, smoothing=12.0)(_delta(grid)).numpy()
    kernel = np.exp(-0.5 * 12.0**2 * grid.kmag() ** 2)
    expected = np.fft.irfftn(
        np.fft.rfftn(raw, axes=(1, 2, 3)) * kernel, s=grid.grid_shape, axes=(1, 2, 3)
    )
    np.testing.assert_allclose(smooth, expected, atol=1e-12)


@pytest.mark.parametrize("smoothing", [None, 10.0], ids=["raw", "smoothed"])
@pytest.mark.parametrize("grid_key", GRIDS)
def test_gradient_matches_finite_differences_along_random_directions(grid_key, smoothing):
    """float64 reverse-mode gradient of <F(delta), r> vs central differences.

    F is piecewise smooth (CIC is piecewise linear in the positions); with eps = 1e-7
    the chance that a particle crosses a cell face inside the stencil is ~1e-4.
    """
    grid = models.Grid(*GRIDS[grid_key])
    fwd = models.ZeldovichForward(grid, growth=1.0, smoothing=smoothing)
    delta = _delta(grid)
    rng = np.random.default_rng(11)
    r = tf.constant(rng.standard_normal(delta.shape))

    def loss(d):
        return tf.reduce_sum(fwd(d) * r)

    with tf.GradientTape() as tape:
        tape.watch(delta)
        value = loss(delta)
    grad = tape.gradient(value, delta).numpy()
    eps = 1e-7
    for _ in range(5):
        v = rng.standard_normal(delta.shape)
        v /= np.linalg.norm(v)
        up = float(loss(delta + eps * v))
        down = float(loss(delta - eps * v))
        fd = (up - down) / (2 * eps)
        np.testing.assert_allclose(np.sum(grad * v), fd, rtol=1e-5, atol=1e-6 * abs(float(value)))


@pytest.mark.parametrize("grid_key", GRIDS)
def test_from_modes_equals_forward_and_its_gradient_matches_finite_differences(grid_key):
    """from_modes(rfft3d(delta)) == F(delta); its gradient (TF's complex convention,
    registered adjoint) vs central differences along Hermitian directions rfft3d(v)."""
    grid = models.Grid(*GRIDS[grid_key])
    fwd = models.ZeldovichForward(grid, growth=1.0)
    delta = _delta(grid)
    modes = tf.signal.rfft3d(delta)
    np.testing.assert_allclose(fwd.from_modes(modes).numpy(), fwd(delta).numpy(), atol=1e-12)
    rng = np.random.default_rng(12)
    r = tf.constant(rng.standard_normal(delta.shape))

    def loss(m):
        return tf.reduce_sum(fwd.from_modes(m) * r)

    with tf.GradientTape() as tape:
        tape.watch(modes)
        value = loss(modes)
    grad = tape.gradient(value, modes).numpy()
    eps = 1e-7
    for _ in range(4):
        v = np.fft.rfftn(rng.standard_normal(delta.shape), axes=(1, 2, 3))
        v /= np.linalg.norm(v)
        fd = (float(loss(modes + eps * v)) - float(loss(modes - eps * v))) / (2 * eps)
        directional = np.sum(np.real(np.conj(grad) * v))
        np.testing.assert_allclose(directional, fd, rtol=1e-5, atol=1e-6 * abs(float(value)))


@pytest.mark.parametrize(
    ("grid_key", "parametrization"), [("even", "noncentred"), ("odd", "centred")]
)
def test_model_through_the_modes_hook_has_the_same_log_density_and_gradient(
    grid_key, parametrization
):
    """ForwardFieldModel skips irfft3d -> rfft3d via from_modes; float64 log density and
    gradient equal those through forward(delta) (a function without the hook)."""
    grid = models.Grid(*GRIDS[grid_key])
    fwd = models.ZeldovichForward(grid, growth=1.2)
    kwargs = {"parametrization": parametrization, "dtype": tf.float64}
    hooked = models.GaussianFieldModel(grid, POWER, 0.3, forward=fwd, **kwargs)
    plain = models.GaussianFieldModel(
        grid, POWER, 0.3, forward=lambda d: fwd(d), check_forward=False, **kwargs
    )
    data = hooked.sample(seed=[3, 4])["data"]
    latents = hooked.init_latents("prior", 2, seed=[5, 6])
    out = []
    for target in (hooked.target_log_prob_fn(data), plain.target_log_prob_fn(data)):
        with tf.GradientTape() as tape:
            tape.watch(latents)
            value = target(*latents)
        out.append((value.numpy(), tape.gradient(value, latents)[0].numpy()))
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-13)
    scale = np.abs(out[1][1]).max()
    np.testing.assert_allclose(out[0][1] / scale, out[1][1] / scale, atol=1e-12)
    repinned = hooked.repinnable_target_log_prob_fn(data)(*latents).numpy()
    np.testing.assert_allclose(repinned, out[0][0], rtol=1e-13)


def test_value_and_gradient_under_xla_equal_eager_float32():
    """XLA equals eager; and the wavenumbers enter the compiled program as 1-D arguments:
    no HLO constant is larger than one axis (graph constants were folded into the
    [3, n0, n1, m] multiplier i k / k^2, 25 MB at 128^3; 960 elements here)."""
    import re

    grid = models.Grid(*GRIDS["even"])
    fwd = models.ZeldovichForward(grid, growth=1.0, smoothing=5.0)
    delta = _delta(grid, dtype=tf.float32)
    r = tf.constant(np.random.default_rng(2).standard_normal(delta.shape), tf.float32)

    def vg(d):
        with tf.GradientTape() as tape:
            tape.watch(d)
            y = tf.reduce_sum(fwd(d) * r) + tf.reduce_sum(fwd.from_modes(tf.signal.rfft3d(d)) * r)
        return y, tape.gradient(y, d)

    eager = vg(delta)
    compiled = tf.function(vg, jit_compile=True)
    xla = compiled(delta)
    assert xla[1].dtype == tf.float32
    hlo = compiled.experimental_get_compiler_ir(delta)(stage="hlo")
    shapes = re.findall(r"\w+\[([\d,]*)\]\S* constant\(", hlo)
    assert shapes  # the pattern matches this HLO
    sizes = [int(np.prod([int(v) for v in s.split(",") if v])) for s in shapes]
    assert max(sizes) <= max(grid.grid_shape), max(sizes)
    np.testing.assert_allclose(xla[0].numpy(), eager[0].numpy(), rtol=1e-4)
    np.testing.assert_allclose(xla[1].numpy(), eager[1].numpy(), atol=1e-4)


def test_bad_arguments():
    grid = models.Grid(*GRIDS["even"])
    with pytest.raises(ValueError, match="smoothing"):
        models.ZeldovichForward(grid, smoothing=-1.0)
    with pytest.raises(ValueError, match="growth"):
        models.ZeldovichForward(grid, growth=float("nan"))
    with pytest.raises(ValueError, match="Grid"):
        models.ZeldovichForward((8, 8, 8))
    with pytest.raises(ValueError, match="lattice_offset"):
        models.ZeldovichForward(grid, lattice_offset=0.25)


def test_log_density_is_differentiable_at_the_initial_lattice():
    """The CIC kink: from particles on the grid nodes the forward model's response to a
    small field eps*delta is not odd in eps, and the log density's gradient jumps
    between latents +eps*v and -eps*v (an HMC trajectory crosses such points wherever a
    displacement changes sign). From the default sites, half a cell off the nodes, both
    are smooth: the even part and the jump are O(eps)."""
    grid = models.Grid(*GRIDS["even"])
    delta = _delta(grid, num_chains=1)
    even_over_odd, jump = {}, {}
    for offset in (0.0, 0.5):
        fwd = models.ZeldovichForward(grid, growth=1.0, lattice_offset=offset)
        eps = 1e-5
        plus, minus = fwd(eps * delta).numpy(), fwd(-eps * delta).numpy()
        even_over_odd[offset] = np.linalg.norm(plus + minus) / np.linalg.norm(plus - minus)
        model = models.GaussianFieldModel(grid, POWER, 0.3, forward=fwd, dtype=tf.float64)
        target = model.target_log_prob_fn(model.sample(seed=[3, 4])["data"])
        v = model.init_latents("prior", 1, seed=[5, 6])[0]
        grads = []
        for sign in (1.0, -1.0):
            x = tf.constant(sign * eps, tf.float64) * v
            with tf.GradientTape() as tape:
                tape.watch(x)
                value = target(x)
            grads.append(tape.gradient(value, x).numpy())
        jump[offset] = np.linalg.norm(grads[0] - grads[1]) / np.linalg.norm(grads[0])
    assert even_over_odd[0.0] > 0.1 and jump[0.0] > 1e-2, (even_over_odd, jump)
    assert even_over_odd[0.5] < 1e-3 and jump[0.5] < 1e-4, (even_over_odd, jump)
    assert models.ZeldovichForward(grid).lattice_offset == 0.5


@pytest.mark.parametrize("offset", [0.5, 0.0])
def test_linear_gain_is_the_small_amplitude_response(offset):
    """linear_gain g_k vs <delta_e delta*> / <|delta|^2> measured per k-bin on a 1e-4
    amplitude field (bins with >= 100 modes); from sites half a cell off the nodes the
    response is linear and diagonal, so it equals g_k mode by mode."""
    grid = models.Grid((16, 16, 16), 128.0)
    fwd = models.ZeldovichForward(grid, growth=0.7, lattice_offset=offset)
    delta = 1e-4 * _delta(grid, num_chains=4).numpy()
    evolved = fwd(tf.constant(delta)).numpy()
    dk = np.fft.rfftn(delta, axes=(1, 2, 3))
    ek = np.fft.rfftn(evolved, axes=(1, 2, 3))
    w = grid.hermitian_weights()
    kbins = grid.kbins()
    checked = 0
    for b in range(kbins.num_bins):
        sel = kbins.index == b
        if w[sel].sum() < 100:
            continue
        measured = (w * (ek * dk.conj()).real)[:, sel].sum() / (w * np.abs(dk) ** 2)[:, sel].sum()
        predicted = (w * fwd.linear_gain)[sel].sum() / w[sel].sum()
        assert abs(measured - predicted) < 0.03 * 0.7, (kbins.k[b], measured, predicted)
        checked += 1
    assert checked >= 4
    # fundamental mode along an axis: g = D sin(k h) / (k h) from the nodes, the
    # difference over one cell D sin(k h / 2) / (k h / 2) from between them
    x = 2 * np.pi / 16 * (1.0 - offset)
    np.testing.assert_allclose(fwd.linear_gain[0, 0, 1], 0.7 * np.sin(x) / x, rtol=1e-12)
    if offset:
        scale = np.abs(dk).max()
        # second order in the 1e-4 amplitude: ~1e-5 of the largest mode
        np.testing.assert_allclose(ek / scale, fwd.linear_gain * dk / scale, atol=1e-4)
