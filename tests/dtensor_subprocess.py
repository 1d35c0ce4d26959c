"""Run a script on virtual CPU devices in a fresh process and read its JSON result.

TensorFlow fixes its logical devices when it first initialises them, which the test
session has done long before a sharded test runs; the DTensor tests therefore run
their computations in a subprocess that makes the mesh first (one per test module,
shared by its tests through a module-scoped fixture).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_json(module: str, *args: str, timeout: float = 600) -> dict:
    """``python -m module *args`` from the repository root; its last stdout line as JSON."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{module} exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@functools.cache
def default_results() -> dict:
    """The default-run DTensor results of ``tests/ops`` and ``tests/samplers``, computed
    once per test session in one subprocess (one TensorFlow start-up for both)."""
    return run_json("tests.dtensor_cases")
