"""Bring your own forward model: field prior + forward model + likelihood.

A **forward model** is any TensorFlow function

.. code-block:: python

    prediction = forward_fn(delta, **params)

from the overdensity :math:`\\delta` (the prior's field, ``[chains, n0, n1, n2]`` in
the model dtype) to a prediction on the data grid of the same shape and dtype,
differentiable in :math:`\\delta` and batch-independent along the leading axis. A
:class:`~fieldhmc.models.likelihoods.Likelihood` compares the prediction with the data
(where it would have compared :math:`\\delta`). :class:`ForwardFieldModel` combines the
two with the Gaussian-random-field prior of :class:`~fieldhmc.models.FieldModel`, so
the prior over Fourier modes, both parametrisations, sampled hyperparameters, float64
reductions, initial states, preconditioners, samplers, checkpoints and diagnostics
work unchanged:

.. math::

    \\ln p(\\theta, x \\mid d) = \\ln p(\\theta) + \\ln p(x \\mid \\theta)
    + \\ln p\\bigl(d \\mid \\mu = F(\\delta(x, \\theta))\\bigr) + \\text{const}.

:class:`~fieldhmc.models.GaussianFieldModel` and
:class:`~fieldhmc.models.LognormalPoissonModel` are :class:`ForwardFieldModel` with the
identity forward model. Built in: :class:`~fieldhmc.models.ZeldovichForward`.

A forward model may carry ``linear_gain`` (default 1): its linear response
:math:`g_k = \\partial\\mu_k/\\partial\\delta_k` at :math:`\\delta = 0`, a float or a
float64 array over the half-spectrum ``[n0, n1, n2 // 2 + 1]``. It is used only for
the Fourier-diagonal ``posterior`` preconditioner, :math:`1 + g_k^2 s_k \\bar W`
(it never changes the posterior).

**The modes hook (optional).** A forward model whose first step is
``tf.signal.rfft3d(delta)`` may also provide the attribute ``from_modes``, a function

.. code-block:: python

    prediction = forward_fn.from_modes(modes, **params)   # modes = tf.signal.rfft3d(delta)

(complex ``[chains, n0, n1, n2 // 2 + 1]``, exactly Hermitian) returning the same
prediction. :class:`ForwardFieldModel` then passes the prior's modes directly,
:math:`\\mathrm{rfft3d}(\\delta) = \\sqrt N\\, \\sqrt{s_k}\\, Z_k`, and skips the prior's
irfft3d and the forward model's rfft3d: one FFT pair fewer in the value and one in the
gradient. ``forward_fn(delta, **params)`` stays the reference (used for simulating data
and by :meth:`ForwardFieldModel.predict`); the two must agree (checked below).
:class:`~fieldhmc.models.ZeldovichForward` provides it.

**Modes out (optional).** A forward model with ``from_modes`` and the attribute
``predicts_modes = True`` also accepts ``from_modes(modes, return_modes=True, **params)``
and returns the prediction's ``rfft3d``. With white Gaussian noise (scalar sigma, no
mask) the likelihood then reads those modes (Parseval), and the forward model's last
inverse transform is skipped: one FFT pair fewer per gradient
(:class:`~fieldhmc.models.GalaxyClusteringForward`: 13 -> 12).

User functions are checked once on a two-chain prior draw (:func:`check_forward_fn`):
callable as ``forward_fn(delta, **params)``, returning a ``tf.Tensor`` of ``delta``'s
shape and dtype, finite, with a finite gradient that is not ``None`` or identically
zero (eagerly), and compilable with XLA; a ``from_modes`` must return the same
prediction from ``rfft3d(delta)``. Failures raise :class:`ForwardModelError` with a
one-line message.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from fieldhmc.models.field_model import FieldModel
from fieldhmc.models.grid import Grid
from fieldhmc.models.likelihoods import Likelihood
from fieldhmc.models.power import PowerSpectrum
from fieldhmc.models.priors import NormalPrior, ScalarPrior

__all__ = [
    "ForwardFieldModel",
    "ForwardModelError",
    "check_forward_fn",
    "load_forward_target",
]


class ForwardModelError(ValueError):
    """A forward function that cannot be used (one-line message)."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def load_forward_target(target: str) -> Callable[..., Any]:
    """Import ``"package.module:function"`` (or ``"/path/to/file.py:function"``).

    Parameters
    ----------
    target : str
        Module (dotted import path, or a ``.py`` file path) and attribute (dotted)
        separated by one ``:``.

    Returns
    -------
    callable

    Raises
    ------
    ForwardModelError
        Malformed target, the module cannot be imported (or raises on import), the
        attribute is missing or not callable.
    """
    module_name, sep, attr = str(target).partition(":")
    if not sep or not module_name or not attr or ":" in attr:
        raise ForwardModelError(f"target must be 'module:function', got {target!r}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise FileNotFoundError(f"no such file {path}")
            name = f"fieldhmc_user_forward_{abs(hash(str(path.resolve())))}"
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 -- any failure on import is the user's
        raise ForwardModelError(f"cannot import {module_name!r}: {_one_line(exc)}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ForwardModelError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ForwardModelError(f"{target!r} is a {type(obj).__name__}, not a function")
    return obj


def check_forward_fn(
    forward_fn: Callable[..., Any],
    delta: tf.Tensor,
    params: Mapping[str, Any] | None = None,
    name: str = "forward function",
    compile_check: bool = True,
) -> None:
    """Check a forward function on a small batch, eagerly.

    Parameters
    ----------
    forward_fn : callable
        ``forward_fn(delta, **params) -> prediction``.
    delta : tf.Tensor
        A test input ``[chains, n0, n1, n2]`` (e.g. a two-chain prior draw).
    params : mapping, optional
        Keyword arguments; tensors among them (sampled parameters, ``[chains]``) are
        also checked to have a finite gradient that is not ``None``.
    name : str
        How to call the function in messages.
    compile_check : bool
        Also compile value and gradient with ``tf.function(jit_compile=True)`` (as the
        sampler will), so graph-incompatible code (``.numpy()``, Python control flow on
        tensor values) is reported here.

    Raises
    ------
    ForwardModelError
        Wrong signature, an exception when called, a result that is not a ``tf.Tensor``
        of ``delta``'s shape and dtype, non-finite values, a gradient with respect to
        ``delta`` that is ``None``, not finite or identically zero, a gradient with
        respect to a tensor parameter that is ``None`` or not finite, or a failure to
        compile with XLA.
    """
    params = dict(params or {})
    sampled = {k: v for k, v in params.items() if isinstance(v, tf.Tensor)}
    try:
        inspect.signature(forward_fn).bind(delta, **params)
    except TypeError as exc:
        keys = "".join(f", {k}=..." for k in params)
        raise ForwardModelError(
            f"{name} cannot be called as function(delta{keys}): {exc}"
        ) from None
    except ValueError:  # no signature (builtins): let the call decide
        pass
    delta = tf.convert_to_tensor(delta)
    try:
        with tf.GradientTape(persistent=bool(sampled)) as tape:
            tape.watch(delta)
            tape.watch(list(sampled.values()))
            out = forward_fn(delta, **params)
            if not isinstance(out, tf.Tensor):
                raise ForwardModelError(
                    f"{name} returned a {type(out).__name__}, not a tf.Tensor (write it with "
                    "TensorFlow ops so it is differentiable)"
                )
            if tuple(out.shape) != tuple(delta.shape):
                raise ForwardModelError(
                    f"{name} returned shape {list(out.shape)} for delta of shape "
                    f"{list(delta.shape)}; it must return a prediction on the data grid, "
                    "[chains, n0, n1, n2]"
                )
            if out.dtype != delta.dtype:
                raise ForwardModelError(
                    f"{name} returned {out.dtype.name} for {delta.dtype.name} delta; it must "
                    "return delta's dtype"
                )
            probe = tf.random.stateless_normal(tf.shape(out), [3, 5], dtype=out.dtype)
            loss = tf.reduce_sum(out * probe)
        grad = tape.gradient(loss, delta)
        param_grads = {k: tape.gradient(loss, v) for k, v in sampled.items()}
        del tape
    except ForwardModelError:
        raise
    except LookupError as exc:  # "No gradient defined for operation ..."
        raise ForwardModelError(f"{name} is not differentiable: {_one_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 -- report the user's error in one line
        raise ForwardModelError(f"{name} raised {_one_line(exc)}") from None
    if not bool(tf.reduce_all(tf.math.is_finite(out))):
        raise ForwardModelError(f"{name} returned non-finite values (NaN or Inf)")
    if grad is None:
        raise ForwardModelError(
            f"{name} is not differentiable: the gradient of its output with respect to delta "
            "is None (non-TensorFlow code, tf.stop_gradient or a cast to an integer dtype?)"
        )
    grad = tf.convert_to_tensor(grad)
    if not bool(tf.reduce_all(tf.math.is_finite(grad))):
        raise ForwardModelError(f"{name} has a non-finite gradient with respect to delta")
    if not bool(tf.reduce_any(grad != 0)):
        raise ForwardModelError(
            f"{name} is not differentiable: its gradient with respect to delta is identically "
            "zero (rounding, floor or comparisons?)"
        )
    for key, g in param_grads.items():
        if g is None:
            raise ForwardModelError(
                f"{name} does not depend on the sampled parameter {key} (its gradient is None: "
                "non-TensorFlow code on it, or it is unused)"
            )
        if not bool(tf.reduce_all(tf.math.is_finite(g))):
            raise ForwardModelError(f"{name} has a non-finite gradient with respect to {key}")
    from_modes = getattr(forward_fn, "from_modes", None)
    if from_modes is not None:
        _check_from_modes(from_modes, delta, out, params, name, compile_check)
    if compile_check:
        _check_compiles(lambda d: tf.reduce_sum(forward_fn(d, **params) * probe), delta, name)


def _check_compiles(scalar_fn, x, label: str) -> None:
    """``scalar_fn`` and its gradient at ``x`` compile with XLA, or a one-line error."""

    def value_and_gradient(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = scalar_fn(v)
        return y, tape.gradient(y, v)

    try:
        tf.function(value_and_gradient, jit_compile=True)(x)
    except Exception as exc:  # noqa: BLE001 -- report the user's error in one line
        message = _one_line(exc)
        message = message if len(message) <= 300 else message[:297] + "..."
        raise ForwardModelError(
            f"{label} does not compile with XLA (tf.function(jit_compile=True)), as the "
            f"sampler needs: {message}"
        ) from None


def _check_from_modes(from_modes, delta, out, params, name, compile_check) -> None:
    """``from_modes(rfft3d(delta))`` is a tensor equal to ``out = forward_fn(delta)``."""
    if not callable(from_modes):
        raise ForwardModelError(
            f"{name}.from_modes is a {type(from_modes).__name__}, not a function"
        )
    modes = tf.signal.rfft3d(delta)
    try:
        with tf.GradientTape() as tape:
            tape.watch(modes)
            out_m = from_modes(modes, **params)
            if not isinstance(out_m, tf.Tensor):
                raise ForwardModelError(
                    f"{name}.from_modes returned a {type(out_m).__name__}, not a tf.Tensor"
                )
            loss = tf.reduce_sum(out_m)
        grad = tape.gradient(loss, modes)
    except ForwardModelError:
        raise
    except Exception as exc:  # noqa: BLE001 -- report the user's error in one line
        raise ForwardModelError(f"{name}.from_modes raised {_one_line(exc)}") from None
    if tuple(out_m.shape) != tuple(out.shape) or out_m.dtype != out.dtype:
        raise ForwardModelError(
            f"{name}.from_modes returned {out_m.dtype.name} {list(out_m.shape)}; it must "
            f"return what {name} returns, {out.dtype.name} {list(out.shape)}"
        )
    scale = 1.0 + float(tf.reduce_max(tf.abs(out)))
    diff = float(tf.reduce_max(tf.abs(out_m - out)))
    tol = 1e-4 if out.dtype == tf.float32 else 1e-9
    if not diff <= tol * scale:  # also catches NaN
        raise ForwardModelError(
            f"{name}.from_modes(rfft3d(delta)) differs from {name}(delta) by {diff:.3g} "
            f"(largest |prediction| {scale - 1.0:.3g}); it must compute the same prediction"
        )
    if grad is None or not bool(tf.reduce_all(tf.math.is_finite(tf.abs(grad)))):
        raise ForwardModelError(
            f"{name}.from_modes is not differentiable in the modes (gradient None or not finite)"
        )
    if compile_check:
        _check_compiles(
            lambda m: tf.reduce_sum(from_modes(m, **params)), modes, f"{name}.from_modes"
        )


class ForwardFieldModel(FieldModel):
    """A Gaussian-random-field prior observed through a forward model and a likelihood.

    .. math:: d \\sim p(d \\mid \\mu), \\qquad \\mu = F(\\delta;\\ \\text{params})

    Parameters
    ----------
    grid : Grid
    power : PowerSpectrum
        Prior power spectrum of :math:`\\delta`.
    likelihood : Likelihood
        Compares the prediction with the data (its grid must be ``grid``).
    forward : callable, optional
        ``forward(delta, **forward_params) -> prediction``, ``[chains, n0, n1, n2]``
        in and out, model dtype, written with TensorFlow ops (differentiable,
        XLA-compatible). ``None``: the identity, :math:`\\mu = \\delta`.
    forward_params : mapping, optional
        Keyword arguments of ``forward``: Python values are passed as given; a
        :class:`~fieldhmc.models.priors.ScalarPrior` (``NormalPrior``,
        ``TruncatedNormalPrior``, ``UniformPrior``) makes the parameter sampled, a latent
        after the P(k) hyperparameters (in this mapping's order), passed as a tensor
        ``[chains]`` of the model dtype (physical values).
    check_forward : bool, optional
        Run :func:`check_forward_fn` on a two-chain prior draw. Default: True unless
        ``forward`` is ``None`` or a built-in forward model of :mod:`fieldhmc.models`.
    parametrization, hyper_priors, dtype
        See :class:`~fieldhmc.models.FieldModel`.

    Raises
    ------
    ValueError
        As :class:`~fieldhmc.models.FieldModel`; a likelihood on another grid.
    ForwardModelError
        ``forward`` fails :func:`check_forward_fn`.
    """

    def __init__(
        self,
        grid: Grid,
        power: PowerSpectrum,
        likelihood: Likelihood,
        forward: Callable[..., tf.Tensor] | None = None,
        forward_params: Mapping[str, Any] | None = None,
        *,
        check_forward: bool | None = None,
        parametrization: str = "noncentred",
        hyper_priors: Mapping[str, NormalPrior | tuple[float, float]] | None = None,
        dtype: tf.DType = tf.float32,
    ):
        forward_params = dict(forward_params or {})
        param_priors = {k: v for k, v in forward_params.items() if isinstance(v, ScalarPrior)}
        if param_priors and forward is None:
            raise ValueError("sampled forward parameters need a forward model")
        super().__init__(
            grid,
            power,
            parametrization=parametrization,
            hyper_priors=hyper_priors,
            param_priors=param_priors,
            dtype=dtype,
        )
        if not isinstance(likelihood, Likelihood):
            raise ValueError(
                f"likelihood must be a fieldhmc.models.Likelihood, got {type(likelihood).__name__}"
            )
        if likelihood.grid.grid_shape != grid.grid_shape:
            raise ValueError(
                f"likelihood grid {likelihood.grid.grid_shape} differs from the model grid "
                f"{grid.grid_shape}"
            )
        if forward is not None and not callable(forward):
            raise ValueError(f"forward must be callable, got {type(forward).__name__}")
        self.likelihood = likelihood
        self.forward = forward
        #: the fixed keyword arguments of ``forward`` (the sampled ones are ``param_names``)
        self.forward_params = {k: v for k, v in forward_params.items() if k not in param_priors}
        self._from_modes = None if forward is None else getattr(forward, "from_modes", None)
        if self._from_modes is not None and not callable(self._from_modes):
            raise ValueError(
                f"forward.from_modes must be callable, got {type(self._from_modes).__name__}"
            )
        # A forward model that can end in Fourier space (``predicts_modes``: its
        # ``from_modes`` takes ``return_modes=True``) and white noise: the likelihood from
        # the prediction's modes (Parseval), one inverse transform fewer per evaluation.
        self._likelihood_from_modes = bool(
            self._from_modes is not None
            and getattr(forward, "predicts_modes", False)
            and getattr(likelihood, "is_fourier_diagonal", False)
            and hasattr(likelihood, "log_prob_modes")
        )
        #: the sampled P(k) parameters the forward model reads (e.g. Omega_m for the growth)
        self.forward_power_names = self._check_power_parameters(forward, power)
        gain = 1.0 if forward is None else getattr(forward, "linear_gain", 1.0)
        gain_fn = getattr(forward, "linear_gain_fn", None)
        sampled = (*self.param_names, *self.forward_power_names)
        if sampled and gain_fn is not None:  # at the sampled parameters' fiducials
            fiducial = {n: tf.constant(self.fiducial[n], tf.float64) for n in sampled}
            gain = gain_fn(**self.forward_params, **fiducial).numpy()
            gain = gain.reshape(gain.shape[-3:]) if gain.ndim >= 3 else gain.reshape(())
        gain = np.asarray(gain, dtype=np.float64)
        if gain.ndim != 0 and gain.shape != grid.modes_shape:
            raise ValueError(
                f"forward.linear_gain must be a float or of shape {grid.modes_shape}, got "
                f"{gain.shape}"
            )
        if not np.all(np.isfinite(gain)):
            raise ValueError("forward.linear_gain must be finite")
        self.linear_gain = gain
        if check_forward is None:
            module = type(forward).__module__ if forward is not None else "fieldhmc.models"
            check_forward = not module.startswith("fieldhmc.models")
        if check_forward and forward is not None:
            self.check_forward()

    def _check_power_parameters(self, forward, power) -> tuple[str, ...]:
        """The names of ``forward.power_parameter_names`` that are sampled here, after
        checking that the forward model's fixed values (``forward.power_parameters``) are
        the power spectrum's fiducial ones."""
        names = tuple(getattr(forward, "power_parameter_names", ()) or ())
        fixed = getattr(forward, "power_parameters", {}) or {}
        for name in names:
            if name not in power.parameter_names:
                raise ValueError(
                    f"the forward model reads the power-spectrum parameter {name!r}, which "
                    f"{type(power).__name__} does not have (it has {power.parameter_names})"
                )
            if name in fixed and not np.isclose(fixed[name], power.fiducial[name], rtol=1e-12):
                raise ValueError(
                    f"the forward model's {name} = {fixed[name]} differs from the power "
                    f"spectrum's {power.fiducial[name]}"
                )
        return tuple(n for n in names if n in self.power_hyper_names)

    # --- the forward model --------------------------------------------------------------
    def check_forward(self, num_chains: int = 2, seed=(8, 1)) -> None:
        """Run :func:`check_forward_fn` on a ``num_chains`` prior draw of :math:`\\delta`."""
        prior = self._noncentred_twin() if self.is_conditional else self  # a data-free latent
        latents = prior.init_latents("prior", num_chains, seed=list(seed))
        _, hp = prior._unpack(latents)  # sampled parameters: prior draws, physical values
        delta = prior.field_from_latents(*latents)
        name = getattr(self.forward, "__qualname__", type(self.forward).__name__)
        params = self._forward_params(hp, tf.shape(delta)[:-3])
        check_forward_fn(self.forward, delta, params, name=f"forward {name}")

    def _forward_params(self, hp, batch_shape=None) -> dict:
        """The keyword arguments of ``forward``: the fixed ``forward_params`` and the
        sampled parameters' physical values from ``hp`` as model-dtype tensors (with the
        sampled P(k) parameters the forward model reads, ``forward_power_names``).

        Parameters
        ----------
        hp : mapping
            ``{name: tensor}`` physical values (``[*batch]`` or scalars); sampled
            parameters missing from it take their fiducial values.
        batch_shape : 1-D int tensor, optional
            If given, the sampled values are broadcast to it and flattened to
            ``[prod(batch_shape)]`` (the one chain axis the forward function sees).
        """
        params = dict(self.forward_params)
        for name in (*self.param_names, *self.forward_power_names):
            value = hp.get(name) if hp is not None else None
            if value is None:
                value = self.fiducial[name]
            value = tf.cast(value, self.dtype)
            if batch_shape is not None:
                value = tf.reshape(tf.broadcast_to(value, batch_shape), [-1])
            params[name] = value
        return params

    def predict(self, delta, hp=None) -> tf.Tensor:
        """The prediction :math:`\\mu = F(\\delta)` on the data grid.

        Parameters
        ----------
        delta : tf.Tensor
            ``[..., n0, n1, n2]`` in the model dtype; the leading axes are flattened
            into one chain axis for the forward function and restored after.
        hp : mapping, optional
            Physical values of sampled forward parameters, ``{name: [...]}`` (batch
            broadcastable to ``delta``'s leading axes); default their fiducial values.

        Returns
        -------
        tf.Tensor
            ``[..., n0, n1, n2]`` in the model dtype.
        """
        if self.forward is None:
            return delta
        # the forward function always sees one leading (chain) axis
        shape = tf.shape(delta)
        flat = tf.reshape(delta, tf.concat([[-1], shape[-3:]], 0))
        flat = tf.ensure_shape(flat, [None, *self.grid.grid_shape])
        out = self.forward(flat, **self._forward_params(hp, shape[:-3]))
        return tf.reshape(out, shape)

    def _predict_from_modes(self, modes, hp=None) -> tf.Tensor:
        """:meth:`predict` from ``modes = rfft3d(delta)`` ``[..., n0, n1, n2 // 2 + 1]``
        through the forward model's ``from_modes``."""
        shape = tf.shape(modes)
        flat = tf.reshape(modes, tf.concat([[-1], shape[-3:]], 0))
        flat = tf.ensure_shape(flat, [None, *self.grid.modes_shape])
        out = self._from_modes(flat, **self._forward_params(hp, shape[:-3]))
        return tf.reshape(out, tf.concat([shape[:-3], self.grid.grid_shape], 0))

    def _predict_modes_from_modes(self, modes, hp=None) -> tf.Tensor:
        """The prediction's unnormalised ``rfft3d`` from ``modes = rfft3d(delta)``
        (``from_modes(..., return_modes=True)``)."""
        shape = tf.shape(modes)
        flat = tf.reshape(modes, tf.concat([[-1], shape[-3:]], 0))
        flat = tf.ensure_shape(flat, [None, *self.grid.modes_shape])
        out = self._from_modes(flat, return_modes=True, **self._forward_params(hp, shape[:-3]))
        return tf.reshape(out, shape)

    @property
    def is_gaussian_likelihood(self) -> bool:  # type: ignore[override]
        """True if the posterior is Gaussian in :math:`\\delta` (identity forward, Gaussian
        likelihood): then the Wiener filter is exact."""
        return self.forward is None and self.likelihood.is_gaussian

    @property
    def mask(self) -> np.ndarray | None:
        """The likelihood's mask (float64 ``grid_shape``) or ``None``."""
        return self.likelihood.mask

    # --- FieldModel hooks -------------------------------------------------------------------
    def _sigma2_for_likelihood(self, hp, c):
        if not self.likelihood.uses_prior_variance:
            return None
        return self._sigma2_delta(hp, c)

    def _check_data(self, data) -> np.ndarray:
        return self.likelihood.check_data(data)

    def _likelihood_constants(self, data: np.ndarray) -> dict[str, tf.Tensor]:
        out = self.likelihood.constants(data, self.dtype)
        if self._likelihood_from_modes:
            out.update(self.likelihood.modes_constants(data, self.dtype))
        return out

    def _log_likelihood(self, delta, hp, c, lc) -> tf.Tensor:
        mu = self.predict(delta, hp)
        return self.likelihood.log_prob(mu, lc, self._sigma2_for_likelihood(hp, c))

    def _log_likelihood_of_field(self, field, hp, c, lc) -> tf.Tensor:
        if self._from_modes is None:
            return super()._log_likelihood_of_field(field, hp, c, lc)
        # rfft3d(delta) straight from the prior: no irfft3d -> rfft3d round trip
        modes = self._modes(field, hp, c, factor=math.sqrt(self.grid.num_cells), lc=lc)
        if self._likelihood_from_modes:
            return self.likelihood.log_prob_modes(self._predict_modes_from_modes(modes, hp), lc)
        mu = self._predict_from_modes(modes, hp)
        return self.likelihood.log_prob(mu, lc, self._sigma2_for_likelihood(hp, c))

    def _likelihood_makes_delta(self) -> bool:
        own = type(self)._log_likelihood_of_field is ForwardFieldModel._log_likelihood_of_field
        return own and self._from_modes is None  # else the likelihood reads the modes

    def _data_distribution(self, delta, hp, c):
        mu = self.predict(delta, hp)
        return self.likelihood.distribution(mu, self._sigma2_for_likelihood(hp, c))

    # --- the conditional parametrisation's surrogate ------------------------------------------
    def _linear_response(self, hp, c) -> tf.Tensor:
        """float64 :math:`R_k(\\theta)`, broadcastable to ``[*batch, n0, n1, n2 // 2 + 1]``.

        A forward model with a ``linear_gain_fn`` attribute gives it as
        ``forward.linear_gain_fn(**params)`` of the forward-model parameters (fixed ones
        merged with the sampled ones, ``[batch]`` tensors, :meth:`_forward_params`); it must
        return a tensor broadcastable to ``[*batch, n0, n1, n2 // 2 + 1]`` (e.g.
        ``b[:, None, None, None]`` for a linear bias ``b``). Otherwise the fixed
        ``linear_gain`` (1 for the identity).
        """
        gain_fn = getattr(self.forward, "linear_gain_fn", None)
        if gain_fn is None:
            return c["linear_gain"]
        return tf.cast(gain_fn(**self._forward_params(hp)), tf.float64)

    def _surrogate_noise_precision(self) -> float:
        # about the prediction: the response R_k carries the forward model's gain
        return self.likelihood.noise_precision_mean

    def _surrogate_weighted_data(self, data):
        d_eff, weights = self.likelihood.gaussian_approximation(data)
        return weights * d_eff

    @property
    def noise_precision_mean(self) -> float:
        """Mean Fisher information per voxel about :math:`\\delta` at linear order,
        :math:`\\langle g_k^2\\rangle \\bar W` (``linear_gain`` :math:`g` of the forward
        model, averaged over the full spectrum)."""
        gain2 = self.linear_gain**2
        if gain2.ndim:
            w = self.grid.hermitian_weights()
            gain2 = (w * gain2).sum() / w.sum()
        return self.likelihood.noise_precision_mean * float(gain2)

    def posterior_precision_diag(self, data=None) -> np.ndarray:
        """Fourier-diagonal approximation of the posterior precision of ``"field"``.

        As :meth:`FieldModel.posterior_precision_diag` with the noise precision of each
        mode scaled by the forward model's squared linear response :math:`g_k^2`:

        .. math::

            \\text{non-centred: } 1 + s_{k(j)} g_{k(j)}^2 \\bar W, \\qquad
            \\text{centred: } 1/s_{k(j)} + g_{k(j)}^2 \\bar W .
        """
        if self.linear_gain.ndim == 0 or self.is_conditional:
            return super().posterior_precision_diag(data)
        if data is not None:
            self._check_data(data)
        shape = self.grid.grid_shape
        s_real = self.signal_variance_np().reshape(-1)[self._mode_of_real].reshape(shape)
        g2 = (self.linear_gain**2).reshape(-1)[self._mode_of_real].reshape(shape)
        w = self.likelihood.noise_precision_mean * g2
        if self.parametrization == "noncentred":
            return 1.0 + s_real * w
        return np.where(self._is_mean_coordinate, 1.0, 1.0 / self._latent_variance_np() + w)

    def _gaussian_approximation(self, data):
        if self.forward is not None:
            raise ValueError(
                "the Wiener-filter approximation needs the identity forward model (use init "
                "'prior' or 'zeros' with a forward model)"
            )
        return self.likelihood.gaussian_approximation(data)

    def __repr__(self) -> str:
        forward = None if self.forward is None else getattr(self.forward, "__qualname__", None)
        forward = forward or repr(self.forward)
        return (
            f"{type(self).__name__}(grid={self.grid}, power={self.power!r}, "
            f"likelihood={type(self.likelihood).__name__}, forward={forward}, "
            f"parametrization={self.parametrization!r}, sampled={self.hyper_names})"
        )
