"""The sampler kinds, each declared once (one module per kind) and registered here.

A kind (:class:`~fieldhmc.samplers.kinds.base.SamplerKind`) says which options it takes
(a pydantic model: the config's ``sampler`` section is a discriminated union of them),
its rules, how to build its kernel and tuner, its per-step statistics, its gradients
per transition and whether the sharded sampler runs it. The config, the driver, the
workflow's export and the sweeps ask the kind instead of comparing kind strings.

Adding a kind: a module here defining ``KIND`` and its entry in :data:`_MODULES`.
Importing this package does not import TensorFlow.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from fieldhmc.samplers.kinds.base import KindOptions, OptionError, SamplerKind
from fieldhmc.samplers.kinds.families import MicrocanonicalKind, NutsFamilyKind

__all__ = [
    "KINDS",
    "MICROCANONICAL_KINDS",
    "NUTS_KINDS",
    "KindOptions",
    "OptionError",
    "SamplerKind",
    "all_kinds",
    "build_kernel",
    "default_target_accept_prob",
    "get",
    "names_where",
]

# Registration order is the schema's and the docs' order.
_MODULES = ("hmc", "nuts", "fieldnuts", "chees", "snaper", "mclmc", "mams")

_REGISTRY: dict[str, SamplerKind] = {}
for _module in _MODULES:
    _kind = importlib.import_module(f"{__name__}.{_module}").KIND
    _REGISTRY[_kind.name] = _kind
del _module, _kind


def get(name: str) -> SamplerKind:
    """The registered kind called ``name``; ValueError naming the choices otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"sampler kind must be one of {KINDS}, got {name!r}") from None


def all_kinds() -> tuple[SamplerKind, ...]:
    return tuple(_REGISTRY.values())


def names_where(predicate) -> tuple[str, ...]:
    """Names of the kinds for which ``predicate(kind)`` holds, in registration order."""
    return tuple(k.name for k in _REGISTRY.values() if predicate(k))


KINDS: tuple[str, ...] = names_where(lambda k: True)


# Groups other modules still import by name (the sharded sampler).
NUTS_KINDS = names_where(lambda k: isinstance(k, NutsFamilyKind))
MICROCANONICAL_KINDS = names_where(lambda k: isinstance(k, MicrocanonicalKind))


def default_target_accept_prob(kind: str) -> float:
    """The kind's ``target_accept_prob: null``: 0.8 for the NUTS kinds (Stan), 0.9 for
    MAMS (arXiv:2503.01707), 0.65 for the HMC kinds and (unused) for mclmc."""
    value = get(kind).default_target_accept_prob
    return 0.65 if value is None else value


def build_kernel(
    kind: str,
    target_log_prob_fn: Callable[..., Any],
    *,
    step_size,
    num_adaptation_steps: int,
    target_accept_prob: float | None = None,
    num_leapfrog_steps: int = 16,
    jitter_leapfrog: bool = False,
    max_tree_depth: int = 10,
    step_size_jitter: float = 0.0,
    dimension: int | None = None,
    trajectory_length: float = 1.0,
    desired_energy_var: float = 5e-4,
    integrator: str = "minimal_norm",
) -> Any:
    """The kernel of ``kind`` for a whitened target, options as keywords.

    The dual-averaging kinds are ``DualAveragingStepSizeAdaptation(kernel)``;

    the microcanonical kinds tune themselves instead (no wrapper, see
    :mod:`fieldhmc.samplers.mclmc`).

    Parameters
    ----------
    kind : {"hmc", "nuts", "fieldnuts", "chees", "snaper", "mclmc", "mams"}
        ``hmc``: TFP HMC (fixed or jittered length). ``nuts``: TFP's NUTS (which
        has the pre-2019 U-turn check, see issue #7). ``fieldnuts``: our NUTS with
        Stan's corrected criterion. ``chees``: TFP's ChEES trajectory-length
        adaptation around HMC; ``snaper``: TFP's SNAPER-HMC (trajectory length and a
        diagonal mass matrix adapted across chains). The last two need >= 2 chains.
    target_log_prob_fn : callable
        Whitened target (:func:`fieldhmc.samplers.kernels.whiten`).
    step_size : float or Tensor
        Initial step size.
    num_adaptation_steps : int
        Step size (and ChEES trajectory length) adapt during these steps, then
        freeze.
    target_accept_prob : float, optional
        Dual-averaging target; default :func:`default_target_accept_prob`.
    dimension : int, optional
        Total number of whitened coordinates per chain; required by ``mclmc`` and
        ``mams``, whose initial step size and decoherence length are
        ``step_size * sqrt(dimension)`` and ``trajectory_length * sqrt(dimension)``
        (so that ``step_size`` reads like an HMC step: a step moves the whitened
        state by about ``step_size * sqrt(d)`` in both).
    trajectory_length, desired_energy_var, integrator
        ``mclmc`` / ``mams`` only: initial :math:`L / \\sqrt d`; MCLMC's bias
        tolerance (energy-error variance per dimension); ``"minimal_norm"`` or
        ``"leapfrog"``.
    """
    sampler_kind = get(kind)
    if dimension is None and isinstance(sampler_kind, MicrocanonicalKind):
        raise ValueError(f"sampler kind {kind!r} needs the state's dimension")
    given = {
        "target_accept_prob": target_accept_prob,
        "num_leapfrog_steps": num_leapfrog_steps,
        "jitter_leapfrog": jitter_leapfrog,
        "max_tree_depth": max_tree_depth,
        "step_size_jitter": step_size_jitter,
        "trajectory_length": trajectory_length,
        "desired_energy_var": desired_energy_var,
        "integrator": integrator,
    }
    return sampler_kind.build_kernel(
        target_log_prob_fn,
        {name: given[name] for name in sampler_kind.option_names},
        step_size=step_size,
        num_adaptation_steps=num_adaptation_steps,
        dimension=dimension,
    )
