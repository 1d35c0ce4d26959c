"""Plane-parallel redshift-space distortions of LPT particles, and the Kaiser factor.

Along a fixed line of sight :math:`\\hat z` (a box axis, ``los_axis``; the distant-observer
limit) a particle's redshift-space position is its real-space position moved by its
peculiar velocity along :math:`\\hat z` in units of :math:`aH`. In LPT the velocity of
order :math:`n` is :math:`\\dot\\Psi^{(n)} = f_n H\\, \\Psi^{(n)}` with
:math:`f_n = d\\ln D_n / d\\ln a`, so

.. math::

    \\mathbf s = \\mathbf q + \\Psi + (f_1 D_1 \\Psi_1 + f_2 D_2 \\Psi_2)\\cdot\\hat z\\,\\hat z ,

which is 2LPT (:mod:`fieldhmc.models.lpt`) with per-axis growth factors

.. math:: D_{n,a} = D_n\\,(1 + f_n\\,[a = \\text{los}]),

(:func:`redshift_space_growth`); positions wrap periodically when painted. Passing them to
:meth:`~fieldhmc.models.lpt.LagrangianPerturbation.displacement` moves the particles into
redshift space with no transform beyond the real-space displacement's (the factors
combine per axis in Fourier space). For 2LPT :math:`f_2 \\approx 2\\,\\Omega_m(a)^{6/11}`.

To linear order the galaxy overdensity in redshift space is the Kaiser (1987) form
:math:`\\delta_s(\\mathbf k) = D_1 (b_E + f_1 \\mu^2)\\, \\delta(\\mathbf k)`,
:math:`\\mu = k_\\text{los}/k` (:func:`kaiser_factor`), with the Eulerian linear bias
:math:`b_E = 1 + b_1` of a Lagrangian bias :math:`b_1`
(:mod:`fieldhmc.models.lagrangian_bias`).

References
----------
1. Kaiser (1987), "Clustering in real space and in redshift space", MNRAS 227, 1.
2. Taylor & Hamilton (1996), "Non-linear cosmological power spectra in real and
   redshift space", MNRAS 282, 767, arXiv:astro-ph/9604020.
3. Simon-Onfroy, Lanusse & de Mattia (2025), "Benchmarking field-level cosmological
   inference from galaxy surveys", arXiv:2504.20130.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fieldhmc.models.grid import Grid
from fieldhmc.models.lpt import as_real

__all__ = ["kaiser_factor", "line_of_sight", "redshift_space_growth"]


def line_of_sight(los_axis: int) -> int:
    """The line-of-sight axis as 0, 1 or 2 (``-1`` is the last axis); ValueError else."""
    if isinstance(los_axis, bool) or not isinstance(los_axis, int | np.integer):
        raise ValueError(f"los_axis must be an integer axis in -3..2, got {los_axis!r}")
    if not -3 <= los_axis <= 2:
        raise ValueError(f"los_axis must be in -3..2, got {los_axis}")
    return int(los_axis) % 3


def _chains(value, dtype) -> tf.Tensor:
    """A float or ``[chains]`` parameter as ``[chains or 1, 1]``."""
    value = as_real(value, dtype)
    if value.shape.rank not in (0, 1):
        raise ValueError(f"a parameter must be a scalar or [chains], got {value.shape}")
    return tf.reshape(value, [-1, 1])


def redshift_space_growth(
    growth1, growth2, rate1, rate2, los_axis: int = -1, dtype=tf.float64
) -> tuple[tf.Tensor, tf.Tensor | None]:
    """Per-axis growth factors :math:`D_{n,a} = D_n (1 + f_n [a = \\text{los}])`.

    Parameters
    ----------
    growth1, growth2 : float or tf.Tensor
        :math:`D_1`, :math:`D_2`: Python floats or ``[chains]``; ``growth2=None`` for 1LPT
        (then ``rate2`` is ignored).
    rate1, rate2 : float or tf.Tensor
        Growth rates :math:`f_1`, :math:`f_2`, as above.
    los_axis : int
        Line-of-sight axis of the box (default the last).
    dtype : tf.DType
        Real dtype of the model (the displacement's).

    Returns
    -------
    (tf.Tensor, tf.Tensor or None)
        ``[chains or 1, 3]`` each, for
        :meth:`fieldhmc.models.lpt.LagrangianPerturbation.displacement`.
    """
    axis = line_of_sight(los_axis)
    unit = tf.constant(np.eye(3)[axis], dtype)[None, :]  # [1, 3]
    g1 = _chains(growth1, dtype) * (1.0 + _chains(rate1, dtype) * unit)
    if growth2 is None:
        return g1, None
    return g1, _chains(growth2, dtype) * (1.0 + _chains(rate2, dtype) * unit)


def kaiser_factor(grid: Grid, growth, bias, rate, los_axis: int = -1, dtype=tf.float64):
    """Linear redshift-space response :math:`D\\,(b_E + f\\mu^2)` on the half-spectrum.

    Parameters
    ----------
    grid : Grid
    growth, bias, rate : float or tf.Tensor
        :math:`D_1`, the Eulerian linear bias :math:`b_E` (:math:`1 + b_1` for a
        Lagrangian :math:`b_1`) and :math:`f_1`: floats or ``[chains]``.
    los_axis : int
        Line-of-sight axis.
    dtype : tf.DType

    Returns
    -------
    tf.Tensor
        ``[chains or 1, n0, n1, n2 // 2 + 1]``; :math:`\\mu = 0` at :math:`\\mathbf k = 0`.
    """
    axis = line_of_sight(los_axis)
    # from three eager 1-D tensors, captured as arguments of a compiled program: as graph
    # constants TF would fold mu^2 into one [n0, n1, m] constant
    with tf.init_scope():
        k = [tf.constant(np.asarray(ka, np.float64).reshape(-1), dtype) for ka in grid.kvec()]
    k2 = k[0][:, None, None] ** 2 + k[1][None, :, None] ** 2 + k[2][None, None, :] ** 2
    los = [k[0][:, None, None], k[1][None, :, None], k[2][None, None, :]][axis] ** 2
    nonzero = k2 > 0
    mu2 = tf.where(nonzero, los / tf.where(nonzero, k2, tf.ones([], dtype)), 0.0)[None]

    def chains(value):
        return tf.reshape(as_real(value, dtype), [-1, 1, 1, 1])

    return chains(growth) * (chains(bias) + chains(rate) * mu2)
