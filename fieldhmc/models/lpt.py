"""Second-order Lagrangian perturbation theory (2LPT) displacements, batched, FFT-based.

A particle starting at the centre :math:`\\mathbf q` of a cell moves to
:math:`\\mathbf x = \\mathbf q + \\Psi(\\mathbf q)` with

.. math::

    \\Psi = D_1 \\Psi_1 + D_2 \\Psi_2, \\qquad
    \\Psi_1(\\mathbf k) = \\frac{i\\mathbf k}{k^2}\\, \\delta(\\mathbf k), \\qquad
    \\Psi_2(\\mathbf k) = -\\frac{i\\mathbf k}{k^2}\\, \\delta_2(\\mathbf k),

so that :math:`\\nabla_q\\cdot\\Psi_1 = -\\delta` (as :mod:`fieldhmc.models.zeldovich`,
NumPy's FFT sign) and :math:`\\nabla_q\\cdot\\Psi_2 = +\\delta_2`, with the
second-order source built from the 1LPT tidal tensor
:math:`\\phi_{ij} = \\partial_i\\partial_j \\nabla^{-2}\\delta`,

.. math::

    \\phi_{ij}(\\mathbf k) = \\frac{k_i k_j}{k^2}\\, \\delta(\\mathbf k), \\qquad
    \\delta_2 = \\sum_{i<j} \\bigl[\\phi_{ii}\\phi_{jj} - \\phi_{ij}^2\\bigr]
    = \\tfrac12 \\bigl[(\\mathrm{tr}\\,\\phi)^2 - \\phi_{ij}\\phi_{ij}\\bigr].

**Sign convention** (pmwd, flbench): :math:`D_2 \\approx -\\tfrac37 D_1^2`
(:math:`D_2 = -\\tfrac37 D_1^2` exactly in Einstein-de Sitter), i.e. the second-order
displacement is :math:`\\nabla\\cdot\\Psi^{(2)} = D_2\\delta_2 = -\\tfrac37 D_1^2\\delta_2`,
the LPT kernel :math:`L_2 = \\tfrac37 \\frac{\\mathbf k}{k^2}(1 - \\mu_{12}^2)` of
Matsubara (ref. 3) and Bernardeau et al. (ref. 2, eq. 167). FlowPM (ref. 4) writes the same
displacement with the kernel of :math:`\\Psi_1`, :math:`\\tfrac37` in the source and
:math:`D_2 > 0`. :math:`\\delta` is the linear field at the prior's normalisation (a = 1
for a cosmological prior), :math:`D_1, D_2` the growth factors relative to it.

Conventions on the grid: the mean mode has the isotropic tidal tensor
:math:`\\phi_{ij}(\\mathbf 0) = \\delta_{ij}\\,\\delta(\\mathbf 0)/3` (so
:math:`\\mathrm{tr}\\,\\phi = \\delta` exactly, and a uniform overdensity sources
:math:`\\delta_2` as spherical collapse does), and :math:`\\Psi(\\mathbf 0) = 0`. Odd
operators (:math:`k_a` of one derivative: :math:`\\Psi_a`, and :math:`k_i k_j`,
:math:`i \\ne j`) are 0 on the Nyquist plane of an even axis, where the mode is its own
Hermitian partner (as :mod:`~fieldhmc.models.zeldovich` and pmwd); the diagonal
:math:`k_i^2/k^2` is even and kept there.

**Cost** (transforms of one field, the three or six components of a stack batched into
one call). From the modes :math:`\\delta(\\mathbf k)`: the tidal tensor 6 irfft3d, the
source 1 rfft3d (:meth:`LagrangianPerturbation.fields_from_modes`), the displacement 3
irfft3d (:meth:`~LagrangianPerturbation.displacement`; first and second order, and a
redshift-space line-of-sight factor, are combined in Fourier space per axis, so
:math:`\\Psi_1` and :math:`\\Psi_2` are never transformed on their own): **10
transforms forward and 10 backward** (each transform's adjoint is one transform of the
other kind). That is the floor of this formulation: the particles need 3 real
displacement components, :math:`\\delta_2` is a sum of products of the 6 independent
real :math:`\\phi_{ij}`, and its modes take one rfft3d (5 irfft3d suffice for the
tensor if :math:`\\delta` is at hand in real space, via
:math:`\\phi_{zz} = \\delta - \\phi_{xx} - \\phi_{yy}`: the same 10 from :math:`\\delta`
counting its rfft3d). The gradients are TensorFlow's through the registered exact
``RFFT3D``/``IRFFT3D`` adjoints of :mod:`fieldhmc.ops` -- a hand-written adjoint
would take the same transforms -- so no custom gradient is needed.

References
----------
1. Bouchet, Colombi, Hivon & Juszkiewicz (1995), "Perturbative Lagrangian approach to
   gravitational instability", A&A 296, 575, arXiv:astro-ph/9406013.
2. Bernardeau, Colombi, Gaztanaga & Scoccimarro (2002), "Large-scale structure of the
   Universe and cosmological perturbation theory", Phys. Rep. 367, 1,
   arXiv:astro-ph/0112551.
3. Matsubara (2008), "Resumming cosmological perturbations via the Lagrangian picture",
   arXiv:0711.2521.
4. Modi, Lanusse & Seljak (2021), "FlowPM", arXiv:2010.11847.
5. Li, Modi, Zhang et al. (2022), "pmwd: a differentiable cosmological particle-mesh
   N-body library", arXiv:2211.09958.
6. Simon-Onfroy, Lanusse & de Mattia (2025), "Benchmarking field-level cosmological
   inference from galaxy surveys", arXiv:2504.20130.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from fieldhmc.models.grid import Grid

__all__ = ["LPTFields", "LagrangianPerturbation", "as_chain_parameter", "as_real"]

#: The 6 independent components of the tidal tensor, in the order of the stacks.
TIDAL_COMPONENTS = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))


class LPTFields(NamedTuple):
    """The linear field and its 2LPT source, shared by displacement and bias weights.

    Attributes
    ----------
    modes : tf.Tensor
        complex ``[chains, n0, n1, n2 // 2 + 1]``, :math:`\\delta(\\mathbf k)` (rfft3d).
    delta : tf.Tensor
        real ``[chains, n0, n1, n2]``, :math:`\\delta = \\mathrm{tr}\\,\\phi`.
    delta2 : tf.Tensor
        real ``[chains, n0, n1, n2]``, :math:`\\delta_2 = \\sum_{i<j}[\\phi_{ii}\\phi_{jj}
        - \\phi_{ij}^2]` (unit growth).
    delta2_modes : tf.Tensor
        complex, ``rfft3d(delta2)``.
    """

    modes: tf.Tensor
    delta: tf.Tensor
    delta2: tf.Tensor
    delta2_modes: tf.Tensor


def as_real(value, dtype) -> tf.Tensor:
    """A Python number or array as ``dtype`` exactly (``tf.constant``), a tensor of another
    float dtype cast to it (a float64 sampled parameter into a float32 model)."""
    if isinstance(value, tf.Tensor | tf.Variable):
        return tf.cast(value, dtype)
    return tf.constant(value, dtype)


def as_chain_parameter(value, dtype, event_ndims: int) -> tf.Tensor:
    """A scalar parameter as a tensor broadcastable against ``[chains, *event]``.

    Parameters
    ----------
    value : float or tf.Tensor
        A Python float, a scalar tensor, ``[chains]`` (one per chain) or
        ``[chains, *extra]``, ``extra`` broadcasting against the leading event axes
        (e.g. ``[chains, 3]`` per axis against ``[chains, 3, n0, n1, n2]``).
    dtype : tf.DType
        Real dtype of the model.
    event_ndims : int
        Trailing axes to append (3 for a field ``[chains, n0, n1, n2]``).

    Returns
    -------
    tf.Tensor
        ``value`` in ``dtype`` with ``event_ndims`` unit axes appended (a scalar stays a
        scalar).
    """
    value = as_real(value, dtype)
    if value.shape.rank == 0:
        return value
    return tf.reshape(value, tf.concat([tf.shape(value), tf.ones([event_ndims], tf.int32)], 0))


def _real_times(modes: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """``modes * factor`` for a real ``factor``, on the real and imaginary parts."""
    return tf.complex(tf.math.real(modes) * factor, tf.math.imag(modes) * factor)


class LagrangianPerturbation:
    """2LPT on a periodic grid: the tidal source and the displacement (see module).

    Parameters
    ----------
    grid : Grid
        Box and cells; wavenumbers in h/Mpc.

    Notes
    -----
    All methods are batched over the leading ``[chains]`` axis, float32 or float64 (the
    dtype of the input), graph- and XLA-compatible; chain ``i``'s outputs depend only on
    chain ``i``'s inputs. The wavenumbers are 1-D tensors made eagerly, so a compiled
    caller captures them as small arguments and the ``[n0, n1, n2 // 2 + 1]`` kernels
    are computed in the program (as :class:`~fieldhmc.models.ZeldovichForward`).
    """

    def __init__(self, grid: Grid):
        if not isinstance(grid, Grid):
            raise ValueError(f"grid must be a fieldhmc.models.Grid, got {type(grid).__name__}")
        self.grid = grid
        self.cell = tuple(ell / n for ell, n in zip(grid.box_size, grid.grid_shape, strict=True))
        k = [np.asarray(ka, np.float64).reshape(-1) for ka in grid.kvec()]
        odd = []  # 0 on the Nyquist bin of an even axis (odd operators)
        for ka, n in zip(k, grid.grid_shape, strict=True):
            kd = ka.copy()
            if n % 2 == 0:
                kd[n // 2] = 0.0
            odd.append(kd)
        with tf.init_scope():  # eager tensors even if built inside a tf.function
            self._waves = {
                dtype: (
                    tuple(tf.constant(a, dtype) for a in k),
                    tuple(tf.constant(a, dtype) for a in odd),
                )
                for dtype in (tf.float32, tf.float64)
            }

    def __repr__(self) -> str:
        return f"LagrangianPerturbation(grid={self.grid})"

    # --- kernels (built in the program from the 1-D wavenumbers) ---------------------
    def _axes(self, dtype, *, odd: bool):
        waves = self._waves[dtype][1 if odd else 0]
        return (waves[0][:, None, None], waves[1][None, :, None], waves[2][None, None, :])

    def k2(self, dtype) -> tf.Tensor:
        """:math:`k^2` ``[n0, n1, n2 // 2 + 1]`` in (h/Mpc)²."""
        k0, k1, k2 = self._axes(dtype, odd=False)
        return k0**2 + k1**2 + k2**2

    def _inverse_k2(self, dtype):
        k2 = self.k2(dtype)
        nonzero = k2 > 0
        return nonzero, tf.where(nonzero, 1.0 / tf.where(nonzero, k2, tf.ones([], dtype)), 0.0)

    def tidal_kernels(self, dtype) -> tf.Tensor:
        """:math:`k_i k_j / k^2` for :data:`TIDAL_COMPONENTS`, real ``[6, n0, n1, m]``
        (:math:`\\delta_{ij}/3` at :math:`\\mathbf k = 0`; off-diagonal 0 on Nyquist planes)."""
        nonzero, inv = self._inverse_k2(dtype)
        full = self._axes(dtype, odd=False)
        odd = self._axes(dtype, odd=True)
        third = tf.constant(1.0 / 3.0, dtype)
        kernels = []
        for i, j in TIDAL_COMPONENTS:
            if i == j:
                kernels.append(tf.where(nonzero, full[i] ** 2 * inv, third))
            else:
                kernels.append(odd[i] * odd[j] * inv)
        shape = self.grid.modes_shape
        return tf.stack([tf.broadcast_to(t, shape) for t in kernels], axis=0)

    def displacement_kernels(self, dtype) -> tf.Tensor:
        """:math:`S_a = k_a / (k^2 h_a)`, real ``[3, n0, n1, m]``, so that
        :math:`\\Psi_{1,a} = \\mathrm{irfft}(i S_a \\delta_k)` in cells (0 at k = 0 and on
        the Nyquist plane of axis ``a``)."""
        _, inv = self._inverse_k2(dtype)
        odd = self._axes(dtype, odd=True)
        shape = self.grid.modes_shape
        return tf.stack(
            [tf.broadcast_to(odd[a] * inv / h, shape) for a, h in enumerate(self.cell)], axis=0
        )

    # --- fields ------------------------------------------------------------------------
    def tidal_tensor_from_modes(self, modes) -> tf.Tensor:
        """:math:`\\phi_{ij}` in real space, ``[chains, 6, n0, n1, n2]`` in the order of
        :data:`TIDAL_COMPONENTS` (one batched irfft3d of 6 fields)."""
        modes = tf.convert_to_tensor(modes)
        kernels = self.tidal_kernels(modes.dtype.real_dtype)
        return tf.signal.irfft3d(_real_times(modes[:, None], kernels), self.grid.grid_shape)

    def fields_from_modes(self, modes) -> LPTFields:
        """The linear field, its tidal source :math:`\\delta_2` and their modes.

        Parameters
        ----------
        modes : tf.Tensor
            complex64/complex128 ``[chains, n0, n1, n2 // 2 + 1]``, ``rfft3d(delta)``
            (Hermitian on the self-paired planes, as any rfft3d of a real field).

        Returns
        -------
        LPTFields
            6 irfft3d (batched) and 1 rfft3d.
        """
        modes = tf.convert_to_tensor(modes)
        phi = self.tidal_tensor_from_modes(modes)
        xx, yy, zz, xy, xz, yz = tf.unstack(phi, axis=1)
        delta = xx + yy + zz
        delta2 = xx * yy + xx * zz + yy * zz - xy**2 - xz**2 - yz**2
        delta2_modes = tf.signal.rfft3d(delta2, self.grid.grid_shape)
        return LPTFields(modes, delta, delta2, delta2_modes)

    def fields(self, delta) -> LPTFields:
        """:meth:`fields_from_modes` of ``rfft3d(delta)``, ``delta`` real
        ``[chains, n0, n1, n2]`` (one rfft3d more)."""
        delta = tf.convert_to_tensor(delta)
        return self.fields_from_modes(tf.signal.rfft3d(delta, self.grid.grid_shape))

    def displacement(self, fields: LPTFields, growth1, growth2=None) -> tf.Tensor:
        """:math:`D_1\\Psi_1 + D_2\\Psi_2` in **cell units**, ``[chains, 3, n0, n1, n2]``.

        .. math:: \\Psi_a = \\mathrm{irfft}\\bigl(i S_a\\,[D_{1,a}\\,\\delta_k
            - D_{2,a}\\,\\delta_{2,k}]\\bigr)

        (one batched irfft3d of the 3 components).

        Parameters
        ----------
        fields : LPTFields
            From :meth:`fields_from_modes`.
        growth1, growth2 : float or tf.Tensor
            :math:`D_1`, :math:`D_2` (:math:`D_2 \\approx -\\tfrac37 D_1^2`): Python floats,
            ``[chains]``, or ``[chains, 3]`` per axis (the redshift-space factors of
            :func:`fieldhmc.models.rsd.redshift_space_growth`). ``growth2=None``: 1LPT.

        Returns
        -------
        tf.Tensor
            Real ``[chains, 3, n0, n1, n2]``, the dtype of the fields.
        """
        dtype = fields.modes.dtype.real_dtype
        d1 = _per_axis(growth1, dtype)
        re = d1 * tf.math.real(fields.modes)[:, None]
        im = d1 * tf.math.imag(fields.modes)[:, None]
        if growth2 is not None:
            d2 = _per_axis(growth2, dtype)
            re = re - d2 * tf.math.real(fields.delta2_modes)[:, None]
            im = im - d2 * tf.math.imag(fields.delta2_modes)[:, None]
        s = self.displacement_kernels(dtype)  # [3, n0, n1, m]
        return tf.signal.irfft3d(tf.complex(-im * s, re * s), self.grid.grid_shape)

    def __call__(self, delta, growth1, growth2=None) -> tf.Tensor:
        """:meth:`displacement` of :meth:`fields` ``(delta)``."""
        return self.displacement(self.fields(delta), growth1, growth2)


def _per_axis(value, dtype) -> tf.Tensor:
    """A growth factor as ``[chains or 1, 3 or 1, 1, 1, 1]`` against a displacement stack
    ``[chains, 3, n0, n1, m]``: a float, ``[chains]`` or ``[chains, 3]``."""
    value = as_real(value, dtype)
    rank = value.shape.rank
    if rank not in (0, 1, 2):
        raise ValueError(
            f"a growth factor must be a scalar, [chains] or [chains, 3], got {value.shape}"
        )
    value = tf.reshape(value, [1, 1]) if rank == 0 else value
    value = value[:, None] if rank == 1 else value
    return value[:, :, None, None, None]
