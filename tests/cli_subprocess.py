"""Check configs through the CLI in a fresh interpreter, and that TensorFlow stays unloaded.

The test session imports TensorFlow long before these tests run, so whether validation
loads it can only be seen in a new process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def run_bad_then_good(bad: Path, good: Path, out: Path) -> subprocess.CompletedProcess:
    """``run bad --out out`` must exit 2 and ``validate good`` 0, in a fresh interpreter
    where importing the CLI and both commands load no TensorFlow module; the script
    prints ``no-tensorflow`` when all of that held. Returns the finished process."""
    script = textwrap.dedent(
        f"""
        import sys
        from fieldhmc import cli
        assert "tensorflow" not in sys.modules, "importing the CLI loaded TensorFlow"
        code = cli.main(["run", {str(bad)!r}, "--out", {str(out)!r}])
        assert code == 2, code
        code = cli.main(["validate", {str(good)!r}])
        assert code == 0, code
        loaded = sorted(name for name in sys.modules if name.split(".")[0] == "tensorflow")
        assert not loaded, loaded
        print("no-tensorflow")
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
