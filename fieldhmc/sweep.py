"""Many runs of one config: simulation-based calibration and seed/override sweeps.

:func:`run_sbc` and :func:`run_sweep` lay out a directory of ordinary fieldhmc run
directories, hand one job per run to :func:`fieldhmc.distributed.run_jobs` and gather
the results. A job writes its marker file (``sbc.json`` / ``sweep.json``) last, so a
directory with its marker is finished and skipped by a later call, and one without
is redone from scratch (a killed worker's realisation included).

SBC layout (``DIR``)::

    sbc_spec.json                 the config(s) the sweep was started with
    realisations/r0000/ ...       one run directory per realisation (+ sbc.json)
    sbc.nc                        ranks [realisation, quantity], truth, posterior
                                  mean/sd, per-quantity p-values (xarray / netCDF4)
    sbc_report.txt                p-values per quantity, failures
    plots/sbc_ranks_*.png, plots/sbc_ecdf_*.png

Realisation ``i`` simulates with ``data.seed + i`` (hyperparameters, where the config
samples them, and the field drawn from the prior) and samples with
``sampler.seed + 2 i`` (its initial state uses ``sampler.seed + 2 i + 1``). The
posterior draws ranked are the stored field draws -- every ``outputs.field_thin``-th
draw of every chain -- and the traces at the same steps: the hyperparameters, the
binned power spectrum per k-bin, the real and imaginary parts of the tracked modes and
the log likelihood (Talts et al. 2018, arXiv:1804.06788; Modrák et al. 2023,
arXiv:2211.02383).

Inside a worker, realisations of one config share one compiled sampler: the data
enter through :class:`fieldhmc.models.RepinnableTarget`, the seed as a tensor.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fieldhmc import config as cfg
from fieldhmc import io

__all__ = [
    "SbcJob",
    "SweepJob",
    "SweepPoint",
    "check_sbc_config",
    "gather_sbc",
    "run_sbc",
    "run_sweep",
    "sbc_realisation",
    "sweep_points",
    "sweep_run",
]

_log = logging.getLogger(__name__)

SBC_MARKER = "sbc.json"
SWEEP_MARKER = "sweep.json"
ATTEMPTS = "attempts.jsonl"


# --- one SBC realisation (runs on a worker) ---------------------------------------------
@dataclass(frozen=True)
class SbcJob:
    """One realisation: the fit config and the simulation config, as plain dicts."""

    index: int
    config: dict
    simulate_config: dict
    out_dir: str


_local = threading.local()


def _cache_key(raw: Mapping[str, Any]) -> str:
    raw = json.loads(json.dumps(raw))
    raw["data"].pop("seed", None)
    raw["sampler"].pop("seed", None)
    raw["outputs"].pop("directory", None)
    return json.dumps(raw, sort_keys=True)


def _compiled(config: cfg.Config, data: np.ndarray):
    """This worker thread's :class:`~fieldhmc.workflow.Built` for ``config`` (compiled
    once for the configs that differ only in their seeds), re-pinned to ``data``.

    A Dask worker calls the job function once per job: the thread keeps the last
    compiled sampler for the next job of the same config (a sampler's carried state
    cannot serve two threads at once, hence per thread)."""
    from fieldhmc import workflow

    key = _cache_key(config.to_dict())
    cached = getattr(_local, "sbc", None)
    if cached is None or cached[0] != key:
        _local.sbc = cached = (key, workflow.build(config, data, repinnable=True))
    built = cached[1]
    built.repin(data)
    return built


def _record_attempt(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"pid": os.getpid(), "time": time.time()})
    with open(out / ATTEMPTS, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _read_marker(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def sbc_realisation(job: SbcJob) -> dict:
    """Simulate, sample and rank one realisation; write its run directory.

    Returns (and writes as ``sbc.json``, last) ``realisation``, ``num_draws`` (L),
    ``quantities``, ``k`` (per quantity, NaN but for power bins), ``ranks``, ``truth``,
    ``posterior_mean``, ``posterior_sd``, the seeds, ``gradient_evaluations`` and
    ``seconds``. A finished directory is returned as it is.
    """
    out = Path(job.out_dir)
    done = _read_marker(out / SBC_MARKER)
    if done is not None:
        return done
    _record_attempt(out)
    t0 = time.perf_counter()
    from fieldhmc import sbc, workflow
    from fieldhmc.samplers import read_fields, read_traces

    config = cfg.config_from_dict(job.config, out)
    sim_config = cfg.config_from_dict(job.simulate_config, out)
    d = workflow.obtain_data(sim_config, workflow.build_model(sim_config))
    built = _compiled(config, d.data)
    model = built.model
    run = io.prepare_run_directory(out, overwrite=True)
    workflow.write_inputs(run, config, model, d)
    init = workflow.initial_state(config, built, d.data)
    result = workflow.sample(run, config, built, init, progress=False)
    workflow.export(run, config, built, result)

    traces = read_traces(run.traces)
    fields = read_fields(run.fields, ("draws",))["draws"]  # [F, chains, n0, n1, n2]
    step = config.outputs.field_thin // config.sampler.thin
    tidx = np.arange(fields.shape[0]) * step
    num_draws = fields.shape[0] * fields.shape[1]

    def pooled(values: np.ndarray) -> np.ndarray:  # [F, chains, ...] -> [L, ...]
        return values.reshape(num_draws, *values.shape[2:]).astype(np.float64)

    field_outputs, kbins, idx = built.field_outputs, built.kbins, built.tracked
    import tensorflow as tf

    truth_delta = tf.constant(d.truth[None], model.dtype)
    names: list[str] = []
    k_of: list[float] = []
    draws: list[np.ndarray] = []
    truths: list[np.ndarray] = []
    # every sampled scalar (P(k) hyperparameters, forward parameters), physical values
    hyper_draws = model.physical_parameters({n: pooled(traces[n][tidx]) for n in model.hyper_names})
    hyper_truth = model.physical_parameters(d.truth_latents)
    for name in model.hyper_names:
        names.append(name)
        k_of.append(np.nan)
        draws.append(hyper_draws[name][:, None])
        truths.append(np.atleast_1d(np.asarray(hyper_truth[name], np.float64)))
    loglik_fn = model.log_likelihood_fn(d.data)
    flat_fields = fields.reshape(num_draws, *fields.shape[2:])
    loglik = loglik_fn(
        tf.constant(flat_fields, model.dtype),
        **{n: tf.constant(v, model.dtype) for n, v in hyper_draws.items()},
    ).numpy()
    loglik_truth = loglik_fn(
        truth_delta,
        **{n: tf.constant([hyper_truth[n]], model.dtype) for n in model.hyper_names},
    ).numpy()
    names.append("log_likelihood")
    k_of.append(np.nan)
    draws.append(loglik[:, None].astype(np.float64))
    truths.append(loglik_truth.astype(np.float64))
    power = pooled(traces["power"][tidx])
    names += [f"power[{b}]" for b in range(power.shape[-1])]
    k_of += [float(k) for k in kbins.k]
    draws.append(power)
    spectral_truth = field_outputs.spectral_of_field(truth_delta)
    truths.append(np.asarray(field_outputs.power_fn(spectral_truth), np.float64)[0])
    if field_outputs.tracked_fn is not None:
        modes_truth = np.asarray(field_outputs.tracked_fn(spectral_truth))[0]
        # Self-paired modes (Hermitian weight 1) are real: their imaginary part is 0.
        weights = np.broadcast_to(model.grid.hermitian_weights(), kbins.index.shape)
        has_imag = weights[tuple(idx.T)] == 2
        for part, values, keep in (
            ("real", modes_truth.real, np.ones(len(idx), bool)),
            ("imag", modes_truth.imag, has_imag),
        ):
            mode_names = workflow.mode_names(idx)
            names += [f"{m}.{part}" for m, kept in zip(mode_names, keep, strict=True) if kept]
            k_of += [np.nan] * int(keep.sum())
            draws.append(pooled(traces[f"tracked_{part}"][tidx])[:, keep])
            truths.append(values[keep].astype(np.float64))
    draws_all = np.concatenate(draws, axis=1)  # [L, Q]
    truth_all = np.concatenate(truths)
    record = {
        "realisation": job.index,
        "num_draws": int(num_draws),
        "quantities": names,
        "k": [None if np.isnan(k) else k for k in k_of],
        "ranks": sbc.ranks(draws_all, truth_all).tolist(),
        "truth": truth_all.tolist(),
        "posterior_mean": draws_all.mean(axis=0).tolist(),
        "posterior_sd": draws_all.std(axis=0, ddof=1).tolist(),
        "data_seed": sim_config.data.seed,
        "sampler_seed": config.sampler.seed,
        "gradient_evaluations": int(result.gradient_evaluations),
        "seconds": time.perf_counter() - t0,
        "pid": os.getpid(),
    }
    io.write_json(out / SBC_MARKER, record)
    return record


# --- the SBC sweep (runs on the client) ----------------------------------------------------
def _realisation_raw(raw: dict, index: int, *, sampler_seed: bool) -> dict:
    raw = json.loads(json.dumps(raw))
    raw["data"]["seed"] = raw["data"]["seed"] + index
    if sampler_seed:
        raw["sampler"]["seed"] = raw["sampler"]["seed"] + 2 * index
    return raw


def check_sbc_config(config: cfg.Config, simulate_config: cfg.Config | None = None) -> None:
    """Raise ``ValueError`` (one line) if ``config`` cannot be calibrated by SBC."""
    if config.data.source != "simulate":
        raise ValueError(f"data.source: sbc simulates its data (got {config.data.source})")
    if not config.outputs.store_fields:
        raise ValueError("outputs.store_fields: sbc ranks the stored field draws; set it true")
    if config.outputs.field_thin % config.sampler.thin:
        raise ValueError(
            f"outputs.field_thin ({config.outputs.field_thin}) must be a multiple of "
            f"sampler.thin ({config.sampler.thin}) for sbc"
        )
    if simulate_config is not None and tuple(simulate_config.grid.shape) != tuple(
        config.grid.shape
    ):
        raise ValueError("grid.shape: --simulate-set must not change the grid")


def _spec_guard(path: Path, spec: dict, what: str) -> None:
    """Write ``spec`` to ``path``, or check that an earlier sweep there used the same."""
    old = _read_marker(path)
    if old is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        io.write_json(path, spec)
    elif old != json.loads(json.dumps(spec)):
        raise ValueError(
            f"{path.parent} holds {what} started with a different config; "
            "use a new --out (or the same config and overrides to resume it)"
        )


def _strip_outputs(raw: dict) -> dict:
    raw = json.loads(json.dumps(raw))
    raw["outputs"].pop("directory", None)
    return raw


@dataclass
class SbcResult:
    """What :func:`run_sbc` produced."""

    out_dir: Path
    dataset: Any  # xarray.Dataset, or None if no realisation finished
    failures: list = field(default_factory=list)
    skipped: list = field(default_factory=list)


def run_sbc(
    config: cfg.Config,
    out_dir: str | os.PathLike,
    num_realisations: int,
    client: Any,
    *,
    simulate_config: cfg.Config | None = None,
    progress: bool = True,
    plots: bool = True,
) -> SbcResult:
    """Simulation-based calibration of ``config`` over ``num_realisations``.

    Parameters
    ----------
    config : Config
        The fit; ``data.source`` must be ``simulate``.
    out_dir : path
        The sweep directory (see the module docstring); a second call with the same
        config resumes it, skipping finished realisations (``num_realisations`` may
        grow).
    client : distributed.Client
        See :func:`fieldhmc.distributed.open_client`.
    simulate_config : Config, optional
        Simulate from this config instead (same grid): a deliberately miscalibrated
        posterior, to check that the tests reject it.

    Returns
    -------
    SbcResult
    """
    from fieldhmc import distributed

    if num_realisations < 1:
        raise ValueError(f"--realisations must be >= 1 (got {num_realisations})")
    check_sbc_config(config, simulate_config)
    sim = simulate_config if simulate_config is not None else config
    out = Path(os.path.abspath(out_dir))
    fit_raw, sim_raw = _strip_outputs(config.to_dict()), _strip_outputs(sim.to_dict())
    _spec_guard(out / "sbc_spec.json", {"config": fit_raw, "simulate_config": sim_raw}, "an SBC")
    jobs, labels, skipped = [], [], []
    for i in range(num_realisations):
        rdir = out / "realisations" / f"r{i:04d}"
        label = f"r{i:04d}"
        if (rdir / SBC_MARKER).exists():
            skipped.append(label)
            continue
        jobs.append(
            SbcJob(
                i,
                _realisation_raw(config.to_dict(), i, sampler_seed=True),
                _realisation_raw(sim.to_dict(), i, sampler_seed=True),
                str(rdir),
            )
        )
        labels.append(label)
    outcome = distributed.run_jobs(
        client,
        sbc_realisation,
        jobs,
        labels,
        progress=progress,
        description="sbc",
        skipped=skipped,
    )
    # Every finished realisation in the directory (a resume asking for fewer keeps all).
    records = [_read_marker(p) for p in sorted(out.glob(f"realisations/r*/{SBC_MARKER}"))]
    records = [r for r in records if r is not None]
    dataset = gather_sbc(out, records, outcome.failures, plots=plots) if records else None
    return SbcResult(out, dataset, outcome.failures, outcome.skipped)


_GROUPS = {
    "hyperparameters": lambda n: not (n.startswith("power[") or n.startswith("mode[")),
    "power": lambda n: n.startswith("power["),
    "modes": lambda n: n.startswith("mode["),
}


def gather_sbc(out_dir: Path, records: Sequence[dict], failures: Sequence = (), *, plots=True):
    """``sbc.nc``, ``sbc_report.txt`` and the plots from the realisations' records.

    Returns
    -------
    xarray.Dataset
        ``rank``, ``truth``, ``posterior_mean``, ``posterior_sd`` ``[realisation,
        quantity]``; ``p_chi_square``, ``p_ecdf``, ``ecdf_gamma`` ``[quantity]``; ``k``
        coordinate (NaN but for power bins); attrs ``num_draws``, ``p_family`` (the
        Bonferroni p-value over both tests and all quantities), ``failures``.
    """
    import xarray as xr

    from fieldhmc import sbc

    out_dir = Path(out_dir)
    records = sorted(records, key=lambda r: r["realisation"])
    names = records[0]["quantities"]
    num_draws = records[0]["num_draws"]
    for r in records:
        if r["quantities"] != names or r["num_draws"] != num_draws:
            raise ValueError(
                f"realisation {r['realisation']} ranked other quantities or draws than "
                f"realisation {records[0]['realisation']}"
            )
    ranks = np.asarray([r["ranks"] for r in records], np.int64)
    tests = sbc.uniformity_tests(ranks, num_draws)
    p_all = np.concatenate([tests["chi_square"].pvalue, tests["ecdf"].pvalue])
    k = np.asarray([np.nan if v is None else v for v in records[0]["k"]], np.float64)
    dims = ("realisation", "quantity")
    ds = xr.Dataset(
        {
            "rank": (dims, ranks),
            "truth": (dims, np.asarray([r["truth"] for r in records])),
            "posterior_mean": (dims, np.asarray([r["posterior_mean"] for r in records])),
            "posterior_sd": (dims, np.asarray([r["posterior_sd"] for r in records])),
            "data_seed": (("realisation",), np.asarray([r["data_seed"] for r in records])),
            "sampler_seed": (("realisation",), np.asarray([r["sampler_seed"] for r in records])),
            "chi_square": (("quantity",), tests["chi_square"].statistic),
            "p_chi_square": (("quantity",), tests["chi_square"].pvalue),
            "ecdf_gamma": (("quantity",), tests["ecdf"].statistic),
            "p_ecdf": (("quantity",), tests["ecdf"].pvalue),
        },
        coords={
            "realisation": np.asarray([r["realisation"] for r in records]),
            "quantity": np.asarray(names, dtype=object),
            "k": (("quantity",), k),
        },
        attrs={
            "num_draws": num_draws,
            "num_realisations": len(records),
            "p_family": sbc.bonferroni(p_all),
            "failures": json.dumps([f"{f.label}: {f.error}" for f in failures]),
            "references": "Talts et al. arXiv:1804.06788; Sailynoja et al. arXiv:2103.10522",
        },
    )
    io.atomic_write(out_dir / "sbc.nc", lambda tmp: ds.to_netcdf(str(tmp), engine="h5netcdf"))
    io.write_text(out_dir / "sbc_report.txt", format_sbc_report(ds, failures))
    if plots:
        _plot_sbc(out_dir, ds)
    return ds


def format_sbc_report(ds, failures: Sequence = ()) -> str:
    """The text report: per quantity the two p-values; the family p-value; failures."""
    lines = [
        f"SBC: {ds.attrs['num_realisations']} realisations, "
        f"{ds.attrs['num_draws']} posterior draws each (ranks 0..{ds.attrs['num_draws']})",
        f"family-wise p (Bonferroni over {2 * ds.sizes['quantity']} tests): "
        f"{ds.attrs['p_family']:.3g}",
        "",
        f"{'quantity':<28} {'k':>8} {'p_chi2':>8} {'p_ecdf':>8}",
    ]
    for q in range(ds.sizes["quantity"]):
        k = float(ds["k"][q])
        flag = "  <- p < 0.01" if min(float(ds.p_chi_square[q]), float(ds.p_ecdf[q])) < 0.01 else ""
        lines.append(
            f"{str(ds.quantity.values[q]):<28} {'' if np.isnan(k) else f'{k:.3g}':>8} "
            f"{float(ds.p_chi_square[q]):8.3g} {float(ds.p_ecdf[q]):8.3g}{flag}"
        )
    lines.append("")
    if failures:
        lines.append(f"{len(failures)} realisation(s) FAILED:")
        lines += [f"  {f.label}: {f.error}" for f in failures]
    else:
        lines.append("no failures")
    return "\n".join(lines) + "\n"


def _plot_sbc(out_dir: Path, ds) -> list[Path]:
    from fieldhmc import plotting, sbc

    plot_dir = out_dir / "plots"
    plot_dir.mkdir(exist_ok=True)
    names = [str(n) for n in ds.quantity.values]
    ranks = ds["rank"].values
    num_draws = int(ds.attrs["num_draws"])
    band = sbc.ecdf_band(ranks.shape[0], num_draws, alpha=0.05)
    written = []
    for group, member in _GROUPS.items():
        cols = [i for i, n in enumerate(names) if member(n)]
        if not cols:
            continue
        sel = [names[i] for i in cols]
        pvals = {names[i]: (float(ds.p_chi_square[i]), float(ds.p_ecdf[i])) for i in cols}
        for kind, fig in (
            ("ranks", plotting.plot_sbc_ranks(ranks[:, cols], num_draws, sel, pvalues=pvals)),
            ("ecdf", plotting.plot_sbc_ecdf(ranks[:, cols], num_draws, sel, band, pvalues=pvals)),
        ):
            path = plot_dir / f"sbc_{kind}_{group}.png"

            def save(tmp, fig=fig):
                fig.savefig(tmp, dpi=100, format="png")

            io.atomic_write(path, save)
            written.append(path)
    return written


# --- seed / override sweeps -------------------------------------------------------------------
@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: its label, the overrides that make it, its config."""

    label: str
    values: dict
    overrides: tuple[str, ...]
    config: cfg.Config


def _split_values(text: str) -> list[str]:
    """Split ``v1,v2,[1,2,3]`` at top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]


def sweep_points(
    config_path: str | os.PathLike, assignments: Sequence[str], num_seeds: int
) -> list[SweepPoint]:
    """The grid ``assignments`` (``key=v1,v2,...``) x ``num_seeds`` sampler seeds.

    Seed ``s`` sets ``sampler.seed`` to the config's ``sampler.seed + s``. Every point is
    validated here, before anything runs.

    Raises
    ------
    ConfigError
        For a malformed assignment or an invalid value at any point.
    """
    if num_seeds < 1:
        raise ValueError(f"--seeds must be >= 1 (got {num_seeds})")
    axes: list[tuple[str, list[str]]] = []
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        key = key.strip()
        if not sep or not key:
            raise cfg.ConfigError("--set", f"expected dotted.key=v1,v2,... (got {assignment!r})")
        if key == "sampler.seed":
            raise cfg.ConfigError("--set", "sampler.seed is swept by --seeds; set no values for it")
        if key in (k for k, _ in axes):
            raise cfg.ConfigError("--set", f"{key} given twice")
        values = _split_values(text)
        if any(not v for v in values):
            raise cfg.ConfigError(key, f"empty value in --set {assignment!r}")
        axes.append((key, values))
    base_seed = cfg.load_config(config_path).sampler.seed
    points = []
    combos = list(itertools.product(*(v for _, v in axes))) if axes else [()]
    for p, combo in enumerate(combos):
        overrides = [f"{key}={value}" for (key, _), value in zip(axes, combo, strict=True)]
        for s in range(num_seeds):
            seed_over = f"sampler.seed={base_seed + s}"
            config = cfg.load_config(config_path, [*overrides, seed_over])
            values = {key: value for (key, _), value in zip(axes, combo, strict=True)}
            values["seed"] = base_seed + s
            points.append(SweepPoint(f"p{p:03d}-s{s:02d}", values, (*overrides, seed_over), config))
    return points


@dataclass(frozen=True)
class SweepJob:
    label: str
    values: dict
    config: dict
    out_dir: str
    plots: bool


def _flatten(prefix: str, obj: Any, out: dict) -> None:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, bool | int | float | str) or obj is None:
        out[prefix] = obj


def sweep_run(job: SweepJob) -> dict:
    """One sweep point: a full ``fieldhmc run``; returns its summary row (``sweep.json``).

    Points that differ only in ``sampler.seed`` / ``data.seed`` share the worker's
    compiled sampler.
    """
    out = Path(job.out_dir)
    done = _read_marker(out / SWEEP_MARKER)
    if done is not None:
        return done
    _record_attempt(out)
    from fieldhmc import workflow

    t0 = time.perf_counter()
    config = cfg.config_from_dict(job.config, out)
    # workflow.run's steps, with this worker's compiled sampler when only the seeds differ.
    d = workflow.obtain_data(config, workflow.build_model(config))
    built = _compiled(config, d.data)
    run = io.prepare_run_directory(out, overwrite=True)
    workflow.write_inputs(run, config, built.model, d)
    init = workflow.initial_state(config, built, d.data)
    result = workflow.sample(run, config, built, init, progress=False)
    workflow.export(run, config, built, result)
    workflow.diagnose(run.root)
    if job.plots:
        workflow.plot(run.root)
    summary = json.loads((out / "summary.json").read_text())
    row: dict = {"run": job.label, **job.values}
    flat: dict = {}
    _flatten("", {k: v for k, v in summary.items() if k != "metadata"}, flat)
    row.update(flat)
    row["seconds"] = time.perf_counter() - t0
    io.write_json(out / SWEEP_MARKER, row)
    return row


def _table(rows: Sequence[dict]):
    import pandas as pd

    return pd.DataFrame(list(rows)).set_index("run")


@dataclass
class SweepResult:
    out_dir: Path
    table: Any  # pandas.DataFrame (one row per finished run)
    failures: list = field(default_factory=list)
    skipped: list = field(default_factory=list)


def run_sweep(
    points: Sequence[SweepPoint],
    out_dir: str | os.PathLike,
    client: Any,
    *,
    progress: bool = True,
    plots: bool = False,
) -> SweepResult:
    """Run every point (resumable) and gather ``sweep.csv`` and ``sweep.nc``."""
    from fieldhmc import distributed

    out = Path(os.path.abspath(out_dir))
    spec = {p.label: {"overrides": list(p.overrides)} for p in points}
    spec["_config"] = _strip_outputs(points[0].config.to_dict()) if points else {}
    for p in points:
        spec[p.label]["config"] = _strip_outputs(p.config.to_dict())
    _spec_guard(out / "sweep_spec.json", spec, "a sweep")
    jobs, labels, skipped = [], [], []
    for p in points:
        rdir = out / "runs" / p.label
        if (rdir / SWEEP_MARKER).exists():
            skipped.append(p.label)
            continue
        raw = p.config.to_dict()
        raw["outputs"]["directory"] = str(rdir)
        jobs.append(SweepJob(p.label, p.values, raw, str(rdir), plots))
        labels.append(p.label)
    outcome = distributed.run_jobs(
        client, sweep_run, jobs, labels, progress=progress, description="sweep", skipped=skipped
    )
    rows = [_read_marker(out / "runs" / p.label / SWEEP_MARKER) for p in points]
    rows = [r for r in rows if r is not None]
    table = None
    if rows:
        table = _table(rows)
        io.atomic_write(out / "sweep.csv", lambda tmp: table.to_csv(tmp))
        ds = table.to_xarray()
        for name in ds.data_vars:  # netCDF has no mixed-type columns
            if ds[name].dtype == object:
                ds[name] = ds[name].astype(str)
        ds.attrs["failures"] = json.dumps([f"{f.label}: {f.error}" for f in outcome.failures])
        io.atomic_write(out / "sweep.nc", lambda tmp: ds.to_netcdf(str(tmp), engine="h5netcdf"))
    failure_text = "".join(f"{f.label}: {f.error}\n" for f in outcome.failures)
    io.write_text(out / "sweep_failures.txt", failure_text)
    return SweepResult(out, table, outcome.failures, outcome.skipped)
