"""The linear matter power spectrum :math:`P(k; \\Omega_m, \\sigma_8, a)`, sigma8-normalised.

.. math::

    P(k, a) = A\\, k^{n_s}\\, T^2(k)\\, \\left[\\frac{D_1(a)}{D_1(1)}\\right]^2, \\qquad
    A = \\frac{\\sigma_8^2}{\\sigma^2_{u}(8\\,h^{-1}\\mathrm{Mpc})}, \\qquad P(0) := 0,

    \\sigma^2_{u}(R) = \\frac{1}{2\\pi^2}\\int k^3\\, k^{n_s} T^2(k)\\, W^2(kR)\\, d\\ln k,
    \\qquad W(x) = \\frac{3(\\sin x - x\\cos x)}{x^3},

with :math:`k` in h/Mpc, :math:`P` in (Mpc/h)\\ :sup:`3`, :math:`T` the Eisenstein & Hu
transfer function (:mod:`~fieldhmc.models.cosmology.transfer`, with or without
wiggles), :math:`D_1` the linear growth factor of flat :math:`\\Lambda`CDM
(:mod:`~fieldhmc.models.cosmology.growth`). :math:`\\sigma_8` is the rms of the
*linear* density contrast at :math:`a = 1` in spheres of radius 8 Mpc/h (top hat);
so :math:`P(k, 1)` has :math:`\\sigma(8) = \\sigma_8` whatever :math:`\\Omega_m`, and
earlier :math:`P` is scaled by :math:`D_1^2`.

**Quadrature.** :math:`\\sigma^2_u` uses composite Simpson on a fixed grid of
``num_nodes`` (odd) points uniform in :math:`\\ln k` over :math:`[10^{-5}, 50]` h/Mpc;
the integrand outside is below :math:`10^{-8}` of its peak (:math:`k^{3+n_s}` below,
:math:`(kR)^{-4}` above). With the default 1025 nodes it agrees with
``scipy.integrate.quad`` to better than :math:`10^{-7}`
(tests/models/test_cosmology.py). Everything is TensorFlow float64 with static
shapes: batched over :math:`(\\Omega_m, \\sigma_8, a)` of any broadcastable shape
``B`` (e.g. ``[chains]``), differentiable, and compilable with
``tf.function(jit_compile=True)``.

**Unphysical values.** Python values outside :math:`\\Omega_b < \\Omega_m \\le 1`,
:math:`\\sigma_8 > 0`, :math:`0 < a \\le 1` raise :class:`ValueError` naming the
parameter. Tensors are clipped into that domain first
(:func:`~fieldhmc.models.cosmology.clip_to_support`): for any finite input the result
and its gradient are finite, and the caller masks with
:func:`~fieldhmc.models.cosmology.in_support`.

References
----------
.. [1] Eisenstein & Hu (1998), astro-ph/9709112.
.. [2] Peebles (1980), *The Large-Scale Structure of the Universe*, section 26
   (top-hat variance).
.. [3] Campagne et al. (2023), "JAX-COSMO: an end-to-end differentiable and GPU
   accelerated cosmology library", arXiv:2302.05163 (the same construction in JAX,
   used by the flbench benchmark, arXiv:2504.20130).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from fieldhmc.models.cosmology.growth import DEFAULT_NUM_STEPS, growth_factors
from fieldhmc.models.cosmology.parameters import (
    PLANCK18,
    FixedCosmology,
    check_cosmology,
    clip_to_support,
)
from fieldhmc.models.cosmology.transfer import eisenstein_hu_transfer

__all__ = [
    "COSMOLOGY_PARAMETER_NAMES",
    "EisensteinHuPower",
    "linear_power",
    "sigma_r_squared",
]

#: Names of the sampleable cosmological parameters, in sampling order.
COSMOLOGY_PARAMETER_NAMES: tuple[str, ...] = ("Omega_m", "sigma8")
#: Radius of sigma8, Mpc/h.
SIGMA8_RADIUS = 8.0
K_QUADRATURE = (1e-5, 50.0)
DEFAULT_NUM_NODES = 1025


def _tophat(x: tf.Tensor) -> tf.Tensor:
    """3 (sin x - x cos x)/x^3 with its series below 1e-2."""
    small = x < tf.constant(1e-2, tf.float64)
    safe = tf.where(small, tf.ones_like(x), x)
    x2 = x * x
    series = 1.0 - x2 / 10.0 + x2 * x2 / 280.0
    return tf.where(small, series, 3.0 * (tf.sin(safe) - safe * tf.cos(safe)) / safe**3)


def _simpson_weights(num_nodes: int, step: float) -> np.ndarray:
    if num_nodes < 3 or num_nodes % 2 == 0:
        raise ValueError(f"num_nodes must be odd and >= 3, got {num_nodes}")
    w = np.ones(num_nodes)
    w[1:-1:2] = 4.0
    w[2:-1:2] = 2.0
    return w * step / 3.0


def sigma_r_squared(
    omega_m,
    radius: float = SIGMA8_RADIUS,
    fixed: FixedCosmology = PLANCK18,
    wiggles: bool = True,
    num_nodes: int = DEFAULT_NUM_NODES,
) -> tf.Tensor:
    """Top-hat variance :math:`\\sigma_u^2(R)` of the unit-amplitude :math:`k^{n_s} T^2(k)`.

    Parameters
    ----------
    omega_m : float or tf.Tensor
        :math:`\\Omega_m`, batch shape ``B`` (used as given: no clipping).
    radius : float
        :math:`R`, Mpc/h.
    fixed, wiggles
        As :func:`~fieldhmc.models.cosmology.eisenstein_hu_transfer`.
    num_nodes : int
        Odd number of Simpson nodes in :math:`\\ln k` over :math:`[10^{-5}, 50]` h/Mpc.

    Returns
    -------
    tf.Tensor
        float64, shape ``B``, (Mpc/h)^(3 + n_s) units of the unnormalised shape.
    """
    ln_k = np.linspace(math.log(K_QUADRATURE[0]), math.log(K_QUADRATURE[1]), num_nodes)
    k = np.exp(ln_k)
    weights = _simpson_weights(num_nodes, ln_k[1] - ln_k[0])
    # the k-only factors are NumPy constants: k^(3 + n_s) W^2(kR) dlnk / (2 pi^2)
    window = _tophat(tf.constant(k * radius, tf.float64))
    const = tf.constant(weights * k ** (3.0 + fixed.n_s) / (2.0 * math.pi**2), tf.float64)
    t = eisenstein_hu_transfer(tf.constant(k, tf.float64), omega_m, fixed, wiggles)
    return tf.reduce_sum(const * window**2 * t**2, axis=-1)


def _is_python(x) -> bool:
    return x is not None and not tf.is_tensor(x)


def linear_power(
    k,
    omega_m,
    sigma8,
    a=1.0,
    fixed: FixedCosmology = PLANCK18,
    wiggles: bool = True,
    num_nodes: int = DEFAULT_NUM_NODES,
    num_growth_steps: int = DEFAULT_NUM_STEPS,
) -> tf.Tensor:
    """:math:`P(k; \\Omega_m, \\sigma_8, a)` in (Mpc/h)^3, TensorFlow float64.

    Parameters
    ----------
    k : array-like or tf.Tensor
        ``[...K]``, h/Mpc, :math:`k \\ge 0`; :math:`P = 0` where :math:`k \\le 0`.
        A NumPy ``k`` (e.g. ``Grid.kmag()``) is evaluated on its distinct values only
        and gathered back (exact, and ~25x fewer transfer-function evaluations on a
        32^3 grid).
    omega_m, sigma8 : float or tf.Tensor
        Broadcastable batch shapes (e.g. ``[chains]`` or scalars).
    a : float or tf.Tensor
        Scale factor; Python ``1.0`` skips the growth integration.
    fixed : FixedCosmology
        :math:`\\Omega_b, h, n_s, T_\\mathrm{CMB}`.
    wiggles : bool
        E&H with baryon oscillations, or the no-wiggle form.
    num_nodes, num_growth_steps : int
        Quadrature nodes for :math:`\\sigma_8`; RK4 steps for :math:`D_1`.

    Returns
    -------
    tf.Tensor
        ``B + K`` float64, ``B`` the broadcast batch shape of the parameters.

    Raises
    ------
    ValueError
        Python parameter values outside the physical domain (tensors are clipped).
    """
    check_cosmology(
        omega_m if _is_python(omega_m) else None,
        sigma8 if _is_python(sigma8) else None,
        a if _is_python(a) else None,
        fixed.omega_b,
    )
    needs_growth = tf.is_tensor(a) or bool(np.any(np.asarray(a) != 1.0))
    omega_m, sigma8, a = clip_to_support(omega_m, sigma8, a, fixed.omega_b)
    batch = tf.broadcast_dynamic_shape(
        tf.broadcast_dynamic_shape(tf.shape(omega_m), tf.shape(sigma8)), tf.shape(a)
    )
    omega_m = tf.broadcast_to(omega_m, batch)
    amplitude = tf.broadcast_to(sigma8, batch) ** 2 / sigma_r_squared(
        omega_m, SIGMA8_RADIUS, fixed, wiggles, num_nodes
    )
    if needs_growth:
        growth = growth_factors(omega_m, tf.broadcast_to(a, batch), "today", num_growth_steps)
        amplitude = amplitude * growth.d1**2
    if not tf.is_tensor(k):
        # a grid's |k| has few distinct values (682 of 17408 modes at 32^3): evaluate
        # those and gather, which is exact
        k = np.asarray(k, dtype=np.float64)
        k_unique, inverse = np.unique(k, return_inverse=True)
        p_unique = _power_on(tf.constant(k_unique), omega_m, amplitude, batch, fixed, wiggles)
        return tf.reshape(
            tf.gather(p_unique, tf.constant(inverse.reshape(-1)), axis=-1),
            tf.concat([batch, k.shape], 0),
        )
    return _power_on(tf.cast(k, tf.float64), omega_m, amplitude, batch, fixed, wiggles)


def _power_on(k, omega_m, amplitude, batch, fixed, wiggles):
    """amplitude k^n T^2(k), ``B + K``, 0 where k <= 0."""
    k_rank = len(k.shape)
    amplitude = tf.reshape(amplitude, tf.concat([batch, tf.ones([k_rank], tf.int32)], 0))
    is_pos = k > 0
    k_safe = tf.where(is_pos, k, tf.ones_like(k))
    shape = tf.pow(k_safe, tf.constant(fixed.n_s, tf.float64)) * tf.square(
        eisenstein_hu_transfer(k_safe, omega_m, fixed, wiggles)
    )
    return tf.where(is_pos, amplitude * shape, tf.zeros([], tf.float64))


class EisensteinHuPower:
    """Linear :math:`P(k)` from :math:`(\\Omega_m, \\sigma_8)`, usable on a grid's :math:`|k|`.

    The cosmological counterpart of :class:`~fieldhmc.models.PowerSpectrum`:
    :meth:`numpy` gives the fiducial spectrum, calling the object gives the
    TensorFlow spectrum with optional batched :math:`(\\Omega_m, \\sigma_8, a)`.

    Parameters
    ----------
    omega_m, sigma8 : float
        Fiducial :math:`\\Omega_m \\in (\\Omega_b, 1]` and :math:`\\sigma_8 > 0`
        (Planck 2018 defaults as flbench: 0.3111, 0.8102).
    a : float
        Scale factor of the spectrum, :math:`0 < a \\le 1` (1: the linear field today).
    fixed : FixedCosmology
        :math:`\\Omega_b, h, n_s, T_\\mathrm{CMB}` (default :data:`PLANCK18`).
    wiggles : bool
        Baryon oscillations (default) or the no-wiggle form.
    num_nodes, num_growth_steps : int
        See :func:`linear_power`.

    Raises
    ------
    ValueError
        Unphysical parameters, naming the parameter.
    """

    parameter_names: tuple[str, ...] = COSMOLOGY_PARAMETER_NAMES

    def __init__(
        self,
        omega_m: float = 0.3111,
        sigma8: float = 0.8102,
        a: float = 1.0,
        fixed: FixedCosmology = PLANCK18,
        wiggles: bool = True,
        num_nodes: int = DEFAULT_NUM_NODES,
        num_growth_steps: int = DEFAULT_NUM_STEPS,
    ):
        check_cosmology(omega_m, sigma8, a, fixed.omega_b)
        _simpson_weights(num_nodes, 1.0)
        self.omega_m = float(omega_m)
        self.sigma8 = float(sigma8)
        self.a = float(a)
        self.fixed = fixed
        self.wiggles = bool(wiggles)
        self.num_nodes = int(num_nodes)
        self.num_growth_steps = int(num_growth_steps)

    @property
    def fiducial(self) -> dict[str, float]:
        """``{"Omega_m": ..., "sigma8": ...}``."""
        return {"Omega_m": self.omega_m, "sigma8": self.sigma8}

    def __call__(self, k, omega_m=None, sigma8=None, a=None) -> tf.Tensor:
        """:math:`P(k)` (TF float64, ``B + K``); ``None`` parameters take the fiducial values."""
        return linear_power(
            k,
            self.omega_m if omega_m is None else omega_m,
            self.sigma8 if sigma8 is None else sigma8,
            self.a if a is None else a,
            self.fixed,
            self.wiggles,
            self.num_nodes,
            self.num_growth_steps,
        )

    def numpy(self, k) -> np.ndarray:
        """Fiducial :math:`P(k)`, NumPy float64 (:math:`P = 0` where :math:`k = 0`)."""
        k = np.asarray(k, dtype=np.float64)
        if np.any(k < 0) or not np.all(np.isfinite(k)):
            raise ValueError("k must be finite and non-negative")
        return self(k).numpy()

    def __repr__(self) -> str:
        return (
            f"EisensteinHuPower(omega_m={self.omega_m!r}, sigma8={self.sigma8!r}, a={self.a!r}, "
            f"fixed={self.fixed!r}, wiggles={self.wiggles!r})"
        )
