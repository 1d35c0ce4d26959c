"""A Gaussian-field model's posterior on a field sharded over a DTensor mesh.

:class:`ShardedGaussianTarget` evaluates the log density and its gradient of a
:class:`~fieldhmc.models.GaussianFieldModel` (scalar or per-voxel sigma and an optional
mask) or a :class:`~fieldhmc.models.LognormalPoissonModel` (counts, optional
completeness) -- non-centred or conditional latent, identity forward model, fixed or sampled
power-spectrum hyperparameters -- for fields laid out in x-slabs
(:func:`fieldhmc.ops.sharded.slab_layout`): each device holds ``n0 / P`` planes of the
latent, of :math:`\\delta` and of the gradient.

The latent is **real-space white noise** :math:`\\xi \\sim \\mathcal N(0, I)`,

.. math:: \\delta = \\mathrm{irfft3d}\\big(\\sqrt{s_k}\\;\\mathrm{rfft3d}(\\xi,
          \\text{ortho}),\\ \\text{ortho}\\big),

instead of the model's Hermitian packing of the modes (whose kz = 0 plane packing
is a gather across the whole n0 x n1 plane, i.e. across devices). The two latents
are related by the orthogonal map :math:`x = \\mathrm{unpack}(\\mathrm{rfft3d}(\\xi,
\\text{ortho}))` (:meth:`ShardedGaussianTarget.model_latent`), whose Jacobian is 1:
the log density of :math:`\\xi` **equals** ``model.target_log_prob_fn(data)`` at
:math:`x(\\xi)`, normalisation included, and the posterior of :math:`\\delta` is the
model's. The per-voxel terms are computed in the field dtype and summed in float64
over the whole mesh (DTensor inserts the all-reduce), returning float64 ``[chains]``.

The same class runs on plain tensors (``mesh=None``) with :mod:`fieldhmc.ops`: that
is the single-device reference the sharded run must reproduce.

**Poisson counts.** The lognormal-Poisson likelihood is a per-voxel sum in real space:
the target calls the likelihood's own ``log_prob`` on the slab field with its per-voxel
constants in slabs (its float64 sums are reduced over the mesh by DTensor), and
:math:`\\sigma^2_\\delta` is the model's (fixed) or its Hermitian-weighted sum of
:math:`s_k(\\theta)` over the spectrum layout (sampled). The conditional latent's
surrogate and the ``posterior`` metric read the likelihood's Gaussian approximation
(:math:`\\bar W = \\bar n \\langle m \\rangle`), as on one device.

**Sampled hyperparameters.** The state is then a list of parts in the model's
``latent_names`` order: one ``[chains]`` tensor per sampled hyperparameter (replicated on
the mesh), then the field. :math:`s_k(\\theta)` is evaluated in the graph from the
model's power spectrum on the spectrum layout (its grid terms sharded as the modes are),
and the hyperprior (:meth:`~fieldhmc.models.FieldModel._log_prior_hypers`) is added; the
non-centred field prior does not depend on :math:`\\theta`. A hyperparameter part is
whitened, :math:`u = \\sigma_u v` (``hyper_scales``, the single-device metric's scale of
that latent), so the kernels keep an identity metric; the log density is that of
:math:`u(v)` (no Jacobian, as the driver's whitening).

**Conditional parametrisations** (``conditional``, ``conditional_scale``): the latent's
modes :math:`Z = \\mathrm{rfft3d}(\\xi, \\text{ortho})` give :math:`\\delta_k = \\mu_k(\\theta)
+ \\sqrt{w_k(\\theta)} Z_k` (:mod:`fieldhmc.models.field_model`), per Fourier mode and so
on the spectrum layout; the prior of the latent is the model's (Hermitian-weighted sums
over the half-spectrum, float64). Its ``posterior`` metric is the identity (the latent is
white a posteriori), ``hyper_scales`` the hyperparameters' Fisher widths.

**Preconditioning.** The single-device driver runs its kernels on ``x / scale`` with a
metric diagonal in the model's Fourier latent. Here the latent is real-space, where
that metric is a convolution; with ``preconditioner="posterior"`` the target's latent
is instead :math:`v` with

.. math:: \\xi = A v = \\mathrm{irfft3d}\\big(c_k\\, \\mathrm{rfft3d}(v, \\text{ortho}),
          \\ \\text{ortho}\\big),\\qquad c_k = (1 + s_k \\bar W)^{-1/2},

the posterior scale of :meth:`~fieldhmc.models.GaussianFieldModel.posterior_precision_diag`
per mode (1 at :math:`k = 0`): the same metric as the single-device ``posterior``
preconditioner (a sampler with the identity metric on :math:`v` is one with metric
:math:`A^{-2}` on :math:`\\xi`). The log density is that of :math:`\\xi(v)` (no
Jacobian, as the driver's whitening), so the traced ``lp`` is the model's. ``prior``
is the identity for the non-centred latent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from fieldhmc.mesh_support import mesh_support
from fieldhmc.models.forward import ForwardFieldModel
from fieldhmc.models.likelihoods import LognormalPoissonLikelihood
from fieldhmc.ops import fft as fft1
from fieldhmc.ops import sharded

__all__ = ["ShardedGaussianTarget"]

_LOG_2PI = math.log(2.0 * math.pi)
#: the lognormal-Poisson likelihood's per-voxel constants (laid out in slabs)
_POISSON_FIELDS = ("counts", "expected", "observed")


class ShardedGaussianTarget:
    """Posterior log density of a Gaussian-field model on x-slab DTensors.

    Parameters
    ----------
    model : ForwardFieldModel
        A ``GaussianFieldModel`` or ``LognormalPoissonModel``: non-centred or
        conditional, identity forward model; sampled P(k) hyperparameters allowed.
    data : array-like
        Observed data ``grid_shape`` (validated by the model).
    mesh : dtensor.Mesh, optional
        1-D mesh whose size divides ``n0`` and ``n1``; None runs on plain tensors.
    preconditioner : {"identity", "prior", "posterior", "diagonal"}
        The metric, as a map of the latent (module docs); ``prior`` is the identity, and
        so is ``diagonal`` here (the sampler adapts per-element scales of this latent).
    hyper_scales : mapping, optional
        ``{name: scale}`` of the sampled hyperparameters' latents (module docs; default 1).

    Raises
    ------
    ValueError
        For a model outside that class (:func:`fieldhmc.mesh_support.mesh_support`), or
        a mesh that does not divide the grid.
    """

    def __init__(
        self,
        model: ForwardFieldModel,
        data,
        mesh: dtensor.Mesh | None = None,
        preconditioner: str = "identity",
        hyper_scales: Mapping[str, float] | None = None,
    ):
        if not isinstance(model, ForwardFieldModel):
            raise ValueError(f"needs a ForwardFieldModel, got {type(model).__name__}")
        lik = model.likelihood
        self._is_poisson = isinstance(lik, LognormalPoissonLikelihood)
        reason = mesh_support(
            "hmc",
            preconditioner=preconditioner,
            likelihood="lognormal_poisson"
            if self._is_poisson
            else "gaussian"
            if lik.is_gaussian
            else type(lik).__name__,
            forward_model=model.forward is not None,
            sampled_hyperparameters=bool(model.hyper_names),
            sampled_cosmology=bool(set(model.power_hyper_names) - {"log_amplitude", "index"}),
            parametrisation=model.parametrization,
        )
        if reason is not None:
            raise ValueError(reason)
        self.model = model
        self.preconditioner = preconditioner
        self.latent_names = tuple(model.latent_names)
        self.hyper_names = tuple(model.hyper_names)
        scales = dict(hyper_scales or {})
        unknown = set(scales) - set(self.hyper_names)
        if unknown:
            raise ValueError(f"hyper_scales for unsampled parameters {sorted(unknown)}")
        #: the whitening scale of each hyperparameter part (float64, host)
        self.hyper_scales = tuple(float(scales.get(n, 1.0)) for n in self.hyper_names)
        self.mesh = mesh
        self.grid_shape = tuple(model.grid.grid_shape)
        self.dtype = model.dtype
        if mesh is not None:
            sharded.check_mesh(mesh, self.grid_shape)
        lc = model._likelihood_constants(model.check_data(data))
        np_dtype = self.dtype.as_numpy_dtype
        self._is_conditional = model.is_conditional
        if self._is_conditional:
            self._conditional_constants(model, data)
        self._metric_constants(model, preconditioner)
        if self.hyper_names or self._is_conditional:  # the power's grid terms, sharded
            self._power_constants = self._spectrum_constants(model)
        self._num_cells = int(np.prod(self.grid_shape))
        if self._is_poisson:
            self._poisson_constants(model, lc)
            return
        self._data = self._put(lc["data"].numpy()[None].astype(np_dtype))
        # float64 weights (the likelihood's constants hold them in the model dtype)
        w = np.asarray(lik.weights.flat[0] if lik.is_fourier_diagonal else lik.weights, np.float64)
        self._weights = float(w) if w.ndim == 0 else self._put(w[None])
        self._log_norm = float(lc["log_norm"].numpy())

    # --- layout helpers ------------------------------------------------------------------
    def _put(self, value: np.ndarray, spectrum: bool = False) -> tf.Tensor:
        if self.mesh is None:
            return tf.constant(value)
        layout = sharded.spectrum_layout if spectrum else sharded.slab_layout
        return sharded.shard(value, layout(self.mesh))

    def _spectrum_constants(self, model: ForwardFieldModel) -> dict[str, tf.Tensor]:
        """The power spectrum's grid terms and ``is_pos`` (half-spectrum arrays in the
        spectrum layout, others replicated), floats as float64."""
        half = (self.grid_shape[0], self.grid_shape[1], self.grid_shape[2] // 2 + 1)
        terms = {**model._power_terms_np(), "is_pos": model.grid.kmag() > 0}
        out = {}
        for name, value in terms.items():
            value = np.asarray(value)
            if np.issubdtype(value.dtype, np.floating):
                value = value.astype(np.float64)
            if self.mesh is None:
                out[name] = tf.constant(value)
            elif value.shape == half:
                dim = self.mesh.dim_names[0]
                layout = dtensor.Layout([dtensor.UNSHARDED, dim, dtensor.UNSHARDED], self.mesh)
                out[name] = sharded.shard(value, layout)
            else:
                out[name] = sharded.shard(value, dtensor.Layout.replicated(self.mesh, value.ndim))
        return out

    def _metric_constants(self, model: ForwardFieldModel, preconditioner: str) -> None:
        """The fiducial :math:`\\sqrt{s_k}` and the metric's :math:`c_k` (module docs)."""
        np_dtype = self.dtype.as_numpy_dtype
        s = model.signal_variance_np()
        # c_k (float64, host), or None: the identity metric (also the posterior metric of
        # the conditional latent, white a posteriori already)
        self._metric = None
        if preconditioner == "posterior" and not self._is_conditional:
            self._metric = 1.0 / np.sqrt(1.0 + s * model.noise_precision_mean)
        sqrt_s = np.sqrt(s) if self._metric is None else np.sqrt(s) * self._metric
        self._sqrt_s = self._put(sqrt_s[None].astype(np_dtype), spectrum=True)
        if self._metric is not None:
            if self.hyper_names:  # times sqrt(s_k(theta)) in the graph
                self._metric_t = self._put(self._metric[None], spectrum=True)
            # |A v|^2 = sum_k h_k c_k^2 |V_k|^2 (Parseval, ortho; h the Hermitian weights)
            weighted = model.grid.hermitian_weights() * self._metric**2
            self._prior_weights = self._put(weighted[None].astype(np_dtype), spectrum=True)

    def _conditional_constants(self, model: ForwardFieldModel, data) -> None:
        """What the conditional parametrisation reads (spectrum layout): the Hermitian
        weights, the fiducial ``s_k`` (fixed hyperparameters) and, for ``conditional``,
        the noise-weighted data modes :math:`\\tilde b` (module docs of
        :mod:`fieldhmc.models.field_model`)."""
        if np.any(np.asarray(getattr(model, "linear_gain", 1.0)) != 1.0):
            raise ValueError("the mesh's conditional latent assumes the identity forward model")
        dtype = self.dtype.as_numpy_dtype
        h = model.grid.hermitian_weights()
        self._hermitian = self._put(h[None].astype(dtype), spectrum=True)
        self._hermitian64 = self._put(h[None].astype(np.float64), spectrum=True)
        self._s_fixed = self._put(model.signal_variance_np()[None], spectrum=True)
        self._noise_precision = float(model._surrogate_noise_precision())
        self._surrogate = None
        if model.parametrization == "conditional":
            b = model._surrogate_data_constants(model.check_data(data))
            self._surrogate = tuple(
                self._put(b[k].numpy()[None], spectrum=True)
                for k in ("surrogate_re", "surrogate_im")
            )

    def _poisson_constants(self, model: ForwardFieldModel, lc: Mapping[str, tf.Tensor]) -> None:
        """The lognormal-Poisson likelihood's constants (its :meth:`constants`, the
        per-voxel ones in slabs) and :math:`\\sigma^2_\\delta` (fixed hyperparameters: the
        model's value; sampled: its Hermitian-weighted sum over the spectrum layout)."""
        self._poisson = {name: self._put(lc[name].numpy()[None]) for name in _POISSON_FIELDS}
        self._poisson_scalars = {k: float(lc[k].numpy()) for k in ("total_counts", "const")}
        h = model.grid.hermitian_weights()
        # FieldModel._constants' sigma2_delta, the same float64 expression
        self._sigma2_fixed = float((h * model.signal_variance_np()).sum() / model.grid.num_cells)
        if self.hyper_names:
            self._sigma2_weights = self._put(h[None].astype(np.float64), spectrum=True)

    def _sigma2_delta(self, u: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """float64 prior variance of :math:`\\delta(x)` (``FieldModel._sigma2_delta``):
        a scalar, or ``[chains]`` with sampled hyperparameters."""
        if not self.hyper_names:
            return tf.constant(self._sigma2_fixed, tf.float64)
        hp = {name: self.model._physical(name, value) for name, value in u.items()}
        s = self.model._signal_variance(hp, self._power_constants)  # [chains, n0, n1, m]
        return tf.reduce_sum(self._sigma2_weights * s, axis=[1, 2, 3]) / self._num_cells

    def _poisson_log_likelihood(self, delta: tf.Tensor, u: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """The likelihood's own :meth:`~LognormalPoissonLikelihood.log_prob` of the slab
        field (per-voxel terms, global float64 sums: DTensor reduces over the mesh)."""
        lc = dict(self._poisson)
        lc.update({k: tf.constant(v, tf.float64) for k, v in self._poisson_scalars.items()})
        return self.model.likelihood.log_prob(delta, lc, self._sigma2_delta(u))

    def shard(self, field) -> tf.Tensor:
        """Lay out a host array ``[chains, *grid_shape]`` as the target expects."""
        return self._put(np.asarray(field, self.dtype.as_numpy_dtype))

    def _rfft(self, x):
        if self.mesh is None:
            return fft1.rfft3d(x, norm="ortho")
        return sharded.rfft3d(x, self.mesh, norm="ortho")

    def _irfft(self, z):
        if self.mesh is None:
            return fft1.irfft3d(z, fft_length=self.grid_shape, norm="ortho")
        return sharded.irfft3d(z, self.mesh, fft_length=self.grid_shape, norm="ortho")

    # --- densities -----------------------------------------------------------------------
    def _split(self, parts) -> tuple[list, tf.Tensor]:
        """``(hyperparameter parts, field)`` of a state (a list of parts, or the field)."""
        if tf.is_tensor(parts):
            parts = [parts]
        parts = list(parts)
        if len(parts) != len(self.latent_names):
            raise ValueError(f"expected parts {self.latent_names}, got {len(parts)}")
        return parts[:-1], parts[-1]

    def hyperparameters(self, hyper_parts) -> dict[str, tf.Tensor]:
        """The model's latent :math:`u = \\sigma_u v` of each hyperparameter part (state dtype)."""
        return {
            name: v * scale
            for name, v, scale in zip(self.hyper_names, hyper_parts, self.hyper_scales, strict=True)
        }

    def _field_scale(self, u: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """:math:`\\sqrt{s_k}` (times :math:`c_k` when preconditioned), ``[1 or chains,
        n0, n1, m]`` in the state dtype and the spectrum layout."""
        if not self.hyper_names:
            return self._sqrt_s
        hp = {name: self.model._physical(name, value) for name, value in u.items()}
        c = self._power_constants
        s = self.model._signal_variance(hp, c)  # float64 [chains, n0, n1, m]
        is_pos = c["is_pos"]
        # sqrt where s > 0 only: its gradient at s = 0 (the mean mode) is infinite
        root = tf.where(is_pos, tf.sqrt(tf.where(is_pos, s, tf.ones_like(s))), tf.zeros_like(s))
        if self._metric is not None:
            root = root * self._metric_t
        return tf.cast(root, self.dtype)

    def delta(self, parts) -> tf.Tensor:
        """:math:`\\delta` of a state (the latent :math:`\\xi`, or :math:`v` when
        preconditioned; with sampled hyperparameters the list of parts),
        ``[chains, *grid_shape]`` in its layout."""
        hyper, xi = self._split(parts)
        u = self.hyperparameters(hyper)
        if self._is_conditional:
            return self._irfft(self._conditional(u, self._rfft(xi))[0])
        return self._delta_of_modes(self._rfft(xi), self._field_scale(u))

    def _conditional(self, u: Mapping[str, tf.Tensor], z: tf.Tensor) -> tuple:
        """The conditional parametrisation (``FieldModel._conditional_modes`` and
        ``_log_prior_conditional`` on the spectrum layout): :math:`\\delta`'s modes
        :math:`\\mu_k + \\sqrt{w_k} Z_k` and the float64 ``[chains]`` log prior of the
        latent (its :math:`N/2 \\ln 2\\pi` left out), ``z`` = rfft3d(latent, ortho)."""
        c = self._power_constants
        if self.hyper_names:
            hp = {name: self.model._physical(name, value) for name, value in u.items()}
            s = self.model._signal_variance(hp, c)  # float64 [chains, n0, n1, m]
        else:
            s = self._s_fixed
        is_pos = c["is_pos"]
        q = s * self._noise_precision  # the identity forward model: R = 1
        one = tf.ones_like(s)
        # sqrt only where s > 0: its gradient at the mean mode (s = 0) is infinite
        root = tf.where(is_pos, tf.sqrt(tf.where(is_pos, s / (1.0 + q), one)), 0.0 * one)
        root_s = tf.where(is_pos, tf.sqrt(tf.where(is_pos, s, one)), 0.0 * one)
        re, im = tf.math.real(z), tf.math.imag(z)
        a = tf.cast(tf.math.rsqrt(1.0 + q), self.dtype)
        scale = tf.cast(root, self.dtype)
        d_re, d_im, p_re, p_im = re * scale, im * scale, re * a, im * a
        if self._surrogate is not None:
            b_re, b_im = self._surrogate
            coef = tf.cast(s / (1.0 + q), self.dtype)  # w R
            prior_coef = tf.cast(root_s / (1.0 + q), self.dtype)
            d_re, d_im = d_re + coef * b_re, d_im + coef * b_im
            p_re, p_im = p_re + prior_coef * b_re, p_im + prior_coef * b_im
        power = self._hermitian * (tf.square(p_re) + tf.square(p_im))
        quad = tf.reduce_sum(tf.cast(power, tf.float64), axis=[1, 2, 3])
        log_det = tf.reduce_sum(self._hermitian64 * tf.math.log1p(q), axis=[1, 2, 3])
        return tf.complex(d_re, d_im), -0.5 * quad - 0.5 * log_det

    def _delta_of_modes(self, modes: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
        if not self.hyper_names:  # a constant scale
            return self._irfft(modes * tf.cast(scale, self._rfft_dtype))
        # tf.complex, not a cast: the Cast gradient back to real warns at every trace
        return self._irfft(tf.complex(tf.math.real(modes) * scale, tf.math.imag(modes) * scale))

    @property
    def _rfft_dtype(self) -> tf.DType:
        return tf.complex64 if self.dtype == tf.float32 else tf.complex128

    def __call__(self, *parts: tf.Tensor) -> tf.Tensor:
        """float64 ``[chains]`` log posterior density (unnormalised by the evidence) of the
        parts in ``latent_names`` order."""
        hyper, xi = self._split(parts)
        u = self.hyperparameters(hyper)
        if self._is_conditional:
            delta_modes, log_prior = self._conditional(u, self._rfft(xi))
            delta = self._irfft(delta_modes)
            prior = -2.0 * log_prior  # as the other branches' (-0.5 prior)
        elif self._metric is None:
            scale = self._field_scale(u)
            delta = self._delta_of_modes(self._rfft(xi), scale)
            prior = tf.reduce_sum(tf.square(tf.cast(xi, tf.float64)), axis=[1, 2, 3])
        else:
            modes = self._rfft(xi)
            delta = self._delta_of_modes(modes, self._field_scale(u))
            power = tf.math.real(modes) ** 2 + tf.math.imag(modes) ** 2
            prior = tf.reduce_sum(tf.cast(self._prior_weights * power, tf.float64), axis=[1, 2, 3])
        if self._is_poisson:
            const = tf.constant(-0.5 * self._num_cells * _LOG_2PI, tf.float64)
            lp = -0.5 * prior + self._poisson_log_likelihood(delta, u) + const
        else:
            residual = tf.cast(self._data - delta, tf.float64)
            quad = tf.reduce_sum(self._weights * tf.square(residual), axis=[1, 2, 3])
            const = self._log_norm - 0.5 * self._num_cells * _LOG_2PI
            lp = -0.5 * prior - 0.5 * quad + tf.constant(const, tf.float64)
        if not self.hyper_names:
            return lp
        lp = lp + self.model._log_prior_hypers(u)
        support = self.model._in_support(
            {name: self.model._physical(name, value) for name, value in u.items()}
        )
        return lp if support is None else tf.where(support, lp, tf.constant(-np.inf, tf.float64))

    def value_and_gradient(self, xi: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(log p [chains] float64, d log p / d xi)`` in the layout of ``xi`` (fixed
        hyperparameters; :meth:`value_and_gradients` for a state of several parts)."""
        if self.hyper_names:
            raise ValueError("sampled hyperparameters: the state is a list of parts")
        with tf.GradientTape() as tape:
            tape.watch(xi)
            lp = self(xi)
        return lp, tape.gradient(lp, xi)

    def value_and_gradients(self, parts) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """``(log p [chains] float64, [d log p / d part, ...])`` of the parts in
        ``latent_names`` order, each gradient in its part's layout."""
        parts = list(parts)
        with tf.GradientTape() as tape:
            for p in parts:
                tape.watch(p)
            lp = self(*parts)
        return lp, tape.gradient(lp, parts)

    # --- single-device bridges --------------------------------------------------------------
    def model_latent(self, xi: np.ndarray) -> np.ndarray:
        """The model's ``"field"`` latent :math:`x(\\xi)` of host draws ``[..., *grid]``
        of this target's latent (:math:`\\xi`, or :math:`v` when preconditioned)."""
        xi = tf.constant(np.asarray(xi, np.float64))
        modes = fft1.rfft3d(xi, norm="ortho")
        if self._metric is not None:
            modes = modes * tf.constant(self._metric, modes.dtype)
        return self.model.packing.real_from_modes(modes).numpy()

    def model_latents(self, parts) -> list[np.ndarray]:
        """The model's latents (``latent_names`` order, float64 host arrays) of host
        draws of this target's parts: :math:`u = \\sigma_u v` and :meth:`model_latent`."""
        *hyper, xi = (np.asarray(p) for p in parts)
        scales = self.hyper_scales
        out = [v.astype(np.float64) * scale for v, scale in zip(hyper, scales, strict=True)]
        return [*out, self.model_latent(xi)]

    def state_from_model(self, latents) -> list[np.ndarray]:
        """Inverse of :meth:`model_latents`: this target's parts of the model's latents."""
        *hyper, x = (np.asarray(p, np.float64) for p in latents)
        out = [u / scale for u, scale in zip(hyper, self.hyper_scales, strict=True)]
        return [*out, self.latent_from_model(x)]

    def latent_from_model(self, x: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`model_latent`."""
        x = tf.constant(np.asarray(x, np.float64))
        modes = self.model.packing.modes_from_real(x)
        if self._metric is not None:
            modes = modes / tf.constant(self._metric, modes.dtype)
        return fft1.irfft3d(modes, fft_length=self.grid_shape, norm="ortho").numpy()
