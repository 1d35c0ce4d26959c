"""Priors of the sampled scalar parameters: P(k) hyperparameters and forward-model parameters.

The power-spectrum hyperparameters (``log_amplitude``, ``index``) take a
:class:`NormalPrior`; a hyperparameter without a prior is fixed at the power
spectrum's fiducial value. A forward model's parameters (``bias``, ``growth`` or any
keyword of a user's function) may take any of

* :class:`NormalPrior` :math:`\\mathcal N(\\mu, \\sigma^2)`;
* :class:`TruncatedNormalPrior` :math:`\\mathcal N(\\mu, \\sigma^2)` restricted to
  :math:`[a, b]` (one bound may be infinite);
* :class:`UniformPrior` :math:`\\mathcal U(a, b)`.

**Unconstrained coordinates.** The sampler moves an unconstrained latent :math:`u`;
the parameter is :math:`\\theta = T(u)` with

.. math::

    T(u) = \\begin{cases}
      u & \\text{no bound}\\\\
      a + e^{u} & \\text{lower bound } a\\\\
      b - e^{u} & \\text{upper bound } b\\\\
      a + (b - a)\\, \\sigma(u) & \\text{both},\\quad \\sigma(u) = 1/(1 + e^{-u})
    \\end{cases}

and the latent's density is :math:`p_u(u) = p_\\theta(T(u))\\,|T'(u)|`, with
:math:`\\ln|T'(u)| = 0,\\ u,\\ u,\\ \\ln(b - a) - \\mathrm{softplus}(u) -
\\mathrm{softplus}(-u)`. So an unadjusted integrator (mclmc) never steps outside the
support, and everything a user sees (``samples.nc``, the report, the values passed to
the model) is the physical :math:`\\theta`.

The fiducial value (initial state for ``init: zeros``, the fixed value when not
sampled) is the prior's ``loc`` (truncated Normal: ``loc`` if inside the bounds, else
the median) or, for a uniform prior, the midpoint.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Mapping

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from scipy import special, stats

from fieldhmc.models.power import HYPERPARAMETER_NAMES

__all__ = [
    "PRIOR_KINDS",
    "NormalPrior",
    "ScalarPrior",
    "TruncatedNormalPrior",
    "UniformPrior",
    "check_hyper_priors",
    "check_param_priors",
    "make_prior",
]

tfb = tfp.bijectors
tfd = tfp.distributions
_LOG_2PI = math.log(2.0 * math.pi)


def _finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"prior {name} must be finite, got {value}")
    return value


def _positive_scale(value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"prior scale must be positive and finite, got {value}")
    return value


class ScalarPrior(abc.ABC):
    """A prior of one scalar parameter, sampled in an unconstrained coordinate.

    Subclasses define the physical density and the bounds; the transform, its
    Jacobian and the latent distribution follow from the bounds (module docstring).
    """

    low: float = -math.inf
    high: float = math.inf

    # --- physical density -------------------------------------------------------------
    @property
    @abc.abstractmethod
    def fiducial(self) -> float:
        """Default value of the parameter (inside the support)."""

    @abc.abstractmethod
    def scipy(self):
        """The frozen :mod:`scipy.stats` distribution of :math:`\\theta` (reference)."""

    @abc.abstractmethod
    def _physical_distribution(self, dtype: tf.DType) -> tfd.Distribution:
        """The TFP distribution of :math:`\\theta`."""

    @abc.abstractmethod
    def _log_prob_physical(self, theta: tf.Tensor) -> tf.Tensor:
        """float64 :math:`\\ln p(\\theta)` of float64 ``theta`` inside the support."""

    def log_prob(self, value) -> np.ndarray | float:
        """Log density of :math:`\\theta` (NumPy float64; ``-inf`` outside the support)."""
        return self.scipy().logpdf(value)

    # --- unconstrained coordinate -------------------------------------------------------
    @property
    def is_bounded(self) -> bool:
        """Whether :math:`u \\ne \\theta` (some bound is finite)."""
        return math.isfinite(self.low) or math.isfinite(self.high)

    def physical(self, u: tf.Tensor) -> tf.Tensor:
        """:math:`\\theta = T(u)` in ``u``'s dtype (identity without bounds)."""
        if not self.is_bounded:
            return u
        lo, hi = math.isfinite(self.low), math.isfinite(self.high)
        dtype = u.dtype
        if lo and hi:
            width = tf.constant(self.high - self.low, dtype)
            return tf.constant(self.low, dtype) + width * tf.math.sigmoid(u)
        if lo:
            return tf.constant(self.low, dtype) + tf.exp(u)
        return tf.constant(self.high, dtype) - tf.exp(u)

    def physical_np(self, u) -> np.ndarray:
        """:math:`T(u)` in NumPy float64."""
        u = np.asarray(u, np.float64)
        lo, hi = math.isfinite(self.low), math.isfinite(self.high)
        if lo and hi:
            return self.low + (self.high - self.low) * special.expit(u)
        if lo:
            return self.low + np.exp(u)
        if hi:
            return self.high - np.exp(u)
        return u

    def unconstrained_np(self, theta) -> np.ndarray:
        """:math:`T^{-1}(\\theta)` in NumPy float64 (``theta`` inside the support)."""
        theta = np.asarray(theta, np.float64)
        lo, hi = math.isfinite(self.low), math.isfinite(self.high)
        if lo and hi:
            return special.logit((theta - self.low) / (self.high - self.low))
        if lo:
            return np.log(theta - self.low)
        if hi:
            return np.log(self.high - theta)
        return theta

    def log_abs_det_jacobian(self, u: tf.Tensor) -> tf.Tensor:
        """float64 :math:`\\ln|T'(u)|` of float64 ``u``."""
        lo, hi = math.isfinite(self.low), math.isfinite(self.high)
        if lo and hi:
            return math.log(self.high - self.low) - tf.math.softplus(u) - tf.math.softplus(-u)
        if lo or hi:
            return u
        return tf.zeros_like(u)

    def log_prob_latent(self, u: tf.Tensor) -> tf.Tensor:
        """float64 :math:`\\ln p_u(u) = \\ln p(T(u)) + \\ln|T'(u)|` (exact, every
        normalisation constant) of the latent ``u`` (any float dtype)."""
        u = tf.cast(u, tf.float64)
        return self._log_prob_physical(self.physical(u)) + self.log_abs_det_jacobian(u)

    def _bijector(self, dtype: tf.DType) -> tfb.Bijector:
        """:math:`T` as a TFP bijector (``dtype`` parameters)."""
        lo, hi = math.isfinite(self.low), math.isfinite(self.high)
        low, high = tf.constant(self.low, dtype), tf.constant(self.high, dtype)
        if lo and hi:
            return tfb.Sigmoid(low=low, high=high)
        if lo:
            return tfb.Chain([tfb.Shift(low), tfb.Exp()])
        return tfb.Chain([tfb.Shift(high), tfb.Scale(tf.constant(-1.0, dtype)), tfb.Exp()])

    def latent_distribution(self, dtype: tf.DType, name: str) -> tfd.Distribution:
        """The TFP distribution of the latent :math:`u` (for sampling and the joint model)."""
        physical = self._physical_distribution(dtype)
        if not self.is_bounded:
            return physical
        return tfd.TransformedDistribution(physical, tfb.Invert(self._bijector(dtype)), name=name)

    @property
    def latent_scale(self) -> float:
        """Standard deviation of :math:`u` under the prior (a metric scale), from 999
        evenly spaced quantiles."""
        q = (np.arange(999) + 0.5) / 999
        return float(np.std(self.unconstrained_np(self.scipy().ppf(q))))


@dataclasses.dataclass(frozen=True)
class NormalPrior(ScalarPrior):
    """:math:`\\theta \\sim \\mathcal N(\\mathrm{loc}, \\mathrm{scale}^2)`.

    Parameters
    ----------
    loc : float
        Mean (units of the parameter: ``log_amplitude`` is
        :math:`\\ln[P(k_p) / (\\mathrm{Mpc}/h)^3]`, ``index`` is dimensionless).
    scale : float
        Standard deviation, > 0.
    """

    loc: float
    scale: float

    def __post_init__(self):
        object.__setattr__(self, "loc", _finite("loc", self.loc))
        object.__setattr__(self, "scale", _positive_scale(self.scale))

    @property
    def fiducial(self) -> float:
        return self.loc

    def scipy(self):
        return stats.norm(self.loc, self.scale)

    def log_prob(self, value) -> np.ndarray | float:
        """Log density (NumPy/Python float64)."""
        z = (value - self.loc) / self.scale
        return -0.5 * z * z - math.log(self.scale) - 0.5 * _LOG_2PI

    def _physical_distribution(self, dtype, name=None):
        return tfd.Normal(tf.constant(self.loc, dtype), tf.constant(self.scale, dtype), name=name)

    def latent_distribution(self, dtype: tf.DType, name: str) -> tfd.Distribution:
        return self._physical_distribution(dtype, name=name)

    def _log_prob_physical(self, theta):
        z = (theta - self.loc) / self.scale
        return -0.5 * z * z - (math.log(self.scale) + 0.5 * _LOG_2PI)

    @property
    def latent_scale(self) -> float:
        return self.scale


@dataclasses.dataclass(frozen=True)
class TruncatedNormalPrior(ScalarPrior):
    """:math:`\\mathcal N(\\mathrm{loc}, \\mathrm{scale}^2)` restricted to ``[low, high]``.

    .. math:: p(\\theta) = \\frac{\\phi((\\theta - \\mu)/\\sigma)}
              {\\sigma\\,[\\Phi(\\beta) - \\Phi(\\alpha)]},\\quad
              \\alpha = \\frac{a - \\mu}{\\sigma},\\ \\beta = \\frac{b - \\mu}{\\sigma}

    Parameters
    ----------
    loc, scale : float
        Location and scale (> 0) of the untruncated Normal.
    low, high : float
        Bounds, ``low < high``; one (not both) may be infinite.
    """

    loc: float
    scale: float
    low: float = -math.inf
    high: float = math.inf

    def __post_init__(self):
        object.__setattr__(self, "loc", _finite("loc", self.loc))
        object.__setattr__(self, "scale", _positive_scale(self.scale))
        low, high = float(self.low), float(self.high)
        if math.isnan(low) or math.isnan(high) or low == math.inf or high == -math.inf:
            raise ValueError(f"prior bounds must be numbers, got low={low}, high={high}")
        if not low < high:
            raise ValueError(f"prior bounds out of order: low={low} must be < high={high}")
        if not (math.isfinite(low) or math.isfinite(high)):
            raise ValueError("a truncated Normal prior needs a finite low or high")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        if not self._log_normaliser > -700:  # Phi(beta) - Phi(alpha) underflows
            raise ValueError(
                f"prior bounds [{low}, {high}] hold no mass of N({self.loc}, {self.scale}^2)"
            )

    @property
    def _alpha_beta(self) -> tuple[float, float]:
        return (self.low - self.loc) / self.scale, (self.high - self.loc) / self.scale

    @property
    def _log_normaliser(self) -> float:
        """:math:`\\ln[\\Phi(\\beta) - \\Phi(\\alpha)]`, stable in either tail."""
        a, b = self._alpha_beta
        if a > 0:  # both in the upper tail: use the survival functions
            a, b = -b, -a
        la, lb = special.log_ndtr(a), special.log_ndtr(b)
        return float(lb + np.log1p(-np.exp(la - lb)))

    @property
    def fiducial(self) -> float:
        if self.low < self.loc < self.high:
            return self.loc
        return float(self.scipy().median())

    def scipy(self):
        a, b = self._alpha_beta
        return stats.truncnorm(a, b, loc=self.loc, scale=self.scale)

    def _physical_distribution(self, dtype):
        c = lambda x: tf.constant(x, dtype)  # noqa: E731
        return tfd.TruncatedNormal(c(self.loc), c(self.scale), c(self.low), c(self.high))

    def _log_prob_physical(self, theta):
        z = (theta - self.loc) / self.scale
        return -0.5 * z * z - (math.log(self.scale) + 0.5 * _LOG_2PI + self._log_normaliser)


@dataclasses.dataclass(frozen=True)
class UniformPrior(ScalarPrior):
    """:math:`\\theta \\sim \\mathcal U(\\mathrm{low}, \\mathrm{high})`, finite bounds.

    In the latent :math:`u` (:math:`\\theta = a + (b-a)\\sigma(u)`) this is the
    standard logistic distribution, :math:`\\ln p_u = -\\mathrm{softplus}(u) -
    \\mathrm{softplus}(-u)`.
    """

    low: float
    high: float

    def __post_init__(self):
        low, high = _finite("low", self.low), _finite("high", self.high)
        if not low < high:
            raise ValueError(f"prior bounds out of order: low={low} must be < high={high}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @property
    def fiducial(self) -> float:
        return 0.5 * (self.low + self.high)

    def scipy(self):
        return stats.uniform(self.low, self.high - self.low)

    def _physical_distribution(self, dtype):
        return tfd.Uniform(tf.constant(self.low, dtype), tf.constant(self.high, dtype))

    def _log_prob_physical(self, theta):
        return tf.fill(tf.shape(theta), tf.constant(-math.log(self.high - self.low), tf.float64))

    def latent_distribution(self, dtype: tf.DType, name: str) -> tfd.Distribution:
        """The standard logistic distribution, exactly the law of :math:`u` (sampled
        directly: no draw on a bound of the float32 interval maps to :math:`\\pm\\infty`)."""
        return tfd.Logistic(tf.zeros([], dtype), tf.ones([], dtype), name=name)


#: Prior kinds by their config name.
PRIOR_KINDS: dict[str, type[ScalarPrior]] = {
    "normal": NormalPrior,
    "truncated_normal": TruncatedNormalPrior,
    "uniform": UniformPrior,
}


def make_prior(kind: str, **arguments: float) -> ScalarPrior:
    """The prior of config kind ``kind`` (``normal``, ``truncated_normal``, ``uniform``)
    with its keyword ``arguments`` (``None`` values dropped)."""
    if kind not in PRIOR_KINDS:
        raise ValueError(f"prior kind must be one of {tuple(PRIOR_KINDS)}, got {kind!r}")
    return PRIOR_KINDS[kind](**{k: v for k, v in arguments.items() if v is not None})


def check_hyper_priors(
    hyper_priors: Mapping[str, ScalarPrior | tuple[float, float]] | None,
    names: tuple[str, ...] = HYPERPARAMETER_NAMES,
) -> dict[str, ScalarPrior]:
    """Validate ``{name: ScalarPrior or (loc, scale)}`` of the power spectrum's sampled
    parameters (``names``: its ``parameter_names``); return them in sampling order.

    Raises
    ------
    ValueError
        For a name not in ``names`` or a bad prior.
    """
    if not hyper_priors:
        return {}
    unknown = set(hyper_priors) - set(names)
    if unknown:
        raise ValueError(
            f"unknown hyperparameter(s) {sorted(unknown)}; expected a subset of {tuple(names)}"
        )
    out = {}
    for name in names:
        if name in hyper_priors:
            prior = hyper_priors[name]
            if not isinstance(prior, ScalarPrior):
                try:
                    loc, scale = prior
                except (TypeError, ValueError) as err:
                    raise ValueError(
                        f"prior of {name} must be a NormalPrior, TruncatedNormalPrior or "
                        f"UniformPrior, or (loc, scale), got {prior!r}"
                    ) from err
                prior = NormalPrior(loc, scale)
            out[name] = prior
    return out


def check_param_priors(param_priors: Mapping[str, ScalarPrior] | None) -> dict[str, ScalarPrior]:
    """Validate ``{name: ScalarPrior}`` of sampled forward-model parameters (order kept).

    Raises
    ------
    ValueError
        A name that is not an identifier, clashes with a P(k) hyperparameter or
        ``"field"``, or a value that is not a :class:`ScalarPrior`.
    """
    out: dict[str, ScalarPrior] = {}
    for name, prior in (param_priors or {}).items():
        if not str(name).isidentifier() or name in (*HYPERPARAMETER_NAMES, "field", "data"):
            raise ValueError(
                f"a sampled forward parameter cannot be called {name!r} (reserved or not an "
                "identifier)"
            )
        if not isinstance(prior, ScalarPrior):
            raise ValueError(
                f"prior of forward parameter {name} must be a NormalPrior, TruncatedNormalPrior "
                f"or UniformPrior, got {prior!r}"
            )
        out[name] = prior
    return out
