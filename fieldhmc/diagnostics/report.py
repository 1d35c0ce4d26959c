"""Human-readable text report of a run summary.

One function per section; :func:`format_report` joins them and ends with a one-line
verdict. Each section takes the JSON form of its part of the summary (``None`` for NaN).
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return format(value, spec)
    return str(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-align the first column, right-align the rest."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(w) for cell, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


Lines = list[str]


def _scalar_lines(scalars: Mapping[str, Mapping[str, Any]]) -> Lines:
    headers = ["name", "mean", "sd", "q5", "q95", "mcse_mean", "ess_bulk", "ess_tail", "r_hat"]
    rows = [
        [
            name,
            _fmt(r["mean"], ".4g"),
            _fmt(r["sd"], "#.3g"),
            _fmt(r["q5"], ".4g"),
            _fmt(r["q95"], ".4g"),
            _fmt(r["mcse_mean"], ".2g"),
            _fmt(r["ess_bulk"], ".0f"),
            _fmt(r["ess_tail"], ".0f"),
            _fmt(r["r_hat"], ".3f"),
        ]
        for name, r in scalars.items()
    ]
    lines = [
        "",
        "Scalars (rule: R-hat <= 1.01 and ESS >= 100 per chain for each; a tracked mode"
        " above 1.01 warns only if also flagged by the joint test of all tracked modes)",
    ]
    lines += _table(headers, rows)
    fixed = [n for n, r in scalars.items() if r.get("is_constant") and n != "lp"]
    frozen = [n for n, r in scalars.items() if r.get("frozen_chains") and n not in fixed]
    if fixed:
        lines.append(f"constant in every draw (not sampled, not checked): {', '.join(fixed)}")
    for name in frozen:
        chains = ", ".join(str(c) for c in scalars[name]["frozen_chains"])
        lines.append(f"{name}: R-hat and ESS undefined, chain(s) {chains} never move")
    return lines


def _per_chain(section: Any, key: str | None, spec: str, num_chains: int) -> list[str]:
    values = None if section is None else (section if key is None else section.get(key))
    if values is None:
        return ["-"] * num_chains
    return [_fmt(v, spec) for v in values]


def _sampler_lines(sampler: Mapping[str, Any]) -> Lines:
    c = sampler["num_chains"]
    depth = sampler.get("tree_depth")
    columns = {
        "accept": _per_chain(sampler["acceptance"], "per_chain", ".2f", c),
        "step_size": _per_chain(sampler["step_size"], "per_chain", ".3g", c),
        "divergent": _per_chain(sampler["divergences"], "per_chain", "d", c),
        "E-BFMI": _per_chain(sampler["ebfmi"], None, ".2f", c),
        "tree_depth": _per_chain(depth, "mean_per_chain", ".1f", c),
        "saturated": _per_chain(depth, "num_saturated_per_chain", "d", c),
        "grad_evals": _per_chain(sampler["gradient_evals"], "per_chain", ".0f", c),
    }
    rows = [[str(i)] + [values[i] for values in columns.values()] for i in range(c)]
    lines = ["", "Sampler health"] + _table(["chain", *columns], rows)
    target = sampler["target_accept_prob"]
    lines.append(
        "no Metropolis test (unadjusted): acceptance does not apply"
        if target is None
        else f"target_accept_prob {target:.2f}"
    )
    energy = sampler.get("energy_error_var_per_dim")
    if energy is not None:
        desired = energy["desired"]
        lines.append(
            "energy-error variance per dimension (Var[dE]/d) per chain: "
            + ", ".join(_fmt(v, ".2g") for v in energy["per_chain"])
            + ("" if desired is None else f" (bias tolerance tuned to {desired:g})")
        )
    return lines


def _tuning_lines(metadata: Mapping[str, Any], energy: Mapping[str, Any] | None = None) -> Lines:
    """The microcanonical kernels' own statement: unadjusted or not, what was tuned, and
    (``energy``: the sampler health's ``energy_error_var_per_dim``) whether the tuned step
    met the bias tolerance after warm-up."""
    lines = []
    if metadata.get("adjusted") is False:
        tolerance = metadata.get("bias_tolerance")
        line = (
            f"{metadata.get('sampler')} is UNADJUSTED (no Metropolis test): its draws are "
            f"biased by design; step size tuned to the bias tolerance Var[dE]/d = {tolerance}"
        )
        if energy is not None and tolerance:
            worst = max(energy["per_chain"])
            met = worst <= 2.0 * tolerance
            line += f"; after warm-up Var[dE]/d {_fmt(worst, '.2g')} (worst chain): " + (
                "within 2x of it" if met else f"NOT met, {worst / tolerance:.2g}x the tolerance"
            )
        lines.append(line)
    tuning = metadata.get("tuning")
    if tuning:
        lines.append(
            "tuned: "
            + ", ".join(f"{k} {_fmt(v, '.4g')}" for k, v in tuning["tuned"].items())
            + f"; warm-up gradient evaluations {tuning['warmup_gradient_evaluations']}"
            + (
                f" in {tuning['num_warmup_steps']} transitions"
                if tuning.get("num_warmup_steps") is not None
                else ""
            )
        )
        moments = tuning.get("field_moments") or {}
        if moments.get("every", 1) > 1:
            lines.append(
                f"field mean / variance (fields.h5) from every {moments['every']}th transition "
                f"after warm-up: {moments['draws_all_chains']} draws of all chains"
            )
    return lines


def _efficiency_lines(efficiency: Mapping[str, Any]) -> Lines:
    if efficiency.get("no_effective_samples"):
        reason = efficiency["no_effective_samples"]
        return [f"gradient evaluations per effective sample: no effective samples ({reason})"]
    if efficiency.get("gradient_evals_per_ess") is None:
        return []
    return [
        f"gradient evaluations per effective sample: {efficiency['gradient_evals_per_ess']:.1f} "
        f"(min ESS {efficiency['min_ess']:.0f}, {efficiency['min_ess_quantity']})"
    ]


def _kbin_rows(field: Mapping[str, Any]) -> list[list[str]]:
    kb = field["kbins"]
    k = field.get("k")
    return [
        [
            str(b),
            _fmt(k[b], ".3g") if k is not None else "-",
            _fmt(kb["num_modes"][b]),
            _fmt(kb["r_hat_median"][b], ".3f"),
            _fmt(kb["r_hat_max"][b], ".3f"),
            _fmt(kb["ess_bulk_min"][b], ".0f"),
            _fmt(kb["ess_bulk_median"][b], ".0f"),
            _fmt(kb.get("num_flagged", [None] * (b + 1))[b]),
            _fmt(kb.get("num_undefined", [None] * (b + 1))[b]),
        ]
        for b in range(len(kb["num_modes"]))
    ]


def _mode_list(entries: Sequence[Mapping[str, Any]], limit: int = 5) -> str:
    return ", ".join(
        f"{e['name']} (bin {e['kbin']}, R-hat {_fmt(e['r_hat'], '.3f')}, "
        f"ESS {_fmt(e['ess_bulk'], '.0f')})"
        for e in entries[:limit]
    )


def _field_rule_lines(field: Mapping[str, Any]) -> Lines:
    overall = field["overall"]
    q = field.get("false_alarm")
    if q is None:  # a summary written before the multiplicity-aware test
        return []
    return [
        f"rule: converged chains of this shape ({field['num_chains']} chains x "
        f"{field['num_draws']} draws, autocorrelation time "
        f"{_fmt(overall.get('tau_ref'), '.2f')}) give R-hat above "
        f"{_fmt(overall.get('r_hat_q99'), '.3f')} in 1% of modes; a mode is flagged when its "
        f"R-hat is beyond what they give, tested over all {overall['num_values']} at a "
        f"false-alarm rate of {q:g} (Benjamini-Hochberg; docs/diagnostics.md)"
    ]


def _field_lines(field: Mapping[str, Any]) -> Lines:
    headers = [
        "bin", "k [h/Mpc]", "modes", "r_hat_med", "r_hat_max", "ess_min", "ess_med",
        "flagged", "undefined",
    ]  # fmt: skip
    lines = ["", "Field convergence per k-bin (real and imaginary parts of each mode)"]
    lines += _table(headers, _kbin_rows(field)) + _field_rule_lines(field)
    for key, title in (
        ("flagged", "flagged modes, most significant first"),
        ("worst_r_hat", "modes with largest R-hat"),
        ("worst_ess_bulk", "modes with lowest ESS"),
    ):
        if field.get(key):
            lines.append(f"{title}: {_mode_list(field[key])}")
    vox = field.get("voxels")
    if vox:
        lines.append(
            f"voxels (reported, not tested): R-hat median {_fmt(vox['r_hat_median'], '.3f')}, "
            f"max {_fmt(vox['r_hat_max'], '.3f')}; bulk ESS min "
            f"{_fmt(vox['ess_bulk_min'], '.0f')}, median {_fmt(vox['ess_bulk_median'], '.0f')}"
        )
    return lines


def _truth_lines(truth: Mapping[str, Any]) -> Lines:
    lines = ["", "Against truth"]
    cols = [
        ("transfer_median", "T(k) draws"),
        ("transfer_lo", "T 16%"),
        ("transfer_hi", "T 84%"),
        ("transfer_mean_field", "T mean field"),
        ("cross_correlation", "r(k)"),
    ]
    present = [(key, label) for key, label in cols if truth.get(key) is not None]
    k = truth.get("k") or []
    if present and k:
        counts = truth.get("num_modes")
        sparse = truth.get("is_sparse") or [False] * len(k)
        rows = [
            [str(b), _fmt(k[b], ".3g")]
            + ([] if counts is None else [_fmt(counts[b], ".0f")])
            + [("few" if sparse[b] else _fmt(truth[key][b], ".3f")) for key, _ in present]
            for b in range(len(k))
        ]
        modes = [] if counts is None else ["modes(±k)"]
        lines += _table(["bin", "k [h/Mpc]", *modes] + [label for _, label in present], rows)
        if any(sparse):
            lines.append(
                f"few: fewer than {truth['min_modes']} modes in the bin (modes(±k): counting "
                "k and -k), too few to estimate T(k) and r(k); not shown"
            )
    cov = truth.get("coverage")
    if cov:
        shown = ", ".join(
            f"{100 * p:.0f}%: {_fmt(c, '.3f')}"
            for p, c in zip(cov["probs"], cov["coverage"], strict=True)
        )
        lines.append(f"coverage of the truth (nominal: observed) {shown}")
    return lines


def _wiener_lines(wiener: Mapping[str, Any]) -> Lines:
    rows = [
        [
            label,
            _fmt(s.get("num")),
            _fmt(s.get("rms"), ".2f"),
            _fmt(s.get("max_abs"), ".2f"),
            _fmt(s.get("fraction_above_3"), ".4f"),
        ]
        for label, s in (("mean", wiener.get("mean")), ("variance", wiener.get("var")))
        if s
    ]
    lines = ["", "Against the analytic Wiener posterior (z-scores, expected rms 1)"]
    return lines + _table(["moment", "n", "rms", "max|z|", "frac |z|>3"], rows)


def _warning_lines(warnings: Sequence[str], carried: Mapping[str, Any] | None = None) -> Lines:
    if not warnings:
        return ["", "No warnings.", "", "Verdict: healthy (no warnings)"]
    lines = ["", f"Warnings ({len(warnings)})"] + [f"  ! {w}" for w in warnings]
    verdict = f"Verdict: NOT healthy ({len(warnings)} warnings above"
    if carried:
        num = sum(len(v) for v in (carried.get("warnings") or {}).values())
        verdict += (
            f"; {num} of them carried over from the last diagnosis of what could not be recomputed"
        )
    return lines + ["", verdict + ")"]


def _carried_note(carried: Mapping[str, Any] | None, section: str) -> Lines:
    """The line above a section (or part of one) kept from the last diagnosis."""
    keys = [k for k in ((carried or {}).get("keys") or {}) if k.split(".")[0] == section]
    if not keys:
        return []
    origin = carried["keys"][keys[0]]
    when = origin.get("diagnosed_at") or "an earlier run"
    draws = f", {origin['num_draws']} draws" if origin.get("num_draws") else ""
    what = ", ".join(keys)
    reason = "; ".join(r.split(":")[0] for r in carried["reason"])  # "fields.h5 is missing"
    return [f"  [{what}: NOT recomputed ({reason}); as the diagnosis of {when}{draws} said]"]


def format_report(summary: Mapping[str, Any]) -> str:
    """Human-readable report of a :func:`build_summary` dict (aligned tables + warnings).

    Parameters
    ----------
    summary : mapping
        Output of :func:`build_summary` (or the same dict loaded back from JSON).

    Returns
    -------
    str
        Multi-line text ending with a one-line verdict; the caller prints or saves it.
    """
    lines = ["fieldhmc diagnostics", "===================="]
    lines.append(
        f"{summary.get('num_chains', 0)} chains x {summary.get('num_draws', 0)} draws "
        "after warm-up (chains numbered from 0)"
    )
    for missing in summary.get("missing_outputs") or []:
        lines.append(f"INCOMPLETE RUN DIRECTORY: {missing}")
    if summary.get("scalars"):
        lines += _scalar_lines(summary["scalars"])
    if summary.get("zero_by_symmetry"):
        lines.append(
            "zero by Hermitian symmetry (self-conjugate modes, 2k = 0 mod n on every axis; "
            f"not sampled, not checked): {', '.join(summary['zero_by_symmetry'])}"
        )
    if summary.get("sampler"):
        lines += _sampler_lines(summary["sampler"])
    energy = (summary.get("sampler") or {}).get("energy_error_var_per_dim")
    lines += _tuning_lines(summary.get("metadata") or {}, energy)
    if summary.get("efficiency"):
        lines += _efficiency_lines(summary["efficiency"])
    carried = summary.get("carried_over")
    sections = (("field", _field_lines), ("truth", _truth_lines), ("wiener", _wiener_lines))
    for key, section in sections:
        if summary.get(key):
            body = section(summary[key])
            lines += body[:2] + _carried_note(carried, key) + body[2:]
    advice = (summary.get("mixing") or {}).get("advice")
    if advice:
        lines += ["", advice]
    lines += _warning_lines(summary.get("warnings") or [], carried)
    return "\n".join(lines) + "\n"
