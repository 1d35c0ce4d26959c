"""Cost of a gradient of the Zel'dovich (1LPT + CIC) forward model, side by side.

Run: ``make bench`` or ``.venv/bin/python benchmarks/forward_model.py [--sizes 64 128]``.

For each grid size, under ``tf.function(jit_compile=True)`` and timed round-robin in
one process (medians):

* ``pair``: one raw ``tf.signal.irfft3d`` + ``tf.signal.rfft3d`` (the unit);
* ``zel``: value and gradient of :math:`\\langle F, r\\rangle` for
  :class:`fieldhmc.models.ZeldovichForward` (no smoothing) from the modes,
  ``F.from_modes(rfft3d(delta))`` with respect to the modes -- what one leapfrog step
  of the sampler pays for the forward model, since :class:`~fieldhmc.models.
  ForwardFieldModel` passes the prior's modes (the target);
* ``zel(delta)``: the same from :math:`\\delta`, ``F(delta)`` (one rfft3d more forward,
  one irfft3d more backward: the entry point before the modes hook);
* ``smooth``: ``zel`` with Gaussian smoothing (one more FFT pair each way);
* ``target`` / ``target(delta)``: value and gradient of the whole posterior log
  density (prior, Zel'dovich, Gaussian likelihood) with respect to the latent field,
  through the modes hook / with a forward function without it (the prior's irfft3d
  and the model's rfft3d, and their adjoints, in addition);
* where the time goes: ``disp``, value and gradient of the displacement from the
  modes alone (:meth:`~fieldhmc.models.ZeldovichForward.displacement_from_modes`: 3
  irfft3d forward, 3 rfft3d backward, batched), and ``cic``, value and position
  gradient of the unit-mass CIC paint alone (one scatter of 8 corners per particle
  forward, one gather of 8 corners backward) at the Zel'dovich positions;
* the floor, with the particles' flat cell indices precomputed outside the program:
  ``fft6`` (3 irfft3d + 3 rfft3d, batched: the displacement's transforms), a scatter
  and a gather of one value per particle (``scatter1``, ``gather1``: the least any
  particle paint and readout can move) and of 8 (``scatter8``, ``gather8``: CIC's
  corners). ``floor1 = fft6 + scatter1 + gather1`` is what no Zel'dovich + mass
  assignment gradient on XLA:CPU can beat; ``floor8`` the same for CIC.

With ``--sampled-params`` it instead measures sampling efficiency on
``benchmarks/zeldovich_sampled_32.yaml`` (Zel'dovich data, growth D and bias b sampled
with the field, P(k) fixed): gradients per min-ESS over the two parameters and every
field coordinate, per kernel (``--kinds``, default fieldnuts and mams), through
``benchmarks/microcanonical.py --config`` (same driver, posterior metric for the field,
the priors' latent scales for D and b, a prior-draw start), and the same model with D
and b fixed (at 1.0 and 1.5; its data differ, drawn with those values).

Target: ``zel / pair <= 4``. Memory: the peak of TensorFlow's CPU allocator during
one call (``tf.config.experimental.get_memory_info``, reset before each; it holds
XLA's temporary buffers), in units of one float32 field (``4 n^3`` bytes).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _timing import median_seconds  # noqa: E402

from fieldhmc import models  # noqa: E402


def _block(out):
    return [t.numpy() for t in out] if isinstance(out, tuple | list) else out.numpy()


def _peak_bytes(fn) -> int:
    tf.config.experimental.reset_memory_stats("CPU:0")
    fn()
    return int(tf.config.experimental.get_memory_info("CPU:0")["peak"])


def _lattice_indices(positions: tf.Tensor, shape) -> tuple[tf.Tensor, tf.Tensor]:
    """Flat int32 indices (batch offset included) of each particle's cell and of its 8
    CIC corners, computed eagerly, so the scatter/gather floor rows pay no index work."""
    x = np.asarray(positions)  # [batch, P, 3]
    n = np.asarray(shape)
    cell = np.floor(x).astype(np.int64)
    strides = np.asarray([n[1] * n[2], n[2], 1])
    offset = np.arange(x.shape[0])[:, None] * int(np.prod(n))
    one = (np.mod(cell, n) * strides).sum(-1) + offset
    corners = np.stack(
        [(np.mod(cell + np.asarray(e), n) * strides).sum(-1) + offset for e in np.ndindex(2, 2, 2)],
        -1,
    )
    return tf.constant(one.reshape(-1), tf.int32), tf.constant(corners.reshape(-1), tf.int32)


def bench(n: int, repeats: int, num_chains: int) -> dict[str, float]:
    shape = (n, n, n)
    grid = models.Grid(shape, 8.0 * n)
    model = models.GaussianFieldModel(grid, models.PowerLaw(1000.0, -1.5, 0.1), 1.0)
    delta = model.field_from_latents(*model.init_latents("prior", num_chains, seed=[0, 1]))
    rng = np.random.default_rng(0)
    r = tf.constant(rng.standard_normal(delta.shape).astype(np.float32))
    z = tf.signal.rfft3d(r)
    jit = tf.function(jit_compile=True)

    @jit
    def pair(z, g):
        x = tf.signal.irfft3d(z, shape)
        return tf.reduce_sum(x * g), tf.signal.rfft3d(g, shape)

    def make_vg(forward):
        @jit
        def vg(d, r):
            with tf.GradientTape() as tape:
                tape.watch(d)
                y = tf.reduce_sum(forward(d) * r)
            return y, tape.gradient(y, d)

        return vg

    forward = models.ZeldovichForward(grid, growth=1.0)
    smoothed = models.ZeldovichForward(grid, growth=1.0, smoothing=8.0)
    modes = tf.signal.rfft3d(delta)
    zel = make_vg(forward.from_modes)
    zel_delta = make_vg(forward)
    smooth = make_vg(smoothed.from_modes)
    disp = make_vg(forward.displacement_from_modes)
    r3 = tf.constant(rng.standard_normal((num_chains, 3, *shape)).astype(np.float32))
    q = np.stack(np.meshgrid(*map(np.arange, shape), indexing="ij")).astype(np.float32)
    positions = tf.reshape(
        tf.transpose(q + forward.displacement(delta), [0, 2, 3, 4, 1]), [num_chains, -1, 3]
    )

    @jit
    def cic(x, g):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(models.cic_paint(x, None, shape) * g)
        return y, tape.gradient(y, x)

    def make_target_vg(forward_fn, **kwargs):
        posterior = models.GaussianFieldModel(grid, model.power, 0.1, forward=forward_fn, **kwargs)
        target = posterior.target_log_prob_fn(posterior.sample(seed=3)["data"])

        @jit
        def vg(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = target(x)
            return y, tape.gradient(y, x)

        return vg

    latent = model.init_latents("prior", num_chains, seed=[0, 1])[0]
    target = make_target_vg(forward)
    # the same model through forward(delta) only (a function without from_modes)
    target_delta = make_target_vg(lambda d: forward(d), check_forward=False)

    fns = {
        "pair": lambda: _block(pair(z, r)),
        "zel": lambda: _block(zel(modes, r)),
        "zel(delta)": lambda: _block(zel_delta(delta, r)),
        "smooth": lambda: _block(smooth(modes, r)),
        "target": lambda: _block(target(latent)),
        "target(delta)": lambda: _block(target_delta(latent)),
        "disp": lambda: _block(disp(modes, r3)),
        "cic": lambda: _block(cic(positions, r)),
    }
    # peaks before the floor's arrays exist (the allocator's peak includes live tensors)
    for fn in fns.values():
        fn()
    field_bytes = 4 * n**3 * num_chains
    peaks = {name: _peak_bytes(fn) / field_bytes for name, fn in fns.items()}

    # the floor: the model's irreducible parts alone, indices precomputed outside
    z3 = tf.signal.rfft3d(r3)

    @jit
    def fft6(z3, g3):
        return tf.reduce_sum(tf.signal.irfft3d(z3, shape) * g3), tf.signal.rfft3d(g3, shape)

    index1, index8 = _lattice_indices(positions, shape)
    values1 = tf.reshape(r, [-1])
    values8 = tf.repeat(values1, 8)
    size = num_chains * n**3

    @jit
    def scatter(i, v):
        return tf.tensor_scatter_nd_add(tf.zeros([size], v.dtype), i[:, None], v)

    @jit
    def gather(f, i):
        return tf.gather(f, i)

    fns.update(
        {
            "fft6": lambda: _block(fft6(z3, r3)),
            "scatter1": lambda: _block(scatter(index1, values1)),
            "gather1": lambda: _block(gather(values1, index1)),
            "scatter8": lambda: _block(scatter(index8, values8)),
            "gather8": lambda: _block(gather(values1, index8)),
        }
    )
    times = median_seconds(fns, repeats)
    return {
        **{f"ms_{k}": 1e3 * v for k, v in times.items()},
        **{f"mem_{k}": v for k, v in peaks.items()},
    }


SAMPLED_CONFIG = os.path.join(os.path.dirname(__file__), "zeldovich_sampled_32.yaml")


def sampled_params_efficiency(grid: int, chains: int, kinds, extra=()) -> dict:
    """Gradients per min-ESS (parameters and field) with D and b sampled, then fixed.

    Rows from :func:`microcanonical.main` ``--config``; ``extra`` are further arguments
    of it (draw counts, ``--set`` overrides)."""
    import microcanonical

    out = {}
    for label, sets in (
        ("growth and bias sampled", []),
        (
            "growth and bias fixed (1.0, 1.5)",
            ["model.forward.growth=1.0", "model.forward.bias=1.5"],
        ),
    ):
        print(f"\n== {label} ==")
        argv = ["--config", SAMPLED_CONFIG, "--grid", str(grid), "--chains", str(chains)]
        argv += ["--kinds", *kinds, "--set", "sampler.preconditioner=posterior", *extra]
        for assignment in sets:
            argv += ["--set", assignment]
        out[label] = microcanonical.main(argv)["config"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--chains", type=int, default=1, help="--sampled-params: 4 is usual")
    parser.add_argument(
        "--sampled-params",
        action="store_true",
        help="sampling efficiency with the Zel'dovich growth and bias sampled (32³) instead",
    )
    parser.add_argument("--kinds", nargs="+", default=["fieldnuts", "mams"])
    args, extra = parser.parse_known_args(argv)
    if args.sampled_params:
        sampled_params_efficiency(32, args.chains, args.kinds, extra)
        return 0
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    print(f"Zel'dovich forward model, value+gradient, {args.chains} chain(s), float32, XLA")
    cols = ["zel", "zel(delta)", "smooth", "target", "target(delta)", "disp", "cic"]
    print(
        f"{'n':>5} {'pair ms':>8} {'zel ms':>8} "
        + " ".join(f"{c + '/pair':>{max(len(c) + 5, 9)}}" for c in cols)
        + f"   peak mem (fields): {'pair':>5} {'zel':>5} {'target':>6}"
    )
    worst = 0.0
    floors = []
    for n in args.sizes:
        b = bench(n, args.repeats, args.chains)
        floors.append((n, b))
        ratio = b["ms_zel"] / b["ms_pair"]
        worst = max(worst, ratio)
        print(
            f"{n:>5} {b['ms_pair']:>8.2f} {b['ms_zel']:>8.2f} "
            + " ".join(f"{b['ms_' + c] / b['ms_pair']:>{max(len(c) + 5, 9)}.2f}" for c in cols)
            + f"   {'':>19}{b['mem_pair']:>5.1f} {b['mem_zel']:>5.1f} {b['mem_target']:>6.1f}"
        )
    print(f"target zel/pair <= 4: {'met' if worst <= 4 else 'NOT met'} (worst {worst:.2f})")
    print(
        "floor (indices precomputed), in pairs: fft6 = 3 irfft3d + 3 rfft3d (batched); "
        "scatter/gather of P = n^3 values (1 per particle) and of 8 P (CIC's corners)"
    )
    print(
        f"{'n':>5} {'fft6':>6} {'sc1':>6} {'ga1':>6} {'sc8':>6} {'ga8':>6}"
        f" {'floor1':>7} {'floor8':>7}"
    )
    for n, b in floors:
        r = {
            k: b["ms_" + k] / b["ms_pair"]
            for k in ("fft6", "scatter1", "gather1", "scatter8", "gather8")
        }
        print(
            f"{n:>5} {r['fft6']:>6.2f} {r['scatter1']:>6.2f} {r['gather1']:>6.2f} "
            f"{r['scatter8']:>6.2f} {r['gather8']:>6.2f} "
            f"{r['fft6'] + r['scatter1'] + r['gather1']:>7.2f} "
            f"{r['fft6'] + r['scatter8'] + r['gather8']:>7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
