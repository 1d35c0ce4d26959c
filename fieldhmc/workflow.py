"""The jobs the CLI runs: simulate, run, resume, diagnose, plot.

Each takes a validated :class:`fieldhmc.config.Config` (or a run directory), calls
the library and writes the run directory laid out in :mod:`fieldhmc.io`. Nothing
here parses arguments or prints tables beyond the diagnostics report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from fieldhmc import config as cfg
from fieldhmc import datafiles, io

__all__ = [
    "Built",
    "build",
    "build_model",
    "diagnose",
    "export",
    "field_warmup",
    "initial_state",
    "make_mesh",
    "obtain_data",
    "plot",
    "resume",
    "run",
    "sample",
    "simulate",
    "write_inputs",
]

_log = logging.getLogger(__name__)


def _chatty() -> bool:
    """Progress bars and the printed report, unless the CLI was asked to be quiet."""
    return logging.getLogger("fieldhmc").getEffectiveLevel() <= logging.INFO


# --- model and data ----------------------------------------------------------------------
def _versions() -> dict[str, str]:
    import tensorflow as tf
    import tensorflow_probability as tfp

    from fieldhmc import __version__

    return {
        "fieldhmc": __version__,
        "tensorflow": tf.__version__,
        "tensorflow_probability": tfp.__version__,
    }


@contextlib.contextmanager
def _file_error():
    """An input file's :class:`~fieldhmc.datafiles.DataFileError` as the config error
    ``validate`` gives (one line naming the key)."""
    try:
        yield
    except datafiles.DataFileError as exc:
        raise cfg.ConfigError(exc.key, exc.message) from None


def _build_power(power: cfg.PowerConfig):
    from fieldhmc import models

    if power.kind == "eisenstein_hu":
        from fieldhmc.models.cosmology import CosmologicalPower, FixedCosmology

        fiducial = {
            key: _forward_parameter(getattr(power, key), f"model.power.{key}")
            for key in cfg.COSMOLOGY_LATENT_NAMES
        }
        fiducial = {
            k: v.fiducial if isinstance(v, models.ScalarPrior) else v for k, v in fiducial.items()
        }
        fixed = FixedCosmology(omega_b=power.omega_b, h=power.h, n_s=power.n_s)
        return CosmologicalPower(fiducial["omega_m"], fiducial["sigma8"], fixed, power.wiggles)
    if power.kind == "power_law":
        return models.PowerLaw(power.amplitude, power.index, power.k_pivot)
    if power.kind == "turnover":
        return models.TurnoverPowerLaw(
            power.amplitude, power.index, power.k_pivot, k_turnover=power.k_turnover
        )
    return models.TabulatedPower.from_file(power.file, k_pivot=power.k_pivot)


def _mask(config: cfg.Config, grid) -> np.ndarray | None:
    from fieldhmc import models

    lik = config.model.likelihood
    mask = lik.mask
    if mask is None:
        return None
    if mask.file is not None:
        with _file_error():
            loaded = datafiles.load_mask(mask.file, config.grid.shape, lik.kind)
        return np.asarray(loaded, dtype=np.float64)
    g = mask.generate
    return models.make_mask(grid, g.kind, g.fraction, g.seed)


def _forward_parameter(value, key: str):
    """A forward parameter's value: a number as given, or (``{sample, prior}``) its
    :class:`~fieldhmc.models.ScalarPrior` if sampled, else the prior's fiducial value."""
    from fieldhmc import models

    if not isinstance(value, cfg.SampledParameterConfig):
        return value
    try:
        prior = models.make_prior(value.prior.kind, **value.prior.arguments)
    except ValueError as exc:  # config.py checks the same first; a guard, one line
        raise cfg.ConfigError(f"{key}.prior", str(exc)) from None
    return prior if value.sample else prior.fiducial


def _power_priors(config: cfg.Config) -> dict:
    """``{latent name: prior}`` of the sampled power-spectrum parameters: ``(loc, scale)``
    of log A / n, or the :class:`~fieldhmc.models.ScalarPrior` of Omega_m / sigma8."""
    hyper = {
        name: (
            getattr(config.model.hyperparameters, name).prior_loc,
            getattr(config.model.hyperparameters, name).prior_scale,
        )
        for name in ("log_amplitude", "index")
        if getattr(config.model.hyperparameters, name).sample
    }
    power = config.model.power
    for key, latent in cfg.COSMOLOGY_LATENT_NAMES.items():
        if latent in power.sampled:
            hyper[latent] = _forward_parameter(getattr(power, key), f"model.power.{key}")
    return hyper


def _build_forward(config: cfg.Config, grid, power=None):
    """``(forward, forward_params)`` of ``model.forward`` (``(None, {})`` for the identity);
    sampled parameters are :class:`~fieldhmc.models.ScalarPrior` values. ``power`` (the
    built prior spectrum) gives kind ``lpt`` its fiducial Omega_m and fixed cosmology."""
    from fieldhmc import models

    forward = config.model.forward
    if forward is None:
        return None, {}
    if forward.kind == "lpt":
        from fieldhmc.models.galaxy_clustering import GalaxyClusteringForward

        values = {
            name: _forward_parameter(value, f"model.forward.params.{name}")
            for name, value in (forward.params or {}).items()
        }
        fixed = {k: 0.0 if isinstance(v, models.ScalarPrior) else v for k, v in values.items()}
        sampled = {
            name: values[name]
            for name in cfg.LPT_BIAS_NAMES
            if isinstance(values.get(name), models.ScalarPrior)
        }
        fwd = GalaxyClusteringForward(
            grid,
            a_obs=forward.a_obs,
            omega_m=power.omega_m,
            fixed=power.fixed,
            order=forward.order,
            rsd=forward.rsd,
            los_axis=forward.los_axis,
            bias=None if forward.bias == "none" else forward.bias,
            deconvolve=forward.deconvolve,
            **fixed,
        )
        return fwd, sampled
    if forward.kind == "zeldovich":
        values = {
            name: _forward_parameter(getattr(forward, name), f"model.forward.{name}")
            for name in ("growth", "bias")
        }
        fixed = {k: 1.0 if isinstance(v, models.ScalarPrior) else v for k, v in values.items()}
        sampled = {k: v for k, v in values.items() if isinstance(v, models.ScalarPrior)}
        return models.ZeldovichForward(grid, smoothing=forward.smoothing, **fixed), sampled
    try:
        fn = models.load_forward_target(forward.target)
    except models.ForwardModelError as exc:
        raise cfg.ConfigError("model.forward.target", str(exc)) from None
    params = {
        k: _forward_parameter(v, f"model.forward.params.{k}")
        for k, v in (forward.params or {}).items()
    }
    return fn, params


def build_model(
    config: cfg.Config, mask: np.ndarray | None = None, sigma_map: np.ndarray | None = None
):
    """The :class:`~fieldhmc.models.ForwardFieldModel` a config describes.

    ``mask`` / ``sigma_map`` override the config's (a run directory stores them). A
    ``model.forward`` of kind ``python`` is imported and checked on a two-chain prior
    draw here, before anything is compiled or written.

    Raises
    ------
    fieldhmc.config.ConfigError
        ``model.forward.target`` cannot be imported or fails
        :func:`~fieldhmc.models.check_forward_fn` (one line).
    """
    import tensorflow as tf

    from fieldhmc import models

    grid = models.Grid(config.grid.shape, config.grid.box_size)
    power = _build_power(config.model.power)
    hyper = _power_priors(config)
    lik = config.model.likelihood
    if mask is None:
        mask = _mask(config, grid)
    forward, forward_params = _build_forward(config, grid, power)
    common = {
        "forward": forward,
        "forward_params": forward_params,
        "parametrization": config.model.parametrisation,
        "hyper_priors": hyper,
        "dtype": tf.as_dtype(config.precision),
    }
    try:
        if lik.kind == "lognormal_poisson":
            return models.LognormalPoissonModel(grid, power, lik.nbar, mask, **common)
        if sigma_map is None and lik.sigma_map is not None:
            with _file_error():
                sigma_map = datafiles.load_sigma_map(lik.sigma_map, config.grid.shape, mask)
        sigma = sigma_map if sigma_map is not None else lik.sigma
        if sigma_map is None and lik.shot_noise is not None:  # 1 / sqrt(nbar V_cell)
            sigma = 1.0 / math.sqrt(lik.shot_noise.nbar * grid.volume / grid.num_cells)
        return models.GaussianFieldModel(grid, power, sigma, mask, **common)
    except models.ForwardModelError as exc:
        raise cfg.ConfigError("model.forward.target", str(exc)) from None


def check_forward(config: cfg.Config) -> str | None:
    """Import and check a ``model.forward`` of kind ``python`` exactly as ``run`` does.

    Builds the model (:func:`build_model`), which imports ``target`` and runs
    :func:`~fieldhmc.models.check_forward_fn` on a two-chain prior draw of the
    configured grid and precision: signature, a ``tf.Tensor`` of the right shape and
    dtype, finite values, a finite non-zero gradient, an XLA compile. Writes nothing.

    Returns
    -------
    str or None
        The checked ``target``, or ``None`` if there is no user forward function.

    Raises
    ------
    fieldhmc.config.ConfigError
        As :func:`build_model` (one line naming ``model.forward.target``).
    """
    forward = config.model.forward
    if forward is None or forward.kind != "python":
        return None
    build_model(config)
    return forward.target


@dataclass
class _Data:
    data: np.ndarray
    truth: np.ndarray | None
    truth_latents: dict[str, np.ndarray] | None


def _load_data_file(config: cfg.Config, mask: np.ndarray | None) -> np.ndarray:
    """The data file, checked as ``validate`` checks it; masked voxels set to 0."""
    with _file_error():
        return datafiles.load_data(
            config.data.path,
            config.data.key,
            config.grid.shape,
            config.model.likelihood.kind,
            mask,
        )


def obtain_data(config: cfg.Config, model) -> _Data:
    """The data (and, simulated, the truth and its latents) a config describes."""
    if config.data.source == "file":
        data = _load_data_file(config, getattr(model, "mask", None))
        return _Data(model.check_data(data), None, None)
    from fieldhmc.samplers import stateless_seed

    draw = model.sample(seed=stateless_seed(config.data.seed))
    latents = {name: np.asarray(draw[name]) for name in model.latent_names}
    return _Data(np.asarray(draw["data"]), np.asarray(draw["delta"]), latents)


def _write_data(run: io.RunDirectory, model, d: _Data) -> None:
    io.write_npy(run.data("data"), d.data)
    if d.truth is not None:
        io.write_npy(run.data("truth"), d.truth)

        def write_latents(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, **d.truth_latents)

        io.atomic_write(run.data_dir / "truth_latents.npz", write_latents)
    if getattr(model, "mask", None) is not None:
        io.write_npy(run.data("mask"), np.asarray(model.mask))
    sigma = getattr(model, "sigma", None)
    if sigma is not None and np.ndim(sigma) == 3:
        io.write_npy(run.data("sigma_map"), np.asarray(sigma))


def write_inputs(run: io.RunDirectory, config: cfg.Config, model, d: _Data) -> None:
    """A run directory's inputs: its config (with the versions) and data files."""
    _write_config(run, config)
    _write_data(run, model, d)


def _write_config(run: io.RunDirectory, config: cfg.Config) -> None:
    raw = config.to_dict()
    raw["versions"] = _versions()
    io.write_text(run.config, cfg.dump_yaml(raw))  # atomic, and follows the umask


def _read_config(run: io.RunDirectory) -> cfg.Config:
    if not run.config.exists():
        raise FileNotFoundError(f"{run.root} is not a fieldhmc run directory (no config.yaml)")
    raw = cfg.read_yaml(run.config)
    raw.pop("versions", None)
    return cfg.config_from_dict(raw, run.root)


def simulate(config: cfg.Config, out_dir: Path, overwrite: bool = False) -> io.RunDirectory:
    """Write synthetic truth and data (plus mask, sigma map) to ``out_dir/data``."""
    if config.data.source != "simulate":
        raise ValueError(
            f"data.source: `fieldhmc simulate` needs data.source=simulate "
            f"(got {config.data.source})"
        )
    model = build_model(config)
    with io.lock_run_directory(out_dir, create=True):
        run = io.prepare_run_directory(out_dir, overwrite)
        write_inputs(run, config, model, obtain_data(config, model))
    _log.info("simulated truth and data in %s", run.data_dir)
    return run


# --- the pipeline: build -> sample -> export (-> diagnose -> plot) ---------------------
def _settings(config: cfg.Config, num_results: int | None = None):
    from fieldhmc.samplers import SamplerSettings
    from fieldhmc.samplers.driver import CHUNK_SIZE_MIN, auto_chunk_size

    s = config.sampler
    settings = SamplerSettings(
        kind=s.kind,
        num_chains=s.num_chains,
        num_burnin_steps=s.num_burnin_steps,
        num_results=num_results or s.num_results,
        step_size=s.step_size,
        adapt_diagonal=s.preconditioner in ("diagonal", "dense_params"),
        adapt_dense_params=s.preconditioner == "dense_params",
        chunk_size=CHUNK_SIZE_MIN if s.chunk_size == "auto" else s.chunk_size,
        checkpoint_seconds=s.checkpoint_seconds,
        thin=s.thin,
        field_thin=config.outputs.field_thin,
        seed=s.seed,
        **s.sampler_kind.driver_options(s),
    )
    if s.chunk_size == "auto":
        size = auto_chunk_size(settings, math.prod(config.grid.shape))
        settings = dataclasses.replace(settings, chunk_size=size)
    return settings


def _metric_groups(config: cfg.Config, model, settings) -> list | None:
    """The windowed metric's pooling groups per latent (``sampler.metric_pooling``:
    :meth:`~fieldhmc.models.FieldModel.metric_groups`), or ``None``."""
    if settings.adapt_diagonal and config.sampler.metric_pooling == "shells":
        return model.metric_groups()
    return None


# the metrics that use (posterior) or start from (the windowed ones) the P(k) block
_BLOCK_METRICS = ("posterior", "diagonal", "dense_params")


def _hyper_block(config: cfg.Config, model, data) -> tuple[tuple[str, ...], np.ndarray] | None:
    """The posterior metric's block of the sampled P(k) parameters under a conditional
    parametrisation: ``(names, latent covariance)`` of their Laplace fit at the data's
    posterior mode (:meth:`~fieldhmc.models.FieldModel.hyper_posterior_laplace`), or the
    Fisher covariance at the fiducial values if that fit fails; ``None`` for another
    metric or parametrisation. The windowed metrics (``diagonal``, ``dense_params``) start
    from the Laplace fit where there is one: from the prior widths their first windows
    ran saturated trees (masked 32³, fieldnuts: 105,000 warm-up gradients against
    28,000; benchmarks/README.md); elsewhere they start from the prior widths. The
    fiducial Fisher covariance without ``data`` (a mesh run: the fit evaluates the
    unsharded model) and for a forward model or non-Gaussian likelihood (where the fit
    was not validated), and under ``conditional_scale`` (whose z = 0 is the field 0). The
    fiducial Fisher matrix is not the default because the data's parameters can be far
    from the fiducial ones (a prior draw in SBC and simulated data); then it is several
    times too wide and misses the correlation (log A and n: -0.96 at 32³ against -0.81),
    and MCLMC's step collapses on the narrow direction (benchmarks/README.md)."""
    if config.sampler.preconditioner not in _BLOCK_METRICS or not model.is_conditional:
        return None
    if not model.power_hyper_names:
        return None
    # conditional_scale's z = 0 is the field 0, where the density does not see the data
    fits = data is not None and model.is_gaussian_likelihood and model.has_data_in_latent
    if not fits:
        if config.sampler.preconditioner != "posterior":
            return None  # a windowed metric keeps its start off the fit (not measured)
        # a mesh run, conditional_scale, or a forward model or non-Gaussian likelihood,
        # whose z = 0 is only the surrogate's mean (the galaxy model's fit at 16³ put
        # Omega_m near its bound, its latent width 6x the Fisher one): the Fisher
        # covariance at the fiducial values
        return model.hyper_posterior_covariance()
    fit = model.hyper_posterior_laplace(data)
    if fit is None:
        _log.warning(
            "the Laplace fit of %s at the data's posterior mode failed; their metric is "
            "the Fisher covariance at the fiducial values",
            ", ".join(model.power_hyper_names),
        )
        return model.hyper_posterior_covariance()
    names, _, cov = fit
    return names, cov


def _hyper_scales(config: cfg.Config, model, block=None) -> dict[str, float]:
    """The configured metric's scale of each sampled scalar's latent (``block``: the
    posterior metric's, :func:`_hyper_block`)."""
    kind = config.sampler.preconditioner
    # conditional parametrisations: the field latent is whitened at every theta, so the
    # posterior metric's hyperparameter scales are their approximate posterior widths
    posterior_hyper = {}
    if block is not None:
        names, cov = block
        posterior_hyper = {n: float(np.sqrt(cov[i, i])) for i, n in enumerate(names)}
    out = {}
    for name in model.hyper_names:
        if name in posterior_hyper:
            out[name] = posterior_hyper[name]
        else:  # the prior's scale of the (unconstrained) latent
            out[name] = 1.0 if kind == "identity" else model.hyper_latent_scale(name)
    return out


def _hyper_dense_factor(model, block) -> np.ndarray | None:
    """The posterior metric's dense block (``block``: :func:`_hyper_block`) as the lower
    Cholesky factor of the sampled scalars' correlation: the block's between the sampled
    P(k) parameters, the identity for the other scalars, in latent order; ``None`` with
    fewer than two sampled P(k) parameters or no block. The scales are
    :func:`_hyper_scales`' marginal widths, so the metric is the block's covariance: a
    diagonal one cannot follow log A and n, correlated -0.96 to -0.98 at 32³-64³."""
    if block is None or len(block[0]) < 2:
        return None
    names, cov = block
    scalars = [n for n in model.latent_names if n != "field"]
    idx = [scalars.index(n) for n in names]
    sd = np.sqrt(np.diag(cov))
    corr = np.eye(len(scalars))
    corr[np.ix_(idx, idx)] = cov / np.outer(sd, sd)
    return np.linalg.cholesky(corr)


def _scales(config: cfg.Config, model, data, block=None) -> list[np.ndarray]:
    """Per-part metric scales M^{-1/2} for the configured preconditioner (``block``:
    :func:`_hyper_block`'s, made here if not given)."""
    kind = config.sampler.preconditioner
    dtype = np.dtype(config.precision)
    if block is None:
        block = _hyper_block(config, model, data)
    hyper = _hyper_scales(config, model, block)
    scales = []
    for name in model.latent_names:
        if name != "field":
            scales.append(np.asarray(hyper[name], dtype))
        elif kind == "identity":
            scales.append(np.ones(model.grid.grid_shape, dtype))
        elif kind == "posterior":
            scales.append((1.0 / np.sqrt(model.posterior_precision_diag(data))).astype(dtype))
        else:  # prior, and the starting point of diagonal / dense_params adaptation
            scales.append((1.0 / np.sqrt(model.prior_precision_diag())).astype(dtype))
    return scales


def _metric(config: cfg.Config, model, data):
    """The configured metric for ``data``, as the CLI builds it: ``(scales, dense factor,
    block)`` -- :func:`_scales`, :func:`_hyper_dense_factor` and the sampled P(k)
    parameters' block they are made from (:func:`_hyper_block`; ``None`` if the metric
    has none)."""
    block = _hyper_block(config, model, data)
    return _scales(config, model, data, block), _hyper_dense_factor(model, block), block


def tracked_mode_indices(grid, num: int) -> np.ndarray:
    """``num`` half-spectrum modes spread over |k|: the first modes of evenly spaced bins.

    Modes off the self-paired planes are preferred (their real and imaginary parts are
    both free; on the planes some are identically zero). A bin with no such mode (the
    Nyquist corner alone in the last bin of an even grid) gives a self-conjugate mode:
    its imaginary part is exported as 0 and not diagnosed
    (:func:`fieldhmc.diagnostics.is_self_conjugate`).
    """
    if num <= 0:
        return np.zeros((0, 3), np.int64)
    kbins = grid.kbins()
    free = np.broadcast_to(grid.hermitian_weights() == 2, kbins.index.shape)
    picks = np.unique(np.linspace(0, kbins.num_bins - 1, num).round().astype(int))
    out = []
    for b in picks:
        in_bin = kbins.index == b
        idx = np.argwhere(in_bin & free) if (in_bin & free).any() else np.argwhere(in_bin)
        out.extend(idx[: max(1, math.ceil(num / len(picks)))].tolist())
    return np.asarray(out[:num], np.int64)


def mode_names(indices: np.ndarray) -> list[str]:
    return [f"mode[{i},{j},{k}]" for i, j, k in indices]


def _field_outputs(config: cfg.Config, model, target_fn=None):
    """The driver's field outputs. P(k) and the tracked modes are read from the field's
    Fourier modes made from the latents (``modes_from_latents``), not from an FFT of
    the field: a stored draw whose field is not kept costs no transform. When the
    modes are a fixed scale of the latent (``packed_modes_scale``), from its packed
    modes (:class:`~fieldhmc.models.PackedSpectrum`): no complex modes are made."""
    import tensorflow as tf

    from fieldhmc import models
    from fieldhmc.samplers import FieldOutputs

    grid = model.grid
    kbins = grid.kbins()
    idx = tracked_mode_indices(grid, config.outputs.tracked_modes)
    source = target_fn if hasattr(target_fn, "modes_from_latents") else model
    scale = source.packed_modes_scale() if hasattr(source, "packed_modes_scale") else None
    if scale is not None:
        packed = models.PackedSpectrum(grid, kbins, idx)
        field_index = list(model.latent_names).index("field")

        def packed_modes(*x_parts):
            return tf.cast(x_parts[field_index], scale.dtype) * scale

        return FieldOutputs(
            field_fn=source.field_from_latents,
            power_fn=packed.power,
            tracked_fn=packed.tracked if len(idx) else None,
            store_fields=config.outputs.store_fields,
            modes_fn=packed_modes,
            modes_of_field=packed.of_field,
        )

    def power_fn(modes):
        return models.power_of_modes(modes, grid, kbins).power

    def tracked_fn(modes):  # [chains, T] complex
        return tf.transpose(tf.gather_nd(tf.transpose(modes, [1, 2, 3, 0]), idx))

    return FieldOutputs(
        field_fn=source.field_from_latents,
        power_fn=power_fn,
        tracked_fn=tracked_fn if len(idx) else None,
        store_fields=config.outputs.store_fields,
        modes_fn=source.modes_from_latents,
    )


@dataclass
class Built:
    """What :func:`build` makes of a config: the model, the compiled sampler and what
    the later steps need of them.

    Attributes
    ----------
    model : FieldModel
    sampler : Sampler or ShardedSampler
        Compiled once; :func:`sample` runs it (any number of times, any seed).
    field_outputs : FieldOutputs
        The field statistics the sampler computes (P(k) and tracked-mode functions).
    kbins : KBins
        The P(k) bins.
    tracked : ndarray
        ``[T, 3]`` indices of the tracked modes.
    state_fn : callable
        Maps the model's initial latents (list of arrays) to the sampler's state.
    target : RepinnableTarget or None
        The target the sampler holds, if it can be re-pinned to new data
        (:meth:`repin`).
    """

    model: object
    sampler: object
    field_outputs: object
    kbins: object
    tracked: np.ndarray
    state_fn: object = None
    target: object = None
    metric_fn: object = None

    def repin(self, data: np.ndarray) -> None:
        """Point the compiled sampler at new data (no retrace): ``build(...,
        repinnable=True)`` only. A data-dependent metric (the posterior metric's block of
        the sampled P(k) parameters) is re-made for the new data."""
        if self.target is None:
            raise ValueError("this sampler's target is pinned to its data; build it repinnable")
        self.target.pin(data)
        if self.metric_fn is not None:
            self.sampler.set_metric(*self.metric_fn(data))


def build(
    config: cfg.Config,
    data: np.ndarray,
    *,
    model=None,
    mesh=None,
    num_results: int | None = None,
    repinnable: bool = False,
) -> Built:
    """The model, preconditioner and compiled sampler a config describes, for ``data``.

    Parameters
    ----------
    config : Config
    data : ndarray
        The observed data: the target is pinned to it and the ``posterior``
        preconditioner's scales read it.
    model : FieldModel, optional
        :func:`build_model`'s (built here if not given).
    mesh : optional
        The DTensor mesh of a ``distribution`` config (:func:`make_mesh`): the sampler is
        then the sharded one, its state the white-noise latent of
        :class:`~fieldhmc.models.sharded.ShardedGaussianTarget`.
    num_results : int, optional
        Replaces ``sampler.num_results`` (resume extends a run).
    repinnable : bool
        Build the target re-pinnable (:meth:`Built.repin`): one compiled sampler then
        serves every data set of a sweep (``data`` only sets the preconditioner's
        scales, which do not depend on the data values).
    """
    from fieldhmc.samplers import Sampler

    model = build_model(config) if model is None else model
    settings = _settings(config, num_results)
    kbins = model.grid.kbins()
    tracked = tracked_mode_indices(model.grid, config.outputs.tracked_modes)
    if mesh is not None:
        from fieldhmc.models.sharded import ShardedGaussianTarget
        from fieldhmc.samplers.sharded import ShardedFieldOutputs, ShardedSampler

        outputs = ShardedFieldOutputs(model.grid, kbins, tracked, config.outputs.store_fields)
        sharded = ShardedGaussianTarget(
            model,
            data,
            mesh,
            preconditioner=config.sampler.preconditioner or "identity",
            # the fiducial Fisher widths: the Laplace fit evaluates the unsharded model
            hyper_scales=_hyper_scales(config, model, _hyper_block(config, model, None)),
        )
        return Built(
            model,
            ShardedSampler(sharded, settings, outputs),
            _field_outputs(config, model),
            kbins,
            tracked,
            # the sharded latent: an orthogonal map of the model's field, the
            # hyperparameters whitened by their metric scales
            state_fn=sharded.state_from_model,
        )
    target = model.repinnable_target_log_prob_fn(data) if repinnable else None
    target_fn = target if repinnable else model.target_log_prob_fn(data)
    # the target maps latents to fields given its (re-pinnable) data: the 'conditional'
    # parametrisation's latent is measured from a data-dependent mean
    field_outputs = _field_outputs(config, model, target_fn)

    scales, factor, block = _metric(config, model, data)
    sampler = Sampler(
        target_fn,
        settings,
        model.latent_names,
        scales,
        field_outputs,
        dense_factor=factor,
        metric_groups=_metric_groups(config, model, settings),
    )
    # the posterior metric depends on the data (not only through the conditional block:
    # its field part too, for a non-conditional parametrisation); a windowed metric's
    # start only through the block
    metric_fn = None
    if config.sampler.preconditioner == "posterior" or block is not None:

        def metric_fn(data):  # (scales, dense factor)
            return _metric(config, model, data)[:2]

    return Built(model, sampler, field_outputs, kbins, tracked, target=target, metric_fn=metric_fn)


def initial_state(config: cfg.Config, built: Built, data: np.ndarray):
    """The sampler's initial state (``sampler.init``, seed ``sampler.seed + 1``) as an
    iterator over its parts: once the sampler has loaded it, nothing holds it."""
    from fieldhmc.samplers import stateless_seed

    init = [
        np.asarray(t)
        for t in built.model.init_latents(
            config.sampler.init,
            config.sampler.num_chains,
            seed=stateless_seed(config.sampler.seed + 1),
            data=data,
            jitter=config.sampler.init_jitter,
        )
    ]
    if config.sampler.field_warmup > 0 and built.state_fn is None:
        init, _ = field_warmup(config, built.model, data, init, built.sampler.initial_scales)
    if built.state_fn is not None:
        init = built.state_fn(init)
    return iter(init)  # an exhausted list iterator drops its list


def field_warmup(config: cfg.Config, model, data, init: list[np.ndarray], scales):
    """``sampler.field_warmup``: the configured kind on the field alone, for that many
    warm-up transitions with its own tuning, every sampled scalar held at its value in
    ``init`` (per chain), the field's part of the metric ``scales`` (the run's sampler's
    ``initial_scales``, per latent: not made again, which under a conditional
    parametrisation repeats the Laplace fit of the sampled parameters). Returns
    ``(init with the field it ends at, gradient evaluations spent)``. As the field-level
    benchmark's first warm-up: the field moves toward the data before the parameters
    are free to make up for a poor one."""
    import dataclasses
    import tempfile

    import tensorflow as tf

    from fieldhmc.samplers import MemorySink, Sampler

    names = model.latent_names
    j = names.index("field")
    held = [tf.constant(v) for v in init]
    target = model.target_log_prob_fn(data)

    def field_target(field):
        return target(*[field if i == j else held[i] for i in range(len(names))])

    settings = dataclasses.replace(
        _settings(config),
        num_burnin_steps=config.sampler.field_warmup,
        num_results=1,
        thin=1,
        adapt_dense_params=False,
        seed=config.sampler.seed + 2,  # the run's draws take seed, its initial state + 1
    )
    groups = _metric_groups(config, model, settings)
    sampler = Sampler(
        field_target,
        settings,
        ("field",),
        [scales[j]],
        metric_groups=None if groups is None else [groups[j]],
    )
    before = float(np.mean(target(*held)))
    with tempfile.TemporaryDirectory() as d:
        result = sampler.run(MemorySink(), Path(d), iter([init[j]]), progress=False)
    field = np.asarray(result.latent_state[0])
    out = [field if i == j else v for i, v in enumerate(init)]
    after = float(np.mean(target(*[tf.constant(v) for v in out])))
    _log.info(
        "field warm-up: %d transitions with the sampled parameters held, %d gradients; "
        "mean log density %.1f -> %.1f",
        config.sampler.field_warmup,
        result.gradient_evaluations,
        before,
        after,
    )
    return out, int(result.gradient_evaluations)


def sample(
    run: io.RunDirectory,
    config: cfg.Config,
    built: Built,
    init=None,
    *,
    resume: bool = False,
    progress: bool | None = True,
):
    """Run ``built.sampler`` into ``run`` (traces, fields, field moments, checkpoint);
    returns its :class:`~fieldhmc.samplers.RunResult`.

    ``init`` is :func:`initial_state`'s (required unless ``resume``). ``config`` may
    differ from the one ``built`` was made of in its seeds only.
    """
    from fieldhmc.samplers import H5TraceSink

    sink = H5TraceSink(run.traces, run.fields if config.outputs.store_fields else None)
    result = built.sampler.run(
        sink,
        run.checkpoint,
        init,
        resume=resume,
        progress=_chatty() if progress is None else progress,
        tensorboard_dir=run.root / "tensorboard" if config.outputs.tensorboard else None,
        seed=config.sampler.seed,
    )
    if result.field_mean is not None:
        if not config.outputs.store_fields:
            sink = H5TraceSink(run.traces, run.fields)
        sink.write_field_moments(result.field_mean, result.field_var)
    return result


def export(run: io.RunDirectory, config: cfg.Config, built: Built, result) -> None:
    """samples.nc (ArviZ) and power.nc from the streamed traces and ``result``."""
    from fieldhmc import diagnostics, models
    from fieldhmc.samplers import read_traces

    model, kbins, idx = built.model, built.kbins, built.tracked
    traces = read_traces(run.traces)
    # the sampled scalars' physical values (their latents are unconstrained)
    posterior = model.physical_parameters(traces)
    for n, name in enumerate(mode_names(idx)):
        posterior[f"{name}.real"] = traces["tracked_real"][..., n]
        imag = traces["tracked_imag"][..., n]
        if diagnostics.is_self_conjugate(idx[n], model.grid.grid_shape):
            imag = np.zeros_like(imag)  # zero by symmetry; a float32 FFT leaves ~1e-6
        posterior[f"{name}.imag"] = imag
    stats = {name: traces[name] for name in config.sampler.sampler_kind.stat_names}
    attrs = {f"{k}_version": v for k, v in _versions().items()}
    attrs["sampler"] = config.sampler.kind
    attrs["gradient_evaluations"] = str(result.gradient_evaluations)
    tuning_extra = {}
    # the scalar parameters' dense block: dense_params' last window, or the posterior
    # metric's fixed block (conditional parametrisations: _hyper_block)
    if result.dense_factor is not None:
        block = [i for i, sc in enumerate(result.scales) if np.ndim(sc) == 0]
        factor = np.asarray(result.dense_factor)
        tuning_extra["dense_params"] = {
            "names": [model.latent_names[i] for i in block],
            "scales": [float(result.scales[i]) for i in block],
            "correlation": (factor @ factor.T).round(6).tolist(),
        }
    attrs["tuning"] = json.dumps(
        {
            **tuning_extra,
            "tuned": result.tuned,
            "warmup_gradient_evaluations": result.warmup_gradient_evaluations,
            # warm-up transitions: num_burnin_steps, or where mams' tuner converged
            "num_warmup_steps": result.num_warmup_steps,
            # fields.h5 mean / var average every k-th post-warm-up transition (mclmc: k > 1)
            "field_moments": {
                "every": result.field_moments_every,
                "draws_all_chains": result.field_moments_draws,
            },
        }
    )
    io.write_inference_data(run.samples, posterior, stats, attrs)
    refs = {"input": model.power.numpy(kbins.k)}
    truth = run.load_data("truth")
    if truth is not None:
        refs["truth"] = models.measure_power_np(truth, model.grid, kbins).power
    data = run.load_data("data")
    if data is not None and model.is_gaussian_likelihood:
        refs["data"] = models.measure_power_np(np.nan_to_num(data), model.grid, kbins).power
    if result.field_mean is not None:
        refs["posterior_mean"] = models.measure_power_np(result.field_mean, model.grid, kbins).power
    io.write_power(run.power, kbins.k, traces["power"], kbins.num_modes, refs)


def make_mesh(config: cfg.Config):
    """The DTensor mesh of a ``distribution`` config (None without); before any TF op."""
    if config.distribution is None:
        return None
    from fieldhmc.ops.sharded import make_mesh as make

    return make(config.distribution.mesh[0], config.distribution.devices)


def _sample_and_export(
    rundir: io.RunDirectory,
    config: cfg.Config,
    model,
    *,
    resume: bool,
    progress: bool,
    mesh=None,
    num_results: int | None = None,
) -> None:
    """build -> sample -> export, the data read back from ``rundir`` and dropped (with
    the sampler) as soon as they are not needed: neither stays alive as a copy through
    the sampling, nor the carried state and compiled chunk through the export."""
    data = rundir.load_data("data")
    if data is None:
        raise FileNotFoundError(f"{rundir.data('data')} is missing")
    built = build(config, data, model=model, mesh=mesh, num_results=num_results)
    init = None if resume else initial_state(config, built, data)
    del data
    result = sample(rundir, config, built, init, resume=resume, progress=progress)
    built.sampler = None
    gc.collect()
    export(rundir, config, built, result)


def run(
    config: cfg.Config,
    out_dir: Path,
    overwrite: bool = False,
    progress: bool = True,
    plots: bool = True,
) -> io.RunDirectory:
    """Simulate or load data, sample, write the run directory, diagnose and (if
    ``plots``) plot.

    The run directory's lock (:func:`fieldhmc.io.lock_run_directory`) is held from
    before anything in ``out_dir`` is deleted or written until the plots are written:
    another process on the same directory gets :class:`fieldhmc.io.RunDirectoryLocked`.
    """
    mesh = make_mesh(config)
    model = build_model(config)
    d = obtain_data(config, model)
    with io.lock_run_directory(out_dir, create=True):
        rundir = io.prepare_run_directory(out_dir, overwrite)
        write_inputs(rundir, config, model, d)
        # Truth, its latents and the data are on disk now: the sampling reads the data
        # back and the diagnostics the rest.
        del d
        _sample_and_export(rundir, config, model, resume=False, progress=progress, mesh=mesh)
        # diagnose and plot read everything back from the run directory: the model's
        # constants are not needed there (its compiled functions form reference cycles,
        # hence the collection).
        del model
        gc.collect()
        diagnose(rundir.root)
        if plots:
            plot(rundir.root)
    return rundir


def resume(run_dir: Path, num_results: int | None = None, progress: bool = True) -> io.RunDirectory:
    """Continue a killed run from its checkpoint, or extend a finished one.

    Holds the run directory's lock throughout (a run still going is refused with
    :class:`fieldhmc.io.RunDirectoryLocked`); a missing or unreadable checkpoint is a
    :class:`fieldhmc.io.RunDirectoryError` saying how to restart.
    """
    with io.lock_run_directory(run_dir):
        io.check_resumable(run_dir)
        return _resume(io.RunDirectory(run_dir), num_results, progress)


def _resume(rundir: io.RunDirectory, num_results: int | None, progress: bool) -> io.RunDirectory:
    config = _read_config(rundir)
    mesh = make_mesh(config)
    if num_results is not None and num_results < config.sampler.num_results:
        raise ValueError(
            f"--num-results {num_results} is fewer than the run's "
            f"{config.sampler.num_results}; resume can only extend a run"
        )
    model = build_model(
        config, mask=rundir.load_data("mask"), sigma_map=rundir.load_data("sigma_map")
    )
    if not rundir.data("data").exists():
        raise FileNotFoundError(f"{rundir.data('data')} is missing")
    if num_results is not None:
        raw = config.to_dict()
        raw["sampler"]["num_results"] = num_results
        config = cfg.config_from_dict(raw, rundir.root)
        _write_config(rundir, config)
    _sample_and_export(rundir, config, model, resume=True, progress=progress, mesh=mesh)
    diagnose(rundir.root)
    plot(rundir.root)
    return rundir


# --- diagnostics and plots -----------------------------------------------------------------
def _load_run(run_dir: Path, field_names: tuple[str, ...] | None = None):
    import xarray as xr

    rundir = io.RunDirectory(run_dir)
    config = _read_config(rundir)
    for path in (rundir.samples, rundir.power):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: the run has not finished sampling")
    posterior, stats, _ = io.read_inference_data(rundir.samples)
    with xr.open_dataset(rundir.power, engine="h5netcdf") as ds:
        power = {k: ds[k].values for k in ds.data_vars}
        power["k"] = ds["k"].values
    fields = {}
    if _fields_file_problem(rundir) is None:
        from fieldhmc.samplers import read_fields

        fields = read_fields(rundir.fields, field_names)
    return rundir, config, posterior, stats, power, fields


def _fields_file_problem(rundir: io.RunDirectory) -> str | None:
    """Why ``fields.h5`` cannot be used (missing, unreadable), or None."""
    if not rundir.fields.exists():
        return f"{rundir.fields.name} is missing"
    import h5py

    try:
        with h5py.File(rundir.fields, "r"):
            pass
    except OSError as exc:
        return f"{rundir.fields.name} cannot be read ({exc})"
    return None


def _missing_outputs(rundir: io.RunDirectory, config: cfg.Config) -> list[str]:
    """One sentence per run output that ``diagnose`` or ``plot`` needs and cannot use.

    Each becomes a warning (``summary["missing_outputs"]``): a run directory that lost a
    file is diagnosed with what is left, never silently as if it were whole."""
    out = []
    problem = _fields_file_problem(rundir)
    if problem is not None:
        out.append(
            f"{problem}: the field convergence per k-bin, the coverage of the truth, r(k) "
            "and the field plots could not be recomputed (restore the file, or re-run)"
        )
    elif config.outputs.store_fields and not _has_field_draws(rundir):
        out.append(
            f"{rundir.fields.name} holds no field draws although outputs.store_fields is "
            "true: the field convergence per k-bin and the coverage could not be recomputed"
        )
    for name, needed in (
        ("data", "the data panel of the field plots"),
        ("truth", "the coverage of the truth and r(k)"),
    ):
        expected = name == "data" or config.data.source == "simulate"
        if expected and not rundir.data(name).exists():
            out.append(
                f"data/{name}.npy is missing: {needed} could not be recomputed "
                "(restore the file, or re-run)"
            )
    return out


def _has_field_draws(rundir: io.RunDirectory) -> bool:
    import h5py

    with h5py.File(rundir.fields, "r") as f:
        return "draws" in f


def _sampler_tuning(rundir: io.RunDirectory) -> dict | None:
    """Tuned step size (and L) and warm-up gradients stored with the draws, if any."""
    raw = io.read_inference_data(rundir.samples)[2].get("tuning")
    return None if raw is None else json.loads(raw)


def diagnose(run_dir: Path) -> dict:
    """Recompute ``summary.json`` and ``report.txt``; print the report.

    A missing or unreadable output (``fields.h5``, ``data/truth.npy``...) is a warning,
    and what the replaced ``summary.json`` said about the sections that cannot be
    recomputed without it is kept, marked (:func:`fieldhmc.diagnostics.carry_over`):
    the verdict never turns healthier because a file is gone. Holds the run directory's
    lock (:func:`fieldhmc.io.lock_run_directory`) throughout.
    """
    with io.lock_run_directory(run_dir), contextlib.ExitStack() as stack:
        rundir, config, posterior, stats, power, fields = _load_run(run_dir, ("mean",))
        draws = _open_field_draws(rundir, stack)
        return _diagnose(rundir, config, posterior, stats, power, fields, draws)


def _open_field_draws(rundir: io.RunDirectory, stack: contextlib.ExitStack):
    """The stored field draws as a lazy ``[chain, draw, ...]`` view, or None.

    The draws are never loaded whole: the diagnostics read them in slabs (at 256³,
    4 chains x 20 draws are 5.4 GB; all of them in memory, plus their modes, would not
    fit a workstation).
    """
    if _fields_file_problem(rundir) is not None:
        return None
    import h5py

    from fieldhmc.samplers.storage import ChainDrawView

    f = stack.enter_context(h5py.File(rundir.fields, "r"))
    if "draws" not in f or f["draws"].shape[0] < 4:
        return None
    return ChainDrawView(f["draws"])


def _diagnose(rundir, config, posterior, stats, power, fields, draws) -> dict:
    from fieldhmc import diagnostics, models

    truth = rundir.load_data("truth")
    kbins = models.Grid(config.grid.shape, config.grid.box_size).kbins()
    field_summary = None
    if draws is not None:
        field_summary = diagnostics.field_convergence(draws, kbins.index, kbins.num_bins, k=kbins.k)
    truth_summary = None
    if "truth" in power:
        cov = None
        if truth is not None and draws is not None:
            cov = diagnostics.coverage(draws, truth)
        cross = None
        if truth is not None and "mean" in fields:
            cross = diagnostics.cross_power(
                fields["mean"],
                kbins.index,
                kbins.num_bins,
                field_b=truth,
                box_size=config.grid.box_size,
            )
        truth_summary = diagnostics.truth_comparison(
            power["k"],
            power["truth"],
            power_draws=power["power"],
            power_mean=power.get("posterior_mean"),
            power_cross=cross,
            coverage_result=cov,
            num_modes=power.get("nmodes"),
        )
    sampler = config.sampler
    tuning = _sampler_tuning(rundir)
    summary = diagnostics.build_summary(
        posterior=posterior,
        sample_stats=stats,
        # a kind's own options (None where they do not apply)
        target_accept_prob=getattr(sampler, "target_accept_prob", None),
        max_tree_depth=getattr(sampler, "max_tree_depth", None),
        dimension=(tuning or {}).get("tuned", {}).get("dimension"),
        desired_energy_var=getattr(sampler, "desired_energy_var", None),
        field=field_summary,
        truth=truth_summary,
        scalars_method="numpy",
        metadata={
            "run_dir": str(rundir.root),
            "diagnosed_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "sampler": sampler.kind,
            "preconditioner": sampler.preconditioner,
            "likelihood": config.model.likelihood.kind,
            "grid_shape": list(config.grid.shape),
            **sampler.sampler_kind.summary_metadata(sampler),
            "tuning": tuning,
            **_distribution_note(config),
        },
        grid_shape=config.grid.shape,
        missing_outputs=_missing_outputs(rundir, config),
        preconditioner=config.sampler.preconditioner,
        is_masked=config.model.likelihood.mask is not None,
        conditional=config.model.parametrisation in ("conditional", "conditional_scale"),
        windowed_metric=not sampler.sampler_kind.tunes_own_metric,
    )
    summary = diagnostics.carry_over(summary, _read_summary(rundir))
    io.write_json(rundir.summary, summary)
    report = diagnostics.format_report(summary)
    io.write_text(rundir.report, report + "\n")
    if _chatty():
        print(report)
    return summary


def _read_summary(rundir: io.RunDirectory) -> dict | None:
    """The run's ``summary.json`` (None if absent or unreadable); ``diagnose`` reads the
    one it is about to replace."""
    try:
        return json.loads(rundir.summary.read_text())
    except (OSError, ValueError):
        return None


def _distribution_note(config: cfg.Config) -> dict:
    """What a sharded run's summary says about its state (nothing for other runs)."""
    dist = config.distribution
    if dist is None:
        return {}
    latent = "real-space white noise xi, delta = irfft(sqrt(P(k)) rfft(xi))"
    if config.model.parametrisation != "noncentred":
        latent = "real-space xi, delta = irfft(mu + sqrt(w) rfft(xi)) (conditional)"
    if config.model.samples_power:
        latent += ", the sampled hyperparameters replicated on every device"
    return {
        "distribution": {
            "mesh": list(dist.mesh),
            "devices": dist.devices,
            "layout": "x-slabs: each device holds n0/P planes of x, momentum and gradient",
            "latent": f"{latent} (fieldhmc.models.sharded); the traced modes and field draws "
            "are of delta",
            "field_statistics": "per draw on the mesh with the sharded rfft3d (power, "
            "tracked modes, running mean/variance); stored draws gathered to the host",
            "checkpoint": "state, gradient and field moments gathered to host NumPy "
            "at every checkpoint, re-sharded on resume",
            "sampler": config.sampler.sampler_kind.mesh_description(config.sampler),
        }
    }


#: The PNGs ``plot`` writes; any of them it did not write this time is stale.
PLOT_NAMES = (
    "traces",
    "autocorrelation",
    "corner",
    "power_spectrum",
    "field_slices",
    "kbin_convergence",
)


def plot(run_dir: Path) -> list[Path]:
    """Write the standard set of PNGs to ``run_dir/plots``.

    A plot of :data:`PLOT_NAMES` that cannot be drawn this time (its input is missing,
    see :func:`diagnose`) but exists from an earlier call is stale: it is moved to
    ``plots/stale/``, listed with the reason in ``plots/stale/README.txt`` and logged,
    so that ``plots/`` holds only what the run directory supports now. Holds the run
    directory's lock (:func:`fieldhmc.io.lock_run_directory`) throughout.
    """
    with io.lock_run_directory(run_dir):
        return _plot(run_dir)


def _plot(run_dir: Path) -> list[Path]:
    from fieldhmc import plotting

    rundir, config, posterior, stats, power, fields = _load_run(run_dir, ("mean", "var"))
    rundir.plots.mkdir(exist_ok=True)
    written = []
    not_drawn: dict[str, str] = {}

    def save(fig_or_ax, name):
        fig = getattr(fig_or_ax, "figure", fig_or_ax)
        path = rundir.plots / f"{name}.png"
        io.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
        written.append(path)

    hyper = [n for n in config.model.sampled_parameter_names if n in posterior]
    modes = [n for n in posterior if n.startswith("mode[")][:6]
    trace_vars = {**{n: posterior[n] for n in hyper + modes}, "lp": stats["lp"]}
    save(plotting.plot_traces(trace_vars, diverging=stats.get("diverging")), "traces")
    save(plotting.plot_autocorrelation(trace_vars), "autocorrelation")
    if len(hyper) >= 2:
        save(plotting.plot_corner({n: posterior[n] for n in hyper}), "corner")
    truth = rundir.load_data("truth")
    save(
        plotting.plot_power_summary(
            power["k"],
            power["power"],
            power_truth=power.get("truth"),
            power_data=power.get("data"),
            power_input=power.get("input"),
            power_mean=power.get("posterior_mean"),
            num_modes=power.get("nmodes"),
        ),
        "power_spectrum",
    )
    problem = _fields_file_problem(rundir)
    if "mean" in fields:
        save(
            plotting.plot_field_slices(
                fields["mean"],
                np.sqrt(fields["var"]),
                truth=truth,
                data=rundir.load_data("data"),
                mask=rundir.load_data("mask"),
                box_size=config.grid.box_size,
            ),
            "field_slices",
        )
    else:
        not_drawn["field_slices"] = problem or f"{rundir.fields.name} has no posterior mean"
    summary = _read_summary(rundir) or {}
    carried = (summary.get("carried_over") or {}).get("keys") or {}
    if summary.get("field") and "field" not in carried:
        save(plotting.plot_kbin_convergence(summary["field"]), "kbin_convergence")
    elif "field" in carried:
        not_drawn["kbin_convergence"] = (
            "summary.json could not recompute the field convergence ("
            + "; ".join(summary["carried_over"]["reason"])
            + ")"
        )
    else:
        not_drawn["kbin_convergence"] = "summary.json has no field convergence"
    _set_aside_stale_plots(rundir, written, not_drawn)
    return written


def _set_aside_stale_plots(
    rundir: io.RunDirectory, written: list[Path], reasons: dict[str, str]
) -> list[Path]:
    """Move the standard plots this ``plot`` did not write to ``plots/stale/``, with a
    README saying why (an older one there is replaced); returns their new paths."""
    stale = [
        path
        for name in PLOT_NAMES
        if (path := rundir.plots / f"{name}.png").exists() and path not in written
    ]
    if not stale:
        return []
    folder = rundir.plots / "stale"
    folder.mkdir(exist_ok=True)
    moved, lines = [], []
    for path in stale:
        target = folder / path.name
        path.replace(target)
        moved.append(target)
        reason = reasons.get(path.stem, "not drawn by the last `fieldhmc plot`")
        lines.append(f"{path.name}: not redrawn: {reason}")
        _log.warning("plots/%s is stale (%s); moved to plots/stale/", path.name, reason)
    header = (
        f"Plots from an earlier `fieldhmc plot` that the run directory no longer supports "
        f"(moved here on {datetime.now(UTC).isoformat(timespec='seconds')}):"
    )
    io.write_text(folder / "README.txt", "\n".join([header, *lines]) + "\n")
    return moved
