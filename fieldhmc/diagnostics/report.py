"""Human-readable text report of a run summary."""

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


def format_report(summary: Mapping[str, Any]) -> str:
    """Human-readable report of a :func:`build_summary` dict (aligned tables + warnings).

    Parameters
    ----------
    summary : mapping
        Output of :func:`build_summary` (or the same dict loaded back from JSON).

    Returns
    -------
    str
        Multi-line text; the caller prints or saves it.
    """
    lines = ["fieldhmc diagnostics", "===================="]
    lines.append(
        f"{summary.get('num_chains', 0)} chains x {summary.get('num_draws', 0)} draws "
        "after warm-up (chains numbered from 0)"
    )

    scalars = summary.get("scalars") or {}
    if scalars:
        lines += ["", "Scalars"]
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
        lines += _table(headers, rows)

    sampler = summary.get("sampler")
    if sampler:
        lines += ["", "Sampler health"]
        c = sampler["num_chains"]

        def per_chain(section: Any, key: str | None, spec: str) -> list[str]:
            if section is None:
                return ["-"] * c
            values = section if key is None else section.get(key)
            if values is None:
                return ["-"] * c
            return [_fmt(v, spec) for v in values]

        accept = per_chain(sampler["acceptance"], "per_chain", ".2f")
        step = per_chain(sampler["step_size"], "per_chain", ".3g")
        div = per_chain(sampler["divergences"], "per_chain", "d")
        ebfmi = per_chain(sampler["ebfmi"], None, ".2f")
        depth = sampler.get("tree_depth")
        mean_depth = per_chain(depth, "mean_per_chain", ".1f")
        sat = per_chain(depth, "num_saturated_per_chain", "d")
        grads = per_chain(sampler["gradient_evals"], "per_chain", ".0f")
        rows = [
            [str(i), accept[i], step[i], div[i], ebfmi[i], mean_depth[i], sat[i], grads[i]]
            for i in range(c)
        ]
        lines += _table(
            [
                "chain",
                "accept",
                "step_size",
                "divergent",
                "E-BFMI",
                "tree_depth",
                "saturated",
                "grad_evals",
            ],
            rows,
        )
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
    metadata = summary.get("metadata") or {}
    if metadata.get("adjusted") is False:
        lines.append(
            f"{metadata.get('sampler')} is UNADJUSTED (no Metropolis test): its draws are "
            "biased by design; step size tuned to the bias tolerance Var[dE]/d = "
            f"{metadata.get('bias_tolerance')}"
        )
    tuning = metadata.get("tuning")
    if tuning:
        lines.append(
            "tuned: "
            + ", ".join(f"{k} {_fmt(v, '.4g')}" for k, v in tuning["tuned"].items())
            + f"; warm-up gradient evaluations {tuning['warmup_gradient_evaluations']}"
        )
    efficiency = summary.get("efficiency")
    if efficiency and efficiency.get("gradient_evals_per_ess") is not None:
        lines.append(
            f"gradient evaluations per effective sample: "
            f"{efficiency['gradient_evals_per_ess']:.1f} "
            f"(min ESS {efficiency['min_ess']:.0f}, {efficiency['min_ess_quantity']})"
        )

    field = summary.get("field")
    if field:
        lines += ["", "Field convergence per k-bin (real and imaginary parts of each mode)"]
        kb = field["kbins"]
        nb = len(kb["num_modes"])
        k = field.get("k")
        rows = [
            [
                str(b),
                _fmt(k[b], ".3g") if k is not None else "-",
                _fmt(kb["num_modes"][b]),
                _fmt(kb["r_hat_median"][b], ".3f"),
                _fmt(kb["r_hat_max"][b], ".3f"),
                _fmt(kb["ess_bulk_min"][b], ".0f"),
                _fmt(kb["ess_bulk_median"][b], ".0f"),
                _fmt(kb["num_rhat_above"][b]),
            ]
            for b in range(nb)
        ]
        lines += _table(
            [
                "bin",
                "k [h/Mpc]",
                "modes",
                "r_hat_med",
                "r_hat_max",
                "ess_min",
                "ess_med",
                f"r_hat>{field['rhat_threshold']:g}",
            ],
            rows,
        )
        for key, title in (("worst_r_hat", "largest R-hat"), ("worst_ess_bulk", "lowest ESS")):
            entries = field.get(key) or []
            if entries:
                shown = ", ".join(
                    f"{e['name']} (bin {e['kbin']}, R-hat {_fmt(e['r_hat'], '.3f')}, "
                    f"ESS {_fmt(e['ess_bulk'], '.0f')})"
                    for e in entries[:5]
                )
                lines.append(f"modes with {title}: {shown}")
        vox = field.get("voxels")
        if vox:
            lines.append(
                f"voxels: R-hat median {_fmt(vox['r_hat_median'], '.3f')}, max "
                f"{_fmt(vox['r_hat_max'], '.3f')}; bulk ESS min "
                f"{_fmt(vox['ess_bulk_min'], '.0f')}, median "
                f"{_fmt(vox['ess_bulk_median'], '.0f')}"
            )

    truth = summary.get("truth")
    if truth:
        lines += ["", "Against truth"]
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
            rows = [
                [str(b), _fmt(k[b], ".3g")] + [_fmt(truth[key][b], ".3f") for key, _ in present]
                for b in range(len(k))
            ]
            lines += _table(["bin", "k [h/Mpc]"] + [label for _, label in present], rows)
        cov = truth.get("coverage")
        if cov:
            shown = ", ".join(
                f"{100 * p:.0f}%: {_fmt(c, '.3f')}"
                for p, c in zip(cov["probs"], cov["coverage"], strict=True)
            )
            lines.append(f"coverage of the truth (nominal: observed) {shown}")

    wiener = summary.get("wiener")
    if wiener:
        lines += ["", "Against the analytic Wiener posterior (z-scores, expected rms 1)"]
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
        lines += _table(["moment", "n", "rms", "max|z|", "frac |z|>3"], rows)

    warnings = summary.get("warnings") or []
    lines.append("")
    if warnings:
        lines.append(f"Warnings ({len(warnings)})")
        lines += [f"  ! {w}" for w in warnings]
    else:
        lines.append("No warnings.")
    return "\n".join(lines) + "\n"
