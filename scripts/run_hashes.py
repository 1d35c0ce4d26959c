"""Hash the stored draws, traces and summary figures of every shipped config.

Runs each config in ``configs/`` (and ``configs/distributed/``) on a small grid with few
steps, one subprocess each, and prints one table row per config: a SHA-256 (first 12
hex digits) of the sampled draws (``samples.nc`` posterior and sample stats), of the
stored fields (``fields.h5`` datasets) and of the numeric figures of ``summary.json``.
Run it on two commits to show that a change keeps the numbers bit-identical::

    python scripts/run_hashes.py --out /tmp/hashes-a      # on commit A
    python scripts/run_hashes.py --out /tmp/hashes-b      # on commit B
    diff /tmp/hashes-a/hashes.tsv /tmp/hashes-b/hashes.tsv

Only what fieldhmc computed is hashed: versions, wall times, paths and dates are not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]

# Figures in summary.json that depend on the clock or the machine, not on the draws.
_VOLATILE_KEYS = ("time", "seconds", "wall", "version", "date", "path", "dir", "host", "_at")


def _small_overrides(config: Path, grid: int, steps: int) -> list[str]:
    return [
        f"grid.shape=[{grid},{grid},{grid}]",
        f"sampler.num_burnin_steps={steps}",
        f"sampler.num_results={steps}",
        "sampler.num_chains=2",
    ]


def _hash_arrays(items) -> str:
    h = hashlib.sha256()
    for name, array in items:
        a = np.ascontiguousarray(array)
        h.update(name.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:12]


def _netcdf_items(path: Path, group: str):
    with h5py.File(path, "r") as f:
        if group not in f:  # ArviZ writes no group for an empty dict (nothing tracked)
            return
    with xr.open_dataset(path, group=group) as ds:
        for name in sorted(ds.data_vars):
            yield f"{group}/{name}", ds[name].values


def _h5_items(path: Path):
    out = []
    with h5py.File(path, "r") as f:

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out.append((name, obj[()]))

        f.visititems(visit)
    return sorted(out, key=lambda item: item[0])


def _summary_items(value, prefix=""):
    if isinstance(value, dict):
        for key in sorted(value):
            if any(v in key.lower() for v in _VOLATILE_KEYS):
                continue
            yield from _summary_items(value[key], f"{prefix}/{key}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _summary_items(v, f"{prefix}[{i}]")
    elif isinstance(value, bool | int | float | str) or value is None:
        yield prefix, np.asarray(json.dumps(value))


def hash_run(run_dir: Path) -> dict[str, str]:
    """The three hashes of one finished run directory."""
    samples = run_dir / "samples.nc"
    fields = run_dir / "fields.h5"
    summary = run_dir / "summary.json"
    draws = [*_netcdf_items(samples, "posterior"), *_netcdf_items(samples, "sample_stats")]
    return {
        "draws": _hash_arrays(draws),
        "fields": _hash_arrays(_h5_items(fields)) if fields.exists() else "-",
        "summary": _hash_arrays(_summary_items(json.loads(summary.read_text()))),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the runs")
    parser.add_argument("--grid", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--only", nargs="*", help="config stems to run (default: all)")
    args = parser.parse_args(argv)
    configs = sorted((ROOT / "configs").glob("*.yaml")) + sorted(
        (ROOT / "configs" / "distributed").glob("*.yaml")
    )
    if args.only:
        configs = [c for c in configs if c.stem in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = ["config\tdraws\tfields\tsummary"]
    for config in configs:
        run_dir = args.out / config.stem
        cmd = [sys.executable, "-m", "fieldhmc", "run", str(config), "--out", str(run_dir)]
        cmd += ["--overwrite", "--no-memory-check"]
        for override in _small_overrides(config, args.grid, args.steps):
            cmd += ["--set", override]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["?"])[-1]
            rows.append(f"{config.stem}\tfailed (exit {result.returncode}): {last}\t-\t-")
        else:
            h = hash_run(run_dir)
            rows.append(f"{config.stem}\t{h['draws']}\t{h['fields']}\t{h['summary']}")
        print(rows[-1], flush=True)
    (args.out / "hashes.tsv").write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
