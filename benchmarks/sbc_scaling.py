"""Wall time of an SBC sweep on a LocalCluster of 1 vs 2 worker processes.

Run: ``.venv/bin/python benchmarks/sbc_scaling.py [--realisations 16] [--n 16]``
(part of ``make bench``; needs the ``distributed`` extra). The sweep is the README's
recipe for ``configs/hierarchical_64.yaml`` at ``n³``: per worker count, a fresh
cluster (``workers x threads = cores``) runs every realisation into a fresh directory.
Each worker runs one job at a time (1 Dask thread; its TensorFlow gets
``cores / workers`` threads); ``--threaded`` adds 1 worker x 2 Dask threads. It prints
the wall time from cluster start to gathered ``sbc.nc``, the time of the
sweep alone (cluster already up), the realisations' own summed compute seconds, and
the ratio 1-worker / 2-worker (ideal: the number of cores, 2 on this machine; the
first realisation on every worker pays the TensorFlow import and the XLA compile).
``--keep DIR`` keeps the 2-worker sweep (the README's rank plots come from it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
)  # the workers import this tree too

from fieldhmc import config as cfg  # noqa: E402
from fieldhmc import distributed, sweep  # noqa: E402

#: The README's SBC recipe for configs/hierarchical_64.yaml (with grid.shape added).
RECIPE = [
    "sampler.num_chains=4",
    "sampler.num_burnin_steps=200",
    "sampler.num_results=200",
    "sampler.max_tree_depth=6",
    "outputs.field_thin=20",  # 10 draws x 4 chains = 40 ranked draws
]


def one(config, num_workers: int, threads: int, realisations: int, out: Path) -> dict:
    t0 = time.perf_counter()
    with distributed.open_client(num_workers=num_workers, threads_per_worker=threads) as client:
        client.wait_for_workers(num_workers)
        t1 = time.perf_counter()
        result = sweep.run_sbc(config, out, realisations, client, progress=False)
        t2 = time.perf_counter()
    records = [
        json.loads((out / "realisations" / f"r{i:04d}" / "sbc.json").read_text())
        for i in range(realisations)
    ]
    return {
        "total": t2 - t0,
        "sweep": t2 - t1,
        "compute": sum(r["seconds"] for r in records),
        "first": max(r["seconds"] for r in records),
        "failures": len(result.failures),
        "p_family": float(result.dataset.attrs["p_family"]),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--realisations", type=int, default=16)
    parser.add_argument("--n", type=int, default=16, help="grid size n (n³)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--keep", type=Path, help="keep the 2-worker sweep here")
    parser.add_argument(
        "--threaded",
        action="store_true",
        help="also 1 worker x 2 Dask threads (two jobs at once in one TensorFlow)",
    )
    args = parser.parse_args(argv)
    config = cfg.load_config(
        ROOT / "configs" / "hierarchical_64.yaml",
        [f"grid.shape=[{args.n},{args.n},{args.n}]", *RECIPE, *args.overrides],
    )
    print(f"{config.summary()}; {args.realisations} realisations; {os.cpu_count()} cores")
    layouts = [(1, 1), (2, 1)] + ([(1, 2)] if args.threaded else [])
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers, threads in layouts:
            out = Path(tmp) / f"w{workers}t{threads}"
            rows[workers, threads] = one(config, workers, threads, args.realisations, out)
            if (workers, threads) == (2, 1) and args.keep is not None:
                shutil.rmtree(args.keep, ignore_errors=True)
                shutil.copytree(out, args.keep)
    print(
        f"{'workers x threads':>17} | {'total s':>8} {'sweep s':>8} {'compute s':>9} "
        f"{'slowest s':>9} | failures  p_family"
    )
    for (w, t), r in rows.items():
        print(
            f"{f'{w} x {t}':>17} | {r['total']:8.1f} {r['sweep']:8.1f} {r['compute']:9.1f} "
            f"{r['first']:9.1f} | {r['failures']:8d}  {r['p_family']:.3g}"
        )
    one_, two = rows[1, 1], rows[2, 1]
    print(
        f"speed-up 1 -> 2 workers: total {one_['total'] / two['total']:.2f}x, "
        f"sweep {one_['sweep'] / two['sweep']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
