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


class HermitianPacking:
    """Orthonormal bijection between ``N`` reals and an exactly Hermitian half-spectrum.

    ``modes_from_real`` maps ``v`` (real, ``[..., n0, n1, n2]``, read as a flat
    vector of ``N = n0 n1 n2`` numbers) to complex modes ``[..., n0, n1, n2//2+1]``:

    * a bin with ``w_k = 2`` gets :math:`Z_k = (v_a + i v_b)/\\sqrt 2`;
    * a self-conjugate bin (``k = -k``; on a self-paired plane) gets :math:`Z_k = v_a`
      (real);
    * a conjugate pair ``(k, -k)`` inside a self-paired plane gets
      :math:`Z_k = (v_a + i v_b)/\\sqrt 2` and :math:`Z_{-k} = \\overline{Z_k}`.

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
        self.modes_shape = (*self.grid_shape[:-1], self.grid_shape[-1] // 2 + 1)
        self._build_tables()

    def _build_tables(self) -> None:
        shape, mshape = self.grid_shape, self.modes_shape
        n_last = shape[-1]
        n_modes = math.prod(mshape)
        idx = np.arange(n_modes).reshape(mshape)
        kz = np.broadcast_to(np.arange(mshape[-1]), mshape)
        plane = (kz == 0) | ((n_last % 2 == 0) & (kz == n_last // 2))
        # Flat index of the conjugate partner -k (same kz; full axes negated).
        neg = [(-np.arange(n)) % n for n in shape[:-1]]
        partner = idx[np.ix_(*neg, np.arange(mshape[-1]))] if neg else idx
        partner = np.where(plane, partner, idx)
        self_conj = plane & (partner == idx)
        is_rep = plane & (idx < partner)  # representative of a tied pair
        is_free = ~plane  # w = 2

        flat_partner = partner.reshape(-1)
        self_conj, is_rep, is_free = (a.reshape(-1) for a in (self_conj, is_rep, is_free))
        w = np.where(plane, 1.0, 2.0).reshape(-1)
        r2 = 1.0 / math.sqrt(2.0)
        # Each owner bin takes 1 (self-conjugate) or 2 (free / pair representative)
        # consecutive reals; the partner of a representative takes none.
        count = np.where(self_conj, 1, np.where(is_rep | is_free, 2, 0))
        offset = np.cumsum(count) - count
        if int(count.sum()) != math.prod(shape):
            raise AssertionError(f"packing counts {count.sum()} reals for {shape}")
        owner = np.where(count > 0, idx.reshape(-1), flat_partner)
        src_re = offset[owner]
        src_im = offset[owner] + 1
        c_re = np.where(self_conj, 1.0, r2)
        c_im = np.where(self_conj, 0.0, np.where(count > 0, r2, -r2))
        src_im = np.where(self_conj, 0, src_im)
        self._src_re, self._src_im = src_re.astype(np.int32), src_im.astype(np.int32)
        self._c_re, self._c_im = c_re, c_im
        self.mode_of_real = np.repeat(idx.reshape(-1), count)
        # Adjoint tables: v_j = sum over the (at most two) bins that read v_j.
        # Slot 0 is the owner bin, slot 1 the tied partner (coefficient 0 if none).
        owners = np.repeat(idx.reshape(-1), count)
        is_im = np.zeros(owners.shape, bool)
        is_im[1:] = owners[1:] == owners[:-1]
        partners = np.where(is_rep[owners], flat_partner[owners], owners)
        coef0 = np.where(is_im, w[owners] * c_im[owners], w[owners] * c_re[owners])
        coef1 = np.where(is_rep[owners], np.where(is_im, c_im[partners], c_re[partners]), 0.0)
        self._adj = [
            (owners.astype(np.int32), is_im, coef0),
            (partners.astype(np.int32), is_im, coef1),
        ]

    def _tables(self, dtype: tf.DType) -> dict[str, tf.Tensor]:
        # Built per call, never cached: a tensor cached while tracing one graph
        # cannot be used from another.
        t = {
            "src_re": tf.constant(self._src_re),
            "src_im": tf.constant(self._src_im),
            "c_re": tf.constant(self._c_re, dtype),
            "c_im": tf.constant(self._c_im, dtype),
        }
        for slot, (src, part, coef) in enumerate(self._adj):
            t[f"adj_src{slot}"] = tf.constant(src)
            t[f"adj_is_im{slot}"] = tf.constant(part)
            t[f"adj_coef{slot}"] = tf.constant(coef, dtype)
        return t

    def modes_from_real(self, v: tf.Tensor) -> tf.Tensor:
        """Pack reals ``[..., *grid_shape]`` into Hermitian modes ``[..., *modes_shape]``."""
        v = tf.convert_to_tensor(v)
        t = self._tables(v.dtype)
        nd = len(self.grid_shape)
        batch = tf.shape(v)[: tf.rank(v) - nd]
        flat = tf.reshape(v, tf.concat([batch, [-1]], 0))
        re = t["c_re"] * tf.gather(flat, t["src_re"], axis=-1)
        im = t["c_im"] * tf.gather(flat, t["src_im"], axis=-1)
        z = tf.complex(re, im)
        return tf.reshape(z, tf.concat([batch, self.modes_shape], 0))

    def real_from_modes(self, modes: tf.Tensor) -> tf.Tensor:
        """Unpack modes ``[..., *modes_shape]`` into reals ``[..., *grid_shape]``."""
        modes = tf.convert_to_tensor(modes)
        t = self._tables(modes.dtype.real_dtype)
        nd = len(self.grid_shape)
        batch = tf.shape(modes)[: tf.rank(modes) - nd]
        flat = tf.reshape(modes, tf.concat([batch, [-1]], 0))
        re, im = tf.math.real(flat), tf.math.imag(flat)
        v = 0.0
        for slot in range(2):
            src = t[f"adj_src{slot}"]
            part = tf.where(
                t[f"adj_is_im{slot}"], tf.gather(im, src, axis=-1), tf.gather(re, src, axis=-1)
            )
            v = v + t[f"adj_coef{slot}"] * part
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
