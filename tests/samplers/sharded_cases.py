"""Sharded target, bare sharded HMC and driver-run sharded HMC for ``test_sharded.py``.

``python -m tests.samplers.sharded_cases [--slow]`` makes 4 virtual CPU devices and
prints one JSON line of results.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import numpy as np

GRID = (8, 8, 8)


def _problem(masked: bool, dtype):
    import tensorflow as tf

    from fieldhmc import models
    from fieldhmc.seeds import stateless_seed

    grid = models.Grid(GRID, 100.0)
    power = models.PowerLaw(1000.0, -1.5, 0.1)
    mask = models.make_mask(grid, "slab", 0.25, seed=3) if masked else None
    model = models.GaussianFieldModel(grid, power, sigma=2.0, mask=mask, dtype=tf.as_dtype(dtype))
    data = np.asarray(model.sample(seed=stateless_seed(7))["data"])
    return model, data


def target_cases(mesh):
    """Sharded log density and gradient vs the model's own, at x(xi)."""
    import tensorflow as tf

    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.ops import sharded as sh

    out = {}
    for masked, dtype in ((False, "float32"), (True, "float64")):
        model, data = _problem(masked, dtype)
        xi = np.random.default_rng(1).standard_normal((3, *GRID))
        target = ShardedGaussianTarget(model, data, mesh)
        lp, grad = tf.function(target.value_and_gradient, autograph=False)(target.shard(xi))
        lp, grad = sh.gather(lp), sh.gather(grad)
        # The model's own target at x(xi) (float64 model, same data), and its
        # gradient mapped back to xi by the (orthogonal) inverse map.
        model64, _ = _problem(masked, "float64")
        x = tf.constant(target.model_latent(xi))
        with tf.GradientTape() as tape:
            tape.watch(x)
            ref = model64.target_log_prob_fn(data)(x)
        gx = tape.gradient(ref, x).numpy()
        ref_grad = target.latent_from_model(gx)
        out[f"{'masked' if masked else 'unmasked'}-{dtype}"] = {
            "lp_rel": float(np.max(np.abs(lp - ref.numpy()) / np.abs(ref.numpy()))),
            "grad_rel": float(np.max(np.abs(grad - ref_grad)) / np.max(np.abs(ref_grad))),
            "lp_dtype": str(lp.dtype),
        }
    out["masked-float64-posterior"] = _preconditioned_target_case(mesh)
    return out


def _preconditioned_target_case(mesh):
    """The posterior-preconditioned target at v == the identity target at xi = A v, and
    its gradient == A (the identity target's gradient), A = irfft(c_k rfft(.)) on the
    host in NumPy (an independent reference for the map)."""
    import tensorflow as tf

    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.ops import sharded as sh

    model, data = _problem(True, "float64")
    c = 1.0 / np.sqrt(1.0 + model.signal_variance_np() * model.noise_precision_mean)

    def apply_a(v):
        modes = np.fft.rfftn(v, axes=(-3, -2, -1), norm="ortho") * c
        return np.fft.irfftn(modes, s=GRID, axes=(-3, -2, -1), norm="ortho")

    v = np.random.default_rng(2).standard_normal((3, *GRID))
    pre = ShardedGaussianTarget(model, data, mesh, preconditioner="posterior")
    lp, grad = tf.function(pre.value_and_gradient, autograph=False)(pre.shard(v))
    lp, grad = sh.gather(lp), sh.gather(grad)
    plain = ShardedGaussianTarget(model, data, None)
    ref, ref_grad = plain.value_and_gradient(tf.constant(apply_a(v)))
    ref_grad = apply_a(ref_grad.numpy())
    # the model latent of v is x(A v)
    x_diff = np.max(np.abs(pre.model_latent(v) - plain.model_latent(apply_a(v))))
    back = np.max(np.abs(pre.latent_from_model(pre.model_latent(v)) - v))
    return {
        "lp_rel": float(np.max(np.abs(lp - ref.numpy()) / np.abs(ref.numpy()))),
        "grad_rel": float(np.max(np.abs(grad - ref_grad)) / np.max(np.abs(ref_grad))),
        "lp_dtype": str(lp.dtype),
        "latent_diff": float(x_diff),
        "roundtrip_diff": float(back),
        "metric_min": float(c.min()),
    }


def _hmc(model, data, mesh, num_results, num_burnin, seed, step_size, steps, chains=4):
    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.ops import sharded as sh
    from fieldhmc.samplers.sharded import run_sharded_hmc

    target = ShardedGaussianTarget(model, data, mesh)
    init = np.random.default_rng(seed).standard_normal((chains, *GRID))
    t0 = time.perf_counter()
    res = run_sharded_hmc(
        target.value_and_gradient,
        target.shard(init),
        step_size=step_size,
        num_leapfrog_steps=steps,
        num_results=num_results,
        num_burnin_steps=num_burnin,
        seed=seed,
        mesh=mesh,
        record_fn=(lambda x: sh.gather(x)) if mesh is not None else (lambda x: x.numpy()),
    )
    return res, np.stack(res.records), time.perf_counter() - t0


def reproducibility(mesh, dtypes=("float64",), num_results=6, steps=3):
    out = {}
    for dtype in dtypes:
        model, data = _problem(True, dtype)
        r1, d1, t1 = _hmc(model, data, None, num_results, 0, 5, 0.4, steps)
        r4, d4, t4 = _hmc(model, data, mesh, num_results, 0, 5, 0.4, steps)
        out[dtype] = {
            "max_draw_diff": float(np.max(np.abs(d1 - d4))),
            "draw_scale": float(np.max(np.abs(d1))),
            "same_accepts": bool(np.array_equal(r1.is_accepted, r4.is_accepted)),
            "accept_rate": float(r1.is_accepted.mean()),
            "max_lp_diff": float(np.max(np.abs(r1.target_log_prob - r4.target_log_prob))),
            "seconds_1dev": t1,
            "seconds_4dev": t4,
        }
    return out


def _wiener_z(post, mean, var) -> dict:
    """z-scores of the draws' means and variances against the exact posterior's, an
    MCSE-scaled chi-square over all of them (two-sided p); ``post`` ``[chains, draws, d]``."""
    from scipy import stats

    from fieldhmc.diagnostics import ess_bulk

    z_mean = (post.mean(axis=(0, 1)) - mean) / np.sqrt(var / ess_bulk(post))
    sq = (post - mean) ** 2
    z_var = (sq.mean(axis=(0, 1)) - var) / (var * np.sqrt(2.0 / ess_bulk(sq)))
    z = np.concatenate([z_mean, z_var])
    chi2 = float(np.sum(z**2))
    p = 2 * min(stats.chi2.sf(chi2, z.size), stats.chi2.cdf(chi2, z.size))
    return {"p": float(p), "max_abs_z": float(np.max(np.abs(z))), "num_z": int(z.size)}


def wiener_ztest(mesh, masked: bool, num_results: int):
    """MCSE-scaled z-scores of every latent's posterior mean and variance."""

    from fieldhmc import models
    from fieldhmc.models.sharded import ShardedGaussianTarget

    model, data = _problem(masked, "float64")
    dense = models.dense_posterior(model, data)
    res, draws, secs = _hmc(model, data, mesh, num_results, 50, 11, 0.3, 5)
    target = ShardedGaussianTarget(model, data, None)
    x = target.model_latent(draws)  # [draws, chains, *grid]: the model's latent
    post = np.moveaxis(x, 0, 1).reshape(x.shape[1], x.shape[0], -1)
    mean, var = dense.mean.reshape(-1), np.diag(dense.covariance)
    return {
        **_wiener_z(post, mean, var),
        "accept_rate": float(res.is_accepted.mean()),
        "seconds": secs,
    }


def _settings(num_burnin, num_results, chunk_size, steps, step_size, seed, field_thin=1):
    from fieldhmc.samplers import SamplerSettings

    return SamplerSettings(
        kind="hmc",
        num_chains=4,
        num_burnin_steps=num_burnin,
        num_results=num_results,
        num_leapfrog_steps=steps,
        step_size=step_size,
        chunk_size=chunk_size,
        field_thin=field_thin,
        seed=seed,
    )


def _driver(model, data, mesh, settings, tracked=2, preconditioner="identity"):
    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.samplers.sharded import ShardedFieldOutputs, ShardedSampler
    from fieldhmc.workflow import tracked_mode_indices

    grid = model.grid
    outputs = ShardedFieldOutputs(grid, grid.kbins(), tracked_mode_indices(grid, tracked), True)
    target = ShardedGaussianTarget(model, data, mesh, preconditioner=preconditioner)
    return ShardedSampler(target, settings, outputs)


def _driver_run(sampler, directory, init=None, resume=False, max_chunks=None):
    from fieldhmc.samplers import H5TraceSink, read_fields, read_traces

    directory.mkdir(parents=True, exist_ok=True)
    sink = H5TraceSink(directory / "traces.h5", directory / "fields.h5")
    t0 = time.perf_counter()
    summary = sampler.run(
        sink,
        directory / "checkpoint",
        init,
        resume=resume,
        progress=False,
        max_chunks=max_chunks,
    )
    seconds = time.perf_counter() - t0
    if not summary.complete:
        return summary, None, None, seconds
    traces = read_traces(directory / "traces.h5")
    return summary, traces, read_fields(directory / "fields.h5"), seconds


def driver_cases(mesh):
    """The driver's sharded run: 4 devices vs 1 (plain tensors) vs the bare loop; resume."""
    import tempfile
    from pathlib import Path

    import tensorflow as tf

    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.samplers.sharded import run_sharded_hmc

    model, data = _problem(True, "float64")
    # 4 warm-up steps adapt the step size (dual averaging), 4 draws; chunks of 3.
    settings = _settings(4, 4, 3, 3, 0.1, 5, field_thin=2)
    init = [np.random.default_rng(5).standard_normal((4, *GRID))]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        one = _driver(model, data, None, settings)
        s1, t1, f1, _ = _driver_run(one, tmp / "one", init)
        four = _driver(model, data, mesh, settings)
        s4, t4, f4, _ = _driver_run(four, tmp / "four", init)
        # Killed in warm-up (step 3: the step size still adapting), resumed and killed
        # again in sampling (step 6: two draws and one field stored), resumed to the end;
        # each resume reads only the (gathered, re-sharded) checkpoint.
        d = tmp / "resumed"
        first, _, _, _ = _driver_run(four, d, init, max_chunks=1)
        second, _, _, _ = _driver_run(four, d, resume=True, max_chunks=2)
        sr, tr, fr, _ = _driver_run(four, d, resume=True)
        # Without warm-up (nothing adapts) the driver's chain is the bare loop's.
        s0, t0, _, _ = _driver_run(
            _driver(model, data, None, _settings(0, 3, 2, 3, 0.4, 5)), tmp / "fixed", init
        )
    bare = run_sharded_hmc(
        ShardedGaussianTarget(model, data, None).value_and_gradient,
        tf.constant(init[0]),
        step_size=0.4,
        num_leapfrog_steps=3,
        num_results=3,
        seed=5,
    )
    scale = float(np.max(np.abs(s1.latent_state[0])))
    names = sorted(t1)
    out["repro"] = {
        "names": names,
        "num_draws": int(t4["lp"].shape[0]),
        "num_fields": int(f4["draws"].shape[0]),
        "accept_rate": float(t1["is_accepted"].mean()),
        "same_accepts": bool(np.array_equal(t1["is_accepted"], t4["is_accepted"])),
        "max_state_diff": float(np.max(np.abs(s1.latent_state[0] - s4.latent_state[0]))),
        "state_scale": scale,
        "max_lp_diff": float(np.max(np.abs(t1["lp"] - t4["lp"]))),
        "max_power_rel": float(np.max(np.abs(t1["power"] - t4["power"]) / np.abs(t1["power"]))),
        "max_tracked_diff": float(
            max(np.max(np.abs(t1[k] - t4[k])) for k in ("tracked_real", "tracked_imag"))
        ),
        "max_field_diff": float(np.max(np.abs(f1["draws"] - f4["draws"]))),
        "max_mean_diff": float(np.max(np.abs(s1.field_mean - s4.field_mean))),
        "step_sizes": [float(v) for v in t1["step_size"][:, 0]],
        "bare_accept_rate": float(bare.is_accepted.mean()),
        "bare_state_diff": float(np.max(np.abs(bare.state.numpy() - s0.latent_state[0]))),
        "bare_lp_diff": float(np.max(np.abs(bare.target_log_prob - t0["lp"]))),
    }
    out["resume"] = {
        "interrupted_steps": [int(first.step), int(second.step)],
        "complete": bool(sr.complete),
        "traces_identical": all(np.array_equal(t4[k], tr[k]) for k in t4)
        and sorted(tr) == sorted(t4),
        "fields_identical": all(np.array_equal(f4[k], fr[k]) for k in f4),
        "state_identical": bool(np.array_equal(s4.latent_state[0], sr.latent_state[0])),
        "num_draws": int(tr["lp"].shape[0]),
    }
    return out


def _micro_settings(kind, num_burnin=12, num_results=4, chunk_size=5, seed=5, **kw):
    from fieldhmc.samplers import SamplerSettings

    return SamplerSettings(
        kind=kind,
        num_chains=4,
        num_burnin_steps=num_burnin,
        num_results=num_results,
        step_size=0.3,
        trajectory_length=1.0,
        chunk_size=chunk_size,
        seed=seed,
        **kw,
    )


def _memory_run(sampler, init):
    import tempfile
    from pathlib import Path

    from fieldhmc.samplers import MemorySink

    sink = MemorySink()
    with tempfile.TemporaryDirectory() as tmp:
        summary = sampler.run(sink, Path(tmp), init, progress=False)
    return summary, sink.stacked_traces()


def _max_rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.maximum(np.abs(b), 1e-300)
    return float(np.nanmax(np.abs(a - b) / scale)) if a.size else 0.0


def microcanonical_cases(mesh):
    """Sharded mclmc / mams through the driver, 12 tuning steps (every stage) + 4 draws:

    * ``repro``: 4 devices vs 1 (plain tensors), counter draws, with field outputs;
    * ``resume``: killed at steps 5 (stage 2) and 10 (stage 3 / 4), and in sampling
      (15), resumed from the gathered checkpoint each time.
    """
    import tempfile
    from pathlib import Path

    model, data = _problem(True, "float64")
    init = [np.random.default_rng(5).standard_normal((4, *GRID))]
    out = {}
    for kind in ("mclmc", "mams"):
        settings = _micro_settings(kind, field_thin=2)
        r = {}
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            t0 = time.perf_counter()
            s1, t1, f1, _ = _driver_run(_driver(model, data, None, settings), tmp / "one", init)
            four = _driver(model, data, mesh, settings)
            s4, t4, f4, _ = _driver_run(four, tmp / "four", init)
            r["seconds_repro"] = time.perf_counter() - t0
            d = tmp / "resumed"
            steps = [int(_driver_run(four, d, init, max_chunks=1)[0].step)]
            steps.append(int(_driver_run(four, d, resume=True, max_chunks=1)[0].step))
            steps.append(int(_driver_run(four, d, resume=True, max_chunks=2)[0].step))
            sr, tr, fr, _ = _driver_run(four, d, resume=True)
        scale = float(np.max(np.abs(s1.latent_state[0])))
        r["repro"] = {
            "names": sorted(t4),
            "num_draws": int(t4["lp"].shape[0]),
            "num_fields": int(f4["draws"].shape[0]),
            "same_accepts": bool(np.array_equal(t1["is_accepted"], t4["is_accepted"])),
            "same_n_steps": bool(np.array_equal(t1["n_steps"], t4["n_steps"])),
            "accept_rate": float(t1["is_accepted"].mean()),
            "n_steps": [int(v) for v in t1["n_steps"][:, 0]],
            "max_state_diff": float(np.max(np.abs(s1.latent_state[0] - s4.latent_state[0]))),
            "state_scale": scale,
            "max_lp_diff": float(np.max(np.abs(t1["lp"] - t4["lp"]))),
            "max_energy_error_diff": float(np.max(np.abs(t1["energy_error"] - t4["energy_error"]))),
            "max_power_rel": _max_rel(t4["power"], t1["power"]),
            "max_field_diff": float(np.max(np.abs(f1["draws"] - f4["draws"]))),
            "max_mean_diff": float(np.max(np.abs(s1.field_mean - s4.field_mean))),
            "field_moments_draws": int(s4.field_moments_draws),
            "tuned_1": s1.tuned,
            "tuned_4": s4.tuned,
            "step_size_rel": _max_rel(t4["step_size"], t1["step_size"]),
        }
        r["resume"] = {
            "interrupted_steps": steps,
            "complete": bool(sr.complete),
            "traces_identical": sorted(tr) == sorted(t4)
            and all(np.array_equal(t4[k], tr[k], equal_nan=True) for k in t4),
            "fields_identical": all(np.array_equal(f4[k], fr[k]) for k in f4),
            "state_identical": bool(np.array_equal(s4.latent_state[0], sr.latent_state[0])),
            "tuned_identical": sr.tuned == s4.tuned,
        }
        out[kind] = r
    out["subset_equal"] = _sharded_subset_equal(mesh)
    return out


def _sharded_subset_equal(mesh) -> bool:
    """Stage 3's coordinates picked on the mesh (segment sum) == ``mclmc._subset``."""
    import tensorflow as tf

    from fieldhmc.ops import sharded as sh
    from fieldhmc.samplers import mclmc
    from fieldhmc.samplers.sharded_mclmc import ShardedMicrocanonical

    shape = (2, 16, 16, 16)  # stride 8
    x = np.random.default_rng(0).standard_normal(shape)
    kernel = ShardedMicrocanonical(
        "mams",
        lambda v: (tf.reduce_sum(tf.cast(v, tf.float64) ** 2, axis=[1, 2, 3]), v),
        shape,
        tf.float64,
        mesh,
        step_size=0.1,
        trajectory_length=1.0,
        num_adaptation_steps=10,
    )
    got = sh.gather(kernel._subset(sh.shard(x, sh.slab_layout(mesh))))
    return bool(np.array_equal(got, mclmc._subset([tf.constant(x)], 512).numpy()))


def microcanonical_unsharded_cases():
    """Plain tensors with the unsharded kernels' Philox draws (``random="philox"``) vs the
    unsharded driver running ``fieldhmc.samplers.mclmc`` on the same target: the same
    algorithm, tuning included (12 tuning steps + 4 draws, float64)."""
    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.samplers import Sampler
    from fieldhmc.samplers.sharded import ShardedSampler

    model, data = _problem(True, "float64")
    init = [np.random.default_rng(5).standard_normal((4, *GRID))]
    out = {}
    for kind in ("mclmc", "mams"):
        settings = _micro_settings(kind, field_thin=2)
        # The same algorithm as the unsharded kernel: its own draws, on one device.
        target = ShardedGaussianTarget(model, data, None)
        t0 = time.perf_counter()
        sp, tp = _memory_run(ShardedSampler(target, settings, random="philox"), init)
        su, tu = _memory_run(Sampler(target, settings, ("field",), [np.ones(GRID)]), init)
        r = {
            "seconds": time.perf_counter() - t0,
            "same_accepts": bool(np.array_equal(tp["is_accepted"], tu["is_accepted"])),
            "same_n_steps": bool(np.array_equal(tp["n_steps"], tu["n_steps"])),
            "max_state_diff": float(np.max(np.abs(sp.latent_state[0] - su.latent_state[0]))),
            "state_scale": float(np.max(np.abs(su.latent_state[0]))),
            "max_lp_diff": float(np.max(np.abs(tp["lp"] - tu["lp"]))),
            "max_energy_error_diff": float(np.max(np.abs(tp["energy_error"] - tu["energy_error"]))),
            "step_size_rel": _max_rel(tp["step_size"], tu["step_size"]),
            "tuned_rel": {
                k: _max_rel(sp.tuned[k], su.tuned[k]) for k in ("step_size", "trajectory_length")
            },
            "tuned": su.tuned,
            "initial": {"step_size": 0.3, "trajectory_length": 1.0},
        }
        if kind == "mams":
            r["max_accept_rate_diff"] = float(
                np.max(np.abs(tp["acceptance_rate"] - tu["acceptance_rate"]))
            )
        out[kind] = r
    return out


def _latent_posterior(model, fields, num_results, chains=4):
    """The model's latents ``[chains, draws, d']`` of stored draws of delta, and the mask
    of the d' latents kept (the k = 0 mode, which delta does not see, is left out).

    The model's latent is :math:`x = \\mathrm{unpack}(\\mathrm{rfft}(\\delta)/\\sqrt{s})`
    (:meth:`ShardedGaussianTarget.model_latent` of xi).
    """
    import tensorflow as tf

    sqrt_s = np.sqrt(model.signal_variance_np())
    seen = sqrt_s > 0
    modes = np.fft.rfftn(fields["draws"], axes=(-3, -2, -1), norm="ortho")
    modes = np.where(seen, modes / np.where(seen, sqrt_s, 1.0), 0.0)
    x = model.packing.real_from_modes(tf.constant(modes)).numpy()  # [draw, chain, *grid]
    post = np.moveaxis(x, 0, 1).reshape(chains, num_results, -1)
    keep = ~np.all(post == 0.0, axis=(0, 1))  # the k = 0 latent
    return post[..., keep], keep


def _driver_draws(mesh, masked: bool, settings, preconditioner="identity"):
    import tempfile
    from pathlib import Path

    from fieldhmc import models

    model, data = _problem(masked, "float64")
    dense = models.dense_posterior(model, data)
    init = [np.random.default_rng(settings.seed).standard_normal((4, *GRID))]
    sampler = _driver(model, data, mesh, settings, preconditioner=preconditioner)
    with tempfile.TemporaryDirectory() as tmp:
        summary, traces, fields, secs = _driver_run(sampler, Path(tmp), init)
    post, keep = _latent_posterior(model, fields, settings.num_results)
    mean, var = dense.mean.reshape(-1)[keep], np.diag(dense.covariance)[keep]
    info = {
        "num_left_out": int((~keep).sum()),
        "accept_rate": float(np.nanmean(traces["acceptance_rate"]))
        if np.isfinite(traces["acceptance_rate"]).any()
        else None,
        "step_size": float(traces["step_size"][0, 0]),
        "tuned": summary.tuned,
        "gradients_per_transition": float(traces["n_steps"].mean()),
        "seconds": secs,
    }
    return post, mean, var, info


def driver_wiener_ztest(
    mesh, masked: bool, num_results: int, kind: str = "hmc", preconditioner: str = "identity"
):
    """MCSE-scaled z-scores of the posterior mean and variance of every model latent,
    from the driver-run 4-device chain's stored draws of delta (field_thin 1), vs the
    dense posterior (hmc: 50 warm-up steps, mams: 200 tuning steps)."""
    if kind == "hmc":
        settings = _settings(50, num_results, 50, 5, 0.3, 11)
    else:
        settings = _micro_settings(kind, 200, num_results, 100, seed=11, field_thin=1)
    if preconditioner == "diagonal":  # 150 warm-up steps: one slow window, 75 to 100
        settings = dataclasses.replace(settings, num_burnin_steps=150, adapt_diagonal=True)
    post, mean, var, info = _driver_draws(mesh, masked, settings, preconditioner)
    return {**_wiener_z(post, mean, var), **info}


def conservation_ztest(
    mesh, kind: str, preconditioner: str, chains: int = 256, steps: int = 3, jitter=False
):
    """Target conservation on the mesh: ``chains`` exact posterior draws (dense Wiener
    posterior, masked 8³) as the initial state, ``steps`` driver-run transitions without
    adaptation, then z-scores of every model latent's mean and variance of the final
    state against the exact posterior with the known ESS = ``chains`` (independent
    chains: no ESS estimate). A transition that does not preserve the posterior moves
    them."""
    import tempfile
    from pathlib import Path

    import tensorflow as tf
    from scipy import stats

    from fieldhmc import models
    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.samplers import SamplerSettings

    model, data = _problem(True, "float64")
    dense = models.dense_posterior(model, data)
    rng = np.random.default_rng(17)
    chol = np.linalg.cholesky(dense.covariance + 1e-12 * np.eye(dense.covariance.shape[0]))
    x = dense.mean.reshape(-1) + rng.standard_normal((chains, chol.shape[0])) @ chol.T
    target = ShardedGaussianTarget(model, data, None, preconditioner=preconditioner)
    init = [target.latent_from_model(x.reshape(chains, *GRID))]
    settings = SamplerSettings(
        kind=kind,
        num_chains=chains,
        num_burnin_steps=0,
        num_results=steps,
        num_leapfrog_steps=5,
        jitter_leapfrog=jitter,
        step_size=0.3,
        trajectory_length=1.5,
        chunk_size=steps,
        field_thin=1,
        seed=3,
    )
    with tempfile.TemporaryDirectory() as tmp:
        _, traces, fields, secs = _driver_run(
            _driver(model, data, mesh, settings, preconditioner=preconditioner), Path(tmp), init
        )
    post, keep = _latent_posterior(model, {"draws": fields["draws"][-1:]}, 1, chains)
    mean, var = dense.mean.reshape(-1)[keep], np.diag(dense.covariance)[keep]
    final = post[:, 0]  # [chains, d']
    z_mean = (final.mean(axis=0) - mean) / np.sqrt(var / chains)
    z_var = (((final - mean) ** 2).mean(axis=0) - var) / (var * np.sqrt(2.0 / chains))
    z = np.concatenate([z_mean, z_var])
    chi2 = float(np.sum(z**2))
    p = 2 * min(stats.chi2.sf(chi2, z.size), stats.chi2.cdf(chi2, z.size))
    moved = float(np.mean(np.abs(final - x[:, keep]) > 1e-8))
    del tf
    return {
        "p": float(p),
        "max_abs_z": float(np.max(np.abs(z))),
        "num_z": int(z.size),
        "accept_rate": float(np.mean(traces["is_accepted"])),
        "moved": moved,
        "n_steps": sorted({int(v) for v in traces["n_steps"][:, 0]}),
        "seconds": secs,
    }


# (loose, tight) Var[dE]/d: the identity metric on xi leaves the data-determined modes
# narrower than the rest, and 8³'s step for 1e-2 is past the integrator's stability limit
# (tuned step/sqrt(d) 1.33 at 1e-2, 1.30 at 1e-3, 0.90 at 1e-4; b^2 3.5e-4, 3.1e-4,
# 5.3e-5): the tolerance sets the step at 1e-3 and 1e-4.
SHARDED_BIAS_TOLERANCES = (1e-3, 1e-4)


def driver_mclmc_bias(mesh, masked: bool, desired_energy_var: float, num_results: int = 2000):
    """Squared bias of the posterior variances under the sharded, tuned MCLMC (4 devices,
    identity metric on xi), MC noise removed, as ``tests/samplers/test_posterior.py``'s
    ``mclmc_bias`` measures it (:func:`fieldhmc.diagnostics.variance_bias`): ``b2``, its
    standard error ``se``, the mean relative variance error ``rel``."""
    from fieldhmc.diagnostics import variance_bias

    settings = _micro_settings(
        "mclmc", 200, num_results, 500, seed=11, desired_energy_var=desired_energy_var, field_thin=1
    )
    post, mean, var, info = _driver_draws(mesh, masked, settings)
    return {**variance_bias(post, mean, var), **info}


# --- sampled hyperparameters ---------------------------------------------------------------
HYPER_SCALES = {"log_amplitude": 0.3, "index": 0.7}
# (draws, warm-up) of the exact-posterior z-tests; mclmc: more draws (cheaper transitions)
# mclmc's mean z's take batch-means MCSEs (test_conditional_posterior._z): with Geyer's
# ESS its field mean z's read underdispersed (sum z^2 293-305 for 511 at seeds 5/11/12,
# batch means 473-512; all z's 814 for 1022 at seed 11, a failure). MCLMC is not
# reversible, and Geyer's initial sequence stops at the first negative pair of its
# oscillating autocorrelation, ~1.7x under the ESS. Sum z^2 now 994/1138/1081 for 1022.
HYPER_RUNS = {"hmc": (400, 300), "mams": (300, 200), "mclmc": (1000, 200)}


def _hyper_problem(masked: bool, parametrization: str = "noncentred"):
    """The 8³ problem with log A and n sampled (Normal priors about the fiducial)."""
    import tensorflow as tf

    from fieldhmc import models
    from fieldhmc.seeds import stateless_seed

    grid = models.Grid(GRID, 100.0)
    mask = models.make_mask(grid, "slab", 0.25, seed=3) if masked else None
    model = models.GaussianFieldModel(
        grid,
        models.PowerLaw(1000.0, -1.5, 0.1),
        sigma=2.0,
        mask=mask,
        hyper_priors={"log_amplitude": (np.log(1000.0), 1.0), "index": (-1.5, 0.5)},
        parametrization=parametrization,
        dtype=tf.float64,
    )
    data = np.asarray(model.sample(seed=stateless_seed(7))["data"])
    return model, data


def _hyper_parts(target, chains, seed):
    """Random mesh-state parts about the prior: (v_logA, v_n, xi)."""
    rng = np.random.default_rng(seed)
    u = [np.log(1000.0) + 0.5 * rng.standard_normal(chains)]
    u.append(-1.5 + 0.3 * rng.standard_normal(chains))
    return target.state_from_model([*u, rng.standard_normal((chains, *GRID))])


def _against_model(target, model, data, parts, mesh, scales) -> tuple[dict, np.ndarray]:
    """The mesh target's value and gradients at ``parts`` against the model's
    ``target_log_prob_fn`` at their model latents (its gradient mapped by the chain rule:
    the hyperparameters' ``scales``, the field's orthonormal map times the metric's c_k):
    the comparison dict, and the model's log density."""
    import tensorflow as tf

    from fieldhmc.ops import fft
    from fieldhmc.samplers.reductions import host
    from fieldhmc.samplers.sharded import _ShardedCarry

    carry = _ShardedCarry(mesh, GRID)
    lp, grads = tf.function(target.value_and_gradients, autograph=False)(
        [carry.place(p) for p in parts]
    )
    lp, grads = host(lp), [host(g) for g in grads]
    latents = [tf.constant(v) for v in target.model_latents(parts)]
    with tf.GradientTape() as tape:
        tape.watch(latents)
        ref = model.target_log_prob_fn(data)(*latents)
    ref_grads = tape.gradient(ref, latents)
    names = model.hyper_names
    expected = [g.numpy() * scales[n] for n, g in zip(names, ref_grads[:-1], strict=True)]
    modes = model.packing.modes_from_real(ref_grads[-1])
    if target._metric is not None:  # d/dv = A^T d/dxi: c_k once more
        modes = modes * tf.constant(target._metric, modes.dtype)
    expected.append(fft.irfft3d(modes, fft_length=GRID, norm="ortho").numpy())
    ref = ref.numpy()
    return {
        "lp_dtype": str(lp.dtype),
        "lp_rel": float(np.max(np.abs(lp - ref) / np.abs(ref))),
        "grad_rel": [
            float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
            for a, b in zip(grads, expected, strict=True)
        ],
        "names": list(target.latent_names),
    }, ref


def hyper_target_cases(mesh):
    """The mesh target with sampled (log A, n) on 4 devices == the model's
    ``target_log_prob_fn`` at the model latents of the parts, value and gradient (the
    gradient mapped back by the chain rule: the hyperparameters' scales, the field's
    orthonormal map times the posterior metric's c_k)."""
    from fieldhmc.models.sharded import ShardedGaussianTarget

    out = {}
    # the mask and the posterior metric's map; the conditional latent (mu + sqrt(w) Z)
    for masked, pre, par in ((True, "posterior", "noncentred"), (True, "identity", "conditional")):
        model, data = _hyper_problem(masked, par)
        target = ShardedGaussianTarget(model, data, mesh, pre, hyper_scales=HYPER_SCALES)
        parts = _hyper_parts(target, 3, 1)
        key = f"{'masked' if masked else 'unmasked'}-{pre}-{par}"
        out[key] = _against_model(target, model, data, parts, mesh, HYPER_SCALES)[0]
    return out


def _hyper_driver(model, data, mesh, settings, preconditioner="identity", scales=None):
    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.samplers.sharded import ShardedFieldOutputs, ShardedSampler
    from fieldhmc.workflow import tracked_mode_indices

    grid = model.grid
    outputs = ShardedFieldOutputs(grid, grid.kbins(), tracked_mode_indices(grid, 2), True)
    target = ShardedGaussianTarget(
        model, data, mesh, preconditioner, hyper_scales=HYPER_SCALES if scales is None else scales
    )
    return ShardedSampler(target, settings, outputs), target


def hyper_driver_cases(mesh, kind="hmc"):
    """A short driver run with sampled (log A, n), 4 devices vs plain tensors of one
    device, and a resume: jittered HMC (4 warm-up steps adapting the step size, 4 draws,
    chunks of 3, killed at steps 3 and 6), or mclmc / mams (12 tuning steps through every
    stage of the tuner, 4 draws, chunks of 5, killed at 5 and 15)."""
    import tempfile
    from pathlib import Path

    from fieldhmc.samplers import SamplerSettings

    model, data = _hyper_problem(True)
    if kind == "hmc":
        settings = SamplerSettings(
            kind="hmc",
            num_chains=4,
            num_burnin_steps=4,
            num_results=4,
            num_leapfrog_steps=3,
            jitter_leapfrog=True,
            step_size=0.1,
            chunk_size=3,
            field_thin=2,
            seed=5,
        )
    else:
        settings = _micro_settings(kind, field_thin=2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        one, target = _hyper_driver(model, data, None, settings)
        init = _hyper_parts(target, 4, 5)
        s1, t1, f1, _ = _driver_run(one, tmp / "one", init)
        four, _ = _hyper_driver(model, data, mesh, settings)
        s4, t4, f4, _ = _driver_run(four, tmp / "four", init)
        d = tmp / "resumed"
        first = int(_driver_run(four, d, init, max_chunks=1)[0].step)
        second = int(_driver_run(four, d, resume=True, max_chunks=2)[0].step)
        sr, tr, fr, _ = _driver_run(four, d, resume=True)
    hypers = list(model.hyper_names)
    return {
        "names": sorted(t4),
        "num_draws": int(t4["lp"].shape[0]),
        "same_accepts": bool(np.array_equal(t1["is_accepted"], t4["is_accepted"])),
        "same_n_steps": bool(np.array_equal(t1["n_steps"], t4["n_steps"])),
        "accept_rate": float(t1["is_accepted"].mean()),
        "n_steps": sorted({int(v) for v in t1["n_steps"].ravel()}),
        "max_state_diff": [
            float(np.max(np.abs(a - b)))
            for a, b in zip(s1.latent_state, s4.latent_state, strict=True)
        ],
        "max_hyper_trace_diff": float(max(np.max(np.abs(t1[n] - t4[n])) for n in hypers)),
        "max_energy_error_diff": float(np.max(np.abs(t1["energy_error"] - t4["energy_error"]))),
        "hyper_moved": float(min(np.ptp(t1[n]) for n in hypers)),
        "hyper_trace_is_model_latent": bool(
            np.allclose(t4[hypers[0]][-1], s4.latent_state[0] * HYPER_SCALES[hypers[0]])
        ),
        "max_lp_diff": float(np.max(np.abs(t1["lp"] - t4["lp"]))),
        "max_power_rel": _max_rel(t4["power"], t1["power"]),
        "max_field_diff": float(np.max(np.abs(f1["draws"] - f4["draws"]))),
        "tuned_1": s1.tuned,
        "tuned_4": s4.tuned,
        "resume": {
            "interrupted_steps": [first, second],
            "complete": bool(sr.complete),
            "traces_identical": sorted(tr) == sorted(t4)
            and all(np.array_equal(t4[k], tr[k], equal_nan=True) for k in t4),
            "fields_identical": all(np.array_equal(f4[k], fr[k]) for k in f4),
            "state_identical": all(
                np.array_equal(a, b) for a, b in zip(s4.latent_state, sr.latent_state, strict=True)
            ),
            "tuned_identical": sr.tuned == s4.tuned,
        },
    }


def poisson_diagonal_driver_cases(mesh):
    """Lognormal-Poisson counts with (log A, n) sampled and the windowed diagonal metric
    through the driver (one compiled run for both): jittered HMC, 40 warm-up steps (one
    slow window, steps 6 to 36, then the step-size adaptation restarted), 4 draws, chunks
    of 5; 4 devices vs plain tensors of one device, and a run killed at step 5 (before
    the window), 35 (inside it: moments in the checkpoint) and 40 (after the metric
    update) and resumed each time."""
    import tempfile
    from pathlib import Path

    from fieldhmc.samplers import SamplerSettings
    from fieldhmc.samplers.driver import adaptation_windows

    model, data = _poisson_problem(True)
    settings = SamplerSettings(
        kind="hmc",
        num_chains=4,
        num_burnin_steps=40,
        num_results=4,
        num_leapfrog_steps=3,
        jitter_leapfrog=True,
        step_size=0.1,
        chunk_size=5,
        field_thin=2,
        seed=5,
        adapt_diagonal=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        one, target = _hyper_driver(model, data, None, settings, "diagonal")
        init = _hyper_parts(target, 4, 5)
        init[-1] = 0.3 * init[-1]  # about the posterior's scale
        s1, t1, f1, _ = _driver_run(one, tmp / "one", init)
        four, _ = _hyper_driver(model, data, mesh, settings, "diagonal")
        s4, t4, f4, _ = _driver_run(four, tmp / "four", init)
        d = tmp / "resumed"
        steps = [int(_driver_run(four, d, init, max_chunks=1)[0].step)]
        steps.append(int(_driver_run(four, d, resume=True, max_chunks=7)[0].step))
        steps.append(int(_driver_run(four, d, resume=True, max_chunks=2)[0].step))
        sr, tr, fr, _ = _driver_run(four, d, resume=True)
    return {
        "windows": adaptation_windows(settings.num_burnin_steps),
        "names": sorted(t4),
        "num_draws": int(t4["lp"].shape[0]),
        "same_accepts": bool(np.array_equal(t1["is_accepted"], t4["is_accepted"])),
        "same_n_steps": bool(np.array_equal(t1["n_steps"], t4["n_steps"])),
        "accept_rate": float(t1["is_accepted"].mean()),
        "max_state_diff": [
            float(np.max(np.abs(a - b)))
            for a, b in zip(s1.latent_state, s4.latent_state, strict=True)
        ],
        "scales_rel": [_max_rel(a, b) for a, b in zip(s4.scales, s1.scales, strict=True)],
        # the field's scales vary by element, the scalar parts' moved off 1
        "field_scale_ptp": float(np.ptp(s4.scales[-1])),
        "hyper_scales": [float(v) for v in s4.scales[:-1]],
        "max_lp_rel": _max_rel(t4["lp"], t1["lp"]),
        "step_size_rel": _max_rel(t4["step_size"], t1["step_size"]),
        "max_power_rel": _max_rel(t4["power"], t1["power"]),
        "max_field_diff": float(np.max(np.abs(f1["draws"] - f4["draws"]))),
        "resume": {
            "interrupted_steps": steps,
            "complete": bool(sr.complete),
            "traces_identical": sorted(tr) == sorted(t4)
            and all(np.array_equal(t4[k], tr[k], equal_nan=True) for k in t4),
            "fields_identical": all(np.array_equal(f4[k], fr[k]) for k in f4),
            "state_identical": all(
                np.array_equal(a, b) for a, b in zip(s4.latent_state, sr.latent_state, strict=True)
            ),
            "scales_identical": all(
                np.array_equal(a, b) for a, b in zip(s4.scales, sr.scales, strict=True)
            ),
        },
    }


def hyper_posterior_ztest(
    mesh,
    kind="hmc",
    num_results=400,
    num_burnin=300,
    seed=11,
    model_fn=None,
    parametrization="noncentred",
):
    """Jittered HMC (or mams) on 4 devices with (log A, n) sampled next to the non-centred field
    (8³ problem of ``test_conditional_posterior.py``, hyperparameters whitened by their
    prior widths, as the single-device non-centred metric): z-scores of theta's mean and
    variance and of every field coordinate's against the exact posterior
    (``QuadratureReference``: 2-D quadrature of the marginal posterior of theta, the
    Wiener posterior of the field mixed over it). ``model_fn`` replaces the sampled model
    (the test of the test: a wrong hyperprior must fail)."""
    import tempfile
    from pathlib import Path

    from fieldhmc.samplers import SamplerSettings, stateless_seed
    from tests.samplers.test_conditional_posterior import (
        HYPERS,
        QuadratureReference,
        joint_zscores,
        make_problem,
    )
    from tests.samplers.test_posterior import _looks_standard_normal

    model, data = make_problem(parametrization)
    ref = QuadratureReference(data)
    sampled = model if model_fn is None else model_fn()
    if kind == "hmc":
        settings = SamplerSettings(
            kind="hmc",
            num_chains=4,
            num_burnin_steps=num_burnin,
            num_results=num_results,
            num_leapfrog_steps=8,
            jitter_leapfrog=True,
            chunk_size=num_burnin + num_results,
            field_thin=1,
            seed=seed,
        )
    else:
        settings = _micro_settings(
            kind, num_burnin, num_results, num_burnin + num_results, seed=seed, field_thin=1
        )
    if sampled.is_conditional:  # the posterior metric of a conditional config
        scales = sampled.hyper_posterior_scales()
    else:
        scales = {n: sampled.hyper_latent_scale(n) for n in HYPERS}
    sampler, target = _hyper_driver(sampled, data, mesh, settings, scales=scales)
    latents = sampled.init_latents("prior", 4, seed=stateless_seed(1))
    init = target.state_from_model([np.asarray(v) for v in latents])
    with tempfile.TemporaryDirectory() as tmp:
        _, traces, fields, secs = _driver_run(sampler, Path(tmp), init)
    z_theta, z_field = joint_zscores(
        {n: traces[n] for n in HYPERS}, fields["draws"], ref, batch_mcse=kind == "mclmc"
    )
    ok, msg = _looks_standard_normal(z_field)
    return {
        "z_theta": [float(z) for z in z_theta],
        "field_ok": bool(ok),
        "field_msg": msg,
        "num_field_z": int(z_field.size),
        "max_abs_z_field": float(np.max(np.abs(z_field))),
        "accept_rate": float(np.mean(traces["is_accepted"])),
        "n_steps": sorted({int(v) for v in traces["n_steps"].ravel()}),
        "theta_mean": [float(np.mean(traces[n])) for n in HYPERS],
        "ref_mean": [float(v) for v in ref.mean],
        "seconds": secs,
    }


# --- lognormal-Poisson counts ----------------------------------------------------------------
def _poisson_problem(sampled: bool = False, parametrization: str = "noncentred"):
    """8³ counts (nbar 3, a completeness in [0, 1] with a masked slab), float64; with
    ``sampled`` log A and n get Normal priors about the fiducial."""
    import tensorflow as tf

    from fieldhmc import models
    from fieldhmc.seeds import stateless_seed

    grid = models.Grid(GRID, 100.0)
    rng = np.random.default_rng(4)
    completeness = rng.uniform(0.3, 1.0, GRID) * models.make_mask(grid, "slab", 0.25, seed=3)
    hyper = {"log_amplitude": (np.log(1000.0), 1.0), "index": (-1.5, 0.5)} if sampled else None
    model = models.LognormalPoissonModel(
        grid,
        models.PowerLaw(1000.0, -1.5, 0.1),
        3.0,
        completeness,
        hyper_priors=hyper,
        parametrization=parametrization,
        dtype=tf.float64,
    )
    data = np.asarray(model.sample(seed=stateless_seed(7))["data"])
    return model, data


# (metric, parametrisation, sampled log A and n): both sigma2_delta branches (fixed,
# sampled), both latents, both metrics, in two compiled targets
POISSON_TARGETS = (("posterior", "noncentred", False), ("identity", "conditional", True))


def poisson_target_cases(mesh):
    """The mesh target of lognormal-Poisson counts on 4 devices == the model's
    ``target_log_prob_fn`` at the model latents of random parts (value and every part's
    gradient mapped by the chain rule, as ``hyper_target_cases``): fixed P(k) with the
    posterior metric; sampled (log A, n) with the conditional latent."""
    from fieldhmc.models.sharded import ShardedGaussianTarget

    out = {}
    for pre, par, sampled in POISSON_TARGETS:
        model, data = _poisson_problem(sampled, par)
        scales = HYPER_SCALES if sampled else None
        target = ShardedGaussianTarget(model, data, mesh, pre, hyper_scales=scales)
        if sampled:
            parts = _hyper_parts(target, 3, 1)
        else:  # xi about the posterior: counts of 3 per voxel keep exp(delta) moderate
            parts = [0.5 * np.random.default_rng(1).standard_normal((3, *GRID))]
        case, ref = _against_model(target, model, data, parts, mesh, HYPER_SCALES)
        case["finite"] = bool(np.all(np.isfinite(ref)))
        out[f"{pre}-{par}-{'sampled' if sampled else 'fixed'}"] = case
    return out


# --- sampled cosmology (Omega_m, sigma8 of the Eisenstein-Hu P(k)) ------------------------
COSMOLOGY_SCALES = {"Omega_m": 0.05, "sigma8": 0.1}


def _cosmology_problem():
    """8³ Gaussian data (sigma 0.5, box 320 Mpc/h) of an Eisenstein-Hu field with
    Omega_m and sigma8 sampled (truncated normal priors), float64."""
    import tensorflow as tf

    from fieldhmc import models
    from fieldhmc.models.cosmology import CosmologicalPower
    from fieldhmc.seeds import stateless_seed

    tn = models.TruncatedNormalPrior
    model = models.GaussianFieldModel(
        models.Grid(GRID, 320.0),
        CosmologicalPower(0.3111, 0.8102),
        0.5,
        hyper_priors={"Omega_m": tn(0.3111, 0.2, 0.05, 1.0), "sigma8": tn(0.8102, 0.2, 0.05)},
        dtype=tf.float64,
    )
    return model, np.asarray(model.sample(seed=stateless_seed(7))["data"])


def _cosmology_parts(target, chains, seed):
    rng = np.random.default_rng(seed)
    u = [0.3 + 0.02 * rng.standard_normal(chains), 0.8 + 0.05 * rng.standard_normal(chains)]
    return target.state_from_model([*u, rng.standard_normal((chains, *GRID))])


def cosmology_target_case(mesh):
    """The mesh target with Omega_m and sigma8 sampled (the E&H power evaluated on the
    distinct |k| and gathered by the sharded |k| index), posterior metric, on 4 devices
    == model.target_log_prob_fn at the parts' model latents, value and every gradient."""
    from fieldhmc.models.sharded import ShardedGaussianTarget

    model, data = _cosmology_problem()
    target = ShardedGaussianTarget(model, data, mesh, "posterior", hyper_scales=COSMOLOGY_SCALES)
    parts = _cosmology_parts(target, 3, 1)
    return _against_model(target, model, data, parts, mesh, COSMOLOGY_SCALES)[0]


def cosmology_driver_case(mesh):
    """Omega_m and sigma8 sampled through the driver (jittered HMC, posterior metric,
    4 warm-up steps adapting the step size, 4 draws, chunks of 3): 4 devices vs plain
    tensors of one device."""
    import tempfile
    from pathlib import Path

    from fieldhmc.samplers import SamplerSettings

    model, data = _cosmology_problem()
    settings = SamplerSettings(
        kind="hmc",
        num_chains=4,
        num_burnin_steps=4,
        num_results=4,
        num_leapfrog_steps=3,
        jitter_leapfrog=True,
        step_size=0.1,
        chunk_size=3,
        field_thin=2,
        seed=5,
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        one, target = _hyper_driver(model, data, None, settings, "posterior", COSMOLOGY_SCALES)
        init = _cosmology_parts(target, 4, 5)
        s1, t1, f1, _ = _driver_run(one, tmp / "one", init)
        four, _ = _hyper_driver(model, data, mesh, settings, "posterior", COSMOLOGY_SCALES)
        s4, t4, f4, _ = _driver_run(four, tmp / "four", init)
    hypers = list(model.hyper_names)
    return {
        "names": sorted(t4),
        "num_draws": int(t4["lp"].shape[0]),
        "same_accepts": bool(np.array_equal(t1["is_accepted"], t4["is_accepted"])),
        "same_n_steps": bool(np.array_equal(t1["n_steps"], t4["n_steps"])),
        "accept_rate": float(t1["is_accepted"].mean()),
        "hyper_moved": float(min(np.ptp(t1[n]) for n in hypers)),
        "max_state_diff": [
            float(np.max(np.abs(a - b)))
            for a, b in zip(s1.latent_state, s4.latent_state, strict=True)
        ],
        "max_hyper_trace_diff": float(max(np.max(np.abs(t1[n] - t4[n])) for n in hypers)),
        "max_lp_rel": _max_rel(t4["lp"], t1["lp"]),
        "max_power_rel": _max_rel(t4["power"], t1["power"]),
        "max_field_diff": float(np.max(np.abs(f1["draws"] - f4["draws"]))),
    }


def results(slow: bool) -> dict:
    from fieldhmc.ops import sharded as sh

    mesh = sh.make_mesh(4)
    if slow:
        masks = ("unmasked", "masked")
        results = {m: driver_wiener_ztest(mesh, m == "masked", 400) for m in masks}
        results["repro"] = reproducibility(mesh, ("float64", "float32"), 30, 5)
        results["mams"] = {m: driver_wiener_ztest(mesh, m == "masked", 400, "mams") for m in masks}
        results["mclmc_bias"] = {
            str(tol): driver_mclmc_bias(mesh, False, tol) for tol in SHARDED_BIAS_TOLERANCES
        }
        results["microcanonical_unsharded"] = microcanonical_unsharded_cases()
        results["conservation"] = {"mams": conservation_ztest(mesh, "mams", "posterior")}
        results["hyper_driver"] = {k: hyper_driver_cases(mesh, k) for k in ("mclmc", "mams")}
        results["hyper_posterior"] = {
            kind: hyper_posterior_ztest(mesh, kind, *HYPER_RUNS[kind]) for kind in HYPER_RUNS
        }
        results["hyper_posterior"]["hmc-conditional"] = hyper_posterior_ztest(
            mesh, "hmc", *HYPER_RUNS["hmc"], parametrization="conditional"
        )
        # slow: the E&H power's graph costs ~13 s to build on the mesh
        results["cosmology"] = {
            "target": cosmology_target_case(mesh),
            "driver": cosmology_driver_case(mesh),
        }
        results["diagonal_ztest"] = {
            m: driver_wiener_ztest(mesh, m == "masked", 400, "hmc", "diagonal") for m in masks
        }
        results["posterior"] = {
            f"{kind}-{m}": driver_wiener_ztest(mesh, m == "masked", 400, kind, "posterior")
            for kind in ("hmc", "mams")
            for m in masks
        }
    else:
        results = {
            "target": target_cases(mesh),
            "driver": driver_cases(mesh),
            "microcanonical": microcanonical_cases(mesh),
            # the posterior metric on the mesh: exact draws stay exact
            "conservation": {
                "hmc-jitter": conservation_ztest(mesh, "hmc", "posterior", jitter=True)
            },
            "hyper": {
                "target": hyper_target_cases(mesh),
                "driver": {"hmc": hyper_driver_cases(mesh, "hmc")},
            },
            "poisson": {
                "target": poisson_target_cases(mesh),
                "driver": poisson_diagonal_driver_cases(mesh),
            },
        }
    return results


def main() -> None:
    from fieldhmc.ops import sharded as sh

    sh.make_mesh(4)
    sys.stdout.write(json.dumps(results("--slow" in sys.argv)) + "\n")


if __name__ == "__main__":
    main()
