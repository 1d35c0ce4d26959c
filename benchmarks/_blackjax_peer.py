"""The 64³ whitened Gaussian field posterior in JAX, sampled by BlackJAX's NUTS.

Used by ``nuts_field.py`` when ``jax`` and ``blackjax`` are importable (the optional
``peers`` extra: ``pip install -e '.[peers]'``). The log density is a line-by-line
port of `fieldhmc.models.GaussianFieldModel` (non-centred, fixed P(k), scalar noise,
no mask) on the same whitened coordinates, using the model's own packing tables and
spectrum; `check_against` verifies value differences and gradients against the
TensorFlow target before anything is timed.

BlackJAX runs with an identity metric (the coordinates are already whitened), Stan's
dual averaging of one step size shared by the chains (their mean acceptance, as TFP's
wrapper). Its chains run one after another (``lax.map``; see `_transition` for why not
``vmap``), so its time per gradient of the batch is its time per chain-gradient times
the number of chains.
"""

from __future__ import annotations

import time

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from blackjax.adaptation.step_size import dual_averaging_adaptation
from blackjax.mcmc import nuts

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
    weight = float(np.asarray(model._weights).reshape(-1)[0])
    d = jnp.asarray(np.asarray(data), jnp.float32)
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
        return -0.5 * jnp.sum(z * z) - 0.5 * weight * jnp.sum(jnp.square(d - delta))

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
