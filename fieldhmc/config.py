"""Validated run configuration; the only module that reads or writes YAML.

A run is described by one YAML file with the sections ``grid``, ``model``,
``data``, ``sampler``, ``outputs`` and the scalar ``precision``. The file is
parsed with a :class:`yaml.SafeLoader` subclass, validated into frozen pydantic
models (unknown keys are errors) and cross-checked (incompatible options,
input files that are missing, of the wrong shape or with invalid values), so
that a bad configuration fails in well under a second, before TensorFlow is
imported. Every failure is a :class:`ConfigError` whose message is one line
naming the offending dotted key, e.g.::

    config error: sampler.num_chains: must be >= 1 (got 0)

Defaults live in one place only: the ``Field`` declarations below, which
:func:`schema_text` (``fieldhmc config-schema``) prints.

Options that only apply to some kinds (``sampler.num_leapfrog_steps`` for
``hmc``, ``model.likelihood.nbar`` for ``lognormal_poisson``, ...) are an error
when given explicitly for another kind and are resolved to ``None`` there, so
the library never reads a value that does not apply.

Paths
-----
Relative input paths (``model.power.file``, ``model.likelihood.sigma_map``,
``model.likelihood.mask.file``, ``data.path``) are resolved against the
directory of the config file. ``outputs.directory`` is an output location and,
like ``--out`` on the command line, is resolved against the current working
directory. Values given with ``--set`` for a path key are resolved against the
current working directory as well. After loading, all paths are absolute.

This module must not import TensorFlow, nor any part of fieldhmc that does.
"""

import copy
import difflib
import math
import os
import re
import textwrap
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import numpy as np
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, PydanticUndefined

from fieldhmc import datafiles, forward_signature
from fieldhmc.samplers import kinds

__all__ = [
    "Config",
    "ConfigError",
    "DataConfig",
    "ForwardConfig",
    "GridConfig",
    "HyperparametersConfig",
    "IndexPrior",
    "LikelihoodConfig",
    "LogAmplitudePrior",
    "MaskConfig",
    "MaskGenerateConfig",
    "ModelConfig",
    "OutputsConfig",
    "ParameterPriorConfig",
    "PowerConfig",
    "SampledParameterConfig",
    "SamplerConfig",
    "config_from_dict",
    "dump_yaml",
    "load_config",
    "read_yaml",
    "schema_text",
    "write_yaml",
]

GAUSSIAN_LIKELIHOODS = ("gaussian", "masked_gaussian")
DATA_SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")

_ERROR_TYPE = "fieldhmc_config"
_MAX_SHOWN = 60


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


class ConfigError(ValueError):
    """An invalid configuration, reported as one line naming the offending key.

    Parameters
    ----------
    key : str
        Dotted key of the offending option (``sampler.num_chains``,
        ``grid.shape[1]``), or the config file path for file-level problems.
    message : str
        What is wrong, including the offending value where useful.

    Examples
    --------
    >>> str(ConfigError("sampler.num_chains", "must be >= 1 (got 0)"))
    'config error: sampler.num_chains: must be >= 1 (got 0)'
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = _one_line(key)
        self.message = _one_line(message)
        super().__init__(f"config error: {self.key}: {self.message}")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _field_error(field: str, message: str) -> PydanticCustomError:
    """Error raised inside a validator; ``field`` is dotted, relative to the model."""
    return PydanticCustomError(_ERROR_TYPE, "{message}", {"message": message, "field": field})


def _show(value: object) -> str:
    """Short, YAML-flavoured rendering of an offending input value."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = repr(value)
    text = _one_line(text)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _dotted(loc: Sequence[object]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "":
            out += f".{part}" if out else str(part)
    return out


_BOUNDS = {
    "greater_than": (">", "gt"),
    "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"),
    "less_than_equal": ("<=", "le"),
}


def _describe_error(
    error: Mapping[str, Any], root: type[BaseModel] | None = None
) -> tuple[str, str]:
    """Dotted key and concise message for one pydantic error entry (``root``: the
    model validated, default :class:`Config`)."""
    kind = error["type"]
    loc, holder = _resolve_loc(error["loc"], root or Config)
    ctx = error.get("ctx") or {}
    if kind == _ERROR_TYPE:
        field = ctx.get("field", "")
        return _dotted(loc + tuple(field.split("."))), ctx["message"]
    key = _dotted(loc)
    if kind == "missing":
        return key, "required key is missing"
    if kind == "extra_forbidden":
        return key, _unknown_key_message(holder, str(loc[-1]))
    if kind in _BOUNDS:
        symbol, name = _BOUNDS[kind]
        message = f"must be {symbol} {ctx.get(name)}"
    elif kind in ("model_type", "dict_type", "model_attributes_type"):
        message = "must be a mapping of keys to values"
    elif kind == "path_type":
        message = "must be a path string"
    elif kind == "bool_type":
        message = "must be true or false"
    else:
        message = str(error["msg"]).replace("Input should be", "must be")
        message = message[:1].lower() + message[1:]
    return key, f"{message} (got {_show(error.get('input'))})"


def _tagged_members(field: FieldInfo) -> dict[str, type[BaseModel]]:
    """Tag -> model of a discriminated-union field (empty for other fields)."""
    if field.discriminator is None:
        return {}
    out = {}
    for member in get_args(field.annotation):
        tag = get_args(member.model_fields[field.discriminator].annotation)
        if tag:
            out[tag[0]] = member
    return out


def _resolve_loc(
    loc: Sequence[object], root: type[BaseModel]
) -> tuple[tuple[object, ...], type[BaseModel] | None]:
    """``loc`` without the tags of discriminated unions (``sampler.nuts.x`` is
    ``sampler.x``), and the model holding its last key (None if unknown)."""
    out: list[object] = []
    model: type[BaseModel] | None = root
    holder = model
    parts = list(loc)
    i = 0
    while i < len(parts):
        part, holder = parts[i], model
        out.append(part)
        i += 1
        field = (
            model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        )
        if field is None:
            model = None
            continue
        members = _tagged_members(field)
        if members and i < len(parts) and parts[i] in members:
            model = members[parts[i]]
            i += 1
        else:
            model = _model_class(field.annotation)
    return tuple(out), holder


def _unknown_key_message(model: type[BaseModel] | None, given: str) -> str:
    if model is None:
        return "unknown key"
    allowed = list(model.model_fields)
    close = [name for name in allowed if name.startswith(given)] or difflib.get_close_matches(
        given, allowed, n=1
    )
    if close:
        return f"unknown key (did you mean '{close[0]}'?)"
    return f"unknown key (allowed: {', '.join(allowed)})"


def _config_error(exc: ValidationError) -> ConfigError:
    """Turn the first pydantic error into a one-line :class:`ConfigError`."""
    errors = exc.errors(include_url=False)
    if not errors:  # pragma: no cover - pydantic always reports at least one
        return ConfigError("config", str(exc))
    return ConfigError(*_describe_error(errors[0]))


# --------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------


def _set_resolved(model: BaseModel, **values: object) -> None:
    """Store resolved values on a freshly validated frozen model (validators only)."""
    for name, value in values.items():
        object.__setattr__(model, name, value)


def _apply_kind_rule(
    model: BaseModel, name: str, applies: bool, requirement: str, actual: str
) -> None:
    """Reject an explicitly given option that does not apply; resolve the rest.

    An option that does not apply is an error if it was given explicitly (and is not
    ``null``) and is otherwise set to ``None``. An option that applies but is ``None``
    gets its declared default. ``requirement`` says when the option applies
    (``"sampler.kind=hmc"``), ``actual`` what was chosen (``"sampler.kind=nuts"``).
    """
    value = getattr(model, name)
    if not applies:
        if value is not None and name in model.model_fields_set:
            raise _field_error(
                name, f"only used when {requirement} (here {actual}); remove it or set it to null"
            )
        _set_resolved(model, **{name: None})
    elif value is None:
        _set_resolved(model, **{name: type(model).model_fields[name].default})


def _absolute(value: object, base: Path | None) -> object:
    if value is None or not isinstance(value, str | os.PathLike):
        return value
    if isinstance(value, str) and not value.strip():
        raise _field_error("", "must be a non-empty path")
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = (base if base is not None else Path.cwd()) / path
    return Path(os.path.abspath(path))


def _input_path(value: object, info: ValidationInfo) -> object:
    """Resolve an input path against the config directory (validation context)."""
    base = (info.context or {}).get("base_dir")
    return _absolute(value, Path(base) if base is not None else None)


def _require_file(path: Path | None, suffixes: Sequence[str] = ()) -> Path | None:
    if path is None:
        return None
    if not path.exists():
        raise _field_error("", f"file not found: {path}")
    if not path.is_file():
        raise _field_error("", f"not a regular file: {path}")
    if suffixes and path.suffix.lower() not in suffixes:
        raise _field_error("", f"must be a {' or '.join(suffixes)} file (got {path.name!r})")
    return path


def _array_error(field: str, check: Any, *args: Any, **kwargs: Any) -> None:
    """Run a file check, re-raising its ``ValueError`` as an error at ``field``."""
    try:
        check(*args, **kwargs)
    except PydanticCustomError:  # already names its key
        raise
    except ValueError as exc:
        raise _field_error(field, str(exc)) from None


def _check_power_table(path: Path) -> None:
    try:
        table = np.loadtxt(path, ndmin=2, dtype=float)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path} as a two-column text table: {exc}") from None
    if table.shape[1] != 2 or table.shape[0] < 2:
        raise ValueError(f"need >= 2 rows of two columns k, P(k) (got shape {table.shape})")
    k, power = table[:, 0], table[:, 1]
    if not np.isfinite(table).all():
        raise ValueError(f"contains NaN or Inf values: {path}")
    if (k <= 0).any() or (np.diff(k) <= 0).any():
        raise ValueError(f"k (first column) must be > 0 and strictly increasing in {path}")
    if (power < 0).any():
        raise ValueError(f"P(k) (second column) must be >= 0 in {path}")


# --------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------

_FROZEN = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def _require_npy(path: Path | None) -> Path | None:
    return _require_file(path, (".npy",))


def _require_data(path: Path | None) -> Path | None:
    return _require_file(path, DATA_SUFFIXES)


# Optional input files: resolved against the config directory, then checked to exist.
TextFile = Annotated[Path | None, BeforeValidator(_input_path), AfterValidator(_require_file)]
NpyFile = Annotated[Path | None, BeforeValidator(_input_path), AfterValidator(_require_npy)]
DataFile = Annotated[Path | None, BeforeValidator(_input_path), AfterValidator(_require_data)]
Positive = Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]
GridSize = Annotated[int, Field(ge=2, strict=True)]


def _finite(default: float, description: str, **constraints: Any) -> Any:
    return Field(default, strict=True, allow_inf_nan=False, description=description, **constraints)


def _count(default: int, description: str, **constraints: Any) -> Any:
    return Field(default, strict=True, description=description, **constraints)


class GridConfig(BaseModel):
    """Real-space grid: voxel counts and physical box size."""

    model_config = _FROZEN

    shape: tuple[GridSize, GridSize, GridSize] = Field(
        (32, 32, 32),
        description="Voxels per axis (n0, n1, n2), each >= 2; odd and non-cubic grids allowed.",
    )
    box_size: tuple[Positive, Positive, Positive] = Field(
        (100.0, 100.0, 100.0),
        description="Box side length (> 0) in Mpc/h: one number (cubic box) or a list of 3 "
        "(per axis). Stored as 3 numbers.",
    )

    @field_validator("shape", mode="before")
    @classmethod
    def _shape_is_triple(cls, value: object) -> object:
        if not isinstance(value, list | tuple) or len(value) != 3:
            raise _field_error("", f"must be a list of 3 integers (got {_show(value)})")
        return tuple(value)

    @field_validator("box_size", mode="before")
    @classmethod
    def _box_is_triple(cls, value: object) -> object:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return (value, value, value)
        if not isinstance(value, list | tuple) or len(value) != 3:
            raise _field_error("", f"must be a number or a list of 3 numbers (got {_show(value)})")
        return tuple(value)


#: The cosmological parameters of ``model.power.kind=eisenstein_hu`` that can be sampled:
#: config key -> latent name (as in ``samples.nc``).
COSMOLOGY_LATENT_NAMES = {"omega_m": "Omega_m", "sigma8": "sigma8"}


class PowerConfig(BaseModel):
    """Prior power spectrum :math:`P(k) = A\\,(k/k_\\mathrm{pivot})^{n}`, a table, or the
    Eisenstein & Hu linear spectrum of :math:`(\\Omega_m, \\sigma_8)`."""

    model_config = _FROZEN

    kind: Literal["power_law", "turnover", "tabulated", "eisenstein_hu"] = Field(
        "power_law",
        description="power_law: P = A (k/k_pivot)^index; turnover: the same power law "
        "flattened below k_turnover; tabulated: interpolate the table in `file`; "
        "eisenstein_hu: the linear matter P(k) today of flat LCDM, Eisenstein & Hu (1998) "
        "transfer function, sigma8-normalised (docs/cosmology.md).",
    )
    amplitude: Positive | None = Field(
        1000.0,
        description="Amplitude A > 0 of P(k) at k_pivot, volume units (Mpc/h)^3; not for "
        "kind=eisenstein_hu.",
    )
    index: float | None = _finite(
        -1.5, "Spectral index n of P(k) = A (k/k_pivot)^n; not for kind=eisenstein_hu."
    )
    k_pivot: Positive | None = Field(
        0.1, description="Pivot wavenumber k_pivot > 0 in h/Mpc; not for kind=eisenstein_hu."
    )
    omega_m: Union[float, "SampledParameterConfig", None] = Field(
        0.3111,
        description="Matter density today, Omega_b < Omega_m <= 1: a number or {sample: true, "
        "prior: {kind: truncated_normal or uniform, ...}} with bounds inside (Omega_b, 1] "
        "(latent name Omega_m); kind=eisenstein_hu only.",
    )
    sigma8: Union[float, "SampledParameterConfig", None] = Field(
        0.8102,
        description="rms linear density today in 8 Mpc/h spheres, > 0: a number or {sample: "
        "true, prior: {...}} with a lower bound > 0; kind=eisenstein_hu only.",
    )
    omega_b: float | None = _finite(
        0.0490, "Baryon density today, in (0, 1) (fixed); kind=eisenstein_hu only.", gt=0, lt=1
    )
    h: Positive | None = Field(
        0.6766, description="H0 / (100 km/s/Mpc) > 0 (fixed); kind=eisenstein_hu only."
    )
    n_s: float | None = _finite(
        0.9665, "Primordial spectral index (fixed); kind=eisenstein_hu only."
    )
    wiggles: bool | None = Field(
        True,
        strict=True,
        description="Baryon oscillations in the transfer function (else the no-wiggle form); "
        "kind=eisenstein_hu only.",
    )

    @field_validator("omega_m", "sigma8", mode="before")
    @classmethod
    def _number_or_sampled(cls, value: object) -> object:
        return _number_or_sampled_parameter(value)

    k_turnover: Positive | None = Field(
        0.05, description="Turnover wavenumber > 0 in h/Mpc; kind=turnover only."
    )
    file: TextFile = Field(
        None,
        description="Text file with two columns k [h/Mpc], P(k) [(Mpc/h)^3], k increasing; "
        "required for kind=tabulated, forbidden otherwise.",
    )

    @model_validator(mode="after")
    def _check_kind(self) -> "PowerConfig":
        is_cosmology = self.kind == "eisenstein_hu"
        actual = f"model.power.kind={self.kind}"
        for name in ("amplitude", "index", "k_pivot"):
            _apply_kind_rule(
                self, name, not is_cosmology, "model.power.kind is not eisenstein_hu", actual
            )
        for name in ("omega_m", "sigma8", "omega_b", "h", "n_s", "wiggles"):
            _apply_kind_rule(self, name, is_cosmology, "model.power.kind=eisenstein_hu", actual)
        if is_cosmology:
            self._check_cosmology()
        _apply_kind_rule(
            self,
            "k_turnover",
            self.kind == "turnover",
            "model.power.kind=turnover",
            f"model.power.kind={self.kind}",
        )
        if self.kind == "tabulated" and self.file is None:
            raise _field_error("file", "required when model.power.kind=tabulated")
        _apply_kind_rule(
            self,
            "file",
            self.kind == "tabulated",
            "model.power.kind=tabulated",
            f"model.power.kind={self.kind}",
        )
        if self.file is not None:
            _array_error("file", _check_power_table, self.file)
        return self

    def _check_cosmology(self) -> None:
        """Omega_b < Omega_m <= 1 and sigma8 > 0, for numbers and for the support of a
        sampled parameter's prior (bounds inside the domain)."""
        domains = {
            "omega_m": (self.omega_b, 1.0, f"in (Omega_b, 1] = ({self.omega_b}, 1]"),
            "sigma8": (0.0, math.inf, "positive"),
        }
        for name, (low, high, requirement) in domains.items():
            value = getattr(self, name)
            if not isinstance(value, SampledParameterConfig):
                if not low < value <= high:
                    raise _field_error(name, f"must be {requirement} (got {value})")
                continue
            prior = value.prior
            lo = -math.inf if prior.low is None else prior.low
            hi = math.inf if prior.high is None else prior.high
            if not lo > low:
                raise _field_error(
                    f"{name}.prior",
                    f"its support reaches {name} <= {low}: {name} must be {requirement}; "
                    f"give a truncated_normal or uniform prior with low > {low}"
                    + ("" if prior.low is None else f" (got low={prior.low})"),
                )
            if not hi <= high:
                raise _field_error(
                    f"{name}.prior",
                    f"its support reaches {name} > {high}: {name} must be {requirement}; "
                    f"give a prior with high <= {high}"
                    + ("" if prior.high is None else f" (got high={prior.high})"),
                )

    @property
    def sampled(self) -> dict[str, "SampledParameterConfig"]:
        """The sampled cosmological parameters by latent name (``Omega_m``, ``sigma8``)."""
        if self.kind != "eisenstein_hu":
            return {}
        out = {}
        for key, latent in COSMOLOGY_LATENT_NAMES.items():
            value = getattr(self, key)
            if isinstance(value, SampledParameterConfig) and value.sample:
                out[latent] = value
        return out


class LogAmplitudePrior(BaseModel):
    """Normal prior on the log power-spectrum amplitude, log A."""

    model_config = _FROZEN

    sample: bool = Field(False, strict=True, description="Sample log A (else fixed).")
    prior_loc: float | None = _finite(
        None, "Mean of the Normal prior; null means log(model.power.amplitude)."
    )
    prior_scale: Positive = Field(1.0, description="Standard deviation (> 0) of the Normal prior.")


class IndexPrior(BaseModel):
    """Normal prior on the spectral index n."""

    model_config = _FROZEN

    sample: bool = Field(False, strict=True, description="Sample the index n (else fixed).")
    prior_loc: float | None = _finite(
        None, "Mean of the Normal prior; null means model.power.index."
    )
    prior_scale: Positive = Field(0.5, description="Standard deviation (> 0) of the Normal prior.")


class HyperparametersConfig(BaseModel):
    """Which power-spectrum hyperparameters are sampled (default: none)."""

    model_config = _FROZEN

    log_amplitude: LogAmplitudePrior = Field(
        default_factory=LogAmplitudePrior, description="Prior on log A."
    )
    index: IndexPrior = Field(default_factory=IndexPrior, description="Prior on the index n.")

    @property
    def is_any_sampled(self) -> bool:
        """Whether at least one hyperparameter is sampled."""
        return self.log_amplitude.sample or self.index.sample


class MaskGenerateConfig(BaseModel):
    """A synthetic mask generated from a seed."""

    model_config = _FROZEN

    kind: Literal["slab", "sphere", "random"] = Field(
        description="slab: a slab through the box; sphere: a ball; random: random voxels."
    )
    fraction: float = _finite(
        0.2, "Fraction of the voxels that are masked (unobserved), in (0, 1).", gt=0, lt=1
    )
    seed: int = _count(1, "Seed of the random placement of the generated mask (>= 0).", ge=0)


class MaskConfig(BaseModel):
    """Observation mask (1 = observed, 0 = unobserved): a file or a generated mask."""

    model_config = _FROZEN

    file: NpyFile = Field(
        None,
        description=".npy array of grid shape, 1 = observed, 0 = masked: only 0 and 1 for "
        "the gaussian kinds, a completeness in [0, 1] for lognormal_poisson; not all zero.",
    )
    generate: MaskGenerateConfig | None = Field(
        None, description="Generate a mask instead of reading one."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> "MaskConfig":
        if (self.file is None) == (self.generate is None):
            raise _field_error("", "give exactly one of mask.file or mask.generate")
        return self


class ShotNoiseConfig(BaseModel):
    """Gaussian shot noise of a tracer of number density nbar: variance 1/(nbar V_cell)."""

    model_config = _FROZEN

    nbar: Positive = Field(
        description="Mean number density of the tracer, > 0, in (h/Mpc)^3 (objects per "
        "(Mpc/h)^3): the noise standard deviation per voxel is 1/sqrt(nbar V_cell), V_cell "
        "the cell volume in (Mpc/h)^3."
    )


class LikelihoodConfig(BaseModel):
    """Observation model of the data given the field."""

    model_config = _FROZEN

    kind: Literal["gaussian", "masked_gaussian", "lognormal_poisson"] = Field(
        "gaussian",
        description="gaussian: data = field + white noise; masked_gaussian: the same on "
        "the observed voxels of `mask`; lognormal_poisson: Poisson counts with mean "
        "nbar * exp(field - var/2) (times the mask if given).",
    )
    sigma: Positive | None = Field(
        1.0,
        description="Noise standard deviation per voxel, > 0 (gaussian kinds); exclusive with "
        "sigma_map and shot_noise.",
    )
    shot_noise: ShotNoiseConfig | None = Field(
        None,
        description="{nbar: ...}: the noise standard deviation per voxel is 1/sqrt(nbar "
        "V_cell) (Gaussian shot noise of a tracer of density nbar, (h/Mpc)^3); gaussian kinds "
        "only, exclusive with sigma and sigma_map.",
    )
    sigma_map: NpyFile = Field(
        None,
        description=".npy array of grid shape with the noise standard deviation per voxel, "
        "finite and > 0 on observed voxels, any value (NaN too) on masked ones (gaussian "
        "kinds).",
    )
    mask: MaskConfig | None = Field(
        None,
        description="Required for masked_gaussian, optional for lognormal_poisson, forbidden "
        "for gaussian: {file: mask.npy} or {generate: {kind, fraction, seed}}.",
    )
    nbar: Positive | None = Field(
        2.0, description="Mean count per voxel, > 0; lognormal_poisson only."
    )

    @model_validator(mode="after")
    def _check_kind(self) -> "LikelihoodConfig":
        is_gaussian = self.kind in GAUSSIAN_LIKELIHOODS
        requirement = "model.likelihood.kind is gaussian or masked_gaussian"
        actual = f"model.likelihood.kind={self.kind}"
        _apply_kind_rule(self, "sigma_map", is_gaussian, requirement, actual)
        _apply_kind_rule(self, "shot_noise", is_gaussian, requirement, actual)
        if is_gaussian and self.shot_noise is not None:
            if self.sigma_map is not None:
                raise _field_error("shot_noise", "give either shot_noise or sigma_map, not both")
            if self.sigma is not None and "sigma" in self.model_fields_set:
                raise _field_error("sigma", "give either sigma or shot_noise, not both")
            _set_resolved(self, sigma=None)
        elif is_gaussian and self.sigma_map is not None:
            if self.sigma is not None and "sigma" in self.model_fields_set:
                raise _field_error("sigma", "give either sigma or sigma_map, not both")
            _set_resolved(self, sigma=None)
        else:
            _apply_kind_rule(self, "sigma", is_gaussian, requirement, actual)
        _apply_kind_rule(
            self, "nbar", not is_gaussian, "model.likelihood.kind=lognormal_poisson", actual
        )
        if self.kind == "masked_gaussian" and self.mask is None:
            raise _field_error("mask", "required when model.likelihood.kind=masked_gaussian")
        if self.kind == "gaussian" and self.mask is not None:
            raise _field_error(
                "mask", "not used by model.likelihood.kind=gaussian (use masked_gaussian)"
            )
        return self


class ParameterPriorConfig(BaseModel):
    """Prior of a sampled forward-model parameter (see fieldhmc.models.priors)."""

    model_config = _FROZEN

    kind: Literal["normal", "truncated_normal", "uniform"] = Field(
        description="normal: N(loc, scale^2); truncated_normal: N(loc, scale^2) restricted "
        "to [low, high] (one bound may be omitted); uniform: U(low, high). Bounded priors "
        "are sampled in an unconstrained coordinate (exact Jacobian)."
    )
    loc: float | None = _finite(None, "Mean (normal, truncated_normal: before truncation).")
    scale: Positive | None = Field(
        None, description="Standard deviation > 0 (normal, truncated_normal: before truncation)."
    )
    low: float | None = _finite(None, "Lower bound (truncated_normal, uniform).")
    high: float | None = _finite(None, "Upper bound (truncated_normal, uniform).")

    @model_validator(mode="after")
    def _check_kind(self) -> "ParameterPriorConfig":
        actual = f"kind={self.kind}"
        is_normal = self.kind in ("normal", "truncated_normal")
        for name in ("loc", "scale"):
            if is_normal and getattr(self, name) is None:
                raise _field_error(name, f"required when kind={self.kind}")
            _apply_kind_rule(self, name, is_normal, "kind=normal or truncated_normal", actual)
        for name in ("low", "high"):
            if self.kind == "uniform" and getattr(self, name) is None:
                raise _field_error(name, "required when kind=uniform")
            applies = self.kind != "normal"
            _apply_kind_rule(self, name, applies, "kind=truncated_normal or uniform", actual)
        if self.kind == "truncated_normal" and self.low is None and self.high is None:
            raise _field_error("low", "kind=truncated_normal needs low or high (or both)")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise _field_error(
                "high", f"bounds out of order: must be > low={self.low} (got {self.high})"
            )
        if self.kind == "truncated_normal":
            # the mass of N(loc, scale^2) inside [low, high], from the nearer tail
            a = -math.inf if self.low is None else (self.low - self.loc) / self.scale
            b = math.inf if self.high is None else (self.high - self.loc) / self.scale
            if a > 0:
                a, b = -b, -a
            mass = 0.5 * (math.erfc(-b / math.sqrt(2.0)) - math.erfc(-a / math.sqrt(2.0)))
            if not mass > 1e-300:
                raise _field_error(
                    "low" if self.low is not None and self.loc < self.low else "high",
                    f"[low, high] holds no mass of N(loc={self.loc}, scale={self.scale}^2)",
                )
        return self

    @property
    def arguments(self) -> dict[str, float]:
        """Keyword arguments of ``fieldhmc.models.make_prior(kind, ...)`` (given ones)."""
        names = ("loc", "scale", "low", "high")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


class SampledParameterConfig(BaseModel):
    """A forward-model parameter given a prior: sampled with the field (or, with
    ``sample: false``, fixed at the prior's fiducial value: loc, or a uniform's midpoint)."""

    model_config = _FROZEN

    sample: bool = Field(True, strict=True, description="Sample the parameter (else fixed).")
    prior: ParameterPriorConfig = Field(description="Its prior.")


def _sampled_parameter(value: object, where: str) -> SampledParameterConfig:
    """Validate ``{sample, prior}`` given under key ``where`` (errors name the full key)."""
    try:
        return SampledParameterConfig.model_validate(value)
    except ValidationError as exc:
        key, message = _describe_error(exc.errors(include_url=False)[0], SampledParameterConfig)
        raise _field_error(".".join(k for k in (where, key) if k), message) from None


def _number_or_sampled_parameter(value: object) -> object:
    """A finite number (as float), ``{sample, prior}`` or ``None`` (a field validator)."""
    if isinstance(value, Mapping):
        return _sampled_parameter(value, "")
    if value is None or isinstance(value, SampledParameterConfig):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _field_error("", f"must be a number or {{sample, prior}} (got {_show(value)})")
    if not math.isfinite(value):
        raise _field_error("", f"must be finite (got {value})")
    return float(value)


PowerConfig.model_rebuild()  # its omega_m / sigma8 refer to SampledParameterConfig


_TARGET_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def _plain_param(value: object, where: str) -> None:
    """Forward-model params must be plain YAML values (numbers, strings, bools, lists)."""
    if value is None or isinstance(value, bool | int | float | str):
        if isinstance(value, float) and not math.isfinite(value):
            raise _field_error(where, f"must be finite (got {value})")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _plain_param(item, f"{where}[{i}]")
        return
    raise _field_error(
        where, f"must be a number, string, bool or a list of them (got {_show(value)})"
    )


#: The Lagrangian bias parameters of ``model.forward.kind=lpt`` (``params`` keys), in order.
LPT_BIAS_NAMES = ("b1", "b2", "bs2", "bnabla2")


class ForwardConfig(BaseModel):
    """Forward model from the initial field delta to the prediction the likelihood sees."""

    model_config = _FROZEN

    kind: Literal["python", "zeldovich", "lpt"] = Field(
        description="python: your TensorFlow function `target`, called as "
        "function(delta, **params) with delta [chains, n0, n1, n2]; zeldovich: built-in "
        "1LPT displacement + cloud-in-cell painting (see docs/forward-models.md); lpt: the "
        "galaxy-clustering model, growth at a_obs from Omega_m, 2LPT, redshift space, "
        "Lagrangian bias, CIC (needs model.power.kind=eisenstein_hu; docs/cosmology.md)."
    )
    target: str | None = Field(
        None,
        description="'package.module:function' (importable) or 'path/to/file.py:function' "
        "(relative to the config file); kind=python only.",
    )
    params: dict[str, Any] | None = Field(
        None,
        description="Keyword arguments of the python function (numbers, strings, bools, "
        "lists), or {sample: true, prior: {kind, loc, scale, low, high}} for a parameter "
        "sampled with the field (passed as a tensor [chains]); kind=python, and kind=lpt "
        "with bias=lagrangian: the biases b1, b2, bs2, bnabla2 (numbers or {sample, prior}; "
        "default 0).",
    )
    growth: float | SampledParameterConfig | None = Field(
        1.0,
        description="Linear growth factor D multiplying the Zel'dovich displacement, a number "
        "or {sample: true, prior: {...}}; kind=zeldovich only.",
    )
    bias: float | SampledParameterConfig | Literal["lagrangian", "none"] | None = Field(
        1.0,
        description="kind=zeldovich: linear Eulerian bias b of the prediction b * "
        "delta_evolved, a number or {sample: true, prior: {...}}; kind=lpt: lagrangian "
        "(default; weights 1 + b1 delta + b2 (delta^2 - <delta^2>) + bs2 (s^2 - <s^2>) + "
        "bnabla2 lap delta, parameters in params) or none (the matter field).",
    )
    order: int | None = _count(2, "LPT order, 1 or 2; kind=lpt only.", ge=1, le=2)
    rsd: bool | None = Field(
        True,
        strict=True,
        description="Redshift-space distortions along los_axis (plane-parallel); kind=lpt only.",
    )
    los_axis: int | None = _count(
        2, "Line-of-sight axis of the box, 0, 1 or 2; kind=lpt only.", ge=0, le=2
    )
    a_obs: float | None = _finite(0.5, "Scale factor of the observation, in (0, 1]; kind=lpt only.")
    deconvolve: bool | None = Field(
        True,
        strict=True,
        description="Divide the painted field's modes by the CIC window; kind=lpt only.",
    )
    smoothing: float | None = _finite(
        None,
        "Gaussian smoothing radius (>= 0, Mpc/h) of the evolved density; null or 0: none; "
        "kind=zeldovich only.",
        ge=0,
    )

    @field_validator("target", mode="before")
    @classmethod
    def _resolve_target(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        module, sep, attr = value.partition(":")
        if sep and module.endswith(".py"):
            path = _input_path(module, info)
            if not Path(path).is_file():
                raise _field_error("", f"file not found: {path}")
            return f"{path}:{attr}"
        return value

    @field_validator("growth", "bias", mode="before")
    @classmethod
    def _number_or_sampled(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str) and info.data.get("kind") == "lpt":
            if value not in ("lagrangian", "none"):
                raise _field_error("", f"must be lagrangian or none for kind=lpt (got {value!r})")
            return value
        return _number_or_sampled_parameter(value)

    @model_validator(mode="after")
    def _check_kind(self) -> "ForwardConfig":
        actual = f"model.forward.kind={self.kind}"
        is_python = self.kind == "python"
        if is_python and self.target is None:
            raise _field_error("target", "required when model.forward.kind=python")
        if self.target is not None:
            module, _, attr = self.target.partition(":")
            if not (module.endswith(".py") or _TARGET_RE.match(self.target)) or not attr:
                raise _field_error(
                    "target",
                    f"must be 'package.module:function' or 'file.py:function' "
                    f"(got {self.target!r})",
                )
        _apply_kind_rule(self, "target", is_python, "model.forward.kind=python", actual)
        is_lpt = self.kind == "lpt"
        _apply_kind_rule(
            self, "params", is_python or is_lpt, "model.forward.kind is python or lpt", actual
        )
        params = {}
        for key, value in (self.params or {}).items():
            if not re.match(r"^[A-Za-z_]\w*$", str(key)):
                raise _field_error("params", f"keys must be Python identifiers (got {key!r})")
            if isinstance(value, Mapping | SampledParameterConfig):
                value = _sampled_parameter(value, f"params.{key}")
            else:
                _plain_param(value, f"params.{key}")
            params[key] = value
        if is_python:
            _set_resolved(self, params=params)
            self._check_params_accepted()
        is_zeldovich = self.kind == "zeldovich"
        for name in ("growth", "smoothing"):
            _apply_kind_rule(self, name, is_zeldovich, "model.forward.kind=zeldovich", actual)
        if is_lpt:
            self._check_lpt(params)
        else:
            if isinstance(self.bias, str):
                raise _field_error(
                    "bias",
                    f"must be a number or {{sample, prior}} for {actual} (got {self.bias!r})",
                )
            _apply_kind_rule(self, "bias", is_zeldovich, "model.forward.kind=zeldovich", actual)
        for name in ("order", "rsd", "los_axis", "a_obs", "deconvolve"):
            _apply_kind_rule(self, name, is_lpt, "model.forward.kind=lpt", actual)
        return self

    def _check_lpt(self, params: dict[str, Any]) -> None:
        """kind=lpt: bias lagrangian or none, a_obs in (0, 1], params only the biases."""
        if "bias" not in self.model_fields_set or self.bias is None:
            _set_resolved(self, bias="lagrangian")
        elif not isinstance(self.bias, str):
            raise _field_error(
                "bias", f"must be lagrangian or none for kind=lpt (got {_show(self.bias)})"
            )
        if self.a_obs is not None and not 0.0 < self.a_obs <= 1.0:
            raise _field_error("a_obs", f"must be in (0, 1] (got {self.a_obs})")
        names = LPT_BIAS_NAMES if self.bias == "lagrangian" else ()
        for key, value in params.items():
            if key not in names:
                what = (
                    "sampled parameter"
                    if isinstance(value, SampledParameterConfig)
                    else ("parameter")
                )
                has = f"it has {', '.join(names)}" if names else "bias=none has no parameters"
                raise _field_error(
                    f"params.{key}",
                    f"the lpt forward model has no {what} {key!r} ({has})",
                )
            if not isinstance(value, SampledParameterConfig) and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise _field_error(
                    f"params.{key}", f"must be a number or {{sample, prior}} (got {_show(value)})"
                )
        _set_resolved(
            self,
            params={
                k: v if isinstance(v, SampledParameterConfig) else float(v)
                for k, v in params.items()
            },
        )

    def _check_params_accepted(self) -> None:
        """Every param is a keyword the function accepts: its source is parsed with
        :mod:`ast`, nothing imported (``run`` imports and calls it as well)."""
        accepted = forward_signature.accepted_keywords(self.target)
        if accepted is None:
            return
        signature, keywords = accepted
        for key, value in self.params.items():
            if key not in keywords:
                sampled = isinstance(value, SampledParameterConfig)
                what = "sampled parameter" if sampled else "parameter"
                raise _field_error(
                    f"params.{key}",
                    f"{signature} does not accept the {what} {key!r} ({self.target})",
                )

    @property
    def sampled(self) -> dict[str, SampledParameterConfig]:
        """The parameters given a prior and ``sample: true``, in latent order."""
        if self.kind == "zeldovich":
            values = {"growth": self.growth, "bias": self.bias}
        elif self.kind == "lpt":
            values = {k: (self.params or {}).get(k) for k in LPT_BIAS_NAMES}
        else:
            values = dict(self.params or {})
        return {
            k: v for k, v in values.items() if isinstance(v, SampledParameterConfig) and v.sample
        }


class ModelConfig(BaseModel):
    """Prior (parametrisation, power spectrum, hyperparameters), forward model and likelihood."""

    model_config = _FROZEN

    parametrisation: Literal["noncentred", "centred", "conditional", "conditional_scale"] = Field(
        "noncentred",
        description="noncentred: sample white-noise modes scaled by sqrt(P); centred: "
        "sample the Fourier modes of the field directly; conditional: white-noise modes "
        "mapped through the conditional posterior (mean and width) of a linear surrogate of "
        "the likelihood at the current hyperparameters (for sampled hyperparameters; the "
        "preconditioners prior and posterior are then the same); conditional_scale: the "
        "same without the mean (scale only).",
    )
    power: PowerConfig = Field(default_factory=PowerConfig, description="Prior power spectrum.")
    hyperparameters: HyperparametersConfig = Field(
        default_factory=HyperparametersConfig,
        description="Sampled power-spectrum hyperparameters.",
    )
    forward: ForwardConfig | None = Field(
        None,
        description="Forward model applied to the field before the likelihood compares it "
        "with the data ({kind: zeldovich, growth, smoothing} or {kind: python, target, "
        "params}); null: the identity (the data observe the field itself).",
    )
    likelihood: LikelihoodConfig = Field(
        default_factory=LikelihoodConfig,
        description="Likelihood of the data given the prediction (the field, or the forward "
        "model's output).",
    )

    @model_validator(mode="after")
    def _resolve_priors(self) -> "ModelConfig":
        hyper = self.hyperparameters
        if self.power.kind in ("tabulated", "eisenstein_hu"):
            for name in ("log_amplitude", "index"):
                if getattr(hyper, name).sample:
                    what = (
                        " (sample power.omega_m and power.sigma8 instead)"
                        if self.power.kind == "eisenstein_hu"
                        else ""
                    )
                    raise _field_error(
                        f"hyperparameters.{name}.sample",
                        "cannot sample power-spectrum hyperparameters with "
                        f"model.power.kind={self.power.kind}{what}",
                    )
        forward = self.forward
        if forward is not None and forward.kind == "lpt" and self.power.kind != "eisenstein_hu":
            raise _field_error(
                "forward.kind",
                "lpt takes its growth from Omega_m: it needs model.power.kind=eisenstein_hu "
                f"(got {self.power.kind})",
            )
        log_amplitude, index = hyper.log_amplitude, hyper.index
        if self.power.amplitude is None:  # eisenstein_hu: no log A / n to sample
            return self
        if log_amplitude.prior_loc is None:
            log_amplitude = log_amplitude.model_copy(
                update={"prior_loc": math.log(self.power.amplitude)}
            )
        if index.prior_loc is None:
            index = index.model_copy(update={"prior_loc": self.power.index})
        resolved = hyper.model_copy(update={"log_amplitude": log_amplitude, "index": index})
        _set_resolved(self, hyperparameters=resolved)
        return self

    @property
    def samples_power(self) -> bool:
        """Whether a power-spectrum parameter is sampled (log A, n, or the cosmology's)."""
        return self.hyperparameters.is_any_sampled or bool(self.power.sampled)

    @property
    def sampled_parameter_names(self) -> tuple[str, ...]:
        """Every sampled scalar in latent order: the P(k) hyperparameters, then the
        forward model's parameters (config order)."""
        power = [n for n in ("log_amplitude", "index") if getattr(self.hyperparameters, n).sample]
        power += list(self.power.sampled)
        forward = list(self.forward.sampled) if self.forward is not None else []
        return (*power, *forward)


class DataConfig(BaseModel):
    """Where the observed data come from."""

    model_config = _FROZEN

    source: Literal["simulate", "file"] = Field(
        "simulate",
        description="simulate: draw a field from the prior and data from the likelihood; "
        "file: read the data array from `path`.",
    )
    seed: int = _count(42, "Seed of the simulated field and data (>= 0).", ge=0)
    path: DataFile = Field(
        None,
        description=f"Data file ({', '.join(DATA_SUFFIXES)}) holding an array of grid shape "
        "(any value, NaN too, in masked voxels: they are ignored); required for source=file, "
        "forbidden otherwise.",
    )
    key: str = Field(
        "data", min_length=1, strict=True, description="Array name inside .npz/.h5/.hdf5 files."
    )

    @model_validator(mode="after")
    def _check_source(self) -> "DataConfig":
        if self.source == "file" and self.path is None:
            raise _field_error("path", "required when data.source=file")
        _apply_kind_rule(
            self, "path", self.source == "file", "data.source=file", f"data.source={self.source}"
        )
        return self


def _kind_list() -> str:
    return "; ".join(f"{k.name}: {k.description}" for k in kinds.all_kinds())


class _SamplerCommon(BaseModel):
    """The settings every sampler kind takes (see :data:`SamplerConfig`)."""

    model_config = _FROZEN

    kind: str = Field(
        "hmc",
        description=f"{_kind_list()}. Each kind takes the options listed with it below.",
    )
    num_chains: int = _count(4, "Number of parallel chains (>= 1; chees/snaper need >= 2).", ge=1)
    num_burnin_steps: int = _count(200, "Adaptation/burn-in steps per chain (>= 0).", ge=0)
    num_results: int = _count(500, "Kept steps per chain, before thinning (>= 1).", ge=1)
    step_size: Positive = Field(
        0.1,
        description="Initial leapfrog step size (> 0); adapted during burn-in. For "
        "mclmc/mams in units of sqrt(d) (the whitened state moves by step_size*sqrt(d) "
        "per step, as in HMC).",
    )
    preconditioner: Literal["identity", "diagonal", "dense_params", "prior", "posterior"] | None = (
        Field(
            None,
            description="Mass matrix: identity; diagonal (adapted in warm-up windows); "
            "dense_params (as diagonal for the field, and a dense covariance of the sampled "
            "scalar parameters adapted in the same windows; needs >= 2 sampled parameters, "
            "not with mclmc/mams/chees/snaper nor on a mesh); prior (prior covariance of "
            "the modes); posterior (Gaussian-approximation posterior covariance of the modes). "
            "Default (null): prior when the likelihood has a mask (masked_gaussian, or "
            "lognormal_poisson with a mask: the posterior metric spreads the mean noise "
            "precision over the masked voxels too, see benchmarks/README.md) or "
            "hyperparameters are sampled (but posterior for the conditional parametrisation "
            "with a gaussian or masked_gaussian likelihood and no forward model: its block for "
            "the sampled P(k) parameters is their Laplace fit at the data's mode); posterior "
            "otherwise (exact for gaussian with scalar sigma); identity with a distribution "
            "section.",
        )
    )
    metric_pooling: Literal["shells", "none"] = Field(
        "shells",
        description="diagonal / dense_params: shells shrinks each warm-up window's variance "
        "estimates of the field latent toward the mean of their |k| shell (James-Stein: as "
        "far as the shell's spread is sampling noise), so one noisy estimate does not "
        "mis-scale a mode; none: per coordinate, as Stan. Per coordinate on a mesh "
        "(distribution section).",
    )
    init: Literal["prior", "zeros", "wiener", "posterior"] = Field(
        "prior",
        description="Initial state: a prior draw, zeros, the Wiener-filter mean (gaussian "
        "likelihoods with fixed hyperparameters only), or posterior: hyperparameters at "
        "their fiducial values and per chain a draw of the field's linear-surrogate "
        "conditional posterior there (the conditional parametrisation's; exact for "
        "unmasked gaussian data and the identity forward model), in the bulk of the "
        "posterior where a prior draw sits far out along the modes the data measure.",
    )
    init_jitter: float = _finite(
        0.0, "Scale of Gaussian jitter added to the initial state (>= 0).", ge=0
    )
    field_warmup: int = _count(
        0,
        "Transitions of a field-only warm-up before the run (>= 0; 0: none; needs sampled "
        "scalar parameters, not with a distribution section): the same kind, its own "
        "tuning, the sampled parameters held at their initial values; the run then starts "
        "from its last field. As the field-level benchmark does: from a field that fits "
        "the data badly (a prior or linear-surrogate draw) the parameters first move to "
        "make up for the field, and on the galaxy model at 32³ mclmc's chains went to a "
        "false mode (sigma8 at its bound, b1 ~40, a field 13x too weak) that way.",
        ge=0,
    )
    seed: int = _count(0, "Sampler seed (>= 0).", ge=0)
    chunk_size: int | Literal["auto"] = Field(
        "auto",
        description="Steps per compiled chunk: draws reach the outputs after each (>= 1), or "
        "auto: 2^24 / (gradients per transition x chains x grid cells) transitions, within "
        "50..1000 (mclmc with 4 chains: 512 at 16^3, 64 at 32^3, 50 from 64^3); 50 for kinds "
        "whose gradients per transition are tuned (fieldnuts, mams). A chunk costs a few ms "
        "besides its transitions, a few % of short chunks.",
    )
    checkpoint_seconds: float = _finite(
        30.0,
        "Seconds of sampling between checkpoints (>= 0; 0: after every chunk). A checkpoint "
        "follows the first chunk, the chunk that ends warm-up and the last; a killed run "
        "resumes from its last checkpoint, replaying up to this much sampling and a chunk.",
        ge=0,
    )
    thin: int = _count(1, "Keep every thin-th draw (>= 1).", ge=1)

    @field_validator("chunk_size", mode="before")
    @classmethod
    def _chunk_size_or_auto(cls, value: object) -> object:
        if value == "auto" or (
            isinstance(value, int) and not isinstance(value, bool) and value >= 1
        ):
            return value
        raise _field_error("", f"must be an integer >= 1 or auto (got {_show(value)})")

    @property
    def sampler_kind(self) -> kinds.SamplerKind:
        """The registered kind (:mod:`fieldhmc.samplers.kinds`)."""
        return kinds.get(self.kind)

    @model_validator(mode="after")
    def _check_kind(self) -> "_SamplerCommon":
        kind = self.sampler_kind
        try:
            kind.check(self)
        except kinds.OptionError as exc:
            raise _field_error(exc.field, exc.message) from None
        if "target_accept_prob" in type(self).model_fields and self.target_accept_prob is None:
            _set_resolved(self, target_accept_prob=kind.default_target_accept_prob)
        return self


# One section model per kind: the common settings plus the kind's own options.
_SAMPLER_SECTIONS: dict[str, type[_SamplerCommon]] = {
    k.name: type(
        f"{type(k).__name__}SamplerConfig",
        (k.options, _SamplerCommon),
        {"__module__": __name__, "__doc__": f"``sampler`` section of kind {k.name}."},
    )
    for k in kinds.all_kinds()
}

#: The ``sampler`` section: a discriminated union on ``kind`` of the kinds' sections.
SamplerConfig = Annotated[
    Union[tuple(_SAMPLER_SECTIONS.values())],  # noqa: UP007 (built from the registry)
    Field(discriminator="kind"),
]


def _kinds_text(names: Sequence[str]) -> str:
    """When an option applies: ``sampler.kind=hmc``, ``sampler.kind is nuts or fieldnuts``,
    ``sampler.kind is not mclmc``."""
    if len(names) == 1:
        return f"sampler.kind={names[0]}"
    others = [n for n in kinds.KINDS if n not in names]
    if len(others) == 1:
        return f"sampler.kind is not {others[0]}"
    return f"sampler.kind is {', '.join(names[:-1])} or {names[-1]}"


def _sampler_section(value: object) -> object:
    """The raw ``sampler`` mapping with its kind (default hmc) and without the options
    that do not apply to it: an error if given (not null), dropped if null. A null own
    option takes its default."""
    if not isinstance(value, Mapping):
        return value
    value = dict(value)
    name = value.setdefault("kind", "hmc")
    if not isinstance(name, str) or name not in kinds.KINDS:
        choices = ", ".join(repr(k) for k in kinds.KINDS[:-1]) + f" or {kinds.KINDS[-1]!r}"
        raise _field_error("kind", f"must be {choices} (got {_show(name)})")
    own = kinds.get(name).option_names
    for key in [k for k in value if k not in _SamplerCommon.model_fields]:
        owners = kinds.names_where(lambda k, key=key: key in k.option_names)
        if value[key] is None and (owners or key in own):
            del value[key]
        elif owners and key not in own:
            raise _field_error(
                key,
                f"only used when {_kinds_text(owners)} (here sampler.kind={name}); "
                "remove it or set it to null",
            )
    return value


class OutputsConfig(BaseModel):
    """What is written to the run directory."""

    model_config = _FROZEN

    directory: Path = Field(
        Path("runs/default"),
        description="Run directory; relative paths are taken from the current working "
        "directory (like --out).",
    )
    store_fields: bool = Field(True, strict=True, description="Store thinned field draws.")
    field_thin: int = _count(10, "Keep every n-th stored field draw (>= 1).", ge=1)
    tracked_modes: int = _count(
        8, "Number of individual Fourier modes whose full traces are kept (>= 0).", ge=0
    )
    tensorboard: bool = Field(
        False,
        strict=True,
        description="Also write per-chunk TensorBoard scalars (acceptance, step size, "
        "divergences, leapfrogs, log prob) to <run>/tensorboard.",
    )

    @field_validator("directory", mode="before")
    @classmethod
    def _resolve_directory(cls, value: object) -> object:
        return _absolute(value, None)


class DistributionConfig(BaseModel):
    """Shard the field over a 1-D DTensor mesh (``docs/distributed-fields.md``)."""

    model_config = _FROZEN

    mesh: tuple[int] = Field(
        description="Devices of the 1-D mesh, e.g. [4]; must divide grid.shape[0] and [1]."
    )
    devices: Literal["cpu", "gpu"] = Field(
        "cpu", description="cpu: virtual CPU devices made by the CLI; gpu: the host's GPUs."
    )

    @field_validator("mesh")
    @classmethod
    def _positive(cls, value: tuple[int]) -> tuple[int]:
        if value[0] < 1:
            raise ValueError(f"must be a positive device count (got {value[0]})")
        return value


def default_preconditioner(config: "Config") -> str:
    """``sampler.preconditioner`` when the config leaves it out (or null).

    ``posterior`` (the Fourier-diagonal posterior precision
    :math:`1 + s_k \\overline{W}`) without a mask: exact for Gaussian noise of scalar
    sigma, and fewer gradients per min-ESS than ``prior`` for Poisson counts. With a
    mask, :math:`\\overline W` (the mean of the mask times the noise precision) shrinks
    the step of the masked voxels too, whose posterior is the prior: there ``prior``
    needs fewer gradients per min-ESS (``benchmarks/sampling.py``; the figures are in
    ``benchmarks/README.md``). Sampled hyperparameters get ``prior``, but under the
    ``conditional`` parametrisation of the field with Gaussian data (identity forward
    model, masked or not) ``posterior``: its field part is then the prior's (the latent
    is whitened given the parameters either way) and its block for the sampled P(k)
    parameters is their Laplace fit at the data's posterior mode (MCLMC at 32³: 4.8
    gradients per min-ESS, 185 with the fiducial Fisher widths, which in turn beat the
    prior widths at 16³: ``benchmarks/README.md``); a sharded run defaults to
    ``identity`` (``prior`` and ``posterior`` run there too when asked for).
    """
    if config.distribution is not None:
        return "identity"
    model = config.model
    if (
        model.samples_power
        and model.parametrisation == "conditional"
        and model.forward is None
        and model.likelihood.kind in GAUSSIAN_LIKELIHOODS
    ):
        return "posterior"
    if model.samples_power:
        return "prior"
    return "posterior" if config.model.likelihood.mask is None else "prior"


def _check_distribution(config: "Config") -> None:
    """The mesh divides the grid, and the run is one the sharded path supports
    (:func:`fieldhmc.mesh_support.mesh_support` says which)."""
    dist = config.distribution
    num = dist.mesh[0]
    n0, n1 = config.grid.shape[:2]
    if n0 % num or n1 % num:
        raise _field_error(
            "distribution.mesh",
            f"{num} devices must divide grid.shape[0] and [1] (got {n0} and {n1})",
        )
    from fieldhmc.mesh_support import mesh_support

    reason = mesh_support(
        config.sampler.kind,
        preconditioner=config.sampler.preconditioner or "identity",
        jitter_leapfrog=bool(getattr(config.sampler, "jitter_leapfrog", False)),
        likelihood=config.model.likelihood.kind,
        forward_model=config.model.forward is not None,
        sampled_hyperparameters=config.model.samples_power,
        sampled_cosmology=bool(config.model.power.sampled),
        parametrisation=config.model.parametrisation,
    )
    if reason is not None:
        raise _field_error("distribution", reason)


class Config(BaseModel):
    """A complete, validated fieldhmc run configuration (immutable).

    Build it with :func:`load_config` or :func:`config_from_dict`; all paths are
    absolute and kind-dependent options that do not apply are ``None``.
    """

    model_config = _FROZEN

    grid: GridConfig = Field(default_factory=GridConfig, description="Grid and box.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Prior and likelihood.")
    data: DataConfig = Field(default_factory=DataConfig, description="Observed data.")
    sampler: SamplerConfig = Field(
        default_factory=_SAMPLER_SECTIONS["hmc"], description="MCMC sampler."
    )
    outputs: OutputsConfig = Field(default_factory=OutputsConfig, description="Run outputs.")
    precision: Literal["float32", "float64"] = Field(
        "float32", description="Floating-point precision of the computation."
    )
    distribution: DistributionConfig | None = Field(
        None, description="Shard the field over a device mesh; null runs on one device."
    )

    @field_validator("sampler", mode="before")
    @classmethod
    def _sampler_kind_rules(cls, value: object) -> object:
        return _sampler_section(value)

    @model_validator(mode="after")
    def _cross_check(self) -> "Config":
        shape = self.grid.shape
        likelihood = self.model.likelihood
        if self.sampler.preconditioner is None:
            _set_resolved(self.sampler, preconditioner=default_preconditioner(self))
        if self.sampler.preconditioner == "dense_params":
            num = len(self.model.sampled_parameter_names)
            if num < 2:
                raise _field_error(
                    "sampler.preconditioner",
                    f"dense_params adapts a dense metric of the sampled scalar parameters: "
                    f"needs >= 2 of them (got {num}); use diagonal",
                )
        mask = likelihood.mask
        try:  # NumPy only, before TensorFlow; the workflow reads them with the same rules
            datafiles.check_inputs(
                shape,
                likelihood.kind,
                data_path=self.data.path,
                data_key=self.data.key,
                mask_path=None if mask is None else mask.file,
                sigma_map_path=likelihood.sigma_map,
                has_generated_mask=mask is not None and mask.generate is not None,
            )
        except datafiles.DataFileError as exc:
            raise _field_error(exc.key, exc.message) from None
        if self.sampler.init == "wiener":
            if self.model.forward is not None:
                raise _field_error(
                    "sampler.init",
                    f"wiener needs the identity forward model (got model.forward.kind="
                    f"{self.model.forward.kind}); use prior or zeros",
                )
            if likelihood.kind not in GAUSSIAN_LIKELIHOODS:
                raise _field_error(
                    "sampler.init", f"wiener needs a gaussian likelihood (got {likelihood.kind})"
                )
            if self.model.samples_power:
                raise _field_error(
                    "sampler.init", "wiener needs fixed hyperparameters (some are sampled)"
                )
        if self.sampler.field_warmup > 0:
            if not self.model.sampled_parameter_names:
                raise _field_error(
                    "sampler.field_warmup",
                    "holds the sampled scalar parameters while the field warms up: none are "
                    "sampled; use 0",
                )
            if self.distribution is not None:
                raise _field_error(
                    "sampler.field_warmup", "does not combine with a distribution section; use 0"
                )
        if self.distribution is not None:
            _check_distribution(self)
        num_modes = shape[0] * shape[1] * (shape[2] // 2 + 1)
        if self.outputs.tracked_modes > num_modes:
            raise _field_error(
                "outputs.tracked_modes",
                f"must be <= {num_modes}, the number of Fourier modes "
                f"(got {self.outputs.tracked_modes})",
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """Fully resolved configuration as plain JSON/YAML types (absolute paths).

        Returns
        -------
        dict
            Nested mapping such that ``config_from_dict(config.to_dict(), base_dir)
            == config`` for any ``base_dir``.
        """
        return self.model_dump(mode="json")

    def with_output_directory(self, directory: str | os.PathLike[str]) -> "Config":
        """Copy with ``outputs.directory`` replaced (relative to the working directory)."""
        path = Path(os.path.abspath(Path(directory).expanduser()))
        outputs = self.outputs.model_copy(update={"directory": path})
        return self.model_copy(update={"outputs": outputs})

    def summary(self) -> str:
        """One-line human-readable description of the run."""
        grid = "x".join(str(n) for n in self.grid.shape)
        sampled = self.model.sampled_parameter_names
        hyper = f", sampling {'+'.join(sampled)}" if sampled else ""
        sampler = self.sampler
        return (
            f"{grid} grid, {self.model.power.kind} prior ({self.model.parametrisation}{hyper}), "
            f"{self.model.likelihood.kind} likelihood, {self.data.source} data, "
            f"{sampler.kind} x {sampler.num_chains} chains "
            f"({sampler.num_burnin_steps} burn-in + {sampler.num_results} results), "
            f"{self.precision}"
        )


# --------------------------------------------------------------------------------------
# YAML
# --------------------------------------------------------------------------------------


class _SafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects duplicate keys and reads ``1e-3`` as a float.

    PyYAML implements YAML 1.1, where exponent floats need a dot (``1.0e-3``); the
    extra resolver gives the YAML 1.2 reading that users expect. No other tags
    than the safe ones are constructed.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


_SafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


class _Dumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` writing short lists of scalars in flow style ``[32, 32, 32]``."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    is_flat = all(not isinstance(item, dict | list) for item in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=is_flat)


_Dumper.add_representer(list, _represent_list)


def _parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
        raise ConfigError(source, f"invalid YAML{where}: {problem}") from None


def _read_text(path: Path) -> str:
    if not path.exists():
        raise ConfigError(str(path), "file not found")
    if path.is_dir():
        raise ConfigError(str(path), "is a directory, not a YAML file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read file: {exc}") from None


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """Read a YAML file safely (no arbitrary object construction).

    Parameters
    ----------
    path : str or os.PathLike
        YAML file.

    Returns
    -------
    object
        The parsed document (``None`` for an empty file).

    Raises
    ------
    ConfigError
        If the file is missing, unreadable or not valid YAML (with line number).
    """
    path = Path(path)
    return _parse_yaml(_read_text(path), str(path))


def _plain(value: Any) -> Any:
    """Convert mappings, tuples, paths and NumPy values to plain YAML-safe types."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


def dump_yaml(mapping: Mapping[str, Any]) -> str:
    """Render a mapping as block-style YAML, keeping key order.

    Parameters
    ----------
    mapping : Mapping
        Nested mapping of plain values; tuples, ``Path`` objects, NumPy scalars and
        arrays and pydantic models are converted.

    Returns
    -------
    str
        YAML text readable by :func:`read_yaml` / :func:`load_config`.
    """
    return yaml.dump(
        _plain(mapping), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100
    )


def write_yaml(mapping: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Atomically write :func:`dump_yaml` of ``mapping`` to ``path``.

    The text goes to a temporary file in the same directory, which then replaces
    ``path``, so readers never see a partial file; the file gets the umask's
    permissions like every other output (not the temporary file's ``0o600``).

    Parameters
    ----------
    mapping : Mapping
        Mapping to write.
    path : str or os.PathLike
        Destination; its directory must exist.

    Returns
    -------
    pathlib.Path
        The written path.
    """
    from fieldhmc import io  # atomic write with the umask's permissions, as every output

    text = dump_yaml(mapping)
    return io.atomic_write(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


def _model_class(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``annotation`` (``Model`` or ``Model | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        for member in get_args(annotation):
            found = _model_class(member)
            if found is not None:
                return found
    return None


def _is_path_field(field: FieldInfo) -> bool:
    annotation = field.annotation
    return annotation is Path or Path in get_args(annotation)


def _field_at(dotted: str) -> FieldInfo | None:
    """The schema field named by a dotted key, or ``None`` if there is none (a key of a
    discriminated union's section is found in any of its members)."""
    candidates: list[type[BaseModel]] = [Config]
    field: FieldInfo | None = None
    for part in dotted.split("."):
        found = [m.model_fields[part] for m in candidates if part in m.model_fields]
        if not found:
            return None
        field = found[0]
        members = _tagged_members(field)
        if members:
            candidates = list(members.values())
        else:
            sub = _model_class(field.annotation)
            candidates = [sub] if sub is not None else []
    return field


def _apply_override(raw: dict[str, Any], assignment: str) -> None:
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError("--set", f"expected dotted.key=value (got {assignment!r})")
    field = _field_at(key)
    if field is None:
        raise ConfigError(key, f"unknown key in --set {assignment!r}")
    value = _parse_yaml(text, f"{key} (--set value)")
    if _is_path_field(field) and isinstance(value, str) and value.strip():
        value = str(_absolute(value, Path.cwd()))
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def config_from_dict(raw: Mapping[str, Any], base_dir: str | os.PathLike[str]) -> Config:
    """Validate a raw configuration mapping.

    Parameters
    ----------
    raw : Mapping
        Parsed YAML document (sections ``grid``, ``model``, ``data``, ``sampler``,
        ``outputs`` and the key ``precision``; every key is optional).
    base_dir : str or os.PathLike
        Directory against which relative input paths are resolved (normally the
        directory of the config file).

    Returns
    -------
    Config
        The validated, fully resolved configuration.

    Raises
    ------
    ConfigError
        On the first problem found, as one line naming the dotted key.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError("config", f"top level must be a mapping of sections (got {_show(raw)})")
    base = Path(os.path.abspath(Path(base_dir).expanduser()))
    try:
        return Config.model_validate(dict(raw), context={"base_dir": base})
    except ValidationError as exc:
        raise _config_error(exc) from None


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Config:
    """Read, override and validate a YAML config file.

    Parameters
    ----------
    path : str or os.PathLike
        YAML config file. Relative input paths inside it are resolved against its
        directory.
    overrides : sequence of str
        ``dotted.key=value`` assignments (the CLI's ``--set``), applied in order;
        ``value`` is parsed as YAML, so ``sampler.num_results=500`` is an int,
        ``sampler.jitter_leapfrog=true`` a bool and ``grid.shape=[16,16,16]`` a list.

    Returns
    -------
    Config
        The validated configuration.

    Raises
    ------
    ConfigError
        If the file is missing, is not valid YAML (the message gives the line), its
        top level is not a mapping, an override names an unknown key, or any value
        is invalid.
    """
    path = Path(path)
    raw = read_yaml(path)
    if raw is None:
        raise ConfigError(str(path), "empty config file (expected a mapping of sections)")
    if not isinstance(raw, dict):
        raise ConfigError(
            str(path), f"top level must be a mapping of sections (got {type(raw).__name__})"
        )
    raw = copy.deepcopy(raw)
    # A run directory's config.yaml records the versions that wrote it; it stays a
    # config that `fieldhmc run` accepts (to restart the run).
    raw.pop("versions", None)
    for assignment in overrides:
        _apply_override(raw, assignment)
    return config_from_dict(raw, path.parent)


# --------------------------------------------------------------------------------------
# Schema listing
# --------------------------------------------------------------------------------------


def _type_text(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(str(arg) for arg in get_args(annotation))
    if origin in (Union, types.UnionType):
        members = [_type_text(arg) for arg in get_args(annotation) if arg is not type(None)]
        nullable = type(None) in get_args(annotation)
        return " | ".join(members) + (" | null" if nullable else "")
    if origin is tuple:
        return "[" + ", ".join(_type_text(arg) for arg in get_args(annotation)) + "]"
    if origin is Annotated:
        return _type_text(get_args(annotation)[0])
    if annotation is Path:
        return "path"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "mapping"
        return annotation.__name__
    return str(annotation)


def _value_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value_text(item) for item in value) + "]"
    return str(value)


def _default_text(field: FieldInfo) -> str:
    if field.default is PydanticUndefined:
        return "(required)" if field.default_factory is None else ""
    return _value_text(_plain(field.default))


def _field_lines(key: str, field: FieldInfo, lines: list[str], note: str = "") -> None:
    lines.append(f"{key}: {_type_text(field.annotation)} = {_default_text(field)}{note}")
    lines.extend(
        textwrap.wrap(field.description or "", 96, initial_indent="    ", subsequent_indent="    ")
    )


def _union_lines(key: str, members: Mapping[str, type[BaseModel]], lines: list[str]) -> None:
    """A discriminated union's section: the keys all members share, then each member's
    own keys (one entry per distinct declaration, naming the tags that take it)."""
    models = list(members.values())
    shared = [n for n in models[0].model_fields if all(n in m.model_fields for m in models)]
    discriminator = next(
        n
        for n in shared
        if all(get_origin(m.model_fields[n].annotation) is Literal for m in models)
    )
    for name in shared:
        field = models[0].model_fields[name]
        if name == discriminator:  # its description is the base model's
            described = (getattr(b, "model_fields", {}).get(name) for b in models[0].__mro__)
            text = next((f.description for f in described if f and f.description), "")
            lines.append(f"{key}.{name}: {' | '.join(members)} = {_default_text(field)}")
            lines.extend(textwrap.wrap(text, 96, initial_indent="    ", subsequent_indent="    "))
        else:
            _field_lines(f"{key}.{name}", field, lines)
    entries: dict[tuple[str, str, str, str], list[str]] = {}
    for tag, model in members.items():
        for name, field in model.model_fields.items():
            if name not in shared:
                ident = (
                    name,
                    _type_text(field.annotation),
                    _default_text(field),
                    field.description or "",
                )
                entries.setdefault(ident, []).append(tag)
    for (name, *_), tags in entries.items():
        fields = members[tags[0]].model_fields
        _field_lines(
            f"{key}.{name}", fields[name], lines, f"  [{discriminator}: {', '.join(tags)}]"
        )


def _schema_lines(model: type[BaseModel], prefix: str, lines: list[str]) -> None:
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        members = _tagged_members(field)
        sub = _model_class(field.annotation)
        if sub is not None:
            optional = " (optional section, default null)" if field.default is None else ""
            lines.append(f"{key}:{optional}")
            lines.extend(
                textwrap.wrap(
                    field.description or "", 96, initial_indent="    ", subsequent_indent="    "
                )
            )
            if members:
                _union_lines(key, members, lines)
            else:
                _schema_lines(sub, f"{key}.", lines)
            continue
        _field_lines(key, field, lines)


def schema_text() -> str:
    """Human-readable listing of every config key with type, default and meaning.

    Returns
    -------
    str
        One entry per dotted key, ``key: type = default`` followed by an indented
        description; sections are listed before their keys.
    """
    lines = [
        "fieldhmc configuration (YAML). Every key is optional unless marked 'required';",
        "unknown keys are errors. Options that do not apply to the chosen kind must be left",
        "out. Relative input paths are resolved against the config file's directory,",
        "outputs.directory against the working directory. Override any key on the command",
        "line with --set dotted.key=value (value parsed as YAML).",
        "",
    ]
    _schema_lines(Config, "", lines)
    return "\n".join(lines) + "\n"
