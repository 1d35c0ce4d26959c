"""Compare a sampler run with the analytic (Wiener-filter) posterior of its model.

For Gaussian-likelihood models with fixed hyperparameters the posterior is Gaussian
and known: per-mode means and variances from :func:`fieldhmc.models.wiener_posterior`.
This runs the sampler and prints MCSE-scaled z-scores of the sampled mode means and
variances against it, per k-bin: a correct sampler gives z ~ N(0, 1).

    python scripts/compare_wiener.py configs/quickstart.yaml --out runs/cmp \
        --set outputs.field_thin=1
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/quickstart.yaml")
    parser.add_argument("--out", required=True, help="new run directory")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from fieldhmc.cli import tf_environment

    tf_environment()  # before TensorFlow starts: freed buffers go back to the system

    from fieldhmc import config as cfg

    config = cfg.load_config(args.config, args.set)
    if config.model.likelihood.kind == "lognormal_poisson":
        parser.error("the Poisson model has no analytic posterior")
    if config.model.hyperparameters.is_any_sampled:
        parser.error("the analytic posterior needs fixed hyperparameters")
    if not config.outputs.store_fields:
        parser.error("the comparison needs stored field draws (outputs.store_fields: true)")

    import numpy as np

    from fieldhmc import diagnostics, models, workflow
    from fieldhmc.samplers import read_fields

    run = workflow.run(config, Path(args.out), progress=False)
    model = workflow.build_model(
        config, mask=run.load_data("mask"), sigma_map=run.load_data("sigma_map")
    )
    ref = models.wiener_posterior(model, np.load(run.data("data")))
    if ref.mode_variance is None:
        parser.error("grid too large for exact per-mode variances; shrink grid.shape")
    grid = model.grid
    draws = np.swapaxes(read_fields(run.fields)["draws"], 0, 1).astype(np.float64)
    scale = grid.volume / grid.num_cells  # continuum modes: (V/N) rfft
    modes = scale * np.fft.rfftn(draws, axes=(-3, -2, -1))
    mean = modes.mean(axis=(0, 1))
    var = (np.abs(modes - mean) ** 2).mean(axis=(0, 1)) / grid.volume
    ess = np.fmin(diagnostics.ess_bulk(modes.real), diagnostics.ess_bulk(modes.imag))
    ref_var = ref.mode_variance
    with np.errstate(divide="ignore", invalid="ignore"):  # k = 0 has zero variance
        # E|mean - ref|^2 = V * mode_variance / ESS, so E[z_mean^2] = 1.
        z_mean = np.abs(mean - ref.mean_modes) / np.sqrt(grid.volume * ref_var / ess)
        # |d_k|^2 has relative variance 1 for a complex mode, 2 for a real one.
        is_real = np.all(modes.imag == 0, axis=(0, 1))
        ess_sq = diagnostics.ess_bulk(np.abs(modes - mean) ** 2)
        z_var = (var - ref_var) / (ref_var * np.sqrt(np.where(is_real, 2.0, 1.0) / ess_sq))
    kbins = grid.kbins()
    print(f"\n{'bin':>3} {'k [h/Mpc]':>9} {'modes':>5} {'rms z(mean)':>11} {'rms z(var)':>10}")
    for b in range(kbins.num_bins):
        sel = kbins.index == b
        if sel.any():
            print(
                f"{b:>3} {kbins.k[b]:>9.3f} {int(sel.sum()):>5} "
                f"{np.sqrt(np.mean(z_mean[sel] ** 2)):>11.2f} "
                f"{np.sqrt(np.mean(z_var[sel] ** 2)):>10.2f}"
            )
    sel = kbins.index >= 0
    print(
        f"\nall modes: rms z(mean) {np.sqrt(np.mean(z_mean[sel] ** 2)):.2f}, "
        f"rms z(var) {np.sqrt(np.mean(z_var[sel] ** 2)):.2f} (about 1 for a correct sampler; "
        f"field draws are thinned by {config.outputs.field_thin})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
