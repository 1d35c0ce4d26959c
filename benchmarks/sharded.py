"""Sharded (DTensor slab) gradients: all-to-all bytes, time on 1/2/4 devices, memory.

``python benchmarks/sharded.py [--grids 32 64] [--memory-grid 128]`` prints

1. **communication per gradient** of the Gaussian target: the number of all-to-all
   exchanges in the traced value-and-gradient (counted while tracing) times the bytes
   each moves, ``(P-1)/P * chains * n0 * n1 * (n2//2+1) * complex bytes``;
2. **ms per gradient** (median, round-robin) of the plain single-device target
   (``fieldhmc.ops``) and of the sharded one on meshes of 1, 2 and 4 virtual CPU
   devices of this process. Virtual devices share the machine's cores, so this
   measures DTensor's overhead, not a speed-up;
3. **memory per device at 128³** (4 chains, float32), each mode in a fresh process:
   the peak RSS increase of one value-and-gradient over the process after making the
   state, for one device (plain) and for a 4-device mesh. Virtual devices share one
   address space, so the per-device figure is the total / 4 (DTensor components are
   equal by construction); the size of each device's component of the state is
   printed too;
4. **ms per gradient of a whole HMC run, through the driver vs standalone** on
   meshes of 1, 2 and 4 devices (and plain tensors): ``ShardedSampler.run`` (the
   chunked driver: checkpoint after every chunk, trace sink, with and without the
   per-draw field outputs of ``fieldhmc run``) against the bare loop over the same
   compiled transition (:func:`fieldhmc.samplers.sharded.run_sharded_hmc` without
   its compile), per gradient (``transitions x num_leapfrog_steps``).

5. **ms per gradient of sharded mclmc / mams runs** (and hmc) through the driver
   (``ShardedSampler.run``, no warm-up, no field outputs) on plain tensors and meshes
   of 1, 2 and 4 devices, per batched gradient evaluation (MCLMC: one minimal-norm
   step, 2 gradients, per transition; MAMS: :math:`N` such steps, each a compiled
   call from Python).

``--driver-only`` runs section 4 alone, ``--microcanonical-only`` section 5.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHAINS = 4


def _problem(n: int):
    import tensorflow as tf

    from fieldhmc import models
    from fieldhmc.seeds import stateless_seed

    grid = models.Grid((n, n, n), 100.0 * n / 32)
    model = models.GaussianFieldModel(
        grid, models.PowerLaw(1000.0, -1.5, 0.1), sigma=2.0, dtype=tf.float32
    )
    data = model.sample(seed=stateless_seed(7))["data"].numpy()
    return model, data


def _state(target, n: int, mesh):
    """A standard-normal state made on the devices (no host copy of the field)."""
    import tensorflow as tf

    from fieldhmc.samplers.counter_random import global_index, index_normal, key

    index = global_index((CHAINS, n, n, n), mesh)
    return tf.function(
        lambda: index_normal(index, key(0, tf.constant(0, tf.int64), 0), tf.float32)
    )()


def _block(out):
    from tensorflow.experimental import dtensor

    lp = out[0]
    return [c.numpy() for c in dtensor.unpack(lp)] if dtensor.is_dtensor(lp) else lp.numpy()


def exchanges_per_gradient(n: int, mesh) -> int:
    """Count the all-to-all exchanges traced into one value-and-gradient."""
    import tensorflow as tf

    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.ops import sharded

    model, data = _problem(n)
    target = ShardedGaussianTarget(model, data, mesh)
    count = {"n": 0}
    original = sharded._exchange

    def counting(t, layout):
        count["n"] += 1
        return original(t, layout)

    sharded._exchange = counting
    try:
        tf.function(target.value_and_gradient).get_concrete_function(_state(target, n, mesh))
    finally:
        sharded._exchange = original
    return count["n"]


def timing(grids, repeats: int) -> None:
    import tensorflow as tf
    from _timing import median_seconds
    from tensorflow.experimental import dtensor

    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.ops import sharded

    sharded.make_mesh(4)
    meshes = {
        p: dtensor.create_mesh([("x", p)], devices=[f"CPU:{i}" for i in range(p)])
        for p in (1, 2, 4)
    }
    print(
        "\n1. all-to-all volume per gradient (Gaussian target, value + gradient, float32, "
        f"{CHAINS} chains)"
    )
    print("  grid |  P | exchanges | MiB per exchange | MiB per gradient | per device MiB")
    for n in grids:
        m = n // 2 + 1
        for p in (2, 4):
            k = exchanges_per_gradient(n, meshes[p])
            per = (p - 1) / p * CHAINS * n * n * m * 8
            print(
                f"  {n:3d}³ | {p:2d} | {k:9d} | {per / 2**20:16.2f} | {k * per / 2**20:16.2f} |"
                f" {k * per / p / 2**20:14.2f}"
            )
    print(
        f"\n2. ms per value-and-gradient (median of {repeats}, round-robin; virtual devices "
        "share 2 cores)"
    )
    print("  grid | plain (fieldhmc.ops) | P=1 mesh | P=2 mesh | P=4 mesh | P=4 / plain")
    for n in grids:
        model, data = _problem(n)
        fns = {}
        for name, mesh in [("plain", None), *((f"P={p}", meshes[p]) for p in (1, 2, 4))]:
            target = ShardedGaussianTarget(model, data, mesh)
            x = _state(target, n, mesh)
            f = tf.function(target.value_and_gradient)
            fns[name] = lambda f=f, x=x: _block(f(x))
        t = median_seconds(fns, repeats=repeats, warmup=2)
        ms = {k: 1e3 * v for k, v in t.items()}
        print(
            f"  {n:3d}³ | {ms['plain']:20.1f} | {ms['P=1']:8.1f} | {ms['P=2']:8.1f} |"
            f" {ms['P=4']:8.1f} | {t['P=4'] / t['plain']:11.2f}"
        )


def driver_timing(grids, repeats: int, transitions: int = 10, leapfrog: int = 4) -> None:
    """Section 4: the driver's sharded run against the bare transition loop."""
    import tempfile

    import numpy as np
    import tensorflow as tf
    from _timing import median_seconds
    from tensorflow.experimental import dtensor

    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.ops import sharded
    from fieldhmc.samplers import MemorySink, SamplerSettings
    from fieldhmc.samplers.counter_random import base_key as _base_key
    from fieldhmc.samplers.reductions import host as _host
    from fieldhmc.samplers.sharded import ShardedFieldOutputs, ShardedSampler, make_hmc_transition
    from fieldhmc.workflow import tracked_mode_indices

    sharded.make_mesh(4)
    meshes = {"plain": None}
    meshes.update(
        {
            f"P={p}": dtensor.create_mesh([("x", p)], devices=[f"CPU:{i}" for i in range(p)])
            for p in (1, 2, 4)
        }
    )
    settings = SamplerSettings(
        kind="hmc",
        num_chains=CHAINS,
        num_burnin_steps=0,
        num_results=transitions,
        num_leapfrog_steps=leapfrog,
        step_size=0.05,
        chunk_size=5,
        field_thin=5,
    )
    grads = transitions * leapfrog
    print(
        f"\n4. ms per gradient of an HMC run ({transitions} transitions x {leapfrog} leapfrog,"
        f" {CHAINS} chains, float32, chunks of 5; median of {repeats}, round-robin)"
    )
    print(
        "  grid |  mesh | standalone | driver | driver + field outputs |"
        " driver / standalone | + outputs / standalone"
    )
    tmp = Path(tempfile.mkdtemp(prefix="sharded-bench-"))
    for n in grids:
        model, data = _problem(n)
        grid = model.grid
        init = [np.random.default_rng(0).standard_normal((CHAINS, n, n, n)).astype(np.float32)]
        outputs = ShardedFieldOutputs(grid, grid.kbins(), tracked_mode_indices(grid, 8), True)
        for name, mesh in meshes.items():
            target = ShardedGaussianTarget(model, data, mesh)
            x0 = target.shard(init[0])
            one_step = make_hmc_transition(
                target.value_and_gradients,
                (CHAINS, n, n, n),
                tf.float32,
                num_leapfrog_steps=leapfrog,
                mesh=mesh,
            )
            vg = tf.function(target.value_and_gradients, autograph=False)
            bases = _base_key(0, 0), _base_key(0, 1)
            eps = tf.constant(0.05, tf.float32)

            def standalone(one_step=one_step, vg=vg, x0=x0, bases=bases, eps=eps):
                x = [x0]
                lp, grad = vg(x)
                for t in range(transitions):
                    x, lp, grad, _, _, acc = one_step(
                        x, lp, grad, eps, *bases, tf.constant(t, tf.int64)
                    )
                    _host(lp), _host(acc)

            drivers = {
                "driver": ShardedSampler(target, settings),
                "outputs": ShardedSampler(target, settings, outputs),
            }

            def driver(sampler, key, where=tmp / f"{n}-{name}", init=init):
                sampler.run(MemorySink(), where / key, init, progress=False)

            fns = {"standalone": standalone}
            fns.update({k: (lambda v=v, k=k: driver(v, k)) for k, v in drivers.items()})
            t = median_seconds(fns, repeats=repeats, warmup=1)
            ms = {k: 1e3 * v / grads for k, v in t.items()}
            print(
                f"  {n:3d}³ | {name:>5} | {ms['standalone']:10.2f} | {ms['driver']:6.2f} |"
                f" {ms['outputs']:22.2f} | {t['driver'] / t['standalone']:19.2f} |"
                f" {t['outputs'] / t['standalone']:22.2f}"
            )


def microcanonical_timing(grids, repeats: int, transitions: int = 10) -> None:
    """Section 5: ms per gradient of sharded mclmc / mams runs (and hmc) through the driver."""
    import tempfile

    import numpy as np
    from _timing import median_seconds
    from tensorflow.experimental import dtensor

    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.ops import sharded
    from fieldhmc.samplers import MemorySink, SamplerSettings
    from fieldhmc.samplers.sharded import ShardedSampler

    sharded.make_mesh(4)
    meshes = {"plain": None}
    meshes.update(
        {
            f"P={p}": dtensor.create_mesh([("x", p)], devices=[f"CPU:{i}" for i in range(p)])
            for p in (1, 2, 4)
        }
    )
    kinds = {
        "hmc": {"num_leapfrog_steps": 4, "step_size": 0.05},
        "mclmc": {"step_size": 0.5, "trajectory_length": 1.0},
        "mams": {"step_size": 0.5, "trajectory_length": 2.0},
    }
    print(
        f"\n5. ms per gradient of sharded runs through the driver ({transitions} transitions,"
        f" no warm-up, {CHAINS} chains, float32, chunks of 5, no field outputs; median of"
        f" {repeats}, round-robin; gradients = batched value-and-gradient evaluations)"
    )
    print("  grid |  mesh |  hmc | mclmc | mams | mclmc / hmc | mams / hmc | mams grads/transition")
    tmp = Path(tempfile.mkdtemp(prefix="sharded-micro-bench-"))
    for n in grids:
        model, data = _problem(n)
        init = [np.random.default_rng(0).standard_normal((CHAINS, n, n, n)).astype(np.float32)]
        for name, mesh in meshes.items():
            target = ShardedGaussianTarget(model, data, mesh)
            grads, fns = {}, {}
            for kind, kw in kinds.items():
                settings = SamplerSettings(
                    kind=kind,
                    num_chains=CHAINS,
                    num_burnin_steps=0,
                    num_results=transitions,
                    chunk_size=5,
                    **kw,
                )
                sampler = ShardedSampler(target, settings)
                where = tmp / f"{n}-{name}-{kind}"
                sampler.run(MemorySink(), where, init, progress=False)  # compiles
                # a second run: its summary counts every chunk's gradients (the first
                # run's leaves out the chunk that compiled)
                summary = sampler.run(MemorySink(), where, init, progress=False)
                grads[kind] = summary.sampling_batched_gradients

                def run(sampler=sampler, where=where, init=init):
                    sampler.run(MemorySink(), where, init, progress=False)

                fns[kind] = run
            t = median_seconds(fns, repeats=repeats, warmup=0)
            ms = {k: 1e3 * t[k] / grads[k] for k in kinds}
            print(
                f"  {n:3d}³ | {name:>5} | {ms['hmc']:4.2f} | {ms['mclmc']:5.2f} |"
                f" {ms['mams']:4.2f} | {ms['mclmc'] / ms['hmc']:11.2f} |"
                f" {ms['mams'] / ms['hmc']:10.2f} | {grads['mams'] / transitions:21.1f}"
            )


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def memory_worker(n: int, p: int) -> None:
    """One mode in this process: print JSON {state, peak increase, component bytes}."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from fieldhmc.models.sharded import ShardedGaussianTarget
    from fieldhmc.ops import sharded

    mesh = sharded.make_mesh(4) if p > 1 else None
    if mesh is not None and p != 4:
        mesh = dtensor.create_mesh([("x", p)], devices=[f"CPU:{i}" for i in range(p)])
    model, data = _problem(n)
    target = ShardedGaussianTarget(model, data, mesh)
    x = _state(target, n, mesh)
    f = tf.function(target.value_and_gradient)
    f.get_concrete_function(x)  # compile outside the measurement
    comp = dtensor.unpack(x)[0] if dtensor.is_dtensor(x) else x
    del model, data
    _reset_peak()
    base = _rss_bytes()
    out = f(x)
    _block(out)
    peak = _hwm_bytes() - base
    print(
        json.dumps(
            {
                "peak_increase": peak,
                "component_bytes": int(comp.shape.num_elements() * 4),
                "field_bytes": CHAINS * n**3 * 4,
                "rss_resource": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            }
        )
    )


def memory(n: int) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    rows = {}
    for p in (1, 4):
        proc = subprocess.run(
            [sys.executable, __file__, "--memory-worker", str(n), str(p)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        rows[p] = json.loads(proc.stdout.strip().splitlines()[-1])
    field = rows[1]["field_bytes"]
    print(
        f"\n3. memory of one value-and-gradient at {n}³ x {CHAINS} chains (float32; one "
        f"state = {field / 2**20:.0f} MiB), fresh process each"
    )
    print(
        "  mode | state per device MiB | peak increase MiB (all devices) | per device MiB |"
        " per device / single device | increase in states"
    )
    single = rows[1]["peak_increase"]
    for p, r in rows.items():
        per_dev = r["peak_increase"] / p
        print(
            f"  {'1 dev' if p == 1 else f'P={p} '} | {r['component_bytes'] / 2**20:20.1f} |"
            f" {r['peak_increase'] / 2**20:31.1f} | {per_dev / 2**20:14.1f} |"
            f" {per_dev / single:26.3f} | {r['peak_increase'] / field:18.2f}"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--memory-grid", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--driver-repeats", type=int, default=3)
    parser.add_argument("--driver-only", action="store_true", help="section 4 only")
    parser.add_argument(
        "--microcanonical-only", action="store_true", help="section 5 (mclmc / mams) only"
    )
    parser.add_argument("--memory-worker", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_worker:
        memory_worker(*args.memory_worker)
        return
    if args.microcanonical_only:
        microcanonical_timing(args.grids, args.driver_repeats)
        return
    if not args.driver_only:
        memory(args.memory_grid)
        timing(args.grids, args.repeats)
    driver_timing(args.grids, args.driver_repeats)
    microcanonical_timing(args.grids, args.driver_repeats)


if __name__ == "__main__":
    main()
