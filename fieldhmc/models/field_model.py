"""Gaussian-random-field priors over Fourier modes, assembled into TFP joint distributions.

**Conventions** (``N = n0 n1 n2`` cells, box volume ``V``, see
:mod:`fieldhmc.models.power_estimator`): the continuum modes are
:math:`\\delta_k \\approx (V/N)\\,\\mathrm{rfft3d}(\\delta)_k` and
:math:`P(k) = \\langle|\\delta_k|^2\\rangle / V`. Write
:math:`s_k = P(k)\\, N / V`, the prior variance of a mode in the orthonormal
("ortho") Fourier basis, and :math:`Z = \\mathrm{pack}(x)` for
:meth:`fieldhmc.ops.HermitianPacking.modes_from_real` (orthonormal, exactly
Hermitian, :math:`E|Z_k|^2 = 1` for white :math:`x`). The latent ``"field"``
:math:`x` has the grid's shape ``[..., n0, n1, n2]`` and

* **non-centred**: :math:`x \\sim \\mathcal N(0, I)`,
  :math:`\\delta = \\mathrm{irfft3d}(\\sqrt{s_k}\\, Z_k, \\text{norm="ortho"})`;
* **centred**: :math:`x_j \\sim \\mathcal N(0, s_{k(j)})` (``k(j)`` =
  ``packing.mode_of_real[j]``), :math:`\\delta = \\mathrm{irfft3d}(Z_k,
  \\text{norm="ortho"})`.

* **conditional** (and **conditional_scale**): :math:`x \\approx \\mathcal N(0, I)` a
  posteriori; the modes are those of the conditional posterior of a linear,
  Fourier-diagonal surrogate of the likelihood evaluated at the current
  hyperparameters :math:`\\theta`,

  .. math::

      \\delta_k = \\mu_k(\\theta) + \\sqrt{w_k(\\theta)}\\, Z_k, \\qquad
      w_k = \\frac{s_k}{1 + s_k R_k^2 \\bar W}, \\qquad
      \\mu_k = w_k R_k \\tilde b_k,

  with :math:`R_k(\\theta)` the forward model's linear response
  (:meth:`_linear_response`), :math:`\\bar W` the mean noise precision per voxel
  (observed fraction over the noise variance) and :math:`\\tilde b =
  \\mathrm{rfft3d}(W_x d^{\\rm eff}_x, \\text{norm="ortho"})` the noise-weighted data
  of the likelihood's Gaussian approximation. ``conditional_scale`` drops the mean
  (:math:`\\mu = 0`, the scale-only form of [3]). The log-Jacobian is
  :math:`\\tfrac12 \\sum_j \\ln w_{k(j)}` over the real coordinates. For Gaussian
  noise of uniform :math:`\\sigma`, no mask and the identity forward model the
  ``conditional`` latent is exactly white given :math:`\\theta`: the posterior
  factorises into :math:`p(\\theta \\mid d)\\, \\mathcal N(x; 0, I)`. The latent is
  defined only given the data, so the target (:class:`PinnedTarget`) holds
  :math:`\\tilde b` and maps latents to fields.

Check: :math:`\\mathrm{rfft3d}(\\delta) = \\sqrt N\\,\\sqrt{s_k} Z_k`, so
:math:`\\langle|\\mathrm{rfft3d}(\\delta)_k|^2\\rangle = N s_k = P(k) N^2/V` as required.
The map :math:`x \\mapsto \\delta` is orthogonal up to the per-mode scale, and
the two parametrisations differ by :math:`x^{c}_j = \\sqrt{s_{k(j)}}\\, x^{nc}_j`, a
Jacobian :math:`\\tfrac12\\sum_j \\ln s_{k(j)}` (constant for fixed hyperparameters).

**The mean mode is fixed**: :math:`\\delta_{k=0} = 0` exactly (:math:`P(0) := 0`;
the overdensity of a periodic box has zero mean). Its one latent coordinate does
not enter :math:`\\delta` or the likelihood and keeps a standard-normal prior (also
in the centred case), so its posterior is :math:`\\mathcal N(0, 1)`.

**Hyperparameters**, the power spectrum's ``parameter_names`` (``log_amplitude`` and
``index``, see :mod:`fieldhmc.models.power`; ``Omega_m`` and ``sigma8`` for
:class:`~fieldhmc.models.cosmology.CosmologicalPower`), are sampled when given a prior
(any :class:`~fieldhmc.models.priors.ScalarPrior`), else fixed at the power spectrum's
fiducial values; outside their physical domain (``PowerSpectrum.in_support``) the
target's log density is :math:`-\\infty`. A subclass may add sampled scalar
parameters of its own (``param_priors``: a forward model's bias, growth, ...; see
:mod:`fieldhmc.models.priors`), sampled in an unconstrained coordinate :math:`u`
whose prior density includes the Jacobian of :math:`\theta = T(u)`. Latents are
ordered ``(*sampled P(k) hyperparameters, *sampled parameters, "field")`` (together
``hyper_names``) and may carry any leading batch (chain) shape; the scalars then have
shape ``[batch]``. Internally ``hp`` holds the physical values :math:`\theta`.

**Precision.** :meth:`FieldModel.target_log_prob_fn` computes per-voxel terms in
the latents' dtype and reduces them in float64, returning float64
(:mod:`fieldhmc.models.reduction`); :meth:`FieldModel.joint_distribution` is the
plain TFP model (reductions in the model dtype) used for sampling and as the
readable reference.

References
----------
1. Papaspiliopoulos, Roberts & Sköld (2007), "A general framework for the
   parametrization of hierarchical models", arXiv:0708.3797.
2. Jasche & Kitaura (2010), "Fast Hamiltonian sampling for large-scale structure
   inference", arXiv:0911.2493.
3. Simon-Onfroy, Lanusse & de Mattia (2025), "Benchmarking field-level cosmological
   inference from galaxy redshift surveys", arXiv:2504.20130.
"""

from __future__ import annotations

import abc
import copy
import math
from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from fieldhmc.models.grid import Grid
from fieldhmc.models.power import PowerSpectrum
from fieldhmc.models.priors import (
    NormalPrior,
    ScalarPrior,
    check_hyper_priors,
    check_param_priors,
)
from fieldhmc.models.reduction import reduce_sum_float64
from fieldhmc.models.wiener_solver import wiener_filter_mean
from fieldhmc.ops import HermitianPacking, irfft3d, rfft3d
from fieldhmc.seeds import as_stateless

tfd = tfp.distributions
Root = tfd.JointDistributionCoroutine.Root

__all__ = [
    "CONDITIONAL_PARAMETRIZATIONS",
    "INIT_KINDS",
    "PARAMETRIZATIONS",
    "FieldModel",
    "PinnedTarget",
    "RepinnableTarget",
]

#: Parametrisations of the prior alone (the latent has a data-free prior).
PARAMETRIZATIONS: tuple[str, ...] = ("noncentred", "centred")
#: Parametrisations whose latent is white a posteriori under a linear surrogate.
CONDITIONAL_PARAMETRIZATIONS: tuple[str, ...] = ("conditional", "conditional_scale")
INIT_KINDS: tuple[str, ...] = ("prior", "zeros", "wiener", "posterior")
_LOG_2PI = math.log(2.0 * math.pi)


class FieldModel(abc.ABC):
    """A Gaussian random field prior with a likelihood for gridded data.

    Subclasses add the likelihood; :class:`~fieldhmc.models.ForwardFieldModel` (the
    public extension point) does so with a forward model and a
    :class:`~fieldhmc.models.Likelihood`, and :class:`GaussianFieldModel` and
    :class:`LognormalPoissonModel` are instances of it. The interface the samplers use:

    * ``latent_names``, ``latent_event_shapes`` (tuples, aligned);
    * :meth:`joint_distribution`, :meth:`sample`, :meth:`posterior`;
    * :meth:`target_log_prob_fn` (float64, batched, XLA-compatible);
    * :meth:`field_from_latents`, :meth:`latents_from_field`;
    * :meth:`prior_precision_diag`, :meth:`posterior_precision_diag`;
    * :meth:`init_latents`.

    Parameters
    ----------
    grid : Grid
        The box.
    power : PowerSpectrum
        Prior power spectrum; its parameters are the fiducial hyperparameters.
    parametrization : {"noncentred", "centred", "conditional", "conditional_scale"}
        Meaning of the ``"field"`` latent (see the module docstring).
    hyper_priors : mapping, optional
        ``{"log_amplitude": NormalPrior(loc, scale), "index": ...}`` (or
        ``(loc, scale)`` tuples; any :class:`ScalarPrior`, keys among
        ``power.parameter_names``) for the hyperparameters to sample; the others are
        fixed at their fiducial values. Default: all fixed.
    param_priors : mapping, optional
        ``{name: ScalarPrior}`` of further sampled scalars (a forward model's
        parameters), in latent order after the P(k) hyperparameters; their fiducial
        values are the priors' (:attr:`ScalarPrior.fiducial`).
    dtype : tf.DType
        float32 (default) or float64: the dtype of latents, fields and data.

    Raises
    ------
    ValueError
        If the fiducial :math:`P(k)` is not positive and finite at every
        :math:`k > 0` of the grid (or underflows in ``dtype``), or for an unknown
        parametrization / hyperparameter.
    """

    #: True if the likelihood is Gaussian in :math:`\\delta` (Wiener filter exact).
    is_gaussian_likelihood: bool = False

    def __init__(
        self,
        grid: Grid,
        power: PowerSpectrum,
        *,
        parametrization: str = "noncentred",
        hyper_priors: Mapping[str, NormalPrior | tuple[float, float]] | None = None,
        param_priors: Mapping[str, ScalarPrior] | None = None,
        dtype: tf.DType = tf.float32,
    ):
        if not isinstance(grid, Grid):
            raise ValueError(f"grid must be a fieldhmc.models.Grid, got {type(grid).__name__}")
        if not isinstance(power, PowerSpectrum):
            raise ValueError(
                f"power must be a fieldhmc.models.PowerSpectrum, got {type(power).__name__}"
            )
        known = (*PARAMETRIZATIONS, *CONDITIONAL_PARAMETRIZATIONS)
        if parametrization not in known:
            raise ValueError(f"parametrization must be one of {known}, got {parametrization!r}")
        dtype = tf.as_dtype(dtype)
        if dtype not in (tf.float32, tf.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype.name}")
        self.grid = grid
        self.power = power
        self.parametrization = parametrization
        self.dtype = dtype
        power_priors = check_hyper_priors(hyper_priors, power.parameter_names)
        param_priors = check_param_priors(param_priors)
        clash = set(param_priors) & set(power.parameter_names)
        if clash:
            raise ValueError(
                f"sampled forward parameter(s) {sorted(clash)} clash with the power spectrum's "
                f"parameters {power.parameter_names}"
            )
        #: every sampled scalar's prior, in latent order
        self.hyper_priors: dict[str, ScalarPrior] = {**power_priors, **param_priors}
        #: the sampled P(k) hyperparameters (those that make P(k) vary)
        self.power_hyper_names: tuple[str, ...] = tuple(power_priors)
        #: the sampled non-P(k) parameters (a forward model's)
        self.param_names: tuple[str, ...] = tuple(param_priors)
        #: every sampled scalar: P(k) hyperparameters, then the parameters
        self.hyper_names: tuple[str, ...] = tuple(self.hyper_priors)
        self.latent_names: tuple[str, ...] = (*self.hyper_names, "field")
        self.latent_event_shapes: tuple[tuple[int, ...], ...] = (
            *(() for _ in self.hyper_names),
            grid.grid_shape,
        )
        self.fiducial: dict[str, float] = {
            **power.fiducial,
            **{name: prior.fiducial for name, prior in param_priors.items()},
        }
        self.packing = HermitianPacking(grid.grid_shape)

        kmag = grid.kmag()
        self._is_pos = kmag > 0
        self._mode_of_real = np.asarray(self.packing.mode_of_real, dtype=np.int32)
        self._is_mean_coordinate = (self._mode_of_real == 0).reshape(grid.grid_shape)
        self._check_power(kmag)

    # --- power spectrum on the grid --------------------------------------------------
    def _power_terms_np(self) -> dict[str, np.ndarray]:
        """The power spectrum's grid constants (:meth:`PowerSpectrum.grid_terms_np`; for a
        power law float64 ``log(k / k_pivot)`` and ``log_shape(k)`` on the half-spectrum),
        the inputs of :meth:`PowerSpectrum.grid_power`. Made on demand, not kept: only
        models with sampled hyperparameters read them in their density (two float64
        half-spectra, ~2 fields: 1 GiB at 512³)."""
        return self.power.grid_terms_np(self.grid.kmag())

    @staticmethod
    def _as_constants(terms: Mapping[str, np.ndarray]) -> dict[str, tf.Tensor]:
        """NumPy grid constants as tensors: floats as float64, integers as they are."""
        return {
            k: tf.constant(
                v, tf.float64 if np.issubdtype(np.asarray(v).dtype, np.floating) else None
            )
            for k, v in terms.items()
        }

    def _check_power(self, kmag: np.ndarray) -> None:
        p = self.power.numpy(kmag)
        s = p * self.grid.num_cells / self.grid.volume
        s_cast = s.astype(self.dtype.as_numpy_dtype)
        bad = self._is_pos & ~(np.isfinite(s_cast) & (s_cast > 0) & np.isfinite(p) & (p > 0))
        if bad.any():
            i = tuple(np.argwhere(bad)[0])
            raise ValueError(
                f"P(k) must be positive and finite for k > 0: P({kmag[i]:.4g} h/Mpc) = "
                f"{p[i]:.4g} (Mpc/h)^3 (N/V * P = {s[i]:.4g} in {self.dtype.name})"
            )

    def signal_variance_np(self) -> np.ndarray:
        """:math:`s_k = P(k) N / V` at the fiducial hyperparameters.

        Returns
        -------
        np.ndarray
            float64 ``[n0, n1, n2 // 2 + 1]``; 0 at ``k = 0``.
        """
        return self.power.numpy(self.grid.kmag()) * self.grid.num_cells / self.grid.volume

    def _latent_variance_np(self) -> np.ndarray:
        """Prior variance of each centred latent coordinate (1 for the mean mode)."""
        s_real = self.signal_variance_np().reshape(-1)[self._mode_of_real]
        return np.where(self._is_mean_coordinate.reshape(-1), 1.0, s_real).reshape(
            self.grid.grid_shape
        )

    def _constants(
        self, field_only: bool = False, power_terms: bool = False
    ) -> dict[str, tf.Tensor]:
        """Tensors of the grid/spectrum constants, made once per public call.

        Always made eagerly (``tf.init_scope``), also when called while a function is
        traced, so a ``tf.function`` captures them as inputs rather than embedding them
        as graph constants: XLA keeps an embedded constant resident about 7 times over
        (graph, HLO literal, executable; measured: 64 MiB -> 444 MiB). With
        ``field_only`` only what :meth:`field_from_latents` needs is made. The float64
        power terms of :meth:`_signal_variance` (``log_k_ratio``, ``log_shape``) are
        made where the density reads them (sampled hyperparameters), or on request
        (``power_terms``).
        """
        with tf.init_scope():  # eager even while a function is traced (docstring)
            sampled = bool(self.power_hyper_names)
            c: dict[str, tf.Tensor] = {"is_pos": tf.constant(self._is_pos)}
            if self.is_conditional:
                c.update(self._surrogate_constants())
                return c
            if power_terms or (
                sampled and (not field_only or self.parametrization == "noncentred")
            ):
                c.update(self._as_constants(self._power_terms_np()))
            if field_only:
                if not sampled and self.parametrization == "noncentred":
                    c["sqrt_s"] = tf.constant(np.sqrt(self.signal_variance_np()), self.dtype)
                return c
            if sampled:  # read by _latent_variance only (one int32 field)
                c["mode_of_real"] = tf.constant(self._mode_of_real)
                c["is_mean_coordinate"] = tf.constant(self._is_mean_coordinate)
            else:
                s = self.signal_variance_np()
                var = self._latent_variance_np()
                c["sqrt_s"] = tf.constant(np.sqrt(s), self.dtype)
                if self.parametrization == "centred":
                    c["inv_latent_variance"] = tf.constant(1.0 / var, tf.float64)
                c["log_latent_variance_sum"] = tf.constant(np.log(var).sum(), tf.float64)
                c["sigma2_delta"] = tf.constant(
                    (self.grid.hermitian_weights() * s).sum() / self.grid.num_cells, tf.float64
                )
            return c

    def _signal_variance(self, hp: Mapping[str, tf.Tensor], c) -> tf.Tensor:
        """float64 :math:`s_k` on the half-spectrum, ``[*hyper_batch, n0, n1, m]``."""
        p = self.power.grid_power(c, c["is_pos"], hp)
        return p * (self.grid.num_cells / self.grid.volume)

    def _sigma2_delta(self, hp: Mapping[str, tf.Tensor], c) -> tf.Tensor:
        """float64 prior variance of :math:`\\delta(x)`, ``[*hyper_batch]``.

        .. math:: \\sigma^2_\\delta = \\frac1V \\sum_{k\\,\\text{full}} P(k)
                  = \\frac1N \\sum_{k\\,\\text{half}} w_k s_k
        """
        if not self.power_hyper_names:
            return c["sigma2_delta"]
        s = self._signal_variance(hp, c)
        w = tf.constant(self.grid.hermitian_weights(), tf.float64)
        return tf.reduce_sum(w * s, axis=[-3, -2, -1]) / self.grid.num_cells

    def _latent_variance(self, hp, c) -> tf.Tensor:
        """float64 prior variance per centred latent coordinate, ``[*hyper_batch, *grid]``."""
        s = self._signal_variance(hp, c)
        batch = tf.shape(s)[:-3]
        flat = tf.reshape(s, tf.concat([batch, [-1]], 0))
        s_real = tf.gather(flat, c["mode_of_real"], axis=-1)
        s_real = tf.reshape(s_real, tf.concat([batch, self.grid.grid_shape], 0))
        return tf.where(c["is_mean_coordinate"], tf.ones([], tf.float64), s_real)

    # --- the conditional parametrisation's linear surrogate ---------------------------------
    @property
    def is_conditional(self) -> bool:
        """True for the ``conditional`` and ``conditional_scale`` parametrisations."""
        return self.parametrization in CONDITIONAL_PARAMETRIZATIONS

    @property
    def has_data_in_latent(self) -> bool:
        """True if the field latent's meaning depends on the data (``conditional``): then
        only a :class:`PinnedTarget` maps latents to fields."""
        return self.parametrization == "conditional"

    def _surrogate_constants(self) -> dict[str, tf.Tensor]:
        """Data-independent constants of the surrogate (called inside ``init_scope``)."""
        h = self.grid.hermitian_weights()
        sigma2_delta = (h * self.signal_variance_np()).sum() / self.grid.num_cells
        return {
            **self._as_constants(self._power_terms_np()),
            "sigma2_delta": tf.constant(sigma2_delta, tf.float64),  # fixed hyperparameters
            "hermitian_weights": tf.constant(h, self.dtype),
            "hermitian_weights64": tf.constant(h, tf.float64),
            "linear_gain": tf.constant(np.asarray(getattr(self, "linear_gain", 1.0)), tf.float64),
            "noise_precision": tf.constant(self._surrogate_noise_precision(), tf.float64),
        }

    def _surrogate_noise_precision(self) -> float:
        """:math:`\\bar W` of the surrogate: the Fisher information per voxel about the
        *prediction* (the forward model's response enters through :meth:`_linear_response`)."""
        return self.noise_precision_mean

    def _surrogate_weighted_data(self, data: np.ndarray) -> np.ndarray:
        """float64 ``grid_shape`` :math:`W_x d^{\\rm eff}_x` of the Gaussian approximation."""
        d_eff, weights = self._gaussian_approximation(data)
        return weights * d_eff

    def _surrogate_data_constants(self, data: np.ndarray) -> dict[str, tf.Tensor]:
        """``surrogate_re`` / ``surrogate_im``: :math:`\\tilde b = \\mathrm{rfft3d}(W d^{\\rm
        eff}, \\text{norm="ortho"})` in the model dtype (``conditional`` only; empty else)."""
        if self.parametrization != "conditional":
            return {}
        b = np.fft.rfftn(self._surrogate_weighted_data(data), norm="ortho")
        dtype = self.dtype
        return {
            "surrogate_re": tf.constant(b.real, dtype),
            "surrogate_im": tf.constant(b.imag, dtype),
        }

    def _data_constants(self, data: np.ndarray) -> dict[str, tf.Tensor]:
        """Everything the target reads from validated ``data``: the likelihood's
        constants and the surrogate's weighted data modes."""
        return {**self._likelihood_constants(data), **self._surrogate_data_constants(data)}

    def _linear_response(self, hp: Mapping[str, tf.Tensor], c) -> tf.Tensor:
        """float64 :math:`R_k(\\theta)`, broadcastable to ``[*batch, n0, n1, n2 // 2 + 1]``:
        the forward model's response to :math:`\\delta_k` at :math:`\\delta = 0` (1 for the
        identity). :class:`~fieldhmc.models.ForwardFieldModel` may make it depend on
        sampled forward-model parameters."""
        return c["linear_gain"]

    def _surrogate(self, hp, c) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """float64 ``(s, R, q)`` per mode, ``q = s R^2 \\bar W`` (all 0 at ``k = 0``):
        :math:`w = s / (1 + q)`, :math:`\\ln w - \\ln s = -\\ln(1 + q)`."""
        s = self._signal_variance(hp, c)
        r = self._linear_response(hp, c)
        q = s * tf.square(r) * c["noise_precision"]
        return s, r, q

    def _in_support(self, hp) -> tf.Tensor | None:
        """bool ``[batch]``: the sampled P(k) parameters are physical
        (:meth:`PowerSpectrum.in_support`), or ``None`` if every value is."""
        if not self.power_hyper_names:
            return None
        return self.power.in_support(hp)

    # --- latents -----------------------------------------------------------------------
    def _unpack(self, latents) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        if len(latents) != len(self.latent_names):
            raise ValueError(
                f"expected {len(self.latent_names)} latents {self.latent_names}, got {len(latents)}"
            )
        values = dict(zip(self.latent_names, latents, strict=True))
        field = tf.cast(tf.convert_to_tensor(values["field"]), self.dtype)
        hp = {name: self._physical(name, values[name]) for name in self.hyper_names}
        return field, hp

    def _physical(self, name: str, u) -> tf.Tensor:
        """The physical value :math:`\theta = T(u)` of sampled scalar ``name``'s latent."""
        return self.hyper_priors[name].physical(tf.convert_to_tensor(u))

    def _hyper_latents(self, latents) -> dict[str, tf.Tensor]:
        """The sampled scalars' latent (unconstrained) values, by name."""
        values = dict(zip(self.latent_names, latents, strict=True))
        return {name: tf.convert_to_tensor(values[name]) for name in self.hyper_names}

    def physical_parameters(self, latents: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """NumPy float64 physical values of the sampled scalars from their latents.

        Parameters
        ----------
        latents : mapping
            ``{name: array}`` for (at least) every name of ``hyper_names``, any shape.

        Returns
        -------
        dict
            ``{name: T(u)}`` for ``hyper_names`` in the latents' dtype (the arrays
            themselves for unbounded priors).
        """
        out = {}
        for name in self.hyper_names:
            u = np.asarray(latents[name])
            prior = self.hyper_priors[name]
            out[name] = prior.physical_np(u).astype(u.dtype) if prior.is_bounded else u
        return out

    def hyper_latent_scale(self, name: str) -> float:
        """Prior standard deviation of sampled scalar ``name``'s latent (a metric scale)."""
        return self.hyper_priors[name].latent_scale

    def _modes(self, field: tf.Tensor, hp, c, factor: float = 1.0, lc=None) -> tf.Tensor:
        """``factor`` times the orthonormal modes of :math:`\\delta`,
        ``[..., n0, n1, n2 // 2 + 1]`` complex: :math:`\\delta =
        \\mathrm{irfft3d}(\\text{modes}, \\text{norm="ortho"})` for ``factor`` 1, and
        ``modes == rfft3d(delta)`` (exactly Hermitian) for ``factor`` :math:`\\sqrt N`.
        ``lc`` (the data constants) is read by the ``conditional`` parametrisation."""
        modes = self.packing.modes_from_real(field)
        if self.is_conditional:
            return self._conditional_modes(modes, hp, c, factor, lc)
        if self.parametrization == "noncentred":
            if self.power_hyper_names:
                scale = tf.cast(tf.sqrt(self._signal_variance(hp, c)), self.dtype)
            else:
                scale = c["sqrt_s"]
        else:
            scale = tf.cast(c["is_pos"], self.dtype)
        scale = tf.convert_to_tensor(scale, self.dtype)
        if factor != 1.0:
            scale = scale * tf.constant(factor, self.dtype)
        # Real and imaginary parts times the real scale: the same numbers as a complex
        # product with (scale + 0i), but no complex copy of the scale exists. A constant
        # scale's complex copy (and its conjugate, in the gradient) is loop-invariant, so
        # XLA hoisted both out of the sampler's loop: two half-spectrum complex buffers
        # (~2 fields, whatever the number of chains) held through the whole chunk.
        # tf.complex, not tf.cast: the Cast gradient back to real logs a "discards the
        # imaginary part" warning at every trace (test_field_model pins this).
        return tf.complex(tf.math.real(modes) * scale, tf.math.imag(modes) * scale)

    def _conditional_modes(self, z: tf.Tensor, hp, c, factor: float, lc) -> tf.Tensor:
        """:math:`\\mu_k + \\sqrt{w_k} Z_k` times ``factor`` (``conditional`` parametrisations)."""
        s, r, q = self._surrogate(hp, c)
        f = tf.constant(factor, tf.float64)
        # sqrt(w) only where w > 0: at the mean mode (w = 0) sqrt's gradient is infinite,
        # and XLA turned its product with a zero upstream gradient into NaN for every
        # parameter R depends on (a sampled growth or bias)
        w = tf.where(c["is_pos"], s / (1.0 + q), tf.ones_like(s))
        root = tf.where(c["is_pos"], tf.sqrt(w), tf.zeros_like(w))
        scale = tf.cast(f * root, self.dtype)
        re, im = tf.math.real(z) * scale, tf.math.imag(z) * scale
        if self.parametrization == "conditional":
            if lc is None or "surrogate_re" not in lc:
                raise ValueError(
                    "the 'conditional' parametrisation maps latents to fields only given the "
                    "data: use the target's field_from_latents (FieldModel.target_log_prob_fn)"
                )
            coef = tf.cast(f * s * r / (1.0 + q), self.dtype)  # w R
            re = re + coef * lc["surrogate_re"]
            im = im + coef * lc["surrogate_im"]
        return tf.complex(re, im)

    def _delta(self, field: tf.Tensor, hp, c, lc=None) -> tf.Tensor:
        modes = self._modes(field, hp, c, lc=lc)
        return irfft3d(modes, fft_length=self.grid.grid_shape, norm="ortho")

    def _log_likelihood_of_field(self, field: tf.Tensor, hp, c, lc) -> tf.Tensor:
        """float64 ``[batch]`` log-likelihood of the latent ``field``: by default
        :meth:`_log_likelihood` of :math:`\\delta` (a subclass may skip the real-space
        field, see :class:`~fieldhmc.models.ForwardFieldModel`)."""
        return self._log_likelihood(self._delta(field, hp, c, lc), hp, c, lc)

    def _likelihood_makes_delta(self) -> bool:
        """:meth:`_log_likelihood_of_field` is :meth:`_log_likelihood` of
        :meth:`_delta` (this class's; not a subclass's own)."""
        return type(self)._log_likelihood_of_field is FieldModel._log_likelihood_of_field

    def field_from_latents(self, *latents) -> tf.Tensor:
        """The overdensity :math:`\\delta(x)` of latents (batch-aware).

        Parameters
        ----------
        *latents : tf.Tensor
            In ``latent_names`` order; ``field`` is ``[..., n0, n1, n2]``,
            hyperparameters ``[...]``.

        Returns
        -------
        tf.Tensor
            ``[..., n0, n1, n2]`` in the model dtype, dimensionless.
        """
        field, hp = self._unpack(latents)
        c = self._kept_field_only_constants()
        return self._delta(field, hp, c)  # 'conditional' raises: it needs the data

    def _kept_field_only_constants(self) -> dict:
        """``_constants(field_only=True)``, made once (eagerly, see _constants) and kept:
        the compiled chunk traces the field (and its modes) in its loop and again in a
        cond, and each trace would capture its own copy. As embedded constants they held
        13-16 fields at 256³ after the first chunk."""
        c = self.__dict__.get("_field_only_constants")
        if c is None:
            c = self._field_only_constants = self._constants(field_only=True)
        return c

    def modes_from_latents(self, *latents) -> tf.Tensor:
        """:math:`F = \\mathrm{rfft3d}(\\delta)` of :meth:`field_from_latents`, made in
        Fourier space without the field (no transform), ``[..., n0, n1, n2 // 2 + 1]``
        complex in the model dtype, Hermitian on the self-paired planes.

        What the sampler's per-draw P(k) and tracked modes read
        (:class:`~fieldhmc.samplers.FieldOutputs` ``modes_fn``): the same numbers as
        ``rfft3d(field_from_latents(...))`` up to rounding, one FFT pair cheaper.
        """
        field, hp = self._unpack(latents)
        c = self._kept_field_only_constants()
        return self._modes(field, hp, c, factor=math.sqrt(self.grid.num_cells))

    def packed_modes_scale(self) -> tf.Tensor | None:
        r"""The per-coordinate scale ``a`` with ``packed modes = a * field latent``, or None.

        The packed modes are :math:`y = \mathrm{real\_from\_modes}(F)` of
        :meth:`modes_from_latents`' :math:`F`
        (:class:`~fieldhmc.models.PackedSpectrum`). When no scalar is sampled and the
        parametrisation needs no data, :math:`F` is a fixed real scale of each packed
        latent's bin, so ``y`` is the latent times ``a`` (``[n0, n1, n2]``, model
        dtype, made once and kept): the sampler's per-draw P(k) and tracked modes then
        cost a product and a segment sum. None when the map moves with the parameters
        or needs the data (the ``conditional`` mean)."""
        if self.hyper_names or self.has_data_in_latent:
            return None
        if "_packed_modes_scale" not in self.__dict__:
            c = self._kept_field_only_constants()
            factor = math.sqrt(self.grid.num_cells)
            with tf.init_scope():  # an eager input of the traces, see _constants
                ones = tf.ones(self.grid.grid_shape, self.dtype)
                scale = self.packing.real_from_modes(self._modes(ones, {}, c, factor))
                offset = self._modes(tf.zeros_like(ones), {}, c, factor)
                linear = not np.any(np.abs(offset.numpy()) > 0)
            self._packed_modes_scale = scale if linear else None
        return self._packed_modes_scale

    def latents_from_field(self, delta, *, data=None, **hyperparameters) -> tf.Tensor:
        """The ``"field"`` latent that maps to :math:`\\delta` (its mean-mode coordinate 0).

        Parameters
        ----------
        delta : array-like
            ``[..., n0, n1, n2]``; its mean is discarded.
        data : array-like, optional
            Observed data (validated here); needed by the ``conditional``
            parametrisation, whose latent is measured from the surrogate's mean.
        **hyperparameters : float or tf.Tensor
            Values of sampled hyperparameters (default fiducial), batch-broadcastable.

        Returns
        -------
        tf.Tensor
            ``[..., n0, n1, n2]`` in the model dtype.
        """
        delta = tf.cast(tf.convert_to_tensor(delta), self.dtype)
        c = self._constants(power_terms=True)
        modes = rfft3d(delta, norm="ortho")
        if self.is_conditional:
            hp = {n: hyperparameters[n] for n in self.hyper_names if n in hyperparameters}
            hp = {n: tf.convert_to_tensor(v, self.dtype) for n, v in hp.items()}
            lc = None
            if self.parametrization == "conditional":
                if data is None:
                    raise ValueError(
                        "latents_from_field needs data for the 'conditional' parametrisation"
                    )
                lc = self._surrogate_data_constants(self._check_data(data))
            # delta = mu + sqrt(w) Z: Z = (modes - mu) / sqrt(w), the mean mode 0
            zero = tf.zeros_like(tf.math.real(modes))
            mu_modes = self._conditional_modes(tf.complex(zero, zero), hp, c, 1.0, lc)
            s, _, q = self._surrogate(hp, c)
            inv = tf.where(c["is_pos"], tf.sqrt((1.0 + q) / tf.where(c["is_pos"], s, 1.0)), 0.0)
            inv = tf.cast(inv, self.dtype)
            diff = modes - mu_modes
            modes = tf.complex(tf.math.real(diff) * inv, tf.math.imag(diff) * inv)
        elif self.parametrization == "noncentred":
            hp = {n: hyperparameters.get(n) for n in self.hyper_names}
            hp = {n: v for n, v in hp.items() if v is not None}
            s = self._signal_variance(hp, c)
            inv = tf.where(c["is_pos"], tf.math.rsqrt(tf.where(c["is_pos"], s, 1.0)), 0.0)
            modes = modes * tf.cast(tf.cast(inv, self.dtype), modes.dtype)
        else:
            modes = modes * tf.cast(tf.cast(c["is_pos"], self.dtype), modes.dtype)
        return self.packing.real_from_modes(modes)

    # --- densities -----------------------------------------------------------------------
    def _log_prior_hypers(self, u) -> tf.Tensor:
        """float64 log prior density of the sampled scalars' **latent** values ``u``
        (``{name: tensor}``, see :meth:`_hyper_latents`), Jacobians included. For a
        Normal prior (every P(k) hyperparameter) latent and physical values coincide."""
        total = tf.zeros([], tf.float64)
        for name in self.hyper_names:
            prior = self.hyper_priors[name]
            if isinstance(prior, NormalPrior):  # as it always was: the same bits
                z = (tf.cast(u[name], tf.float64) - prior.loc) / prior.scale
                total = total - 0.5 * z * z - (math.log(prior.scale) + 0.5 * _LOG_2PI)
            else:
                total = total + prior.log_prob_latent(u[name])
        return total

    def _log_prior_field(self, field: tf.Tensor, hp, c, lc=None) -> tf.Tensor:
        n = self.grid.num_cells
        if self.is_conditional:
            return self._log_prior_conditional(field, hp, c, lc) - 0.5 * n * _LOG_2PI
        if self.parametrization == "noncentred":
            # float32 squares, float64 (blocked) sum: see fieldhmc.models.reduction
            return -0.5 * reduce_sum_float64(tf.square(field)) - 0.5 * n * _LOG_2PI
        x2 = tf.square(tf.cast(field, tf.float64))
        if self.power_hyper_names:
            var = self._latent_variance(hp, c)
            quad = reduce_sum_float64(x2 / var)
            log_det = tf.reduce_sum(tf.math.log(var), axis=[-3, -2, -1])
        else:
            quad = reduce_sum_float64(x2 * c["inv_latent_variance"])
            log_det = c["log_latent_variance_sum"]
        return -0.5 * quad - 0.5 * log_det - 0.5 * n * _LOG_2PI

    def _log_prior_conditional(self, field: tf.Tensor, hp, c, lc) -> tf.Tensor:
        """:math:`\\ln p(x \\mid \\theta) + \\tfrac12 N \\ln 2\\pi` of a ``conditional`` latent.

        The prior of :math:`\\delta` with the Jacobian of :math:`x \\mapsto \\delta`, over
        the half-spectrum with Hermitian weights :math:`h_k` (the number of real
        coordinates of each bin, :math:`\\sum_k h_k |Z_k|^2 = |x|^2`):

        .. math::

            -\\frac12 \\sum_k h_k \\frac{|\\mu_k + \\sqrt{w_k} Z_k|^2}{s_k}
            + \\frac12 \\sum_{k \\neq 0} h_k \\ln\\frac{w_k}{s_k}, \\qquad
            \\frac{\\mu_k + \\sqrt{w_k} Z_k}{\\sqrt{s_k}}
            = \\frac{\\sqrt{s_k} R_k \\tilde b_k}{1 + q_k} + \\frac{Z_k}{\\sqrt{1 + q_k}},

        the mean mode's term being :math:`-\\tfrac12 Z_0^2` (its coordinate keeps a
        standard-normal prior). Terms in the model dtype, sums in float64.
        """
        z = self.packing.modes_from_real(field)
        s, r, q = self._surrogate(hp, c)
        a = tf.cast(tf.math.rsqrt(1.0 + q), self.dtype)
        re, im = tf.math.real(z) * a, tf.math.imag(z) * a
        if self.parametrization == "conditional":
            # sqrt(s) where s > 0 only (see _conditional_modes: sqrt's gradient at 0)
            root_s = tf.where(c["is_pos"], tf.sqrt(tf.where(c["is_pos"], s, 1.0)), 0.0)
            coef = tf.cast(root_s * r / (1.0 + q), self.dtype)
            re = re + coef * lc["surrogate_re"]
            im = im + coef * lc["surrogate_im"]
        quad = reduce_sum_float64(c["hermitian_weights"] * (tf.square(re) + tf.square(im)))
        log_det = tf.reduce_sum(c["hermitian_weights64"] * tf.math.log1p(q), axis=[-3, -2, -1])
        return -0.5 * quad - 0.5 * log_det

    @abc.abstractmethod
    def _check_data(self, data) -> np.ndarray:
        """Validate observed data; return float64 ``[n0, n1, n2]``."""

    @abc.abstractmethod
    def _likelihood_constants(self, data: np.ndarray) -> dict[str, tf.Tensor]:
        """Tensors the log-likelihood needs for these data."""

    @abc.abstractmethod
    def _log_likelihood(self, delta: tf.Tensor, hp, c, lc) -> tf.Tensor:
        """float64 ``[batch]`` log-likelihood, reduced in float64."""

    @abc.abstractmethod
    def _data_distribution(self, delta: tf.Tensor, hp, c) -> tfd.Distribution:
        """The TFP distribution of ``"data"`` given :math:`\\delta`, event = grid."""

    @property
    @abc.abstractmethod
    def noise_precision_mean(self) -> float:
        """Effective mean noise precision per voxel, e.g. ``mean(mask / sigma**2)``."""

    @abc.abstractmethod
    def _gaussian_approximation(self, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gaussian approximation of the likelihood, ``(d_eff, weights)``.

        :math:`d_{eff} \\sim \\mathcal N(\\delta, W^{-1})` with ``W = weights`` per voxel.
        """

    def check_data(self, data) -> np.ndarray:
        """Validate ``data`` and return it as float64 ``[n0, n1, n2]``.

        Raises
        ------
        ValueError
            Wrong shape, NaN/Inf, or values outside the likelihood's support.
        """
        return self._check_data(data)

    def target_log_prob_fn(self, data) -> Callable[..., tf.Tensor]:
        """The unnormalised posterior log density, pinned to ``data``.

        .. math:: \\ln p(\\theta) + \\ln p(x \\mid \\theta) + \\ln p(d \\mid \\delta(x, \\theta))

        including every normalisation constant, so it equals
        ``joint_distribution().log_prob`` of the latents and data (to rounding).

        Parameters
        ----------
        data : array-like
            Concrete observed data ``[n0, n1, n2]`` (validated once, here).

        Returns
        -------
        PinnedTarget
            ``target_log_prob_fn(*latents) -> tf.Tensor`` float64 ``[batch]``, latents in
            ``latent_names`` order with a common leading batch (chain) shape. Terms are
            computed in the latents' dtype and **reduced in float64, and the result is
            float64 even for float32 latents** (the sampler subtracts a per-chain
            reference before casting down). Works eagerly, in ``tf.function`` and with
            ``jit_compile=True``; gradients are finite. Its ``field_from_latents`` maps
            latents to :math:`\\delta` given these data (the ``conditional``
            parametrisation needs them).
        """
        return PinnedTarget(self, data)

    def log_likelihood_fn(self, data) -> Callable[..., tf.Tensor]:
        """Log likelihood :math:`\\ln p(d \\mid \\delta, \\theta)` of fields, pinned to ``data``.

        Parameters
        ----------
        data : array-like
            Concrete observed data ``[n0, n1, n2]`` (validated once, here).

        Returns
        -------
        callable
            ``log_likelihood_fn(delta, **hyperparameters) -> tf.Tensor`` float64
            ``[batch]`` for overdensities ``delta`` ``[batch, n0, n1, n2]`` (model dtype)
            and every sampled scalar as a ``[batch]`` tensor of **physical** values
            (P(k) hyperparameters enter the lognormal-Poisson rate, forward parameters
            the prediction; see :meth:`physical_parameters` for the latents' values). With every
            normalisation constant, as in :meth:`target_log_prob_fn`.
        """
        lc = self._likelihood_constants(self._check_data(data))
        c = self._constants()

        def log_likelihood_fn(delta, **hyperparameters):
            missing = set(self.hyper_names) - set(hyperparameters)
            if missing:
                raise ValueError(f"log_likelihood_fn needs the hyperparameters {sorted(missing)}")
            hp = {n: tf.convert_to_tensor(hyperparameters[n], self.dtype) for n in self.hyper_names}
            return self._log_likelihood(tf.convert_to_tensor(delta, self.dtype), hp, c, lc)

        return log_likelihood_fn

    def repinnable_target_log_prob_fn(self, data) -> RepinnableTarget:
        """Like :meth:`target_log_prob_fn`, but the data can be replaced without retracing.

        The data-dependent constants live in (non-trainable) ``tf.Variable``s that a
        compiled sampler reads at every call, so one compiled sampler serves many data
        sets of the same shape (simulation-based calibration runs hundreds).

        Returns
        -------
        RepinnableTarget
            Callable like :meth:`target_log_prob_fn`'s result; ``.pin(data)`` swaps the
            data in place.
        """
        return RepinnableTarget(self, data)

    # --- TFP model -------------------------------------------------------------------------
    def _hyper_prior_distribution(self, name: str) -> tfd.Distribution:
        """The prior of sampled scalar ``name``'s latent (unconstrained) coordinate."""
        return self.hyper_priors[name].latent_distribution(self.dtype, name)

    def _field_prior_distribution(self, hp, c) -> tfd.Distribution:
        # conditional: N(0, I) is the latent's surrogate *posterior* (initial states)
        if self.parametrization != "centred":
            return tfd.Sample(
                tfd.Normal(tf.zeros([], self.dtype), tf.ones([], self.dtype)),
                self.grid.grid_shape,
                name="field",
            )
        if self.power_hyper_names:
            var = self._latent_variance(hp, c)
        else:
            var = tf.constant(self._latent_variance_np(), tf.float64)
        scale = tf.cast(tf.sqrt(var), self.dtype)
        return tfd.Independent(
            tfd.Normal(tf.zeros([], self.dtype), scale), reinterpreted_batch_ndims=3, name="field"
        )

    def joint_distribution(self) -> tfd.JointDistributionCoroutine:
        """The generative model as a :class:`tfd.JointDistributionCoroutine`.

        Variables, in order: the sampled hyperparameters (Normal priors), ``"field"``
        (event ``grid_shape``) and ``"data"`` (event ``grid_shape``). ``sample(n)``
        gives every variable a leading ``[n]``; ``log_prob`` accepts latents with a
        leading batch shape and returns ``[batch]`` (reduced in the model dtype; use
        :meth:`target_log_prob_fn` for float64).

        Not auto-batched: every distribution is written batch-aware (the FFTs and
        gathers act on leading axes), which is cheaper than TFP's ``vectorized_map``.
        Root distributions (the hyperparameters, and ``"field"`` when it does not
        depend on them) take the sample shape; the others inherit it as batch shape.

        Raises
        ------
        ValueError
            For the ``conditional`` parametrisations, whose latent has no prior without
            the data (:meth:`sample` draws through the non-centred model).
        """
        if self.is_conditional:
            raise ValueError(
                f"the {self.parametrization!r} parametrisation has no joint distribution (its "
                "field latent is defined given the data); use target_log_prob_fn(data)"
            )
        c = self._constants()
        is_field_root = self.parametrization == "noncentred" or not self.power_hyper_names

        def model():
            hp = {}
            for name in self.hyper_names:
                u = yield Root(self._hyper_prior_distribution(name))
                hp[name] = self._physical(name, u)
            field_dist = self._field_prior_distribution(hp, c)
            field = yield (Root(field_dist) if is_field_root else field_dist)
            delta = self._delta(field, hp, c)
            yield self._data_distribution(delta, hp, c)

        return tfd.JointDistributionCoroutine(model, name=type(self).__name__)

    def posterior(self, data) -> tfd.JointDistribution:
        """The joint distribution pinned to validated ``data`` (``experimental_pin``)."""
        data = tf.constant(self._check_data(data), self.dtype)
        return self.joint_distribution().experimental_pin(data=data)

    def sample(self, seed, sample_shape=()) -> dict[str, tf.Tensor]:
        """Draw synthetic truth and data.

        Parameters
        ----------
        seed : int or int Tensor of shape [2]
            Stateless seed (an int gives the same draw on every call).
        sample_shape : int or tuple
            Leading shape of every output.

        Returns
        -------
        dict
            The latents (``latent_names``), ``"delta"`` (the true overdensity,
            ``[*sample_shape, *grid_shape]``) and ``"data"``.
        """
        seed = as_stateless(seed)
        if self.is_conditional:
            return self._sample_conditional(seed, sample_shape)
        draw = self.joint_distribution().sample(sample_shape, seed=seed)
        out = dict(draw._asdict())
        out["delta"] = self.field_from_latents(*(out[n] for n in self.latent_names))
        return out

    def _noncentred_twin(self) -> FieldModel:
        """This model written non-centred (the same generative model, a data-free latent)."""
        return self._twin("noncentred")

    def _twin(self, parametrization: str) -> FieldModel:
        """This model written in another parametrisation (the same generative model)."""
        twin = copy.copy(self)
        twin.parametrization = parametrization
        for kept in ("_field_only_constants", "_packed_modes_scale"):
            twin.__dict__.pop(kept, None)
        return twin

    def _surrogate_posterior_field(self, z: tf.Tensor, hyper_latents: dict, data) -> tf.Tensor:
        """This parametrisation's ``"field"`` latent of :math:`\\delta = \\mu + \\sqrt{w}
        Z`, the linear surrogate's conditional posterior at the hyperparameters'
        ``hyper_latents`` (``[chains]`` each) driven by the white noise ``z``."""
        if self.parametrization == "conditional":
            return z
        twin = self._twin("conditional")
        latents = [z if n == "field" else hyper_latents[n] for n in twin.latent_names]
        delta = PinnedTarget(twin, data).field_from_latents(*latents)
        hp = {n: self._physical(n, hyper_latents[n]) for n in self.hyper_names}
        return self.latents_from_field(delta, data=data, **hp)

    def _sample_conditional(self, seed, sample_shape) -> dict[str, tf.Tensor]:
        """:meth:`sample` of a ``conditional`` model: the draw of the same model written
        non-centred, its ``"field"`` latent mapped to this parametrisation's (given each
        draw's data and hyperparameters)."""
        out = self._noncentred_twin().sample(seed, sample_shape)
        # physical values (the draw holds the sampled scalars' unconstrained latents)
        hp = self.physical_parameters({n: np.asarray(out[n]) for n in self.hyper_names})
        if self.parametrization == "conditional":
            data = np.asarray(out["data"], np.float64)
            delta = np.asarray(out["delta"])
            flat = data.reshape(-1, *self.grid.grid_shape)
            hflat = {n: np.reshape(np.asarray(v), [-1]) for n, v in hp.items()}
            fields = [
                self.latents_from_field(
                    delta.reshape(flat.shape)[i],
                    data=flat[i],
                    **{n: v[i] for n, v in hflat.items()},
                )
                for i in range(flat.shape[0])
            ]
            out["field"] = tf.reshape(tf.stack(fields), tf.shape(out["field"]))
        else:
            out["field"] = self.latents_from_field(out["delta"], **hp)
        return out

    # --- preconditioning ---------------------------------------------------------------
    def metric_groups(self) -> list[np.ndarray | None]:
        """Per latent (``latent_names``' order), the groups a windowed diagonal metric may
        pool (:mod:`fieldhmc.samplers.metric_pooling`): for ``"field"`` an int32
        ``grid_shape`` label per real coordinate, one per distinct :math:`|k|` of its mode
        (the mean mode's coordinate alone); ``None`` for the scalar parameters."""
        kmag = self.grid.kmag().reshape(-1)[self._mode_of_real]
        kf = float(self.grid.fundamental.min())
        _, labels = np.unique(np.round(kmag / kf, 6), return_inverse=True)
        field = labels.astype(np.int32).reshape(self.grid.grid_shape)
        return [field if name == "field" else None for name in self.latent_names]

    def prior_precision_diag(self) -> np.ndarray:
        """Prior precision of each ``"field"`` coordinate at the fiducial hyperparameters.

        Returns
        -------
        np.ndarray
            float64 ``grid_shape``: 1 (non-centred) or :math:`1/s_{k(j)}` (centred; 1 for
            the mean-mode coordinate).
        """
        if self.parametrization != "centred":
            return np.ones(self.grid.grid_shape)
        return 1.0 / self._latent_variance_np()

    def posterior_precision_diag(self, data=None) -> np.ndarray:
        """Fourier-diagonal approximation of the posterior precision of ``"field"``.

        .. math::

            \\text{non-centred: } 1 + s_{k(j)} \\bar W, \\qquad
            \\text{centred: } 1/s_{k(j)} + \\bar W,

        at the fiducial hyperparameters, with :math:`\\bar W` =
        :attr:`noise_precision_mean` (``mean(mask / sigma**2)``; ``nbar * mean(mask)``
        for Poisson counts). The mean-mode coordinate gets 1. Exact for Gaussian noise
        with scalar :math:`\\sigma` and no mask.

        Parameters
        ----------
        data : array-like, optional
            Validated if given (the approximation does not depend on it).

        Returns
        -------
        np.ndarray
            float64 ``grid_shape``; use as a diagonal mass matrix (ones for the
            ``conditional`` parametrisations, whose latent is already whitened).
        """
        if data is not None:
            self._check_data(data)
        if self.is_conditional:
            return np.ones(self.grid.grid_shape)
        s_real = self.signal_variance_np().reshape(-1)[self._mode_of_real]
        s_real = s_real.reshape(self.grid.grid_shape)
        w = self.noise_precision_mean
        if self.parametrization == "noncentred":
            return 1.0 + s_real * w
        return np.where(self._is_mean_coordinate, 1.0, 1.0 / self._latent_variance_np() + w)

    def hyper_posterior_covariance(self) -> tuple[tuple[str, ...], np.ndarray]:
        """Approximate posterior covariance of the sampled P(k) parameters' latents.

        The Fisher information of the sampled power-spectrum parameters :math:`\\theta`
        (``log_amplitude`` and ``index``, or ``Omega_m`` and ``sigma8``, ...) about the
        data's modes under the Fourier-diagonal linear surrogate of the likelihood (per
        real coordinate a Gaussian of variance :math:`s_k R_k^2 + 1/\\bar W`), at the
        fiducial values, plus the prior precision:

        .. math::

            F_{ab} = \\frac12 \\sum_k h_k \\Bigl(\\frac{q_k}{1 + q_k}\\Bigr)^2
            \\partial_a \\ln s_k\\, \\partial_b \\ln s_k + \\frac{\\delta_{ab}}{\\sigma_a^2},
            \\qquad q_k = s_k R_k^2 \\bar W,

        with :math:`\\partial \\ln s_k` from the spectrum
        (:meth:`PowerSpectrum.log_power_derivatives_np`; for a power law
        :math:`\\partial \\ln s_k / \\partial \\ln A = 1`,
        :math:`\\partial \\ln s_k / \\partial n = \\ln(k / k_p)`) and :math:`\\sigma_a`
        the prior's standard deviation. Returns :math:`F^{-1}` mapped to the latents
        :math:`u` the sampler moves (divided by :math:`|d\\theta/du|` at the fiducial
        value for a bounded prior).

        The parameters are far from independent: with a power law the data constrain
        :math:`\\ln A + n \\ln(k/k_p)` at the k carrying most modes, so their
        correlation grows with the grid (``configs/hierarchical_64.yaml``: -0.06 at 16³,
        -0.81 at 32³, -0.96 at 64³).

        Returns
        -------
        names : tuple of str
            The sampled P(k) parameters, in :attr:`power_hyper_names` order.
        covariance : ndarray
            ``[p, p]`` float64.
        """
        names = tuple(self.power_hyper_names)
        if not names:
            return names, np.zeros((0, 0))
        s = self.signal_variance_np()
        gain = np.asarray(getattr(self, "linear_gain", 1.0), np.float64)
        q = s * gain**2 * self._surrogate_noise_precision()
        deriv = self.power.log_power_derivatives_np(self.grid.kmag())
        weight = 0.5 * self.grid.hermitian_weights() * (q / (1.0 + q)) ** 2
        fisher = np.array([[np.sum(weight * deriv[a] * deriv[b]) for b in names] for a in names])
        prior_sd = [float(self.hyper_priors[n].scipy().std()) for n in names]
        fisher += np.diag([1.0 / sd**2 for sd in prior_sd])
        cov = np.linalg.inv(fisher)
        slopes = np.ones(len(names))
        for i, name in enumerate(names):
            prior = self.hyper_priors[name]
            if prior.is_bounded:  # d theta / du at the fiducial value's latent
                u = float(prior.unconstrained_np(self.fiducial[name]))
                eps = 1e-6
                slope = (prior.physical_np(u + eps) - prior.physical_np(u - eps)) / (2 * eps)
                slopes[i] = abs(float(slope))
        return names, cov / np.outer(slopes, slopes)

    def hyper_posterior_laplace(
        self, data, max_iterations: int = 50
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray] | None:
        """Mode and covariance of the sampled P(k) parameters' latents under their
        posterior, by a Laplace fit (the ``conditional`` parametrisation: under
        ``conditional_scale`` the latent z = 0 is the field 0, not the conditional mean,
        and the log density there does not see the data).

        At the conditional latent :math:`z = 0` the log density is
        :math:`\\ln p(\\theta \\mid d)` up to a constant (exactly for white Gaussian noise
        without a mask: the latent is white given :math:`\\theta`; through the linear
        surrogate otherwise), so its maximum over the P(k) latents -- the other sampled
        scalars at their fiducial values -- is the posterior mode and minus its inverse
        Hessian the covariance. Newton steps from the fiducial values, each Hessian by
        central differences of the autodiff gradient (one batched evaluation of
        ``2 p + 1`` points, steps of 1% of the current widths), where it is not concave
        (far from the mode) a Fisher-scoring step with the fiducial Fisher matrix; a step
        limited to one prior width and halved while the log density falls.
        :meth:`hyper_posterior_covariance` evaluates the Fisher matrix at the fiducial
        values instead, which is far off when the data's parameters are
        (``configs/hierarchical_64.yaml``'s simulated data at 16³: log A 8.68, n -1.12
        against 6.91, -1.5; Fisher widths 3x the posterior's, correlation -0.06 against
        -0.76).

        Returns
        -------
        (names, mode, covariance) or None
            Latent mode ``[p]`` and covariance ``[p, p]`` (float64) of the sampled P(k)
            parameters (:attr:`power_hyper_names` order); ``None`` if there are none, the
            parametrisation is not ``conditional``, or the fit fails (non-finite values
            at the start, a step halved to nothing, no convergence).
        """
        names = tuple(self.power_hyper_names)
        if not names or not self.has_data_in_latent:
            return None
        from fieldhmc.samplers import stateless_seed

        target = self.target_log_prob_fn(data)
        base = [np.asarray(v) for v in self.init_latents("zeros", 1, seed=stateless_seed(0))]
        idx = [list(self.latent_names).index(n) for n in names]
        p = len(names)
        dtype = base[idx[0]].dtype

        def evaluate(points):  # [m, p] -> lp [m], gradient [m, p] (float64)
            parts = [tf.constant(np.repeat(b, len(points), axis=0)) for b in base]
            for j, i in enumerate(idx):
                parts[i] = tf.constant(points[:, j].astype(dtype))
            watched = [parts[i] for i in idx]
            with tf.GradientTape() as tape:
                tape.watch(watched)
                lp = target(*parts)
            grads = tape.gradient(lp, watched)
            return (
                lp.numpy().astype(np.float64),
                np.stack([g.numpy() for g in grads], -1).astype(np.float64),
            )

        u = np.array([float(base[i][0]) for i in idx])
        _, fisher_cov = self.hyper_posterior_covariance()
        prior_scale = np.array([self.hyper_latent_scale(n) for n in names])
        width = np.sqrt(np.diag(fisher_cov))
        lp_prev = u_prev = step = None
        for _ in range(max_iterations):
            h = 1e-2 * width
            points = np.concatenate([u[None], u + np.diag(h), u - np.diag(h)])
            lp, grad = evaluate(points)
            fell = lp_prev is not None and not lp[0] >= lp_prev - 1e-7 * abs(lp_prev)
            if fell or not (np.all(np.isfinite(lp)) and np.all(np.isfinite(grad))):
                if step is None or np.max(np.abs(step) / width) < 1e-6:
                    return None
                step = 0.5 * step  # the step overshot (or left the support): halve it
                u = u_prev + step
                continue
            hessian = (grad[1 : p + 1] - grad[p + 1 :]).T / (2 * h)  # column j: d/du_j
            hessian = 0.5 * (hessian + hessian.T)
            if np.all(np.linalg.eigvalsh(hessian) < 0):  # Newton
                cov = np.linalg.inv(-hessian)
                width = np.sqrt(np.diag(cov))
                step = cov @ grad[0]
                if float(np.sqrt(step @ -hessian @ step)) < 1e-3:  # in posterior widths
                    return names, u, cov
            else:  # not concave here (far from the mode): a Fisher scoring step
                step = fisher_cov @ grad[0]
            size = float(np.max(np.abs(step) / prior_scale))
            if size > 1.0:  # at most one prior width per step
                step = step / size
            u_prev, lp_prev = u, lp[0]
            u = u + step
        return None

    def hyper_posterior_scales(self) -> dict[str, float]:
        """Approximate posterior standard deviations of the sampled P(k) parameters'
        latents: the square roots of the diagonal of :meth:`hyper_posterior_covariance`
        (marginal widths), the ``conditional`` parametrisations' metric scales (their
        field latent has unit posterior scale at every :math:`\\theta`).

        Returns
        -------
        dict
            ``{name: sd}`` for the sampled P(k) parameters.
        """
        names, cov = self.hyper_posterior_covariance()
        return {n: float(np.sqrt(cov[i, i])) for i, n in enumerate(names)}

    # --- initial states -----------------------------------------------------------------
    def wiener_latent(self, data, tol: float = 1e-8) -> np.ndarray:
        """The ``"field"`` latent of the (linearised) Wiener-filter mean at the fiducial.

        Exact posterior mean for Gaussian noise; for other likelihoods the Wiener
        filter of :meth:`_gaussian_approximation` (for Poisson counts: the
        overdensity ``c / (nbar m) - 1`` with noise variance ``1 / (nbar m)``).

        Returns
        -------
        np.ndarray
            float64 ``grid_shape``.
        """
        approx = list(self._gaussian_approximation(self._check_data(data)))
        # d_eff is passed as a temporary (popped, not named), so the solver drops its
        # float64 grid once the right-hand side is formed (2 fields fewer at the peak).
        mean_field, _ = wiener_filter_mean(
            self.grid.grid_shape, self.signal_variance_np(), approx[1], approx.pop(0), tol=tol
        )
        del approx
        field = mean_field.astype(self.dtype.as_numpy_dtype)
        del mean_field
        data = data if self.has_data_in_latent else None
        return self.latents_from_field(field, data=data).numpy().astype(np.float64)

    def init_latents(
        self, kind: str, num_chains: int, seed, data=None, jitter: float = 0.0
    ) -> tuple[tf.Tensor, ...]:
        """Initial states for ``num_chains`` chains.

        Parameters
        ----------
        kind : {"prior", "zeros", "wiener", "posterior"}
            ``"prior"``: a prior draw of every latent; ``"zeros"``: hyperparameters at
            their fiducial values, ``field`` zero; ``"wiener"``: hyperparameters at
            their fiducial values, ``field`` at the Wiener-filter mean
            (:meth:`wiener_latent`, needs ``data``); ``"posterior"``: hyperparameters
            at their fiducial values, ``field`` an independent draw per chain of the
            linear surrogate's conditional posterior there (the ``conditional``
            parametrisation's mean and width; exact for Gaussian data without a mask
            and no forward model, needs ``data``), written in this model's
            parametrisation. Under the ``posterior`` metric a prior draw sits up to
            :math:`\\sqrt{1 + q}` posterior widths out along the well-measured modes;
            this one starts in the bulk.
        num_chains : int
            Leading batch size.
        seed : int or int Tensor [2]
            Stateless seed.
        data : array-like, optional
            Observed data (needed for ``"wiener"``).
        jitter : float
            Standard deviation of independent Normal noise added to every latent
            coordinate (all kinds).

        Returns
        -------
        tuple of tf.Tensor
            In ``latent_names`` order, each ``[num_chains, *event_shape]``, model dtype.
        """
        if kind not in INIT_KINDS:
            raise ValueError(f"init kind must be one of {INIT_KINDS}, got {kind!r}")
        num_chains = int(num_chains)
        if num_chains < 1:
            raise ValueError(f"num_chains must be >= 1, got {num_chains}")
        jitter = float(jitter)
        if not (math.isfinite(jitter) and jitter >= 0):
            raise ValueError(f"jitter must be non-negative and finite, got {jitter}")
        seed = as_stateless(seed)
        draw_seed, jitter_seed = tfp.random.split_seed(seed, 2)
        shape = [num_chains]
        values: dict[str, tf.Tensor] = {}
        if kind == "prior":
            seeds = tfp.random.split_seed(draw_seed, len(self.hyper_names) + 1)
            for name, s in zip(self.hyper_names, seeds[:-1], strict=False):
                values[name] = self._hyper_prior_distribution(name).sample(shape, seed=s)
            hp = {name: self._physical(name, values[name]) for name in self.hyper_names}
            field_dist = self._field_prior_distribution(hp, self._constants())
            field_shape = (
                [] if self.power_hyper_names and self.parametrization == "centred" else shape
            )
            values["field"] = field_dist.sample(field_shape, seed=seeds[-1])
        else:
            for name in self.hyper_names:
                fiducial = self.fiducial[name]
                if self.hyper_priors[name].is_bounded:  # the latent of the fiducial value
                    fiducial = float(self.hyper_priors[name].unconstrained_np(fiducial))
                values[name] = tf.fill(shape, tf.constant(fiducial, self.dtype))
            if kind == "zeros":
                values["field"] = tf.zeros([num_chains, *self.grid.grid_shape], self.dtype)
            elif kind == "posterior":
                if data is None:
                    raise ValueError("init kind 'posterior' needs data")
                z = tf.random.stateless_normal(
                    [num_chains, *self.grid.grid_shape], draw_seed, dtype=self.dtype
                )
                data = self._check_data(data)
                values["field"] = self._surrogate_posterior_field(z, values, data)
            else:
                if data is None:
                    raise ValueError("init kind 'wiener' needs data")
                latent = tf.constant(self.wiener_latent(data), self.dtype)
                values["field"] = tf.tile(latent[None], [num_chains, 1, 1, 1])
        out = []
        jitter_seeds = tfp.random.split_seed(jitter_seed, len(self.latent_names))
        for name, s in zip(self.latent_names, jitter_seeds, strict=True):
            v = tf.cast(values[name], self.dtype)
            if jitter > 0:
                v = v + jitter * tf.random.stateless_normal(tf.shape(v), s, dtype=self.dtype)
            out.append(v)
        return tuple(out)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(grid={self.grid}, power={self.power!r}, "
            f"parametrization={self.parametrization!r}, sampled={self.hyper_names})"
        )


class PinnedTarget:
    """A model's posterior log density pinned to data: :meth:`FieldModel.target_log_prob_fn`.

    Calling it gives :math:`\\ln p(\\theta) + \\ln p(x \\mid \\theta) + \\ln p(d \\mid
    \\delta(x, \\theta))` (float64 ``[batch]``); :meth:`field_from_latents` maps latents to
    :math:`\\delta` with the same data (the ``conditional`` latent is defined only given
    them). The data constants are made once, eagerly, and captured by a compiled caller.
    """

    def __init__(self, model: FieldModel, data):
        self.model = model
        self._constants = model._constants()
        self._data = model._data_constants(model._check_data(data))

    def _data_constants(self) -> dict[str, tf.Tensor]:
        return self._data

    def __call__(self, *latents) -> tf.Tensor:
        return self._log_prob(latents, with_field=False)[0]

    @property
    def computes_field(self) -> bool:
        """The log density makes :math:`\\delta` on its way (the default likelihood of
        the real-space field): :meth:`log_prob_and_field` returns it at no extra cost."""
        return self.model._likelihood_makes_delta()

    def log_prob_and_field(self, *latents) -> tuple[tf.Tensor, tf.Tensor]:
        """``(log density, delta)`` from one evaluation: the call's value and
        :meth:`field_from_latents` (to rounding), for a model whose log density makes the
        field (:attr:`computes_field`)."""
        if not self.computes_field:
            raise ValueError(
                f"{type(self.model).__name__}'s log density does not make the field: "
                "use field_from_latents"
            )
        return self._log_prob(latents, with_field=True)

    def _log_prob(self, latents, with_field: bool):
        m = self.model
        field, hp = m._unpack(latents)
        lc = self._data_constants()
        if with_field:  # FieldModel._log_likelihood_of_field, with delta kept
            delta = m._delta(field, hp, self._constants, lc)
            likelihood = m._log_likelihood(delta, hp, self._constants, lc)
        else:
            delta = None
            likelihood = m._log_likelihood_of_field(field, hp, self._constants, lc)
        log_prob = (
            m._log_prior_hypers(m._hyper_latents(latents))
            + m._log_prior_field(field, hp, self._constants, lc)
            + likelihood
        )
        ok = m._in_support(hp)
        if ok is not None:
            # outside the parameters' physical domain: -inf (the model evaluates clipped
            # values there, so the discarded branch and its gradient are finite)
            log_prob = tf.where(ok, log_prob, tf.constant(-np.inf, tf.float64))
        return log_prob, delta

    def field_from_latents(self, *latents) -> tf.Tensor:
        """:meth:`FieldModel.field_from_latents` given these data (batch-aware)."""
        if not self.model.has_data_in_latent:
            return self.model.field_from_latents(*latents)
        field, hp = self.model._unpack(latents)
        return self.model._delta(field, hp, self._constants, self._data_constants())

    def modes_from_latents(self, *latents) -> tf.Tensor:
        """:meth:`FieldModel.modes_from_latents` given these data (batch-aware)."""
        if not self.model.has_data_in_latent:
            return self.model.modes_from_latents(*latents)
        field, hp = self.model._unpack(latents)
        factor = math.sqrt(self.model.grid.num_cells)
        return self.model._modes(field, hp, self._constants, factor, self._data_constants())

    def packed_modes_scale(self) -> tf.Tensor | None:
        """:meth:`FieldModel.packed_modes_scale` (None when the data enter the latent)."""
        return None if self.model.has_data_in_latent else self.model.packed_modes_scale()


class RepinnableTarget(PinnedTarget):
    """A model's posterior log density whose data is held in ``tf.Variable``s.

    Made by :meth:`FieldModel.repinnable_target_log_prob_fn`. Calling it is
    :meth:`FieldModel.target_log_prob_fn` ``(data)(*latents)``; :meth:`pin` replaces the
    data (same shape) so that functions compiled around it (the log density and
    :meth:`field_from_latents`) do not retrace.
    """

    def __init__(self, model: FieldModel, data):
        self.model = model
        self._constants = model._constants()
        lc = model._data_constants(model._check_data(data))
        self._variables = {
            name: tf.Variable(value, trainable=False, name=f"likelihood_{name}")
            for name, value in lc.items()
        }

    def pin(self, data) -> None:
        """Replace the observed data (validated, same grid) in place."""
        lc = self.model._data_constants(self.model._check_data(data))
        for name, value in lc.items():
            self._variables[name].assign(value)

    def _data_constants(self) -> dict[str, tf.Tensor]:
        return {name: v.read_value() for name, v in self._variables.items()}
