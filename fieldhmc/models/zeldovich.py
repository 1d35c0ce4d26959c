"""A differentiable Zel'dovich (1LPT) + cloud-in-cell forward model.

The initial overdensity :math:`\\delta` (linear, at the prior's normalisation)
displaces one particle per cell from its site :math:`q` by the first-order
Lagrangian displacement

.. math::

    \\Psi(\\mathbf k) = D\\, \\frac{i \\mathbf k}{k^2}\\, \\delta(\\mathbf k),
    \\qquad \\nabla_q \\cdot \\Psi = -D\\, \\delta, \\qquad x = q + \\Psi(q),

with growth factor :math:`D` (``growth``); particles of unit mass are painted with
periodic cloud-in-cell (:func:`~fieldhmc.models.cic.cic_paint`) and the evolved
overdensity is :math:`\\delta_e = \\rho / \\bar\\rho - 1` (:math:`\\bar\\rho = 1`
particle per cell), optionally smoothed with a Gaussian of radius :math:`R`,
:math:`\\delta_e(\\mathbf k) \\to e^{-k^2 R^2/2}\\, \\delta_e(\\mathbf k)`.
The prediction is the tracer overdensity with a linear Eulerian bias :math:`b`
(``bias``, default 1): :math:`\\mu = b\\, \\delta_e`.

**Sampled growth and bias.** ``forward(delta, growth=D, bias=b)`` (and
``from_modes``) take :math:`D` and :math:`b` per chain as tensors ``[chains]`` (the
fixed constructor values are the default), so a
:class:`~fieldhmc.models.ForwardFieldModel` can sample them. At linear order the
prediction is :math:`b D\\, \\delta`: the data constrain the product :math:`bD`;
only the Zel'dovich (second and higher order in :math:`D\\delta`) terms tell them
apart, weakly unless the field is nonlinear.

The derivative :math:`i k_a` of an even-sized axis is set to 0 on its Nyquist
frequency (the mode is its own Hermitian partner there, so an odd operator would
not map real fields to real fields); :math:`\\Psi(\\mathbf 0) = 0`.

**Sites half a cell off the nodes** (``lattice_offset=0.5``, the default): the sites
are :math:`q = \\mathbf n + o` (:math:`\\mathbf n` the grid nodes, :math:`o = 1/2` cell
along every axis) and :math:`\\Psi` is evaluated there (the modes times the half-cell
phase, :func:`~fieldhmc.models.cic.shift_to_sites`; no extra transform), as in
:class:`~fieldhmc.models.LPTGalaxyForward`. On the nodes (``lattice_offset=0``) the CIC
kernel has its kink at zero displacement: the painted field is only piecewise linear in
:math:`\\delta` (:math:`\\|F(\\epsilon\\delta) + F(-\\epsilon\\delta)\\| \\approx 0.6\\,
\\|F(\\epsilon\\delta) - F(-\\epsilon\\delta)\\|` at any small :math:`\\epsilon`, 8³), so the log
density's gradient jumps wherever a displacement component changes sign (by its own size
between latents :math:`\\pm\\epsilon v`; from between the nodes by :math:`O(\\epsilon)`).

The linear response (``linear_gain``, used only by the ``posterior`` preconditioner):
from sites between the nodes a small displacement moves weight between the two nodes on
either side, a difference over one cell centred on the site (:math:`2\\sin(k_a h_a/2) /
h_a`), and the other axes split the particle evenly over their two nodes
(:math:`\\cos(k_b h_b / 2)`), so the response is exactly linear and diagonal,

.. math::

    g_k = b\\, D\\, e^{-k^2R^2/2}\\, \\frac{1}{k^2} \\sum_a k_a
    \\frac{2 \\sin(k_a h_a / 2)}{h_a} \\prod_{b \\ne a} \\cos\\frac{k_b h_b}{2};

from the nodes painting differentiates :math:`\\Psi` by a one-sided difference whose side
follows the sign of the displacement, the centred difference on average,
:math:`g_k = b D e^{-k^2R^2/2} k^{-2} \\sum_a k_a \\sin(k_a h_a) / h_a`. Both
:math:`\\to bD` at low :math:`k` and are 0 on the Nyquist planes (:math:`h_a` the cell size).

Cost per value and gradient: from :math:`\\delta`, 1 rfft3d + 3 irfft3d forward
(the three components are one batched transform) and 3 rfft3d + 1 irfft3d backward
(the registered adjoint of :meth:`ZeldovichForward.displacement`); from the modes
(:meth:`ZeldovichForward.from_modes`, which :class:`~fieldhmc.models.ForwardFieldModel`
calls, so the prior's irfft3d and this rfft3d are skipped) 3 irfft3d forward and 3
rfft3d backward. Then one 8-corner scatter forward and 8 gathers backward
(:mod:`fieldhmc.models.cic`); smoothing adds one rfft3d + irfft3d pair each way.

References
----------
1. Zel'dovich (1970), "Gravitational instability: an approximate theory for large
   density perturbations", A&A 5, 84.
2. Jasche & Wandelt (2013), "Bayesian physical reconstruction of initial conditions
   from large-scale structure surveys", arXiv:1203.3639.
3. Modi, Lanusse & Seljak (2021), "FlowPM", arXiv:2010.11847.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from fieldhmc.models.cic import cic_paint_lattice, lattice_response_factors, shift_to_sites
from fieldhmc.models.grid import Grid

__all__ = ["ZeldovichForward"]


class ZeldovichForward:
    """1LPT displacement of a particle grid, painted by periodic CIC (callable).

    Parameters
    ----------
    grid : Grid
        The box (wavenumbers in h/Mpc, cells of ``box_size / grid_shape`` Mpc/h).
    growth : float
        Linear growth factor :math:`D` multiplying the displacement (dimensionless;
        ``0`` gives :math:`\\delta_e = 0`).
    smoothing : float, optional
        Gaussian smoothing radius :math:`R` in Mpc/h of the evolved density; ``None`` or
        0: none.
    bias : float
        Linear Eulerian bias :math:`b` of the prediction :math:`b\\,\\delta_e`
        (dimensionless, default 1).
    lattice_offset : {0.5, 0.0}
        The particles' sites, in cells from the grid nodes along every axis (see the
        module): 0.5 (default) between the nodes, where the forward model is smooth in
        small displacements; 0 on the nodes, where it has the CIC kink.

    Notes
    -----
    ``forward(delta)`` takes ``[chains, n0, n1, n2]`` float32/float64 and returns the
    evolved overdensity of the same shape and dtype; ``forward.from_modes(modes)`` the
    same from ``modes = tf.signal.rfft3d(delta)`` (the optional modes hook of a forward
    model, see :mod:`fieldhmc.models.forward`). The wavenumbers are six 1-D
    tensors made eagerly here, so a compiled caller captures them as arguments and
    the multipliers :math:`D k_a / (k^2 h_a)` and :math:`e^{-k^2R^2/2}` are computed
    inside the program; as graph constants they were folded into one complex
    ``[3, n0, n1, n2 // 2 + 1]`` constant (25 MB at 128³, about a second of compile
    time there).
    """

    def __init__(
        self,
        grid: Grid,
        growth: float = 1.0,
        smoothing: float | None = None,
        bias: float = 1.0,
        lattice_offset: float = 0.5,
    ):
        if lattice_offset not in (0.0, 0.5):
            raise ValueError(f"lattice_offset must be 0 or 0.5, got {lattice_offset!r}")
        if not isinstance(grid, Grid):
            raise ValueError(f"grid must be a fieldhmc.models.Grid, got {type(grid).__name__}")
        growth = float(growth)
        if not math.isfinite(growth):
            raise ValueError(f"growth must be finite, got {growth}")
        bias = float(bias)
        if not math.isfinite(bias):
            raise ValueError(f"bias must be finite, got {bias}")
        smoothing = 0.0 if smoothing is None else float(smoothing)
        if not (math.isfinite(smoothing) and smoothing >= 0):
            raise ValueError(f"smoothing must be >= 0 and finite (Mpc/h), got {smoothing}")
        self.grid = grid
        self.growth = growth
        self.bias = bias
        self.smoothing = smoothing
        self.lattice_offset = float(lattice_offset)
        self._cell = tuple(ell / n for ell, n in zip(grid.box_size, grid.grid_shape, strict=True))
        k = [np.asarray(ka, np.float64).reshape(-1) for ka in grid.kvec()]
        # derivative wavenumbers: 0 on the Nyquist frequency of even axes (-Nyquist of
        # fftfreq or the last rfft bin), in cell units and times D
        unit_slopes = []
        for ka, n, h in zip(k, grid.grid_shape, self._cell, strict=True):
            kd = ka.copy()
            if n % 2 == 0:
                kd[n // 2] = 0.0
            unit_slopes.append(kd / h)
        slopes = [growth * sa for sa in unit_slopes]
        with tf.init_scope():  # eager tensors even if built inside a tf.function
            # [k^2 per axis, D k_a / h_a, k_a / h_a (growth given per call)]
            self._waves = {
                dtype: (
                    tuple(tf.constant(ka**2, dtype) for ka in k),
                    tuple(tf.constant(sa, dtype) for sa in slopes),
                    tuple(tf.constant(sa, dtype) for sa in unit_slopes),
                )
                for dtype in (tf.float32, tf.float64)
            }
        self._unit_gain = self._unbiased_gain(1.0)
        self.linear_gain = self.bias * self._unbiased_gain(self.growth)

    def _unbiased_gain(self, growth: float) -> np.ndarray:
        """float64 ``[n0, n1, n2 // 2 + 1]``: the linear response at bias 1 (module;
        :func:`~fieldhmc.models.cic.lattice_response_factors`)."""
        k = self.grid.kvec()
        k2 = sum(ka**2 for ka in k)
        shapes = [(-1, 1, 1), (1, -1, 1), (1, 1, -1)]
        t, c = (
            [f.reshape(s) for f, s in zip(factors, shapes, strict=True)]
            for factors in lattice_response_factors(self.grid.grid_shape, self.lattice_offset)
        )
        # c[a - 1] * c[a - 2]: the two other axes
        response = sum(k[a] ** 2 * t[a] * c[a - 1] * c[a - 2] for a in range(3))
        gain = growth * np.where(k2 > 0, response / np.where(k2 > 0, k2, 1.0), 0.0)
        return gain * np.exp(-0.5 * self.smoothing**2 * k2)

    def linear_gain_fn(self, growth=None, bias=None, **_) -> tf.Tensor:
        """The linear response :math:`g_k` (``linear_gain``) at per-chain ``growth`` and
        ``bias`` (``[batch]`` tensors or floats; ``None``: the fixed values).

        Returns
        -------
        tf.Tensor
            float64 ``[*batch, n0, n1, n2 // 2 + 1]`` (``[n0, n1, n2 // 2 + 1]`` without
            per-chain values): :math:`b D` times the fixed shape of ``linear_gain``.
        """
        factor = tf.ones([], tf.float64)
        for value, fixed in ((growth, self.growth), (bias, self.bias)):
            value = fixed if value is None else value
            # a Python float as a float64 constant: tf.cast would round it through float32
            value = (
                tf.cast(value, tf.float64)
                if tf.is_tensor(value)
                else tf.constant(value, tf.float64)
            )
            factor = factor * value
        factor = tf.reshape(factor, tf.concat([tf.shape(factor), [1, 1, 1]], 0))
        return factor * tf.constant(self._unit_gain, tf.float64)

    def __repr__(self) -> str:
        return (
            f"ZeldovichForward(grid={self.grid}, growth={self.growth}, bias={self.bias}, "
            f"smoothing={self.smoothing}, lattice_offset={self.lattice_offset})"
        )

    def _k2(self, dtype) -> tf.Tensor:
        """Squared wavenumber ``[n0, n1, n2 // 2 + 1]`` (h/Mpc)^2, built in the program."""
        s0, s1, s2 = self._waves[dtype][0]
        return s0[:, None, None] + s1[None, :, None] + s2[None, None, :]

    def _multipliers(self, dtype, unit: bool = False) -> tf.Tensor:
        """:math:`S_a = D k_a / (k^2 h_a)`, real ``[3, n0, n1, n2 // 2 + 1]``, so that
        :math:`\\Psi_a(\\mathbf k) = i S_a \\delta(\\mathbf k)` in cells (``unit``:
        without the factor :math:`D`)."""
        k2 = self._k2(dtype)
        inv_k2 = tf.where(k2 > 0, 1.0 / tf.where(k2 > 0, k2, tf.ones([], dtype)), 0.0)
        g0, g1, g2 = self._waves[dtype][2 if unit else 1]
        return tf.stack(
            [
                g0[:, None, None] * inv_k2,
                g1[None, :, None] * inv_k2,
                g2[None, None, :] * inv_k2,
            ],
            axis=0,
        )

    def _to_sites(self, modes: tf.Tensor, sign: int = 1) -> tf.Tensor:
        """``modes`` at the particles' sites (:func:`~fieldhmc.models.cic.shift_to_sites`;
        ``sign=-1``: its adjoint, the conjugate phase); the identity on the nodes."""
        if not self.lattice_offset:
            return modes
        return shift_to_sites(modes, self.grid.grid_shape, sign * self.lattice_offset)

    def displacement(self, delta: tf.Tensor, growth=None) -> tf.Tensor:
        """The 1LPT displacement :math:`D\\,\\Psi` at the particles' sites, in **cell units**.

        .. math:: \\Psi_a = \\mathrm{irfft}\\bigl(i S_a P\\, \\mathrm{rfft}(\\delta)\\bigr),
            \\qquad
            \\bar\\delta = \\mathrm{irfft}\\Bigl(\\bar P \\sum_a (-i S_a)\\,
            \\mathrm{rfft}(\\bar\\Psi_a)\\Bigr)

        (:math:`P` the phase to the sites, 1 on the nodes; backward norm; the gradient is
        the exact adjoint, registered with :func:`tf.custom_gradient`: one batched rfft3d
        of the three components and one irfft3d. The sum is Hermitian on the self-paired
        planes, so no projection is needed for a GPU c2r either.)

        Parameters
        ----------
        delta : tf.Tensor
            ``[chains, n0, n1, n2]``.
        growth : tf.Tensor, optional
            :math:`D` per chain, ``[chains]`` (default: the fixed ``growth``).

        Returns
        -------
        tf.Tensor
            ``[chains, 3, n0, n1, n2]``, dtype of ``delta``.
        """
        delta = tf.convert_to_tensor(delta)
        shape = self.grid.grid_shape
        mult = self._multipliers(delta.dtype, unit=growth is not None)

        @tf.custom_gradient
        def psi(d):
            modes = self._to_sites(tf.signal.rfft3d(d, fft_length=shape))[:, None]
            re, im = tf.math.real(modes), tf.math.imag(modes)  # [B, 1, n0, n1, m]
            disp = tf.signal.irfft3d(tf.complex(-im * mult, re * mult), fft_length=shape)

            def grad(upstream):
                g = tf.signal.rfft3d(upstream, fft_length=shape)  # [B, 3, n0, n1, m]
                re_g = tf.reduce_sum(tf.math.imag(g) * mult, axis=1)
                im_g = -tf.reduce_sum(tf.math.real(g) * mult, axis=1)
                back = self._to_sites(tf.complex(re_g, im_g), -1)
                return tf.signal.irfft3d(back, fft_length=shape)

            return disp, grad

        return self._times_growth(psi(delta), growth)

    @staticmethod
    def _times_growth(disp: tf.Tensor, growth) -> tf.Tensor:
        """``disp`` ``[chains, 3, n0, n1, n2]`` times a per-chain ``growth`` (if given)."""
        if growth is None:
            return disp
        growth = tf.cast(growth, disp.dtype)
        return disp * tf.reshape(growth, [-1, 1, 1, 1, 1])

    def displacement_from_modes(self, modes: tf.Tensor, growth=None) -> tf.Tensor:
        """:meth:`displacement` from ``modes = tf.signal.rfft3d(delta)``.

        .. math:: \\Psi_a = \\mathrm{irfft}\\bigl(i S_a P\\, \\delta_k\\bigr), \\qquad
            \\bar\\delta_k = \\frac{w_k}{N} \\bar P \\sum_a (-i S_a)\\,
            \\mathrm{rfft}(\\bar\\Psi_a)

        (one batched irfft3d forward, one batched rfft3d backward; the gradient is
        TensorFlow's convention for complex inputs, as the registered ``IRFFT3D``
        gradient of :mod:`fieldhmc.ops.fft`, with Hermitian weights :math:`w_k`).

        Parameters
        ----------
        modes : tf.Tensor
            complex64/complex128 ``[chains, n0, n1, n2 // 2 + 1]``, Hermitian on the
            self-paired planes (as any ``rfft3d`` of a real field).
        growth : tf.Tensor, optional
            :math:`D` per chain, ``[chains]`` (default: the fixed ``growth``).

        Returns
        -------
        tf.Tensor
            ``[chains, 3, n0, n1, n2]`` in cells, the real dtype of ``modes``.
        """
        modes = tf.convert_to_tensor(modes)
        shape = self.grid.grid_shape
        dtype = modes.dtype.real_dtype
        mult = self._multipliers(dtype, unit=growth is not None)
        n2 = shape[2]
        weight = np.full(n2 // 2 + 1, 2.0 / math.prod(shape))
        weight[0] /= 2.0
        if n2 % 2 == 0:
            weight[-1] /= 2.0
        adjoint = mult * tf.constant(weight, dtype)

        @tf.custom_gradient
        def psi(z):
            z = self._to_sites(z)[:, None]  # [B, 1, n0, n1, m]
            re, im = tf.math.real(z), tf.math.imag(z)
            disp = tf.signal.irfft3d(tf.complex(-im * mult, re * mult), fft_length=shape)

            def grad(upstream):
                g = tf.signal.rfft3d(upstream, fft_length=shape)  # [B, 3, n0, n1, m]
                re_g = tf.reduce_sum(tf.math.imag(g) * adjoint, axis=1)
                im_g = -tf.reduce_sum(tf.math.real(g) * adjoint, axis=1)
                return self._to_sites(tf.complex(re_g, im_g), -1)

            return disp, grad

        return self._times_growth(psi(modes), growth)

    def from_modes(self, modes, growth=None, bias=None) -> tf.Tensor:
        """Biased evolved overdensity from ``modes = tf.signal.rfft3d(delta)``:
        ``self(delta, growth, bias)`` without the rfft3d (``[chains, n0, n1, n2 // 2 + 1]``
        complex in, ``[chains, n0, n1, n2]`` real out)."""
        return self._evolve(self.displacement_from_modes(modes, growth), bias)

    def _smooth(self, field: tf.Tensor) -> tf.Tensor:
        """:math:`e^{-k^2R^2/2}` applied to ``[chains, n0, n1, n2]``; self-adjoint, so its
        gradient is itself (one rfft3d + irfft3d pair each way)."""
        shape = self.grid.grid_shape
        kernel = tf.exp(-0.5 * self.smoothing**2 * self._k2(field.dtype))

        def apply(x):
            modes = tf.signal.rfft3d(x, fft_length=shape)
            modes = tf.complex(tf.math.real(modes) * kernel, tf.math.imag(modes) * kernel)
            return tf.signal.irfft3d(modes, fft_length=shape)

        @tf.custom_gradient
        def smooth(x):
            return apply(x), apply

        return smooth(field)

    def _evolve(self, disp: tf.Tensor, bias=None) -> tf.Tensor:
        """Paint the lattice displaced by ``disp`` ``[B, 3, n0, n1, n2]``, minus 1, smoothed,
        times the bias (``[B]``, or the fixed one)."""
        dtype = disp.dtype
        evolved = cic_paint_lattice(disp, None, self.lattice_offset) - 1.0
        if self.smoothing > 0:
            evolved = self._smooth(evolved)
        if bias is not None:
            return evolved * tf.reshape(tf.cast(bias, dtype), [-1, 1, 1, 1])
        if self.bias != 1.0:
            return evolved * tf.constant(self.bias, dtype)
        return evolved

    def __call__(self, delta, growth=None, bias=None) -> tf.Tensor:
        """Biased evolved overdensity :math:`b\\,\\delta_e` ``[chains, n0, n1, n2]`` (dtype
        of ``delta``); ``growth`` and ``bias`` per chain (``[chains]`` tensors) or ``None``
        for the fixed values."""
        return self._evolve(self.displacement(tf.convert_to_tensor(delta), growth), bias)
