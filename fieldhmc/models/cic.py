"""Periodic cloud-in-cell (CIC) paint and readout, batched, with exact cheap gradients.

Positions are in **cell units** (a particle at ``(i, j, k)`` sits on the centre of cell
``(i, j, k)``; coordinates wrap periodically). With :math:`x_a = i_a + f_a`,
:math:`i_a = \\lfloor x_a \\rfloor`, a particle spreads weight to the 8 cells
:math:`c = (i_0 + e_0, i_1 + e_1, i_2 + e_2)`, :math:`e_a \\in \\{0, 1\\}`, with

.. math::

    W_c(x) = \\prod_a w_{e_a}(f_a), \\qquad w_0(f) = 1 - f, \\quad w_1(f) = f,

so that **paint** and **readout** are

.. math::

    \\rho_c = \\sum_p m_p\\, W_c(x_p), \\qquad
    v_p = \\sum_c W_c(x_p)\\, \\rho_c .

Readout is the adjoint (transpose) of paint in the weights :math:`m`:
:math:`\\langle \\mathrm{paint}(x, m), g\\rangle = \\langle m, \\mathrm{readout}(g, x)\\rangle`.
Both are piecewise linear in the positions; their derivative with respect to
:math:`x_{p,a}` replaces :math:`w_{e_a}` by :math:`\\partial w_{e_a}/\\partial f_a = \\pm 1`.

**Window.** Painting convolves with the CIC kernel (a tent of one cell per axis), whose
Fourier transform on the grid's wavenumbers (cell size :math:`h_a`) is

.. math::

    W(\\mathbf k) = \\prod_a \\mathrm{sinc}^2\\!\\left(\\frac{k_a h_a}{2}\\right),
    \\qquad \\mathrm{sinc}\\, x = \\frac{\\sin x}{x};

:func:`cic_deconvolve` divides the painted field's modes by it (:func:`cic_window`).
Deconvolution does not undo aliasing: for particles at independent uniform positions
the painted field's power is :math:`N_p \\sum_{\\mathbf n} W^2(\\mathbf k + 2\\pi
\\mathbf n / h) = N_p \\prod_a [1 - \\tfrac23 \\sin^2(k_a h_a / 2)]` (ref. 3), which
falls to :math:`1/3` per axis at the Nyquist frequency; after deconvolution it is that
sum over :math:`W^2(\\mathbf k)`, which rises to :math:`\\pi^4/48 \\approx 2.03` per axis:
flatter in dynamic range (27 -> 8.4 between the corner of the cube and ``k -> 0``), not flat.

Gradients are registered with :func:`tf.custom_gradient`: the backward pass of paint
is one 8-corner readout of the upstream gradient (values and position derivatives
from the same 8 gathers), and that of readout one paint plus the same gathers. The
backward pass reuses the forward pass's corner indices and fractions (one int32 and
three float fields of particles). Everything is TensorFlow (scatter with
:func:`tf.tensor_scatter_nd_add`, gathers with :func:`tf.gather`), batched over a
leading axis and XLA-compatible.

References
----------
1. Hockney & Eastwood (1988), *Computer Simulation Using Particles*, ch. 5.
2. Modi, Lanusse & Seljak (2021), "FlowPM: Distributed TensorFlow implementation of
   the FastPM cosmological N-body solver", arXiv:2010.11847.
3. Jing (2005), "Correcting for the alias effect when measuring the power spectrum
   using a fast Fourier transform", ApJ 620, 559, arXiv:astro-ph/0409240.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

__all__ = [
    "cic_deconvolve",
    "cic_paint",
    "cic_paint_lattice",
    "cic_readout",
    "cic_window",
    "half_cell_phase",
    "lattice_response_factors",
    "shift_to_sites",
]

_CORNERS = tuple((e0, e1, e2) for e0 in (0, 1) for e1 in (0, 1) for e2 in (0, 1))


def _corners(components: Sequence[tf.Tensor], grid_shape: Sequence[int]):
    """Flat indices of the 8 corner cells and the fractional offsets.

    ``components`` are 3 position arrays ``[batch, P]`` in cell units. Returns the flat
    indices ``[batch, P, 8]`` (int32, batch offset included, periodic wrap, corners in
    :data:`_CORNERS` order) and the 3 fractions :math:`f_a \\in [0, 1)`.
    """
    n0, n1, n2 = (int(n) for n in grid_shape)
    batch = tf.shape(components[0])[0]
    offset = tf.range(batch, dtype=tf.int32)[:, None] * (n0 * n1 * n2)
    fracs, pairs = [], []
    for x, n, stride in zip(components, (n0, n1, n2), (n1 * n2, n2, 1), strict=True):
        base = tf.floor(x)
        fracs.append(x - base)
        i0 = tf.math.floormod(tf.cast(base, tf.int32), n)
        pairs.append(tf.stack([i0, tf.where(i0 + 1 == n, 0, i0 + 1)], -1) * stride)
    index = (
        (offset[..., None] + pairs[0])[..., :, None, None]
        + pairs[1][..., None, :, None]
        + pairs[2][..., None, None, :]
    )
    return tf.reshape(index, tf.concat([tf.shape(components[0]), [8]], 0)), fracs


def _paint_flat(components, weights, grid_shape) -> tf.Tensor:
    """Forward paint without a custom gradient; returns ``[batch, n0, n1, n2]``.

    One scatter of the ``8 P`` corner weights :math:`m_p W_c(x_p)`.
    """
    index, fracs = _corners(components, grid_shape)
    return _scatter(index, fracs, weights, grid_shape)


def _scatter(index, fracs, weights, grid_shape) -> tf.Tensor:
    """Scatter of the corner weights of ``(index, fracs)`` (:func:`_corners`) times
    ``weights`` ``[batch, P]`` (``None``: unit masses)."""
    f0, f1, f2 = fracs
    w0 = tf.stack([1.0 - f0, f0], -1)[..., :, None, None]
    if weights is not None:
        w0 = w0 * weights[..., None, None, None]
    w1 = tf.stack([1.0 - f1, f1], -1)[..., None, :, None]
    w2 = tf.stack([1.0 - f2, f2], -1)[..., None, None, :]
    batch = tf.shape(index)[0]
    size = batch * int(grid_shape[0]) * int(grid_shape[1]) * int(grid_shape[2])
    out = tf.tensor_scatter_nd_add(
        tf.zeros(tf.reshape(size, [1]), f0.dtype),
        tf.reshape(index, [-1, 1]),
        tf.reshape(w0 * w1 * w2, [-1]),
    )
    return tf.reshape(out, tf.concat([[batch], tf.constant(grid_shape, tf.int32)], 0))


def _interpolate(field: tf.Tensor, index, fracs, *, with_positions: bool):
    """Readout of ``field`` ``[batch, n0, n1, n2]`` at the particles of ``(index, fracs)``
    (:func:`_corners`): values ``[batch, P]`` and, if ``with_positions``, the 3 position
    derivatives ``[batch, P]``.

    One gather of the ``8 P`` corner values, then the trilinear combination done axis
    by axis (minor axis first), which also gives the derivatives.
    """
    f0, f1, f2 = fracs
    g = tf.gather(tf.reshape(field, [-1]), index)  # [batch, P, 8]
    g = tf.reshape(g, tf.concat([tf.shape(f0), [2, 2, 2]], 0))
    lo, hi = g[..., 0], g[..., 1]  # [batch, P, 2, 2] over (e0, e1)
    a = lo + (hi - lo) * f2[..., None, None]
    lo1, hi1 = a[..., 0], a[..., 1]  # [batch, P, 2] over e0
    b = lo1 + (hi1 - lo1) * f1[..., None]
    value = b[..., 0] + (b[..., 1] - b[..., 0]) * f0
    if not with_positions:
        return value, None
    d2 = hi - lo
    d2 = d2[..., 0] + (d2[..., 1] - d2[..., 0]) * f1[..., None]
    d1 = hi1 - lo1
    dpos = (
        b[..., 1] - b[..., 0],
        d1[..., 0] + (d1[..., 1] - d1[..., 0]) * f0,
        d2[..., 0] + (d2[..., 1] - d2[..., 0]) * f0,
    )
    return value, dpos


def _check(positions: tf.Tensor, grid_shape: Sequence[int]) -> tuple[int, int, int]:
    grid_shape = tuple(int(n) for n in grid_shape)
    if len(grid_shape) != 3 or min(grid_shape) < 1:
        raise ValueError(f"grid_shape must be 3 positive integers, got {grid_shape}")
    if positions.shape.rank != 3 or positions.shape[-1] != 3:
        raise ValueError(f"positions must be [batch, num_particles, 3], got {positions.shape}")
    return grid_shape


def cic_paint(positions, weights, grid_shape: Sequence[int]) -> tf.Tensor:
    """Paint particles onto a periodic grid with cloud-in-cell weights.

    .. math:: \\rho_c = \\sum_p m_p\\, W_c(x_p)

    Parameters
    ----------
    positions : tf.Tensor
        float32/float64 ``[batch, num_particles, 3]`` in cell units (any real values;
        wrapped periodically).
    weights : tf.Tensor or None
        ``[batch, num_particles]`` particle masses :math:`m_p` (same dtype); ``None``
        means 1 for every particle.
    grid_shape : sequence of 3 int
        ``(n0, n1, n2)``.

    Returns
    -------
    tf.Tensor
        ``[batch, n0, n1, n2]``, the painted mass per cell (dtype of ``positions``).
        Differentiable in ``positions`` and ``weights`` (exact, piecewise-linear).
    """
    positions = tf.convert_to_tensor(positions)
    grid_shape = _check(positions, grid_shape)
    if weights is not None:
        weights = tf.convert_to_tensor(weights, positions.dtype)
    return _paint(tf.unstack(positions, axis=-1), weights, grid_shape)


def cic_readout(field, positions, grid_shape: Sequence[int] | None = None) -> tf.Tensor:
    """Interpolate a periodic grid at particle positions (the adjoint of :func:`cic_paint`).

    .. math:: v_p = \\sum_c W_c(x_p)\\, \\rho_c

    Parameters
    ----------
    field : tf.Tensor
        ``[batch, n0, n1, n2]``.
    positions : tf.Tensor
        ``[batch, num_particles, 3]`` in cell units, same dtype as ``field``.
    grid_shape : sequence of 3 int, optional
        Defaults to ``field.shape[1:]``.

    Returns
    -------
    tf.Tensor
        ``[batch, num_particles]``; differentiable in ``field`` and ``positions``.
    """
    field = tf.convert_to_tensor(field)
    positions = tf.convert_to_tensor(positions, field.dtype)
    grid_shape = _check(positions, grid_shape if grid_shape is not None else field.shape[1:])
    return _readout(field, tf.unstack(positions, axis=-1), grid_shape)


def _paint(components, weights, grid_shape):
    """:func:`cic_paint` on position components ``3 x [batch, P]`` (custom gradient).

    ``weights`` ``[batch, P]``, or ``None`` for unit masses (then no weight gradient).
    The corner indices and fractions are computed once and shared with the backward
    pass.
    """

    def forward(x0, x1, x2, m):
        index, fracs = _corners((x0, x1, x2), grid_shape)
        rho = _scatter(index, fracs, m, grid_shape)

        def grad(upstream):
            value, dpos = _interpolate(upstream, index, fracs, with_positions=True)
            if m is None:
                return dpos
            return (*(d * m for d in dpos), value)

        return rho, grad

    if weights is None:
        return tf.custom_gradient(lambda x0, x1, x2: forward(x0, x1, x2, None))(*components)
    return tf.custom_gradient(forward)(*components, weights)


def _readout(field, components, grid_shape):
    """:func:`cic_readout` on position components ``3 x [batch, P]`` (custom gradient)."""

    @tf.custom_gradient
    def readout(f, x0, x1, x2):
        index, fracs = _corners((x0, x1, x2), grid_shape)
        value, _ = _interpolate(f, index, fracs, with_positions=False)

        def grad(upstream):
            g_field = _scatter(index, fracs, upstream, grid_shape)
            _, dpos = _interpolate(f, index, fracs, with_positions=True)
            return g_field, dpos[0] * upstream, dpos[1] * upstream, dpos[2] * upstream

        return value, grad

    return readout(field, *components)


def cic_paint_lattice(displacement, weights=None, offset: float = 0.0) -> tf.Tensor:
    """Paint one particle per cell, moved from its lattice site by ``displacement``.

    .. math:: \\rho_c = \\sum_{\\mathbf q} m_{\\mathbf q}\\,
        W_c\\bigl(\\mathbf q + o + \\Psi(\\mathbf q)\\bigr)

    With ``offset`` :math:`o = 0` the sites are the grid nodes, where :math:`W_c` has its
    kink: the painted field is then only piecewise linear in small displacements
    (``rho(eps psi) - 1 != -(rho(-eps psi) - 1)``), so a log density through it has a
    discontinuous gradient wherever a displacement component changes sign. With
    :math:`o = 1/2` (sites between nodes) it is smooth until a particle moves half a cell.

    Parameters
    ----------
    displacement : tf.Tensor
        float32/float64 ``[batch, 3, n0, n1, n2]`` in **cell units**; component ``a`` of
        the particle that starts at the centre of cell ``q``.
    weights : tf.Tensor or None
        ``[batch, n0, n1, n2]`` particle masses :math:`m_{\\mathbf q}` (same dtype), or
        ``None`` for 1.
    offset : float
        The sites' offset from the nodes along every axis, in cells.

    Returns
    -------
    tf.Tensor
        ``[batch, n0, n1, n2]`` painted mass per cell; differentiable in both (custom
        gradient of :func:`cic_paint`).
    """
    displacement = tf.convert_to_tensor(displacement)
    if displacement.shape.rank != 5 or displacement.shape[1] != 3:
        raise ValueError(f"displacement must be [batch, 3, n0, n1, n2], got {displacement.shape}")
    dtype = displacement.dtype
    grid_shape = tuple(int(n) for n in displacement.shape[2:])
    batch = tf.shape(displacement)[0]
    # Unit masses: the offset is added last; in the lattice (tf.range(n) + offset) XLA's
    # CPU paint and its gradient took 1.25x as long at 64³ (the Zel'dovich model,
    # benchmarks/README.md). With weights the order made no difference in speed, and the
    # lattice's keeps the galaxy model's draws (float rounding) as they were.
    is_offset_last = weights is None and offset != 0.0
    q = [tf.range(n, dtype=dtype) for n in grid_shape]
    if not is_offset_last:
        q = [x + tf.constant(offset, dtype) for x in q]
    q = (q[0][:, None, None], q[1][None, :, None], q[2][None, None, :])
    components = [tf.reshape(q[a] + displacement[:, a], [batch, -1]) for a in range(3)]
    if is_offset_last:
        components = [x + tf.constant(offset, dtype) for x in components]
    if weights is not None:
        weights = tf.reshape(tf.convert_to_tensor(weights, dtype), [batch, -1])
    return _paint(components, weights, grid_shape)


def half_cell_phase(freqs: np.ndarray, offset: float) -> np.ndarray:
    """Per-axis factor :math:`e^{2\\pi i\\, o f}` that translates a field by ``-offset``
    cells (``freqs`` in cycles per cell); on the Nyquist frequency (:math:`|f| = 1/2`)
    its real part :math:`\\cos(\\pi o)`, the same for :math:`\\pm f` (0 for a half cell:
    :math:`\\cos \\pi(q + \\tfrac12) = 0` on the lattice)."""
    freqs = np.asarray(freqs, np.float64)
    nyquist = np.abs(freqs) == 0.5
    return np.where(
        nyquist, np.cos(2 * np.pi * offset * freqs), np.exp(2j * np.pi * offset * freqs)
    )


def shift_to_sites(modes, grid_shape: Sequence[int], offset: float) -> tf.Tensor:
    """``modes`` of the field translated by ``-offset`` cells: its values at the sites
    ``q + offset`` of :func:`cic_paint_lattice` on the nodes ``q``.

    .. math:: \\delta_k \\to \\delta_k \\prod_a e^{2\\pi i\\, o\\, m_a / n_a}

    (:func:`half_cell_phase`, signed frequencies :math:`m_a`). Three 1-D phase factors,
    eager and captured as program arguments (as in :func:`cic_deconvolve`); no FFT. Its
    adjoint is the shift by ``-offset`` (the conjugate phase; the Nyquist factor is real).

    Parameters
    ----------
    modes : tf.Tensor
        complex64/complex128 ``[..., n0, n1, n2 // 2 + 1]``.
    grid_shape : sequence of 3 int
        ``(n0, n1, n2)``.
    offset : float
        In cells, along every axis.

    Returns
    -------
    tf.Tensor
        Same shape and dtype as ``modes``.
    """
    n0, n1, n2 = (int(n) for n in grid_shape)
    freqs = (np.fft.fftfreq(n0), np.fft.fftfreq(n1), np.fft.rfftfreq(n2))
    with tf.init_scope():
        phase = [tf.constant(half_cell_phase(f, offset), modes.dtype) for f in freqs]
    return modes * phase[0][:, None, None] * phase[1][None, :, None] * phase[2][None, None, :]


def lattice_response_factors(
    grid_shape: Sequence[int], offset: float
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-axis factors of the linear response of a lattice painted by CIC.

    One particle per cell starts at the site :math:`q + o` (:func:`cic_paint_lattice`)
    with weight :math:`1 + \\beta\\,\\delta` and moves by the displacement
    :math:`\\Psi_a(\\mathbf k) = D_a\\, i k_a k^{-2}\\,\\delta(\\mathbf k)` (both evaluated
    at the sites, :func:`shift_to_sites`). To first order in :math:`\\delta` the painted
    field minus 1 is

    .. math:: \\Bigl[\\sum_a D_a \\frac{k_a^2}{k^2}\\, t_a \\prod_{b \\ne a} c_b
        + \\beta \\prod_b c_b\\Bigr]\\, \\delta(\\mathbf k)

    with, for :math:`x_a = \\pi m_a / n_a = k_a h_a / 2`,

    * :math:`o = 1/2` (sites between the nodes; exact and diagonal): a small displacement
      moves weight between the two nodes on either side of the site, a difference over one
      cell centred on it, :math:`t_a = \\sin x_a / x_a`, and each particle is split evenly
      over the two nodes of every other axis, :math:`c_b = \\cos x_b`;
    * :math:`o = 0` (sites on the nodes, the CIC kink): the difference is one-sided, its side
      that of the displacement; for the part odd in :math:`\\delta`, the centred difference
      :math:`t_a = \\sin 2x_a / 2x_a`, and :math:`c_b = 1` (a particle at rest paints only
      its own node).

    :math:`t_a = 0` on the Nyquist frequency (an even axis' derivative is 0 there); with
    :math:`o = 1/2` the response is 0 on every Nyquist plane. :func:`cic_deconvolve`
    divides it by :func:`cic_window`.

    Parameters
    ----------
    grid_shape : sequence of 3 int
    offset : {0.0, 0.5}

    Returns
    -------
    difference, spread : list of 3 np.ndarray
        float64 :math:`t_a` and :math:`c_a` on the bins of ``fftfreq(n0)``, ``fftfreq(n1)``,
        ``rfftfreq(n2)`` (1-D; broadcast them as ``[:, None, None]`` etc.).
    """
    if offset not in (0.0, 0.5):
        raise ValueError(f"offset must be 0 or 0.5, got {offset!r}")
    n0, n1, n2 = (int(n) for n in grid_shape)
    freqs = (np.fft.fftfreq(n0), np.fft.fftfreq(n1), np.fft.rfftfreq(n2))
    scale = 1.0 if offset else 2.0  # np.sinc(y) = sin(pi y) / (pi y), x = pi f
    difference = [np.where(np.abs(f) == 0.5, 0.0, np.sinc(scale * f)) for f in freqs]
    spread = [np.cos(np.pi * f) if offset else np.ones_like(f) for f in freqs]
    return difference, spread


def _window_factors(grid_shape: Sequence[int]) -> list[np.ndarray]:
    """Per-axis :math:`\\mathrm{sinc}^2(\\pi m / n)` on the rfft half-spectrum bins."""
    n0, n1, n2 = (int(n) for n in grid_shape)
    freqs = (np.fft.fftfreq(n0), np.fft.fftfreq(n1), np.fft.rfftfreq(n2))
    return [np.sinc(f) ** 2 for f in freqs]  # np.sinc(x) = sin(pi x) / (pi x)


def cic_window(grid_shape: Sequence[int]) -> np.ndarray:
    """The CIC window :math:`W(\\mathbf k) = \\prod_a \\mathrm{sinc}^2(k_a h_a / 2)`.

    Parameters
    ----------
    grid_shape : sequence of 3 int

    Returns
    -------
    np.ndarray
        float64 ``[n0, n1, n2 // 2 + 1]`` in the bin order of ``rfft3d``; 1 at ``k = 0``,
        :math:`(2/\\pi)^2` per axis on a Nyquist plane.
    """
    w0, w1, w2 = _window_factors(grid_shape)
    return w0[:, None, None] * w1[None, :, None] * w2[None, None, :]


def cic_deconvolve(field, *, return_modes: bool = False) -> tf.Tensor:
    """Divide a painted field's modes by the CIC window :math:`W(\\mathbf k)`.

    .. math:: \\tilde\\rho = \\mathrm{irfft}\\bigl(\\mathrm{rfft}(\\rho) / W\\bigr)

    One rfft3d and (unless ``return_modes``) one irfft3d forward, as many backward
    (TensorFlow's registered FFT gradients, :mod:`fieldhmc.ops.fft`; the division is
    real and diagonal). :math:`1/W \\le (\\pi/2)^6 \\approx 15` on a 3D grid, so
    the division is well conditioned. The window enters a compiled program as three 1-D
    arguments (no ``[n0, n1, m]`` constant).

    Parameters
    ----------
    field : tf.Tensor
        float32/float64 ``[batch, n0, n1, n2]``.
    return_modes : bool
        Return the deconvolved modes (complex ``[batch, n0, n1, n2 // 2 + 1]``) and skip
        the irfft3d, for a likelihood evaluated in Fourier space.

    Returns
    -------
    tf.Tensor
        ``[batch, n0, n1, n2]`` (dtype of ``field``), or its modes.
    """
    field = tf.convert_to_tensor(field)
    grid_shape = tuple(int(n) for n in field.shape[-3:])
    dtype = field.dtype
    # eager 1-D factors, captured as program arguments: as graph constants TF folds their
    # outer product into one [n0, n1, m] constant
    with tf.init_scope():
        w0, w1, w2 = (tf.constant(1.0 / w, dtype) for w in _window_factors(grid_shape))
    inverse = w0[:, None, None] * w1[None, :, None] * w2[None, None, :]
    modes = tf.signal.rfft3d(field, fft_length=grid_shape)
    modes = tf.complex(tf.math.real(modes) * inverse, tf.math.imag(modes) * inverse)
    if return_modes:
        return modes
    return tf.signal.irfft3d(modes, fft_length=grid_shape)
