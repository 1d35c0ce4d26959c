"""Cost per gradient and peak memory against grid size: sampler, standalone, raw FFT pair.

For each ``n`` (own process, so peak RSS is that grid's): the quickstart model scaled to
``n³`` (Gaussian likelihood, posterior preconditioner), timed round-robin:

* ``raw pair``: one ``tf.signal.irfft3d`` plus one ``tf.signal.rfft3d`` of its output
  times a field, all chains (the least any value+grad of a Fourier-space field model
  must do; the rfft depends on the irfft, as in a gradient);
* ``standalone``: the model's value+grad, compiled alone;
* ``sampler``: ms per batched gradient inside the compiled HMC driver (with its real
  field outputs: per-draw P(k), tracked modes, stored fields), from its own clock;
  ``--sampler-repeats`` runs, each after one round of the timings above, median.

The raw pair and the standalone value+grad are timed twice: once per call (one XLA
program per gradient), and ``loop``: ``--loop`` gradients inside one compiled
``tf.while_loop`` (``x <- x + 1e-4 grad``; the raw pair as ``z <- rfft3d(irfft3d(z) g)``),
per gradient. The sampler runs its gradients inside one program too, so ``loop`` is
its like-for-like reference: a call of its own allocates every temporary buffer
afresh, and under the CLI's system allocator (``fieldhmc.cli.tf_environment``) a
buffer above glibc's mmap threshold is mapped and page-faulted in on each call.

Ratios: ``sampler / standalone`` (target <= 1.2) and ``standalone / raw pair``
(target <= 1.3), per call and in the loop. ``ms/(N log2 N)`` (of the standalone loop)
normalised to the first row shows the N log N law; ``RSS/chain`` is
``(peak RSS - RSS after importing TF) / chains`` in fields.

Usage::

    python benchmarks/scaling.py                         # 32³, 64³, 128³, 2 chains
    python benchmarks/scaling.py --grid 256 --chains 1 --no-field-outputs  # opt-in
    python benchmarks/scaling.py --grid 512 --chains 1 --no-field-outputs  # check memory
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return math.nan


def child(
    n: int,
    chains: int,
    leapfrog: int,
    results: int,
    repeats: int,
    field_outputs: bool,
    loop: int = 4,
    sampler_repeats: int = 1,
) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from fieldhmc.cli import tf_environment

    tf_environment()  # the allocator the CLI runs with
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _timing import median_seconds

    from fieldhmc import config as cfg
    from fieldhmc import workflow
    from fieldhmc.samplers import MemorySink, Sampler, stateless_seed

    baseline = _hwm_mb()
    raw = cfg.read_yaml(ROOT / "configs" / "quickstart.yaml")
    raw["grid"].update(shape=[n, n, n], box_size=100.0 * n / 32)
    raw["sampler"].update(
        num_chains=chains,
        num_burnin_steps=2,
        num_results=results,
        num_leapfrog_steps=leapfrog,
        jitter_leapfrog=False,
        chunk_size=50,
    )
    raw["outputs"].update(field_thin=max(1, results // 4), store_fields=True)
    config = cfg.config_from_dict(raw, ROOT)
    model = workflow.build_model(config)
    data = np.asarray(model.sample(seed=stateless_seed(3))["data"])
    target = model.target_log_prob_fn(data)
    x0 = model.init_latents("prior", chains, seed=stateless_seed(0))[0]
    x = tf.constant(np.asarray(x0))
    shape = [n, n, n]
    modes = tf.signal.rfft3d(x)

    @tf.function(jit_compile=True, autograph=False)
    def value_and_grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            lp = tf.cast(target(x), tf.float32)
        return lp, tape.gradient(lp, x)

    @tf.function(jit_compile=True, autograph=False)
    def raw_pair(z, g):
        # the rfft reads the irfft's output, as a value+grad's does: two independent
        # FFTs in one program run concurrently on two cores (XLA:CPU), which made
        # this pair look ~1.5x cheaper than any gradient can be
        f = tf.signal.irfft3d(z, shape)
        return tf.reduce_sum(f * g), tf.signal.rfft3d(f * g, shape)

    def loop_of(body, *init):
        @tf.function(jit_compile=True, autograph=False)
        def run(*state):
            return tf.while_loop(
                lambda i, *_: i < loop,
                lambda i, *s: (i + 1, *body(*s)),
                (tf.constant(0), *state),
                maximum_iterations=loop,
            )[1:]

        return lambda: [t.numpy() for t in run(*init)]

    def vg_step(x, acc):
        lp, g = value_and_grad.python_function(x)
        return x + 1e-4 * g, acc + lp

    def raw_step(z, acc):
        f = tf.signal.irfft3d(z, shape)
        return tf.signal.rfft3d(f * x, shape), acc + tf.reduce_sum(f * x)

    fns = {
        "standalone": lambda: [t.numpy() for t in value_and_grad(x)],
        "raw": lambda: [t.numpy() for t in raw_pair(modes, x)],
        "standalone_loop": loop_of(vg_step, x, tf.zeros([chains])),
        "raw_loop": loop_of(raw_step, modes, tf.zeros([])),
    }
    times = {name: [] for name in fns}
    sampler_ms = []

    fo = workflow._field_outputs(config, model) if field_outputs else None
    settings = workflow._settings(config)
    sampler = Sampler(
        target, settings, model.latent_names, workflow._scales(config, model, data), fo
    )
    init = [np.asarray(t) for t in model.init_latents("prior", chains, seed=stateless_seed(1))]
    # round-robin: the timings, a sampler run, the timings, ...; medians of each
    for _ in range(sampler_repeats):
        for name, t in median_seconds(fns, repeats=repeats).items():
            times[name].append(t)
        with tempfile.TemporaryDirectory() as d:
            summary = sampler.run(MemorySink(), Path(d), init, progress=False)
        grads = max(1, summary.sampling_batched_gradients)
        sampler_ms.append(1e3 * summary.sampling_seconds / grads)
    for name, t in median_seconds(fns, repeats=repeats).items():
        times[name].append(t)
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    return {
        "n": n,
        "chains": chains,
        "raw_ms": ms["raw"],
        "standalone_ms": ms["standalone"],
        "raw_loop_ms": ms["raw_loop"] / loop,
        "standalone_loop_ms": ms["standalone_loop"] / loop,
        "sampler_ms": statistics.median(sampler_ms),
        "load": os.getloadavg()[0],
        "peak_mb": _hwm_mb(),
        "baseline_mb": baseline,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--chains", type=int, default=2)
    p.add_argument("--leapfrog", type=int, default=8)
    p.add_argument("--results", type=int, default=8)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--loop", type=int, default=4, help="gradients per call in the loop timings")
    p.add_argument("--sampler-repeats", type=int, default=1)
    p.add_argument(
        "--field-outputs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the sampler computes P(k), tracked modes, running moments and stores fields "
        "(--no-field-outputs: the kernel alone, about half the memory)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        out = child(
            args.grid[0],
            args.chains,
            args.leapfrog,
            args.results,
            args.repeats,
            args.field_outputs,
            args.loop,
            args.sampler_repeats,
        )
        print("RESULT " + json.dumps(out))
        return 0
    rows = []
    for n in args.grid:
        cmd = [sys.executable, __file__, "--child", "--grid", str(n)]
        for name in ("chains", "leapfrog", "results", "repeats", "loop", "sampler_repeats"):
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        cmd += ["--field-outputs" if args.field_outputs else "--no-field-outputs"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
        if res.returncode != 0 or not line:
            print(res.stdout[-2000:], res.stderr[-4000:], file=sys.stderr)
            return 1
        rows.append(json.loads(line[0][len("RESULT ") :]))
    print(
        f"{'grid':>5s} {'chains':>6s} | {'raw pair':>9s} {'standalone':>10s} {'sampler':>8s}"
        f" | {'raw loop':>9s} {'stand loop':>10s} ms/grad"
        f" | {'samp/stand':>10s} {'stand/raw':>9s} | {'loop: s/s':>9s} {'s/raw':>6s}"
        f" (<=1.2, <=1.3) | {'ms/NlogN':>8s} | {'peak MB':>8s} {'RSS/chain':>9s} fields | load"
    )
    ref = None
    for r in rows:
        big_n = r["n"] ** 3
        per = r["standalone_loop_ms"] / (r["chains"] * big_n * math.log2(big_n))
        ref = ref or per
        fields = (r["peak_mb"] - r["baseline_mb"]) / (big_n * 4 / 2**20) / r["chains"]
        print(
            f"{r['n']:>4d}³ {r['chains']:>6d} | {r['raw_ms']:9.2f} {r['standalone_ms']:10.2f} "
            f"{r['sampler_ms']:8.2f} | {r['raw_loop_ms']:9.2f} {r['standalone_loop_ms']:10.2f}"
            f"         | {r['sampler_ms'] / r['standalone_ms']:10.2f} "
            f"{r['standalone_ms'] / r['raw_ms']:9.2f} | "
            f"{r['sampler_ms'] / r['standalone_loop_ms']:9.2f} "
            f"{r['standalone_loop_ms'] / r['raw_loop_ms']:6.2f}                | {per / ref:8.2f} "
            f"| {r['peak_mb']:8.0f} {fields:9.1f}        | {r['load']:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
