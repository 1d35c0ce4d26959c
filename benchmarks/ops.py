"""Speed of fieldhmc's differentiable real FFTs against raw TensorFlow, side by side.

Run: ``make bench`` or ``.venv/bin/python benchmarks/ops.py [--sizes 64 128]``.
Prints ratios measured in one process (targets: forward <= 1.05, value+grad
<= 1.15); times are medians of repeated calls under ``tf.function(jit_compile=True)``,
timed round-robin. "same fwd HLO" compares the optimised XLA programs of our forward
and raw TF's: when True they are the same ops, and a forward ratio away from 1 is
timing noise of the shared machine.
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

from fieldhmc import ops  # noqa: E402


def _block(t):
    return t.numpy() if not isinstance(t, tuple) else [x.numpy() for x in t]


def bench(n: int, repeats: int) -> dict[str, float]:
    shape = (n, n, n)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    z = tf.constant(np.fft.rfftn(x).astype(np.complex64))
    g = tf.constant(rng.standard_normal(shape).astype(np.float32))
    zfull = tf.constant(np.fft.fftn(x).astype(np.complex64))
    jit = tf.function(jit_compile=True)

    ours_fwd = jit(lambda z: ops.irfft3d(z, shape))
    raw_fwd = jit(lambda z: tf.signal.irfft3d(z, shape))

    @jit
    def ours_vg(z, g):
        with tf.GradientTape() as tape:
            tape.watch(z)
            loss = tf.reduce_sum(ops.irfft3d(z, shape) * g)
        return loss, tape.gradient(loss, z)

    @jit
    def raw_pair(z, g):  # the least any value+grad must do: one c2r and one r2c
        x = tf.signal.irfft3d(z, shape)
        return tf.reduce_sum(x * g), tf.signal.rfft3d(g, shape)

    @jit
    def complex_vg(zfull, g):  # FlowPM-style workaround: complex FFTs with TF's gradients
        with tf.GradientTape() as tape:
            tape.watch(zfull)
            loss = tf.reduce_sum(tf.math.real(tf.signal.ifft3d(zfull)) * g)
        return loss, tape.gradient(loss, zfull)

    def hlo_ops(fn, *args):
        text = fn.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
        return sorted(
            line.split("=", 1)[1].split("(")[0].strip()
            for line in text.splitlines()
            if " = " in line and "ROOT" not in line
        )

    same_forward = hlo_ops(ours_fwd, z) == hlo_ops(raw_fwd, z)
    times = median_seconds(
        {
            "fwd_ours": lambda: _block(ours_fwd(z)),
            "fwd_raw": lambda: _block(raw_fwd(z)),
            "vg_ours": lambda: _block(ours_vg(z, g)),
            "vg_raw": lambda: _block(raw_pair(z, g)),
            "vg_complex": lambda: _block(complex_vg(zfull, g)),
        },
        repeats,
    )
    times["same_forward_hlo"] = same_forward
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    print(f"TensorFlow {tf.__version__}, float32, XLA, median of {args.repeats} calls")
    header = (
        f"{'grid':>6} | {'fwd ours ms':>11} {'fwd raw ms':>10} {'ratio':>6} (<=1.05) | "
        f"{'v+g ours ms':>11} {'raw pair ms':>11} {'ratio':>6} (<=1.15) | "
        f"{'complex ms':>10} {'complex/ours':>12} | same fwd HLO"
    )
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        t = bench(n, args.repeats)
        print(
            f"{n:>5}³ | {1e3 * t['fwd_ours']:>11.2f} {1e3 * t['fwd_raw']:>10.2f} "
            f"{t['fwd_ours'] / t['fwd_raw']:>6.3f}          | "
            f"{1e3 * t['vg_ours']:>11.2f} {1e3 * t['vg_raw']:>11.2f} "
            f"{t['vg_ours'] / t['vg_raw']:>6.3f}          | "
            f"{1e3 * t['vg_complex']:>10.2f} {t['vg_complex'] / t['vg_ours']:>12.2f} | "
            f"{t['same_forward_hlo']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
