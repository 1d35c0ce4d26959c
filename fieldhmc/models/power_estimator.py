"""Binned auto- and cross-power-spectrum estimators, in TensorFlow and NumPy.

**Convention.** A real field :math:`\\delta(x)` on ``N`` cells of a box of volume
``V`` has continuum Fourier modes :math:`\\delta_k \\approx (V/N)\\,F_k` with
:math:`F = \\mathrm{rfft3d}(\\delta)` (unnormalised, "backward"), and
:math:`P(k) = \\langle|\\delta_k|^2\\rangle / V`, i.e.
:math:`\\langle |F_k|^2 \\rangle = P(k)\\, N^2 / V`. The estimator of bin ``b`` is

.. math::

    \\hat P_b = \\frac{V}{N^2}
        \\frac{\\sum_{k \\in b} w_k\\, \\mathrm{Re}(F^a_k \\overline{F^b_k})}
              {\\sum_{k \\in b} w_k},

with the Hermitian weights :math:`w_k` (each stored half-spectrum bin stands for
:math:`w_k` modes of the full spectrum). It is unbiased:
:math:`E[\\hat P_b] = \\sum_b w_k P(k) / \\sum_b w_k` (:func:`expected_binned_power`),
and for a Gaussian field its cosmic variance is exactly
:math:`2 \\sum_b w_k P(k)^2 / (\\sum_b w_k)^2` (each full-spectrum mode carries
:math:`2P^2` — a free complex mode :math:`P^2` for each of the pair, a real
self-conjugate mode :math:`2P^2`).

References
----------
1. Feldman, Kaiser & Peacock (1994), "Power-spectrum analysis of three-dimensional
   redshift surveys", arXiv:astro-ph/9304022.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from fieldhmc.models.grid import Grid, KBins
from fieldhmc.ops import HermitianPacking, rfft3d

__all__ = [
    "PackedSpectrum",
    "PowerSpectrumEstimate",
    "expected_binned_power",
    "measure_cross_power",
    "measure_power",
    "measure_power_np",
    "power_of_modes",
]


class PowerSpectrumEstimate(NamedTuple):
    """A binned power spectrum.

    Attributes
    ----------
    k : np.ndarray
        float64 ``[num_bins]``, h/Mpc: mean :math:`|k|` of each bin.
    power : tf.Tensor or np.ndarray
        ``[..., num_bins]``, (Mpc/h)^3 (the field's dtype in TF, float64 in NumPy);
        NaN for an empty bin.
    num_modes : np.ndarray
        float64 ``[num_bins]``: :math:`\\sum w_k` per bin.
    """

    k: np.ndarray
    power: tf.Tensor | np.ndarray
    num_modes: np.ndarray


def _binned_sum(values: tf.Tensor, kbins: KBins) -> tf.Tensor:
    """Sum ``values[..., n0, n1, m]`` over each k-bin -> ``[..., num_bins]``."""
    nb = kbins.num_bins
    # Excluded modes go to an extra segment that is dropped (negative segment ids
    # are dropped on CPU but are not portable).
    ids = np.where(kbins.index >= 0, kbins.index, nb).reshape(-1)
    shape = tf.shape(values)
    batch = shape[:-3]
    flat = tf.reshape(values, tf.concat([[-1], [int(ids.size)]], 0))  # [B, M]
    with tf.init_scope():  # an eager input, not an embedded constant: see FieldModel._constants
        segment_ids = tf.constant(ids)
    sums = tf.math.unsorted_segment_sum(tf.transpose(flat), segment_ids, nb + 1)
    return tf.reshape(tf.transpose(sums[:nb]), tf.concat([batch, [nb]], 0))


def _measure(field_a, field_b, grid: Grid, kbins: KBins | None) -> PowerSpectrumEstimate:
    if kbins is None:
        kbins = grid.kbins()
    field_a = tf.convert_to_tensor(field_a)
    if not field_a.dtype.is_floating:
        raise ValueError(f"field must be a real float tensor, got {field_a.dtype}")
    if tuple(field_a.shape[-3:]) != grid.grid_shape:
        raise ValueError(
            f"field has shape {tuple(field_a.shape)}, expected [..., *{grid.grid_shape}]"
        )
    dtype = field_a.dtype
    fa = rfft3d(field_a)
    if field_b is None:
        return _binned_power(fa, grid, kbins)
    field_b = tf.convert_to_tensor(field_b, dtype)
    if tuple(field_b.shape[-3:]) != grid.grid_shape:
        raise ValueError(
            f"field_b has shape {tuple(field_b.shape)}, expected [..., *{grid.grid_shape}]"
        )
    fb = rfft3d(field_b)
    return _binned(tf.math.real(fa * tf.math.conj(fb)), grid, kbins)


def power_of_modes(modes, grid: Grid, kbins: KBins | None = None) -> PowerSpectrumEstimate:
    """:func:`measure_power` of the field whose ``rfft3d`` is ``modes`` (no transform).

    Parameters
    ----------
    modes : tf.Tensor
        Complex ``[..., n0, n1, n2 // 2 + 1]``, :math:`F = \\mathrm{rfft3d}(\\delta)`
        (unnormalised), Hermitian on the self-paired planes as ``rfft3d`` makes it, e.g.
        :meth:`~fieldhmc.models.FieldModel.modes_from_latents`.
    grid : Grid
    kbins : KBins, optional

    Returns
    -------
    PowerSpectrumEstimate
        As :func:`measure_power`, ``power`` in the modes' real dtype.
    """
    if kbins is None:
        kbins = grid.kbins()
    modes = tf.convert_to_tensor(modes)
    expected = (*grid.grid_shape[:2], grid.grid_shape[2] // 2 + 1)
    if not modes.dtype.is_complex or tuple(modes.shape[-3:]) != expected:
        raise ValueError(
            f"modes must be complex [..., *{expected}], got {modes.dtype.name} {tuple(modes.shape)}"
        )
    return _binned_power(modes, grid, kbins)


def _binned_power(fa, grid: Grid, kbins: KBins) -> PowerSpectrumEstimate:
    return _binned(tf.math.real(fa) ** 2 + tf.math.imag(fa) ** 2, grid, kbins)


def _binned(cross, grid: Grid, kbins: KBins) -> PowerSpectrumEstimate:
    """The estimator's normalised bin averages of ``cross`` ``[..., n0, n1, m]`` (real)."""
    dtype = cross.dtype
    weighted = cross * tf.constant(grid.hermitian_weights()[0, 0], dtype)  # [m], broadcasts
    sums = _binned_sum(weighted, kbins)
    norm = grid.volume / float(grid.num_cells) ** 2
    num = kbins.num_modes
    scale = np.where(num > 0, norm / np.maximum(num, 1.0), np.nan)
    return PowerSpectrumEstimate(kbins.k, sums * tf.constant(scale, dtype), num)


def measure_power(field, grid: Grid, kbins: KBins | None = None) -> PowerSpectrumEstimate:
    """Binned auto-power spectrum of real fields, in TensorFlow (batched, differentiable).

    .. math:: \\hat P_b = \\frac{V}{N^2} \\frac{\\sum_{k\\in b} w_k |F_k|^2}{\\sum_{k\\in b} w_k},
              \\qquad F = \\mathrm{rfft3d}(\\delta)

    Parameters
    ----------
    field : tf.Tensor or array-like
        Real float32/float64 ``[..., n0, n1, n2]`` (leading axes are batch, e.g.
        chains or draws), dimensionless overdensity.
    grid : Grid
        The box (for ``V``, ``N`` and the weights).
    kbins : KBins, optional
        Default ``grid.kbins()`` (fundamental spacing).

    Returns
    -------
    PowerSpectrumEstimate
        ``k`` (NumPy), ``power`` (Tensor ``[..., num_bins]``, (Mpc/h)^3, field dtype),
        ``num_modes`` (NumPy). Works under ``tf.function(jit_compile=True)``.
    """
    return _measure(field, None, grid, kbins)


def measure_cross_power(
    field_a, field_b, grid: Grid, kbins: KBins | None = None
) -> PowerSpectrumEstimate:
    """Binned cross-power spectrum :math:`\\hat P^{ab}_b` (TensorFlow, batched).

    .. math:: \\hat P^{ab}_b = \\frac{V}{N^2}
              \\frac{\\sum_{k\\in b} w_k \\mathrm{Re}(F^a_k \\overline{F^b_k})}{\\sum_{k\\in b} w_k}

    ``field_a`` and ``field_b`` are ``[..., n0, n1, n2]`` and broadcast against each
    other; see :func:`measure_power` for the rest.
    """
    return _measure(field_a, field_b, grid, kbins)


def measure_power_np(
    field, grid: Grid, kbins: KBins | None = None, field_b=None
) -> PowerSpectrumEstimate:
    """NumPy float64 version of :func:`measure_power` (and, with ``field_b``, the cross).

    Parameters
    ----------
    field : array-like
        Real ``[..., n0, n1, n2]``.
    grid : Grid
    kbins : KBins, optional
    field_b : array-like, optional
        Second field for a cross-spectrum.

    Returns
    -------
    PowerSpectrumEstimate
        All NumPy float64; ``power`` is ``[..., num_bins]``.
    """
    if kbins is None:
        kbins = grid.kbins()
    field = grid.check_field(field, "field", allow_batch=True)
    fa = np.fft.rfftn(field, axes=(-3, -2, -1))
    if field_b is None:
        cross = np.abs(fa) ** 2
    else:
        field_b = grid.check_field(field_b, "field_b", allow_batch=True)
        cross = np.real(fa * np.conj(np.fft.rfftn(field_b, axes=(-3, -2, -1))))
    weighted = cross * grid.hermitian_weights()
    batch = weighted.shape[:-3]
    flat = weighted.reshape((-1, int(np.prod(grid.modes_shape))))
    idx = kbins.index.reshape(-1)
    sel = idx >= 0
    sums = np.stack(
        [np.bincount(idx[sel], weights=row[sel], minlength=kbins.num_bins) for row in flat]
    )
    norm = grid.volume / float(grid.num_cells) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        power = np.where(kbins.num_modes > 0, sums * norm / kbins.num_modes, np.nan)
    return PowerSpectrumEstimate(kbins.k, power.reshape((*batch, kbins.num_bins)), kbins.num_modes)


def expected_binned_power(
    power_modes: np.ndarray, grid: Grid, kbins: KBins | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Expectation and Gaussian cosmic variance of :math:`\\hat P_b` for a given :math:`P(k)`.

    .. math::

        E[\\hat P_b] = \\frac{\\sum_{k \\in b} w_k P_k}{\\sum_{k \\in b} w_k}, \\qquad
        \\mathrm{Var}[\\hat P_b] = \\frac{2 \\sum_{k \\in b} w_k P_k^2}{(\\sum_{k \\in b} w_k)^2}.

    Parameters
    ----------
    power_modes : np.ndarray
        float ``[n0, n1, n2 // 2 + 1]``: :math:`P` on the half-spectrum, (Mpc/h)^3
        (e.g. ``power.numpy(grid.kmag())``).
    grid : Grid
    kbins : KBins, optional

    Returns
    -------
    mean, variance : np.ndarray
        float64 ``[num_bins]`` in (Mpc/h)^3 and (Mpc/h)^6 (NaN for empty bins).
    """
    if kbins is None:
        kbins = grid.kbins()
    power_modes = np.asarray(power_modes, dtype=np.float64)
    if power_modes.shape != grid.modes_shape:
        raise ValueError(f"power_modes has shape {power_modes.shape}, expected {grid.modes_shape}")
    w = grid.hermitian_weights()
    idx = kbins.index
    sel = idx >= 0
    s1 = np.bincount(idx[sel], weights=(w * power_modes)[sel], minlength=kbins.num_bins)
    s2 = np.bincount(idx[sel], weights=(w * power_modes**2)[sel], minlength=kbins.num_bins)
    num = kbins.num_modes
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(num > 0, s1 / num, np.nan)
        var = np.where(num > 0, 2.0 * s2 / num**2, np.nan)
    return mean, var


class PackedSpectrum:
    r"""Binned P(k) and chosen Fourier modes read from a field's *packed* modes.

    The packed modes of a field are the reals
    :math:`y = \mathrm{real\_from\_modes}(\mathrm{rfft3d}(\delta))`
    (:class:`~fieldhmc.ops.HermitianPacking`: ``N`` reals, each the real or imaginary
    part of one half-spectrum bin, with :math:`\sum_k w_k |F_k|^2 = |y|^2` bin by bin).
    So :math:`\hat P_b` is a weighted sum of :math:`y_j^2` over the reals of bin ``b``
    (one segment sum; no complex half-spectrum is made), and a mode is a combination of
    at most two reals. A model whose modes are a fixed per-coordinate scale of its latent
    (:meth:`~fieldhmc.models.FieldModel.packed_modes_scale`) gives ``y`` in one product:
    the sampler's per-draw P(k) and tracked modes then skip the packing of the modes,
    most of their cost (``benchmarks/README.md``).

    Parameters
    ----------
    grid : Grid
    kbins : KBins
    tracked : array of int, optional
        ``[T, 3]`` half-spectrum indices of the modes :meth:`tracked` returns.
    """

    def __init__(self, grid: Grid, kbins: KBins, tracked=None):
        self.grid, self.kbins = grid, kbins
        self.packing = HermitianPacking(grid.grid_shape)
        mode_of_real = self.packing.mode_of_real
        nb = kbins.num_bins
        index = kbins.index.reshape(-1)[mode_of_real]
        # Excluded reals (k = 0, out-of-range modes) go to an extra segment, dropped.
        self._segment = np.where(index >= 0, index, nb).astype(np.int32)
        scale = np.where(kbins.num_modes > 0, 1.0 / np.maximum(kbins.num_modes, 1.0), np.nan)
        self._bin_scale = scale * grid.volume / float(grid.num_cells) ** 2
        self.tracked_indices = np.zeros((0, 3), np.int64) if tracked is None else tracked
        self._tracked = self._tracked_coefficients(np.asarray(self.tracked_indices))

    def _tracked_coefficients(self, idx: np.ndarray):
        """Per tracked mode the (at most two) reals it is made of and their complex
        coefficients, read off two packings of indicator vectors (the map is local)."""
        if not len(idx):
            return None
        n0, n1, m = self.packing.modes_shape
        flat = (idx[:, 0] * n1 + idx[:, 1]) * m + idx[:, 2]
        # A bin on a self-paired plane that is not its pair's owner holds no real:
        # its reals are its partner's, (-k0, -k1, k2).
        partner = ((-idx[:, 0]) % n0 * n1 + (-idx[:, 1]) % n1) * m + idx[:, 2]
        mode_of_real = self.packing.mode_of_real
        reals = np.zeros((len(idx), 2), np.int64)
        count = np.zeros(len(idx), np.int64)
        for t, (k, p) in enumerate(zip(flat, partner, strict=True)):
            own = np.flatnonzero(mode_of_real == k)
            own = own if len(own) else np.flatnonzero(mode_of_real == p)
            reals[t, : len(own)] = own
            count[t] = len(own)
        probes = np.zeros((2, mode_of_real.size))
        probes[0, reals[:, 0]] = 1.0
        probes[1, reals[count == 2, 1]] = 1.0
        packed = self.packing.modes_from_real(
            tf.constant(probes.reshape(2, *self.grid.grid_shape), tf.float64)
        )
        at = np.asarray(tf.reshape(packed, [2, -1]).numpy())[:, flat]  # [2, T] complex
        at[1, count < 2] = 0.0
        return reals, at

    def of_field(self, field) -> tf.Tensor:
        """Packed modes ``[..., n0, n1, n2]`` of real fields ``[..., n0, n1, n2]``."""
        return self.packing.real_from_modes(rfft3d(tf.convert_to_tensor(field)))

    def power(self, y) -> tf.Tensor:
        r"""``[..., num_bins]`` binned :math:`\hat P_b` (as :func:`power_of_modes`) of
        packed modes ``y`` ``[..., n0, n1, n2]``, in ``y``'s dtype."""
        y = tf.convert_to_tensor(y)
        nd, nb = len(self.grid.grid_shape), self.kbins.num_bins
        batch = tf.shape(y)[: tf.rank(y) - nd]
        flat = tf.reshape(y * y, [-1, self._segment.size])
        with tf.init_scope():  # eager inputs, not embedded constants (FieldModel._constants)
            segment = tf.constant(self._segment)
            bin_scale = tf.constant(self._bin_scale, y.dtype)
        sums = tf.math.unsorted_segment_sum(tf.transpose(flat), segment, nb + 1)[:nb]
        return tf.reshape(tf.transpose(sums) * bin_scale, tf.concat([batch, [nb]], 0))

    def tracked(self, y) -> tf.Tensor:
        r"""``[..., T]`` complex: the tracked modes of :math:`\mathrm{rfft3d}(\delta)`."""
        y = tf.convert_to_tensor(y)
        reals, coef = self._tracked
        nd = len(self.grid.grid_shape)
        flat = tf.reshape(y, tf.concat([tf.shape(y)[: tf.rank(y) - nd], [-1]], 0))
        re = im = 0.0
        for j in range(2):
            part = tf.gather(flat, reals[:, j], axis=-1)
            re = re + part * tf.constant(coef[j].real, y.dtype)
            im = im + part * tf.constant(coef[j].imag, y.dtype)
        return tf.complex(re, im)
