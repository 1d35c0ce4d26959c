"""The machine-readable run summary (``summary.json``) and its plain-language warnings.

Which rule applies where (see also ``docs/diagnostics.md``):

* scalars (hyperparameters, ``lp``, tracked modes): the single-quantity rules, R-hat above
  1.01 and bulk/tail ESS below 100 per chain [1]_;
* field modes: the multiplicity-aware test of :mod:`fieldhmc.diagnostics.multiplicity`
  (false-alarm rate 1% for a converged run), and the median bulk ESS per k-bin;
* any quantity with a chain that never moves, and any chain whose acceptance is about 0
  after warm-up: undefined R-hat/ESS, a warning, and "no effective samples".

References
----------
.. [1] A. Vehtari et al., arXiv:1903.08008.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from fieldhmc.diagnostics import modes as _modes
from fieldhmc.diagnostics import multiplicity
from fieldhmc.diagnostics._text import _name_list, _plural
from fieldhmc.diagnostics.convergence import MIN_ESS_PER_CHAIN, RHAT_THRESHOLD
from fieldhmc.diagnostics.health import EBFMI_THRESHOLD, preconditioner_advice, sampler_health
from fieldhmc.diagnostics.multiplicity import FIELD_FALSE_ALARM
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


def _is_defined(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def _degenerate_scalars(scalars: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Scalars with a chain that never moves, except fixed quantities (constant everywhere).

    ``lp`` is never a fixed quantity: if it does not change, nothing moved.
    """
    return [
        name
        for name, row in scalars.items()
        if row.get("frozen_chains") and (name == "lp" or not row.get("is_constant"))
    ]


def _frozen_scalar_warning(scalars: Mapping[str, Mapping[str, Any]], names: list[str]) -> str:
    chains = sorted({c for name in names for c in scalars[name]["frozen_chains"]})
    which = ", ".join(str(c) for c in chains)
    return (
        f"R-hat and ESS undefined for {_plural(len(names), 'quantity')} "
        f"({_name_list(names)}): chain{'s' if len(chains) > 1 else ''} {which} never "
        "move in them — a stuck chain is not a sample; see the sampler health above"
    )


def _is_tracked_mode(name: str) -> bool:
    return name.startswith("mode[") and name.endswith((".real", ".imag"))


def zero_by_symmetry(names: Sequence[str], grid_shape: Sequence[int] | None) -> list[str]:
    """The tracked imaginary parts (``mode[i,j,l].imag``) of self-conjugate modes.

    Such a mode (:math:`2k \\equiv 0 \\bmod n` on every axis,
    :func:`~fieldhmc.diagnostics.modes.is_self_conjugate`) is real by Hermitian symmetry:
    its imaginary part is zero, or float32 round-off of the FFT (sd ~1e-6) on grids
    whose FFT does not cancel it exactly, and never a sampled quantity. Empty without
    ``grid_shape``.
    """
    if grid_shape is None:
        return []
    out = []
    for name in names:
        if _is_tracked_mode(name) and name.endswith(".imag"):
            index = [int(v) for v in name[len("mode[") : name.index("]")].split(",")]
            if _modes.is_self_conjugate(index, grid_shape):
                out.append(name)
    return out


def _upper_mean(values: np.ndarray) -> float:
    """Mean plus one standard error of the finite ``values`` (NaN if fewer than 2)."""
    finite = values[np.isfinite(values)]
    if finite.size < 2:
        return math.nan
    return float(finite.mean() + finite.std(ddof=1) / math.sqrt(finite.size))


def tracked_mode_test(
    posterior: Mapping[str, ArrayLike] | None, false_alarm: float = FIELD_FALSE_ALARM
) -> dict[str, Any] | None:
    """The tracked modes' R-hat tested jointly, as the field's modes are (multiplicity).

    Each tracked value (``mode[i,j,k].real`` / ``.imag``) gets the p-value of its bulk
    and tail :math:`B/W` against converged split chains with the autocorrelation time
    of the tracked values (their mean estimate plus one standard error, see below;
    :func:`~fieldhmc.diagnostics.multiplicity.rhat_pvalue`), and Benjamini–Hochberg at
    ``false_alarm`` decides which are flagged. With 8 tracked modes (16 values) the
    single-quantity rule alone warns on converged chains in 8.7% of runs of the
    quickstart's shape (4 x 600 draws, ESS ~1000 each); this test in 1.0%.

    Returns
    -------
    dict or None
        ``{"names", "p_value", "flagged", "false_alarm"}``; None with fewer than 2 tracked
        values, 2 chains or 8 draws.
    """
    names = [n for n in (posterior or {}) if _is_tracked_mode(n)]
    if len(names) < 2:
        return None
    x = np.stack([np.asarray(posterior[n], dtype=float) for n in names])  # (m, chain, draw)
    if x.ndim != 3 or x.shape[1] < 2 or x.shape[2] < 8:
        return None
    stats, _ = _modes._mode_block(x)
    row = {key: stats[i] for i, key in enumerate(_modes._STAT_ROWS)}
    split = (2 * x.shape[1], x.shape[2] // 2)
    # The reference autocorrelation time is the tracked values' mean estimate plus one
    # standard error: from a few values it is noisy, and its mean alone made converged
    # runs warn 4.4% of the time at the quickstart's shape (1500 runs), against 1.0%
    # with the standard error (tests/diagnostics/test_multiplicity.py).
    tau_bulk, tau_tail = (_upper_mean(row[key]) for key in ("tau_bulk", "tau_tail"))
    p = multiplicity.rhat_pvalue(row["ratio_bulk"], row["ratio_tail"], tau_bulk, tau_tail, *split)
    flagged = multiplicity.benjamini_hochberg(p, false_alarm)
    return {
        "names": names,
        "p_value": p,
        "flagged": [n for n, f in zip(names, flagged, strict=True) if f],
        "false_alarm": false_alarm,
    }


def _scalar_warnings(
    scalars: Mapping[str, Mapping[str, Any]],
    num_chains: int,
    rhat_threshold: float,
    min_ess_per_chain: float,
    tracked: Mapping[str, Any] | None = None,
) -> list[str]:
    warnings = []
    frozen = _degenerate_scalars(scalars)
    if frozen:
        warnings.append(_frozen_scalar_warning(scalars, frozen))
    min_ess = min_ess_per_chain * max(num_chains, 1)
    bad_rhat = sorted(
        ((name, row["r_hat"]) for name, row in scalars.items() if _is_defined(row["r_hat"])),
        key=lambda item: -item[1],
    )
    # Tracked modes above the threshold warn only if the joint test flags them too; lp and
    # hyperparameters keep the single-quantity rule.
    excused = set() if tracked is None else set(tracked["names"]) - set(tracked["flagged"])
    bad_rhat = [(n, v) for n, v in bad_rhat if v > rhat_threshold and n not in excused]
    if bad_rhat:
        warnings.append(
            f"R-hat > {rhat_threshold:g} for {_plural(len(bad_rhat), 'quantity')} "
            f"(worst {bad_rhat[0][1]:.3f}: {_name_list([n for n, _ in bad_rhat])}) — chains "
            "have not mixed; run longer, check for multimodality or stuck chains"
        )
    for key, what in (
        ("ess_bulk", "posterior means and medians"),
        ("ess_tail", "credible intervals and tail quantiles"),
    ):
        low = sorted(
            (row[key], name)
            for name, row in scalars.items()
            if _is_defined(row[key]) and row[key] < min_ess
        )
        if low:
            label = "bulk" if key == "ess_bulk" else "tail"
            warnings.append(
                f"{label} ESS below {min_ess:g} ({min_ess_per_chain:g} per chain) for "
                f"{_plural(len(low), 'quantity')} (lowest {low[0][0]:.0f}: "
                f"{_name_list([n for _, n in low])}) — {what} are unreliable; run longer"
            )
    return warnings


def _efficiency(
    sampler: Mapping[str, Any] | None, scalars: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | None:
    """Gradient evaluations per effective sample, or why there are no effective samples."""
    if sampler is None or sampler["gradient_evals"] is None:
        return None
    out = {
        "total_gradient_evals": sampler["gradient_evals"]["total"],
        "gradient_evals_per_ess": None,
        "min_ess": None,
        "min_ess_quantity": None,
        "no_effective_samples": None,
    }
    stuck = sampler.get("stuck_chains") or []
    frozen = _degenerate_scalars(scalars)
    if stuck:
        out["no_effective_samples"] = (
            f"chain{'s' if len(stuck) > 1 else ''} "
            + ", ".join(str(c) for c in stuck)
            + " stuck (acceptance about 0)"
        )
    elif frozen:
        out["no_effective_samples"] = f"{_name_list(frozen)} never moves in some chain"
    candidates = [
        (row[key], name, key)
        for name, row in scalars.items()
        for key in ("ess_bulk", "ess_tail")
        if _is_defined(row[key])
    ]
    if out["no_effective_samples"] is None and candidates:
        min_ess, name, key = min(candidates)
        out.update(
            gradient_evals_per_ess=out["total_gradient_evals"] / min_ess if min_ess > 0 else None,
            min_ess=min_ess,
            min_ess_quantity=f"{key} of {name}",
        )
    return out


def _kbin_list(kbins: Mapping[str, Any], key: str, limit: int = 4) -> str:
    counts = np.asarray(kbins[key])
    order = [int(b) for b in np.argsort(-counts, kind="stable") if counts[b] > 0]
    total = kbins["num_values"]
    shown = ", ".join(f"{b} ({int(counts[b])} of {int(total[b])})" for b in order[:limit])
    return shown + (f" and {len(order) - limit} more" if len(order) > limit else "")


def _outlier_note(overall: Mapping[str, Any]) -> str:
    """Name the chain that stands out in most flagged modes, if one does (> half)."""
    counts = np.asarray(overall.get("outlier_chain_counts") or [0])
    chain = int(np.argmax(counts))
    if counts.sum() and counts[chain] > 0.5 * counts.sum():
        return f"; chain {chain} is the outlier in {100.0 * counts[chain] / counts.sum():.0f}%"
    return ""


def _undefined_field_warning(overall: Mapping[str, Any], kbins: Mapping[str, Any]) -> str:
    frozen = overall.get("frozen_per_chain") or []
    chains = ", ".join(str(c) for c, count in enumerate(frozen) if count)
    return (
        f"R-hat and ESS undefined for {overall['num_undefined']} of {overall['num_values']} "
        f"field-mode components (k-bins {_kbin_list(kbins, 'num_undefined')}): chain(s) "
        f"{chains} never move in them — those draws are not samples"
    )


def _flagged_field_warning(field: Mapping[str, Any]) -> str:
    overall, worst = field["overall"], field["flagged"][0]
    return (
        f"{overall['num_flagged']} of {overall['num_values']} field-mode components have "
        f"R-hat beyond what converged chains give (false-alarm rate {field['false_alarm']:g}; "
        f"most significant {worst['name']}, R-hat {worst['r_hat']:.3f}, k-bin {worst['kbin']}; "
        f"k-bins {_kbin_list(field['kbins'], 'num_flagged')}{_outlier_note(overall)}) — the "
        "field has not converged in those modes; run longer, check for stuck or shifted chains"
    )


def _field_warnings(field: Mapping[str, Any], min_ess_per_chain: float) -> list[str]:
    warnings = []
    overall, kbins = field["overall"], field["kbins"]
    if overall.get("num_undefined"):
        warnings.append(_undefined_field_warning(overall, kbins))
    if overall.get("num_flagged"):
        warnings.append(_flagged_field_warning(field))
    min_ess = min_ess_per_chain * max(field["num_chains"], 1)
    medians = np.asarray(kbins["ess_bulk_median"], dtype=float)
    low = [b for b in np.flatnonzero(np.isfinite(medians) & (medians < min_ess))]
    if low:
        shown = ", ".join(f"{int(b)} ({medians[b]:.0f})" for b in low[:6])
        warnings.append(
            f"median bulk ESS of the field modes below {min_ess:g} in k-bins {shown}"
            f"{' and more' if len(low) > 6 else ''} — field means there are noisy; run longer "
            "or thin less"
        )
    return warnings


def _truth_warnings(truth: Mapping[str, Any], coverage_tolerance: float) -> list[str]:
    cov = truth.get("coverage")
    if cov is None:
        return []
    warnings = []
    for p, c in zip(cov["probs"], np.asarray(cov["coverage"]), strict=True):
        if abs(c - p) > coverage_tolerance:
            verdict = "too narrow (overconfident)" if c < p else "too wide"
            warnings.append(
                f"{100 * p:.0f}% posterior intervals cover the truth {100 * c:.0f}% of the "
                f"time — the posterior looks {verdict}"
            )
    return warnings


def _wiener_warnings(wiener: Mapping[str, Any], rms_tolerance: float) -> list[str]:
    warnings = []
    for key, label in (("mean", "means"), ("var", "variances")):
        stats_ = wiener.get(key)
        if stats_ and stats_["num"] and abs(stats_["rms"] - 1.0) > rms_tolerance:
            warnings.append(
                f"posterior {label} disagree with the analytic Wiener posterior: rms z-score "
                f"{stats_['rms']:.2f} (expected 1), {100 * stats_['fraction_above_3']:.1f}% "
                "beyond 3σ (expected 0.3%)"
            )
    return warnings


def _scalar_inputs(
    posterior: Mapping[str, ArrayLike] | None, sample_stats: Mapping[str, ArrayLike] | None
) -> tuple[dict[str, ArrayLike], int, int]:
    inputs: dict[str, ArrayLike] = dict(posterior or {})
    if sample_stats is not None and "lp" in sample_stats:
        inputs.setdefault("lp", sample_stats["lp"])
    shapes = [np.shape(v) for v in [*inputs.values(), *(sample_stats or {}).values()]]
    num_chains, num_draws = shapes[0][:2] if shapes else (0, 0)
    return inputs, int(num_chains), int(num_draws)


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
    grid_shape: Sequence[int] | None = None,
    missing_outputs: Sequence[str] | None = None,
    preconditioner: str | None = None,
    is_masked: bool = False,
    conditional: bool = False,
    windowed_metric: bool = True,
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
        Single-quantity rule, applied to the scalars only.
    min_ess_per_chain : float, default 100
        Scalars: every bulk/tail ESS; field: the median bulk ESS of each k-bin.
    coverage_tolerance : float, default 0.1
        Warn when a coverage differs from its nominal probability by more than this.
    wiener_rms_tolerance : float, default 0.25
        Warn when the rms of the Wiener z-scores differs from 1 by more than this.
    metadata : mapping, optional
        Free-form run information copied into ``summary["metadata"]``.
    grid_shape : sequence of 3 int, optional
        Real-space grid of the tracked modes: the imaginary parts of self-conjugate ones
        (:func:`zero_by_symmetry`) are then not summarised or checked, only listed in
        ``zero_by_symmetry``.
    missing_outputs : sequence of str, optional
        One sentence per run output that is missing or unreadable and what could not be
        computed without it; each is a warning (section ``outputs``, listed first) and
        they are kept in ``missing_outputs``. See :func:`carry_over`.
    preconditioner : str, optional
        The run's ``sampler.preconditioner``; with ``is_masked`` (the likelihood has a
        mask) it gives ``mixing["advice"]``, a line naming the preconditioner when the
        scalars or field modes warn or E-BFMI is low
        (:func:`~fieldhmc.diagnostics.health.preconditioner_advice`).
    is_masked : bool, default False
    conditional, windowed_metric : bool, default False, True
        The field's parametrisation is ``conditional``; the sampler kind can adapt a
        windowed metric (both for the advice line).

    Returns
    -------
    dict
        JSON-serialisable (plain lists/floats, ``None`` for NaN) with keys ``metadata``,
        ``num_chains``, ``num_draws``, ``thresholds``, ``scalars``, ``sampler``,
        ``efficiency`` (``gradient_evals_per_ess`` = total leapfrog steps / min bulk-or-tail
        ESS over the scalars and which quantity attains the min, or
        ``no_effective_samples``: why there are none), ``field``, ``truth``, ``wiener``,
        ``warnings`` (plain-language strings: sampler health first, then scalars, field,
        truth and Wiener checks), ``warning_sections`` (the same warnings by the section
        that gave them: ``outputs``, ``sampler``, ``scalars``, ``field``, ``truth``,
        ``wiener``), ``missing_outputs``, ``zero_by_symmetry``, ``carried_over`` (None;
        see :func:`carry_over`), ``mixing`` (``{"poor": [what], "preconditioner",
        "advice"}``) and ``healthy`` (no warnings).
    """
    fixed = zero_by_symmetry(list(posterior or {}), grid_shape)
    if fixed:
        posterior = {k: v for k, v in posterior.items() if k not in fixed}
    scalar_inputs, num_chains, num_draws = _scalar_inputs(posterior, sample_stats)
    sections: dict[str, list[str]] = {}
    if missing_outputs:
        sections["outputs"] = list(missing_outputs)
    sampler = None
    if sample_stats is not None:
        sampler = sampler_health(
            sample_stats,
            target_accept_prob,
            max_tree_depth,
            dimension=dimension,
            desired_energy_var=desired_energy_var,
        )
        sections["sampler"] = sampler["warnings"]
    scalars = summarize_scalars(scalar_inputs, method=scalars_method) if scalar_inputs else {}
    tracked = tracked_mode_test(posterior)
    sections["scalars"] = _scalar_warnings(
        scalars, num_chains, rhat_threshold, min_ess_per_chain, tracked
    )
    if field is not None:
        sections["field"] = _field_warnings(field, min_ess_per_chain)
    if truth is not None:
        sections["truth"] = _truth_warnings(truth, coverage_tolerance)
    wiener_out = None if wiener is None else dict(wiener.get("summary", wiener))
    if wiener_out is not None:
        sections["wiener"] = _wiener_warnings(wiener_out, wiener_rms_tolerance)
    warnings = [w for section in sections.values() for w in section]
    poor = [
        what
        for what, bad in (
            ("scalars' R-hat/ESS", bool(sections.get("scalars"))),
            ("field modes' R-hat/ESS", bool(sections.get("field"))),
            ("E-BFMI", any(v < EBFMI_THRESHOLD for v in (sampler or {}).get("ebfmi") or [])),
        )
        if bad
    ]
    summary = {
        "metadata": dict(metadata) if metadata is not None else {},
        "num_chains": num_chains,
        "num_draws": num_draws,
        "thresholds": {
            "r_hat": rhat_threshold,
            "min_ess_per_chain": min_ess_per_chain,
            "ebfmi": EBFMI_THRESHOLD,
            "field_false_alarm": FIELD_FALSE_ALARM if field is None else field["false_alarm"],
        },
        "scalars": scalars,
        "tracked_modes_test": None
        if tracked is None
        else {"flagged": tracked["flagged"], "false_alarm": tracked["false_alarm"]},
        "sampler": sampler,
        "efficiency": _efficiency(sampler, scalars),
        "field": None if field is None else dict(field),
        "truth": None if truth is None else dict(truth),
        "wiener": wiener_out,
        "zero_by_symmetry": fixed,
        "missing_outputs": list(missing_outputs or []),
        "carried_over": None,
        "mixing": {
            "poor": poor,
            "preconditioner": preconditioner,
            "advice": preconditioner_advice(
                preconditioner, is_masked, poor, conditional, windowed_metric
            ),
        },
        "warnings": warnings,
        "warning_sections": sections,
        "healthy": not warnings,
    }
    return to_jsonable(summary)


#: What :func:`carry_over` can keep: (summary key, sub-key or None, warning section).
_CARRIED = (
    ("field", None, "field"),
    ("truth", "coverage", "truth"),
    ("truth", "cross_correlation", None),
)


def _previous_warnings(previous: Mapping[str, Any], section: str, current: Sequence[str]):
    """The warnings ``previous`` had from ``section`` (without any carried-over marker)."""
    carried = (previous.get("carried_over") or {}).get("warnings") or {}
    if section in carried:
        return list(carried[section])
    if "warning_sections" in previous:
        return list(previous["warning_sections"].get(section) or [])
    # A summary from before warning_sections: every warning that is not given again.
    return [w for w in previous.get("warnings") or [] if w not in current]


def carry_over(summary: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """Keep what the last diagnosis said about the sections this one could not recompute.

    When run outputs are missing (``summary["missing_outputs"]``, e.g. ``fields.h5``),
    the field convergence, the coverage of the truth and :math:`r(k)` cannot be
    recomputed. Dropping them would make the report look healthier than the last full
    one; instead each section that ``previous`` (the ``summary.json`` being replaced)
    had and ``summary`` lacks is copied over together with its warnings, which are
    counted again, marked ``(not recomputed: from the diagnosis of <when>, <n> draws)``.
    ``carried_over`` records ``{"reason", "keys": {key: {"diagnosed_at", "num_draws"}},
    "warnings": {section: [...]}}``; a section carried twice keeps its first origin.
    Without missing outputs, or without ``previous``, ``summary`` is returned unchanged.

    Returns
    -------
    dict
        A new summary (``summary`` is not modified).
    """
    missing = summary.get("missing_outputs") or []
    if not missing or not previous:
        return dict(summary)
    out = {key: (dict(v) if isinstance(v, Mapping) else v) for key, v in summary.items()}
    before = previous.get("carried_over") or {}
    origin = {
        "diagnosed_at": (previous.get("metadata") or {}).get("diagnosed_at"),
        "num_draws": previous.get("num_draws"),
    }
    keys: dict[str, Any] = {}
    carried_warnings: dict[str, list[str]] = {}
    for key, sub, section in _CARRIED:
        name = key if sub is None else f"{key}.{sub}"
        old = previous.get(key)
        old = old.get(sub) if sub is not None and old else old
        new = out.get(key)
        new = new.get(sub) if sub is not None and new else new
        if old is None or new is not None:
            continue
        if sub is None:
            out[key] = old
        elif out.get(key) is None:  # keep only what is carried
            out[key] = {sub: old}
        else:
            out[key][sub] = old
        keys[name] = (before.get("keys") or {}).get(name, origin)
        if section is not None:
            texts = _previous_warnings(previous, section, summary["warnings"])
            taken = {t for done in carried_warnings.values() for t in done}
            carried_warnings[section] = [t for t in texts if t not in taken]
    if not keys:
        return out
    sections = dict(out.get("warning_sections") or {})
    for section, texts in carried_warnings.items():
        where = next(v for k, v in keys.items() if k.split(".")[0] == section)
        mark = f"(not recomputed: from the diagnosis of {where['diagnosed_at'] or 'an earlier run'}"
        mark += f", {where['num_draws']} draws) " if where.get("num_draws") else ") "
        sections[section] = sections.get(section, []) + [mark + t for t in texts]
    out["warning_sections"] = sections
    out["warnings"] = [w for texts in sections.values() for w in texts]
    out["healthy"] = not out["warnings"]
    out["carried_over"] = {"reason": list(missing), "keys": keys, "warnings": carried_warnings}
    return to_jsonable(out)
