"""What every sampler kind declares: :class:`SamplerKind` and its options' base model.

Importing this module (and a kind's module) does not import TensorFlow: the config
reads the kinds' options and rules before TensorFlow is loaded; the kernel-building
methods import it when called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["KindOptions", "OptionError", "SamplerKind", "count", "finite"]


class OptionError(ValueError):
    """A kind's rule broken by a sampler section: ``field`` (relative to the section)
    and a one-line ``message``."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class KindOptions(BaseModel):
    """The options one kind takes besides the common sampler settings (frozen; unknown
    keys are errors). Each kind's subclass declares ``kind: Literal[<name>]``."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def finite(default: float | None, description: str, **constraints: Any) -> Any:
    """A strict, finite float option."""
    return Field(default, strict=True, allow_inf_nan=False, description=description, **constraints)


def count(default: int | None, description: str, **constraints: Any) -> Any:
    """A strict int option."""
    return Field(default, strict=True, description=description, **constraints)


def target_accept_field(default: float) -> Any:
    """``target_accept_prob``: the dual-averaging target, ``null`` meaning ``default``."""
    return finite(
        None,
        f"Step-size adaptation target in (0, 1); null means {default}.",
        gt=0,
        lt=1,
    )


class SamplerKind:
    """One sampler kind, declared once: options, rules, kernel, statistics, mesh support.

    Subclasses set the class attributes and override the kernel methods; the registry
    (:mod:`fieldhmc.samplers.kinds`) holds one instance per kind.

    Attributes
    ----------
    name : str
        The ``sampler.kind`` string.
    description : str
        One line for the config schema.
    options : type[KindOptions]
        The kind's own options (pydantic), with their defaults and bounds.
    default_target_accept_prob : float or None
        What ``target_accept_prob: null`` means; None for a kind without a Metropolis test.
    min_chains : int
        Chains the kind needs (the ensemble kinds adapt across chains).
    tunes_own_metric : bool
        Adapts its trajectory (or metric) itself: the windowed diagonal metric would
        fight it.
    runs_on_mesh : bool
        The sharded sampler (:mod:`fieldhmc.samplers.sharded`) runs it.
    mesh_note : str
        What a sharded run of this kind does (its ``summary.json`` note).
    mesh_refusal : str
        Why a kind that does not run on a mesh cannot (empty: not implemented).
    stat_names : tuple of str
        The per-step statistics exported to ``samples.nc``'s ``sample_stats``.
    field_at_proposal : bool
        The kernel's last target evaluation in a transition is at its proposal, traced
        outside any loop (:class:`~fieldhmc.samplers.kernels.EndPointTap`), and its
        results say per chain whether the proposal was accepted: the driver's field
        outputs then read the field that evaluation made.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    options: ClassVar[type[KindOptions]]
    default_target_accept_prob: ClassVar[float | None] = None
    min_chains: ClassVar[int] = 1
    tunes_own_metric: ClassVar[bool] = False
    runs_on_mesh: ClassVar[bool] = False
    mesh_note: ClassVar[str] = ""
    mesh_refusal: ClassVar[str] = ""
    field_at_proposal: ClassVar[bool] = False
    stat_names: ClassVar[tuple[str, ...]] = (
        "lp",
        "acceptance_rate",
        "diverging",
        "energy",
        "step_size",
        "n_steps",
    )

    def __repr__(self) -> str:
        return f"<sampler kind {self.name}>"

    # -- options and rules (no TensorFlow) ------------------------------------------------
    @property
    def option_names(self) -> tuple[str, ...]:
        """The kind's own option names (without ``kind``)."""
        return tuple(n for n in self.options.model_fields if n != "kind")

    def check(self, settings: Any) -> None:
        """Raise :class:`OptionError` if ``settings`` (a config section or the driver's
        :class:`~fieldhmc.samplers.SamplerSettings`) breaks one of the kind's rules.

        ``settings.num_chains`` and whether a windowed metric is asked for
        (``settings.adapt_diagonal``, or ``settings.preconditioner`` ``diagonal`` or
        ``dense_params``) are read.
        """
        if settings.num_chains < self.min_chains:
            raise OptionError(
                "num_chains",
                f"sampler.kind={self.name} adapts across chains: needs >= {self.min_chains} "
                f"chains (got {settings.num_chains})",
            )
        windowed = getattr(settings, "adapt_diagonal", None)
        name = "dense_params" if getattr(settings, "adapt_dense_params", False) else "diagonal"
        if windowed is None:
            name = getattr(settings, "preconditioner", None)
            windowed = name in ("diagonal", "dense_params")
        if windowed and self.tunes_own_metric:
            raise OptionError(
                "preconditioner",
                f"{name} (windowed adaptation) does not combine with sampler.kind="
                f"{self.name}'s own tuning; use identity, prior or posterior",
            )

    def driver_options(self, section: Any) -> dict[str, Any]:
        """The kind's options of a config section, as driver settings keywords."""
        return {name: getattr(section, name) for name in self.option_names}

    def mesh_description(self, section: Any) -> str:
        """What a sharded run with these ``sampler`` settings does (``summary.json``)."""
        del section
        return self.mesh_note

    def summary_metadata(self, section: Any) -> dict[str, Any]:
        """Kind-specific entries of ``summary.json``'s metadata (none by default)."""
        return {}

    # -- the kernel (TensorFlow) ----------------------------------------------------------
    def target_accept(self, options: Mapping[str, Any]) -> float | None:
        """``options["target_accept_prob"]``, or the kind's default when absent or None."""
        value = options.get("target_accept_prob")
        return self.default_target_accept_prob if value is None else value

    def build_kernel(
        self,
        target_log_prob_fn: Callable[..., Any],
        options: Mapping[str, Any],
        *,
        step_size: Any,
        num_adaptation_steps: int,
        dimension: int,
    ) -> Any:
        """The transition kernel (with its tuner) for a whitened target.

        Parameters
        ----------
        target_log_prob_fn : callable
            Whitened target (:func:`fieldhmc.samplers.kernels.whiten`).
        options : mapping
            The kind's options (:attr:`option_names`), e.g. from
            :meth:`driver_options`.
        step_size : float or Tensor
            Initial step size.
        num_adaptation_steps : int
            The tuner adapts during these steps, then freezes.
        dimension : int
            Whitened coordinates per chain.
        """
        raise NotImplementedError

    def sampling_kernel(self, kernel: Any) -> Any:
        """The kernel of the post-warm-up program: ``kernel`` 's transitions at the
        parameters its warm-up left in the kernel results, without its tuner.

        The same results structure and the same draws; the driver compiles the chunks
        after warm-up with it, so the tuner's code is not in that program. This default
        keeps ``kernel`` whole (its tuner then stops by its own step count).
        """
        return kernel

    def stops_warmup_early(self, options: Mapping[str, Any]) -> bool:
        """Whether the kind's tuner may end warm-up before ``num_burnin_steps``, once its
        estimates have converged (then :meth:`warmup_end` says where). False: a fixed
        count."""
        return False

    def warmup_end(self, results: Any) -> Any:
        """The step at which the tuner ended warm-up (int32 scalar tensor), -1 while it
        tunes (only asked where :meth:`stops_warmup_early`)."""
        raise NotImplementedError

    def step_stats(self, results: Any, previous_target_log_prob: Any) -> Any:
        """:class:`~fieldhmc.samplers.kernels.StepStats` of one step's kernel results."""
        raise NotImplementedError

    def target_log_prob_of(self, results: Any) -> Any:
        """The current (shifted) target log prob held in the kernel results."""
        raise NotImplementedError

    def tuned_parameters(self, results: Any, scales: Any) -> dict[str, Any]:
        """The adapted step size (and more) held in the final kernel results (NumPy)."""
        raise NotImplementedError

    def gradients_per_transition(self, settings: Any) -> float | None:
        """Gradient evaluations per transition, or None if adapted or path-dependent."""
        return None

    def field_stats_every(self, settings: Any) -> int:
        """Post-warm-up transitions between updates of the field's running moments
        (1 unless the kind's transitions are cheap; see
        :func:`fieldhmc.samplers.driver.field_stats_every`)."""
        return 1
