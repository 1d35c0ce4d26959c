"""Convergence, sampler-health and truth-comparison diagnostics for fieldhmc runs.

Everything here is plain NumPy/SciPy and returns data; nothing prints or plots.
The CLI turns :func:`build_summary` into ``summary.json`` and prints :func:`format_report`.

What comes from where
---------------------
* Scalars (hyperparameters, log prob, tracked modes): ArviZ (``az.summary``) computes the
  rank-normalised split-:math:`\\hat R`, bulk/tail ESS and MCSE [1]_. ArviZ is imported
  lazily: it takes ~1.5 s to import and pulls in ``matplotlib.pyplot``.
* Whole fields (up to millions of modes): :func:`rhat`, :func:`ess_bulk`, :func:`ess_tail`,
  :func:`mcse_mean` and :func:`mcse_sd` are vectorised NumPy re-implementations of the same
  estimators (ArviZ 0.23 conventions, equal to ``az.rhat`` / ``az.ess`` / ``az.mcse`` to
  round-off), working on chunks of columns of ``(chain, draw, ...)`` arrays. ``az.summary``
  needs ~3 s per 2,000 parameters, i.e. tens of minutes for a 128³ field.
* TFP's ``tfp.mcmc.effective_sample_size`` and ``potential_scale_reduction`` are neither
  rank-normalised nor split, and have no tail ESS; they are not used here.

* Many quantities at once (field modes): :mod:`fieldhmc.diagnostics.multiplicity` tests
  every mode's R-hat against its distribution for converged chains and controls the
  false-alarm rate; the 1.01 rule is for single scalars only.
* A quantity with a chain that never moves has undefined R-hat and ESS (ArviZ would count
  it as fully effective).

Conventions
-----------
Chains and draws are indexed from 0, like ArviZ's ``chain``/``draw`` coordinates, so
"chain 2" is ``array[2]``. Thresholds follow Stan/ArviZ: :math:`\\hat R > 1.01`, ESS below
100 per chain, E-BFMI below 0.3 [2]_.

References
----------
.. [1] A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner, "Rank-normalization,
   folding, and localization: An improved R-hat for assessing convergence of MCMC",
   Bayesian Analysis 16 (2021) 667, arXiv:1903.08008.
.. [2] M. Betancourt, "Diagnosing Suboptimal Cotangent Disintegrations in Hamiltonian
   Monte Carlo", arXiv:1604.00695.
"""

from fieldhmc.diagnostics.convergence import (
    MIN_ESS_PER_CHAIN,
    RHAT_THRESHOLD,
    autocorrelation,
    ess_bulk,
    ess_tail,
    frozen_chains,
    mcse_mean,
    mcse_sd,
    rhat,
)
from fieldhmc.diagnostics.health import EBFMI_THRESHOLD, STUCK_ACCEPTANCE, sampler_health
from fieldhmc.diagnostics.modes import (
    field_convergence,
    is_self_conjugate,
    mode_convergence,
    self_conjugate_mask,
)
from fieldhmc.diagnostics.multiplicity import FIELD_FALSE_ALARM, benjamini_hochberg
from fieldhmc.diagnostics.report import format_report
from fieldhmc.diagnostics.scalars import summarize_scalars
from fieldhmc.diagnostics.summary import build_summary, carry_over, to_jsonable, zero_by_symmetry
from fieldhmc.diagnostics.truth import (
    MIN_MODES_PER_BIN,
    coverage,
    cross_correlation,
    cross_power,
    transfer_function,
    truth_comparison,
    variance_bias,
    wiener_zscores,
)

__all__ = [
    "EBFMI_THRESHOLD",
    "FIELD_FALSE_ALARM",
    "MIN_MODES_PER_BIN",
    "MIN_ESS_PER_CHAIN",
    "RHAT_THRESHOLD",
    "STUCK_ACCEPTANCE",
    "autocorrelation",
    "benjamini_hochberg",
    "build_summary",
    "carry_over",
    "coverage",
    "cross_correlation",
    "cross_power",
    "ess_bulk",
    "ess_tail",
    "field_convergence",
    "format_report",
    "frozen_chains",
    "is_self_conjugate",
    "mcse_mean",
    "mcse_sd",
    "mode_convergence",
    "rhat",
    "sampler_health",
    "self_conjugate_mask",
    "summarize_scalars",
    "to_jsonable",
    "transfer_function",
    "truth_comparison",
    "variance_bias",
    "wiener_zscores",
    "zero_by_symmetry",
]
