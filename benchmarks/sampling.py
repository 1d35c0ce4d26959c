"""Sampler efficiency on the 64³ Gaussian field model, side by side in one process.

Run: ``.venv/bin/python benchmarks/sampling.py [--n 64] [--results 200]`` (part of
``make bench``). For each kernel x preconditioner, unmasked and with a 20% slab
mask, it prints:

* ms per gradient inside the compiled sampler / ms per standalone value+grad of the
  same batch of chains (targets: <= 1.1 HMC, <= 1.25 NUTS);
* gradient evaluations per min-ESS over every latent coordinate (every Fourier mode's
  real and imaginary part) -- target <= 25 unmasked with the posterior metric;
* mean leapfrogs per iteration; and the process's peak RSS at the end.

It also measures TFP NUTS's U-turn resonance on the whitened posterior: mean
leapfrogs per iteration at fixed step sizes.

``--masks slab --kinds fieldnuts --metrics prior posterior --no-resonance --n 32`` is
the default-preconditioner comparison of issue 27 (masked data): each kernel runs
with each listed preconditioner on the same model, data and start, and the table adds
the median ESS, the median ESS of the lowest k-bin (the largest scales, where a mask
hurts mixing most) and gradients per median-ESS.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from fieldhmc import models  # noqa: E402
from fieldhmc.diagnostics import ess_bulk  # noqa: E402
from fieldhmc.samplers import (  # noqa: E402
    KINDS,
    FieldOutputs,
    MemorySink,
    Sampler,
    SamplerSettings,
    stateless_seed,
)


def build(n: int, masked: bool, likelihood: str = "gaussian"):
    grid = models.Grid((n, n, n), 100.0 * n / 32)
    mask = models.make_mask(grid, "slab", 0.2, seed=1) if masked else None
    power = models.PowerLaw(1000.0, -1.5, 0.1)
    if likelihood == "poisson":  # the lognormal_poisson_64.yaml density, 2 counts per voxel
        model = models.LognormalPoissonModel(grid, power, 2.0, mask)
    else:
        model = models.GaussianFieldModel(grid, power, sigma=2.0, mask=mask)
    data = np.asarray(model.sample(seed=stateless_seed(3))["data"])
    return model, data


def standalone_ms_per_gradient(model, data, chains: int, repeats: int = 20) -> float:
    target = model.target_log_prob_fn(data)
    x = tf.constant(np.asarray(model.init_latents("prior", chains, seed=stateless_seed(0))[0]))

    @tf.function(jit_compile=True, autograph=False)
    def value_and_grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            lp = tf.cast(target(x), tf.float32)
        return lp, tape.gradient(lp, x)

    for _ in range(3):
        [t.numpy() for t in value_and_grad(x)]
    t0 = time.perf_counter()
    for _ in range(repeats):
        [t.numpy() for t in value_and_grad(x)]
    return 1e3 * (time.perf_counter() - t0) / repeats


def run_one(
    model,
    data,
    kind,
    preconditioner,
    args,
    step_size=None,
    burnin=None,
    results=None,
    keep_fields=True,
):
    chains = args.chains
    settings = SamplerSettings(
        kind=kind,
        num_chains=chains,
        num_burnin_steps=args.burnin if burnin is None else burnin,
        num_results=results or args.results,
        num_leapfrog_steps=args.leapfrog,
        jitter_leapfrog=True,
        max_tree_depth=args.max_depth,
        target_accept_prob=getattr(args, "target_accept", None),  # None: the kind's default
        step_size=step_size or 0.1,
        chunk_size=50,
        field_thin=1,
        seed=getattr(args, "seed", 5),
    )
    scales = [np.ones(model.grid.grid_shape, np.float32)]
    if preconditioner == "posterior":
        scales = [(1.0 / np.sqrt(model.posterior_precision_diag(data))).astype(np.float32)]
    elif preconditioner == "prior":  # the workflow's "prior": identity when non-centred
        scales = [(1.0 / np.sqrt(model.prior_precision_diag())).astype(np.float32)]
    outputs = FieldOutputs(
        field_fn=lambda v: v,
        store_fields=keep_fields,
        power_fn=lambda v: tf.zeros([tf.shape(v)[0], 1], v.dtype),
    )
    sampler = Sampler(model.target_log_prob_fn(data), settings, ["field"], scales, outputs)
    init = [np.asarray(model.init_latents("prior", chains, seed=stateless_seed(1))[0])]
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as d:
        summary = sampler.run(sink, Path(d), init, progress=False)
    batched = max(summary.sampling_batched_gradients, 1)
    out = {
        "ms_per_grad": 1e3 * summary.sampling_seconds / batched,
        "leapfrogs": batched / settings.num_results,
        "step_size": float(np.mean(sink.traces[-1]["step_size"])) if sink.traces else float("nan"),
    }
    if keep_fields:
        draws = sink.stacked_fields()  # draw, chain, ...
        post = np.moveaxis(draws, 0, 1).reshape(chains, draws.shape[0], -1)
        ess = ess_bulk(post)
        out["min_ess"] = float(np.min(ess))
        out["median_ess"] = float(np.median(ess))
        # Gradient evaluations of all chains (post warm-up) per effective sample.
        grads = sum(int(t["n_steps"].sum()) for t in sink.traces)
        out["grads_per_ess"] = grads / out["min_ess"]
        out["grads_per_median_ess"] = grads / out["median_ess"]
        out["lowest_k_median_ess"] = lowest_kbin_median(model, ess)
    return out


def lowest_kbin_median(model, ess: np.ndarray) -> float:
    """Median bulk ESS of the latent coordinates in the lowest |k| bin (k = 0 excluded).

    Each latent coordinate is the real or imaginary part of one Fourier mode
    (``model.packing.mode_of_real``), so its ESS is that mode part's ESS."""
    kbin = model.grid.kbins().index.reshape(-1)[np.asarray(model.packing.mode_of_real)]
    return float(np.median(ess.reshape(-1)[kbin == 0]))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--burnin", type=int, default=200)
    parser.add_argument("--results", type=int, default=200)
    parser.add_argument("--kinds", nargs="+", default=[k for k in KINDS if k != "snaper"])
    parser.add_argument(
        "--leapfrog",
        type=int,
        default=32,
        help="HMC: jittered uniformly in [1, L] (mean trajectory ~ pi/2 at 64³)",
    )
    parser.add_argument(
        "--max-depth",
        type=int,
        default=8,
        help="NUTS kinds (TFP's resonates: uncapped it runs for hours)",
    )
    parser.add_argument("--masks", nargs="+", choices=["none", "slab"], default=["none", "slab"])
    parser.add_argument(
        "--metrics",
        nargs="+",
        choices=["identity", "prior", "posterior"],
        help="every kernel with each of these preconditioners (default: the posterior "
        "metric for every kernel plus identity HMC; masked, hmc and fieldnuts only)",
    )
    parser.add_argument("--no-resonance", action="store_true", help="skip the resonance table")
    parser.add_argument("--seed", type=int, default=5, help="sampler seed (data and start fixed)")
    parser.add_argument(
        "--likelihood",
        choices=["gaussian", "poisson"],
        default="gaussian",
        help="gaussian (sigma 2) or lognormal Poisson counts (nbar 2) for the tables",
    )
    args = parser.parse_args(argv)
    print(
        f"{args.n}³ {args.likelihood} model, {args.chains} chains, {args.burnin} warm-up + "
        f"{args.results} draws, float32, XLA; TF {tf.__version__}"
    )
    header = (
        f"{'mask':>8} {'kernel':>9} {'metric':>9} | {'base':>6} {'ms/grad':>7} {'ratio':>6} "
        f"{'leapfrog/it':>11} {'min ESS':>8} {'grads/ESS':>9} {'med ESS':>8} "
        f"{'low-k med':>9} {'grads/med':>9}"
    )
    results = {}
    for masked in [m == "slab" for m in args.masks]:
        model, data = build(args.n, masked, args.likelihood)
        print(
            f"\n{'masked 20%' if masked else 'unmasked'}; 'base' is a standalone value+grad "
            f"of the same {args.chains} chains, timed just before and after each run"
        )
        print(header)
        print("-" * len(header))
        if args.metrics:
            combos = [(k, m) for k in args.kinds for m in args.metrics]
        else:
            combos = [(k, "posterior") for k in args.kinds] + [("hmc", "identity")]
            if masked:
                combos = [c for c in combos if c[0] in ("hmc", "fieldnuts")]
        for kind, metric in combos:
            if kind not in args.kinds:
                continue
            before = standalone_ms_per_gradient(model, data, args.chains)
            r = run_one(model, data, kind, metric, args)
            base = 0.5 * (before + standalone_ms_per_gradient(model, data, args.chains))
            results[("slab" if masked else "none", kind, metric)] = r
            print(
                f"{'20% slab' if masked else 'none':>8} {kind:>9} {metric:>9} | "
                f"{base:>6.2f} {r['ms_per_grad']:>7.2f} {r['ms_per_grad'] / base:>6.2f} "
                f"{r['leapfrogs']:>11.1f} {r['min_ess']:>8.0f} {r['grads_per_ess']:>9.1f} "
                f"{r['median_ess']:>8.0f} {r['lowest_k_median_ess']:>9.0f} "
                f"{r['grads_per_median_ess']:>9.1f}",
                flush=True,
            )
    if args.no_resonance:
        return results
    # TFP NUTS resonance on the whitened (posterior-metric) field posterior.
    model, data = build(args.n, False)
    print("\nmean leapfrogs per iteration at a fixed step size, whitened unmasked posterior")
    steps = [0.1, 0.2, 0.3, 0.4, 0.5]
    print(f"{'kernel':>9} | " + " ".join(f"{s:>6}" for s in steps))
    for kind in [k for k in ("nuts", "fieldnuts") if k in args.kinds]:
        row = []
        for eps in steps:
            r = run_one(
                model,
                data,
                kind,
                "posterior",
                args,
                step_size=eps,
                burnin=0,
                results=20,
                keep_fields=False,
            )
            row.append(r["leapfrogs"])
        print(f"{kind:>9} | " + " ".join(f"{v:>6.0f}" for v in row), flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS {rss:.0f} MB")
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
