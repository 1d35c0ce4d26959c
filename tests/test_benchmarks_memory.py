"""benchmarks/memory.py and benchmarks/scaling.py run on tiny grids (slow: TF per child)."""

from pathlib import Path

import pytest

from tests.load_script import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    return load_script(ROOT / "benchmarks" / f"{name}.py", name)


@pytest.mark.slow
def test_memory_benchmark_runs(capsys, tmp_path):
    argv = ["--grid", "8", "--chains", "2", "--warmup", "2", "--num-results", "4"]
    argv += ["--field-thin", "1", "--leapfrog", "2", "--no-wiener", "--tmp", str(tmp_path)]
    assert _load("memory").main(argv) == 0
    out = capsys.readouterr().out
    for phase in ("first chunk", "sampling chunk", "checkpoint", "diagnose: field", "plot"):
        assert phase in out


@pytest.mark.slow
def test_scaling_benchmark_runs(capsys):
    argv = ["--grid", "8", "--chains", "1", "--results", "2", "--repeats", "1", "--leapfrog", "2"]
    assert _load("scaling").main(argv) == 0
    assert "samp/stand" in capsys.readouterr().out
