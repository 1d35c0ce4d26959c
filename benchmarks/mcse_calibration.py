"""Are the Monte Carlo standard errors of MCLMC draws right? Replicated groups of chains.

Run: ``.venv/bin/python benchmarks/mcse_calibration.py [--grid 8] [--mask none]
[--step 0.919] [--lengths 0.97 3.88] [--chains 64] [--draws 2000] [--group 4]``.

The 8³ Gaussian field posterior of ``tests/samplers/test_posterior.py`` (``--mask slab``:
its 25% slab; ``--grid``: the same cell size on a larger grid; exact dense reference),
whitened by its posterior metric. ``--chains`` chains start at exact
posterior draws and run MCLMC at a fixed ``eps / sqrt(d)`` (``--step``) and
``L / sqrt(d)`` (each of ``--lengths``), no warm-up. The chains are split into groups of
``--group`` (a test's or a user's run). For each standardised coordinate's mean
(``x``) and mean square (``sq``, the variance's estimator), per group, the predicted
variance of the group's estimate from:

* ``bulk``: the rank-normalised bulk ESS (:func:`fieldhmc.diagnostics.ess_bulk`);
* ``mean``: the non-ranked ESS of ArviZ's ``mcse_mean`` (:func:`fieldhmc.diagnostics.mcse_mean`);
* ``batchB``: non-overlapping batch means of ``B`` draws, pooled over the group's chains;
* ``chains``: the group's chains' spread over their number
  (:func:`fieldhmc.diagnostics.variance_bias`'s noise term);

against the estimate's variance over the groups. The table prints empirical / predicted,
averaged over the coordinates: 1 is calibrated, above 1 the estimator's ESS reads high
(its MCSE too small). ``emp ESS`` is the true ESS of a group (its draws' variance over the
groups' estimates' variance).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from fieldhmc import models  # noqa: E402
from fieldhmc.diagnostics import ess_bulk, mcse_mean  # noqa: E402
from fieldhmc.samplers import (  # noqa: E402
    FieldOutputs,
    MemorySink,
    Sampler,
    SamplerSettings,
    stateless_seed,
)

ESTIMATORS = ("bulk", "mean", "batch50", "batch200", "chains")


def problem(grid: int = 8, masked: bool = False):
    """The 8³ test posterior (at ``grid``³ the same cell size; ``masked``: its 25% slab
    mask): model, data, exact mean and covariance."""
    g = models.Grid((grid,) * 3, 100.0 * grid / 8)
    mask = models.make_mask(g, "slab", 0.25, seed=3) if masked else None
    model = models.GaussianFieldModel(
        g, models.PowerLaw(1000.0, -1.5, 0.1), sigma=2.0, mask=mask, dtype=tf.float64
    )
    data = np.asarray(model.sample(seed=stateless_seed(7))["data"])
    dense = models.dense_posterior(model, data)
    return model, data, dense.mean.reshape(-1), dense.covariance


def run(model, data, mean, cov, step, length, chains, draws, seed=3) -> np.ndarray:
    """Standardised draws ``[chain, draw, d]`` of MCLMC at a fixed step and L."""
    d = mean.size
    rng = np.random.default_rng(5)
    start = mean + rng.standard_normal((chains, d)) @ np.linalg.cholesky(cov).T
    settings = SamplerSettings(
        kind="mclmc",
        num_chains=chains,
        num_burnin_steps=0,
        num_results=draws,
        step_size=step,
        trajectory_length=length,
        chunk_size=min(draws, 500),
        field_thin=1,
        seed=seed,
    )
    outputs = FieldOutputs(
        field_fn=lambda f: f, power_fn=lambda f: tf.reduce_sum(f**2, axis=[-3, -2, -1])[:, None]
    )
    sampler = Sampler(
        model.target_log_prob_fn(data),
        settings,
        ["field"],
        [1.0 / np.sqrt(model.posterior_precision_diag(data))],
        outputs,
    )
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as tmp:
        sampler.run(
            sink, Path(tmp), [start.reshape(chains, *model.grid.grid_shape)], progress=False
        )
    post = np.moveaxis(sink.stacked_fields(), 0, 1).reshape(chains, draws, d)
    return (post - mean) / np.sqrt(np.diag(cov))


def _batch_variance(q: np.ndarray, batch: int) -> np.ndarray:
    c, n = q.shape[:2]
    b = n // batch
    means = q[:, : b * batch].reshape(c * b, batch, -1).mean(axis=1)
    return means.var(axis=0, ddof=1) * batch / (c * n)  # of the mean of all c * n draws


def predicted_variance(q: np.ndarray, estimator: str) -> np.ndarray:
    """The predicted variance of the mean of each column of one group ``[chain, draw, d]``."""
    s2 = q.reshape(-1, q.shape[-1]).var(axis=0, ddof=1)
    if estimator == "bulk":
        return s2 / ess_bulk(q)
    if estimator == "mean":
        return mcse_mean(q) ** 2
    if estimator == "chains":
        return q.mean(axis=1).var(axis=0, ddof=1) / q.shape[0]
    return _batch_variance(q, int(estimator.removeprefix("batch")))


def calibrate(z: np.ndarray, group: int) -> dict[str, dict[str, float]]:
    """Empirical / predicted variance of a group's estimate, per estimator, for the mean
    (``x``) and the mean square (``sq``) of standardised draws ``z``."""
    groups = z.shape[0] // group
    out = {}
    for name, q in (("x", z), ("sq", z**2)):
        parts = [q[g * group : (g + 1) * group] for g in range(groups)]
        empirical = np.stack([p.mean(axis=(0, 1)) for p in parts]).var(axis=0, ddof=1)
        row = {
            e: float(np.mean(empirical) / np.mean([predicted_variance(p, e) for p in parts]))
            for e in ESTIMATORS
        }
        row["emp_ess"] = float(np.mean(q.reshape(-1, q.shape[-1]).var(axis=0)) / np.mean(empirical))
        out[name] = row
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--grid", type=int, default=8)
    p.add_argument("--mask", choices=["none", "slab"], default="none")
    p.add_argument("--step", type=float, default=0.919, help="eps / sqrt(d)")
    p.add_argument("--lengths", type=float, nargs="+", default=[0.97, 3.88], help="L / sqrt(d)")
    p.add_argument("--chains", type=int, default=64)
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args(argv)
    if args.chains < 2 * args.group or args.group < 2:
        p.error("--chains must hold at least two groups of at least 2 chains")
    model, data, mean, cov = problem(args.grid, args.mask == "slab")
    print(
        f"{args.grid}³ Gaussian posterior ({args.mask}), mclmc at eps/sqrt(d) {args.step},"
        f" {args.chains} chains x {args.draws} draws from exact draws, groups of {args.group};"
        " empirical / predicted variance of a group's estimate"
        " (1: calibrated; above 1 the ESS reads high)"
    )
    print(
        f"{'L/√d':>6} {'':>3} | " + " ".join(f"{e:>8}" for e in ESTIMATORS) + f" | {'emp ESS':>8}"
    )
    results = {}
    for length in args.lengths:
        t0 = time.perf_counter()
        z = run(model, data, mean, cov, args.step, length, args.chains, args.draws, args.seed)
        res = calibrate(z, args.group)
        results[length] = res
        for name, row in res.items():
            print(
                f"{length:>6.2f} {name:>3} | "
                + " ".join(f"{row[e]:>8.3f}" for e in ESTIMATORS)
                + f" | {row['emp_ess']:>8.0f}",
                flush=True,
            )
        print(
            f"       ({time.perf_counter() - t0:.0f} s;"
            f" a group holds {args.group * args.draws} draws)"
        )
    return results


if __name__ == "__main__":
    main()
