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
from fieldhmc.ops import rfft3d

__all__ = [
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
