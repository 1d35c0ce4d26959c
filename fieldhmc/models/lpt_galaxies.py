"""Galaxy overdensity from a linear field: 2LPT, redshift space, Lagrangian bias, CIC.

The composition of the building blocks (one module each):

1. :mod:`~fieldhmc.models.lpt` -- the tidal source :math:`\\delta_2` and the displacement
   :math:`D_1\\Psi_1 + D_2\\Psi_2` (1LPT with ``order=1``);
2. :mod:`~fieldhmc.models.rsd` -- with ``rsd``, per-axis growth
   :math:`D_n(1 + f_n[a = \\text{los}])`: the particles' redshift-space positions;
3. :mod:`~fieldhmc.models.lagrangian_bias` -- with ``bias="lagrangian"``, the weights
   :math:`w(\\mathbf q)` (else 1);
4. :mod:`~fieldhmc.models.cic` -- paint at the evolved positions, :math:`\\delta_g =
   \\rho_g - 1`, and with ``deconvolve`` divide its modes by the CIC window.

Cost from the modes (``from_modes``), transforms forward (as many backward): 2LPT + RSD
10 (6 + 1 + 3; 1LPT: 3), :math:`b_{\\nabla^2}` 1, deconvolution 2 (1 with
``return_modes``): **13 FFT pairs per gradient** for the full model with a real output,
12 with modes out (what the galaxy model's white-noise likelihood reads:
:class:`~fieldhmc.models.ForwardFieldModel`); plus one 8-corner scatter forward and its
gathers backward.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fieldhmc.models.cic import (
    _window_factors,
    cic_deconvolve,
    cic_paint_lattice,
    lattice_response_factors,
    shift_to_sites,
)
from fieldhmc.models.grid import Grid
from fieldhmc.models.lagrangian_bias import lagrangian_bias_weights
from fieldhmc.models.lpt import LagrangianPerturbation, LPTFields, as_real
from fieldhmc.models.rsd import line_of_sight, redshift_space_growth

__all__ = ["BIAS_KINDS", "LPTGalaxyForward"]

BIAS_KINDS = (None, "lagrangian")
_AXES = ((-1, 1, 1), (1, -1, 1), (1, 1, -1))  # a 1-D factor of axis a on the 3-D grid


class LPTGalaxyForward:
    """Linear modes -> galaxy overdensity (callable; see module).

    Parameters
    ----------
    grid : Grid
    order : {1, 2}
        LPT order.
    rsd : bool
        Move the particles into redshift space along ``los_axis``.
    los_axis : int
        Line-of-sight axis (default the last).
    bias : {None, "lagrangian"}
        ``None``: unit weights (the matter field).
    deconvolve : bool
        Divide the painted field's modes by the CIC window.
    lattice_offset : {0.0, 0.5}
        Where the particles start, in cells from the grid nodes along every axis
        (:func:`~fieldhmc.models.cic.cic_paint_lattice`). With 0.5 they start between the
        nodes, where the CIC kernel is smooth, and the linear field (displacement and
        bias weights) is evaluated there: the input modes are multiplied by the half-cell
        shift :math:`e^{i\\pi \\sum_a m_a / n_a}` (signed frequencies :math:`m_a`), which
        cancels the shift of the painted field at every mode off the Nyquist planes (on
        them the linear field at the sites is 0: :func:`~fieldhmc.models.cic.shift_to_sites`).
        With 0 (the nodes) the painted field has a kink at zero displacement: it is not
        differentiable there, and its response to a small field is not the Kaiser factor.

    Notes
    -----
    Parameters are keyword arguments of :meth:`from_modes` and :meth:`__call__`, each a
    Python float or a ``[chains]`` tensor (sampled): ``growth1`` (:math:`D_1`), and as the
    configuration needs ``growth2`` (:math:`D_2 \\approx -\\tfrac37 D_1^2`), ``rate1``,
    ``rate2`` (:math:`f_1, f_2`), ``b1``, ``b2``, ``bs2``, ``bnabla2``
    (:attr:`parameter_names`). The biases default to 0 when omitted (``bnabla2``: term
    skipped).
    """

    def __init__(
        self,
        grid: Grid,
        *,
        order: int = 2,
        rsd: bool = True,
        los_axis: int = -1,
        bias: str | None = "lagrangian",
        deconvolve: bool = True,
        lattice_offset: float = 0.0,
    ):
        if lattice_offset not in (0.0, 0.5):
            raise ValueError(f"lattice_offset must be 0 or 0.5, got {lattice_offset!r}")
        if order not in (1, 2):
            raise ValueError(f"order must be 1 or 2, got {order!r}")
        if bias not in BIAS_KINDS:
            raise ValueError(f"bias must be one of {BIAS_KINDS}, got {bias!r}")
        self.lpt = LagrangianPerturbation(grid)
        self.grid = grid
        self.order = order
        self.rsd = bool(rsd)
        self.los_axis = line_of_sight(los_axis)
        self.bias = bias
        self.deconvolve = bool(deconvolve)
        self.lattice_offset = float(lattice_offset)

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """Names of the keyword parameters this configuration reads."""
        names = ["growth1"] + (["growth2"] if self.order == 2 else [])
        if self.rsd:
            names += ["rate1"] + (["rate2"] if self.order == 2 else [])
        if self.bias == "lagrangian":
            names += ["b1", "b2", "bs2", "bnabla2"]
        return tuple(names)

    def __repr__(self) -> str:
        return (
            f"LPTGalaxyForward(grid={self.grid}, order={self.order}, rsd={self.rsd}, "
            f"los_axis={self.los_axis}, bias={self.bias!r}, deconvolve={self.deconvolve}, "
            f"lattice_offset={self.lattice_offset})"
        )

    def linear_response(
        self, *, growth1, rate1=None, b1=0.0, bnabla2=None, dtype=tf.float64, **_
    ) -> tf.Tensor:
        """The linear response of :meth:`from_modes` per mode, for a linear surrogate.

        .. math:: R_k = D_1 \\Bigl[\\sum_a \\bigl(1 + f_1 [a = \\mathrm{los}]\\bigr)
            \\frac{k_a^2}{k^2}\\, t_a \\prod_{b \\ne a} c_b
            + (b_1 - b_{\\nabla^2} k^2) \\prod_b c_b\\Bigr] \\Big/ W_k

        with the lattice's per-axis factors :math:`t_a, c_b`
        (:func:`~fieldhmc.models.cic.lattice_response_factors`) and :math:`W_k` the CIC
        window with ``deconvolve`` (else 1); :math:`f_1 = 0` without RSD, no bias term
        without bias. 2LPT and the :math:`b_2, b_{s^2}` weights are second order. With
        ``lattice_offset=0.5`` it is the exact small-field response, mode by mode (with 0,
        that of the part odd in the field). At low :math:`k` it tends to the Kaiser factor
        :math:`D_1 (1 + b_1 + f_1 \\mu^2)` (:func:`~fieldhmc.models.rsd.kaiser_factor`),
        which beyond half the Nyquist frequency is far from it (above it along the axes,
        below it on the diagonals with ``deconvolve``), see ``benchmarks/README.md``.

        Parameters
        ----------
        growth1, rate1, b1, bnabla2 : float or tf.Tensor
            :math:`D_1, f_1, b_1, b_{\\nabla^2}` (floats or ``[chains]``; ``bnabla2``
            ``None``: no term). Other parameters are accepted and ignored, so the keyword
            set of :meth:`from_modes` can be passed as is.
        dtype : tf.DType

        Returns
        -------
        tf.Tensor
            ``[chains or 1, n0, n1, n2 // 2 + 1]``.
        """
        shape = self.grid.grid_shape
        t, c = lattice_response_factors(shape, self.lattice_offset)
        w = _window_factors(shape) if self.deconvolve else [np.ones_like(f) for f in c]
        # eager 1-D factors, captured as arguments of a compiled program (as kaiser_factor)
        with tf.init_scope():
            k2, t, c, inv_w = (
                [tf.constant(np.reshape(f, s), dtype) for f, s in zip(fs, _AXES, strict=True)]
                for fs in (
                    [np.asarray(ka, np.float64).reshape(-1) ** 2 for ka in self.grid.kvec()],
                    t,
                    c,
                    [1.0 / f for f in w],
                )
            )
        total = k2[0] + k2[1] + k2[2]
        nonzero = total > 0
        inv_k2 = tf.where(nonzero, 1.0 / tf.where(nonzero, total, tf.ones([], dtype)), 0.0)
        # c[a - 1] * c[a - 2]: the two other axes
        term = [k2[a] * inv_k2 * t[a] * c[a - 1] * c[a - 2] for a in range(3)]
        window = inv_w[0] * inv_w[1] * inv_w[2]

        def chains(value):
            return tf.reshape(as_real(value, dtype), [-1, 1, 1, 1])

        response = term[0] + term[1] + term[2]
        if self.rsd:
            response = response + chains(rate1) * term[self.los_axis]
        if self.bias == "lagrangian":
            local = chains(b1)
            if bnabla2 is not None:
                local = local - chains(bnabla2) * total
            response = response + local * (c[0] * c[1] * c[2])
        return chains(growth1) * response * window

    def from_modes(
        self,
        modes,
        *,
        growth1,
        growth2=None,
        rate1=None,
        rate2=None,
        b1=0.0,
        b2=0.0,
        bs2=0.0,
        bnabla2=None,
        return_modes: bool = False,
    ) -> tf.Tensor:
        """Galaxy overdensity from ``modes = rfft3d(delta)``.

        Parameters
        ----------
        modes : tf.Tensor
            complex ``[chains, n0, n1, n2 // 2 + 1]``.
        growth1, growth2, rate1, rate2, b1, b2, bs2, bnabla2 : float or tf.Tensor
            See the class notes.
        return_modes : bool
            With ``deconvolve``, return the deconvolved modes (one irfft3d fewer).

        Returns
        -------
        tf.Tensor
            real ``[chains, n0, n1, n2]`` (or complex modes), the real dtype of ``modes``.
        """
        modes = tf.convert_to_tensor(modes)
        if self.lattice_offset:
            modes = shift_to_sites(modes, self.grid.grid_shape, self.lattice_offset)
        if self.order == 2 and growth2 is None:
            raise ValueError("order 2 needs growth2")
        if self.rsd and (rate1 is None or (self.order == 2 and rate2 is None)):
            raise ValueError("rsd needs rate1 (and rate2 for order 2)")
        if self.order == 1 and self.bias is None:  # the displacement needs the modes only
            fields = LPTFields(modes, None, None, None)
        else:
            fields = self.lpt.fields_from_modes(modes)
        dtype = modes.dtype.real_dtype
        g2 = growth2 if self.order == 2 else None
        if self.rsd:
            g1, g2 = redshift_space_growth(growth1, g2, rate1, rate2, self.los_axis, dtype)
        else:
            g1 = growth1
        disp = self.lpt.displacement(fields, g1, g2)
        weights = None
        if self.bias == "lagrangian":
            weights = lagrangian_bias_weights(self.lpt, fields, growth1, b1, b2, bs2, bnabla2)
        galaxies = cic_paint_lattice(disp, weights, self.lattice_offset) - 1.0
        if self.deconvolve:
            return cic_deconvolve(galaxies, return_modes=return_modes)
        return tf.signal.rfft3d(galaxies, self.grid.grid_shape) if return_modes else galaxies

    def __call__(self, delta, **params) -> tf.Tensor:
        """:meth:`from_modes` of ``rfft3d(delta)`` (``delta`` real ``[chains, n0, n1, n2]``)."""
        delta = tf.convert_to_tensor(delta)
        return self.from_modes(tf.signal.rfft3d(delta, self.grid.grid_shape), **params)
