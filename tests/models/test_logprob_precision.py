"""benchmarks/logprob_precision.py runs on a tiny grid and float64 reduction is exact."""

from __future__ import annotations

import pathlib

import pytest

from tests.load_script import load_script

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "logprob_precision.py"


@pytest.mark.skipif(not SCRIPT.exists(), reason="benchmarks/logprob_precision.py not present")
def test_main_on_a_tiny_grid(capsys):
    module = load_script(SCRIPT, "logprob_precision")
    results = module.main(["--n", "16"])
    assert "[terms] n = 16^3" in capsys.readouterr().out
    terms, model = results["terms"], results["model"]
    # float64 accumulation of float32 terms: no reduction error at all here
    assert terms["f64_reduce_err_vs_f32_terms"] <= 1e-9 * abs(terms["log_prob"])
    assert model["f64_reduce_delta_err"] < 1e-3
    # blocked float32 partial sums: within a few float32 roundings of the terms
    assert terms["f64_blocked_err_vs_f32_terms"] <= 1e-6 * abs(terms["log_prob"])
    assert terms["f64_blocked_delta_err"] < 1e-3
