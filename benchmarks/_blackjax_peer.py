"""The whitened Gaussian field posterior in JAX, sampled by BlackJAX's NUTS, MCLMC, MAMS.

Used by ``nuts_field.py`` (NUTS) and ``microcanonical.py`` (MCLMC and adjusted MCLMC)
when ``jax`` and ``blackjax`` are importable (the optional ``peers`` extra:
``pip install -e '.[peers]'``). The log density is a line-by-line port of
`fieldhmc.models.GaussianFieldModel` (non-centred, fixed P(k), per-voxel noise
weights, so masks too) on the same whitened coordinates, using the model's own
packing tables and spectrum; `check_against` verifies value differences and
gradients against the TensorFlow target before anything is timed.

BlackJAX runs with an identity metric (the coordinates are already whitened), Stan's
dual averaging of one step size shared by the chains (their mean acceptance, as TFP's
wrapper). Its chains run one after another (``lax.map``; see `_transition` for why not
``vmap``), so its time per gradient of the batch is its time per chain-gradient times
the number of chains.

`sample_mclmc` and `sample_adjusted_mclmc` run BlackJAX's own tuners
(``mclmc_find_L_and_step_size``, ``adjusted_mclmc_find_L_and_step_size``), one per
chain, with the warm-up budget and targets of ours (see each docstring);
`sample_nuts_window` runs NUTS after ``window_adaptation`` (Stan's warm-up).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from blackjax.adaptation.step_size import dual_averaging_adaptation
from blackjax.mcmc import adjusted_mclmc_dynamic, integrators, mclmc, nuts
from blackjax.mcmc.adjusted_mclmc import rescale

VERSION = blackjax.__version__


def make_logdensity(model, data, scale: np.ndarray):
    """``logdensity(u)`` of one chain's whitened latent, flattened: ``u`` is ``[n0*n1*n2]``.

    (BlackJAX's metrics want flat positions.)
    """
    grid = model.grid
    n0, n1, n2 = grid.grid_shape
    packing = model.packing
    plane = packing._plane
    k_free = packing._num_free
    has_nyquist = packing._has_nyquist
    sqrt_s = jnp.asarray(np.sqrt(model.signal_variance_np()), jnp.float32)
    weights = np.asarray(model.noise_weights, np.float32)
    uniform = bool(np.all(weights == weights.reshape(-1)[0]))
    weight = float(weights.reshape(-1)[0]) if uniform else jnp.asarray(weights)
    d = jnp.asarray(np.where(weights > 0, np.asarray(data), 0.0), jnp.float32)
    s = jnp.asarray(scale, jnp.float32)
    src_re, src_im = jnp.asarray(plane.src_re), jnp.asarray(plane.src_im)
    c_re = jnp.asarray(plane.c_re, jnp.float32)
    c_im = jnp.asarray(plane.c_im, jnp.float32)
    r2 = np.float32(1.0 / np.sqrt(2.0))

    def pack_plane(flat):
        return jax.lax.complex(c_re * flat[src_re], c_im * flat[src_im])

    def logdensity(u):
        z = u.reshape(n0, n1, n2) * s
        x = z.reshape(n0 * n1, n2)
        pieces = [pack_plane(x[:, 0])[:, None]]
        if k_free:
            pairs = x[:, 1 : 2 * k_free + 1].reshape(n0 * n1, k_free, 2)
            pieces.append(jax.lax.complex(pairs[..., 0] * r2, pairs[..., 1] * r2))
        if has_nyquist:
            pieces.append(pack_plane(x[:, -1])[:, None])
        modes = jnp.concatenate(pieces, axis=-1).reshape(n0, n1, n2 // 2 + 1) * sqrt_s
        delta = jnp.fft.irfftn(modes, s=(n0, n1, n2), norm="ortho")
        return -0.5 * jnp.sum(z * z) - 0.5 * jnp.sum(weight * jnp.square(d - delta))

    return logdensity


def check_against(logdensity, tf_target, u: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """Largest relative errors of (log-density differences, gradients) vs TensorFlow.

    ``u`` is ``[chains, *grid]`` float32; ``tf_target`` the whitened float32 TF target,
    which subtracts a per-chain reference, so values are compared as differences
    between ``u`` and a perturbed ``u`` of the same chain.
    """
    import tensorflow as tf

    u2 = u + 0.05 * np.random.default_rng(seed).standard_normal(u.shape).astype(np.float32)

    def tf_value_and_grad(v):
        x = tf.constant(v)
        with tf.GradientTape() as tape:
            tape.watch(x)
            lp = tf_target(x)
        return lp.numpy().astype(np.float64), tape.gradient(lp, x).numpy()

    vg = jax.jit(jax.vmap(jax.value_and_grad(logdensity)))
    (a_tf, g_tf), (b_tf, _) = tf_value_and_grad(u), tf_value_and_grad(u2)
    flat = [jnp.asarray(v.reshape(v.shape[0], -1)) for v in (u, u2)]
    (a_jx, g_jx), (b_jx, _) = [[np.asarray(t) for t in vg(v)] for v in flat]
    g_jx = g_jx.reshape(g_tf.shape)
    diff_tf = b_tf - a_tf
    diff_jx = b_jx.astype(np.float64) - a_jx.astype(np.float64)
    lp_err = float(np.max(np.abs(diff_tf - diff_jx) / np.maximum(np.abs(diff_tf), 1.0)))
    g_err = float(np.max(np.abs(g_tf - g_jx)) / np.max(np.abs(g_tf)))
    return lp_err, g_err


def _init(logdensity, u0):
    flat = jnp.asarray(u0).reshape(u0.shape[0], -1)
    return jax.vmap(lambda u: nuts.init(u, logdensity))(flat)


def _transition(logdensity, u0, depth: int):
    """``transition(states, key, step_size) -> (states, info)`` for all chains.

    The chains run one after another (``lax.map``), not under ``vmap``: there
    BlackJAX's iterative NUTS turns every while-loop update of its
    ``[max_num_doublings, D]`` momentum checkpoints into a select over the whole
    array, which at 64³ made it more than ten times slower per gradient.
    """
    kernel = nuts.build_kernel()
    chains = u0.shape[0]
    inv_mass = jnp.ones(int(np.prod(u0.shape[1:])), jnp.float32)

    def transition(states, key, step_size):
        def step(key, state):
            return kernel(key, state, logdensity, step_size, inv_mass, depth)

        keys = jax.random.split(key, chains)
        return jax.lax.map(lambda a: step(*a), (keys, states))

    return transition


def ms_per_gradient(logdensity, u0, step_size: float, num_steps: int, repeats: int, depth: int):
    """Median ms per gradient of the batch of chains, ``num_steps`` transitions at a fixed step.

    The chains run one after another (see `_transition`), so the time per gradient of
    the batch is the time per chain-gradient times the number of chains.
    """
    transition = _transition(logdensity, u0, depth)

    @jax.jit
    def run(states, key):
        def one(states, key):
            states, info = transition(states, key, step_size)
            return states, info.num_integration_steps

        return jax.lax.scan(one, states, jax.random.split(key, num_steps))

    states, _ = run(_init(logdensity, u0), jax.random.PRNGKey(0))  # compile
    out = []
    for rep in range(repeats):
        start = time.perf_counter()
        _, steps = run(states, jax.random.PRNGKey(rep + 1))
        steps = np.asarray(steps)  # blocks
        out.append(1e3 * (time.perf_counter() - start) * u0.shape[0] / float(steps.sum()))
    return float(np.median(out))


def sample(
    logdensity,
    u0,
    num_warmup: int,
    num_results: int,
    depth: int,
    seed: int = 0,
    target_accept: float = 0.8,
):
    """Dual-averaging warm-up (to ``target_accept``), then draws.

    Returns ``(draws [chain, draw, D], leapfrog steps [draw, chain], step size)``.
    """
    transition = _transition(logdensity, u0, depth)
    da_init, da_update, _ = dual_averaging_adaptation(target_accept)

    @jax.jit
    def warmup(states, key):
        def one(carry, key):
            states, da = carry
            states, info = transition(states, key, jnp.exp(da.log_step_size))
            da = da_update(da, jnp.mean(info.acceptance_rate))
            return (states, da), None

        (states, da), _ = jax.lax.scan(
            one, (states, da_init(0.1)), jax.random.split(key, num_warmup)
        )
        return states, jnp.exp(da.log_step_size_avg)

    @jax.jit
    def draws(states, key, step_size):
        def one(states, key):
            states, info = transition(states, key, step_size)
            return states, (states.position, info.num_integration_steps)

        return jax.lax.scan(one, states, jax.random.split(key, num_results))[1]

    key_warm, key_draw = jax.random.split(jax.random.PRNGKey(seed))
    states, step_size = warmup(_init(logdensity, u0), key_warm)
    positions, steps = draws(states, key_draw, step_size)
    positions = np.moveaxis(np.asarray(positions), 0, 1)  # chain, draw, D
    return positions, np.asarray(steps), float(step_size)


# ---------------------------------------------------------------------------------
# Microcanonical samplers: BlackJAX's MCLMC and adjusted MCLMC (MAMS), self-tuned
# ---------------------------------------------------------------------------------


class PeerRun(NamedTuple):
    """One BlackJAX run: draws, gradient counts, tuned values, energy errors, timing."""

    draws: np.ndarray  # [chain, draw, D] whitened positions (every ``thin``-th)
    warmup_grads: int  # all chains
    grads: int  # post-warm-up, all chains
    step_size: float  # mean over chains (BlackJAX units)
    trajectory_length: float  # L, mean over chains
    energy_error: np.ndarray  # post-warm-up Delta E, [draw, chain]
    accept: float  # mean acceptance probability (nan for mclmc)
    ms_per_gradient: float  # post-warm-up execution only, per gradient of the batch
    seconds: float  # whole run including compiles
    warmup_seconds: float  # execution of the tuner / adaptation, compile excluded
    sampling_seconds: float  # execution of the post-warm-up loop, compile excluded


def _per_chain_keys(seed: int, chains: int):
    return jax.random.split(jax.random.PRNGKey(seed), chains)


def _timed(fn, *args):
    """Compile ``fn`` ahead of time, then run it once; ``(outputs, execution seconds)``."""
    return _timer(fn, *args)(*args)


def _timer(fn, *args):
    """``fn`` compiled ahead of time for ``args``' shapes; each call of the result runs it
    and returns ``(outputs, execution seconds)`` (so several seeds share one compile)."""
    compiled = jax.jit(fn).lower(*args).compile()

    def run(*call_args):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*call_args))
        return out, time.perf_counter() - start

    return run


def _per_seed(tuner_fn, run_fn, flat, seeds, record) -> list[PeerRun]:
    """One run per seed, the tuner and the sampling loop compiled once, ahead of time.

    ``tuner_fn(flat, keys)`` returns its outputs with the count of tuning steps last;
    ``run_fn(*those_outputs_but_the_last, key)`` the sampling loop's.
    ``record(tuned, sampled, sampling_seconds)`` gives the :class:`PeerRun` fields
    other than its three timings.
    """
    chains = flat.shape[0]
    start = time.perf_counter()
    tuner = _timer(tuner_fn, flat, _per_chain_keys(seeds[0], chains))
    sampler = None
    out = []
    for seed in seeds:
        tuned, warmup_seconds = tuner(flat, _per_chain_keys(seed, chains))
        key = jax.random.PRNGKey(seed + 1)
        if sampler is None:
            sampler = _timer(run_fn, *tuned[:-1], key)
        sampled, seconds = sampler(*tuned[:-1], key)
        fields = record(tuned, sampled, seconds)
        out.append(
            PeerRun(
                **fields,
                seconds=time.perf_counter() - start,
                warmup_seconds=warmup_seconds,
                sampling_seconds=seconds,
            )
        )
        start = time.perf_counter()
    return out


def sample_mclmc(
    logdensity,
    u0: np.ndarray,
    num_warmup: int,
    num_results: int,
    thin: int,
    desired_energy_var: float,
    fractions: tuple[float, float, float] = (0.4, 0.3, 0.3),
    seeds: tuple[int, ...] = (0,),
) -> list[PeerRun]:
    """BlackJAX MCLMC tuned by ``mclmc_find_L_and_step_size``, one tuner per chain.

    ``num_warmup`` tuning transitions split as ``fractions`` (our stages; BlackJAX's
    ``frac_tune1..3`` of ``num_steps = num_warmup``), no diagonal preconditioning
    (the coordinates are whitened already, as for ours), the same
    ``desired_energy_var``; the isokinetic McLachlan (minimal-norm) integrator, two
    gradients per step like ours. The chains run under ``vmap`` (no control flow).
    One run per seed; the tuner and the sampling loop are compiled once, ahead of time,
    so ``warmup_seconds`` and ``sampling_seconds`` are execution only.
    """
    chains = u0.shape[0]
    flat = jnp.asarray(u0).reshape(chains, -1)
    kernel = mclmc.build_kernel(integrator=integrators.isokinetic_mclachlan)

    def tune(u, key):
        init_key, tune_key = jax.random.split(key)
        state = mclmc.init(u, logdensity, init_key)
        state, params, num_steps = blackjax.mclmc_find_L_and_step_size(
            mclmc_kernel=kernel,
            num_steps=num_warmup,
            state=state,
            rng_key=tune_key,
            logdensity_fn=logdensity,
            frac_tune1=fractions[0],
            frac_tune2=fractions[1],
            frac_tune3=fractions[2],
            desired_energy_var=desired_energy_var,
            diagonal_preconditioning=False,
        )
        return state, params, num_steps

    def run(states, params, key):
        def transition(states, key):
            keys = jax.random.split(key, chains)

            def one(k, s, big_l, eps, imm):
                return kernel(k, s, logdensity, imm, big_l, eps)

            states, info = jax.vmap(one)(
                keys, states, params.L, params.step_size, params.inverse_mass_matrix
            )
            return states, info.energy_change

        def stored(states, key):
            states, energy = jax.lax.scan(transition, states, jax.random.split(key, thin))
            return states, (states.position, energy)

        return jax.lax.scan(stored, states, jax.random.split(key, num_results // thin))[1]

    def record(tuned, sampled, seconds):
        _, params, tune_steps = tuned
        positions, energy = sampled
        tune_steps = int(np.asarray(tune_steps).reshape(-1)[0])
        transitions = (num_results // thin) * thin
        batched = 2 * transitions
        return dict(
            draws=np.moveaxis(np.asarray(positions), 0, 1),
            warmup_grads=2 * tune_steps * chains,
            grads=batched * chains,
            step_size=float(np.mean(params.step_size)),
            trajectory_length=float(np.mean(params.L)),
            energy_error=np.asarray(energy).reshape(transitions, chains),
            accept=float("nan"),
            ms_per_gradient=1e3 * seconds / batched,
        )

    return _per_seed(jax.vmap(tune), run, flat, seeds, record)


def _num_steps(key, avg):
    """:math:`\\lceil U s \\rceil`, :math:`\\mathbb E = ` ``avg`` (BlackJAX's ``rescale``)."""
    return jnp.maximum(jnp.ceil(jax.random.uniform(key) * rescale(avg)), 1).astype(jnp.int32)


def sample_adjusted_mclmc(
    logdensity,
    u0: np.ndarray,
    num_warmup: int,
    num_results: int,
    thin: int = 1,
    target_accept: float = 0.9,
    seeds: tuple[int, ...] = (0,),
) -> list[PeerRun]:
    """BlackJAX adjusted MCLMC (MAMS) tuned by ``adjusted_mclmc_find_L_and_step_size``.

    Dynamic kernel (``adjusted_mclmc_dynamic``, :math:`N = \\lceil U s \\rceil` steps,
    full velocity refresh, as ours), McLachlan integrator, no diagonal preconditioning,
    dual averaging to ``target_accept`` (0.9, ours). The tuner's passes
    (``frac_tune1`` dual averaging, ``frac_tune2`` moments, ``frac_tune1`` dual
    averaging again, ``frac_tune3`` autocorrelation, ``frac_tune1`` final dual
    averaging) are set to 0.2 each of ``num_steps = num_warmup``, so it takes
    ``num_warmup`` transitions as ours does; everything else is BlackJAX's default
    (``max="avg"``, ``target_num_integration_steps=2``). Tuning runs the chains
    under ``vmap``; sampling one after another (``lax.map``), since each chain draws
    its own number of steps and ``vmap`` would run every chain for the longest.
    One run per seed, compiled once (see `sample_mclmc`).
    """
    chains = u0.shape[0]
    flat = jnp.asarray(u0).reshape(chains, -1)
    kernel = adjusted_mclmc_dynamic.build_kernel(
        integration_steps_fn=_num_steps, integrator=integrators.isokinetic_mclachlan
    )

    def tune(u, key):
        init_key, tune_key = jax.random.split(key)
        state = adjusted_mclmc_dynamic.init(u, logdensity, init_key)
        return blackjax.adjusted_mclmc_find_L_and_step_size(
            mclmc_kernel=kernel,
            logdensity_fn=logdensity,
            num_steps=num_warmup,
            state=state,
            rng_key=tune_key,
            target=target_accept,
            frac_tune1=0.2,
            frac_tune2=0.2,
            frac_tune3=0.2,
            diagonal_preconditioning=False,
        )

    def run(states, params, key):
        def transition(states, key):
            def one(args):
                k, s, eps, big_l, imm = args
                return kernel(
                    k,
                    s,
                    logdensity,
                    eps,
                    inverse_mass_matrix=imm,
                    integration_steps_params=(big_l / eps,),
                )

            keys = jax.random.split(key, chains)
            states, info = jax.lax.map(
                one, (keys, states, params.step_size, params.L, params.inverse_mass_matrix)
            )
            return states, (info.num_integration_steps, info.acceptance_rate)

        def stored(states, key):
            states, info = jax.lax.scan(transition, states, jax.random.split(key, thin))
            return states, (states.position, *info)

        return jax.lax.scan(stored, states, jax.random.split(key, num_results // thin))[1]

    def record(tuned, sampled, seconds):
        _, params, tune_steps = tuned
        positions, steps, accept = sampled
        chain_grads = 2 * int(np.asarray(steps).sum())
        return dict(
            draws=np.moveaxis(np.asarray(positions), 0, 1),
            warmup_grads=2 * int(np.asarray(tune_steps).sum()),
            grads=chain_grads,
            step_size=float(np.mean(params.step_size)),
            trajectory_length=float(np.mean(params.L)),
            energy_error=np.full((num_results // thin * thin, chains), np.nan),
            accept=float(np.mean(accept)),
            ms_per_gradient=1e3 * seconds * chains / chain_grads,
        )

    return _per_seed(jax.vmap(tune), run, flat, seeds, record)


def sample_nuts_window(
    logdensity,
    u0: np.ndarray,
    num_warmup: int,
    num_results: int,
    depth: int,
    target_accept: float = 0.8,
    seeds: tuple[int, ...] = (0,),
) -> list[PeerRun]:
    """BlackJAX NUTS after Stan's window adaptation (``blackjax.window_adaptation``).

    One adaptation per chain (dual-averaged step size to ``target_accept`` and a
    diagonal inverse mass matrix, from the identity: the coordinates are whitened
    already), ``num_warmup`` transitions, then ``num_results`` NUTS draws at the
    adapted values, maximum tree depth ``depth``. Warm-up and sampling run the chains
    one after another (``lax.map``, see `_transition`), so the time per gradient of
    the batch is the time per chain-gradient times the number of chains. One run per
    seed, compiled once (see `sample_mclmc`).
    """
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    chains = u0.shape[0]
    flat = jnp.asarray(u0).reshape(chains, -1)
    kernel = nuts.build_kernel()
    adaptation = blackjax.window_adaptation(
        blackjax.nuts,
        logdensity,
        is_mass_matrix_diagonal=True,
        target_acceptance_rate=target_accept,
        adaptation_info_fn=get_filter_adapt_info_fn(info_keys={"num_integration_steps"}),
        max_num_doublings=depth,
    )

    def warmup(positions, keys):
        def one(args):
            (state, params), info = adaptation.run(args[1], args[0], num_warmup)
            return state, params["step_size"], params["inverse_mass_matrix"], info

        states, eps, imm, info = jax.lax.map(one, (positions, keys))
        return states, eps, imm, info.info.num_integration_steps

    def run(states, eps, imm, key):
        def transition(states, key):
            def one(args):
                k, s, e, m = args
                return kernel(k, s, logdensity, e, m, depth)

            keys = jax.random.split(key, chains)
            states, info = jax.lax.map(one, (keys, states, eps, imm))
            return states, (states.position, info.num_integration_steps, info.acceptance_rate)

        return jax.lax.scan(transition, states, jax.random.split(key, num_results))[1]

    def record(tuned, sampled, seconds):
        _, eps, _, warm_steps = tuned
        positions, steps, accept = sampled
        chain_grads = int(np.asarray(steps).sum())
        return dict(
            draws=np.moveaxis(np.asarray(positions), 0, 1),
            warmup_grads=int(np.asarray(warm_steps).sum()),
            grads=chain_grads,
            step_size=float(np.mean(eps)),
            trajectory_length=float("nan"),
            energy_error=np.full((num_results, chains), np.nan),
            accept=float(np.mean(accept)),
            ms_per_gradient=1e3 * seconds * chains / chain_grads,
        )

    return _per_seed(warmup, run, flat, seeds, record)


def fixed_runners(logdensity, u0: np.ndarray, step_size: float, big_l: float, num_steps: int):
    """Compiled BlackJAX MCLMC and adjusted-MCLMC loops at a fixed ``(step_size, L)``.

    Returns ``{"mclmc": (fn, batched gradients per call), "mams": (...)}``; ``fn()``
    runs ``num_steps`` transitions of all chains from ``u0`` and blocks. MCLMC's chains
    run under ``vmap``; MAMS's one after another (``lax.map``, see
    `sample_adjusted_mclmc`), so its batched count is its chain-gradients / chains.
    """
    chains = u0.shape[0]
    flat = jnp.asarray(u0).reshape(chains, -1)
    keys = _per_chain_keys(0, chains)
    eps, big_l = jnp.float32(step_size), jnp.float32(big_l)
    unadjusted = mclmc.build_kernel(integrator=integrators.isokinetic_mclachlan)
    adjusted = adjusted_mclmc_dynamic.build_kernel(
        integration_steps_fn=_num_steps, integrator=integrators.isokinetic_mclachlan
    )

    @jax.jit
    def run_mclmc(states, key):
        def one(states, key):
            ks = jax.random.split(key, chains)
            step = jax.vmap(lambda k, s: unadjusted(k, s, logdensity, 1.0, big_l, eps))
            return step(ks, states)[0], None

        return jax.lax.scan(one, states, jax.random.split(key, num_steps))[0].position

    @jax.jit
    def run_mams(states, key):
        def one(states, key):
            def chain(args):
                k, s = args
                return adjusted(k, s, logdensity, eps, integration_steps_params=(big_l / eps,))

            states, info = jax.lax.map(chain, (jax.random.split(key, chains), states))
            return states, info.num_integration_steps

        states, steps = jax.lax.scan(one, states, jax.random.split(key, num_steps))
        return states.position, steps

    s_mclmc = jax.vmap(lambda u, k: mclmc.init(u, logdensity, k))(flat, keys)
    s_mams = jax.vmap(lambda u, k: adjusted_mclmc_dynamic.init(u, logdensity, k))(flat, keys)
    key = jax.random.PRNGKey(1)
    _, steps = jax.block_until_ready(run_mams(s_mams, key))  # compiles; counts the steps
    jax.block_until_ready(run_mclmc(s_mclmc, key))
    return {
        "mclmc": (lambda: jax.block_until_ready(run_mclmc(s_mclmc, key)), 2 * num_steps),
        "mams": (
            lambda: jax.block_until_ready(run_mams(s_mams, key)),
            2 * float(np.asarray(steps).sum()) / chains,
        ),
    }
