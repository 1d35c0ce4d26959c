"""Posterior summaries and convergence diagnostics of scalar quantities."""

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from fieldhmc.diagnostics.convergence import (
    ess_bulk,
    ess_tail,
    frozen_chains,
    mcse_mean,
    mcse_sd,
    rhat,
)

_DIAGNOSTICS = ("mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "r_hat")


def _stack(posterior: Mapping[str, ArrayLike], names: Sequence[str]) -> np.ndarray:
    arrays = []
    for name in names:
        a = np.asarray(posterior[name], dtype=float)
        if a.ndim != 2:
            raise ValueError(f"posterior[{name!r}] must have shape (chain, draw), got {a.shape}")
        arrays.append(a)
    return np.stack(arrays, axis=-1)  # (chain, draw, quantity)


def _diagnostics(stacked: np.ndarray, names: Sequence[str], method: str) -> dict[str, np.ndarray]:
    if method == "numpy":
        return {
            "mcse_mean": mcse_mean(stacked),
            "mcse_sd": mcse_sd(stacked),
            "ess_bulk": ess_bulk(stacked),
            "ess_tail": ess_tail(stacked),
            "r_hat": rhat(stacked),
        }
    if method != "arviz":
        raise ValueError(f"method must be 'arviz' or 'numpy', got {method!r}")
    import arviz as az  # lazy: slow import that also imports matplotlib.pyplot

    dataset = az.convert_to_dataset({n: stacked[..., i] for i, n in enumerate(names)})
    table = az.summary(dataset, kind="diagnostics", round_to="none")
    return {col: np.array([float(table.loc[n, col]) for n in names]) for col in _DIAGNOSTICS}


def summarize_scalars(
    posterior: Mapping[str, ArrayLike],
    *,
    var_names: Sequence[str] | None = None,
    method: Literal["arviz", "numpy"] = "arviz",
) -> dict[str, dict[str, float]]:
    """Posterior summary and convergence diagnostics of scalar quantities.

    A quantity with a chain that never moves (see
    :func:`~fieldhmc.diagnostics.frozen_chains`) has undefined (NaN) R-hat, ESS and MCSE
    with either method: a stuck chain is not an effective sample.

    Parameters
    ----------
    posterior : mapping of str to array_like, each shape (chain, draw)
        Hyperparameters (``log_amplitude``, ...), log prob (``lp``) and tracked modes
        (``mode[3,1,2].real``, ...).
    var_names : sequence of str, optional
        Subset (and order) of names to summarise; default all.
    method : {"arviz", "numpy"}, default "arviz"
        ``"arviz"`` uses ``az.summary`` for R-hat/ESS/MCSE; ``"numpy"`` uses the vectorised
        equivalents in this module (same numbers, much faster for thousands of quantities).

    Returns
    -------
    dict
        ``name -> {"mean", "sd", "q5", "median", "q95", "mcse_mean", "mcse_sd",
        "ess_bulk", "ess_tail", "r_hat", "frozen_chains", "is_constant"}``: floats (NaN
        when undefined, e.g. R-hat of a single chain), the list of chains in which the
        quantity never moves, and whether it takes one value in every draw of every chain.
    """
    names = list(posterior) if var_names is None else list(var_names)
    if not names:
        return {}
    stacked = _stack(posterior, names)
    flat = stacked.reshape(-1, len(names))
    quantiles = np.quantile(flat, [0.05, 0.5, 0.95], axis=0)
    diag = _diagnostics(stacked, names, method)
    frozen = frozen_chains(stacked)  # (chain, quantity)
    out: dict[str, dict[str, float]] = {}
    for i, name in enumerate(names):
        row = {
            "mean": float(flat[:, i].mean()),
            "sd": float(flat[:, i].std(ddof=1)) if flat.shape[0] > 1 else math.nan,
            "q5": float(quantiles[0, i]),
            "median": float(quantiles[1, i]),
            "q95": float(quantiles[2, i]),
        }
        is_frozen = bool(frozen[:, i].any())
        row.update({key: math.nan if is_frozen else float(v[i]) for key, v in diag.items()})
        row["frozen_chains"] = [int(c) for c in np.flatnonzero(frozen[:, i])]
        row["is_constant"] = bool(np.ptp(flat[:, i]) == 0.0) if is_frozen else False
        out[name] = row
    return out
