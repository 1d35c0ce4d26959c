"""Isotropic power spectra with differentiable amplitude and slope hyperparameters.

Every spectrum is written as an amplitude, a tilt and a fixed shape,

.. math::

    P(k) = A \\left(\\frac{k}{k_p}\\right)^{n} \\frac{T(k)}{T(k_p)}, \\qquad
    P(0) = 0,

with the hyperparameters ``log_amplitude`` :math:`= \\ln A = \\ln P(k_p)`
(:math:`A` in (Mpc/h)^3) and ``index`` :math:`= n`, both unconstrained, and a
shape :math:`T` that has no free parameters: :math:`T = 1` for
:class:`PowerLaw`, a turnover (and optional cutoff) for
:class:`TurnoverPowerLaw`, a tabulated function for :class:`TabulatedPower`.
``k`` is in h/Mpc.

**The mean mode.** :math:`P(0) := 0` explicitly (not :math:`A \\cdot 0^n`): the
models fix the ``k = 0`` mode of the overdensity to zero, since the mean
overdensity of a periodic box is zero by definition. See
:class:`fieldhmc.models.FieldModel` for how its latent coordinate is treated.

Evaluating with Tensor hyperparameters of batch shape ``B`` returns ``B + k.shape``;
gradients with respect to the hyperparameters are finite everywhere (also at
``k = 0``).
"""

from __future__ import annotations

import abc
import math
import os

import numpy as np
import tensorflow as tf

__all__ = [
    "HYPERPARAMETER_NAMES",
    "PowerLaw",
    "PowerSpectrum",
    "TabulatedPower",
    "TurnoverPowerLaw",
]

#: Names of the power-spectrum hyperparameters, in the models' sampling order.
HYPERPARAMETER_NAMES: tuple[str, ...] = ("log_amplitude", "index")


def _positive(value: float, name: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value}")
    return value


def _finite(value: float, name: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


class PowerSpectrum(abc.ABC):
    """Base class: :math:`P(k) = A (k/k_p)^n T(k)/T(k_p)`, :math:`P(0) = 0`.

    Parameters
    ----------
    amplitude : float
        :math:`A = P(k_p) > 0`, (Mpc/h)^3. Fiducial value of ``exp(log_amplitude)``.
    index : float
        Fiducial tilt :math:`n`.
    k_pivot : float
        :math:`k_p > 0`, h/Mpc.

    Subclasses implement :meth:`_log_shape_np` and :meth:`_log_shape_tf`, the
    unnormalised :math:`\\ln T(k)` for :math:`k > 0`.
    """

    def __init__(self, amplitude: float, index: float, k_pivot: float):
        self.amplitude = _positive(amplitude, "amplitude")
        self.index = _finite(index, "index")
        self.k_pivot = _positive(k_pivot, "k_pivot")

    @property
    def log_amplitude(self) -> float:
        """Fiducial :math:`\\ln A`."""
        return math.log(self.amplitude)

    @property
    def fiducial(self) -> dict[str, float]:
        """Fiducial hyperparameters ``{"log_amplitude": ..., "index": ...}``."""
        return {"log_amplitude": self.log_amplitude, "index": self.index}

    @abc.abstractmethod
    def _log_shape_np(self, k: np.ndarray) -> np.ndarray:
        """Unnormalised :math:`\\ln T(k)`, NumPy float64, ``k > 0``."""

    @abc.abstractmethod
    def _log_shape_tf(self, k: tf.Tensor) -> tf.Tensor:
        """Unnormalised :math:`\\ln T(k)`, TensorFlow, ``k > 0``."""

    def log_shape(self, k: np.ndarray) -> np.ndarray:
        """:math:`\\ln[T(k)/T(k_p)]` (NumPy float64; 0 where ``k <= 0``)."""
        k = np.asarray(k, dtype=np.float64)
        safe = np.where(k > 0, k, self.k_pivot)
        out = self._log_shape_np(safe) - self._log_shape_np(np.asarray(self.k_pivot))
        return np.where(k > 0, out, 0.0)

    def numpy(self, k) -> np.ndarray:
        """Fiducial :math:`P(k)` in NumPy float64 (``P = 0`` where ``k = 0``)."""
        k = np.asarray(k, dtype=np.float64)
        if np.any(k < 0):
            raise ValueError("k must be non-negative")
        safe = np.where(k > 0, k, self.k_pivot)
        log_p = self.log_amplitude + self.index * np.log(safe / self.k_pivot)
        return np.where(k > 0, np.exp(log_p + self.log_shape(k)), 0.0)

    def __call__(
        self, k, log_amplitude=None, index=None, dtype: tf.DType | None = None
    ) -> tf.Tensor:
        """Evaluate :math:`P(k)` in TensorFlow with optional (batched) hyperparameters.

        Parameters
        ----------
        k : array-like or tf.Tensor
            Wavenumbers ``[...K]``, h/Mpc, ``k >= 0``. A NumPy ``k`` (the usual case:
            a :class:`Grid`'s ``kmag()``) makes the shape a constant computed in
            NumPy; a Tensor ``k`` is evaluated with TensorFlow ops.
        log_amplitude, index : float or tf.Tensor, optional
            Hyperparameters of batch shape ``B`` (broadcastable with each other);
            ``None`` means the fiducial value.
        dtype : tf.DType, optional
            Output dtype. Default: the hyperparameters' dtype if given, else float64.

        Returns
        -------
        tf.Tensor
            :math:`P(k)`, shape ``B + K``, (Mpc/h)^3; exactly 0 where ``k = 0``.
        """
        if dtype is None:
            given = [t for t in (log_amplitude, index) if tf.is_tensor(t)]
            dtype = given[0].dtype if given else tf.float64
        log_k_ratio, log_shape, is_pos = self._k_terms(k, dtype)
        return power_from_terms(log_k_ratio, log_shape, is_pos, self, log_amplitude, index)

    # --- the hooks a FieldModel evaluates P(k) on its grid through ---------------------
    #: Names of the sampleable parameters of this spectrum, in sampling order.
    parameter_names: tuple[str, ...] = HYPERPARAMETER_NAMES

    def grid_terms_np(self, kmag: np.ndarray) -> dict[str, np.ndarray]:
        """NumPy constants :meth:`grid_power` reads, for ``kmag`` (the grid's
        half-spectrum :math:`|k|`): ``log_k_ratio`` :math:`\\ln(k/k_p)` and
        ``log_shape`` (both float64, 0 at ``k = 0``)."""
        kmag = np.asarray(kmag, np.float64)
        is_pos = kmag > 0
        log_k_ratio = np.log(np.where(is_pos, kmag, self.k_pivot) / self.k_pivot)
        return {"log_k_ratio": log_k_ratio, "log_shape": self.log_shape(kmag)}

    def grid_power(self, terms, is_pos: tf.Tensor, hp) -> tf.Tensor:
        """float64 :math:`P(k)` on the grid, ``[*batch, *kmag.shape]``.

        Parameters
        ----------
        terms : mapping
            :meth:`grid_terms_np` as tensors (same keys; floats as float64).
        is_pos : tf.Tensor
            bool, ``k > 0``.
        hp : mapping
            Physical values of the sampled parameters (``[batch]``); the others take
            their fiducial values.
        """
        return power_from_terms(
            terms["log_k_ratio"],
            terms["log_shape"],
            is_pos,
            self,
            hp.get("log_amplitude"),
            hp.get("index"),
        )

    def log_power_derivatives_np(self, kmag: np.ndarray) -> dict[str, np.ndarray]:
        """:math:`\\partial \\ln P(k) / \\partial\\theta` at the fiducial values (NumPy
        float64, 0 at ``k = 0``), for each name of :attr:`parameter_names`."""
        terms = self.grid_terms_np(kmag)
        is_pos = np.asarray(kmag) > 0
        return {"log_amplitude": is_pos.astype(np.float64), "index": terms["log_k_ratio"]}

    def in_support(self, hp) -> tf.Tensor | None:
        """bool ``[batch]``: the sampled values ``hp`` are inside the parameters' physical
        domain, or ``None`` if every real value is allowed (the default)."""
        return None

    def _k_terms(self, k, dtype: tf.DType) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``ln(k/k_p)``, ``ln[T(k)/T(k_p)]`` (both 0 at k = 0) and ``k > 0``."""
        if not tf.is_tensor(k):
            k = np.asarray(k, dtype=np.float64)
            is_pos = k > 0
            safe = np.where(is_pos, k, self.k_pivot)
            return (
                tf.constant(np.log(safe / self.k_pivot), dtype),
                tf.constant(self.log_shape(k), dtype),
                tf.constant(is_pos),
            )
        k = tf.cast(k, dtype)
        is_pos = k > 0
        safe = tf.where(is_pos, k, tf.constant(self.k_pivot, dtype))
        pivot = tf.constant(self.k_pivot, dtype)
        log_shape = self._log_shape_tf(safe) - self._log_shape_tf(pivot)
        zero = tf.zeros([], dtype)
        return (
            tf.where(is_pos, tf.math.log(safe / pivot), zero),
            tf.where(is_pos, log_shape, zero),
            is_pos,
        )


def power_from_terms(
    log_k_ratio: tf.Tensor,
    log_shape: tf.Tensor,
    is_pos: tf.Tensor,
    power: PowerSpectrum,
    log_amplitude,
    index,
) -> tf.Tensor:
    """Assemble :math:`P = \\exp(\\ln A + n \\ln(k/k_p) + \\ln T)` with batched hyperparameters.

    Parameters
    ----------
    log_k_ratio, log_shape : tf.Tensor
        ``[...K]`` float, 0 where ``k = 0``.
    is_pos : tf.Tensor
        bool ``[...K]``, ``k > 0``.
    power : PowerSpectrum
        Supplies fiducial values for hyperparameters given as ``None``.
    log_amplitude, index : float, tf.Tensor or None
        Batch shape ``B``.

    Returns
    -------
    tf.Tensor
        ``B + K``, in the dtype of ``log_k_ratio``.
    """
    dtype = log_k_ratio.dtype
    k_rank = len(log_k_ratio.shape)

    def expand(value, fiducial):
        if value is None:
            return tf.constant(fiducial, dtype)
        value = tf.cast(value, dtype)
        return tf.reshape(value, tf.concat([tf.shape(value), tf.ones([k_rank], tf.int32)], 0))

    log_a = expand(log_amplitude, power.log_amplitude)
    n = expand(index, power.index)
    log_p = log_a + n * log_k_ratio + log_shape
    return tf.where(is_pos, tf.exp(log_p), tf.zeros([], dtype))


class PowerLaw(PowerSpectrum):
    """:math:`P(k) = A (k / k_p)^n`, :math:`P(0) = 0`.

    Parameters
    ----------
    amplitude : float
        :math:`A = P(k_p)`, (Mpc/h)^3.
    index : float
        Slope :math:`n`.
    k_pivot : float
        :math:`k_p`, h/Mpc.
    """

    def __init__(self, amplitude: float, index: float, k_pivot: float = 0.1):
        super().__init__(amplitude, index, k_pivot)

    def _log_shape_np(self, k):
        return np.zeros_like(np.asarray(k, dtype=np.float64))

    def _log_shape_tf(self, k):
        return tf.zeros_like(k)

    def __repr__(self) -> str:
        return (
            f"PowerLaw(amplitude={self.amplitude!r}, index={self.index!r}, "
            f"k_pivot={self.k_pivot!r})"
        )


class TurnoverPowerLaw(PowerSpectrum):
    """A power law that turns over at :math:`k_t`, with an optional Gaussian cutoff.

    .. math::

        P(k) = A \\left(\\frac{k}{k_p}\\right)^{n} \\frac{T(k)}{T(k_p)}, \\qquad
        T(k) = \\left[1 + (k/k_t)^2\\right]^{-\\gamma/2}
               \\exp\\left[-(k/k_c)^2\\right],

    so :math:`P \\propto k^n` for :math:`k \\ll k_t`, :math:`P \\propto k^{n-\\gamma}`
    for :math:`k_t \\ll k \\ll k_c`, and :math:`P(k_p) = A` exactly. With
    :math:`n = 1, \\gamma = 4` this mimics the CDM shape (Harrison-Zel'dovich on
    large scales, :math:`k^{-3}` on small ones).

    Parameters
    ----------
    amplitude : float
        :math:`A = P(k_p)`, (Mpc/h)^3.
    index : float
        Large-scale slope :math:`n` (the sampled ``index``).
    k_pivot : float
        :math:`k_p`, h/Mpc.
    k_turnover : float
        :math:`k_t > 0`, h/Mpc.
    turnover_index : float
        :math:`\\gamma` (fixed), the change of slope across the turnover.
    k_cutoff : float, optional
        :math:`k_c > 0`, h/Mpc; ``None`` for no cutoff.
    """

    def __init__(
        self,
        amplitude: float,
        index: float,
        k_pivot: float = 0.1,
        k_turnover: float = 0.02,
        turnover_index: float = 4.0,
        k_cutoff: float | None = None,
    ):
        super().__init__(amplitude, index, k_pivot)
        self.k_turnover = _positive(k_turnover, "k_turnover")
        self.turnover_index = _finite(turnover_index, "turnover_index")
        self.k_cutoff = None if k_cutoff is None else _positive(k_cutoff, "k_cutoff")

    def _log_shape_np(self, k):
        k = np.asarray(k, dtype=np.float64)
        out = -0.5 * self.turnover_index * np.log1p((k / self.k_turnover) ** 2)
        if self.k_cutoff is not None:
            out = out - (k / self.k_cutoff) ** 2
        return out

    def _log_shape_tf(self, k):
        kt = tf.constant(self.k_turnover, k.dtype)
        out = -0.5 * self.turnover_index * tf.math.log1p(tf.square(k / kt))
        if self.k_cutoff is not None:
            out = out - tf.square(k / tf.constant(self.k_cutoff, k.dtype))
        return out

    def __repr__(self) -> str:
        return (
            f"TurnoverPowerLaw(amplitude={self.amplitude!r}, index={self.index!r}, "
            f"k_pivot={self.k_pivot!r}, k_turnover={self.k_turnover!r}, "
            f"turnover_index={self.turnover_index!r}, k_cutoff={self.k_cutoff!r})"
        )


class TabulatedPower(PowerSpectrum):
    """A tabulated :math:`P(k)`, interpolated linearly in :math:`(\\ln k, \\ln P)`.

    .. math::

        P(k) = A \\left(\\frac{k}{k_p}\\right)^{n} \\frac{P_\\text{tab}(k)}{P_\\text{tab}(k_p)}

    with fiducial :math:`A = P_\\text{tab}(k_p)` and :math:`n = 0`, so the fiducial
    spectrum *is* the table; ``log_amplitude`` rescales it and ``index`` tilts it
    about :math:`k_p`. Outside the table the end segments are extended (power-law
    extrapolation).

    Parameters
    ----------
    k, power : array-like
        float ``[num_rows]``: strictly increasing :math:`k > 0` (h/Mpc) and
        :math:`P > 0` ((Mpc/h)^3), at least 2 rows.
    k_pivot : float, optional
        :math:`k_p`, h/Mpc. Default: the geometric mean of the table's ends.
    index : float
        Fiducial tilt (default 0).
    """

    def __init__(self, k, power, k_pivot: float | None = None, index: float = 0.0):
        k = np.asarray(k, dtype=np.float64)
        power = np.asarray(power, dtype=np.float64)
        if k.ndim != 1 or k.shape != power.shape or k.size < 2:
            raise ValueError(
                f"tabulated k and P(k) must be 1D of equal length >= 2, got {k.shape} "
                f"and {power.shape}"
            )
        if not (np.all(np.isfinite(k)) and np.all(np.isfinite(power))):
            raise ValueError("tabulated k and P(k) must be finite")
        if np.any(k <= 0):
            raise ValueError(f"tabulated k must be positive, got min k = {k.min()}")
        if np.any(power <= 0):
            row = int(np.argmax(power <= 0))
            raise ValueError(
                f"tabulated P(k) must be positive; row {row} has k = {k[row]}, P = {power[row]}"
            )
        if np.any(np.diff(k) <= 0):
            raise ValueError("tabulated k must be strictly increasing")
        self.k_table = k
        self.power_table = power
        self._log_k = np.log(k)
        self._log_p = np.log(power)
        if k_pivot is None:
            k_pivot = float(np.sqrt(k[0] * k[-1]))
        amplitude = float(np.exp(self._interp_np(np.log(_positive(k_pivot, "k_pivot")))))
        super().__init__(amplitude, index, k_pivot)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike, k_pivot: float | None = None, index: float = 0.0
    ) -> TabulatedPower:
        """Load a two-column text file ``k P(k)`` (h/Mpc, (Mpc/h)^3; ``#`` comments).

        Raises
        ------
        ValueError
            If the file does not hold two numeric columns or the values are invalid.
        """
        try:
            table = np.loadtxt(path, dtype=np.float64, ndmin=2)
        except ValueError as err:
            raise ValueError(f"cannot read a two-column k, P(k) table from {path}: {err}") from err
        if table.shape[1] != 2:
            raise ValueError(
                f"power spectrum file {path} must have 2 columns (k, P), got {table.shape[1]}"
            )
        return cls(table[:, 0], table[:, 1], k_pivot=k_pivot, index=index)

    def _interp_np(self, log_k: np.ndarray) -> np.ndarray:
        xs, ys = self._log_k, self._log_p
        i = np.clip(np.searchsorted(xs, log_k, side="right") - 1, 0, xs.size - 2)
        t = (log_k - xs[i]) / (xs[i + 1] - xs[i])
        return ys[i] + t * (ys[i + 1] - ys[i])

    def _log_shape_np(self, k):
        return self._interp_np(np.log(np.asarray(k, dtype=np.float64)))

    def _log_shape_tf(self, k):
        dtype = k.dtype
        xs = tf.constant(self._log_k, dtype)
        ys = tf.constant(self._log_p, dtype)
        log_k = tf.math.log(k)
        flat = tf.reshape(log_k, [1, -1])
        i = tf.searchsorted(xs[None, :], flat, side="right")[0] - 1
        i = tf.clip_by_value(i, 0, self._log_k.size - 2)
        x0, x1 = tf.gather(xs, i), tf.gather(xs, i + 1)
        y0, y1 = tf.gather(ys, i), tf.gather(ys, i + 1)
        out = y0 + (tf.reshape(log_k, [-1]) - x0) / (x1 - x0) * (y1 - y0)
        return tf.reshape(out, tf.shape(k))

    def __repr__(self) -> str:
        return (
            f"TabulatedPower(<{self.k_table.size} rows, k in [{self.k_table[0]:.3g}, "
            f"{self.k_table[-1]:.3g}]>, k_pivot={self.k_pivot!r}, index={self.index!r})"
        )
