"""HMC/NUTS sampler health: divergences, E-BFMI, acceptance, step size, tree depth.

References
----------
.. [2] M. Betancourt, "Diagnosing Suboptimal Cotangent Disintegrations in Hamiltonian
   Monte Carlo", arXiv:1604.00695.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from fieldhmc.diagnostics._text import _plural

#: Default E-BFMI below which a chain is flagged (Betancourt 2016).
EBFMI_THRESHOLD = 0.3
#: Mean post-warm-up acceptance below which a chain counts as stuck (it never moves).
STUCK_ACCEPTANCE = 0.01

Check = tuple[Any, list[str]]  # (section of the health dict, warnings)


def _ebfmi(energy: np.ndarray) -> np.ndarray:
    """E-BFMI per chain, ArviZ/Stan convention.

    .. math::
        \\mathrm{E\\text{-}BFMI} = \\frac{\\frac{1}{N-1}\\sum_{n=1}^{N-1}(E_n - E_{n-1})^2}
        {\\frac{1}{N-1}\\sum_{n=0}^{N-1}(E_n - \\bar E)^2}
    """
    num = np.square(np.diff(energy, axis=1)).mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / energy.var(axis=1, ddof=1)


def _suggest_target(target: float) -> float:
    return round(min(0.99, 1.0 - (1.0 - target) / 2.0), 3)


def _check_divergences(diverging: np.ndarray, target_accept_prob: float | None) -> Check:
    div = diverging.astype(bool)
    per_chain = div.sum(axis=1)
    info = {
        "total": int(per_chain.sum()),
        "per_chain": [int(v) for v in per_chain],
        "iterations": [[int(i) for i in np.flatnonzero(row)] for row in div],
    }
    remedy = (
        "a smaller desired_energy_var (smaller steps)"
        if target_accept_prob is None
        else f"target_accept_prob {_suggest_target(target_accept_prob):g} (smaller steps)"
    )
    warnings = [
        f"{_plural(int(count), 'divergent transition')} after warm-up in chain {chain} — "
        f"consider {remedy} or reparametrising; divergent draws may be biased"
        for chain, count in enumerate(per_chain)
        if count
    ]
    return info, warnings


def _check_ebfmi(energy: np.ndarray, threshold: float) -> Check:
    ebfmi = _ebfmi(energy.astype(float))
    low = [(chain, value) for chain, value in enumerate(ebfmi) if value < threshold]
    warnings = []
    if low:
        which = ", ".join(f"{value:.2f} in chain {chain}" for chain, value in low)
        warnings.append(
            f"E-BFMI below {threshold:g} ({which}) — momentum resampling explores the energy "
            "levels poorly; improve the preconditioner (mass matrix) or reparametrise"
        )
    return [float(v) for v in ebfmi], warnings


def _check_acceptance(acceptance: np.ndarray, target: float, tolerance: float) -> Check:
    acc = acceptance.astype(float).mean(axis=1)
    stuck = [chain for chain, value in enumerate(acc) if value < STUCK_ACCEPTANCE]
    info = {"mean": float(acc.mean()), "per_chain": [float(v) for v in acc], "stuck": stuck}
    warnings = []
    for chain, value in enumerate(acc):
        if chain in stuck:
            continue
        if value < target - tolerance:
            warnings.append(
                f"mean acceptance {value:.2f} in chain {chain} is well below target_accept_prob "
                f"{target:.2f} — step-size adaptation may not have converged; consider a "
                "longer warm-up"
            )
        elif value > target + tolerance:
            warnings.append(
                f"mean acceptance {value:.2f} in chain {chain} is well above target_accept_prob "
                f"{target:.2f} — the step size is smaller than needed (slow mixing); check the "
                "step-size adaptation"
            )
    return info, warnings


def _stuck_warnings(acceptance: Mapping[str, Any]) -> list[str]:
    return [
        f"chain {chain} is stuck: mean acceptance {acceptance['per_chain'][chain]:.3f} after "
        "warm-up, so its draws repeat one state and are not samples — the step size is far "
        "too large (or the chain started in a bad region); lower step_size or warm up longer"
        for chain in acceptance["stuck"]
    ]


def _check_step_size(step_size: np.ndarray) -> Check:
    eps = step_size.astype(float)
    lo, hi = eps.min(axis=1), eps.max(axis=1)
    constant = bool(np.all(hi - lo <= 1e-6 * np.abs(hi)))
    info = {
        "per_chain": [float(v) for v in eps.mean(axis=1)],
        "min": float(eps.min()),
        "max": float(eps.max()),
        "is_constant": constant,
    }
    warnings = []
    if not constant:
        warnings.append(
            "step size changes after warm-up — adaptation should stop before the draws that "
            "are kept, otherwise the chain is not a valid Markov chain"
        )
    return info, warnings


def _check_tree_depth(
    depth: np.ndarray | None, reach_max: np.ndarray | None, max_tree_depth: int | None
) -> Check:
    if reach_max is not None:
        saturated = reach_max.astype(bool)
    elif max_tree_depth is not None and depth is not None:
        saturated = depth >= max_tree_depth
    else:
        saturated = None
    info: dict[str, Any] = {
        "max_tree_depth": None if max_tree_depth is None else int(max_tree_depth),
        "mean_per_chain": None
        if depth is None
        else [float(v) for v in depth.astype(float).mean(axis=1)],
        "max_observed": None if depth is None else int(depth.max()),
        "num_saturated_per_chain": None,
        "fraction_saturated": None,
    }
    if saturated is None:
        return info, []
    sat = saturated.sum(axis=1)
    info["num_saturated_per_chain"] = [int(v) for v in sat]
    info["fraction_saturated"] = float(saturated.mean())
    hit = [(chain, int(count)) for chain, count in enumerate(sat) if count]
    if not hit:
        return info, []
    n = saturated.shape[1]
    limit = "" if max_tree_depth is None else f" {max_tree_depth}"
    which = ", ".join(f"{k} ({100.0 * k / n:.1f}%) in chain {chain}" for chain, k in hit)
    return info, [
        f"transitions that hit max_tree_depth{limit}: {which} — trajectories are cut short; "
        "raise max_tree_depth or improve the preconditioner"
    ]


def _check_energy_error(
    error: np.ndarray, dimension: int, desired_energy_var: float | None
) -> Check:
    var = np.nanmean(np.square(error.astype(float)), axis=1) / dimension
    info = {
        "per_chain": [float(v) for v in var],
        "mean": float(np.mean(var)),
        "desired": None if desired_energy_var is None else float(desired_energy_var),
    }
    if desired_energy_var is None:
        return info, []
    warnings = [
        f"energy-error variance per dimension {value:.2g} in chain {chain} is more than "
        f"twice the bias tolerance {desired_energy_var:g} the step size was tuned to — the "
        "unadjusted sampler's bias may exceed it; use a longer warm-up or a smaller "
        "desired_energy_var"
        for chain, value in enumerate(var)
        if value > 2.0 * desired_energy_var
    ]
    worst = float(np.max(var))
    if worst > 100.0 * desired_energy_var:  # not a near miss: the step tuner failed
        warnings.insert(
            0,
            f"the step-size tuner FAILED on this target: Var[dE]/d reaches {worst:.2g}, "
            f"{worst / desired_energy_var:.2g}x the bias tolerance {desired_energy_var:g} — "
            "the unadjusted draws are not to be trusted (variances and ESS alike); use an "
            "exact kernel (mams, fieldnuts) or a better-conditioned preconditioner",
        )
    return info, warnings


def _gradient_evals(n_steps: np.ndarray) -> dict[str, Any]:
    steps = n_steps.astype(float)
    per_chain = steps.sum(axis=1)
    return {
        "total": float(per_chain.sum()),
        "per_chain": [float(v) for v in per_chain],
        "mean_per_draw": float(steps.mean()),
    }


def sampler_health(
    sample_stats: Mapping[str, ArrayLike],
    target_accept_prob: float | None,
    max_tree_depth: int | None = None,
    *,
    ebfmi_threshold: float = EBFMI_THRESHOLD,
    acceptance_tolerance: float = 0.1,
    dimension: int | None = None,
    desired_energy_var: float | None = None,
) -> dict[str, Any]:
    """HMC/NUTS health checks in Stan's conventions, with plain-language warnings.

    Parameters
    ----------
    sample_stats : mapping of str to array_like, each shape (chain, draw)
        Post-warm-up sampler statistics: ``acceptance_rate``, ``diverging`` (bool),
        ``energy`` (Hamiltonian :math:`H`, Stan sign), ``step_size``, ``n_steps``
        (leapfrog steps = gradient evaluations per iteration), and for NUTS ``tree_depth``
        (or ``reach_max_depth``, bool). Missing keys skip the corresponding check.
    target_accept_prob : float or None
        Target of the step-size adaptation; None for kernels without a Metropolis
        test (MCLMC), whose acceptance check is skipped.
    max_tree_depth : int, optional
        NUTS maximum tree depth; transitions with ``tree_depth >= max_tree_depth`` are
        saturated (the trajectory was cut short).
    ebfmi_threshold : float, default 0.3
        Chains with E-BFMI below this are flagged [2]_.
    acceptance_tolerance : float, default 0.1
        Flag chains whose mean acceptance differs from the target by more than this.
    dimension : int, optional
        Number of sampled coordinates per chain: with an ``energy_error`` statistic
        (:math:`\\Delta E` per transition) gives the energy-error variance per dimension
        :math:`\\overline{\\Delta E^2}/d` per chain (``energy_error_var_per_dim``), the
        health measure of the microcanonical kernels, for which acceptance (MCLMC) and
        E-BFMI (both) do not apply [3]_.
    desired_energy_var : float, optional
        MCLMC's bias tolerance (the value its step size was tuned to); chains more than
        twice above it are flagged.

    Returns
    -------
    dict
        ``num_chains``, ``num_draws``, ``target_accept_prob``,
        ``divergences`` ``{"total", "per_chain", "iterations": [[draw, ...] per chain]}``,
        ``ebfmi`` (per chain), ``acceptance`` ``{"mean", "per_chain", "stuck"}``,
        ``step_size`` ``{"per_chain", "min", "max", "is_constant"}``,
        ``tree_depth`` ``{"max_tree_depth", "mean_per_chain", "max_observed",
        "num_saturated_per_chain", "fraction_saturated"}``,
        ``gradient_evals`` ``{"total", "per_chain", "mean_per_draw"}``,
        ``energy_error_var_per_dim`` ``{"per_chain", "mean", "desired"}``, ``stuck_chains``
        (chains with mean acceptance below :data:`STUCK_ACCEPTANCE`: not samples), and
        ``warnings`` (list of str). Absent inputs give None entries.

    References
    ----------
    .. [2] Betancourt, arXiv:1604.00695.
    .. [3] Robnik, Cohn-Gordon & Seljak, arXiv:2412.08876.
    """
    arrays = {key: np.asarray(value) for key, value in sample_stats.items()}
    shapes = {a.shape for a in arrays.values()}
    if any(len(s) != 2 for s in shapes):
        raise ValueError(f"sample_stats arrays must be (chain, draw), got shapes {shapes}")
    c, n = next(iter(arrays.values())).shape if arrays else (0, 0)
    checks: dict[str, Check] = {}
    if "diverging" in arrays:
        checks["divergences"] = _check_divergences(arrays["diverging"], target_accept_prob)
    if "energy" in arrays and n >= 2 and np.isfinite(arrays["energy"]).all():
        checks["ebfmi"] = _check_ebfmi(arrays["energy"], ebfmi_threshold)
    has_accept = "acceptance_rate" in arrays and np.isfinite(arrays["acceptance_rate"]).all()
    if has_accept and target_accept_prob is not None:
        checks["acceptance"] = _check_acceptance(
            arrays["acceptance_rate"], target_accept_prob, acceptance_tolerance
        )
    if "step_size" in arrays:
        checks["step_size"] = _check_step_size(arrays["step_size"])
    if "tree_depth" in arrays or "reach_max_depth" in arrays:
        checks["tree_depth"] = _check_tree_depth(
            arrays.get("tree_depth"), arrays.get("reach_max_depth"), max_tree_depth
        )
    error = arrays.get("energy_error")
    if error is not None and dimension and np.isfinite(error).any():
        checks["energy_error_var_per_dim"] = _check_energy_error(
            error, dimension, desired_energy_var
        )
    if "n_steps" in arrays:
        checks["gradient_evals"] = (_gradient_evals(arrays["n_steps"]), [])
    out: dict[str, Any] = {"num_chains": c, "num_draws": n}
    out["target_accept_prob"] = None if target_accept_prob is None else float(target_accept_prob)
    keys = ("divergences", "ebfmi", "acceptance", "step_size", "tree_depth", "gradient_evals")
    for key in (*keys, "energy_error_var_per_dim"):
        out[key] = checks[key][0] if key in checks else None
    acceptance = out["acceptance"]
    out["stuck_chains"] = acceptance["stuck"] if acceptance else []
    # stuck chains first: they make every other figure meaningless
    stuck = _stuck_warnings(acceptance) if acceptance else []
    out["warnings"] = stuck + [w for _, warnings in checks.values() for w in warnings]
    return out


def preconditioner_advice(
    preconditioner: str | None,
    is_masked: bool,
    poor: Sequence[str],
    conditional: bool = False,
    windowed: bool = True,
) -> str | None:
    """The line naming the preconditioner when mixing is poor (None when it is not).

    Parameters
    ----------
    preconditioner : str or None
        ``sampler.preconditioner`` of the run (None: not known, no line).
    is_masked : bool
        Whether the likelihood has a mask.
    poor : sequence of str
        What mixed poorly (e.g. ``"field modes' ESS"``); empty: no line.
    conditional : bool, default False
        The field is in a ``conditional`` parametrisation (white under the linear
        surrogate's posterior), where ``prior`` and ``posterior`` scale the field alike.
    windowed : bool, default True
        The sampler kind can adapt a windowed metric (``diagonal``; not the kinds that
        tune their own, mclmc and mams).

    Notes
    -----
    On masked data the ``posterior`` metric spreads the mean noise precision over the
    masked voxels too; ``prior`` needed 1.8x (Gaussian) and 16x (Poisson) fewer
    gradients per min-ESS there (``benchmarks/README.md``). Without a mask
    ``posterior`` is the exact Fourier-diagonal posterior of Gaussian noise. Under the
    ``conditional`` parametrisation with a mask the surrogate is not the posterior, and
    the windowed ``diagonal`` adapts the field's per-mode scales on top of it (masked
    hierarchical model at 32³, fieldnuts: 156 against 322 gradients per min-ESS on
    ``posterior``).
    """
    if not poor or preconditioner is None:
        return None
    line = (
        f"mixing is poor ({', '.join(poor)}) under the {preconditioner!r} preconditioner "
        "(sampler.preconditioner)"
    )
    if conditional and is_masked and preconditioner in ("identity", "prior", "posterior"):
        if not windowed:
            return line + (
                ": under the conditional parametrisation 'prior' and 'posterior' scale the "
                "field alike, and this sampler kind tunes its own metric; try a kind that "
                "adapts one (fieldnuts with sampler.preconditioner=diagonal) before "
                "running longer"
            )
        return line + (
            ": with a mask under the conditional parametrisation 'prior' and 'posterior' "
            "scale the field alike, and the windowed 'diagonal' adapts its per-mode "
            "scales (masked, 32³, fieldnuts: 156 against 322 gradients per min-ESS, "
            "benchmarks/README.md); re-run with --set sampler.preconditioner=diagonal "
            "before running longer"
        )
    if preconditioner == "posterior" and is_masked:
        return line + (
            ": with a mask 'prior' mixes better (on a 20% slab at 32³ 1.8x fewer "
            "gradients per min-ESS for Gaussian noise, 16x for Poisson counts, "
            "benchmarks/README.md); re-run with --set sampler.preconditioner=prior "
            "before running longer"
        )
    if preconditioner in ("identity", "prior") and not is_masked:
        return line + (
            ": without a mask 'posterior' whitens Gaussian noise exactly; try --set "
            "sampler.preconditioner=posterior before running longer"
        )
    return line + (
        "; compare the preconditioners before running longer, e.g. fieldhmc sweep "
        "<config> --set sampler.preconditioner=prior,posterior"
    )
