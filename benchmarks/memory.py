"""Peak resident memory of a full ``fieldhmc run``, phase by phase, in multiples of one field.

Each grid runs in its own process: the quickstart config scaled to ``n³`` (HMC, stored
fields, posterior preconditioner, simulated truth), then ``diagnose`` and ``plot``, then
the Wiener-filter reference. The library is instrumented from outside (its functions are
wrapped here, nothing in ``fieldhmc`` knows about it): at every phase boundary the kernel's
peak-RSS counter is reset (``/proc/self/clear_refs``) and read back (``VmHWM``), so each row
is the true peak of that phase alone, not a sample.

"x field" is ``(peak - RSS after importing TensorFlow) / bytes of one float32 field``;
"x field/chain" divides that by the number of chains.

Usage::

    python benchmarks/memory.py                      # 64³ and 128³, 2 chains
    python benchmarks/memory.py --grid 256 --chains 4 --field-thin 1 --num-results 20
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class PhaseMeter:
    """Per-phase peak RSS (MB); nested phases close the enclosing segment first."""

    def __init__(self):
        self.peaks: dict[str, float] = {}
        self.after: dict[str, float] = {}  # RSS at the phase's end (what it leaves resident)
        self.order: list[str] = []
        self.stack = ["startup"]

    def _close_segment(self) -> None:
        label = self.stack[-1]
        mb = _status_kb("VmHWM") / 1024
        if label not in self.peaks:
            self.order.append(label)
        self.peaks[label] = max(self.peaks.get(label, 0.0), mb)
        self.after[label] = _status_kb("VmRSS") / 1024
        _reset_peak()

    def enter(self, label: str) -> None:
        self._close_segment()
        self.stack.append(label)

    def exit(self) -> None:
        self._close_segment()
        self.stack.pop()

    def wrap(self, fn, label):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            name = label(*args, **kwargs) if callable(label) else label
            self.enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit()

        return wrapped


def _patch(obj, name, meter, label):
    setattr(obj, name, meter.wrap(getattr(obj, name), label))


def child(args) -> dict:
    """Run one grid with every phase metered; return the table as a dict."""
    meter = PhaseMeter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from fieldhmc.cli import tf_environment

    tf_environment()  # the allocator the CLI runs with
    import numpy as np
    import tensorflow as tf  # noqa: F401  (the baseline includes TensorFlow)

    from fieldhmc import config as cfg
    from fieldhmc import diagnostics, workflow
    from fieldhmc.samplers import driver

    meter.enter("import TF + fieldhmc")
    meter.exit()
    baseline = meter.peaks["import TF + fieldhmc"]

    n = args.grid
    cw = {}
    _patch(workflow, "build_model", meter, "build model")
    _patch(workflow, "obtain_data", meter, "simulate truth + data")
    _patch(workflow, "_write_data", meter, "write data")
    _patch(workflow, "_scales", meter, "posterior preconditioner")
    _patch(driver.Sampler, "_fresh_state", meter, "initial state + bootstrap (compile)")
    _patch(driver.Sampler, "_checkpoint", meter, "checkpoint")
    _patch(driver.Sampler, "_emit", meter, "store traces + fields")
    _patch(workflow, "export", meter, "export samples.nc, power.nc")
    _patch(workflow, "_load_run", meter, "load run")
    _patch(diagnostics, "field_convergence", meter, "diagnose: field convergence")
    _patch(diagnostics, "coverage", meter, "diagnose: truth coverage")
    _patch(diagnostics, "cross_power", meter, "diagnose: truth cross power")
    _patch(workflow, "diagnose", meter, "diagnose (rest)")
    _patch(workflow, "plot", meter, "plot")
    original_init = driver.Sampler.__init__
    burnin = args.warmup

    def init(self, *a, **k):
        original_init(self, *a, **k)

        def label(*chunk_args):
            # warm-up and post-warm-up chunks are two programs, each compiled on first call
            phase = "warm-up" if int(chunk_args[4]) < burnin else "sampling"
            cw[phase] = cw.get(phase, 0) + 1
            if cw[phase] == 1:
                return f"first {'' if phase == 'warm-up' else 'sampling '}chunk (compile + run)"
            return f"{phase} chunk"

        self._chunk = meter.wrap(self._chunk, label)
        self._sampling_chunk = meter.wrap(self._sampling_chunk, label)

    driver.Sampler.__init__ = init

    raw = cfg.read_yaml(ROOT / "configs" / "quickstart.yaml")
    raw["grid"]["shape"] = [n, n, n]
    raw["grid"]["box_size"] = 100.0 * n / 32
    raw["sampler"].update(
        num_chains=args.chains,
        num_burnin_steps=args.warmup,
        num_results=args.num_results,
        num_leapfrog_steps=args.leapfrog,
        chunk_size=args.chunk_size,
        jitter_leapfrog=False,
    )
    raw["outputs"].update(field_thin=args.field_thin, store_fields=True)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        raw["outputs"]["directory"] = str(Path(tmp) / "run")
        config = cfg.config_from_dict(raw, ROOT)
        workflow.run(config, Path(tmp) / "run", progress=False)
        if args.wiener:
            model = workflow.build_model.__wrapped__(config)
            data = np.load(Path(tmp) / "run" / "data" / "data.npy")
            meter.wrap(model.wiener_latent, "Wiener-filter reference")(data)
    meter.enter("end")
    meter.exit()
    field_mb = n**3 * 4 / 2**20
    return {
        "grid": n,
        "chains": args.chains,
        "baseline_mb": baseline,
        "field_mb": field_mb,
        "rows": [
            (p, meter.peaks[p], meter.after[p]) for p in meter.order if p not in ("startup", "end")
        ],
        "overall_mb": _status_kb("VmHWM") / 1024,  # since the last reset only
    }


def print_table(result: dict) -> None:
    n, c = result["grid"], result["chains"]
    base, fmb = result["baseline_mb"], result["field_mb"]
    print(f"\n{n}³, {c} chains: one field {fmb:.1f} MiB, RSS after importing TF {base:.0f} MB")
    print(
        f"{'phase':40s} | {'peak MB':>8s} {'x field':>8s} {'x field/chain':>14s} "
        f"| {'RSS after':>9s} {'x field':>8s}"
    )
    top = 0.0
    for phase, mb, after in result["rows"]:
        top = max(top, mb)
        mult = (mb - base) / fmb
        rest = (after - base) / fmb
        print(f"{phase:40s} | {mb:8.0f} {mult:8.1f} {mult / c:14.1f} | {after:9.0f} {rest:8.1f}")
    mult = (top - base) / fmb
    print(f"{'whole run (max of phases)':40s} | {top:8.0f} {mult:8.1f} {mult / c:14.1f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=int, nargs="+", default=[64, 128])
    p.add_argument("--chains", type=int, default=2)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--num-results", type=int, default=20)
    p.add_argument("--field-thin", type=int, default=5)
    p.add_argument("--leapfrog", type=int, default=8)
    p.add_argument("--chunk-size", type=int, default=50)
    p.add_argument("--wiener", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--tmp", default=None, help="where the temporary run directory goes")
    p.add_argument("--json", type=Path, help="also write the tables here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.grid = args.grid[0]
        print("RESULT " + json.dumps(child(args)))
        return 0
    results = []
    for n in args.grid:
        cmd = [sys.executable, __file__, "--child", "--grid", str(n)]
        for name in ("chains", "warmup", "num_results", "field_thin", "leapfrog", "chunk_size"):
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        cmd += ["--wiener" if args.wiener else "--no-wiener"]
        if args.tmp:
            cmd += ["--tmp", args.tmp]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode != 0 or not line:
            print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
            return 1
        result = json.loads(line[0][len("RESULT ") :])
        print_table(result)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
