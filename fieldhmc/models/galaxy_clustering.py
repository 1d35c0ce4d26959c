"""The galaxy-clustering forward model: growth at a_obs from Omega_m, then 2LPT + RSD + bias + CIC.

:class:`GalaxyClusteringForward` is the forward model of the field-level benchmark [1]_
(``model.forward: {kind: lpt}``): the linear field today (the prior of
:class:`~fieldhmc.models.cosmology.CosmologicalPower`, :math:`\\sigma_8` of today) is
evolved to :math:`a_\\mathrm{obs}` by :class:`~fieldhmc.models.LPTGalaxyForward` with
the growth factors and rates of flat :math:`\\Lambda`CDM,

.. math::

    D_1, D_2, f_1, f_2 = \\mathrm{growth}(\\Omega_m, a_\\mathrm{obs}),
    \\qquad D_1(1) = 1,\\ D_2 \\simeq -\\tfrac37 D_1^2

(:func:`~fieldhmc.models.cosmology.growth_factors`, ``normalization="today"``). When
:math:`\\Omega_m` is a sampled parameter of the prior's power spectrum, the model passes
it (``Omega_m``, ``[chains]``; :attr:`power_parameter_names`) and the four functions are
read from a table made here: :func:`growth_factors` on :data:`NUM_GROWTH_NODES` equally
spaced :math:`\\Omega_m \\in [\\Omega_b, 1]`, with their derivatives (central
differences of the same integration, step :math:`10^{-6}`), interpolated by cubic Hermite
polynomials (:math:`C^1`; relative error below :math:`10^{-8}`, tested, under the
integration's own :math:`2\\times10^{-8}`). Integrating per
chain inside the density instead (an RK4 ``tf.while_loop``) made XLA compile the value and
gradient in 70 s instead of 8 s at 8³ (a loaded machine), for no gain in accuracy.
Otherwise the growth is computed once, here.

The biases ``b1, b2, bs2, bnabla2`` (Lagrangian; the Eulerian linear bias is
:math:`1 + b_1`) are fixed constructor values or per-chain keywords. The linear response
for the conditional parametrisation (:meth:`linear_gain_fn`, per mode, anisotropic) is the
exact small-field response of the lattice model,
:meth:`~fieldhmc.models.LPTGalaxyForward.linear_response`: at low :math:`k` the Kaiser factor

.. math:: R_k = D_1(a_\\mathrm{obs})\\,(1 + b_1 + f_1 \\mu_k^2)

(:math:`f_1 = 0` without RSD, :math:`b_1 = 0` without bias), which was the surrogate
before and is far from the model's response beyond half the Nyquist frequency
(``benchmarks/README.md``).

Outside :math:`\\Omega_b < \\Omega_m \\le 1` the growth is evaluated at the clipped value
(finite value and gradient); the model's density is :math:`-\\infty` there (the power
spectrum's :meth:`~fieldhmc.models.cosmology.CosmologicalPower.in_support`).

References
----------
.. [1] Simon-Onfroy, Lanusse & de Mattia (2025), "Benchmarking field-level cosmological
   inference from galaxy redshift surveys", arXiv:2504.20130.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fieldhmc.models.cosmology import (
    PLANCK18,
    FixedCosmology,
    check_cosmology,
    clip_to_support,
    growth_factors,
)
from fieldhmc.models.cosmology.growth import DEFAULT_NUM_STEPS
from fieldhmc.models.grid import Grid
from fieldhmc.models.lpt_galaxies import LPTGalaxyForward

__all__ = ["BIAS_PARAMETER_NAMES", "GalaxyClusteringForward"]

#: The Lagrangian bias parameters, in sampling order.
BIAS_PARAMETER_NAMES: tuple[str, ...] = ("b1", "b2", "bs2", "bnabla2")
#: Nodes of the growth table in Omega_m (equally spaced over [Omega_b, 1]).
NUM_GROWTH_NODES = 513
_GROWTH_KEYS = ("growth1", "growth2", "rate1", "rate2")


class GalaxyClusteringForward:
    """Linear field today -> galaxy overdensity at :math:`a_\\mathrm{obs}` (callable).

    Parameters
    ----------
    grid : Grid
    a_obs : float
        Scale factor of the observation, :math:`0 < a \\le 1`.
    omega_m : float
        :math:`\\Omega_m` of the growth when it is not passed per call (fixed, or the
        fiducial value of a sampled one).
    fixed : FixedCosmology
        :math:`\\Omega_b` (the lower bound of :math:`\\Omega_m`).
    order, rsd, los_axis, bias, deconvolve, lattice_offset
        As :class:`~fieldhmc.models.LPTGalaxyForward`; the particles start half a cell
        from the nodes (``lattice_offset=0.5``), so that the target is differentiable at
        small displacements (on the nodes a chain's gradient jumps wherever a particle's
        displacement changes sign; see ``benchmarks/README.md``).
    b1, b2, bs2, bnabla2 : float
        Fixed Lagrangian biases (``bias="lagrangian"``; :math:`b_{\\nabla^2}` in
        (Mpc/h)²; 0 skips its term and its transform).
    num_growth_steps : int
        RK4 steps of the growth integration.

    Raises
    ------
    ValueError
        :math:`a_\\mathrm{obs}` or :math:`\\Omega_m` outside the physical domain, or a bad
        LPT configuration.
    """

    #: Parameters of the prior's power spectrum this model reads when they are sampled.
    power_parameter_names: tuple[str, ...] = ("Omega_m",)

    def __init__(
        self,
        grid: Grid,
        *,
        a_obs: float = 0.5,
        omega_m: float = 0.3111,
        fixed: FixedCosmology = PLANCK18,
        order: int = 2,
        rsd: bool = True,
        los_axis: int = -1,
        bias: str | None = "lagrangian",
        deconvolve: bool = True,
        lattice_offset: float = 0.5,
        b1: float = 0.0,
        b2: float = 0.0,
        bs2: float = 0.0,
        bnabla2: float = 0.0,
        num_growth_steps: int = DEFAULT_NUM_STEPS,
    ):
        check_cosmology(omega_m, None, a_obs, fixed.omega_b)
        self.lpt = LPTGalaxyForward(
            grid,
            order=order,
            rsd=rsd,
            los_axis=los_axis,
            bias=bias,
            deconvolve=deconvolve,
            lattice_offset=lattice_offset,
        )
        self.grid = grid
        self.a_obs = float(a_obs)
        self.omega_m = float(omega_m)
        self.fixed = fixed
        self.num_growth_steps = int(num_growth_steps)
        self.biases = {}
        if bias == "lagrangian":
            for name, value in zip(BIAS_PARAMETER_NAMES, (b1, b2, bs2, bnabla2), strict=True):
                value = float(value)
                if not np.isfinite(value):
                    raise ValueError(f"{name} must be finite, got {value}")
                self.biases[name] = value
        with tf.init_scope():  # eager, even if built inside a tf.function
            self._table = self._growth_table()
            g = growth_factors(self.omega_m, self.a_obs, "today", self.num_growth_steps)
            self._fixed_growth = {
                "growth1": float(g.d1),
                "growth2": float(g.d2),
                "rate1": float(g.f1),
                "rate2": float(g.f2),
            }
            self.linear_gain = self.linear_gain_fn().numpy().reshape(grid.modes_shape)

    @property
    def power_parameters(self) -> dict[str, float]:
        """The fixed values of :attr:`power_parameter_names` (must be the prior's)."""
        return {"Omega_m": self.omega_m}

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """The keyword parameters besides ``Omega_m``: the biases of this configuration."""
        return tuple(self.biases)

    def _growth_table(self) -> dict[str, tf.Tensor]:
        """Values and derivatives of D1, D2, f1, f2 on the Omega_m nodes (float64, eager)."""
        lo, hi = self.fixed.omega_b, 1.0
        nodes = np.linspace(lo, hi, NUM_GROWTH_NODES)
        eps = 1e-6
        # central differences inside, one-sided at the ends (Omega_m <= 1)
        x = np.concatenate([nodes, np.minimum(nodes + eps, hi), np.maximum(nodes - eps, lo)])
        g = growth_factors(tf.constant(x, tf.float64), self.a_obs, "today", self.num_growth_steps)
        n = NUM_GROWTH_NODES
        width = x[n : 2 * n] - x[2 * n :]
        table = {"step": tf.constant((hi - lo) / (n - 1), tf.float64)}
        for key, values in zip(_GROWTH_KEYS, (g.d1, g.d2, g.f1, g.f2), strict=True):
            v = values.numpy()
            table[key] = tf.constant(v[:n], tf.float64)
            table[key + "_slope"] = tf.constant((v[n : 2 * n] - v[2 * n :]) / width, tf.float64)
        return table

    def growth(self, Omega_m=None) -> dict:  # noqa: N803
        """``growth1, growth2, rate1, rate2`` at :math:`a_\\mathrm{obs}`: Python floats for
        the fixed :math:`\\Omega_m`, float64 tensors ``[chains]`` (the cubic Hermite
        interpolant of the table, module docstring) for a tensor one."""
        if Omega_m is None:
            return dict(self._fixed_growth)
        omega_m, _, _ = clip_to_support(
            tf.cast(Omega_m, tf.float64), None, None, self.fixed.omega_b
        )
        t = self._table
        h = t["step"]
        u = (omega_m - tf.constant(self.fixed.omega_b, tf.float64)) / h
        i = tf.clip_by_value(tf.floor(tf.stop_gradient(u)), 0.0, NUM_GROWTH_NODES - 2.0)
        s = u - i  # in [0, 1] inside the table
        i = tf.cast(i, tf.int32)
        s2, s3 = s * s, s * s * s
        h00, h10 = 2.0 * s3 - 3.0 * s2 + 1.0, s3 - 2.0 * s2 + s
        h01, h11 = -2.0 * s3 + 3.0 * s2, s3 - s2
        out = {}
        for key in _GROWTH_KEYS:
            y, m = t[key], t[key + "_slope"]
            y0, y1 = tf.gather(y, i), tf.gather(y, i + 1)
            m0, m1 = tf.gather(m, i), tf.gather(m, i + 1)
            out[key] = h00 * y0 + h10 * h * m0 + h01 * y1 + h11 * h * m1
        return out

    def _biases(self, given: dict) -> dict:
        out = {}
        for name, fixed in self.biases.items():
            value = given.get(name)
            if value is None:
                if name == "bnabla2" and fixed == 0.0:
                    continue  # the term (and its transform) is skipped
                value = fixed
            out[name] = value
        unknown = [k for k, v in given.items() if v is not None and k not in self.biases]
        if unknown:
            raise ValueError(
                f"this galaxy forward model has no parameter(s) {unknown} (bias="
                f"{self.lpt.bias!r}: {self.parameter_names})"
            )
        return out

    @property
    def predicts_modes(self) -> bool:
        """With the deconvolution the prediction is made in Fourier space: white noise's
        likelihood then reads ``from_modes(..., return_modes=True)`` (Parseval) and the
        inverse transform is skipped. Without it the modes would cost an extra rfft3d."""
        return bool(self.lpt.deconvolve)

    def from_modes(
        self,
        modes,
        Omega_m=None,  # noqa: N803
        b1=None,
        b2=None,
        bs2=None,
        bnabla2=None,
        return_modes: bool = False,
    ) -> tf.Tensor:
        """Galaxy overdensity ``[chains, n0, n1, n2]`` from ``modes = rfft3d(delta)``
        (parameters ``None``: the fixed values; else ``[chains]`` tensors)."""
        biases = self._biases({"b1": b1, "b2": b2, "bs2": bs2, "bnabla2": bnabla2})
        return self.lpt.from_modes(
            modes, **self.growth(Omega_m), **biases, return_modes=return_modes
        )

    def __call__(self, delta, **params) -> tf.Tensor:
        """:meth:`from_modes` of ``rfft3d(delta)``."""
        delta = tf.convert_to_tensor(delta)
        return self.from_modes(tf.signal.rfft3d(delta, self.grid.grid_shape), **params)

    def linear_gain_fn(self, Omega_m=None, b1=None, bnabla2=None, **_) -> tf.Tensor:  # noqa: N803
        """float64 linear response of the lattice model
        (:meth:`~fieldhmc.models.LPTGalaxyForward.linear_response`), ``[chains or 1, n0, n1,
        n2 // 2 + 1]``, at per-chain ``Omega_m``, ``b1`` and ``bnabla2`` (``None``: the
        fixed values)."""
        growth = self.growth(Omega_m)
        biases = self._biases({"b1": b1, "bnabla2": bnabla2})
        return self.lpt.linear_response(growth1=growth["growth1"], rate1=growth["rate1"], **biases)

    def __repr__(self) -> str:
        return (
            f"GalaxyClusteringForward(grid={self.grid}, a_obs={self.a_obs}, "
            f"omega_m={self.omega_m}, order={self.lpt.order}, rsd={self.lpt.rsd}, "
            f"los_axis={self.lpt.los_axis}, bias={self.lpt.bias!r}, "
            f"deconvolve={self.lpt.deconvolve}, lattice_offset={self.lpt.lattice_offset}, "
            f"biases={self.biases})"
        )
