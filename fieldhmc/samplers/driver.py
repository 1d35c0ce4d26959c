"""The compiled, chunked sampling driver with checkpoint/resume and streaming outputs.

Warm-up and sampling run in chunks. Each chunk is one call of a function compiled
once with ``tf.function(jit_compile=True)`` -- state, kernel results, metric,
seeds and counters are passed as tensors, so nothing retraces between chunks.
After every chunk the complete sampler state is checkpointed atomically, traces are
appended to the store, and progress is reported from Python.

Warm-up and post-warm-up chunks are two programs (chunks never straddle the end of
warm-up). The warm-up one carries the kind's tuner (and the latent moments of
``adapt_diagonal``) and computes no field outputs; the post-warm-up one runs the kind's
:meth:`~fieldhmc.samplers.kinds.SamplerKind.sampling_kernel` -- the same transitions at
the tuned parameters, without the tuner's code -- and computes each field output only
on the transitions that feed it. Small runs use one program for both phases
(:func:`separate_sampling_program_for`), with each phase's field outputs, latent
moments and tuner inside loops of zero or one trips on the phase (``_loop_if``; XLA
copies a loop-carried buffer that a ``tf.cond`` passes through, but updates a loop's
state in place): what is left of the tuner's cost, a few scalar predicates per
transition, is not worth a second compile in a small run.

Seeds: step ``t`` (counted over warm-up and sampling) uses
``stateless_fold_in(seed, t)``, independent of chunking, so a resumed run replays
exactly the draws of an uninterrupted one.

Precision: the model's log density is reduced in float64 and a per-chain
reference (its value at the start of the chunk) is subtracted before the cast to
the state dtype (see :func:`fieldhmc.samplers.kernels.whiten`).

Metric: the kernels run on whitened coordinates ``u = x / scale``. ``scale`` is
fixed (identity, prior or posterior Fourier-diagonal) or adapted Stan-style in
windows during warm-up (``adapt_diagonal``): variance estimates over doubling
windows, regularised toward 1e-3, with the step-size adaptation restarted after
each update. With ``adapt_dense_params`` the scalar parts (``[chains]``: the sampled
parameters) also get a dense covariance from the same windows, applied through its
Cholesky factor (:mod:`fieldhmc.samplers.dense_metric`); a fixed factor
(``Sampler(dense_factor=...)``) gives the fixed metrics a dense parameter block.
"""

from __future__ import annotations

import functools
import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla

from fieldhmc.ops import rfft3d
from fieldhmc.ops.gradient_registry import releases_custom_gradients
from fieldhmc.samplers import dense_metric, kinds, metric_pooling
from fieldhmc.samplers.checkpoint import load_checkpoint, save_checkpoint
from fieldhmc.samplers.kernels import (
    EndPointTap,
    expand_results,
    shift_target_log_prob,
    slim_results,
    whiten,
)
from fieldhmc.samplers.loops import pinned_to
from fieldhmc.samplers.mclmc import WARMUP_STOPS
from fieldhmc.seeds import stateless_seed

# Version of what a checkpoint holds: 2 since kernel results are slimmed (no proposal or
# momenta) and the chunk's state lives in variables. Older checkpoints are refused.
CHECKPOINT_LAYOUT = 2

__all__ = [
    "ChunkRunner",
    "FieldOutputs",
    "RunResult",
    "Sampler",
    "SamplerSettings",
    "TraceSink",
    "XlaChunkRunner",
    "adaptation_windows",
    "auto_chunk_size",
    "field_stats_every",
    "separate_sampling_program_for",
    "stateless_seed",
    "tuned_parameters",
]

_log = logging.getLogger(__name__)

STAT_NAMES = (
    "lp",
    "acceptance_rate",
    "is_accepted",
    "diverging",
    "energy",
    "step_size",
    "n_steps",
    "tree_depth",
    "energy_error",
)


@dataclass(frozen=True)
class SamplerSettings:
    """What the driver needs to know (one sub-config, no dict threading)."""

    kind: str = "hmc"
    num_chains: int = 4
    num_burnin_steps: int = 200
    num_results: int = 500
    num_leapfrog_steps: int = 16
    jitter_leapfrog: bool = False
    max_tree_depth: int = 10
    target_accept_prob: float | None = None
    step_size: float = 0.1
    step_size_jitter: float = 0.0
    trajectory_length: float = 1.0  # mclmc / mams: initial L / sqrt(d)
    desired_energy_var: float = 5e-4  # mclmc: bias tolerance Var[dE]/d
    integrator: str = "minimal_norm"  # mclmc / mams
    # mams: end warm-up once the tuner's estimates have converged ("converged"; at most
    # num_burnin_steps transitions) or after num_burnin_steps ("fixed")
    warmup_stop: str = "converged"
    adapt_diagonal: bool = False
    adapt_dense_params: bool = False  # with adapt_diagonal: a dense block for the scalars
    chunk_size: int = 50
    # A checkpoint after a chunk once this many seconds have passed since the last one
    # (0: after every chunk); the first chunk, the end of warm-up and the run's last
    # chunk always write one. At 16³ a checkpoint costs ~10 ms, a 50-transition mclmc
    # chunk ~45 ms.
    checkpoint_seconds: float = 30.0
    thin: int = 1
    field_thin: int = 10
    stats_every: int = 0  # field running moments every n-th transition; 0: field_stats_every
    # A post-warm-up program of its own (no tuner; warm-up's without field outputs) or one
    # program for both phases; None: separate_sampling_program_for(...) decides
    separate_sampling_program: bool | None = None
    seed: int = 0

    def __post_init__(self):
        for name in ("num_chains", "num_results", "chunk_size", "thin", "field_thin"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_burnin_steps < 0:
            raise ValueError(f"num_burnin_steps must be >= 0, got {self.num_burnin_steps}")
        if self.stats_every < 0:
            raise ValueError(f"stats_every must be >= 0 (0: automatic), got {self.stats_every}")
        if self.adapt_dense_params and not self.adapt_diagonal:
            raise ValueError(
                "adapt_dense_params refines the windowed metric: set adapt_diagonal too"
            )
        self.sampler_kind.check(self)  # ValueError (OptionError) naming the setting
        if self.warmup_stop not in WARMUP_STOPS:
            raise ValueError(f"warmup_stop must be one of {WARMUP_STOPS}, got {self.warmup_stop!r}")
        for name in ("trajectory_length", "desired_energy_var"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.checkpoint_seconds < math.inf:
            raise ValueError(
                f"checkpoint_seconds must be finite and >= 0, got {self.checkpoint_seconds}"
            )

    @property
    def sampler_kind(self) -> kinds.SamplerKind:
        """The registered kind (:mod:`fieldhmc.samplers.kinds`); ValueError if unknown."""
        return kinds.get(self.kind)

    @property
    def kind_options(self) -> dict:
        """The kind's own options, as its ``build_kernel`` takes them."""
        return {name: getattr(self, name) for name in self.sampler_kind.option_names}

    @property
    def num_steps(self) -> int:
        return self.num_burnin_steps + self.num_results


@dataclass(frozen=True)
class FieldOutputs:
    """Field-level quantities computed inside the compiled loop during sampling.

    Parameters
    ----------
    field_fn : callable
        ``(*x_parts) -> field [chains, n0, n1, n2]`` (real). When it is the sampler's
        target's ``field_from_latents`` and the target makes that field on its way
        (``computes_field``; its ``log_prob_and_field`` gives both, as
        :class:`~fieldhmc.models.field_model.PinnedTarget` does), mclmc's chunks read the
        field of each draw from the kernel's last evaluation instead of calling it.
    power_fn : callable
        ``field -> [chains, nbins]`` binned power spectrum of each chain's draw
        (``modes -> ...`` with ``modes_fn``).
    tracked_fn : callable, optional
        ``field -> [chains, T]`` complex modes traced in full (``modes -> ...`` with
        ``modes_fn``).
    store_fields : bool
        Keep every ``field_thin``-th field draw.
    modes_fn : callable, optional
        ``(*x_parts) -> modes`` made without the field: ``rfft3d(field)`` ``[chains, n0,
        n1, n2 // 2 + 1]`` (e.g. :meth:`~fieldhmc.models.FieldModel.modes_from_latents`)
        or another representation of it that ``modes_of_field`` makes from a field (the
        packed modes of :class:`~fieldhmc.models.PackedSpectrum`); then ``power_fn`` and
        ``tracked_fn`` take these modes, and a draw whose field is neither stored nor in
        the running moments costs no transform.
    modes_of_field : callable
        ``field -> modes`` as ``modes_fn`` makes them (default ``rfft3d``).
    """

    field_fn: Callable[..., tf.Tensor]
    power_fn: Callable[[tf.Tensor], tf.Tensor]
    tracked_fn: Callable[[tf.Tensor], tf.Tensor] | None = None
    store_fields: bool = True
    modes_fn: Callable[..., tf.Tensor] | None = None
    modes_of_field: Callable[[tf.Tensor], tf.Tensor] = rfft3d

    def spectral_input(self, field_fn: Callable[[], tf.Tensor], x_parts: Callable[[], list]):
        """What ``power_fn`` and ``tracked_fn`` read: the modes, or the field (a thunk)."""
        return self.modes_fn(*x_parts()) if self.modes_fn is not None else field_fn()

    def spectral_of_field(self, field) -> tf.Tensor:
        """What ``power_fn`` and ``tracked_fn`` read for a given field (e.g. the truth)."""
        field = tf.convert_to_tensor(field)
        return self.modes_of_field(field) if self.modes_fn is not None else field


@dataclass(frozen=True)
class RunResult:
    """What :meth:`Sampler.run` returns.

    Attributes
    ----------
    complete : bool
        Warm-up and sampling finished (False after ``max_chunks``).
    step : int
        Transitions done (warm-up and sampling).
    num_warmup_steps : int
        Warm-up transitions: ``num_burnin_steps``, or fewer where the kind's tuner
        stopped on converged estimates (mams, ``warmup_stop`` "converged"); while that
        warm-up runs, its maximum.
    gradient_evaluations, warmup_gradient_evaluations : int
        Gradient evaluations summed over chains: all, and those of warm-up.
    sampling_seconds : float
        Compute time of the post-warm-up chunks in this process, but one whose call
        compiled their program (the first call of it in this Sampler: after a resume, or
        with ``separate_sampling_program``); 0 when that was the only one.
    sampling_batched_gradients : int
        Batched gradient evaluations of those chunks (all chains step until the longest
        trajectory ends).
    num_draws : int
        Draws written to the sink (per chain).
    scales : list of ndarray
        Final metric scales per part.
    dense_factor : ndarray or None
        With ``adapt_dense_params``: the final lower Cholesky factor ``[p, p]`` (float64)
        of the scalar parts' metric correlation (:mod:`~fieldhmc.samplers.dense_metric`).
    field_mean, field_var : ndarray or None
        Running field moments (the field's dtype), averaging every
        ``field_moments_every``-th post-warm-up transition: ``field_moments_draws``
        draws of all chains.
    latent_state : list of ndarray
        The final state per part ``[chains, ...]``.
    tuned : dict
        The kind's :meth:`~fieldhmc.samplers.kinds.SamplerKind.tuned_parameters`.
    """

    complete: bool
    step: int
    gradient_evaluations: int
    scales: list
    field_mean: np.ndarray | None
    field_var: np.ndarray | None
    latent_state: list
    num_draws: int
    sampling_seconds: float
    sampling_batched_gradients: int
    warmup_gradient_evaluations: int
    field_moments_every: int
    field_moments_draws: int
    tuned: dict
    dense_factor: np.ndarray | None = None
    num_warmup_steps: int = 0


class TraceSink(Protocol):
    """Where the driver streams its outputs (see :mod:`fieldhmc.samplers.storage`)."""

    def truncate(self, num_draws: int, num_field_draws: int) -> None: ...

    def append(self, traces: dict[str, np.ndarray]) -> None: ...

    def append_fields(self, fields: np.ndarray) -> None: ...


def field_stats_every(settings: SamplerSettings, stores_fields: bool = False) -> int:
    """Post-warm-up transitions between updates of the field's running moments.

    ``settings.stats_every`` if set; else the kind's
    :meth:`~fieldhmc.samplers.kinds.SamplerKind.field_stats_every`: 1, except for kinds
    with few gradients per transition (``mclmc``), whose running moments would
    otherwise cost a good part of the run (the field statistics cost about one
    gradient). When field draws are stored (``stores_fields``) at least that often
    (``field_thin <= k``), ``k`` is rounded down to a multiple of ``field_thin``: the
    moments then read fields made for the store, and no transition makes a field for
    the moments alone (``field_thin`` 3 and ``k`` 5 made one on 7 transitions in 15,
    now on 5). The moments (``field_mean``, ``field_var``) average
    ``num_results / k`` draws per chain (the draws at
    ``(step - num_burnin_steps) % k == 0``). Per-draw P(k) and tracked modes are
    computed for every stored draw (every ``thin``-th) whatever ``k``.
    """
    if settings.stats_every:
        return settings.stats_every
    k = settings.sampler_kind.field_stats_every(settings)
    thin = settings.field_thin
    if stores_fields and thin <= k:
        return thin * (k // thin)
    return k


def adaptation_windows(num_burnin_steps: int) -> list[tuple[int, int]]:
    """Stan's slow metric-adaptation windows ``[(start, end), ...]`` within warm-up.

    75-step initial buffer, 25-step first window doubling, 50-step final buffer;
    scaled to 15% / 75% / 10% when warm-up is shorter than their sum, none below
    20 steps (Stan's rule).
    """
    n = num_burnin_steps
    if n < 20:
        return []
    init, term, base = 75, 50, 25
    if init + term + base > n:
        init, term = int(0.15 * n), int(0.1 * n)
        base = n - init - term
    windows, start, size = [], init, base
    end_slow = n - term
    while start < end_slow:
        end = start + size
        if end + 2 * size > end_slow:  # the next window would not fit: stretch this one
            end = end_slow
        windows.append((start, end))
        start, size = end, 2 * size
    return windows


# The compiled chunk keeps the field draws it stores in one buffer [slots, chains, ...];
# its slots are capped at this many bytes (at least one draw of every chain), and
# chunks are cut so no chunk stores more draws than that: the buffer does not scale
# with chunk_size at large grids.
FIELD_BUFFER_BYTES = 64 * 2**20


def field_buffer_slots(settings: SamplerSettings, field_bytes_all_chains: int) -> int:
    """Stored-field slots of the compiled chunk: ``ceil(chunk_size / field_thin)``, capped.

    Parameters
    ----------
    settings : SamplerSettings
    field_bytes_all_chains : int
        Bytes of one field draw of every chain.
    """
    wanted = math.ceil(settings.chunk_size / settings.field_thin)
    return max(1, min(wanted, FIELD_BUFFER_BYTES // max(1, field_bytes_all_chains)))


# ``chunk_size`` "auto" (the config's default). A chunk costs more than its transitions:
# the compiled program's call and the host's work around it, ~2-3 ms at 16³, 5-8% of a
# 50-transition mclmc chunk there (benchmarks/README.md, session 35). Chunks of cheap
# transitions are therefore made longer: about CHUNK_WORK gradient evaluations of one
# latent coordinate (gradients per transition x chains x coordinates), ~0.35 s at 16³
# on 2 CPU cores, and never fewer than 50 transitions.
CHUNK_SIZE_MIN, CHUNK_SIZE_MAX, CHUNK_WORK = 50, 1000, 2**24


def auto_chunk_size(settings: SamplerSettings, latent_size: int) -> int:
    """The chunk length of ``chunk_size`` "auto": ``CHUNK_WORK / (gradients per transition
    x chains x latent_size)`` transitions, within [50, 1000]; 50 where the kind's
    gradients per transition are tuned or vary
    (:meth:`~fieldhmc.samplers.kinds.SamplerKind.gradients_per_transition` None: NUTS,
    mams). With 4 chains: mclmc 512 at 16³, 64 at 32³, 50 from 64³; jittered hmc with 24
    leapfrog steps 81 at 16³, 50 from 32³. Not capped by the run's length: an extended
    run (``resume --num-results``) keeps its chunks.

    Parameters
    ----------
    settings : SamplerSettings
        Its ``chunk_size`` is not read.
    latent_size : int
        Latent coordinates of one chain (e.g. the grid's cells).
    """
    gradients = settings.sampler_kind.gradients_per_transition(settings)
    if not gradients:
        return CHUNK_SIZE_MIN
    length = int(CHUNK_WORK // (gradients * settings.num_chains * max(1, latent_size)))
    return max(CHUNK_SIZE_MIN, min(CHUNK_SIZE_MAX, length))


def _chunk_bounds(
    settings: SamplerSettings, field_slots: int | None = None, num_burnin: int | None = None
) -> list[int]:
    """Chunk boundaries (global steps): every chunk_size, the end of warm-up, windows.

    With ``field_slots`` fewer than a chunk keeps, sampling chunks are also cut every
    ``field_slots * field_thin`` steps, so no chunk keeps more field draws than its
    buffer holds. ``num_burnin``: the warm-up's end where the tuner stopped it early
    (default ``num_burnin_steps``); sampling chunks then start there.
    """
    burnin = settings.num_burnin_steps if num_burnin is None else num_burnin
    num_steps = burnin + settings.num_results
    points = set(range(0, num_steps, settings.chunk_size))
    points.add(burnin)
    if field_slots is not None and field_slots < math.ceil(
        settings.chunk_size / settings.field_thin
    ):
        every = field_slots * settings.field_thin
        points.update(range(burnin, num_steps, every))
    if settings.adapt_diagonal:
        for start, end in adaptation_windows(settings.num_burnin_steps):
            points.update((start, end))
    points.add(num_steps)
    return sorted(p for p in points if 0 <= p <= num_steps)


@dataclass
class _RunState:
    """Host-side bookkeeping of a run; the state itself lives in :class:`_Carry`."""

    step: int
    scales: list[np.ndarray]
    reference: np.ndarray
    num_draws_written: int = 0
    num_fields_written: int = 0
    gradient_evaluations: int = 0
    warmup_gradient_evaluations: int = 0
    sampling_seconds: float = 0.0  # this process only (not checkpointed)
    sampling_gradients: int = 0
    # adapt_dense_params: the scalar block's Cholesky factor [p, p] (float64)
    dense_factor: np.ndarray | None = None
    # ``scales`` as the chunk's tensors, made once per metric (see Sampler._scale_tensors)
    scale_tensors: list | None = None
    # the warm-up's end: num_burnin_steps, or the step the tuner stopped it (None: not set)
    num_burnin: int | None = None


def _skeleton(t):
    """A leaf's stand-in in a stored nest structure (no reference to its buffer)."""
    if isinstance(t, tf.__internal__.CompositeTensor):
        return tf.type_spec_from_value(t)
    return 0


class _Carry:
    """What the chunk loop carries from chunk to chunk, held in ``tf.Variable`` s.

    Parts (each a nest of tensors): ``x`` (latent state per part, ``[chains, ...]``),
    ``results`` (slim kernel results, :func:`~fieldhmc.samplers.kernels.slim_results`),
    ``fw`` (running moments of the field draws, in the field's dtype) and ``lw`` (of the latent
    state, only with ``adapt_diagonal``).

    Why variables: ``tf.function`` does not donate its arguments, so state passed in
    and returned existed three times during a chunk -- the argument, the while loop's
    copy of it (XLA may not write into a buffer it does not own) and the result. An
    XLA-compiled function that assigns a resource variable instead updates the
    variable's buffer in place (TensorFlow aliases resource updates with their inputs)
    and runs the loop on it. Between chunks the host keeps no reference to these
    buffers (a live reference would force a copy on write); it reads them, as NumPy
    copies, only to checkpoint, re-centre or summarise.
    """

    PARTS = ("x", "results", "fw", "lw")

    def __init__(self):
        self._structure: dict = {}
        self._variables: dict[str, list[tf.Variable]] = {}

    def load(self, **parts) -> None:
        """Set parts (arrays or tensors); the first load creates the variables."""
        for name, value in parts.items():
            flat = tf.nest.flatten(value, expand_composites=True)
            if name not in self._variables:
                # The nest without its tensors (composites, e.g. SNAPER's linear
                # operators, by their TypeSpec): keeping ``value`` would keep its buffers.
                self._structure[name] = tf.nest.map_structure(_skeleton, value)
                self._variables[name] = [tf.Variable(t, trainable=False) for t in flat]
            else:
                for v, t in zip(self._variables[name], flat, strict=True):
                    v.assign(t)

    def read(self, name: str):
        """Part ``name`` as tensors (inside the compiled chunk: reads of the variables)."""
        return tf.nest.pack_sequence_as(
            self._structure[name],
            [v.read_value() for v in self._variables[name]],
            expand_composites=True,
        )

    def assign(self, name: str, value) -> None:
        """Overwrite part ``name`` (inside the compiled chunk: in place)."""
        flat = tf.nest.flatten(value, expand_composites=True)
        for v, t in zip(self._variables[name], flat, strict=True):
            v.assign(t)

    @property
    def dtype(self) -> tf.DType:
        """The state dtype (of the first latent part)."""
        return self._variables["x"][0].dtype

    def shapes(self, name: str) -> list[tuple[int, ...]]:
        """Shapes of the flattened tensors of part ``name``."""
        return [tuple(v.shape) for v in self._variables[name]]

    def numpy(self, name: str):
        """Part ``name`` as NumPy copies (nothing keeps the variables' buffers)."""
        return tf.nest.pack_sequence_as(
            self._structure[name],
            [np.array(v.numpy(), copy=True) for v in self._variables[name]],
            expand_composites=True,
        )


class ChunkRunner(Protocol):
    """What :meth:`Sampler.run` calls to run chunks: one implementation per backend.

    Attributes
    ----------
    carry
        The state between chunks (``load/read/assign/numpy/shapes/dtype`` of
        :class:`_Carry`): latent ``x`` per part, kernel ``results``, field moments
        ``fw`` and latent moments ``lw``.
    lp64 : callable
        ``x_parts -> [chains]`` float64 log density at (the carried) ``x``.
    bootstrap : callable
        ``(u_parts, scales, reference, step_size) -> results`` (a checkpoint's template).
    chunk : callable
        ``(scales, reference, delta, seed, start, num_steps, num_burnin) -> (traces,
        field_buf, num_fields)``: ``num_steps`` transitions from the carried state, which
        it updates; ``num_burnin`` is the warm-up's end (its maximum while it runs).
    sampling_chunk : callable, optional
        The same for the chunks after warm-up, if the runner has a program of its own
        for them (:class:`XlaChunkRunner`: without the tuner); else ``chunk`` runs both.
    scales_tensors : callable
        ``(scales, dtype) -> list``: the metric as the chunk takes it.
    fresh_state : callable
        ``init_state -> _RunState``: validate and load a fresh state into ``carry``.
    restart_adaptation : callable, optional
        ``(run_state, scales) -> None``: a slow window's end for a runner whose kernel
        results are not the XLA kernels' (:meth:`Sampler._update_metric` re-bootstraps
        those itself): take the new scales and restart the step-size adaptation.
    """

    carry: _Carry
    lp64: Callable
    bootstrap: Callable
    chunk: Callable
    scales_tensors: Callable
    fresh_state: Callable


class _InterruptAtChunkEnd:
    """While :meth:`Sampler.run` runs in the main thread, a first SIGINT (Ctrl-C) is
    held until the chunk under way ends, is checkpointed, and run raises
    ``KeyboardInterrupt`` there: nothing sampled is lost to ``checkpoint_seconds``, and
    no checkpoint is taken between a chunk's state update and its bookkeeping. A second
    SIGINT raises at once (the last checkpoint on disk stays consistent)."""

    def __init__(self):
        self.pending = False
        self._previous = None
        # Only where Ctrl-C would raise KeyboardInterrupt anywhere (not in worker threads,
        # nor where a caller ignores or handles SIGINT itself)
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        if self.pending:
            raise KeyboardInterrupt
        self.pending = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


class _ConcreteCall:
    """A ``tf.function`` called through its concrete function for the arguments' shapes
    and dtypes: the polymorphic call matches its signature on every call (~0.4 ms, ~1%
    of a 50-transition mclmc chunk at 16³). Other attributes are the function's."""

    def __init__(self, function):
        self.function = function
        self._key = self._concrete = None

    def __call__(self, *args):
        flat = tf.nest.flatten(args)
        if not all(isinstance(t, tf.Tensor) for t in flat):
            return self.function(*args)  # Python values are part of a trace's signature
        key = tuple((tuple(t.shape), t.dtype) for t in flat)
        if key != self._key:
            self._concrete = self.function.get_concrete_function(*args)
            self._key = key
        return self._concrete(*args)

    def __getattr__(self, name):
        return getattr(self.function, name)


class XlaChunkRunner:
    """The single-device runner: each piece ``tf.function(jit_compile=True)``-compiled
    once, the carried state in ``tf.Variable`` s the compiled chunk updates in place.

    Parameters
    ----------
    lp64_fn, bootstrap_fn, chunk_fn : callable
        The pieces (:class:`ChunkRunner`) before compilation.
    fresh_state_fn : callable
        ``init_state -> _RunState``.
    sampling_chunk_fn : callable, optional
        The post-warm-up chunk (:attr:`ChunkRunner.sampling_chunk`); ``chunk_fn`` if not
        given.
    """

    def __init__(self, lp64_fn, bootstrap_fn, chunk_fn, fresh_state_fn, sampling_chunk_fn=None):
        # Every gradient of these is taken inside their traces: what the model's custom
        # gradients register there is dropped, so that the traced graphs -- with the
        # carried variables and the model's captured constants -- die with the sampler
        # (TF leaks them otherwise: fieldhmc.ops.gradient_registry).
        def compile_fn(fn):
            compiled = tf.function(releases_custom_gradients(fn), jit_compile=True, autograph=False)
            return _ConcreteCall(compiled)

        self.lp64 = compile_fn(lp64_fn)
        self.bootstrap = compile_fn(bootstrap_fn)
        self.chunk = compile_fn(chunk_fn)
        self.sampling_chunk = (
            self.chunk if sampling_chunk_fn is None else compile_fn(sampling_chunk_fn)
        )
        self.fresh_state = fresh_state_fn
        self.carry = _Carry()

    @staticmethod
    def scales_tensors(scales, dtype) -> list:
        return [tf.constant(sc, dtype) for sc in scales]


class Sampler:
    """Multi-chain HMC/NUTS over whitened coordinates, compiled once, run in chunks.

    Parameters
    ----------
    target_log_prob_fn : callable
        ``(*x_parts) -> [chains]`` float64 log density (model pinned to data).
    settings : SamplerSettings
    part_names : sequence of str
        Names of the state parts (``"field"``, ``"log_amplitude"``, ...). Parts of
        rank 1 (``[chains]``) are traced in full as scalars.
    scales : sequence of array
        Per-part metric scales ``M^{-1/2}`` (broadcast against one chain's part);
        the starting point when ``settings.adapt_diagonal``.
    field_outputs : FieldOutputs, optional
        Field draws, running mean/variance, per-draw P(k) and tracked modes.
    dense_factor : array, optional
        A correlation factor for the scalar parts (``[chains]``: the sampled parameters),
        lower Cholesky ``[p, p]`` of their metric correlation, ``p`` the number of scalar
        parts in order (:mod:`~fieldhmc.samplers.dense_metric`): a fixed dense block, or
        the start of ``adapt_dense_params``' first window (default: the identity). One
        device only.
    metric_groups : sequence of (array or None), optional
        Per part, a group label for each coordinate of one chain's part (``None``: not
        pooled): ``adapt_diagonal``'s window variances are shrunk toward their group's
        mean (:mod:`~fieldhmc.samplers.metric_pooling`).
    runner : ChunkRunner, optional
        What runs the chunks and holds the carried state: :class:`XlaChunkRunner` (the
        default, this class's XLA-compiled pieces) or a runner for state on a DTensor
        mesh (:class:`fieldhmc.samplers.sharded.MeshChunkRunner`). :meth:`run` (chunk
        bounds, checkpoints, sinks, progress) is the same for both.
    """

    def __init__(
        self,
        target_log_prob_fn: Callable[..., tf.Tensor],
        settings: SamplerSettings,
        part_names: Sequence[str],
        scales: Sequence[np.ndarray],
        field_outputs: FieldOutputs | None = None,
        runner: ChunkRunner | None = None,
        *,
        dense_factor: np.ndarray | None = None,
        metric_groups: Sequence[np.ndarray | None] | None = None,
    ):
        self.target_log_prob_fn = target_log_prob_fn
        if metric_groups is not None and len(metric_groups) != len(part_names):
            raise ValueError(
                f"metric_groups has {len(metric_groups)} entries for {len(part_names)} parts"
            )
        self.metric_groups = metric_groups
        self.settings = settings
        self.part_names = tuple(part_names)
        self.initial_scales = [np.asarray(s) for s in scales]
        self.field_outputs = field_outputs
        if runner is None:
            separate = settings.separate_sampling_program
            if separate is None:
                size = sum(math.prod(np.shape(sc)) for sc in self.initial_scales)
                separate = separate_sampling_program_for(settings, size)
            runner = XlaChunkRunner(
                self._lp64_impl,
                self._bootstrap_impl,
                self._chunk_impl if separate else self._chunk_impl_both,
                self._xla_fresh_state,
                self._chunk_impl_sampling if separate else None,
            )
        self.runner = runner
        # adapt_dense_params or a dense_factor: the scalar parts (scale of shape (): a
        # [chains] part) form the dense block
        self._dense_idx: tuple[int, ...] = ()
        self._initial_dense_factor: np.ndarray | None = None
        if settings.adapt_dense_params or dense_factor is not None:
            what = "adapt_dense_params" if dense_factor is None else "dense_factor"
            if not isinstance(runner, XlaChunkRunner):
                raise ValueError(
                    f"{what} runs on one device (the mesh runner applies per-element scales only)"
                )
            self._dense_idx = tuple(i for i, sc in enumerate(self.initial_scales) if sc.ndim == 0)
            p = len(self._dense_idx)
            if p < 2:
                raise ValueError(f"{what} needs >= 2 scalar parts (sampled parameters), got {p}")
            self._initial_dense_factor = self._checked_factor(
                np.eye(p) if dense_factor is None else dense_factor
            )
        self._lp64, self._bootstrap, self._chunk = runner.lp64, runner.bootstrap, runner.chunk
        # Post-warm-up chunks: the runner's program for them, if it has one.
        self._sampling_chunk = getattr(runner, "sampling_chunk", runner.chunk)
        # Warm-up ends when the kind's tuner reports convergence (XLA runner; the mesh
        # runs the fixed count)
        self._stops_warmup_early = isinstance(
            runner, XlaChunkRunner
        ) and settings.sampler_kind.stops_warmup_early(settings.kind_options)
        # The first call of the post-warm-up program in this Sampler compiles it: a
        # sampling chunk making that call is not timed.
        self._sampling_chunk_ran = False
        self._field_slots: int | None = None  # set by run() before the first trace
        self._carry = runner.carry  # loaded by run(); the chunk updates it in place

    # -- the metric ------------------------------------------------------------------
    def _checked_factor(self, factor) -> np.ndarray:
        p = len(self._dense_idx)
        factor = np.asarray(factor, np.float64)
        if (
            factor.shape != (p, p)
            or not np.all(np.isfinite(factor))
            or np.any(np.triu(factor, 1) != 0)
            or np.any(np.diag(factor) <= 0)
        ):
            raise ValueError(
                f"dense_factor must be a finite lower-triangular [{p}, {p}] matrix with a "
                f"positive diagonal (one row per scalar part), got shape {factor.shape}"
            )
        return factor

    def set_metric(self, scales: Sequence[np.ndarray], dense_factor=None) -> None:
        """Replace the initial metric (``scales`` and, for a sampler with a dense block,
        ``dense_factor``, kept if ``None``; same shapes) for the next fresh :meth:`run`:
        the compiled pieces take the metric as arguments, so nothing is retraced (a
        re-pinned SBC sampler gets each realisation's posterior metric)."""
        scales = [np.asarray(sc) for sc in scales]
        if [sc.shape for sc in scales] != [sc.shape for sc in self.initial_scales]:
            raise ValueError("set_metric: the scales' shapes differ from the sampler's")
        if dense_factor is not None:
            if not self._dense_idx:
                raise ValueError("set_metric: this sampler has no dense block")
            self._initial_dense_factor = self._checked_factor(dense_factor)
        self.initial_scales = scales

    def _split_metric(self, metric):
        """``(per-part scales, dense factor or None)`` of the chunk's metric list."""
        if self._dense_idx:
            return list(metric[:-1]), metric[-1]
        return list(metric), None

    def _to_x_fn(self, metric):
        """``u_parts -> x_parts`` of a metric (tensors): ``x = scale * u``, the block
        mixed by its factor first."""
        scales, factor = self._split_metric(metric)

        def to_x(u_parts):
            if factor is not None:
                u_parts = dense_metric.mix(u_parts, factor, self._dense_idx)
            return [u * sc for u, sc in zip(u_parts, scales, strict=True)]

        return to_x

    def _to_u_fn(self, metric):
        """The inverse of :meth:`_to_x_fn`."""
        scales, factor = self._split_metric(metric)

        def to_u(x_parts):
            w = [x / sc for x, sc in zip(x_parts, scales, strict=True)]
            if factor is not None:
                w = dense_metric.unmix(w, factor, self._dense_idx)
            return w

        return to_u

    # -- compiled pieces -------------------------------------------------------------
    def _field_tap(self) -> tuple[str | None, bool]:
        """Whether a chunk's field outputs read the field the kernel's own evaluations
        made, instead of transforming the state again (one ``irfft3d`` of the chains'
        fields less per field made), given that the target's log density makes exactly
        ``field_fn``'s field (``computes_field``, e.g.
        :class:`~fieldhmc.models.field_model.PinnedTarget`). Returns ``(source, kept)``:

        - source ``"kernel"``: the kernel hands out the field of its proposal (its
          ``one_step_with_aux``: mclmc, mams); ``"end_point"``: an
          :class:`~fieldhmc.samplers.kernels.EndPointTap` on its target reads it (the
          kind's ``field_at_proposal``: hmc, inside TFP's wrappers); None: the field is
          made from the state where an output needs it.
        - ``kept``: the running moments read a field on every transition, so the chunk
          carries the current state's field and takes the proposal's per chain where it
          is accepted. Otherwise a field is made from the state on the transitions that
          need one where some chain's proposal was not accepted (mclmc: a step undone).

        What each saves is measured in benchmarks/README.md.
        """
        target, fo, s = self.target_log_prob_fn, self.field_outputs, self.settings
        if not (
            fo is not None
            and getattr(target, "computes_field", False)
            and fo.field_fn == getattr(target, "field_from_latents", None)
        ):
            return None, False
        kind = s.sampler_kind
        kernel_class = getattr(kind, "kernel_class", None)
        if kernel_class is not None and hasattr(kernel_class(), "one_step_with_aux"):
            source = "kernel"
        elif kind.field_at_proposal:
            source = "end_point"
        else:
            return None, False
        return source, field_stats_every(s, fo.store_fields) == 1

    def _kernel(self, metric, reference, dtype, step_size, tap=None):
        """The kind's kernel on the whitened target, and the target's
        :class:`~fieldhmc.samplers.kernels.EndPointTap` for ``tap`` ``"end_point"`` (else
        None); ``tap`` ``"kernel"``: the kernel's target returns ``(log p, field)``
        (:meth:`_field_tap`)."""
        s = self.settings
        scales, factor = self._split_metric(metric)
        fn = self.target_log_prob_fn
        with_field = tap is not None
        target = whiten(
            fn.log_prob_and_field if with_field else fn, scales, reference, dtype, with_field
        )
        if factor is not None:
            whitened, idx = target, self._dense_idx

            def target(*u_parts):
                return whitened(*dense_metric.mix(u_parts, factor, idx))

        end_point = EndPointTap(target) if tap == "end_point" else None
        kernel = s.sampler_kind.build_kernel(
            end_point or target,
            s.kind_options,
            step_size=step_size,
            num_adaptation_steps=s.num_burnin_steps,
            dimension=sum(math.prod(sc.shape) for sc in scales),
        )
        if tap == "kernel":
            kernel = kernel.copy(target_has_aux=True)
        return kernel, end_point

    def _lp64_impl(self, x_parts):
        return tf.cast(self.target_log_prob_fn(*x_parts), tf.float64)

    def _bootstrap_impl(self, u_parts, scales, reference, step_size):
        kernel, _ = self._kernel(scales, reference, u_parts[0].dtype, step_size)
        return slim_results(kernel.bootstrap_results(list(u_parts)))

    def _chunk_impl(self, scales, reference, delta, seed, start, num_steps, num_burnin):
        """Warm-up: ``num_steps`` transitions from the carried state, which they update in
        place, with the kind's tuner (and the latent moments of ``adapt_diagonal``).

        ``delta`` (``[chains]`` float64) re-centres the carried log densities on the
        new ``reference``. Returns the per-step trace buffers, the stored-field buffer
        and the number of fields in it (none in warm-up).
        """
        return self._run_chunk(
            scales, reference, delta, seed, start, num_steps, num_burnin, "warmup"
        )

    def _chunk_impl_sampling(self, scales, reference, delta, seed, start, num_steps, num_burnin):
        """After warm-up: as :meth:`_chunk_impl` with the kind's
        :meth:`~fieldhmc.samplers.kinds.SamplerKind.sampling_kernel` (no tuner) and the
        field outputs, each computed only on the transitions that feed it."""
        return self._run_chunk(
            scales, reference, delta, seed, start, num_steps, num_burnin, "sampling"
        )

    def _chunk_impl_both(self, scales, reference, delta, seed, start, num_steps, num_burnin):
        """Warm-up and sampling in one program (``separate_sampling_program`` False): the
        tuner throughout (frozen after warm-up by its own count), the field outputs and
        the latent moments each under a conditional on the phase. The same transitions
        and outputs as the two programs, for one compile instead of two."""
        return self._run_chunk(scales, reference, delta, seed, start, num_steps, num_burnin, "both")

    def _run_chunk(self, scales, reference, delta, seed, start, num_steps, num_burnin, phase):
        # ``phase`` "warmup" / "sampling": two programs, compiled apart. Warm-up carries and
        # computes no field outputs, sampling no tuner and no latent moments: an XLA
        # conditional that passes a loop-carried buffer through copies it (twice per
        # transition: into the conditional's result and back into the loop's buffer) --
        # for every kind the field moments, with adapt_diagonal the latent moments (the
        # microcanonical tuners run unconditionally, held after warm-up: no copies).
        # "both": one program with those conditionals, for runs too small for the
        # copies to outweigh a second compile (separate_sampling_program_for).
        s = self.settings
        carry = self._carry
        to_x = self._to_x_fn(scales)
        u_parts = self._to_u_fn(scales)(carry.read("x"))
        results = shift_target_log_prob(carry.read("results"), delta)
        dtype = u_parts[0].dtype
        fo = self.field_outputs if phase != "warmup" else None
        tap, kept = self._field_tap() if fo is not None else (None, False)
        kernel, end_point = self._kernel(
            scales, reference, dtype, tf.constant(s.step_size, dtype), tap
        )
        if phase == "sampling":
            kernel = s.sampler_kind.sampling_kernel(kernel)
        k = s.chunk_size
        chains = s.num_chains
        scalar_idx = [i for i, u in enumerate(u_parts) if u.shape.rank == 1]

        # Every per-draw trace goes in one float64 buffer [k, chains, columns], one
        # dynamic-update-slice per transition (one per trace was ~12 small XLA thunks
        # per transition, a few % of mclmc's transition at 16³), and is cut into named
        # traces of their own dtypes after the loop: exact, as the booleans and int32
        # counts are exact in float64. layout: (name, dtype, columns or None for a
        # [k, chains] trace).
        layout = [
            (
                name,
                tf.bool
                if name in ("is_accepted", "diverging")
                else tf.int32
                if name in ("n_steps", "tree_depth")
                else tf.float64,
                None,
            )
            for name in STAT_NAMES
        ]
        layout += [(self.part_names[i], tf.float64, None) for i in scalar_idx]
        carried = {}  # what else the loop carries: field outputs, or the latent moments
        if fo is not None:
            x0 = to_x(u_parts)
            x_shape = fo.field_fn(*x0).shape[1:]
            probe = fo.spectral_input(lambda: fo.field_fn(*x0), lambda: x0)
            nbins = fo.power_fn(probe).shape[-1]
            layout.append(("power", tf.float64, nbins))
            if fo.tracked_fn is not None:
                ntr = fo.tracked_fn(probe).shape[-1]
                layout += [("tracked_real", tf.float64, ntr), ("tracked_imag", tf.float64, ntr)]
            nslots = self._field_slots or math.ceil(k / s.field_thin)
            carried["fw"] = carry.read("fw")
            if fo.store_fields:
                carried["field_buf"] = tf.zeros([nslots, chains, *x_shape], dtype)
                carried["nfields"] = tf.constant(0)
            if kept:  # the current state's field, kept per chain
                carried["field_now"] = fo.field_fn(*x0)
        if phase != "sampling" and s.adapt_diagonal:
            carried["lw"] = carry.read("lw")
        widths = [w or 1 for _, _, w in layout]
        starts = [sum(widths[:j]) for j in range(len(widths))]  # each trace's first column
        columns = sum(widths)
        trace = tf.zeros([k, chains, columns], tf.float64)
        dense_idx = self._dense_idx
        stats_every = field_stats_every(s, fo is not None and fo.store_fields)

        def write(buf, i, value):
            # dynamic-update-slice of a loop-carried buffer: in place under XLA (a
            # scatter, or a write inside a tf.cond, copies the whole buffer per step).
            start = tf.concat([[i], tf.zeros([buf.shape.rank - 1], tf.int32)], 0)
            return xla.dynamic_update_slice(buf, tf.cast(value, buf.dtype)[None], start)

        def body(i, u, res, trace, carried):
            step = start + i
            step_seed = tf.random.experimental.stateless_fold_in(seed, step)
            lp_prev = s.sampler_kind.target_log_prob_of(res)
            # The loop carries slim results (no proposal, no momenta: see slim_results).
            carried = dict(carried)
            if tap == "kernel":  # and the field at the proposal
                u, res, proposed = kernel.one_step_with_aux(u, expand_results(res), seed=step_seed)
            else:
                u, res = kernel.one_step(u, expand_results(res), seed=step_seed)
                proposed = end_point.read() if tap == "end_point" else None
                if tap and proposed is None:
                    raise RuntimeError(
                        f"{s.sampler_kind.name}: the kernel's last target evaluation was "
                        "not traced in the transition's graph (field_at_proposal)"
                    )
            st = s.sampler_kind.step_stats(res, lp_prev)
            if kept:  # the proposal's field where it was accepted
                accepted = tf.reshape(st.is_accepted, [chains] + [1] * (proposed.shape.rank - 1))
                carried["field_now"] = tf.where(accepted, proposed, carried["field_now"])
                field_in = (carried["field_now"],)
            elif tap:  # and whether every chain's proposal was accepted
                # (int32: _loop_if's inputs are pinned by adding a zero, not for bools)
                field_in = (proposed, tf.cast(tf.reduce_all(st.is_accepted), tf.int32))
            else:
                field_in = ()
            res = slim_results(res)
            values = {
                "lp": tf.cast(st.target_log_prob, tf.float64) + reference,
                "acceptance_rate": st.acceptance_rate,
                "is_accepted": st.is_accepted,
                "diverging": st.diverging,
                "energy": tf.cast(st.energy, tf.float64) - reference,
                "step_size": st.step_size,
                "n_steps": st.n_steps,
                "tree_depth": st.tree_depth,
                "energy_error": st.energy_error,
            }

            def x_parts():  # the state in model coordinates, made where it is used
                return to_x(u)

            if dense_idx:
                x_now = to_x(u)
                for j in scalar_idx:
                    values[self.part_names[j]] = x_now[j]
            else:
                for j in scalar_idx:
                    values[self.part_names[j]] = u[j] * scales[j]
            if fo is not None:
                # Each statistic only on the transitions that use it (XLA runs one branch
                # of a tf.cond; a cadence of 1 needs no conditional at all): P(k) and
                # tracked modes on stored draws (every thin-th), the running moments every
                # stats_every-th, the field for those (unless modes_fn gives their modes
                # directly), the moments or a stored field draw (every field_thin-th).
                after = step - num_burnin
                is_trace = _every(after, s.thin)
                is_moment = _every(after, stats_every)
                keep = _every(after, s.field_thin) if fo.store_fields else False
                if phase == "both":  # nothing from warm-up's transitions
                    sampling_step = after >= 0
                    is_trace = _all(sampling_step, is_trace)
                    is_moment = _all(sampling_step, is_moment)
                    keep = _all(sampling_step, keep)
                field_for_trace = is_trace if fo.modes_fn is None else False

                def field_stats(field=None):
                    spectral = fo.spectral_input(lambda: field, x_parts)
                    out = [tf.cast(fo.power_fn(spectral), tf.float64)]
                    if fo.tracked_fn is not None:
                        modes = fo.tracked_fn(spectral)
                        out += [
                            tf.cast(tf.math.real(modes), tf.float64),
                            tf.cast(tf.math.imag(modes), tf.float64),
                        ]
                    return out

                def no_field_stats():
                    out = [tf.zeros([chains, nbins], tf.float64)]
                    if fo.tracked_fn is not None:
                        out += [tf.zeros([chains, ntr], tf.float64)] * 2
                    return out

                def traced(predicate):
                    # A predicate known at trace time to be True still goes in the graph:
                    # the same loops in the post-warm-up program as in the one-program
                    # chunk, whose draws it reproduces to the bit (fused into the body
                    # instead, the float32 moments rounded 1 ulp differently).
                    return after >= 0 if predicate is True else predicate

                # The field, and what reads it, only on the transitions that need it:
                # inside a loop of zero or one trips (_loop_if), which updates the moments
                # and the stored-field buffer in place. A tf.cond materialised a zero field
                # on the others and copied the moments through itself, and the buffer's
                # slot was rewritten every transition (~3 field passes per transition).
                def with_field(state, u_in, *tap_in):
                    if len(tap_in) == 1:  # the current state's field (kept)
                        field = tap_in[0]
                    elif tap_in:  # the proposal's field, made again where one was not taken
                        field = _loop_if(
                            tf.equal(tap_in[1], 0),
                            lambda _, u_now: fo.field_fn(*to_x(u_now)),
                            tap_in[0],
                            (u_in,),
                        )
                    else:
                        field = fo.field_fn(*to_x(u_in))
                    state = dict(state)
                    if "stats" in state:
                        state["stats"] = _cond(
                            field_for_trace, lambda: field_stats(field), no_field_stats
                        )
                    state["fw"] = _loop_if(
                        traced(is_moment),
                        lambda fw, f: _welford_update(fw, [f]),
                        state["fw"],
                        (field,),
                    )
                    if fo.store_fields:
                        # Slot `nfields` takes a kept draw (the last slot once all are
                        # kept: chunks never keep more than there are slots).
                        nfields = state["nfields"]
                        slot = tf.minimum(nfields, nslots - 1)
                        state["field_buf"] = _loop_if(
                            traced(keep),
                            lambda buf, f: write(buf, slot, f),
                            state["field_buf"],
                            (field,),
                        )
                        state["nfields"] = nfields + tf.cast(keep, tf.int32)
                    return state

                state = {k: carried[k] for k in ("fw", "field_buf", "nfields") if k in carried}
                if fo.modes_fn is None:  # P(k) and tracked modes read the field
                    state["stats"] = no_field_stats()
                state = _loop_if(
                    traced(_any(field_for_trace, is_moment, keep)),
                    with_field,
                    state,
                    (u, *field_in),
                )
                if fo.modes_fn is None:
                    out = state.pop("stats")
                else:
                    out = _cond(is_trace, field_stats, no_field_stats)
                carried.update(state)
                values["power"] = out[0]
                if fo.tracked_fn is not None:
                    values["tracked_real"], values["tracked_imag"] = out[1], out[2]
            if "lw" in carried:  # adapt_diagonal: every warm-up transition

                def latent_moments(lw=carried["lw"], u_in=u):
                    x64 = [tf.cast(p, tf.float64) for p in to_x(u_in)]
                    if s.adapt_dense_params:  # the block's mean and co-moment close the list
                        block = tf.stack([x64[j] for j in dense_idx], axis=-1)
                        moments = dense_metric.welford_block_update(lw[0], lw[-2], lw[-1], block)
                        return [*_welford_update(lw[:-2], x64), *moments]
                    return _welford_update(lw, x64)

                if phase == "both":  # a loop, not a tf.cond: no copy after warm-up
                    carried["lw"] = _loop_if(step < num_burnin, latent_moments, carried["lw"], (u,))
                else:
                    carried["lw"] = latent_moments()
            # The row as a sum of zero-padded columns, which XLA fuses into one loop (a
            # concatenate of these many operands stays a thunk of its own, each operand
            # converted by another); adding zeros leaves every value as it was (a -0.0
            # reads +0.0).
            row = [
                tf.pad(
                    tf.reshape(tf.cast(values[name], tf.float64), [chains, width]),
                    [[0, 0], [col, columns - col - width]],
                )
                for (name, _, _), width, col in zip(layout, widths, starts, strict=True)
            ]
            trace = write(trace, i, tf.add_n(row))
            return i + 1, u, res, trace, carried

        early = self._stops_warmup_early and phase != "sampling"

        def going(i, u, res, *_):
            if not early:
                return i < num_steps
            # the tuner has converged: warm-up ends here, run() starts sampling next
            finished = s.sampler_kind.warmup_end(res) >= 0
            return (i < num_steps) & ~(finished & (start < num_burnin))

        _, u_parts, results, trace, carried = tf.while_loop(
            going,
            body,
            (tf.constant(0), list(u_parts), results, trace, carried),
            maximum_iterations=k,
        )
        bufs = {}
        for (name, dt, w), width, col in zip(layout, widths, starts, strict=True):
            piece = trace[:, :, col : col + width]
            bufs[name] = tf.cast(piece if w else piece[:, :, 0], dt)
        carry.assign("x", to_x(u_parts))
        carry.assign("results", results)
        for name in ("fw", "lw"):
            if name in carried:
                carry.assign(name, carried[name])
        if "field_buf" in carried:
            return bufs, carried["field_buf"], carried["nfields"]
        return bufs, tf.zeros([1], dtype), tf.constant(0)

    # -- Python-side orchestration -----------------------------------------------------
    def _to_u(self, x, scales, factor=None):
        u = [np.asarray(xi / si, dtype=xi.dtype) for xi, si in zip(x, scales, strict=True)]
        if self._dense_idx:
            u = dense_metric.unmix_numpy(u, factor, self._dense_idx)
        return [tf.constant(ui) for ui in u]

    def _scales_tensors(self, scales, dtype, factor=None):
        """The metric as the chunk takes it: the runner's per-part scales, and the dense
        block's factor (float64) last with ``adapt_dense_params``."""
        out = self.runner.scales_tensors(scales, dtype)
        if self._dense_idx:
            out = [*out, tf.constant(factor, tf.float64)]
        return out

    def _scale_tensors(self, rs: _RunState) -> list:
        """``rs.scales`` as tensors, made once per metric and kept in ``rs``: made per
        chunk call, a field-sized metric existed once more during every chunk."""
        if rs.scale_tensors is None:
            rs.scale_tensors = self._scales_tensors(rs.scales, self._carry.dtype, rs.dense_factor)
        return rs.scale_tensors

    def _fresh_state(self, init_state: Iterable[np.ndarray]) -> _RunState:
        return self.runner.fresh_state(init_state)

    def _xla_fresh_state(self, init_state: Iterable[np.ndarray]) -> _RunState:
        x = [np.asarray(p) for p in init_state]
        if x[0].shape[0] != self.settings.num_chains:
            raise ValueError(
                f"initial state has {x[0].shape[0]} chains, expected {self.settings.num_chains}"
            )
        for name, p in zip(self.part_names, x, strict=True):
            if not np.all(np.isfinite(p)):
                raise ValueError(f"initial state of {name!r} contains NaN or Inf")
        dtype = tf.as_dtype(x[0].dtype)
        # Views of the initial scales where their shape and dtype already fit (no copy).
        scales = [
            np.asarray(np.broadcast_to(s, p.shape[1:]), p.dtype)
            for s, p in zip(self.initial_scales, x, strict=True)
        ]
        reference = self._lp64([tf.constant(p) for p in x]).numpy()
        if not np.all(np.isfinite(reference)):
            raise ValueError("the log density is not finite at the initial state")
        # the dense block starts as the given factor (default L = I: the diagonal metric)
        factor = self._initial_dense_factor
        results = self._bootstrap(
            self._to_u(x, scales, factor),
            self._scales_tensors(scales, dtype, factor),
            tf.constant(reference),
            tf.constant(self.settings.step_size, dtype),
        )
        self._carry.load(
            x=x, results=results, fw=self._zero_welford_field(x), lw=self._zero_welford_latent(x)
        )
        return _RunState(step=0, scales=scales, reference=reference, dense_factor=factor)

    def _zero_welford_latent(self, x):
        # Windowed variances of the latent state feed adapt_diagonal only: without it
        # the chunk carries the count alone, not 2 float64 copies of the state. With
        # adapt_dense_params the scalar block's mean and co-moment close the list.
        out = _zero_welford([p.shape[1:] for p in x] if self.settings.adapt_diagonal else [])
        if self.settings.adapt_dense_params:
            out += dense_metric.zero_block_moments(len(self._dense_idx))
        return out

    def _zero_welford_field(self, x):
        # The field's running moments in the field's dtype: float32 for float32 models
        # (relative error ~1e-7 sqrt(draws), far below any Monte Carlo error), which
        # halves what they hold -- the carried mean and M2 and the compiled chunk's
        # copy of both in its moment branch: 8 -> 4 field-sized buffers per chain.
        if self.field_outputs is None:
            return _zero_welford([()])
        delta = self.field_outputs.field_fn(*[tf.constant(p) for p in x])
        return _zero_welford([tuple(delta.shape[1:])], delta.dtype.as_numpy_dtype)

    def _checkpoint(self, directory: Path, rs: _RunState) -> None:
        carry = self._carry
        x = carry.numpy("x")
        flat = tf.nest.flatten(carry.numpy("results"), expand_composites=True)
        arrays = {f"x{i}": p for i, p in enumerate(x)}
        arrays.update({f"scale{i}": sc for i, sc in enumerate(rs.scales)})
        arrays.update({f"results{i}": np.asarray(t) for i, t in enumerate(flat)})
        arrays.update({f"fw{i}": np.asarray(t) for i, t in enumerate(carry.numpy("fw"))})
        arrays.update({f"lw{i}": np.asarray(t) for i, t in enumerate(carry.numpy("lw"))})
        arrays["reference"] = rs.reference
        if rs.dense_factor is not None:
            arrays["dense_factor"] = rs.dense_factor
        meta = {
            "layout": CHECKPOINT_LAYOUT,
            "step": rs.step,
            "num_parts": len(x),
            "num_results_flat": len(flat),
            "num_draws_written": rs.num_draws_written,
            "num_fields_written": rs.num_fields_written,
            "gradient_evaluations": rs.gradient_evaluations,
            "warmup_gradient_evaluations": rs.warmup_gradient_evaluations,
            "num_burnin": rs.num_burnin,
            "settings": self.settings.__dict__,
        }
        save_checkpoint(directory, arrays, meta)

    def _restore(self, directory: Path) -> _RunState:
        arrays, meta = load_checkpoint(directory)
        layout = meta.get("layout", 1)
        if layout != CHECKPOINT_LAYOUT:
            raise ValueError(
                f"checkpoint {directory} has state layout {layout}, this fieldhmc reads "
                f"layout {CHECKPOINT_LAYOUT}: resume it with the version that wrote it, "
                "or start the run afresh"
            )
        n = meta["num_parts"]
        x = [arrays[f"x{i}"] for i in range(n)]
        scales = [arrays[f"scale{i}"] for i in range(n)]
        factor = None
        if self._dense_idx:
            if "dense_factor" not in arrays:
                raise ValueError(
                    f"checkpoint {directory} has no dense parameter metric: it was written "
                    "with a diagonal one (or by an older fieldhmc); resume it with the "
                    "preconditioner and version it was started with"
                )
            factor = arrays["dense_factor"]
        elif "dense_factor" in arrays:
            raise ValueError(
                f"checkpoint {directory} holds a dense parameter metric (dense_params, or "
                "posterior with a conditional parametrisation): resume it with the "
                "preconditioner and version it was started with"
            )
        dtype = tf.as_dtype(x[0].dtype)
        template = self._bootstrap(
            self._to_u(x, scales, factor),
            self._scales_tensors(scales, dtype, factor),
            tf.constant(arrays["reference"]),
            tf.constant(self.settings.step_size, dtype),
        )
        expected = len(tf.nest.flatten(template, expand_composites=True))
        if meta["num_results_flat"] != expected:  # e.g. mams' tuner state before its stop
            raise ValueError(
                f"checkpoint {directory} holds {meta['num_results_flat']} kernel-result "
                f"tensors, this sampler's results have {expected}: it was written by another "
                "fieldhmc version or sampler kind; resume it with the version that wrote it, "
                "or start the run afresh"
            )
        flat = [tf.constant(arrays[f"results{i}"]) for i in range(meta["num_results_flat"])]
        results = tf.nest.pack_sequence_as(template, flat, expand_composites=True)
        fw, lw = _numbered(arrays, "fw"), _numbered(arrays, "lw")
        self._carry.load(x=x, results=results, fw=fw, lw=lw)
        return _RunState(
            step=meta["step"],
            scales=scales,
            reference=arrays["reference"],
            num_draws_written=meta["num_draws_written"],
            num_fields_written=meta["num_fields_written"],
            gradient_evaluations=meta["gradient_evaluations"],
            warmup_gradient_evaluations=meta.get("warmup_gradient_evaluations", 0),
            dense_factor=factor,
            num_burnin=meta.get("num_burnin"),
        )

    def _update_metric(self, rs: _RunState) -> None:
        """End of a slow window: new scales from the windowed variance, restart step size
        (a runner with its own results restarts them: ``runner.restart_adaptation``)."""
        x, lw = self._carry.numpy("x"), self._carry.numpy("lw")
        new_scales = windowed_scales(x, lw, self.metric_groups)
        restart = getattr(self.runner, "restart_adaptation", None)
        if restart is not None:
            restart(rs, new_scales)
            return
        factor = rs.dense_factor  # a fixed factor stays (None without a dense block)
        if self.settings.adapt_dense_params:  # the block's scales and factor from its co-moment
            block_scales, factor = dense_metric.dense_window_estimate(float(lw[0]), lw[-1])
            for j, i in enumerate(self._dense_idx):
                new_scales[i] = np.asarray(block_scales[j], x[i].dtype)
            rs.dense_factor = factor
        dtype = tf.as_dtype(x[0].dtype)
        step_size = np.asarray(self._carry.numpy("results").new_step_size)
        rs.scales, rs.scale_tensors = new_scales, None
        results = self._bootstrap(
            self._to_u(x, new_scales, factor),
            self._scales_tensors(new_scales, dtype, factor),
            tf.constant(rs.reference),
            tf.constant(step_size, dtype),
        )
        remaining = self.settings.num_burnin_steps - rs.step
        results = results._replace(num_adaptation_steps=tf.constant(remaining, tf.int32))
        self._carry.load(results=results, lw=self._zero_welford_latent(x))

    def run(
        self,
        sink: TraceSink,
        checkpoint_dir: Path,
        init_state: Iterable[np.ndarray] | None = None,
        *,
        resume: bool = False,
        progress: bool = True,
        max_chunks: int | None = None,
        tensorboard_dir: Path | None = None,
        seed: int | None = None,
    ) -> RunResult:
        """Run (or resume) warm-up and sampling.

        Parameters
        ----------
        sink : TraceSink
            Receives post-warm-up traces (every ``thin``-th draw) and thinned fields.
        checkpoint_dir : Path
            Written after the first chunk, then after a chunk once
            ``settings.checkpoint_seconds`` have passed, at the end of warm-up, after
            the last chunk (or the ``max_chunks``-th) and at a Ctrl-C (which ends the run
            at the chunk's end: :class:`_InterruptAtChunkEnd`); read when ``resume``.
        init_state : iterable of array, optional
            ``[chains, ...]`` per part; required unless ``resume``. Pass an iterator
            (e.g. a generator) to keep no second copy of the initial state alive
            during the run: the sampler's variables then hold the only one.
        max_chunks : int, optional
            Stop after this many chunks (tests use it to simulate a kill).
        tensorboard_dir : Path, optional
            Also write the progress figures as TensorBoard scalars after every chunk.
        seed : int, optional
            Replaces ``settings.seed`` for this run. The compiled chunk takes the seed
            as a tensor, so one ``Sampler`` runs many seeds without retracing.

        Returns
        -------
        RunResult
        """
        s = self.settings
        if resume:
            rs = self._restore(checkpoint_dir)
            sink.truncate(rs.num_draws_written, rs.num_fields_written)
        else:
            if init_state is None:
                raise ValueError("init_state is required for a fresh run")
            rs = self._fresh_state(init_state)
        dtype = self._carry.dtype
        field_slots = None
        if self.field_outputs is not None and self.field_outputs.store_fields:
            shape = self._carry.shapes("fw")[1]  # one field (mean of the running moments)
            itemsize = dtype.size
            field_slots = field_buffer_slots(s, s.num_chains * math.prod(shape) * itemsize)
        if self._field_slots is None:
            self._field_slots = field_slots
        if rs.num_burnin is None:
            rs.num_burnin = s.num_burnin_steps
        bounds = _chunk_bounds(s, self._field_slots, rs.num_burnin)
        windows = adaptation_windows(s.num_burnin_steps) if s.adapt_diagonal else []
        window_starts = {a for a, _ in windows}
        window_ends = {b for _, b in windows}
        seed = tf.constant(stateless_seed(s.seed if seed is None else seed))
        bar = _progress_bar(progress, rs.num_burnin + s.num_results, rs.step)
        writer = None
        if tensorboard_dir is not None:
            try:
                import tensorboard  # noqa: F401  (tf.summary.scalar needs it)
            except ImportError as exc:
                raise ValueError(
                    "outputs.tensorboard needs the tensorboard package: "
                    "pip install 'fieldhmc[tensorboard]'"
                ) from exc
            writer = tf.summary.create_file_writer(str(tensorboard_dir))
        chunks_done = 0
        t0 = time.perf_counter()
        last_checkpoint = None  # perf_counter of this process's last checkpoint
        interrupt = _InterruptAtChunkEnd()
        try:
            while rs.step < rs.num_burnin + s.num_results:
                if max_chunks is not None and chunks_done >= max_chunks:
                    break
                stop = next(b for b in bounds if b > rs.step)
                # A window's metric update happens right before the chunk starting at its
                # end; checkpoints are written after chunks, so a resumed run does it too.
                if s.adapt_diagonal and rs.step in window_ends:
                    self._update_metric(rs)
                if s.adapt_diagonal and rs.step in window_starts:
                    self._carry.load(lw=self._zero_welford_latent(self._carry.numpy("x")))
                # Re-centre the float64 offset on the chunk's starting point (the chunk
                # shifts the carried log densities by the change).
                new_ref = self._lp64(self._carry.read("x")).numpy()
                delta = tf.constant(rs.reference - new_ref)
                rs.reference = new_ref
                chunk_start = time.perf_counter()
                # chunks never straddle the end of warm-up (it is a chunk bound)
                warming = rs.step < rs.num_burnin
                chunk = self._chunk if warming else self._sampling_chunk
                bufs, field_buf, nfields = chunk(
                    self._scale_tensors(rs),
                    tf.constant(rs.reference),
                    delta,
                    seed,
                    tf.constant(rs.step, tf.int32),
                    tf.constant(stop - rs.step, tf.int32),
                    tf.constant(rs.num_burnin, tf.int32),
                )
                if warming and self._stops_warmup_early:
                    # The chunk ended where the tuner converged: sampling starts there.
                    end = int(s.sampler_kind.warmup_end(self._carry.read("results")))
                    if end >= 0:
                        stop = rs.num_burnin = end
                        bounds = _chunk_bounds(s, self._field_slots, end)
                        if bar is not None:
                            bar.total = end + s.num_results
                n = stop - rs.step
                traces = {name: buf.numpy()[:n] for name, buf in bufs.items()}
                if not warming and self._sampling_chunk_ran:
                    # compute time of pure sampling chunks, after the one that compiled them
                    rs.sampling_seconds += time.perf_counter() - chunk_start
                    # Batched evaluations: all chains step until the longest trajectory ends.
                    rs.sampling_gradients += int(traces["n_steps"].max(axis=1).sum())
                self._sampling_chunk_ran |= chunk is self._sampling_chunk
                rs.gradient_evaluations += int(traces["n_steps"].sum())  # summed over chains
                if warming:  # chunks never straddle the end of warm-up
                    rs.warmup_gradient_evaluations += int(traces["n_steps"].sum())
                self._emit(sink, rs, traces, field_buf, int(nfields), stop)
                del field_buf
                rs.step = stop
                chunks_done += 1
                # Resume truncates the sink to the checkpoint's counts and replays the same
                # draws (seeds fold in the step), so chunks between checkpoints are safe to
                # skip: a kill loses up to checkpoint_seconds of sampling and a chunk.
                now = time.perf_counter()
                interrupted = interrupt.pending  # a later SIGINT waits for the next chunk
                if (
                    last_checkpoint is None  # the first chunk: a killed run can always resume
                    or now - last_checkpoint >= s.checkpoint_seconds
                    or rs.step == rs.num_burnin
                    or rs.step >= rs.num_burnin + s.num_results
                    or (max_chunks is not None and chunks_done >= max_chunks)
                    or interrupted
                ):
                    self._checkpoint(checkpoint_dir, rs)
                    last_checkpoint = time.perf_counter()
                if interrupted:  # Ctrl-C: the run stops at this chunk's checkpoint
                    if bar is not None:
                        bar.close()
                    raise KeyboardInterrupt
                msg = _report(bar, traces, n, rs, s, t0)
                if writer is not None:
                    with writer.as_default(step=rs.step):
                        for name, value in msg.items():
                            if name != "phase":
                                tf.summary.scalar(name, value)
                        tf.summary.scalar("lp", float(np.mean(traces["lp"][-1])))
                    writer.flush()
        finally:
            interrupt.restore()
        if bar is not None:
            bar.close()
        return RunResult(**self._summary(rs))

    def _emit(self, sink, rs, traces, field_buf, nfields, stop):
        s = self.settings
        first = rs.step
        steps = np.arange(first, stop)
        post = steps >= rs.num_burnin
        keep = post & ((steps - rs.num_burnin) % s.thin == 0)
        if keep.any():
            sink.append({name: t[keep] for name, t in traces.items()})
            rs.num_draws_written += int(keep.sum())
        if self.field_outputs is not None and self.field_outputs.store_fields and nfields:
            # A view of the chunk's output, not numpy()'s copy: the copy of every chunk's
            # field buffer (fresh pages each time) was 8% of a 64³ mclmc run's wall time.
            sink.append_fields(np.asarray(field_buf)[:nfields])
            rs.num_fields_written += nfields

    def _summary(self, rs: _RunState) -> dict:
        """:class:`RunResult`'s fields (a dict the sharded sampler amends)."""
        fw = self._carry.numpy("fw")
        fo = self.field_outputs
        field_mean = field_var = None
        if fo is not None and float(fw[0]) > 1:
            field_mean = np.asarray(fw[1])
            field_var = np.asarray(fw[2]) / (float(fw[0]) - 1.0)
        return {
            "complete": rs.step >= rs.num_burnin + self.settings.num_results,
            "step": rs.step,
            "num_warmup_steps": rs.num_burnin,
            "gradient_evaluations": rs.gradient_evaluations,
            "scales": rs.scales,
            "field_mean": field_mean,
            "field_var": field_var,
            "latent_state": self._carry.numpy("x"),
            "num_draws": rs.num_draws_written,
            "sampling_seconds": rs.sampling_seconds,
            "sampling_batched_gradients": rs.sampling_gradients,
            "warmup_gradient_evaluations": rs.warmup_gradient_evaluations,
            # field_mean / field_var average every field_moments_every-th transition:
            # field_moments_draws draws of all chains (not num_draws x chains if > 1).
            "field_moments_every": field_stats_every(
                self.settings, fo is not None and fo.store_fields
            ),
            "field_moments_draws": int(float(fw[0])),
            "tuned": self.settings.sampler_kind.tuned_parameters(
                self._carry.numpy("results"), rs.scales
            ),
            "dense_factor": rs.dense_factor,
        }


def windowed_scales(
    x: Sequence[np.ndarray],
    lw: Sequence[np.ndarray],
    groups: Sequence[np.ndarray | None] | None = None,
) -> list[np.ndarray]:
    """A slow window's metric scales per part: the square root of the windowed variance
    ``lw`` (count, then mean and M2 per part of ``x``), regularised toward 1e-3 as Stan's.
    A part with ``groups`` (a label per coordinate of one chain's part) has its variances
    shrunk toward their group's mean first (:func:`~fieldhmc.samplers.metric_pooling.
    shrink_to_groups`)."""
    count = float(lw[0])
    new_scales = []
    for i, p in enumerate(x):
        var = np.asarray(lw[2 + 2 * i]) / max(count - 1.0, 1.0)
        if groups is not None and groups[i] is not None:
            var = metric_pooling.shrink_to_groups(var, count, groups[i])
        var = (count / (count + 5.0)) * var + 1e-3 * (5.0 / (count + 5.0))
        new_scales.append(np.sqrt(var).astype(p.dtype))
    return new_scales


def _numbered(arrays: dict, prefix: str) -> list:
    """``arrays[prefix + "0"], arrays[prefix + "1"], ...`` in numeric order (sorted as
    strings, ``lw10`` came before ``lw2``: a model of 5 or more parts resumed a window
    with its moments out of order)."""
    keys = [k for k in arrays if k.startswith(prefix) and k[len(prefix) :].isdigit()]
    return [arrays[k] for k in sorted(keys, key=lambda k: int(k[len(prefix) :]))]


def tuned_parameters(kind: str, results, scales) -> dict:
    """The adapted step size (and, for mclmc / mams, ``L``) held in the kernel results
    (the kind's :meth:`~fieldhmc.samplers.kinds.SamplerKind.tuned_parameters`)."""
    return kinds.get(kind).tuned_parameters(results, scales)


def _zero_welford(shapes: Sequence[tuple], dtype=np.float64) -> list[np.ndarray]:
    """[count, mean_0, m2_0, mean_1, m2_1, ...], pooled over chains: the count in
    float64, the moments in ``dtype``."""
    out = [np.zeros([], np.float64)]
    for shape in shapes:
        out += [np.zeros(shape, dtype), np.zeros(shape, dtype)]
    return out


def _every(after, n: int):
    """``after % n == 0`` (a tensor), or Python ``True`` for ``n == 1``: no conditional."""
    return True if n == 1 else tf.equal(after % n, 0)


def _all(tensor, predicate):
    """``tensor`` and ``predicate`` (a tensor or a Python bool)."""
    if predicate is True:
        return tensor
    if predicate is False:
        return False
    return tf.logical_and(tensor, predicate)


def separate_sampling_program_for(settings: SamplerSettings, latent_size: int) -> bool:
    """Whether a run gets a post-warm-up program of its own (``separate_sampling_program``
    None): when its post-warm-up transitions times the state's elements (all chains)
    reach 2**30, e.g. 1,024 draws of 4 chains at 64³. The one-program alternative
    carries the tuner and the latent moments of ``adapt_diagonal`` (skipped after
    warm-up) and decides the field outputs on the phase as well as on their cadences;
    the second program costs a second XLA compile (seconds to tens of seconds), which
    is most of a short or small run: the default test suite (mostly 8³ runs) took 737 s
    with two programs everywhere, 611 s with this rule."""
    if settings.num_burnin_steps == 0:
        return True  # one program either way
    work = settings.num_results * settings.num_chains * latent_size
    return work >= 2**30


def _any(*predicates):
    """Logical or of tensors and Python bools (a Python bool when that decides it)."""
    if any(p is True for p in predicates):
        return True
    tensors = [p for p in predicates if p is not False]
    if not tensors:
        return False
    return functools.reduce(tf.logical_or, tensors)


def _loop_if(predicate, fn, state, inputs=()):
    """``fn(state, *inputs)`` if ``predicate`` else ``state``: a ``tf.while_loop`` of
    zero or one trips (a Python bool decides at trace time). Unlike a ``tf.cond``, XLA
    updates a loop's state in place: a conditional copies the buffers it passes through.

    ``fn`` must read what it computes from (e.g. the sampler state) through ``inputs``,
    not from its closure: XLA's loop-invariant code motion hoists whatever the body
    computes from loop-invariant values out of the loop, so a field made from the
    closure's state ran on every transition (an extra ``irfft3d`` per mclmc transition,
    about half of the driver's overhead at 16³). Inside the loop the inputs are made
    loop-variant (:func:`~fieldhmc.samplers.loops.pinned_to`)."""
    if isinstance(predicate, bool):
        return fn(state, *inputs) if predicate else state
    trips = tf.cast(predicate, tf.int32)

    def body(j, st):
        return j + 1, fn(st, *pinned_to(j, inputs))

    _, state = tf.while_loop(
        lambda j, _: j < trips, body, (tf.constant(0), state), maximum_iterations=1
    )
    return state


def _cond(predicate, true_fn, false_fn):
    """``tf.cond``, or just the branch a Python bool ``predicate`` selects."""
    if isinstance(predicate, bool):
        return true_fn() if predicate else false_fn()
    return tf.cond(predicate, true_fn, false_fn)


def _welford_update(acc, parts):
    """Merge one step's chains into the running (count, mean, M2) -- Chan et al. 1979.

    ``parts`` are cast to the accumulators' dtype; so are the counts (exact integers
    in float32 up to 2**24 draws), so float64 accumulators compute what they always did.
    """
    count = acc[0]
    nb = tf.cast(tf.shape(parts[0])[0], tf.float64)
    total = count + nb
    out = [total]
    for i, p in enumerate(parts):
        mean, m2 = acc[1 + 2 * i], acc[2 + 2 * i]
        dt = mean.dtype
        p = tf.cast(p, dt)
        c, n, t = tf.cast(count, dt), tf.cast(nb, dt), tf.cast(total, dt)
        mb = tf.reduce_mean(p, axis=0)
        m2b = tf.reduce_sum(tf.square(p - mb), axis=0)
        d = mb - mean
        out += [mean + d * n / t, m2 + m2b + tf.square(d) * c * n / t]
    return out


def _progress_bar(enabled: bool, total: int, initial: int):
    """A tqdm bar when stderr is a terminal; else None, and each chunk is logged instead."""
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="it", desc="sampling", leave=True)


def _report(bar, traces, n, rs, s, t0):
    phase = "warm-up" if rs.step <= rs.num_burnin else "sampling"
    msg = {
        "phase": phase,
        "accept": float(np.mean(traces["acceptance_rate"])),
        "step": float(np.mean(traces["step_size"][-1])),
        "div": int(np.sum(traces["diverging"])),
        "leapfrog_per_it": float(np.mean(traces["n_steps"])),
    }
    if bar is not None:  # one progress display: the bar, or (not a terminal) a log line
        bar.set_postfix({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in msg.items()})
        bar.update(n)
    else:
        _log.info(
            "step %d/%d (%s): accept %.3g, step size %.3g, %d divergent, %.3g leapfrog/it (%.1fs)",
            rs.step,
            rs.num_burnin + s.num_results,
            phase,
            msg["accept"],
            msg["step"],
            msg["div"],
            msg["leapfrog_per_it"],
            time.perf_counter() - t0,
        )
    return msg
