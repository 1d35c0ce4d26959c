"""benchmarks/normal_draws.py runs on a tiny grid (slow: it compiles each draw, and each
kernel twice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.load_script import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_normal_draws_benchmark_runs(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    module = load_script(ROOT / "benchmarks" / "normal_draws.py", "normal_draws")
    out = module.main(["--grids", "8", "--repeats", "1", "--kernels", "--kernel-grids", "8"])
    assert set(out[8]) == {*module.CANDIDATES, "fft pair"}
    assert all(v > 0 for v in out[8].values())
    assert set(out["kernels"]) == {(kind, 8) for kind in module.PREVIOUS}
    for ms in out["kernels"].values():
        assert ms["ours"] > 0 and ms["previous"] > 0
    # the patched draw is restored
    from fieldhmc.samplers import threefry

    assert threefry.standard_normal is module.CANDIDATES["ours"]
    assert "ours/previous" in capsys.readouterr().out
