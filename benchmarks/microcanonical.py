"""MCLMC and MAMS against fieldnuts and jittered HMC on the Gaussian field model.

Run: ``.venv/bin/python benchmarks/microcanonical.py [--grid 64] [--masks none slab]``
(part of ``make bench``). For each mask (none, and the 20% slab of ``sampling.py``)
every kernel runs through our driver on the same model, data, start (a prior draw),
posterior-metric whitening and chains, one after another in this process, and the
script prints per kernel:

* warm-up gradient evaluations (tuning / adaptation cost, all chains) and the tuned
  step size (``eps / sqrt(d)`` for the microcanonical kinds, with ``L / sqrt(d)``);
* post-warm-up gradient evaluations (all chains), min and median bulk ESS over every
  latent coordinate (every Fourier mode's real and imaginary part) and gradients per
  min-ESS and per median-ESS;
* the squares' :math:`(x_i-\\mu_i)^2` min and median ESS over the bias coordinates
  (non-ranked, as ArviZ's MCSE of a mean: the variances' mixing, which a longer MCLMC
  L slows while it speeds the means'; ``mcse_calibration.py`` measured it up to 1.08x
  high on these posteriors);
* the bias of the posterior variances against the exact Wiener posterior,
  :math:`b^2 = \\frac1d\\sum_i (\\hat E[(x_i-\\mu_i)^2] - \\sigma_i^2)^2 / (2\\sigma_i^4)`
  minus its Monte Carlo part (from the chains' spread,
  :func:`fieldhmc.diagnostics.variance_bias`), the measure of
  arXiv:2412.08876, over every coordinate when unmasked (exact Fourier-diagonal
  posterior) and over ``--bias-coordinates`` coordinates by CG when masked. Exact
  kernels should show 0 within noise; MCLMC's is bounded by its ``desired_energy_var``.

The MCLMC and MAMS chains are highly correlated from one transition to the next, so
their draws are thinned before storing (``--thin-mclmc``, ``--thin-mams``); ESS is
computed on the stored draws, gradients are counted for every transition, so
thinning can only make them look worse. Targets (issue 13): mclmc >= 5x fewer
gradients per min-ESS than fieldnuts masked, >= 3x unmasked; mams >= 2x masked.

If ``jax`` and ``blackjax`` are importable (the optional ``peers`` extra), the rows
``bj-mclmc``, ``bj-mams`` and ``bj-nuts`` run BlackJAX's MCLMC (tuned by
``mclmc_find_L_and_step_size``), adjusted MCLMC (``adjusted_mclmc_find_L_and_step_size``)
and NUTS after Stan's window adaptation (``window_adaptation``) on a JAX port of the same
target (`_blackjax_peer.py`, checked against TensorFlow's log density and gradient
first), with the same whitening, start, warm-up and draw counts, thinning,
``desired_energy_var`` (mclmc) and maximum tree depth (NUTS).

Seconds (issue 30): ``warm s`` and ``samp s`` are the execution times of the warm-up
and the post-warm-up programs, compiles excluded (ours: the driver's compiled chunks,
timed by `ChunkClock`; BlackJAX: its tuner and sampling loop compiled ahead of time),
so seconds per min-/median-ESS are given sampling only and warm-up included.
``ms/grad`` is the post-warm-up seconds per gradient of the batch of chains. With
``--seeds`` every kind runs once per seed (one compile) and the ratios ours / BlackJAX
(mclmc / bj-mclmc, mams / bj-mams, fieldnuts / bj-nuts) are printed per seed with
their median, split into gradients per min-ESS (with warm-up) and ms per gradient.
Targets (issue 30): seconds per min-ESS with warm-up, mclmc / bj-mclmc <= 0.25 at 64³
and 128³ and <= 0.8 at 16³; mams' warm-up gradients <= fieldnuts'.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from nuts_field import _peer_target, peer, whitened_target  # noqa: E402
from sampling import build  # noqa: E402

from fieldhmc import models  # noqa: E402
from fieldhmc.diagnostics import ess_bulk, mcse_mean, variance_bias  # noqa: E402
from fieldhmc.samplers import (  # noqa: E402
    FieldOutputs,
    MemorySink,
    Sampler,
    SamplerSettings,
    stateless_seed,
)

KINDS = ("mclmc", "mams", "fieldnuts", "hmc")
PEER_KINDS = ("bj-mclmc", "bj-mams", "bj-nuts")  # BlackJAX, with the ``peers`` extra


def exact_moments(model, data, masked: bool, num_coordinates: int, seed: int = 0):
    """Posterior mean and variance of the latent coordinates (flat), and which are known.

    Unmasked: exact and Fourier-diagonal, every coordinate. Masked: the mean by CG, the
    variance of ``num_coordinates`` random coordinates by one CG solve each.
    """
    post = models.wiener_posterior(model, data)
    mean = np.asarray(post.mean_latent).reshape(-1)
    if not masked:
        var = 1.0 / np.asarray(model.posterior_precision_diag(data)).reshape(-1)
        return mean, var, np.arange(mean.size)
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(mean.size, size=num_coordinates, replace=False))
    triples = [tuple(int(i) for i in np.unravel_index(j, model.grid.grid_shape)) for j in idx]
    var = np.asarray(models.wiener_variance(model, data, latent_indices=triples).latent_variance)
    full = np.full(mean.size, np.nan)
    full[idx] = var
    return mean, full, idx


class Problem(NamedTuple):
    """A target as the driver takes it: parts, metric scales, start, what to store."""

    target: Callable  # (*parts) -> [chains] log density
    names: list[str]  # latent part names; rank-1 parts ([chains]) are traced as scalars
    scales: list[np.ndarray]  # M^{-1/2} per part
    init: list[np.ndarray]  # start per part, [chains, ...]
    field_fn: Callable  # (*parts) -> the latent field, stored every thin-th draw
    dense_factor: np.ndarray | None = None  # the scalar parts' correlation factor, if any


def gaussian_problem(model, data, chains: int) -> Problem:
    """The Gaussian field posterior, posterior-metric whitening, a prior-draw start."""
    return Problem(
        model.target_log_prob_fn(data),
        ["field"],
        [(1.0 / np.sqrt(model.posterior_precision_diag(data))).astype(np.float32)],
        [np.asarray(model.init_latents("prior", chains, seed=stateless_seed(1))[0])],
        lambda v: v,
    )


def config_problem(path: str, grid: int, chains: int, overrides=()):
    """A shipped config's model on a ``grid``³ box, its data, preconditioner and start.

    Returns ``(problem, description)``; the start is a prior draw of every latent.
    ``overrides`` are ``--set`` assignments applied after the grid's.
    """
    from fieldhmc import config as cfg
    from fieldhmc import workflow

    n = grid
    config = cfg.load_config(path, [f"grid.shape=[{n},{n},{n}]", *overrides])
    model = workflow.build_model(config)
    data = np.asarray(model.sample(seed=stateless_seed(config.data.seed))["data"])
    dtype = np.dtype(config.precision)
    init = [
        np.asarray(v, dtype) for v in model.init_latents("prior", chains, seed=stateless_seed(1))
    ]
    field = list(model.latent_names).index("field")
    scales, factor, _ = workflow._metric(config, model, data)  # the CLI's, dense block too
    problem = Problem(
        model.target_log_prob_fn(data),
        list(model.latent_names),
        scales,
        init,
        lambda *parts: parts[field],
        factor,
    )
    latents = ", ".join(model.latent_names)
    text = f"{Path(path).name} at {n}³ ({latents}; {config.sampler.preconditioner} metric)"
    return problem, text


class ChunkClock:
    """Execution seconds of a sampler's warm-up and post-warm-up chunks, compiles excluded.

    Wraps the sampler's two compiled chunk programs (a private attribute each: the
    driver reports no warm-up time, and its ``sampling_seconds`` includes the
    post-warm-up program's compile on its first chunk). The first call of each program
    is preceded by a call of zero transitions and no re-centring, which compiles it and
    leaves the carried state as it was; each real call is then timed until its outputs
    are on the host. The driver's host work between chunks (re-centring, checkpoints,
    sinks) is not counted, as in ms per gradient.
    """

    def __init__(self, sampler: Sampler):
        self.seconds = {"warmup": 0.0, "sampling": 0.0}
        self._compiled: set[int] = set()
        sampler._chunk = self._wrap(sampler._chunk, "warmup")
        sampler._sampling_chunk = self._wrap(sampler._sampling_chunk, "sampling")

    def reset(self) -> None:
        self.seconds = {"warmup": 0.0, "sampling": 0.0}

    def _wrap(self, chunk, phase: str):
        def timed(scales, reference, delta, seed, start, num_steps, *rest):
            if id(chunk) not in self._compiled:
                zero = tf.constant(0, num_steps.dtype)
                chunk(scales, reference, tf.zeros_like(delta), seed, start, zero, *rest)[2].numpy()
                self._compiled.add(id(chunk))
            begin = time.perf_counter()
            out = chunk(scales, reference, delta, seed, start, num_steps, *rest)
            out[2].numpy()  # blocks until the chunk has run
            self.seconds[phase] += time.perf_counter() - begin
            return out

        return timed


def make_sampler(problem: Problem, kind: str, args) -> Sampler:
    """Our driver for ``kind`` on ``problem``; one per kind, run once per seed."""
    burnin = {"mclmc": args.burnin_mclmc, "mams": args.burnin_mams}.get(kind, args.burnin)
    results = {"mclmc": args.results_mclmc, "mams": args.results_mams}.get(kind, args.results)
    thin = {"mclmc": args.thin_mclmc, "mams": args.thin_mams}.get(kind, 1)
    settings = SamplerSettings(
        kind=kind,
        num_chains=args.chains,
        num_burnin_steps=burnin,
        num_results=results,
        num_leapfrog_steps=args.leapfrog,
        jitter_leapfrog=True,
        max_tree_depth=args.max_depth,
        step_size=0.1,
        desired_energy_var=args.desired_energy_var,
        chunk_size=args.chunk_size,
        field_thin=thin,
        seed=args.seeds[0],
    )
    outputs = FieldOutputs(
        field_fn=problem.field_fn,
        power_fn=lambda v: tf.zeros([tf.shape(v)[0], 1], v.dtype),
    )
    return Sampler(
        problem.target,
        settings,
        problem.names,
        problem.scales,
        outputs,
        dense_factor=problem.dense_factor,
    )


def run_kind(problem: Problem, kind: str, args) -> list[dict]:
    """One driver run per seed of ``--seeds`` (one compile); ESS, gradient counts,
    warm-up and sampling execution seconds, tuned values and the draws' moments."""
    micro = kind in ("mclmc", "mams")
    sampler = make_sampler(problem, kind, args)
    clock = ChunkClock(sampler)
    rows = []
    for seed in args.seeds:
        clock.reset()
        sink = MemorySink()
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            summary = sampler.run(sink, Path(d), problem.init, progress=False, seed=seed)
        seconds = time.perf_counter() - start
        draws = sink.stacked_fields()  # draw, chain, ...
        post = np.moveaxis(draws, 0, 1).reshape(args.chains, draws.shape[0], -1)
        del draws
        scalars = [n for n, x in zip(problem.names, problem.init, strict=True) if x.ndim == 1]
        hyper = (
            np.stack([np.concatenate([t[n] for t in sink.traces]).T for n in scalars], axis=-1)
            if scalars
            else None
        )  # chain, draw, H (every draw)
        grads = int(sum(int(t["n_steps"].sum()) for t in sink.traces))
        energy_error = np.concatenate([t["energy_error"] for t in sink.traces])
        dim = post.shape[-1] + len(scalars)
        tuned = summary.tuned
        rows.append(
            {
                "seed": seed,
                "post": post,
                "hyper": hyper,
                "warmup_grads": summary.warmup_gradient_evaluations,
                "grads": grads,
                "seconds": seconds,
                "warmup_seconds": clock.seconds["warmup"],
                "sampling_seconds": clock.seconds["sampling"],
                "step_size": tuned["step_size"],
                "trajectory_length": tuned.get("trajectory_length", float("nan"))
                if micro
                else None,
                "eevpd": float(np.mean(energy_error**2) / dim) if micro else float("nan"),
                "accept": _nanmean(np.concatenate([t["acceptance_rate"] for t in sink.traces])),
                "draws": post.shape[1],
                "ms_per_gradient": 1e3
                * clock.seconds["sampling"]
                / max(1, summary.sampling_batched_gradients),
            }
        )
    return rows


def run_peer(model, data, kind: str, args) -> list[dict]:
    """BlackJAX's MCLMC, adjusted MCLMC or NUTS (window adaptation) on the JAX port of
    the same whitened target, one run per seed of ``--seeds`` (one compile)."""
    setup = whitened_target(model, data, args.chains)
    logdensity = _peer_target(model, data, setup, setup.u0)
    u0 = setup.u0.numpy()
    seeds = tuple(args.seeds)
    if kind == "bj-mclmc":
        runs = peer.sample_mclmc(
            logdensity,
            u0,
            args.burnin_mclmc,
            args.results_mclmc,
            args.thin_mclmc,
            args.desired_energy_var,
            seeds=seeds,
        )
    elif kind == "bj-mams":
        runs = peer.sample_adjusted_mclmc(
            logdensity, u0, args.burnin_mams, args.results_mams, args.thin_mams, seeds=seeds
        )
    else:
        runs = peer.sample_nuts_window(
            logdensity, u0, args.burnin, args.results, args.max_depth, seeds=seeds
        )
    dim = u0[0].size
    micro = kind != "bj-nuts"
    return [
        {
            "seed": seed,
            "post": r.draws * setup.scale.reshape(-1),
            "warmup_grads": r.warmup_grads,
            "grads": r.grads,
            "seconds": r.seconds,
            "warmup_seconds": r.warmup_seconds,
            "sampling_seconds": r.sampling_seconds,
            "step_size": r.step_size / np.sqrt(dim) if micro else r.step_size,
            "trajectory_length": r.trajectory_length / np.sqrt(dim) if micro else None,
            "eevpd": float(np.mean(r.energy_error**2) / dim),
            "accept": r.accept,
            "draws": r.draws.shape[1],
            "ms_per_gradient": r.ms_per_gradient,
        }
        for seed, r in zip(seeds, runs, strict=True)
    ]


def _nanmean(x: np.ndarray) -> float:
    return float(np.mean(x[np.isfinite(x)])) if np.isfinite(x).any() else float("nan")


def analyse(r: dict, mean, var, idx) -> dict:
    """Add ESS and bias figures to a run's row (and drop its draws)."""
    post = r.pop("post")
    hyper = r.pop("hyper", None)
    ess = ess_bulk(post).reshape(-1)
    if hyper is not None:
        r["hyper_min_ess"] = float(np.min(ess_bulk(hyper)))
        ess = np.concatenate([ess, ess_bulk(hyper).reshape(-1)])
    bias = variance_bias(post, mean[idx], var[idx], columns=idx)
    ess_sq = []
    for lo in range(0, idx.size, 1 << 16):  # column blocks: float64 copies stay small
        j = idx[lo : lo + (1 << 16)]
        sq = (post[..., j] - mean[j]) ** 2
        ess_sq.append(sq.reshape(-1, j.size).var(axis=0, ddof=1) / mcse_mean(sq) ** 2)
    ess_sq = np.concatenate(ess_sq)
    r.update(
        min_ess_sq=float(np.min(ess_sq)),
        median_ess_sq=float(np.median(ess_sq)),
        min_ess=float(np.min(ess)),
        median_ess=float(np.median(ess)),
        grads_per_min_ess=r["grads"] / float(np.min(ess)),
        grads_per_median_ess=r["grads"] / float(np.median(ess)),
        s_per_min_ess=r["sampling_seconds"] / float(np.min(ess)),
        s_per_median_ess=r["sampling_seconds"] / float(np.median(ess)),
        s_per_min_ess_all=(r["warmup_seconds"] + r["sampling_seconds"]) / float(np.min(ess)),
        s_per_median_ess_all=(r["warmup_seconds"] + r["sampling_seconds"]) / float(np.median(ess)),
        b2=bias["b2"],
        b2_se=bias["se"],
        rel_var_err=bias["rel"],
    )
    return r


def _print_header() -> None:
    print(
        f"{'kernel':>9} {'seed':>4} | {'warm grads':>10} {'step/√d':>8} {'L/√d':>6} | "
        f"{'draws':>5} {'grads':>8} {'minESS':>6} {'medESS':>6} {'g/minESS':>8} "
        f"{'g/medESS':>8} | {'warm s':>7} {'samp s':>7} {'ms/grad':>7} | "
        f"{'s/minESS':>8} {'+warm':>8} {'s/medESS':>8} {'+warm':>8} | "
        f"{'b2':>8} {'±':>7} {'ΔVar/Var':>8} {'EEVPD':>7}"
    )


def _print_row(kind: str, r: dict) -> None:
    length = r["trajectory_length"]
    print(
        f"{kind:>9} {r['seed']:>4d} | {r['warmup_grads']:>10d} {r['step_size']:>8.3f} "
        f"{'' if length is None else f'{length:.2f}':>6} | {r['draws']:>5d} {r['grads']:>8d} "
        f"{r['min_ess']:>6.0f} {r['median_ess']:>6.0f} {r['grads_per_min_ess']:>8.1f} "
        f"{r['grads_per_median_ess']:>8.1f} | {r['warmup_seconds']:>7.2f} "
        f"{r['sampling_seconds']:>7.2f} {r['ms_per_gradient']:>7.2f} | "
        f"{r['s_per_min_ess']:>8.4f} {r['s_per_min_ess_all']:>8.4f} "
        f"{r['s_per_median_ess']:>8.4f} {r['s_per_median_ess_all']:>8.4f} | "
        f"{r['b2']:>8.1e} {r['b2_se']:>7.1e} {r['rel_var_err']:>8.4f} {r['eevpd']:>7.1e}"
        + f"   (squares' min / median ESS {r['min_ess_sq']:.0f} / {r['median_ess_sq']:.0f})"
        + (
            f"   (hyperparameters' min ESS {r['hyper_min_ess']:.0f})"
            if "hyper_min_ess" in r
            else ""
        ),
        flush=True,
    )


# Ours against BlackJAX's, per seed: the issue-30 table's ratio rows.
PAIRS = (("mclmc", "bj-mclmc"), ("mams", "bj-mams"), ("fieldnuts", "bj-nuts"))
RATIOS = (
    ("s/min-ESS", "s_per_min_ess"),
    ("s/min-ESS +warm-up", "s_per_min_ess_all"),
    ("s/med-ESS", "s_per_median_ess"),
    ("s/med-ESS +warm-up", "s_per_median_ess_all"),
    ("warm-up grads", "warmup_grads"),
    ("grads/min-ESS", "grads_per_min_ess"),
    ("grads+warm/min-ESS", "all_grads_per_min_ess"),
    ("ms/grad", "ms_per_gradient"),
)


def _mclmc_target(grid: int) -> float | None:
    """Issue 30: seconds per min-ESS with warm-up, ours / BlackJAX's mclmc."""
    return 0.25 if grid >= 64 else 0.8 if grid == 16 else None


def peer_ratios(rows: dict) -> dict:
    """``{(ours, theirs, figure): [ours / theirs per seed]}`` for every pair run."""
    out = {}
    for ours, theirs in PAIRS:
        if ours not in rows or theirs not in rows:
            continue
        for a, b in zip(rows[ours], rows[theirs], strict=True):
            for _, key in RATIOS:
                out.setdefault((ours, theirs, key), []).append(_figure(a, key) / _figure(b, key))
    if "mams" in rows and "fieldnuts" in rows:
        for a, b in zip(rows["mams"], rows["fieldnuts"], strict=True):
            value = a["warmup_grads"] / b["warmup_grads"]
            out.setdefault(("mams", "fieldnuts", "warmup_grads"), []).append(value)
    return out


def _figure(r: dict, key: str) -> float:
    if key == "all_grads_per_min_ess":
        return (r["warmup_grads"] + r["grads"]) / r["min_ess"]
    return float(r[key])


def _print_peer_ratios(ratios: dict, grid: int) -> None:
    """Each ratio per seed and its median; the issue-30 targets where they apply."""
    if not ratios:
        return
    print("ours / peer, per seed (median):")
    names = dict((key, name) for name, key in RATIOS)
    for (ours, theirs, key), values in ratios.items():
        per_seed = " ".join(f"{v:.3g}" for v in values)
        median = float(np.median(values))
        label = f"{ours} / {theirs} {names[key]}"
        verdict = ""
        target = _mclmc_target(grid)
        if (ours, key) == ("mclmc", "s_per_min_ess_all") and target is not None:
            verdict = f"   target <= {target:g}: {'met' if median <= target else 'NOT met'}"
        if (ours, theirs) == ("mams", "fieldnuts"):
            verdict = f"   target <= 1: {'met' if median <= 1 else 'NOT met'}"
        print(f"  {label:<44} {per_seed}  ({median:.3g}){verdict}", flush=True)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Warm-up, draws, thinning and kernel settings per kind, as :func:`run_kind` reads them."""
    parser.add_argument("--burnin", type=int, default=150, help="fieldnuts / hmc warm-up")
    parser.add_argument("--results", type=int, default=200, help="fieldnuts / hmc draws")
    parser.add_argument("--burnin-mclmc", type=int, default=600)
    parser.add_argument("--results-mclmc", type=int, default=800)
    parser.add_argument("--thin-mclmc", type=int, default=2)
    parser.add_argument("--burnin-mams", type=int, default=400)
    parser.add_argument("--results-mams", type=int, default=400)
    parser.add_argument("--thin-mams", type=int, default=1)
    parser.add_argument("--desired-energy-var", type=float, default=5e-4, help="mclmc")
    parser.add_argument("--leapfrog", type=int, default=32, help="hmc: jittered in [1, L]")
    parser.add_argument("--max-depth", type=int, default=8, help="fieldnuts")
    parser.add_argument("--chunk-size", type=int, default=100)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=64)
    parser.add_argument("--masks", nargs="+", default=["none", "slab"], choices=["none", "slab"])
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=["mclmc", "bj-mclmc", "mams", "bj-mams", "fieldnuts", "bj-nuts"],
        choices=KINDS + PEER_KINDS,
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[5],
        help="sampler seeds (ours and BlackJAX's); one compile per kind, a row per seed",
    )
    parser.add_argument(
        "--no-peers",
        dest="peers",
        action="store_false",
        help="skip BlackJAX even if jax and blackjax are importable",
    )
    parser.add_argument(
        "--config",
        help="a shipped config (e.g. configs/hierarchical_64.yaml) on a --grid box instead "
        "of the Gaussian model; its preconditioner, a prior-draw start; no BlackJAX rows",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --config: override a config key (repeatable)",
    )
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument(
        "--speed-steps", type=int, default=50, help="bare-kernel timing vs BlackJAX; 0: skip"
    )
    parser.add_argument("--speed-repeats", type=int, default=5)
    parser.add_argument(
        "--speed-only",
        nargs=4,
        type=float,
        metavar=("MCLMC_STEP", "MCLMC_L", "MAMS_STEP", "MAMS_L"),
        help="only the bare-kernel timing (first mask) at these tuned values (/√d, as printed)",
    )
    add_run_arguments(parser)
    parser.add_argument("--bias-coordinates", type=int, default=64, help="masked: CG solves")
    args = parser.parse_args(argv)
    model_text = "config" if args.config else "Gaussian field model, posterior-metric whitening"
    print(
        f"{args.grid}³ {model_text}, {args.chains} chains, "
        f"float32, XLA; TF {tf.__version__}. Gradients: all chains; warm-up counted apart. "
        f"mclmc desired Var[dE]/d = {args.desired_energy_var:g}"
    )
    with_peers = peer is not None and args.peers and not args.config
    kinds = [k for k in args.kinds if with_peers or k not in PEER_KINDS]
    if peer is None and any(k in PEER_KINDS for k in args.kinds):
        print("BlackJAX rows skipped: install the peers extra (pip install -e '.[peers]')")
    elif with_peers:
        print(f"BlackJAX {peer.VERSION} (JAX {peer.jax.__version__}) rows: {', '.join(PEER_KINDS)}")
    out = {}
    if args.speed_only and with_peers:
        model, data = build(args.grid, args.masks[0] == "slab")
        a, b, c, d = args.speed_only
        rows = {
            "mclmc": {"step_size": a, "trajectory_length": b},
            "mams": {"step_size": c, "trajectory_length": d},
        }
        return {"speed": {args.masks[0]: speed(model, data, rows, args)}}
    if args.config:
        problem, text = config_problem(args.config, args.grid, args.chains, args.overrides)
        print(f"\n{text}; no exact posterior: ΔVar/Var and b2 are against fieldnuts' draws")
        _print_header()
        rows, ref = {}, None
        for kind in ["fieldnuts"] + [k for k in kinds if k in KINDS and k != "fieldnuts"]:
            r = run_kind(problem, kind, args)[0]
            if ref is None:
                ref = r["post"].mean(axis=(0, 1)), r["post"].var(axis=(0, 1))
                ref = ref + (np.arange(ref[0].size),)
            rows[kind] = r = analyse(r, *ref)
            _print_row(kind, r)
        _print_ratios(rows, masked=None)
        return {"config": rows}
    for mask in args.masks:
        masked = mask == "slab"
        model, data = build(args.grid, masked)
        mean, var, idx = exact_moments(model, data, masked, args.bias_coordinates)
        problem = gaussian_problem(model, data, args.chains)
        where = f"{idx.size} coordinates (CG)" if masked else "every coordinate (exact)"
        load = os.getloadavg()
        print(
            f"\n{args.grid}³ {'20% slab mask' if masked else 'unmasked'}; bias b2 over {where}; "
            f"seeds {' '.join(map(str, args.seeds))}; load average at start "
            f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
        )
        print(
            "seconds: execution of the warm-up / post-warm-up programs, compiles excluded; "
            "s/ESS sampling only, +warm: warm-up included"
        )
        _print_header()
        rows = {}
        for kind in kinds:
            if kind in PEER_KINDS:
                runs = run_peer(model, data, kind, args)
            else:
                runs = run_kind(problem, kind, args)
            rows[kind] = [analyse(r, mean, var, idx) for r in runs]
            for r in rows[kind]:
                _print_row(kind, r)
        load = os.getloadavg()
        print(f"load average at end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
        first = {kind: runs[0] for kind, runs in rows.items()}
        _print_ratios(first, masked)
        ratios = peer_ratios(rows)
        _print_peer_ratios(ratios, args.grid)
        if with_peers and args.speed_steps and {"mclmc", "mams"} <= set(rows):
            out.setdefault("speed", {})[mask] = speed(model, data, first, args)
        out[mask] = rows
        out.setdefault("ratios", {})[mask] = ratios
    return out


def _print_ratios(rows: dict, masked: bool | None) -> None:
    """fieldnuts' gradients per ESS over each kernel's; the issue-13 targets unless None."""
    if "fieldnuts" not in rows:
        return
    ref = rows["fieldnuts"]
    for kind in ("mclmc", "mams", "hmc"):
        if kind in rows:
            print(
                f"fieldnuts / {kind} gradients per min-ESS: "
                f"{ref['grads_per_min_ess'] / rows[kind]['grads_per_min_ess']:.2f}, "
                f"per median-ESS: "
                f"{ref['grads_per_median_ess'] / rows[kind]['grads_per_median_ess']:.2f}"
            )
    if masked is None:
        return
    targets = {"mclmc": 5.0 if masked else 3.0, "mams": 2.0 if masked else None}
    for kind, target in targets.items():
        if kind in rows and target is not None:
            ratio = ref["grads_per_min_ess"] / rows[kind]["grads_per_min_ess"]
            verdict = "met" if ratio >= target else "NOT met"
            print(f"target {kind} >= {target:g}x fewer than fieldnuts: {verdict}")


def _our_runner(target, kernel_cls, u0, step_size: float, big_l: float, num_steps: int):
    """Compiled loop of ``num_steps`` transitions of our kernel at a fixed ``(step, L)``.

    Returns ``(fn, batched gradients per call)``; ``fn()`` blocks.
    """
    eps = tf.constant(step_size, tf.float32)
    length = tf.constant(big_l, tf.float32)

    @tf.function(jit_compile=True, autograph=False)
    def bootstrap(u):
        return kernel_cls(target, eps, length).bootstrap_results(u)

    @tf.function(jit_compile=True, autograph=False)
    def run(u, results, seed):
        kernel = kernel_cls(target, eps, length)

        def body(i, u, results, grads):
            step_seed = tf.random.experimental.stateless_fold_in(seed, i)
            u, results = kernel.one_step(u, results, seed=step_seed)
            return i + 1, u, results, grads + results.num_gradient_evaluations

        _, u, _, grads = tf.while_loop(
            lambda i, *_: i < num_steps, body, (tf.constant(0), u, results, tf.constant(0))
        )
        return u, grads

    seed = tf.constant([3, 4], tf.int32)
    results = bootstrap(u0)  # outside the timed loop (one more gradient and normal draw)
    grads = int(run(u0, results, seed)[1])  # compiles

    def fn():
        u, _ = run(u0, results, seed)
        return u.numpy()

    return fn, grads


def _driver_runner(problem: Problem, kind: str, step_size: float, big_l: float, args):
    """Our driver at a fixed ``(step, L)`` (no warm-up, so no tuning), ``--speed-steps``
    transitions in one chunk, storing what `run_kind` stores.

    Returns ``(fn, None)``; ``fn()`` runs and returns the chunk's execution seconds
    per batched gradient (the driver's own ``sampling_seconds``: no compile, checkpoint
    or host work).
    """
    settings = SamplerSettings(
        kind=kind,
        num_chains=args.chains,
        num_burnin_steps=0,
        num_results=args.speed_steps,
        step_size=step_size,
        trajectory_length=big_l,
        chunk_size=args.speed_steps,
        field_thin={"mclmc": args.thin_mclmc, "mams": args.thin_mams}[kind],
        seed=5,
    )
    outputs = FieldOutputs(
        field_fn=problem.field_fn,
        power_fn=lambda v: tf.zeros([tf.shape(v)[0], 1], v.dtype),
    )
    sampler = Sampler(problem.target, settings, problem.names, problem.scales, outputs)

    def run_once():
        with tempfile.TemporaryDirectory() as d:
            return sampler.run(MemorySink(), Path(d), problem.init, progress=False)

    def fn():
        summary = run_once()
        return summary.sampling_seconds / summary.sampling_batched_gradients

    # compiles: its only chunk is left out of sampling_seconds (and its gradients), so
    # it has no time per gradient to divide
    run_once()
    return fn


def speed(model, data, rows: dict, args) -> dict:
    """ms per gradient at fixed (step, L): ours bare, ours inside the driver, BlackJAX.

    Each at our tuned values of its row, ``--speed-steps`` transitions of all chains
    from the same start (a prior draw), round-robin ``--speed-repeats`` times with a
    0.3 s pause before each call (so neither library's idle worker threads are still
    spinning when the other starts; in one process they share the 2 cores), medians.
    "bare": the kernel's compiled loop, nothing stored. "driver": the driver's
    compiled chunk (its ``sampling_seconds``) with `run_kind`'s outputs: traces, the
    field draws every ``--thin-*``-th transition and the field's running moments
    (every 5th transition for mclmc, or the stored draws' multiple of `--thin-mclmc`
    below that; every one for mams; `field_stats_every`).
    BlackJAX: its compiled loop of bare kernel steps, nothing stored.
    """
    from fieldhmc.samplers.mclmc import (
        MetropolisAdjustedMicrocanonical,
        MicrocanonicalLangevin,
    )

    setup = whitened_target(model, data, args.chains)
    problem = gaussian_problem(model, data, args.chains)
    logdensity = peer.make_logdensity(model, data, setup.scale)
    dim = int(np.prod(setup.u0.shape[1:]))
    fns, grads = {}, {}
    for kind, cls in (
        ("mclmc", MicrocanonicalLangevin),
        ("mams", MetropolisAdjustedMicrocanonical),
    ):
        step, length = rows[kind]["step_size"], rows[kind]["trajectory_length"]
        eps, big_l = step * np.sqrt(dim), length * np.sqrt(dim)
        fns[kind], grads[kind] = _our_runner(
            setup.target, cls, setup.u0, eps, big_l, args.speed_steps
        )
        fns[f"{kind} driver"] = _driver_runner(problem, kind, step, length, args)
        theirs = peer.fixed_runners(logdensity, setup.u0.numpy(), eps, big_l, args.speed_steps)
        fns[f"bj-{kind}"], grads[f"bj-{kind}"] = theirs[kind]
    times = {name: [] for name in fns}
    for _ in range(args.speed_repeats):
        for name, fn in fns.items():
            time.sleep(0.3)
            start = time.perf_counter()
            per_grad = fn()
            if name in grads:
                per_grad = (time.perf_counter() - start) / grads[name]
            times[name].append(1e3 * per_grad)
    out = {name: float(np.median(t)) for name, t in times.items()}
    print(
        f"\nms per gradient of the batch of {args.chains} chains at our tuned (step, L), "
        f"{args.speed_steps} transitions, round-robin median of {args.speed_repeats}"
    )
    print(
        f"{'kernel':>6} | {'ours bare':>9} {'ours driver':>11} {'BlackJAX':>8} | "
        f"{'bare/BJ':>7} {'driver/BJ':>9} | target driver/BJ <= 1.2"
    )
    for kind in ("mclmc", "mams"):
        bj = out[f"bj-{kind}"]
        bare, drv = out[kind], out[f"{kind} driver"]
        print(
            f"{kind:>6} | {bare:>9.2f} {drv:>11.2f} {bj:>8.2f} | {bare / bj:>7.2f} "
            f"{drv / bj:>9.2f} | {'met' if max(bare, drv) / bj <= 1.2 else 'NOT met'}",
            flush=True,
        )
    return out


if __name__ == "__main__":
    main()
    sys.exit(0)
