"""The machine-readable run summary (``summary.json``) and its plain-language warnings."""

import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from fieldhmc.diagnostics._text import _name_list, _plural
from fieldhmc.diagnostics.convergence import MIN_ESS_PER_CHAIN, RHAT_THRESHOLD
from fieldhmc.diagnostics.health import EBFMI_THRESHOLD, sampler_health
from fieldhmc.diagnostics.scalars import summarize_scalars


def to_jsonable(obj: Any) -> Any:
    """Convert nested NumPy/Python data to JSON-serialisable plain types.

    Arrays become (nested) lists, NumPy scalars Python scalars, and non-finite floats
    ``None`` (JSON has no NaN/inf).
    """
    if isinstance(obj, Mapping):
        return {str(key): to_jsonable(value) for key, value in obj.items()}
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        value = float(obj)
        return value if math.isfinite(value) else None
    if obj is None or isinstance(obj, str):
        return obj
    raise TypeError(f"cannot convert {type(obj).__name__} to JSON")


def _scalar_warnings(
    scalars: Mapping[str, Mapping[str, float]],
    num_chains: int,
    rhat_threshold: float,
    min_ess_per_chain: float,
) -> list[str]:
    warnings = []
    min_ess = min_ess_per_chain * max(num_chains, 1)
    bad_rhat = [
        (name, row["r_hat"])
        for name, row in scalars.items()
        if row["r_hat"] is not None
        and not math.isnan(row["r_hat"])
        and row["r_hat"] > rhat_threshold
    ]
    if bad_rhat:
        bad_rhat.sort(key=lambda item: -item[1])
        warnings.append(
            f"R-hat > {rhat_threshold:g} for {_plural(len(bad_rhat), 'quantity')} "
            f"(worst {bad_rhat[0][1]:.3f}: {_name_list([n for n, _ in bad_rhat])}) — chains "
            "have not mixed; run longer, check for multimodality or stuck chains"
        )
    for key, what in (
        ("ess_bulk", "posterior means and medians"),
        ("ess_tail", "credible intervals and tail quantiles"),
    ):
        low = [
            (name, row[key])
            for name, row in scalars.items()
            if row[key] is not None and not math.isnan(row[key]) and row[key] < min_ess
        ]
        if low:
            low.sort(key=lambda item: item[1])
            label = "bulk" if key == "ess_bulk" else "tail"
            warnings.append(
                f"{label} ESS below {min_ess:g} ({min_ess_per_chain:g} per chain) for "
                f"{_plural(len(low), 'quantity')} (lowest {low[0][1]:.0f}: "
                f"{_name_list([n for n, _ in low])}) — {what} are unreliable; run longer"
            )
    return warnings


def build_summary(
    *,
    posterior: Mapping[str, ArrayLike] | None = None,
    sample_stats: Mapping[str, ArrayLike] | None = None,
    target_accept_prob: float | None = 0.8,
    max_tree_depth: int | None = None,
    dimension: int | None = None,
    desired_energy_var: float | None = None,
    field: Mapping[str, Any] | None = None,
    truth: Mapping[str, Any] | None = None,
    wiener: Mapping[str, Any] | None = None,
    scalars_method: Literal["arviz", "numpy"] = "arviz",
    rhat_threshold: float = RHAT_THRESHOLD,
    min_ess_per_chain: float = MIN_ESS_PER_CHAIN,
    coverage_tolerance: float = 0.1,
    wiener_rms_tolerance: float = 0.25,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the machine-readable run summary (``summary.json``).

    Parameters
    ----------
    posterior : mapping of str to (chain, draw) arrays, optional
        Hyperparameters and tracked modes.
    sample_stats : mapping of str to (chain, draw) arrays, optional
        Sampler statistics (see :func:`sampler_health`); ``lp`` is summarised as a scalar.
    target_accept_prob : float, default 0.8
    max_tree_depth : int, optional
        NUTS only.
    dimension, desired_energy_var : optional
        Microcanonical kernels: see :func:`sampler_health`.
    field : mapping, optional
        Output of :func:`field_convergence` / :func:`mode_convergence`.
    truth : mapping, optional
        Output of :func:`truth_comparison`.
    wiener : mapping, optional
        Output of :func:`wiener_zscores` (only its ``summary`` is stored).
    scalars_method : {"arviz", "numpy"}, default "arviz"
        Backend of :func:`summarize_scalars`.
    rhat_threshold : float, default 1.01
    min_ess_per_chain : float, default 100
    coverage_tolerance : float, default 0.1
        Warn when a coverage differs from its nominal probability by more than this.
    wiener_rms_tolerance : float, default 0.25
        Warn when the rms of the Wiener z-scores differs from 1 by more than this.
    metadata : mapping, optional
        Free-form run information copied into ``summary["metadata"]``.

    Returns
    -------
    dict
        JSON-serialisable (plain lists/floats, ``None`` for NaN) with keys ``metadata``,
        ``num_chains``, ``num_draws``, ``thresholds``, ``scalars``, ``sampler``,
        ``efficiency`` (``gradient_evals_per_ess`` = total leapfrog steps / min bulk-or-tail
        ESS over the scalars, and which quantity attains the min), ``field``, ``truth``,
        ``wiener`` and ``warnings`` (list of plain-language strings: sampler health first,
        then scalars, field, truth and Wiener checks).
    """
    warnings: list[str] = []
    scalar_inputs: dict[str, ArrayLike] = {}
    if posterior is not None:
        scalar_inputs.update(posterior)
    if sample_stats is not None and "lp" in sample_stats:
        scalar_inputs.setdefault("lp", sample_stats["lp"])
    shapes = [np.shape(v) for v in scalar_inputs.values()]
    if sample_stats:
        shapes += [np.shape(v) for v in sample_stats.values()]
    num_chains, num_draws = shapes[0][:2] if shapes else (0, 0)

    sampler = None
    if sample_stats is not None:
        sampler = sampler_health(
            sample_stats,
            target_accept_prob,
            max_tree_depth,
            dimension=dimension,
            desired_energy_var=desired_energy_var,
        )
        warnings += sampler["warnings"]

    scalars = summarize_scalars(scalar_inputs, method=scalars_method) if scalar_inputs else {}
    warnings += _scalar_warnings(scalars, num_chains, rhat_threshold, min_ess_per_chain)

    efficiency = None
    if sampler is not None and sampler["gradient_evals"] is not None:
        total = sampler["gradient_evals"]["total"]
        candidates = [
            (row[key], name, key)
            for name, row in scalars.items()
            for key in ("ess_bulk", "ess_tail")
            if not math.isnan(row[key])
        ]
        efficiency = {
            "total_gradient_evals": total,
            "gradient_evals_per_ess": None,
            "min_ess": None,
            "min_ess_quantity": None,
        }
        if candidates:
            min_ess, name, key = min(candidates)
            efficiency.update(
                gradient_evals_per_ess=total / min_ess if min_ess > 0 else math.nan,
                min_ess=min_ess,
                min_ess_quantity=f"{key} of {name}",
            )

    field_out = None
    if field is not None:
        field_out = {key: value for key, value in field.items()}
        overall = field["overall"]
        if overall["num_rhat_above"]:
            worst = field["worst_r_hat"][0] if field["worst_r_hat"] else None
            detail = (
                f" (worst {worst['r_hat']:.3f} at {worst['name']}, k-bin {worst['kbin']})"
                if worst and math.isfinite(worst["r_hat"])
                else ""
            )
            warnings.append(
                f"R-hat > {field['rhat_threshold']:g} (or undefined) for "
                f"{overall['num_rhat_above']} of {overall['num_values']} field-mode "
                f"components{detail} — the field has not converged in those modes"
            )
        min_field_ess = min_ess_per_chain * max(field["num_chains"], 1)
        ess_min = overall["ess_bulk_min"]
        if not math.isnan(ess_min) and ess_min < min_field_ess:
            worst = field["worst_ess_bulk"][0]
            warnings.append(
                f"bulk ESS of field modes down to {ess_min:.0f} (< {min_field_ess:g}) at "
                f"{worst['name']}, k-bin {worst['kbin']} — field means in those modes are "
                "noisy; run longer or thin less"
            )

    truth_out = None
    if truth is not None:
        truth_out = dict(truth)
        cov = truth.get("coverage")
        if cov is not None:
            for p, c in zip(cov["probs"], np.asarray(cov["coverage"]), strict=True):
                if abs(c - p) > coverage_tolerance:
                    verdict = "too narrow (overconfident)" if c < p else "too wide"
                    warnings.append(
                        f"{100 * p:.0f}% posterior intervals cover the truth "
                        f"{100 * c:.0f}% of the time — the posterior looks {verdict}"
                    )

    wiener_out = None
    if wiener is not None:
        wiener_out = dict(wiener.get("summary", wiener))
        for key, label in (("mean", "means"), ("var", "variances")):
            stats_ = wiener_out.get(key)
            if stats_ and stats_["num"] and abs(stats_["rms"] - 1.0) > wiener_rms_tolerance:
                warnings.append(
                    f"posterior {label} disagree with the analytic Wiener posterior: rms "
                    f"z-score {stats_['rms']:.2f} (expected 1), "
                    f"{100 * stats_['fraction_above_3']:.1f}% beyond 3σ (expected 0.3%)"
                )

    summary = {
        "metadata": dict(metadata) if metadata is not None else {},
        "num_chains": int(num_chains),
        "num_draws": int(num_draws),
        "thresholds": {
            "r_hat": rhat_threshold,
            "min_ess_per_chain": min_ess_per_chain,
            "ebfmi": EBFMI_THRESHOLD,
        },
        "scalars": scalars,
        "sampler": sampler,
        "efficiency": efficiency,
        "field": field_out,
        "truth": truth_out,
        "wiener": wiener_out,
        "warnings": warnings,
    }
    return to_jsonable(summary)
