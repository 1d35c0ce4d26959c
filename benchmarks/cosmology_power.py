"""Cost of the sigma8-normalised E&H power spectrum and its gradient, side by side.

Run: ``.venv/bin/python benchmarks/cosmology_power.py [--sizes 32 64] [--chains 4]``.

What a sampled :math:`(\\Omega_m, \\sigma_8)` adds to every gradient of the target: the
value and gradient of :math:`\\sum \\ln(1 + P(|k|))` over a grid's half-spectrum with
respect to ``[chains]`` of :math:`(\\Omega_m, \\sigma_8)`, under
``tf.function(jit_compile=True)``, timed round-robin in one process (medians):

* ``P(unique k)``: :func:`~fieldhmc.models.cosmology.linear_power` with the grid's
  NumPy :math:`|k|` (evaluated on its distinct values and gathered back), at a = 1;
* ``P(tensor k)``: the same with :math:`|k|` as a tensor (every mode evaluated);
* ``P(a=0.5)``: ``P(unique k)`` at a = 0.5 (adds the RK4 growth integration);
* ``pair``: one ``tf.signal.irfft3d`` + ``rfft3d`` of ``[chains]`` float32 fields, the unit
  of the forward model's cost.

Wall times depend on the machine's load: quote it with them.
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

from fieldhmc.models import Grid  # noqa: E402
from fieldhmc.models.cosmology import linear_power  # noqa: E402


def _value_and_grad(k, a):
    @tf.function(jit_compile=True)
    def fn(om, s8):
        with tf.GradientTape() as tape:
            tape.watch([om, s8])
            total = tf.reduce_sum(tf.math.log1p(linear_power(k, om, s8, a)))
        return [total, *tape.gradient(total, [om, s8])]

    return fn


def run(size: int, chains: int, repeats: int) -> dict[str, float]:
    kmag = Grid((size,) * 3, (320.0,) * 3).kmag()
    om = tf.constant(np.linspace(0.28, 0.34, chains))
    s8 = tf.constant(np.linspace(0.78, 0.84, chains))
    half = tf.constant(0.5, tf.float64)
    fns = {
        "P(unique k)": _value_and_grad(kmag, 1.0),
        "P(tensor k)": _value_and_grad(tf.constant(kmag), 1.0),
        "P(a=0.5)": _value_and_grad(kmag, half),
    }
    field = tf.random.stateless_normal((chains,) + (size,) * 3, (1, 2))

    @tf.function(jit_compile=True)
    def pair(x):
        return tf.signal.irfft3d(tf.signal.rfft3d(x))

    calls = {name: (lambda f=f: [t.numpy() for t in f(om, s8)]) for name, f in fns.items()}
    calls["pair"] = lambda: pair(field).numpy()
    times = median_seconds(calls, repeats=repeats)
    print(f"{size}^3, {chains} chains: {kmag.size} modes, {np.unique(kmag).size} distinct |k|")
    for name, t in times.items():
        print(f"  {name:12s} {1e3 * t:9.2f} ms  ({t / times['pair']:6.1f} pairs)")
    return times


def main(argv=None) -> dict[int, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    return {n: run(n, args.chains, args.repeats) for n in args.sizes}


if __name__ == "__main__":
    main()
