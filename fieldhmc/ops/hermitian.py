"""Hermitian weights, Hermitian projection and the real <-> half-spectrum packing.

A real field of shape ``(n0, n1, n2)`` has a half-spectrum of shape
``(n0, n1, n2 // 2 + 1)`` (the last axis is the one ``rfft`` halves). Each stored
bin stands for itself and, unless it lies on a *self-paired plane*, also for its
conjugate partner at ``-k``. The self-paired planes are ``kz = 0`` and, when ``n2``
is even, ``kz = n2 / 2`` (the Nyquist plane). This gives the Hermitian weights

.. math::

    w_k = \\begin{cases} 1 & k_z = 0 \\text{ or } (n_2 \\text{ even and } k_z = n_2/2) \\\\
                         2 & \\text{otherwise,} \\end{cases}

so that Parseval's theorem reads :math:`\\sum_x f(x)^2 = \\frac{1}{N}\\sum_{k \\in
\\text{half}} w_k |F_k|^2` with :math:`N = n_0 n_1 n_2`. The parity of ``n2`` --
not the length of the half axis, which is the same for ``n2 = 2m`` and ``2m + 1``
-- decides whether the Nyquist plane exists.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

__all__ = [
    "HermitianPacking",
    "hermitian_project",
    "hermitian_weights",
    "modes_from_real",
    "real_from_modes",
]


def hermitian_weights(fft_length, dtype=tf.float32) -> tf.Tensor:
    """Hermitian weights of the last (halved) axis of a real FFT.

    Parameters
    ----------
    fft_length : int or int Tensor or sequence
        Length ``n`` of the last real axis (a sequence: its last entry). May be a
        dynamic tensor (forward-mode autodiff traces gradients with unknown
        values).
    dtype : tf.DType
        Output dtype.

    Returns
    -------
    tf.Tensor
        Shape ``[n // 2 + 1]``: 1 at ``k = 0`` and, for even ``n``, ``k = n / 2``;
        2 elsewhere. Broadcasts against a half-spectrum's last axis.
    """
    n = tf.convert_to_tensor(fft_length, dtype_hint=tf.int32)
    if n.shape.rank:
        n = n[-1]
    n = tf.cast(n, tf.int32)
    kz = tf.range(n // 2 + 1)
    is_self_paired = tf.logical_or(
        tf.equal(kz, 0), tf.logical_and(tf.equal(n % 2, 0), tf.equal(kz, n // 2))
    )
    return tf.where(is_self_paired, tf.ones([], dtype), 2 * tf.ones([], dtype))


def _conj_partner(z: tf.Tensor, axes: Sequence[int]) -> tf.Tensor:
    """``out[k] = conj(z[-k mod n])`` along ``axes``."""
    flipped = tf.reverse(z, axis=list(axes))
    return tf.math.conj(tf.roll(flipped, shift=[1] * len(axes), axis=list(axes)))


def hermitian_project(modes: tf.Tensor, fft_length, rank: int = 3) -> tf.Tensor:
    """Project the self-paired planes of a half-spectrum onto their Hermitian part.

    .. math:: H(G)_k = \\tfrac12 \\left(G_k + \\overline{G_{-k}}\\right)

    on the ``kz = 0`` plane and, for even ``n_last``, the Nyquist plane, where
    ``-k`` is taken modulo the full axes. Other bins are returned unchanged. On
    the CPU a complex-to-real inverse FFT reads only this Hermitian part, so the
    projection changes nothing there; a GPU c2r (cuFFT) *assumes* the symmetry
    instead of enforcing it, and needs it.

    Parameters
    ----------
    modes : tf.Tensor
        Complex ``[..., n0, ..., n_last // 2 + 1]`` over the last ``rank`` axes.
    fft_length : int Tensor or sequence
        The real lengths of the last ``rank`` axes (only the last is used).
    rank : int
        Number of transformed axes (1, 2 or 3).
    """
    full_axes = list(range(-rank, -1))
    static_n = tf.get_static_value(tf.convert_to_tensor(fft_length, dtype_hint=tf.int32))
    if static_n is not None:
        n_last = int(np.asarray(static_n).reshape(-1)[-1])
        m = n_last // 2 + 1
        planes = [0] + ([m - 1] if n_last % 2 == 0 and m > 1 else [])
        pieces, start = [], 0
        for p in planes:
            if p > start:
                pieces.append(modes[..., start:p])
            plane = modes[..., p : p + 1]
            pieces.append(0.5 * (plane + _conj_partner(plane, full_axes)))
            start = p + 1
        if start < m:
            pieces.append(modes[..., start:])
        return pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=-1)
    # Dynamic fft_length: select with a mask over the whole half-spectrum.
    projected = 0.5 * (modes + _conj_partner(modes, full_axes))
    is_self_paired = tf.equal(hermitian_weights(fft_length, tf.int32), 1)
    return tf.where(is_self_paired, projected, modes)


class _PlaneTables:
    """Packing of ``prod(shape)`` reals into one self-paired plane (all weights 1).

    Self-conjugate bins (``k = -k`` modulo ``shape``) take one real; each conjugate
    pair takes two, stored at its representative (the smaller flat index).
    """

    def __init__(self, shape: tuple[int, ...]):
        size = math.prod(shape)
        idx = np.arange(size).reshape(shape)
        neg = [(-np.arange(n)) % n for n in shape]
        partner = (idx[np.ix_(*neg)] if neg else idx).reshape(-1)
        idx = idx.reshape(-1)
        self_conj = partner == idx
        is_rep = idx < partner
        r2 = 1.0 / math.sqrt(2.0)
        count = np.where(self_conj, 1, np.where(is_rep, 2, 0))
        offset = np.cumsum(count) - count
        owner = np.where(count > 0, idx, partner)
        self.src_re = offset[owner].astype(np.int32)
        self.src_im = np.where(self_conj, 0, offset[owner] + 1).astype(np.int32)
        self.c_re = np.where(self_conj, 1.0, r2)
        self.c_im = np.where(self_conj, 0.0, np.where(count > 0, r2, -r2))
        # Real j -> owning bin; adjoint: v_j = coef0 * part(Z[owner]) + coef1 * part(Z[partner]).
        self.owner_of_real = np.repeat(idx, count)
        is_im = np.zeros(size, bool)
        is_im[1:] = self.owner_of_real[1:] == self.owner_of_real[:-1]
        owners = self.owner_of_real
        partners = np.where(is_rep[owners], partner[owners], owners)
        self.adj = [
            (owners.astype(np.int32), is_im, np.where(is_im, self.c_im[owners], self.c_re[owners])),
            (
                partners.astype(np.int32),
                is_im,
                np.where(
                    is_rep[owners], np.where(is_im, self.c_im[partners], self.c_re[partners]), 0.0
                ),
            ),
        ]

    def pack(self, flat: tf.Tensor) -> tf.Tensor:
        """``[B, size]`` reals -> ``[B, size]`` complex plane."""
        dtype = flat.dtype
        re = tf.constant(self.c_re, dtype) * tf.gather(flat, self.src_re, axis=-1)
        im = tf.constant(self.c_im, dtype) * tf.gather(flat, self.src_im, axis=-1)
        return tf.complex(re, im)

    def unpack(self, plane: tf.Tensor) -> tf.Tensor:
        """``[B, size]`` complex plane -> ``[B, size]`` reals (adjoint of :meth:`pack`)."""
        re, im = tf.math.real(plane), tf.math.imag(plane)
        out = 0.0
        for src, is_im, coef in self.adj:
            part = tf.where(is_im, tf.gather(im, src, axis=-1), tf.gather(re, src, axis=-1))
            out = out + tf.constant(coef, re.dtype) * part
        return out


class HermitianPacking:
    """Orthonormal bijection between ``N`` reals and an exactly Hermitian half-spectrum.

    ``modes_from_real`` maps ``v`` (real, ``[..., n0, n1, n2]``) to complex modes
    ``[..., n0, n1, n2//2+1]``. Along the last axis ``v`` is laid out as
    ``[plane0, re_1, im_1, re_2, im_2, ..., (nyquist)]``:

    * a bin with ``w_k = 2`` (``0 < kz < n2/2``) gets
      :math:`Z_k = (v_{2k_z - 1} + i v_{2k_z})/\\sqrt 2` -- strided slices, no gather;
    * the ``kz = 0`` plane is packed from column 0 and, for even ``n2``, the Nyquist
      plane from column ``n2 - 1``: a self-conjugate bin (``k = -k``) gets
      :math:`Z_k = v_a` (real), a conjugate pair ``(k, -k)`` gets
      :math:`Z_k = (v_a + i v_b)/\\sqrt 2` and :math:`Z_{-k} = \\overline{Z_k}` (gathers
      of plane size only).

    Hence a standard-normal ``v`` maps to complex white noise with
    :math:`E|Z_k|^2 = 1` on every bin, :math:`\\sum_k w_k |Z_k|^2 = |v|^2`, and
    ``irfft3d(modes_from_real(v), norm="ortho")`` is an orthogonal map of
    :math:`\\mathbb{R}^N`. Every real coordinate belongs to exactly one bin
    (``mode_of_real``), so a Fourier-diagonal metric is a *diagonal* metric on
    ``v`` and works with every HMC kernel.

    ``real_from_modes`` is the adjoint of ``modes_from_real`` under the weighted
    inner product :math:`\\langle Y, Z\\rangle = \\sum_k w_k \\mathrm{Re}(\\bar Y_k Z_k)`:
    the exact inverse on Hermitian input, the orthogonal projection onto the
    Hermitian subspace otherwise.

    Parameters
    ----------
    grid_shape : sequence of int
        ``(n0, n1, n2)`` (any rank 1-3 works; the last axis is halved).
    """

    def __init__(self, grid_shape: Sequence[int]):
        self.grid_shape = tuple(int(n) for n in grid_shape)
        if not self.grid_shape or any(n < 1 for n in self.grid_shape):
            raise ValueError(f"grid_shape must be positive integers, got {grid_shape}")
        n_last = self.grid_shape[-1]
        self.modes_shape = (*self.grid_shape[:-1], n_last // 2 + 1)
        self._plane_shape = self.grid_shape[:-1]
        self._plane = _PlaneTables(self._plane_shape)
        self._num_free = (n_last - 1) // 2  # bins with w = 2
        self._has_nyquist = n_last % 2 == 0 and n_last > 1
        self.mode_of_real = self._mode_of_real()

    def _mode_of_real(self) -> np.ndarray:
        """Flat half-spectrum bin index of every flat real coordinate of ``v``."""
        n_last, m = self.grid_shape[-1], self.modes_shape[-1]
        plane_size = math.prod(self._plane_shape)
        rows = np.arange(plane_size)
        # int32 while the modes fit (half the bytes: the model keeps this per coordinate)
        dtype = np.int32 if math.prod(self.modes_shape) < 2**31 else np.int64
        out = np.empty((plane_size, n_last), dtype)
        owner = self._plane.owner_of_real
        out[:, 0] = owner * m
        cols = np.arange(1, 2 * self._num_free + 1)
        out[:, cols] = rows[:, None] * m + (cols[None, :] + 1) // 2
        if self._has_nyquist:
            out[:, n_last - 1] = owner * m + (m - 1)
        return out.reshape(-1)

    def modes_from_real(self, v: tf.Tensor) -> tf.Tensor:
        r"""Pack reals ``[..., *grid_shape]`` into Hermitian modes ``[..., *modes_shape]``.

        Its gradient is the plain adjoint, :math:`\bar v = \mathrm{unpack}(\bar Z / w)`
        (:meth:`real_from_modes` is the adjoint under the *weighted* inner product),
        written as one gather/interleave of :math:`\bar Z` rather than TensorFlow's
        default of a padded buffer per strided slice and a scatter per gather: inside
        a compiled leapfrog loop, where the gradient has two consumers (the carried
        gradient and the momentum update), XLA kept those pads as three field-sized
        buffers per gradient (``benchmarks/scaling.py``).
        """

        @tf.custom_gradient
        def pack(v):
            def grad(dz):
                return self._unpack(dz, 1.0 / math.sqrt(2.0))

            return self._pack(v), grad

        return pack(tf.convert_to_tensor(v))

    def _pack(self, v: tf.Tensor) -> tf.Tensor:
        nd = len(self.grid_shape)
        batch = tf.shape(v)[: tf.rank(v) - nd]
        x = tf.reshape(v, [-1, math.prod(self._plane_shape), self.grid_shape[-1]])
        pieces = [self._plane.pack(x[..., 0])[..., None]]
        k = self._num_free
        if k:
            pairs = tf.reshape(x[..., 1 : 2 * k + 1], [-1, x.shape[1], k, 2])
            r2 = tf.constant(1.0 / math.sqrt(2.0), v.dtype)
            pieces.append(tf.complex(pairs[..., 0] * r2, pairs[..., 1] * r2))
        if self._has_nyquist:
            pieces.append(self._plane.pack(x[..., -1])[..., None])
        z = pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=-1)
        return tf.reshape(z, tf.concat([batch, self.modes_shape], 0))

    def real_from_modes(self, modes: tf.Tensor) -> tf.Tensor:
        """Unpack modes ``[..., *modes_shape]`` into reals ``[..., *grid_shape]``."""
        return self._unpack(tf.convert_to_tensor(modes), math.sqrt(2.0))

    def _unpack(self, modes: tf.Tensor, free_scale: float) -> tf.Tensor:
        r"""Unpack with the ``w = 2`` bins' real and imaginary parts times ``free_scale``:
        :math:`\sqrt 2` for :meth:`real_from_modes`, :math:`1/\sqrt 2` for the plain
        adjoint of :meth:`modes_from_real` (the planes' unpacking is their adjoint)."""
        nd = len(self.grid_shape)
        batch = tf.shape(modes)[: tf.rank(modes) - nd]
        z = tf.reshape(modes, [-1, math.prod(self._plane_shape), self.modes_shape[-1]])
        pieces = [self._plane.unpack(z[..., 0])[..., None]]
        k = self._num_free
        if k:
            free = z[..., 1 : k + 1]
            s2 = tf.constant(free_scale, free.dtype.real_dtype)
            pairs = tf.stack([tf.math.real(free) * s2, tf.math.imag(free) * s2], axis=-1)
            pieces.append(tf.reshape(pairs, [-1, z.shape[1], 2 * k]))
        if self._has_nyquist:
            pieces.append(self._plane.unpack(z[..., -1])[..., None])
        v = pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=-1)
        return tf.reshape(v, tf.concat([batch, self.grid_shape], 0))


@functools.lru_cache(maxsize=16)
def _packing(grid_shape: tuple[int, ...]) -> HermitianPacking:
    return HermitianPacking(grid_shape)


def modes_from_real(v: tf.Tensor, grid_shape: Sequence[int]) -> tf.Tensor:
    """Functional form of :meth:`HermitianPacking.modes_from_real`."""
    return _packing(tuple(int(n) for n in grid_shape)).modes_from_real(v)


def real_from_modes(modes: tf.Tensor, grid_shape: Sequence[int]) -> tf.Tensor:
    """Functional form of :meth:`HermitianPacking.real_from_modes`.

    ``grid_shape`` is needed because the half-spectrum length does not tell the
    parity of the last axis.
    """
    return _packing(tuple(int(n) for n in grid_shape)).real_from_modes(modes)
