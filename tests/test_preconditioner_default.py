"""The default preconditioner per likelihood, and the report line that names it."""

from pathlib import Path

import numpy as np
import pytest

from fieldhmc import diagnostics as diag
from fieldhmc.config import config_from_dict, schema_text

ROOT = Path(__file__).resolve().parents[1]
MASK = {"generate": {"kind": "slab", "fraction": 0.2, "seed": 1}}
SAMPLED = {"log_amplitude": {"sample": True}}


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({}, "posterior"),
        ({"likelihood": {"kind": "gaussian", "sigma": 0.5}}, "posterior"),
        ({"likelihood": {"kind": "masked_gaussian", "mask": MASK}}, "prior"),
        ({"likelihood": {"kind": "lognormal_poisson"}}, "posterior"),
        ({"likelihood": {"kind": "lognormal_poisson", "mask": MASK}}, "prior"),
        ({"hyperparameters": SAMPLED}, "prior"),
        # conditional with Gaussian data: the block of the P(k) parameters' Laplace fit
        ({"hyperparameters": SAMPLED, "parametrisation": "conditional"}, "posterior"),
        (
            {
                "hyperparameters": SAMPLED,
                "parametrisation": "conditional",
                "likelihood": {"kind": "masked_gaussian", "mask": MASK},
            },
            "posterior",
        ),
        ({"hyperparameters": SAMPLED, "parametrisation": "conditional_scale"}, "prior"),
        (
            {
                "hyperparameters": SAMPLED,
                "parametrisation": "conditional",
                "likelihood": {"kind": "lognormal_poisson"},
            },
            "prior",
        ),
    ],
)
def test_default_preconditioner_per_likelihood(model, expected):
    config = config_from_dict({"model": model}, ROOT)
    assert config.sampler.preconditioner == expected
    # the resolved choice is what the run directory's config.yaml records
    assert config.to_dict()["sampler"]["preconditioner"] == expected


def test_explicit_preconditioner_wins():
    raw = {
        "model": {"likelihood": {"kind": "masked_gaussian", "mask": MASK}},
        "sampler": {"preconditioner": "posterior"},
    }
    assert config_from_dict(raw, ROOT).sampler.preconditioner == "posterior"


def test_sharded_default_is_identity():
    raw = {"distribution": {"mesh": [2]}, "grid": {"shape": [8, 8, 8]}}
    assert config_from_dict(raw, ROOT).sampler.preconditioner == "identity"


def test_schema_states_the_default():
    text = schema_text()
    entry = " ".join(text[text.index("sampler.preconditioner:") :].split("\nsampler.")[0].split())
    assert "prior when the likelihood has a mask" in entry and "benchmarks/README.md" in entry


def _poorly_mixed(preconditioner, is_masked, **kw):
    rng = np.random.default_rng(5)
    walk = np.cumsum(rng.normal(size=(4, 200)), axis=1)  # ESS far below 400
    return diag.build_summary(
        posterior={"mode[1,0,0].real": walk, "mode[1,0,0].imag": rng.normal(size=(4, 200))},
        scalars_method="numpy",
        preconditioner=preconditioner,
        is_masked=is_masked,
        **kw,
    )


def test_report_names_the_preconditioner_when_mixing_is_poor():
    summary = _poorly_mixed("posterior", True)
    advice = summary["mixing"]["advice"]
    assert summary["mixing"]["poor"] == ["scalars' R-hat/ESS"]
    assert "'posterior' preconditioner" in advice and "sampler.preconditioner=prior" in advice
    report = diag.format_report(summary)
    assert advice in report
    unmasked = _poorly_mixed("prior", False)["mixing"]["advice"]
    assert "sampler.preconditioner=posterior" in unmasked


@pytest.mark.parametrize("preconditioner", ["prior", "posterior"])
def test_masked_conditional_advice_names_the_windowed_metric(preconditioner):
    """Under the conditional parametrisation 'prior' and 'posterior' scale the field
    alike: with a mask the advice is the windowed 'diagonal', not the other of the two;
    for a kind that tunes its own metric (mclmc, mams) no preconditioner is proposed."""
    advice = _poorly_mixed(preconditioner, True, conditional=True)["mixing"]["advice"]
    assert "sampler.preconditioner=diagonal" in advice, advice
    assert "preconditioner=prior" not in advice and "preconditioner=posterior" not in advice
    own = _poorly_mixed(preconditioner, True, conditional=True, windowed_metric=False)
    own = own["mixing"]["advice"]
    assert "tunes its own metric" in own and "sampler.preconditioner=diagonal" in own
    assert "--set" not in own


def test_no_preconditioner_line_when_mixing_is_fine():
    rng = np.random.default_rng(6)
    summary = diag.build_summary(
        posterior={"a": rng.normal(size=(4, 300))},
        scalars_method="numpy",
        preconditioner="posterior",
        is_masked=True,
    )
    assert summary["mixing"]["advice"] is None
    assert "preconditioner" not in diag.format_report(summary)
