"""What a field-sized normal draw costs under XLA:CPU: ours against TensorFlow's.

Run: ``.venv/bin/python benchmarks/normal_draws.py [--grids 16 32 64] [--repeats 9]
[--kernels] [--kernel-grids 16]``.

fieldnuts draws a ``[chains, n, n, n]`` float32 normal momentum once per transition and
mclmc a partial-refresh normal once per step (hmc and mams keep TensorFlow's draws: see
``fieldhmc/samplers/threefry.py``). Candidates, each drawn
as many times in one compiled ``tf.while_loop`` (summed, so none is dead code),
timed round-robin, medians; µs per draw, and the draw in units of one raw
``irfft3d`` + ``rfft3d`` pair of the same field (the unit of a gradient):

* **ours**: :func:`fieldhmc.samplers.threefry.standard_normal` (Threefry-2x32 of each
  element's index as uint32 TensorFlow ops, by inversion);
* **philox inversion**: TensorFlow's Philox words (``StatelessRandomUniformFullIntV2``)
  by the same inversion, one shot (hmc's momentum, which draws it slab by slab);
* **tf philox normal**, **tf threefry normal**: ``tf.random.stateless_normal`` with
  ``alg="philox"`` (fieldnuts' draw before) and ``"threefry"`` (mclmc's before, mams').

With ``--kernels``, what that buys the two kernels that use it: for fieldnuts and mclmc
at ``--kernel-grids``, ``driver_overhead.py``'s bare kernel (the quickstart model, tuned
by the driver's warm-up, 4 chains) built twice in one process, once with its previous
draw patched in for ours (fieldnuts: tf philox normal; mclmc: tf threefry normal), timed
round-robin: ms per batched gradient, ours / previous.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tensorflow as tf  # noqa: E402
from _timing import median_seconds  # noqa: E402
from tensorflow.python.ops import gen_stateless_random_ops_v2, random_ops_util  # noqa: E402

from fieldhmc.samplers import threefry  # noqa: E402

CHAINS = 4


def _philox_inversion(shape, seed):
    key, counter, alg = random_ops_util.get_key_counter_alg(seed, "philox")
    bits = gen_stateless_random_ops_v2.stateless_random_uniform_full_int_v2(
        shape, key, counter, alg, dtype=tf.uint32
    )
    return threefry.normal_of_bits(bits)


CANDIDATES = {
    "ours": threefry.standard_normal,
    "philox inversion": _philox_inversion,
    "tf philox normal": lambda shape, s: tf.random.stateless_normal(shape, s, alg="philox"),
    "tf threefry normal": lambda shape, s: tf.random.stateless_normal(shape, s, alg="threefry"),
}


def _looped(fn, shape, draws):
    @tf.function(jit_compile=True, autograph=False)
    def run(seed):
        def body(i, acc):
            return i + 1, acc + fn(shape, tf.random.experimental.stateless_fold_in(seed, i))

        return tf.while_loop(lambda i, _: i < draws, body, (0, tf.zeros(shape)))[1]

    seed = tf.constant([1, 2])
    return lambda: run(seed).numpy()


def _fft_pair(shape, draws):
    @tf.function(jit_compile=True, autograph=False)
    def run(x):
        def body(i, acc):
            return i + 1, tf.signal.irfft3d(tf.signal.rfft3d(acc)) + 1.0

        return tf.while_loop(lambda i, _: i < draws, body, (0, x))[1]

    x = tf.zeros(shape)
    return lambda: run(x).numpy()


PREVIOUS = {"fieldnuts": "tf philox normal", "mclmc": "tf threefry normal"}


def kernels(grids, repeats: int) -> dict:
    """Each kind's bare kernel with our draw and with its previous one (see above)."""
    import tempfile

    import driver_overhead as do

    out = {}
    print(f"\n{'kind':>9} {'grid':>5} | {'ours':>7} {'previous':>9} ms/grad | ours/previous")
    for n in grids:
        for kind, previous in PREVIOUS.items():
            with tempfile.TemporaryDirectory() as d:
                transitions = do.TRANSITIONS.get(n, do.TRANSITIONS[64])[kind]
                ours = do.Case(kind, n, 60, transitions, Path(d))
                original = threefry.standard_normal
                threefry.standard_normal = CANDIDATES[previous]
                try:
                    prev = do.Case(kind, n, 60, transitions, Path(d))
                finally:
                    threefry.standard_normal = original
                calls = median_seconds({"ours": ours.bare, "previous": prev.bare}, repeats, 1)
            ms = {
                "ours": calls["ours"] / ours.bare_gradients * 1e3,
                "previous": calls["previous"] / prev.bare_gradients * 1e3,
            }
            r = ms["ours"] / ms["previous"]
            row = f"{ms['ours']:>7.3f} {ms['previous']:>9.3f}"
            print(f"{kind:>9} {n:>4}³ | {row}         | {r:.3f}")
            out[(kind, n)] = ms
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--kernels", action="store_true", help="each kernel's ms/gradient too")
    parser.add_argument("--kernel-grids", type=int, nargs="+", default=[16])
    args = parser.parse_args(argv)
    out = {}
    print(f"{'grid':>5} {'candidate':>20} {'µs/draw':>10} {'FFT pairs':>10} {'/ ours':>8}")
    for n in args.grids:
        shape = [CHAINS, n, n, n]
        draws = max(4, 100 * 16**3 // n**3)
        fns = {name: _looped(fn, shape, draws) for name, fn in CANDIDATES.items()}
        fns["fft pair"] = _fft_pair(shape, draws)
        us = {k: v / draws * 1e6 for k, v in median_seconds(fns, args.repeats, 1).items()}
        for name in CANDIDATES:
            print(
                f"{n:>4}³ {name:>20} {us[name]:>10.1f} {us[name] / us['fft pair']:>10.2f}"
                f" {us[name] / us['ours']:>8.2f}"
            )
        print(f"{n:>4}³ {'(fft pair)':>20} {us['fft pair']:>10.1f}")
        out[n] = us
    if args.kernels:
        out["kernels"] = kernels(args.kernel_grids, args.repeats)
    return out


if __name__ == "__main__":
    main()
