"""The whole chain 2LPT + RSD + Lagrangian bias + CIC (+ deconvolution): NumPy reference,
float64 gradients against central differences (field and every parameter), XLA, batching,
and the number of FFTs in the compiled gradient."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc import models
from fieldhmc.models.lpt_galaxies import LPTGalaxyForward
from tests.load_script import load_script
from tests.models import lpt_reference as ref
from tests.models.test_cic import paint_np
from tests.models.test_lpt import GRIDS, random_field

PARAMS = {
    "growth1": [0.7, 0.9],
    "growth2": [-0.2, -0.35],
    "rate1": [0.75, 0.6],
    "rate2": [1.5, 1.2],
    "b1": [0.8, 1.3],
    "b2": [0.3, -0.4],
    "bs2": [-0.4, 0.25],
    "bnabla2": [3.0, -6.0],
}


def tensors(params, dtype=tf.float64):
    return {k: tf.constant(v, dtype) for k, v in params.items()}


def chain_np(delta, box, params, los_axis, deconvolve, offset=0.0):
    """The forward model from the NumPy pieces: positions, weights, loop paint, window.
    With ``offset`` the particles start at ``q + offset`` and see the linear field there
    (its modes times exp(2 pi i offset m / n) per axis)."""
    p = {k: np.asarray(v, float) for k, v in params.items()}
    shape = delta.shape[1:]
    if offset:
        axes = (1, 2, 3)
        # per axis exp(2 pi i offset f); its real part cos(pi offset) on the Nyquist plane
        per_axis = [np.fft.fftfreq(n) for n in shape]
        per_axis = [
            np.where(
                np.abs(f) == 0.5, np.cos(2 * np.pi * offset * f), np.exp(2j * np.pi * offset * f)
            )
            for f in per_axis
        ]
        phase = per_axis[0][:, None, None] * per_axis[1][None, :, None] * per_axis[2][None, None, :]
        delta = np.fft.ifftn(np.fft.fftn(delta, axes=axes) * phase, axes=axes).real
    disp = ref.redshift_space_displacement(
        delta, box, p["growth1"], p["growth2"], p["rate1"], p["rate2"], los_axis
    )
    weights = ref.bias_weights(delta, box, p["growth1"], p["b1"], p["b2"], p["bs2"], p["bnabla2"])
    q = np.stack(np.meshgrid(*map(np.arange, shape), indexing="ij")) + offset
    pos = np.moveaxis(q[None] + disp, 1, -1).reshape(delta.shape[0], -1, 3)
    out = paint_np(pos, weights.reshape(delta.shape[0], -1), shape) - 1.0
    if deconvolve:
        modes = np.fft.fftn(out, axes=(1, 2, 3)) / ref.cic_window(shape)
        out = np.fft.ifftn(modes, axes=(1, 2, 3)).real
    return out


@pytest.mark.parametrize(
    ("grid_key", "los_axis", "deconvolve", "offset"),
    [("even", -1, True, 0.0), ("odd", 1, True, 0.0), ("odd", 0, False, 0.0), ("odd", 1, True, 0.5)],
)
def test_chain_matches_numpy(grid_key, los_axis, deconvolve, offset):
    shape, box = GRIDS[grid_key]
    grid = models.Grid(shape, box)
    fwd = LPTGalaxyForward(grid, los_axis=los_axis, deconvolve=deconvolve, lattice_offset=offset)
    delta = random_field(shape, seed=17)
    got = fwd(tf.constant(delta), **tensors(PARAMS)).numpy()
    want = chain_np(delta, box, PARAMS, los_axis, deconvolve, offset)
    np.testing.assert_allclose(got, want, atol=1e-11)
    assert np.abs(got).max() > 0.3


@pytest.mark.parametrize("grid_key", GRIDS)
def test_half_cell_lattice_is_linear_at_small_fields(grid_key):
    """Issue 29: from particles on the nodes the painted field's response to a small
    field eps*delta is not odd in eps (the CIC kernel's kink at zero displacement: the
    forward model, and so the target's gradient, is not differentiable there); from
    sites half a cell off the nodes it is linear, and off the Nyquist planes its
    response tends to the Kaiser factor at low k."""
    shape, box = GRIDS[grid_key]
    grid = models.Grid(shape, box)
    delta = random_field(shape, seed=21)
    params = {k: v[:1] for k, v in PARAMS.items()}
    even_over_odd = {}
    for offset in (0.0, 0.5):
        fwd = LPTGalaxyForward(grid, los_axis=-1, lattice_offset=offset)
        plus, minus = (
            fwd(tf.constant(s * 1e-5 * delta[:1]), **tensors(params)).numpy() for s in (1, -1)
        )
        even_over_odd[offset] = np.linalg.norm(plus + minus) / np.linalg.norm(plus - minus)
        if offset:
            gain = fwd.linear_response(**tensors(params)).numpy()[0]
            ratio = np.fft.rfftn(plus[0] - minus[0]) / (2e-5 * np.fft.rfftn(delta[0])) / gain
            k = grid.kmag()
            low = (k > 0) & (k < 1.5 * k[k > 0].min())
            np.testing.assert_allclose(ratio[low], 1.0, atol=0.15)
    assert even_over_odd[0.0] > 0.1
    assert even_over_odd[0.5] < 1e-3


@pytest.mark.parametrize(
    ("grid_key", "los_axis", "deconvolve", "offset"),
    [("even", -1, True, 0.5), ("odd", 1, False, 0.5), ("odd", 0, True, 0.0)],
)
def test_linear_response_is_the_small_field_response(grid_key, los_axis, deconvolve, offset):
    """linear_response (the conditional parametrisation's surrogate) against the forward
    model's response to a small field eps*delta, measured mode by mode from the part odd
    in eps (2LPT, b2, bs2 drop out; b_nabla2 does not). From sites half a cell off the
    nodes the whole response is linear; the Kaiser factor it replaced is far from it
    beyond k_Nyq/2 (benchmarks/README.md)."""
    shape, box = GRIDS[grid_key]
    grid = models.Grid(shape, box)
    fwd = LPTGalaxyForward(grid, los_axis=los_axis, deconvolve=deconvolve, lattice_offset=offset)
    delta = random_field(shape, seed=23)
    eps = 1e-6
    plus, minus = (fwd(tf.constant(s * eps * delta), **tensors(PARAMS)).numpy() for s in (1, -1))
    measured = np.fft.rfftn(plus - minus, axes=(1, 2, 3)) / (2 * eps)
    predicted = fwd.linear_response(**tensors(PARAMS)).numpy() * np.fft.rfftn(delta, axes=(1, 2, 3))
    scale = np.abs(measured).max()
    # on the nodes the kink leaves an odd eps |eps| term (weights times |displacement|)
    atol = 1e-7 if offset else 1e-5
    np.testing.assert_allclose(measured / scale, predicted / scale, atol=atol)


def test_configurations_reduce_to_their_parts():
    """order 1 / no RSD / no bias: the matter field of the Zel'dovich model; the modes
    output is the rfft3d of the real one."""
    shape, box = GRIDS["even"]
    grid = models.Grid(shape, box)
    delta = tf.constant(random_field(shape, seed=18))
    for offset in (0.0, 0.5):  # sites on the nodes and half a cell off them
        matter = LPTGalaxyForward(
            grid, order=1, rsd=False, bias=None, deconvolve=False, lattice_offset=offset
        )
        assert matter.parameter_names == ("growth1",)
        zel = models.ZeldovichForward(grid, growth=0.8, lattice_offset=offset)
        np.testing.assert_allclose(matter(delta, growth1=0.8).numpy(), zel(delta), atol=1e-12)
        # and its linear response is the Zel'dovich model's (rate1 and b1 unused)
        gain = matter.linear_response(growth1=0.8, rate1=0.5, b1=2.0).numpy()[0]
        np.testing.assert_allclose(gain, zel.linear_gain, rtol=1e-12, atol=1e-15)
    full = LPTGalaxyForward(grid)
    assert full.parameter_names == tuple(PARAMS)
    real = full(delta, **tensors(PARAMS)).numpy()
    modes = full(delta, **tensors(PARAMS), return_modes=True).numpy()
    np.testing.assert_allclose(modes, np.fft.rfftn(real, axes=(1, 2, 3)), atol=1e-10)
    # the linear response tends to the Kaiser factor D (1 + b1 + f mu^2) at low k (on
    # the fundamental modes the lattice factors are within 3%; b_nabla2 k^2 within 2%)
    response = full.linear_response(**tensors(PARAMS)).numpy()
    k = grid.kvec()
    k2 = sum(ka**2 for ka in k)
    with np.errstate(invalid="ignore"):
        mu2 = np.nan_to_num(k[2] ** 2 / k2)
    p = {key: np.asarray(v)[:, None, None, None] for key, v in PARAMS.items()}
    kaiser = p["growth1"] * (1 + p["b1"] + p["rate1"] * mu2)
    fundamental = np.isclose(k2, k2[k2 > 0].min())  # 5 modes of the half-spectrum
    ratio = (response / kaiser)[:, fundamental]
    assert ratio.size == 2 * 5 and np.all(np.abs(ratio - 1) < 0.05), ratio
    with pytest.raises(ValueError, match="growth2"):
        full(delta, growth1=0.5, rate1=0.5, rate2=1.0)
    with pytest.raises(ValueError, match="rate1"):
        full(delta, growth1=0.5, growth2=-0.1)
    with pytest.raises(ValueError, match="order"):
        LPTGalaxyForward(grid, order=3)
    with pytest.raises(ValueError, match="bias"):
        LPTGalaxyForward(grid, bias="eulerian")


@pytest.mark.parametrize("grid_key", GRIDS)
def test_gradients_match_finite_differences(grid_key):
    """float64 reverse-mode gradient of <F, r> against central differences along random
    directions: in the modes (Hermitian directions rfft3d(v)), in delta, and in each of
    the 8 parameters (per-chain tensors). CIC is piecewise linear in the positions; with
    eps = 1e-6 a particle crosses a cell face inside the stencil with probability ~1e-3."""
    shape, box = GRIDS[grid_key]
    fwd = LPTGalaxyForward(models.Grid(shape, box))
    rng = np.random.default_rng(23)
    delta = tf.constant(random_field(shape, seed=19, scale=0.2))
    modes = tf.signal.rfft3d(delta)
    params = tensors(PARAMS)
    r = tf.constant(rng.standard_normal(delta.shape))

    def loss(m, p):
        return tf.reduce_sum(fwd.from_modes(m, **p) * r)

    with tf.GradientTape(persistent=True) as tape:
        tape.watch([modes, delta, *params.values()])
        value = loss(modes, params)
        value_delta = tf.reduce_sum(fwd(delta, **params) * r)
    grad_modes = tape.gradient(value, modes).numpy()
    grad_delta = tape.gradient(value_delta, delta).numpy()
    grad_params = {k: tape.gradient(value, v).numpy() for k, v in params.items()}
    eps = 1e-6
    atol = 1e-6 * abs(float(value))

    def check(directional, up, down):
        fd = (float(up) - float(down)) / (2 * eps)
        np.testing.assert_allclose(directional, fd, rtol=1e-5, atol=atol)

    for _ in range(3):
        v = rng.standard_normal(delta.shape)
        v /= np.linalg.norm(v)
        vk = np.fft.rfftn(v, axes=(1, 2, 3))
        check(np.sum(np.real(np.conj(grad_modes) * vk)), loss(modes + eps * vk, params),
              loss(modes - eps * vk, params))  # fmt: skip
        check(
            np.sum(grad_delta * v),
            tf.reduce_sum(fwd(delta + eps * v, **params) * r),
            tf.reduce_sum(fwd(delta - eps * v, **params) * r),
        )
    for name, g in grad_params.items():
        assert np.all(np.abs(g) > 0), name  # every parameter moves the output
        v = rng.standard_normal(2)
        shifted = {s: params[name] + s * eps * v for s in (1, -1)}
        check(
            np.sum(g * v),
            loss(modes, {**params, name: shifted[1]}),
            loss(modes, {**params, name: shifted[-1]}),
        )


def _load_benchmark():
    """benchmarks/lpt_forward.py as a module (its HLO transform counter is shared)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "lpt_forward.py"
    return load_script(path, "lpt_forward")


def test_compiled_value_gradient_equals_eager_is_batched_and_counts_ffts():
    """Under tf.function(jit_compile=True): value and gradients (modes, parameters) equal
    eager (float32); chain i's outputs depend only on chain i's inputs; the compiled
    gradient performs 13 transforms forward and 13 backward per chain (2LPT 6 + 1 + 3,
    b_nabla2 1, deconvolution 2): 13 FFT pairs per gradient; and it holds no
    [n0, n1, m] constant."""
    shape, box = GRIDS["even"]
    fwd = LPTGalaxyForward(models.Grid(shape, box))
    delta = random_field(shape, num_chains=3, seed=29, scale=0.2)
    params = {k: v + [v[0] * 1.1] for k, v in PARAMS.items()}
    r = np.random.default_rng(31).standard_normal(delta.shape)

    def vg(modes, r, params):
        with tf.GradientTape() as tape:
            tape.watch([modes, params])
            y = fwd.from_modes(modes, **params)
            loss = tf.reduce_sum(y * r)
        return y, tape.gradient(loss, [modes, params])

    args = (tf.signal.rfft3d(tf.constant(delta, tf.float32)), tf.constant(r, tf.float32))
    p32 = tensors(params, tf.float32)
    eager = vg(*args, p32)
    compiled = tf.function(vg, jit_compile=True)
    xla = compiled(*args, p32)
    np.testing.assert_allclose(xla[0].numpy(), eager[0].numpy(), atol=1e-4)
    scale = np.abs(eager[1][0].numpy()).max()
    np.testing.assert_allclose(xla[1][0].numpy() / scale, eager[1][0].numpy() / scale, atol=1e-4)
    for k in params:
        np.testing.assert_allclose(xla[1][1][k].numpy(), eager[1][1][k].numpy(), rtol=2e-3)
    # batching: change chain 2's field and parameters only
    delta2 = delta.copy()
    delta2[2] *= -1.3
    other = {k: tf.tensor_scatter_nd_update(v, [[2]], [v[2] * 0.9]) for k, v in p32.items()}
    moved = compiled(tf.signal.rfft3d(tf.constant(delta2, tf.float32)), args[1], other)
    np.testing.assert_array_equal(moved[0].numpy()[:2], xla[0].numpy()[:2])
    np.testing.assert_array_equal(moved[1][0].numpy()[:2], xla[1][0].numpy()[:2])
    assert np.abs(moved[0].numpy()[2] - xla[0].numpy()[2]).max() > 0.1
    # the program as lowered (the optimised one has the same transforms: the benchmark
    # counts those, and costs an XLA optimisation more here)
    hlo = compiled.experimental_get_compiler_ir(*args, p32)(stage="hlo")
    counts = _load_benchmark().count_fft_fields(hlo, num_chains=3)
    assert counts == {"RFFT": 13, "IRFFT": 13}, counts
    # wavenumbers and window enter as 1-D arguments: no constant larger than one axis
    # (graph constants were folded into [n0, n1, m] ones, as ZeldovichForward's were)
    shapes = re.findall(r"\w+\[([\d,]*)\]\S* constant\(", hlo)
    assert shapes
    assert max(int(np.prod([int(v) for v in s.split(",") if v])) for s in shapes) <= max(shape)


@pytest.mark.slow
def test_benchmark_runs(capsys):
    assert _load_benchmark().main(["--sizes", "8", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["8"])
    # FFT pairs per gradient counted in the HLO: full 13, modes out 12, 2LPT+RSD 10, 1LPT 3,
    # and the whole wired log posterior, conditional and noncentred latents: 12 each (its
    # white-noise likelihood reads the predicted modes: no deconvolved field's pair)
    pairs = [float(v) for v in row.split()[3::2]]
    assert pairs == [13.0, 12.0, 10.0, 3.0, 12.0, 12.0], row


def test_passes_the_forward_model_contract_check():
    """LPTGalaxyForward is a forward function with a modes hook for ForwardFieldModel:
    check_forward_fn (signature, shape, dtype, finite non-zero gradient, from_modes equal
    to the call) accepts it with fixed parameters, float32."""
    shape, box = GRIDS["odd"]
    fwd = LPTGalaxyForward(models.Grid(shape, box))
    delta = tf.constant(random_field(shape, seed=37, scale=0.2), tf.float32)
    params = {k: v[0] for k, v in PARAMS.items()}
    models.check_forward_fn(fwd, delta, params, compile_check=False)
