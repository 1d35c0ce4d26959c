"""Second-order Lagrangian bias weights of the LPT particles (Modi, Chen & White 2020).

Each particle carries a weight, a function of the linear field at its **initial**
(Lagrangian, grid) position, evaluated at the observation time
(:math:`\\delta_L = D_1\\delta`):

.. math::

    w(\\mathbf q) = 1 + b_1\\delta_L
        + b_2\\bigl(\\delta_L^2 - \\langle\\delta_L^2\\rangle\\bigr)
        + b_{s^2}\\bigl(s_L^2 - \\langle s_L^2\\rangle\\bigr)
        + b_{\\nabla^2}\\nabla^2\\delta_L,

with the tidal shear :math:`s_{ij} = \\phi_{ij} - \\tfrac13\\delta_{ij}\\,\\mathrm{tr}\\,\\phi`,
:math:`\\phi_{ij}(\\mathbf k) = (k_i k_j/k^2)\\,\\delta(\\mathbf k)`
(:mod:`fieldhmc.models.lpt`; :math:`\\mathrm{tr}\\,\\phi = \\delta`, so
:math:`s_{ij} = (k_ik_j/k^2 - \\delta_{ij}/3)\\delta_k` off :math:`\\mathbf k = 0`), and

.. math::

    s^2 = s_{ij}s_{ij} = \\phi_{ij}\\phi_{ij} - \\tfrac13 (\\mathrm{tr}\\,\\phi)^2
        = \\tfrac23\\,\\delta^2 - 2\\,\\delta_2 ,

the last form from the 2LPT source :math:`\\delta_2 = \\tfrac12[(\\mathrm{tr}\\,\\phi)^2 -
\\phi_{ij}\\phi_{ij}]`, so the shear costs no transform beyond the 2LPT ones.
:math:`\\langle\\cdot\\rangle` is the average over the box (over the particles) of each
chain's own field, summed in float64; with it :math:`\\sum_q w = N\\,(1 + b_1 \\bar\\delta_L)`,
so for a field without a mean mode the painted galaxy density has mean exactly 1.
:math:`\\nabla^2` is :math:`-k^2` with :math:`k` in h/Mpc, so :math:`b_{\\nabla^2}` is in
(Mpc/h)²; it costs one irfft3d (skipped when ``bnabla2`` is ``None``).

Painted by CIC at the particles' evolved (redshift-space) positions
(:func:`fieldhmc.models.cic.cic_paint_lattice`), the weights give the galaxy overdensity
:math:`\\delta_g = \\sum_q w(\\mathbf q)\\, W(\\mathbf x - \\mathbf q - \\Psi) - 1`. To linear
order the painted weights add :math:`b_1\\delta_L` to the matter's :math:`\\delta_L`, so the
**Eulerian linear bias is** :math:`b_E = 1 + b_1` (refs. 1, 2).

References
----------
1. Modi, Chen & White (2020), "Simulations and symmetries", arXiv:1910.07097.
2. Matsubara (2008), "Nonlinear perturbation theory with halo bias and redshift-space
   distortions via the Lagrangian picture", arXiv:0807.1733.
3. Simon-Onfroy, Lanusse & de Mattia (2025), "Benchmarking field-level cosmological
   inference from galaxy surveys", arXiv:2504.20130.
"""

from __future__ import annotations

import math

import tensorflow as tf

from fieldhmc.models.lpt import LagrangianPerturbation, LPTFields, as_chain_parameter
from fieldhmc.models.reduction import reduce_sum_float64

__all__ = ["box_mean", "lagrangian_bias_weights", "shear_squared"]


def shear_squared(fields: LPTFields) -> tf.Tensor:
    """:math:`s^2 = \\tfrac23\\delta^2 - 2\\delta_2` of the unit-growth field,
    ``[chains, n0, n1, n2]``."""
    return (2.0 / 3.0) * fields.delta**2 - 2.0 * fields.delta2


def box_mean(field: tf.Tensor) -> tf.Tensor:
    """Mean over the last three axes, accumulated in float64 (:func:`reduce_sum_float64`),
    returned as ``[chains, 1, 1, 1]`` in the field's dtype."""
    size = math.prod(int(n) for n in field.shape[-3:])
    mean = reduce_sum_float64(field) / tf.constant(size, tf.float64)
    return tf.cast(mean, field.dtype)[:, None, None, None]


def lagrangian_bias_weights(
    lpt: LagrangianPerturbation,
    fields: LPTFields,
    growth1,
    b1,
    b2=None,
    bs2=None,
    bnabla2=None,
) -> tf.Tensor:
    """Per-particle weights :math:`w(\\mathbf q)` on the Lagrangian grid (see module).

    Parameters
    ----------
    lpt : LagrangianPerturbation
        Supplies :math:`k^2` of the grid.
    fields : LPTFields
        From :meth:`LagrangianPerturbation.fields_from_modes` (unit growth).
    growth1 : float or tf.Tensor
        :math:`D_1` at the observation time: float or ``[chains]``.
    b1, b2, bs2, bnabla2 : float or tf.Tensor or None
        Lagrangian biases, floats or ``[chains]``; ``None`` drops the term (for
        ``bnabla2`` also its irfft3d). ``bnabla2`` in (Mpc/h)².

    Returns
    -------
    tf.Tensor
        ``[chains, n0, n1, n2]``, the dtype of the fields; weight of the particle that
        starts at each cell centre.
    """
    dtype = fields.delta.dtype

    def param(value):
        return as_chain_parameter(value, dtype, 3)

    d1 = param(growth1)
    delta_l = d1 * fields.delta
    weights = 1.0 + param(b1) * delta_l
    if b2 is not None:
        square = delta_l**2
        weights += param(b2) * (square - box_mean(square))
    if bs2 is not None:
        shear = d1**2 * shear_squared(fields)
        weights += param(bs2) * (shear - box_mean(shear))
    if bnabla2 is not None:
        k2 = lpt.k2(dtype)
        modes = fields.modes
        lap = tf.signal.irfft3d(
            tf.complex(-tf.math.real(modes) * k2, -tf.math.imag(modes) * k2),
            lpt.grid.grid_shape,
        )
        weights += param(bnabla2) * d1 * lap
    return weights
