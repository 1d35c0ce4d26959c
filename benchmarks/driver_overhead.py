"""The driver's cost per gradient against the bare kernel's, after warm-up.

Run: ``.venv/bin/python benchmarks/driver_overhead.py [--grids 16 64] [--repeats 5]``.

For each kind (``hmc``, ``fieldnuts``, ``mclmc``, ``mams``) and grid, the quickstart
config (Gaussian field, posterior metric, 4 chains, ``chunk_size`` auto -- 50, but
mclmc 512 and hmc 81 at 16³ -- every draw's traces, P(k) and 8 tracked modes, a field
draw every 3rd transition, the field's running moments every ``field_stats_every``-th)
on an ``n``³ box is built by the workflow (``--set sampler.chunk_size=50`` for fixed
chunks),
warmed up through the driver (``--burnin`` transitions, the kind's own tuner) and
checkpointed at the end of warm-up. Then, in one process, round-robin ``--repeats``
times with a 0.3 s pause before each call, medians:

* **driver**: the run resumed from that checkpoint for ``--transitions`` post-warm-up
  transitions (a copy of it each time, so every repeat replays the same draws): the
  driver's own ``sampling_seconds`` (its compiled chunks and the trace copies to the
  host; no compile, checkpoint or sink work) per batched gradient
  (``sampling_batched_gradients``: all chains step until the longest trajectory ends);
* **bare**: the kind's kernel without its tuner (``hmc``, ``fieldnuts``: the inner
  kernel at the tuned step size; ``mclmc``, ``mams``: no adaptation steps, the tuned
  step size and ``L``) on the same whitened target from the same state, the same number
  of transitions in one compiled ``tf.while_loop`` carrying only the state and the
  (slimmed) kernel results; its wall time per batched gradient, counted the same way;
* **driver wall**: the whole resumed ``run()`` (restore, chunks, checkpoints after
  every chunk, sink) per gradient, for reference.

Target (issue 30): driver / bare <= 1.1 for every kind at 16³ and 64³. Single repeats
scatter by ±10–20% on a shared box, so each row also gives the median of the paired
ratios and its bootstrap interval over the repeats: the target is shown met only when
the whole interval is at or below it.

``--profile``: after the timings, one resumed driver run and one bare call per case
under TensorFlow's profiler. Their events are summed by name (the numeric suffix
dropped) and self time (a loop's or conditional's own time, without the operations
inside it): the compiled programs' operations (XLA:CPU thunks) and TensorFlow's own
events around them (a function's dispatch, e.g. ``_chunk_impl_both``). The rows where
the driver spends the most over the bare kernel are printed in microseconds per
transition, with the time outside the programs' execution per chunk (for the driver
its whole resumed run: restore, dispatch, the traces' copies, checkpoints, sink).
"""

from __future__ import annotations

import argparse
import collections
import copy
import glob
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import yaml  # noqa: E402

from fieldhmc import config as cfg  # noqa: E402
from fieldhmc import workflow  # noqa: E402
from fieldhmc.samplers import MemorySink, kinds  # noqa: E402
from fieldhmc.samplers.checkpoint import load_checkpoint  # noqa: E402
from fieldhmc.samplers.kernels import expand_results, slim_results, whiten  # noqa: E402
from fieldhmc.samplers.kinds.families import MicrocanonicalKind  # noqa: E402
from fieldhmc.seeds import stateless_seed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
KINDS = ("hmc", "fieldnuts", "mclmc", "mams")
# The quickstart's hmc options; the other kinds take their defaults.
_HMC_OPTIONS = ("num_leapfrog_steps", "jitter_leapfrog", "target_accept_prob")
# Post-warm-up transitions timed per call, by grid and kind (about a second each).
TRANSITIONS = {
    16: {"hmc": 300, "fieldnuts": 300, "mclmc": 1500, "mams": 300},
    64: {"hmc": 50, "fieldnuts": 50, "mclmc": 250, "mams": 50},
}
TARGET = 1.1


def quickstart_config(
    kind: str, grid: int, burnin: int, results: int, overrides=(), max_tree_depth=None
) -> cfg.Config:
    """The quickstart config on a ``grid``³ box with ``kind`` (hmc keeps its options),
    then ``overrides`` (``--set`` assignments)."""
    raw = copy.deepcopy(cfg.read_yaml(QUICKSTART))
    sampler = raw["sampler"]
    if kind != "hmc":
        for name in _HMC_OPTIONS:
            sampler.pop(name, None)
    sampler.update(kind=kind, num_burnin_steps=burnin, num_results=results)
    if kind == "fieldnuts" and max_tree_depth is not None:
        sampler["max_tree_depth"] = max_tree_depth
    if kind == "mams":  # the warmed-up checkpoint is taken after ceil(burnin / chunk) chunks
        sampler["warmup_stop"] = "fixed"
    raw["grid"]["shape"] = [grid] * 3
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "quickstart.yaml"
        path.write_text(yaml.safe_dump(raw))
        return cfg.load_config(path, overrides)


class Case:
    """One kind at one grid: the warmed-up checkpoint, the driver and the bare runner."""

    def __init__(
        self,
        kind: str,
        grid: int,
        burnin: int,
        transitions: int,
        workdir: Path,
        overrides=(),
        max_tree_depth=None,
    ):
        self.kind, self.grid, self.transitions = kind, grid, transitions
        config = quickstart_config(kind, grid, burnin, transitions, overrides, max_tree_depth)
        model = workflow.build_model(config)
        data = np.asarray(model.sample(seed=stateless_seed(config.data.seed))["data"])
        self.built = workflow.build(config, data, model=model)
        self.sampler = self.built.sampler
        self.warm = workdir / f"{kind}-{grid}-{len(list(workdir.iterdir()))}"
        chunks = math.ceil(burnin / self.sampler.settings.chunk_size)
        start = time.perf_counter()
        init = workflow.initial_state(config, self.built, data)
        self.sampler.run(MemorySink(), self.warm, init, progress=False, max_chunks=chunks)
        self.warmup_seconds = time.perf_counter() - start
        self.tuned = self._bare_from_checkpoint(model, data)
        self.driver()  # the sampling chunks' compile (warm-up's may differ in length)

    def driver(self) -> tuple[float, float]:
        """(chunk seconds, whole-run seconds) per batched gradient of a resumed run."""
        with tempfile.TemporaryDirectory() as d:
            ck = Path(d) / "ck"
            shutil.copytree(self.warm, ck)
            start = time.perf_counter()
            r = self.sampler.run(MemorySink(), ck, resume=True, progress=False)
            wall = time.perf_counter() - start
        if not r.complete:
            raise RuntimeError(f"{self.kind} {self.grid}³: the resumed run did not finish")
        self.gradients = r.sampling_batched_gradients
        return r.sampling_seconds / r.sampling_batched_gradients, wall / self.gradients

    def _bare_from_checkpoint(self, model, data) -> dict:
        arrays, meta = load_checkpoint(self.warm)
        kind = kinds.get(self.kind)
        s = self.sampler.settings
        n = meta["num_parts"]
        x = [arrays[f"x{i}"] for i in range(n)]
        scales = [tf.constant(arrays[f"scale{i}"]) for i in range(n)]
        dtype = tf.as_dtype(x[0].dtype)
        results = self.sampler._carry.numpy("results")  # end of warm-up
        tuned = kind.tuned_parameters(results, [sc.numpy() for sc in scales])
        target_fn = model.target_log_prob_fn(data)
        reference = tf.constant(arrays["reference"])
        target = whiten(target_fn, scales, reference, dtype)
        options = s.kind_options
        dim = sum(int(np.prod(sc.shape)) for sc in scales)
        if isinstance(kind, MicrocanonicalKind):
            kernel = kind.build_kernel(
                target,
                {**options, "trajectory_length": tuned["trajectory_length"]},
                step_size=tf.constant(tuned["step_size"], dtype),
                num_adaptation_steps=0,
                dimension=dim,
            )
        else:
            kernel = kind.inner_kernel(
                target,
                options,
                step_size=tf.constant(tuned["step_size"], dtype),
                num_adaptation_steps=0,
            )
        chains = x[0].shape[0]
        u0 = [tf.constant(xi) / sc for xi, sc in zip(x, scales, strict=True)]
        num_steps = self.transitions

        @tf.function(jit_compile=True, autograph=False)
        def bootstrap(u):
            return slim_results(kernel.bootstrap_results(u))

        @tf.function(jit_compile=True, autograph=False)
        def run(u, res, seed):
            def body(i, u, res, grads):
                step_seed = tf.random.experimental.stateless_fold_in(seed, i)
                u, res = kernel.one_step(u, expand_results(res), seed=step_seed)
                per_chain = tf.broadcast_to(_gradients(res), [chains])
                return i + 1, u, slim_results(res), grads + tf.reduce_max(per_chain)

            _, u, _, grads = tf.while_loop(
                lambda i, *_: i < num_steps, body, (tf.constant(0), u, res, tf.constant(0))
            )
            return u, grads

        res0 = bootstrap(u0)
        seed = tf.constant([3, 4], tf.int32)
        self.bare_gradients = int(run(u0, res0, seed)[1])  # compiles

        def bare():
            start = time.perf_counter()
            u, _ = run(u0, res0, seed)
            [p.numpy() for p in u]
            return (time.perf_counter() - start) / self.bare_gradients

        self.bare = bare
        return tuned


def _gradients(results) -> tf.Tensor:
    """Gradient evaluations of one transition (scalar or per chain) from inner results."""
    if hasattr(results, "num_gradient_evaluations"):  # mclmc, mams
        return results.num_gradient_evaluations
    if hasattr(results, "proposed_results"):  # HMC's Metropolis-Hastings results
        return tf.cast(results.proposed_results.num_leapfrog_steps, tf.int32)
    return tf.cast(results.num_leapfrog_steps, tf.int32)  # NUTS


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--burnin", type=int, default=100, help="warm-up transitions")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply the timed transitions (x50)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the quickstart config (repeatable), e.g. sampler.thin=2",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timings, where the driver's time goes: its compiled operations' "
        "self time against the bare kernel's, per transition (TensorFlow's profiler)",
    )
    parser.add_argument(
        "--max-tree-depth",
        type=int,
        help="fieldnuts' maximum tree depth (default: the kind's, 10); a shallower one "
        "shortens its warm-up at 64³ from the prior-draw start",
    )
    args = parser.parse_args(argv)
    print(
        f"quickstart config, 4 chains, float32, XLA; TF {tf.__version__}; warm-up "
        f"{args.burnin}; fieldnuts depth <= {args.max_tree_depth or 10}; load average "
        f"{os.getloadavg()[0]:.1f}"
        + (f"; --set {' '.join(args.overrides)}" if args.overrides else ""),
        flush=True,
    )
    cases = {}
    with tempfile.TemporaryDirectory() as d:
        for grid in args.grids:
            for kind in args.kinds:
                n = TRANSITIONS.get(grid, TRANSITIONS[64])[kind]
                n = max(50, int(round(n * args.scale / 50)) * 50)
                case = Case(
                    kind, grid, args.burnin, n, Path(d), args.overrides, args.max_tree_depth
                )
                cases[(kind, grid)] = case
                print(
                    f"  built {kind} {grid}³: warm-up {case.warmup_seconds:.0f} s, "
                    f"{n} transitions, {case.gradients} / {case.bare_gradients} batched "
                    f"gradients (driver / bare), tuned "
                    + ", ".join(f"{k} {v:.3g}" for k, v in case.tuned.items()),
                    flush=True,
                )
        times = {key: {"bare": [], "driver": [], "wall": []} for key in cases}
        for repeat in range(args.repeats):
            for key, case in cases.items():
                time.sleep(0.3)
                times[key]["bare"].append(1e3 * case.bare())
                time.sleep(0.3)
                chunk, wall = case.driver()
                times[key]["driver"].append(1e3 * chunk)
                times[key]["wall"].append(1e3 * wall)
                t = times[key]
                print(
                    f"  repeat {repeat + 1}: {key[0]} {key[1]}³ bare {t['bare'][-1]:.3f} "
                    f"driver {t['driver'][-1]:.3f} ms/grad ({t['driver'][-1] / t['bare'][-1]:.3f})",
                    flush=True,
                )
        # inside the with: the cases' checkpoints live in its directory
        profiles = {key: profile_case(case) for key, case in cases.items()} if args.profile else {}
    print(
        f"\nms per batched gradient (4 chains), round-robin median of {args.repeats}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'kind':>9} {'grid':>4} | {'bare':>8} {'driver':>8} {'wall':>8} | "
        f"{'driver/bare':>11} {'(min..max)':>12} | target <= {TARGET}"
    )
    out = {}
    for (kind, grid), t in times.items():
        bare, drv, wall = (float(np.median(t[k])) for k in ("bare", "driver", "wall"))
        ratios = np.asarray(t["driver"]) / np.asarray(t["bare"])
        ratio = drv / bare
        low, high = ratio_interval(t["driver"], t["bare"])
        out[(kind, grid)] = {
            "bare": bare,
            "driver": drv,
            "wall": wall,
            "ratio": ratio,
            "paired": float(np.median(ratios)),
            "interval": (low, high),
        }
        print(
            f"{kind:>9} {grid:>3}³ | {bare:>8.3f} {drv:>8.3f} {wall:>8.3f} | {ratio:>11.3f} "
            f"{f'{ratios.min():.2f}..{ratios.max():.2f}':>12} | "
            f"{'met' if ratio <= TARGET else 'NOT met'}; paired median {np.median(ratios):.3f}, "
            f"90% interval {low:.3f}..{high:.3f}: {verdict(low, high)}",
            flush=True,
        )
    for (kind, grid), prof in profiles.items():
        print_profile(kind, grid, cases[(kind, grid)], prof)
    return out


def self_times(events) -> tuple[collections.Counter, collections.Counter]:
    """Per name, the summed self time (duration less that of the events nested in it)
    and the count of ``(name, start, duration)`` events of one profiler line (nested
    or disjoint, as a thread's trace events are)."""
    total, count = collections.Counter(), collections.Counter()
    stack = []  # [name, end, self time so far] of the open events
    for name, start, duration in sorted(events, key=lambda e: (e[1], -e[2])):
        while stack and stack[-1][1] <= start:
            closed = stack.pop()
            total[closed[0]] += closed[2]
        if stack:
            stack[-1][2] -= duration
        stack.append([name, start + duration, duration])
        count[name] += 1
    for name, _, own in stack:
        total[name] += own
    return total, count


# Runtime events that hold the operations (their self time is the runtime's own).
_RUNTIME = ("ThunkExecutor", "Eager", "TFE_", "CpuExecutable", "BlockUntilReady", "KernelAndDevice")


def profile(fn) -> tuple[collections.Counter, collections.Counter, float, float]:
    """``fn()`` under TensorFlow's profiler: (self time in seconds, count) per event
    name (numeric suffix dropped, summed over threads; compiled operations and
    TensorFlow's events, not the executor's), and the seconds of ``fn`` inside and
    outside the compiled programs' execution."""
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError as exc:  # an internal module: TensorFlow may move it
        raise SystemExit(f"--profile needs tensorflow.tsl.profiler.protobuf ({exc})") from exc
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
        space.ParseFromString(Path(path).read_bytes())
    ops, count = collections.Counter(), collections.Counter()
    executing = 0.0
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            events = [
                (names.get(e.metadata_id, "?"), e.offset_ps, e.duration_ps) for e in line.events
            ]
            # (the calling thread runs some of a program's operations itself)
            executing += sum(d for n, _, d in events if n == "CpuExecutable::ExecuteAsyncOnStream")
            total, n = self_times(events)
            for name, ps in total.items():
                if not name.startswith(_RUNTIME):
                    base = name.rsplit(".", 1)[0] if name.rsplit(".", 1)[-1].isdigit() else name
                    ops[base] += ps * 1e-12
                    count[base] += n[name]
    return ops, count, executing * 1e-12, wall - executing * 1e-12


def profile_case(case: Case) -> tuple:
    """:func:`profile` of one resumed driver run and of one bare call."""
    return profile(case.driver), profile(case.bare)


def print_profile(kind: str, grid: int, case: Case, profiles: tuple, rows: int = 15) -> None:
    """The driver's operations against the bare kernel's (:func:`profile_case`)."""
    (drv, drv_n, drv_exec, drv_host), (bare, bare_n, bare_exec, bare_host) = profiles
    per = 1e6 / case.transitions  # seconds of the run -> microseconds per transition
    chunks = math.ceil(case.transitions / case.sampler.settings.chunk_size)
    print(
        f"\n{kind} {grid}³ under the profiler (one resumed driver run, one bare call), us "
        f"per transition: the programs' execution {per * drv_exec:.1f} (driver) / "
        f"{per * bare_exec:.1f} (bare), the events' self time summed over threads "
        f"{per * sum(drv.values()):.1f} / {per * sum(bare.values()):.1f}; outside the "
        f"programs {1e3 * drv_host / chunks:.2f} ms per chunk of the driver (its whole "
        f"run: restore, checkpoints, sink) / {1e3 * bare_host:.2f} ms in the bare call"
    )
    names = sorted(set(drv) | set(bare), key=lambda k: bare[k] - drv[k])
    head = ("driver - bare", "driver", "(count)", "bare", "(count)")
    print(
        "  "
        + " ".join(f"{h:>{w}}" for h, w in zip(head, (13, 9, 8, 9, 8), strict=True))
        + "  operation"
    )
    for name in names[:rows]:
        print(
            f"  {per * (drv[name] - bare[name]):>13.2f} {per * drv[name]:>9.2f} "
            f"{drv_n[name]:>8d} {per * bare[name]:>9.2f} {bare_n[name]:>8d}  {name[:60]}"
        )


def ratio_interval(driver, bare, level=0.9, resamples=4000, seed=0):
    """Percentile bootstrap interval of the median of the paired ratios driver / bare
    over the round-robin repeats (a repeat's two timings share the box's state, which
    the ratio of medians does not cancel)."""
    ratios = np.asarray(driver, float) / np.asarray(bare, float)
    idx = np.random.default_rng(seed).integers(0, len(ratios), (resamples, len(ratios)))
    boot = np.median(ratios[idx], axis=1)
    tail = 100 * (1 - level) / 2
    return float(np.percentile(boot, tail)), float(np.percentile(boot, 100 - tail))


def verdict(low: float, high: float) -> str:
    """The target shown met (the interval below it), shown missed (above), or neither."""
    if high <= TARGET:
        return "shown met"
    return "shown NOT met" if low > TARGET else "not shown either way"


if __name__ == "__main__":
    main()
    sys.exit(0)
