"""The dense metric of the sampled parameters against the diagonal one, side by side.

Run: ``.venv/bin/python benchmarks/dense_params.py --config configs/galaxy_clustering_16.yaml
[--grid 16] [--kinds fieldnuts] [--seeds 0 1] [--set key=value ...]``.

For a shipped config with sampled scalar parameters, every (kernel, seed) runs with
``sampler.preconditioner: diagonal`` and ``dense_params`` through our driver on the same
data and from the same initial state, in this process. Printed per row: warm-up and
post-warm-up gradient evaluations (all chains), the tuned step size, the bulk ESS of each
sampled parameter and the minimum over every real coordinate of delta's orthonormal
Fourier modes (the mean mode excluded; from every ``--field-thin``-th draw), and
gradients per min-ESS, the minimum over the parameters *and* the field (issue 26's and
29's figure). ``--preconditioners`` takes any of the config's (``posterior`` too); each
row's metric is the CLI's, including the conditional parametrisation's block for the
sampled P(k) parameters, and a row with no sampled parameter
(``--set model.hyperparameters.<name>.sample=false``) is the field's alone. Warm-up and
draws are the config's unless ``--burnin`` / ``--results`` are given.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from fieldhmc import config as cfg  # noqa: E402
from fieldhmc import workflow  # noqa: E402
from fieldhmc.diagnostics import ess_bulk  # noqa: E402
from fieldhmc.ops import HermitianPacking, rfft3d  # noqa: E402
from fieldhmc.samplers import FieldOutputs, MemorySink, Sampler, stateless_seed  # noqa: E402

PRECONDITIONERS = ("diagonal", "dense_params")


def run_row(
    path: str,
    overrides: list[str],
    model,
    data,
    preconditioner: str,
    seed: int,
    field_thin: int = 1,
) -> dict:
    """One driver run of the config at ``path`` with ``preconditioner`` and sampler seed
    ``seed``; the field's ESS from every ``field_thin``-th draw."""
    config = cfg.load_config(
        path, [*overrides, f"sampler.preconditioner={preconditioner}", f"sampler.seed={seed}"]
    )
    settings = workflow._settings(config)
    settings = type(settings)(**{**settings.__dict__, "field_thin": field_thin, "thin": 1})
    target = model.target_log_prob_fn(data)
    packing = HermitianPacking(model.grid.grid_shape)
    keep = packing.mode_of_real != 0  # the mean mode of delta is 0

    def field_fn(*parts):
        modes = rfft3d(target.field_from_latents(*parts), norm="ortho")
        return packing.real_from_modes(modes)

    outputs = FieldOutputs(field_fn, power_fn=lambda v: tf.zeros([tf.shape(v)[0], 1], v.dtype))
    scales, factor, _ = workflow._metric(config, model, data)
    groups = workflow._metric_groups(config, model, settings)
    sampler = Sampler(
        target,
        settings,
        model.latent_names,
        scales,
        outputs,
        dense_factor=factor,
        metric_groups=groups,
    )
    init = [
        np.asarray(t)
        for t in model.init_latents(
            config.sampler.init,
            settings.num_chains,
            seed=stateless_seed(1),  # the same start for every row
            data=data,
            jitter=config.sampler.init_jitter,
        )
    ]
    sink = MemorySink()
    start = time.perf_counter()
    field_grads = 0
    if config.sampler.field_warmup > 0:  # counted with the warm-up
        init, field_grads = workflow.field_warmup(config, model, data, init, sampler.initial_scales)
    with tempfile.TemporaryDirectory() as d:
        summary = sampler.run(sink, Path(d), init, progress=False)
    seconds = time.perf_counter() - start
    traces = sink.stacked_traces()  # draw, chain
    post = np.moveaxis(sink.stacked_fields(), 0, 1)  # chain, draw, ...
    post = post.reshape(*post.shape[:2], -1)[..., keep.ravel()]
    params = [n for n, x in zip(model.latent_names, init, strict=True) if x.ndim == 1]
    param_ess = {n: float(ess_bulk(traces[n].T)) for n in params}
    physical = model.physical_parameters({n: traces[n] for n in params})
    param_mean = {n: float(np.mean(v)) for n, v in physical.items()}
    param_sd = {n: float(np.std(v)) for n, v in physical.items()}
    field_ess = float(np.min(ess_bulk(post)))
    grads = int(traces["n_steps"].sum())
    dim = sum(int(np.prod(x.shape[1:])) for x in init)
    energy_error = traces.get("energy_error")
    eevpd = (  # Var[dE]/d as the tuner and microcanonical.py take it: mean dE^2 / d
        float(np.nanmean(np.square(energy_error)) / dim)
        if energy_error is not None and np.isfinite(energy_error).any()
        else None
    )
    min_ess = min([field_ess, *param_ess.values()])
    return {
        "warmup_grads": summary.warmup_gradient_evaluations + field_grads,
        "grads": grads,
        "step_size": float(np.mean(traces["step_size"][-1])),
        "param_ess": param_ess,
        "param_mean": param_mean,
        "param_sd": param_sd,
        "field_min_ess": field_ess,
        "min_ess": min_ess,
        "grads_per_min_ess": grads / min_ess,
        "seconds": seconds,
        "dense_factor": summary.dense_factor,
        "energy_var_per_dim": eevpd,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/galaxy_clustering_16.yaml")
    parser.add_argument("--grid", type=int, default=None, help="n for an n³ grid")
    parser.add_argument("--kinds", nargs="+", default=["fieldnuts"])
    parser.add_argument("--preconditioners", nargs="+", default=list(PRECONDITIONERS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--burnin", type=int, default=None)
    parser.add_argument("--results", type=int, default=None)
    parser.add_argument(
        "--field-thin",
        type=int,
        default=1,
        help="the field's ESS from every n-th draw (memory: a 64³ draw of 4 chains is 4 MB); "
        "the thinned chain's ESS, a lower bound of the whole chain's up to noise",
    )
    parser.add_argument("--set", nargs="*", default=[], dest="overrides")
    parser.add_argument(
        "--fixed-at-truth",
        action="store_true",
        help="fix the sampled P(k) hyperparameters at the values that drew the data, on the "
        "data of the model that samples them (the issue-26 baseline; without it a row with "
        "--set ...sample=false simulates its own data at the fiducial P(k))",
    )
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.grid:
        overrides.append(f"grid.shape=[{args.grid},{args.grid},{args.grid}]")
    if args.burnin is not None:
        overrides.append(f"sampler.num_burnin_steps={args.burnin}")
    if args.results is not None:
        overrides.append(f"sampler.num_results={args.results}")
    rows: dict = {}
    data = None
    if args.fixed_at_truth:
        from joint_inference import fixed_overrides, simulated_truth

        # the sampler section is validated against a kind: the first row's
        with_kind = [*overrides, f"sampler.kind={args.kinds[0]}"]
        data, truth = simulated_truth(args.config, with_kind)
        overrides += fixed_overrides(truth)
        print("P(k) fixed at " + ", ".join(f"{n} = {v:.4f}" for n, v in truth.items()))
    for kind in args.kinds:
        kind_overrides = [*overrides, f"sampler.kind={kind}"]
        config = cfg.load_config(args.config, kind_overrides)
        model = workflow.build_model(config)
        if data is None and config.data.source == "file":
            data = workflow.obtain_data(config, model).data
        elif data is None:
            data = np.asarray(model.sample(seed=stateless_seed(config.data.seed))["data"])
        if not rows:
            s = config.sampler
            print(
                f"{Path(args.config).name} at {'x'.join(map(str, config.grid.shape))}, "
                f"{s.num_chains} chains, {s.num_burnin_steps} + {s.num_results} steps, "
                f"{config.precision}, XLA; TF {tf.__version__}. Gradients: all chains, after "
                "warm-up; min ESS over every sampled parameter and every coordinate of "
                "delta's orthonormal modes.",
                flush=True,
            )
        for seed in args.seeds:
            for pre in args.preconditioners:
                r = run_row(args.config, kind_overrides, model, data, pre, seed, args.field_thin)
                rows[(kind, seed, pre)] = r
                ess = " ".join(f"{n} {v:.0f}" for n, v in r["param_ess"].items())
                print(
                    f"{kind:>9} seed {seed} {pre:>12} | warm-up {r['warmup_grads']:>7d} "
                    f"step {r['step_size']:.3f} | grads {r['grads']:>7d} | ESS {ess} | "
                    f"field min {r['field_min_ess']:.0f} | grads/min-ESS "
                    f"{r['grads_per_min_ess']:.1f} | {r['seconds']:.0f} s"
                    + (
                        ""
                        if r["energy_var_per_dim"] is None
                        else f" | Var[dE]/d {r['energy_var_per_dim']:.2g}"
                    ),
                    flush=True,
                )
                print(
                    f"{'':>9} posterior mean (sd): "
                    + ", ".join(
                        f"{n} {m:.3f} ({r['param_sd'][n]:.3f})" for n, m in r["param_mean"].items()
                    ),
                    flush=True,
                )
                if r["dense_factor"] is not None:
                    f = r["dense_factor"]
                    corr = f @ f.T
                    off = corr[np.triu_indices_from(corr, 1)]
                    source = "last window's" if pre == "dense_params" else "fixed block's"
                    print(
                        f"{'':>9} {source} correlation: max |r| {np.max(np.abs(off)):.2f}",
                        flush=True,
                    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
