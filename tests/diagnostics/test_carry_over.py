"""A diagnosis that lost an output never reads healthier than the last full one."""

import json

import numpy as np

from fieldhmc import diagnostics as diag

FIELD_WARNING = "median bulk ESS of the field modes below 400 in k-bins 0 (12)"
COVERAGE_WARNING = "95% posterior intervals cover the truth 60% of the time"


def _full(rng) -> dict:
    """A summary as a full diagnosis writes it: a field section and coverage, 2 warnings."""
    posterior = {"a": rng.normal(size=(4, 300))}
    summary = diag.build_summary(
        posterior=posterior, scalars_method="numpy", metadata={"diagnosed_at": "T0"}
    )
    labels = np.zeros((4, 4, 3), dtype=int)
    labels[0, 0, 0] = -1  # k = 0
    draws = rng.normal(size=(4, 40, 4, 4, 4))
    summary["field"] = diag.to_jsonable(diag.field_convergence(draws, labels, 1))
    summary["truth"] = {"k": [0.1], "coverage": {"probs": [0.95], "coverage": [0.6]}}
    summary["warning_sections"].update(field=[FIELD_WARNING], truth=[COVERAGE_WARNING])
    summary["warnings"] = [FIELD_WARNING, COVERAGE_WARNING]
    summary["healthy"] = False
    return json.loads(json.dumps(summary))


def _partial(rng, missing=("fields.h5 is missing: ...",)) -> dict:
    summary = diag.build_summary(
        posterior={"a": rng.normal(size=(4, 300))},
        scalars_method="numpy",
        truth={"k": np.array([0.1]), "coverage": None},
        metadata={"diagnosed_at": "T1"},
        missing_outputs=list(missing),
    )
    return json.loads(json.dumps(summary))


def test_missing_output_is_a_warning_first():
    summary = _partial(np.random.default_rng(0))
    assert summary["warnings"] == ["fields.h5 is missing: ..."]
    assert summary["healthy"] is False
    report = diag.format_report(summary)
    assert "INCOMPLETE RUN DIRECTORY: fields.h5 is missing" in report


def test_sections_that_could_not_be_recomputed_are_kept_and_counted():
    rng = np.random.default_rng(1)
    previous = _full(rng)
    out = diag.carry_over(_partial(rng), previous)
    assert out["field"] == previous["field"]
    assert out["truth"]["coverage"] == previous["truth"]["coverage"]
    assert out["truth"]["k"] == [0.1]  # what was recomputed stays
    assert len(out["warnings"]) == 3  # the missing file plus both earlier warnings
    mark = "(not recomputed: from the diagnosis of T0, 300 draws) "
    assert mark + FIELD_WARNING in out["warnings"]
    assert mark + COVERAGE_WARNING in out["warnings"]
    assert out["carried_over"]["keys"]["field"] == {"diagnosed_at": "T0", "num_draws": 300}
    report = diag.format_report(out)
    assert "[field: NOT recomputed (fields.h5 is missing); as the diagnosis of T0" in report
    assert "Verdict: NOT healthy (3 warnings above; 2 of them carried over" in report

    # carried again: the same warnings, the first origin, no double marks
    again = diag.carry_over(_partial(rng), out)
    assert again["warnings"] == out["warnings"]
    assert again["carried_over"]["keys"] == out["carried_over"]["keys"]


def test_summary_from_before_warning_sections_keeps_every_lost_warning():
    rng = np.random.default_rng(2)
    previous = _full(rng)
    del previous["warning_sections"]
    out = diag.carry_over(_partial(rng), previous)
    assert len(out["warnings"]) == 3
    assert sum(w.endswith(FIELD_WARNING) for w in out["warnings"]) == 1


def test_nothing_is_carried_without_a_missing_output_or_a_previous_summary():
    rng = np.random.default_rng(3)
    whole = _partial(rng, missing=())
    assert diag.carry_over(whole, _full(rng)) == whole
    partial = _partial(rng)
    assert diag.carry_over(partial, None) == partial
