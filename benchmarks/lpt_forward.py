"""FFT pairs per gradient of the 2LPT + RSD + Lagrangian bias + CIC forward model.

Run: ``.venv/bin/python benchmarks/lpt_forward.py [--sizes 32 64] [--chains 1]``.

For each grid size, value and gradient of :math:`\\langle F, r\\rangle` with respect to
the modes **and** the 8 parameters (``[chains]`` tensors, as when they are sampled),
under ``tf.function(jit_compile=True)``, float32, timed round-robin in one process
(medians), in units of ``pair`` (one raw ``irfft3d`` + ``rfft3d``):

* ``full``: :class:`fieldhmc.models.lpt_galaxies.LPTGalaxyForward` with everything on
  (2LPT, RSD, Lagrangian bias with :math:`b_{\\nabla^2}`, CIC deconvolution, real output);
* ``modes_out``: the same returning the deconvolved modes (a Fourier-space likelihood);
* ``lpt_rsd``: 2LPT + RSD + CIC only (no bias, no deconvolution): the matter field in
  redshift space;
* ``zel``: :class:`fieldhmc.models.ZeldovichForward` from the modes (1LPT + CIC, the
  existing model) for scale;
* ``wired_<parametrisation>``: the whole log posterior of ``configs/galaxy_clustering_64.yaml``
  at this grid (E&H power at the sampled :math:`\\Omega_m, \\sigma_8`, the model above,
  the shot-noise likelihood, the priors; ``conditional`` as shipped, and ``noncentred``),
  value and gradient with respect to every latent: what one sampler gradient costs.

``ffts`` counts the single-field 3D transforms per chain in the compiled (optimised) HLO
of each gradient, forward + backward, halved: **FFT pairs per gradient**, independent of
load. The floor of this formulation (see :mod:`fieldhmc.models.lpt`) is 10 pairs for
2LPT + RSD, +1 for :math:`b_{\\nabla^2}`, +1 (modes out) or +2 (real out) for the
deconvolution.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _timing import median_seconds  # noqa: E402

from fieldhmc import models  # noqa: E402
from fieldhmc.models.lpt_galaxies import LPTGalaxyForward  # noqa: E402

PARAMS = dict(
    growth1=0.62, growth2=-0.16, rate1=0.75, rate2=1.45, b1=0.5, b2=0.2, bs2=-0.2, bnabla2=4.0
)


def count_fft_fields(hlo: str, num_chains: int) -> dict[str, int]:
    """Single-field 3D transforms per chain in an optimised HLO module, by kind: an ``fft``
    op whose result is ``[chains, c, n0, n1, m]`` transforms ``c`` fields per chain."""
    out = {"RFFT": 0, "IRFFT": 0}
    for dims, kind in re.findall(r"= \w+\[([\d,]+)\]\S* fft\(.*?fft_type=(I?RFFT)\b", hlo):
        sizes = [int(s) for s in dims.split(",")]
        out[kind] += int(np.prod(sizes[:-3])) // num_chains
    return out


def wired_programs(n: int, num_chains: int) -> dict:
    """The shipped galaxy config's whole log posterior at ``n``^3, per parametrisation:
    ``{name: (compiled value+gradient of the latents, its arguments)}``."""
    from fieldhmc import config as cfg
    from fieldhmc import workflow
    from fieldhmc.samplers import stateless_seed

    path = os.path.join(os.path.dirname(__file__), "..", "configs", "galaxy_clustering_64.yaml")
    out = {}
    for parametrisation in ("conditional", "noncentred"):
        config = cfg.load_config(
            path, [f"grid.shape=[{n},{n},{n}]", f"model.parametrisation={parametrisation}"]
        )
        model = workflow.build_model(config)
        target = model.target_log_prob_fn(np.asarray(workflow.obtain_data(config, model).data))
        latents = [
            tf.constant(v) for v in model.init_latents("prior", num_chains, seed=stateless_seed(1))
        ]

        out[f"wired_{parametrisation}"] = (_value_and_gradient(target), latents)
    return out


def _value_and_gradient(target):
    @tf.function(jit_compile=True)
    def vg(*x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            lp = tf.reduce_sum(target(*x))
        return lp, tape.gradient(lp, x)

    return vg


def bench(n: int, repeats: int, num_chains: int) -> dict[str, float]:
    shape = (n, n, n)
    grid = models.Grid(shape, 5.0 * n)  # 320 Mpc/h at 64^3, the benchmark's cells
    rng = np.random.default_rng(0)
    delta = 0.3 * rng.standard_normal((num_chains, *shape)).astype(np.float32)
    modes = tf.signal.rfft3d(tf.constant(delta))
    r = tf.constant(rng.standard_normal(delta.shape).astype(np.float32))
    params = {k: tf.fill([num_chains], tf.constant(v, tf.float32)) for k, v in PARAMS.items()}
    jit = tf.function(jit_compile=True)

    @jit
    def pair(z, g):
        return tf.reduce_sum(tf.signal.irfft3d(z, shape) * g), tf.signal.rfft3d(g, shape)

    def make_vg(forward_fn, **kwargs):
        def vg(m, r, p):
            with tf.GradientTape() as tape:
                tape.watch([m, p])
                out = forward_fn(m, **p, **kwargs)
                if out.dtype.is_complex:
                    out = tf.math.real(out)  # <Re F_k, r_k>: a real loss of the modes
                y = tf.reduce_sum(out * r[..., : out.shape[-1]])
            return y, tape.gradient(y, [m, p])

        return jit(vg)

    full = LPTGalaxyForward(grid)
    matter = LPTGalaxyForward(grid, bias=None, deconvolve=False)
    zel = models.ZeldovichForward(grid, growth=PARAMS["growth1"])
    matter_params = {k: params[k] for k in matter.parameter_names}
    programs = {
        "full": (make_vg(full.from_modes), params),
        "modes_out": (make_vg(full.from_modes, return_modes=True), params),
        "lpt_rsd": (make_vg(matter.from_modes), matter_params),
        "zel": (make_vg(lambda m: zel.from_modes(m)), {}),
    }
    fns = {"pair": lambda: [t.numpy() for t in pair(modes, r)]}
    counts = {}
    for name, (fn, p) in programs.items():
        fns[name] = lambda fn=fn, p=p: fn(modes, r, p)[0].numpy()
        hlo = fn.experimental_get_compiler_ir(modes, r, p)(stage="optimized_hlo")
        c = count_fft_fields(hlo, num_chains)
        counts[name] = (c["RFFT"] + c["IRFFT"]) / 2
    for name, (fn, latents) in wired_programs(n, num_chains).items():
        fns[name] = lambda fn=fn, x=latents: fn(*x)[0].numpy()
        c = count_fft_fields(fn.experimental_get_compiler_ir(*latents)(stage="optimized_hlo"), 1)
        counts[name] = (c["RFFT"] + c["IRFFT"]) / 2 / num_chains
    times = median_seconds(fns, repeats)
    return {
        **{f"ms_{k}": 1e3 * v for k, v in times.items()},
        **{f"ffts_{k}": v for k, v in counts.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--chains", type=int, default=1)
    args = parser.parse_args(argv)
    cols = ["full", "modes_out", "lpt_rsd", "zel", "wired_conditional", "wired_noncentred"]
    print(
        f"2LPT + RSD + Lagrangian bias + CIC, value+gradient (modes and 8 parameters), "
        f"{args.chains} chain(s), float32, XLA; time in pairs (irfft3d + rfft3d), "
        "FFT pairs counted in the compiled HLO"
    )
    print(
        f"{'n':>5} {'pair ms':>8} "
        + " ".join(f"{c + '/pair':>{len(c) + 6}} {c + ' ffts':>{len(c) + 6}}" for c in cols)
    )
    for n in args.sizes:
        b = bench(n, args.repeats, args.chains)
        print(
            f"{n:>5} {b['ms_pair']:>8.2f} "
            + " ".join(
                f"{b['ms_' + c] / b['ms_pair']:>{len(c) + 6}.2f} {b['ffts_' + c]:>{len(c) + 6}.1f}"
                for c in cols
            )
        )
    print(
        "floor (FFT pairs): 2LPT+RSD 10 = 6 irfft3d (tidal tensor) + 1 rfft3d (source) + "
        "3 irfft3d (displacement), each adjoint one transform; b_nabla2 +1; "
        "deconvolution +2 (real out) or +1 (modes out); target <= 10 for the whole model"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
