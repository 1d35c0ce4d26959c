"""Cost per gradient and peak memory against grid size: sampler, standalone, raw FFT pair.

For each ``n`` (own process, so peak RSS is that grid's): the quickstart model scaled to
``n³`` (Gaussian likelihood, posterior preconditioner), timed round-robin:

* ``raw pair``: one ``tf.signal.irfft3d`` plus one ``tf.signal.rfft3d`` of all chains
  (the least any value+grad of a Fourier-space field model must do);
* ``standalone``: the model's value+grad, compiled alone;
* ``sampler``: ms per batched gradient inside the compiled HMC driver (with its real
  field outputs: per-draw P(k), tracked modes, stored fields), from its own clock.

Ratios: ``sampler / standalone`` (target <= 1.2) and ``standalone / raw pair``
(target <= 1.3). ``ms/(N log2 N)`` normalised to the first row shows the N log N law;
``RSS/chain`` is ``(peak RSS - RSS after importing TF) / chains`` in fields.

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
    n: int, chains: int, leapfrog: int, results: int, repeats: int, field_outputs: bool
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
        f = tf.signal.irfft3d(z, shape)
        return tf.reduce_sum(f * g), tf.signal.rfft3d(g, shape)

    fns = {
        "standalone": lambda: [t.numpy() for t in value_and_grad(x)],
        "raw": lambda: [t.numpy() for t in raw_pair(modes, x)],
    }
    before = median_seconds(fns, repeats=repeats)

    fo = workflow._field_outputs(config, model)[0] if field_outputs else None
    settings = workflow._settings(config)
    sampler = Sampler(
        target, settings, model.latent_names, workflow._scales(config, model, data), fo
    )
    init = [np.asarray(t) for t in model.init_latents("prior", chains, seed=stateless_seed(1))]
    with tempfile.TemporaryDirectory() as d:
        summary = sampler.run(MemorySink(), Path(d), init, progress=False)
    sampler_ms = 1e3 * summary["sampling_seconds"] / max(1, summary["sampling_batched_gradients"])
    after = median_seconds(fns, repeats=repeats)
    return {
        "n": n,
        "chains": chains,
        "raw_ms": 1e3 * (before["raw"] + after["raw"]) / 2,
        "standalone_ms": 1e3 * (before["standalone"] + after["standalone"]) / 2,
        "sampler_ms": sampler_ms,
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
        )
        print("RESULT " + json.dumps(out))
        return 0
    rows = []
    for n in args.grid:
        cmd = [sys.executable, __file__, "--child", "--grid", str(n)]
        for name in ("chains", "leapfrog", "results", "repeats"):
            cmd += [f"--{name}", str(getattr(args, name))]
        cmd += ["--field-outputs" if args.field_outputs else "--no-field-outputs"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
        if res.returncode != 0 or not line:
            print(res.stdout[-2000:], res.stderr[-4000:], file=sys.stderr)
            return 1
        rows.append(json.loads(line[0][len("RESULT ") :]))
    print(
        f"{'grid':>5s} {'chains':>6s} | {'raw pair':>9s} {'standalone':>10s} "
        f"{'sampler':>8s} ms/grad"
        f" | {'samp/stand':>10s} {'stand/raw':>9s} (<=1.2, <=1.3) | {'ms/NlogN':>8s}"
        f" | {'peak MB':>8s} {'RSS/chain':>9s} fields"
    )
    ref = None
    for r in rows:
        big_n = r["n"] ** 3
        per = r["standalone_ms"] / (r["chains"] * big_n * math.log2(big_n))
        ref = ref or per
        fields = (r["peak_mb"] - r["baseline_mb"]) / (big_n * 4 / 2**20) / r["chains"]
        print(
            f"{r['n']:>4d}³ {r['chains']:>6d} | {r['raw_ms']:9.2f} {r['standalone_ms']:10.2f} "
            f"{r['sampler_ms']:8.2f}         | {r['sampler_ms'] / r['standalone_ms']:10.2f} "
            f"{r['standalone_ms'] / r['raw_ms']:9.2f}                | {per / ref:8.2f} "
            f"| {r['peak_mb']:8.0f} {fields:9.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
