"""Where a leapfrog step of our NUTS spends its time, kernel by kernel, next to TFP HMC.

Run: ``.venv/bin/python benchmarks/nuts_profile.py [--n 64] [--step-size 0.1]``.
Not part of ``make bench`` (it is a diagnostic, not a target).

Both samplers run on iid N(0, I) with a ``[4, n, n, n]`` state, so the gradient is
almost free and what remains is the samplers' own work per leapfrog step. XLA:CPU
traces every compiled kernel ("thunk") when ``--xla_cpu_enable_xprof_traceme`` is
set; this script reads the TensorFlow profiler's trace of one compiled
``sample_chain`` call and prints, per kernel, the thread-milliseconds spent per
batched leapfrog step (both worker threads summed). HMC takes 63 leapfrog steps per
transition, like our NUTS at step size 0.1 on this target.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true"
).strip()

import tensorflow as tf  # noqa: E402
import tensorflow_probability as tfp  # noqa: E402
from nuts_resonance import _sampler, iid_log_prob  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

from fieldhmc.samplers.nuts import StanNUTS  # noqa: E402


def kernel_times(run, x0, eps) -> tuple[collections.Counter, int]:
    """Thread-ms per kernel name over one call, and the batched leapfrog steps."""
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        state, steps = run(x0, eps, tf.constant([5, 0]))
        state.numpy()
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    totals: collections.Counter = collections.Counter()
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_numa"):  # the intra-op worker threads
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "?")
                # Executor and while-loop events contain the kernels: skip, not double count.
                if not name.startswith(("ThunkExecutor", "while")):
                    totals[name] += event.duration_ps / 1e9
    return totals, int(steps.numpy().max(axis=1).sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--step-size", type=float, default=0.1)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    n = args.n
    x0 = tf.random.stateless_normal([args.chains, n, n, n], seed=[1, 2])
    eps = tf.constant(args.step_size)
    runs = {
        "TFP HMC (L=63)": _sampler(
            lambda e: tfp.mcmc.HamiltonianMonteCarlo(iid_log_prob, e, 63),
            lambda _, r: tf.fill(tf.shape(r.log_accept_ratio), 63),
            3,
        ),
        "fieldnuts": _sampler(
            lambda e: StanNUTS(iid_log_prob, e), lambda _, r: r.num_leapfrog_steps, 3
        ),
    }
    for name, run in runs.items():
        run(x0, eps, tf.constant([0, 1]))[0].numpy()  # compile
        totals, leaves = kernel_times(run, x0, eps)
        total = sum(totals.values()) / leaves
        print(f"\n{name}: {leaves} batched leapfrog steps, {total:.3f} thread-ms per step")
        for kernel, ms in totals.most_common(args.top):
            print(f"  {ms / leaves:7.3f}  {kernel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
