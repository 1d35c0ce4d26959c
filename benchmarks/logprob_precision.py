"""Float32 vs float64 accumulation of a log density over a 256^3 grid.

The Metropolis-Hastings log accept ratio is a difference of two log densities,
each a sum of N = n^3 per-voxel terms. This script measures, against exact
references, the error of

* ``f32 reduce``: float32 terms summed by ``tf.reduce_sum`` in float32;
* ``f64 reduce``: the same float32 terms cast to float64 and summed;
* ``f64 blocked``: float32 sums of 16 consecutive terms, cast to float64 and summed
  (what :func:`fieldhmc.models.reduce_sum_float64` does, and with it the model's
  ``target_log_prob_fn`` in the ``model`` experiment);

for the log density itself and for the difference between two nearby states
(as after one HMC trajectory). Two experiments:

1. ``terms``: Gaussian log-likelihood terms :math:`-r^2/2`, ``r ~ N(0, 1)``, state
   B = A + 1e-3 noise; the exact reference is ``math.fsum`` of the float64 terms.
2. ``model`` (``--model``): a float32 :class:`GaussianFieldModel` at n^3, its
   ``target_log_prob_fn`` (float64 reduction) and a float32-reduced version of the
   same terms, against the float64 model at the same latents.

Usage::

    python benchmarks/logprob_precision.py            # 256^3, both experiments
    python benchmarks/logprob_precision.py --n 64 --no-model
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import tensorflow as tf


def _terms_experiment(n: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    r_a = rng.standard_normal(n**3)
    r_b = r_a + 1e-3 * rng.standard_normal(n**3)
    out = {}
    exact = {}
    t32 = {}
    for name, r in (("a", r_a), ("b", r_b)):
        exact[name] = math.fsum(-0.5 * r * r)
        r32 = tf.constant(r, tf.float32)
        t32[name] = -0.5 * tf.square(r32)
    f32 = {k: float(tf.reduce_sum(v)) for k, v in t32.items()}
    f64 = {k: float(tf.reduce_sum(tf.cast(v, tf.float64))) for k, v in t32.items()}
    d_exact = exact["b"] - exact["a"]
    out["log_prob"] = exact["a"]
    out["delta_exact"] = d_exact
    out["f32_reduce_abs_err"] = abs(f32["a"] - exact["a"])
    out["f64_reduce_abs_err"] = abs(f64["a"] - exact["a"])
    out["f32_reduce_delta_err"] = abs((f32["b"] - f32["a"]) - d_exact)
    out["f64_reduce_delta_err"] = abs((f64["b"] - f64["a"]) - d_exact)
    # pure reduction error: against the exact sum of the (float32) terms themselves
    exact32 = math.fsum(t32["a"].numpy().astype(np.float64))
    out["f32_reduce_err_vs_f32_terms"] = abs(f32["a"] - exact32)
    out["f64_reduce_err_vs_f32_terms"] = abs(f64["a"] - exact32)
    # what the models do: float32 sums of BLOCK consecutive terms, then float64
    from fieldhmc.models.reduction import reduce_sum_float64

    blk = {k: float(reduce_sum_float64(v, event_ndims=1)) for k, v in t32.items()}
    out["f64_blocked_abs_err"] = abs(blk["a"] - exact["a"])
    out["f64_blocked_delta_err"] = abs((blk["b"] - blk["a"]) - d_exact)
    out["f64_blocked_err_vs_f32_terms"] = abs(blk["a"] - exact32)
    out["float32_spacing_at_total"] = float(abs(np.spacing(np.float32(exact["a"]))))
    return out


def _model_experiment(n: int, seed: int) -> dict[str, float]:
    from fieldhmc.models import GaussianFieldModel, Grid, PowerLaw

    grid = Grid((n, n, n), 4.0 * n)
    power = PowerLaw(2000.0, -1.5, 0.1)
    m32 = GaussianFieldModel(grid, power, 0.5, dtype=tf.float32)
    m64 = GaussianFieldModel(grid, power, 0.5, dtype=tf.float64)
    truth = m64.sample(seed=[seed, 0])
    data = truth["data"].numpy()
    v_a = truth["field"].numpy().astype(np.float32).astype(np.float64)
    rng = np.random.default_rng(seed)
    v_b = (v_a + 1e-3 * rng.standard_normal(v_a.shape)).astype(np.float32).astype(np.float64)

    t32 = m32.target_log_prob_fn(data)
    t64 = m64.target_log_prob_fn(data)
    d32 = tf.constant(data, tf.float32)

    def f32_reduced(v):
        # the same terms as target_log_prob_fn, but reduced in float32
        x = tf.constant(v, tf.float32)
        delta = m32.field_from_latents(x)
        prior = -0.5 * tf.reduce_sum(tf.square(x))
        lik = -0.5 * tf.reduce_sum(tf.square(d32 - delta)) / 0.25
        return float(prior + lik)

    out = {}
    start = time.perf_counter()
    ref = {k: float(t64(tf.constant(v))) for k, v in (("a", v_a), ("b", v_b))}
    out["seconds_f64_model"] = (time.perf_counter() - start) / 2
    start = time.perf_counter()
    f64r = {k: float(t32(tf.constant(v, tf.float32))) for k, v in (("a", v_a), ("b", v_b))}
    out["seconds_f32_model"] = (time.perf_counter() - start) / 2
    f32r = {k: f32_reduced(v) for k, v in (("a", v_a), ("b", v_b))}
    # f32_reduced omits the constants; compare differences (constants cancel) and totals
    const = ref["a"] - (
        -0.5 * np.sum(v_a**2)
        - 0.5 * np.sum((data - m64.field_from_latents(tf.constant(v_a)).numpy()) ** 2) / 0.25
    )
    d_ref = ref["b"] - ref["a"]
    out["log_prob"] = ref["a"]
    out["delta_exact"] = d_ref
    out["f64_reduce_abs_err"] = abs(f64r["a"] - ref["a"])
    out["f32_reduce_abs_err"] = abs(f32r["a"] + const - ref["a"])
    out["f64_reduce_delta_err"] = abs((f64r["b"] - f64r["a"]) - d_ref)
    out["f32_reduce_delta_err"] = abs((f32r["b"] - f32r["a"]) - d_ref)
    return out


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="grid side (default 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-model", action="store_true", help="skip the model experiment")
    args = parser.parse_args(argv)
    results = {"terms": _terms_experiment(args.n, args.seed)}
    if not args.no_model:
        results["model"] = _model_experiment(args.n, args.seed)
    for name, res in results.items():
        print(f"[{name}] n = {args.n}^3")
        for key, value in res.items():
            print(f"  {key:28s} {value: .6g}")
    return results


if __name__ == "__main__":
    main()
