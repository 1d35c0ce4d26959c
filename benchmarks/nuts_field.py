"""Our NUTS (`fieldnuts`) against TFP on the 64³ Gaussian field model, in one process.

Run: ``.venv/bin/python benchmarks/nuts_field.py [--n 64] [--part speed ess]``
(part of ``make bench``). Both parts use the model of ``sampling.py`` (64³ Gaussian
field, P(k) power law, Gaussian noise), whitened by the Fourier-diagonal posterior
metric, float32 under XLA.

``speed``: milliseconds per gradient evaluation of `StanNUTS` and of TFP's
`HamiltonianMonteCarlo` on the same whitened target, each compiled once around
``tfp.mcmc.sample_chain`` at the same fixed step size; HMC takes as many leapfrog
steps per transition as our NUTS's longest chain did on average. The two are timed
round-robin (``--repeats`` times) and the median is reported; a gradient is one
leapfrog step of the batch of chains (all chains step together until the longest
trajectory is done). Target: ratio <= 1.2.

``ess``: gradient evaluations per minimum bulk ESS (over all latent coordinates, every
Fourier mode's real and imaginary part) for `fieldnuts` and TFP's `nuts`, both run by
our driver with dual-averaging step size, the same warm-up, draws and maximum tree
depth. Gradient evaluations are those of every chain after warm-up. Target: TFP's
count >= 2x ours.

If ``jax`` and ``blackjax`` are importable (the optional ``peers`` extra,
``pip install -e '.[peers]'``), both parts also run BlackJAX's NUTS on a JAX port of
the same whitened target (`_blackjax_peer.py`, checked against TensorFlow's log
density and gradient first) and print its ratios too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_probability as tfp  # noqa: E402
from nuts_resonance import _sampler, _steps  # noqa: E402
from sampling import build, run_one  # noqa: E402

from fieldhmc.diagnostics import ess_bulk  # noqa: E402
from fieldhmc.samplers import stateless_seed, whiten  # noqa: E402
from fieldhmc.samplers.nuts import StanNUTS  # noqa: E402

try:  # the optional ``peers`` extra
    import _blackjax_peer as peer
except ImportError:
    peer = None


class Setup(NamedTuple):
    """The whitened target, its per-coordinate scale and a start for the chains."""

    target: Callable  # u -> float32 log density minus a per-chain reference
    scale: np.ndarray  # M^{-1/2} of the posterior metric, float32
    u0: tf.Tensor  # a prior draw, whitened


def whitened_target(model, data, chains: int) -> Setup:
    """The posterior-metric whitened target and a prior-draw start."""
    scale = (1.0 / np.sqrt(model.posterior_precision_diag(data))).astype(np.float32)
    x0 = np.asarray(model.init_latents("prior", chains, seed=stateless_seed(1))[0])
    target64 = model.target_log_prob_fn(data)
    reference = target64(tf.constant(x0))
    fn = whiten(target64, [tf.constant(scale)], reference, tf.float32)
    return Setup(fn, scale, tf.constant(x0 / scale, tf.float32))


def typical_start(setup: Setup, args) -> tf.Tensor:
    """The state after 30 transitions of our NUTS from the prior draw (the typical set)."""
    eps = tf.constant(args.step_size, tf.float32)

    @tf.function(jit_compile=True, autograph=False)
    def burn(u, seed):
        kernel = StanNUTS(setup.target, eps, max_tree_depth=args.max_depth)
        return tfp.mcmc.sample_chain(30, u, kernel=kernel, seed=seed, trace_fn=None)[-1]

    return burn(setup.u0, tf.constant([7, 7]))


def speed(model, data, setup: Setup, u_typ: tf.Tensor, args) -> dict:
    target = setup.target
    eps = tf.constant(args.step_size, tf.float32)
    ours = _sampler(
        lambda e: StanNUTS(target, e, max_tree_depth=args.max_depth),
        lambda _, r: r.num_leapfrog_steps,
        args.speed_steps,
    )
    steps = _steps(ours, u_typ, eps, tf.constant([0, 1]))  # compile; sets HMC's length
    num_leapfrog = max(1, round(float(steps.max(axis=1).mean())))
    hmc = _sampler(
        lambda e: tfp.mcmc.HamiltonianMonteCarlo(target, e, num_leapfrog),
        lambda _, r: tf.fill(tf.shape(r.log_accept_ratio), num_leapfrog),
        args.speed_steps,
    )
    _steps(hmc, u_typ, eps, tf.constant([0, 1]))  # compile
    candidates = {"fieldnuts": ours, f"TFP HMC (L={num_leapfrog})": hmc}
    per_grad = {name: [] for name in candidates}
    for rep in range(args.repeats):  # round-robin, to share the machine's load fairly
        for name, run in candidates.items():
            start = time.perf_counter()
            steps = _steps(run, u_typ, eps, tf.constant([5, rep]))
            elapsed = time.perf_counter() - start
            per_grad[name].append(1e3 * elapsed / float(steps.max(axis=1).sum()))
    out = {name: statistics.median(v) for name, v in per_grad.items()}
    if peer is not None and args.peers:
        logdensity = _peer_target(model, data, setup, u_typ)
        out[f"BlackJAX {peer.VERSION} NUTS"] = peer.ms_per_gradient(
            logdensity,
            u_typ.numpy(),
            args.step_size,
            args.speed_steps,
            args.repeats,
            args.max_depth,
        )
    return out


def _peer_target(model, data, setup: Setup, u):
    """The JAX port of the whitened target, checked against TensorFlow's first."""
    logdensity = peer.make_logdensity(model, data, setup.scale)
    lp_err, g_err = peer.check_against(logdensity, setup.target, np.asarray(u))
    print(
        f"JAX port vs TensorFlow: max rel. error of log-density differences {lp_err:.1e}, "
        f"of gradients {g_err:.1e}"
    )
    if lp_err > 1e-3 or g_err > 1e-4:
        raise RuntimeError("the JAX port of the model disagrees with TensorFlow's")
    return logdensity


def fixed_steps(setup: Setup, u_typ: tf.Tensor, args) -> dict:
    """Gradients per ESS of both NUTS at fixed step sizes, from the typical set.

    Dual averaging lands on one step size; TFP's U-turn check fails at others (at
    64³ it runs to the maximum depth at 0.1 and 0.2). Each sampler takes
    ``--fixed-draws`` transitions from the same start in the typical set.
    """
    target = setup.target
    out = {}
    for eps in args.fixed_steps:
        e = tf.constant(eps, tf.float32)
        kernels = {
            "fieldnuts": (StanNUTS(target, e, max_tree_depth=args.max_depth), "num_leapfrog_steps"),
            "nuts": (
                tfp.mcmc.NoUTurnSampler(target, e, max_tree_depth=args.max_depth),
                "leapfrogs_taken",
            ),
        }
        for kind, (kernel, field) in kernels.items():

            @tf.function(jit_compile=True, autograph=False)
            def run(u, seed, kernel=kernel, field=field):
                return tfp.mcmc.sample_chain(
                    args.fixed_draws,
                    u,
                    kernel=kernel,
                    seed=seed,
                    trace_fn=lambda _, res: getattr(res, field),
                )

            start = time.perf_counter()
            states, steps = (t.numpy() for t in run(u_typ, tf.constant([3, 4])))
            draws = np.moveaxis(states, 0, 1).reshape(args.chains, args.fixed_draws, -1)
            r = _ess_row(draws, steps, eps, time.perf_counter() - start)
            out[(eps, kind)] = r
            _print_ess_row(kind, r)
        ratio = out[(eps, "nuts")]["grads_per_ess"] / out[(eps, "fieldnuts")]["grads_per_ess"]
        print(f"step {eps}: TFP NUTS / fieldnuts gradients per min-ESS {ratio:.1f}", flush=True)
    return out


def ess(model, data, setup: Setup, args) -> dict:
    out = {}
    for kind in args.kinds:
        start = time.perf_counter()
        r = run_one(model, data, kind, "posterior", args)
        r["seconds"] = time.perf_counter() - start
        out[kind] = r
        _print_ess_row(kind, r)
    if peer is not None and args.peers:
        logdensity = _peer_target(model, data, setup, setup.u0)
        start = time.perf_counter()
        positions, steps, step = peer.sample(
            logdensity,
            setup.u0.numpy(),
            args.burnin,
            args.results,
            args.max_depth,
            target_accept=args.target_accept,
        )
        out["blackjax"] = r = _ess_row(positions, steps, step, time.perf_counter() - start)
        _print_ess_row("BlackJAX", r)
    return out


def _ess_row(draws: np.ndarray, steps: np.ndarray, step_size: float, seconds: float) -> dict:
    """A table row from draws ``[chain, draw, D]`` and leapfrog counts ``[draw, chain]``."""
    ess_all = ess_bulk(draws)
    return {
        "leapfrogs": float(steps.max(axis=1).mean()),  # of the longest chain, per draw
        "min_ess": float(np.min(ess_all)),
        "median_ess": float(np.median(ess_all)),
        "grads_per_ess": float(steps.sum()) / float(np.min(ess_all)),  # all chains
        "step_size": step_size,
        "seconds": seconds,
    }


def _print_ess_header() -> None:
    print(
        f"{'kernel':>9} | {'leapfrog/it':>11} {'min ESS':>8} {'median ESS':>10} "
        f"{'grads/ESS':>9} {'step':>9} {'seconds':>8}"
    )


def _print_ess_row(kind: str, r: dict) -> None:
    print(
        f"{kind:>9} | {r['leapfrogs']:>11.1f} {r['min_ess']:>8.0f} {r['median_ess']:>10.0f} "
        f"{r['grads_per_ess']:>9.1f} {r['step_size']:>9.3f} {r['seconds']:>8.0f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument(
        "--part", nargs="+", default=["speed", "ess"], choices=["speed", "ess", "fixed"]
    )
    parser.add_argument("--max-depth", type=int, default=10)
    parser.add_argument("--step-size", type=float, default=0.1, help="speed part (whitened)")
    parser.add_argument("--speed-steps", type=int, default=5, help="transitions per timed run")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--burnin", type=int, default=150, help="ess part")
    parser.add_argument("--results", type=int, default=200, help="ess part")
    parser.add_argument("--kinds", nargs="+", default=["fieldnuts", "nuts"], help="ess part")
    parser.add_argument(
        "--target-accept", type=float, default=0.8, help="ess part: dual-averaging target"
    )
    parser.add_argument(
        "--fixed-steps", type=float, nargs="+", default=[0.1, 0.2], help="fixed part"
    )
    parser.add_argument("--fixed-draws", type=int, default=20, help="fixed part")
    parser.add_argument(
        "--no-peers",
        dest="peers",
        action="store_false",
        help="skip BlackJAX even if jax and blackjax are importable",
    )
    args = parser.parse_args(argv)
    args.leapfrog = 1  # unused by the NUTS kinds (run_one passes it through)
    model, data = build(args.n, masked=False)
    print(
        f"{args.n}³ Gaussian model, whitened by the posterior metric, {args.chains} chains, "
        f"float32, XLA; TF {tf.__version__}, TFP {tfp.__version__}"
    )
    setup = whitened_target(model, data, args.chains)
    u_typ = typical_start(setup, args) if {"speed", "fixed"} & set(args.part) else None
    results = {}
    if "speed" in args.part:
        results["speed"] = rows = speed(model, data, setup, u_typ, args)
        print(
            f"\nms per gradient (batched), step size {args.step_size}, "
            f"{args.speed_steps} transitions per run, median of {args.repeats}"
        )
        for name, ms in rows.items():
            print(f"{name:>22} {ms:8.2f}")
        names = list(rows)
        hmc_ms = rows[names[1]]
        print(f"{'fieldnuts / TFP HMC':>22} {rows[names[0]] / hmc_ms:8.3f}   (target <= 1.2)")
        if len(names) > 2:
            print(f"{'BlackJAX / TFP HMC':>22} {rows[names[2]] / hmc_ms:8.3f}", flush=True)
    if "ess" in args.part:
        print(
            f"\n{args.burnin} warm-up + {args.results} draws, max tree depth {args.max_depth}, "
            f"dual averaging to accept {args.target_accept}"
        )
        _print_ess_header()
        results["ess"] = out = ess(model, data, setup, args)
        ours = out["fieldnuts"]["grads_per_ess"]
        if "nuts" in out:
            print(
                "TFP NUTS / fieldnuts gradients per min-ESS: "
                f"{out['nuts']['grads_per_ess'] / ours:.2f} (target >= 2)"
            )
        if "blackjax" in out:
            print(
                f"BlackJAX / fieldnuts gradients per min-ESS: "
                f"{out['blackjax']['grads_per_ess'] / ours:.2f}"
            )
    if "fixed" in args.part:
        print(
            f"\nfixed step sizes, {args.fixed_draws} draws from the typical set, "
            f"max tree depth {args.max_depth}"
        )
        _print_ess_header()
        results["fixed"] = fixed_steps(setup, u_typ, args)
    return results


if __name__ == "__main__":
    main()
