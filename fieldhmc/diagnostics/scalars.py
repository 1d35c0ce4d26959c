"""Posterior summaries and convergence diagnostics of scalar quantities."""

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from fieldhmc.diagnostics.convergence import ess_bulk, ess_tail, mcse_mean, mcse_sd, rhat


def summarize_scalars(
    posterior: Mapping[str, ArrayLike],
    *,
    var_names: Sequence[str] | None = None,
    method: Literal["arviz", "numpy"] = "arviz",
) -> dict[str, dict[str, float]]:
    """Posterior summary and convergence diagnostics of scalar quantities.

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
        "ess_bulk", "ess_tail", "r_hat"}`` as Python floats (NaN when undefined, e.g.
        R-hat of a single chain).
    """
    names = list(posterior) if var_names is None else list(var_names)
    arrays = {}
    for name in names:
        a = np.asarray(posterior[name], dtype=float)
        if a.ndim != 2:
            raise ValueError(f"posterior[{name!r}] must have shape (chain, draw), got {a.shape}")
        arrays[name] = a
    if not arrays:
        return {}
    stacked = np.stack([arrays[n] for n in names], axis=-1)  # (chain, draw, q)
    flat = stacked.reshape(-1, len(names))
    quantiles = np.quantile(flat, [0.05, 0.5, 0.95], axis=0)
    if method == "arviz":
        import arviz as az  # lazy: slow import that also imports matplotlib.pyplot

        dataset = az.convert_to_dataset({n: arrays[n] for n in names})
        table = az.summary(dataset, kind="diagnostics", round_to="none")
        diag = {
            col: np.array([float(table.loc[n, col]) for n in names])
            for col in ("mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "r_hat")
        }
    elif method == "numpy":
        diag = {
            "mcse_mean": mcse_mean(stacked),
            "mcse_sd": mcse_sd(stacked),
            "ess_bulk": ess_bulk(stacked),
            "ess_tail": ess_tail(stacked),
            "r_hat": rhat(stacked),
        }
    else:
        raise ValueError(f"method must be 'arviz' or 'numpy', got {method!r}")
    out: dict[str, dict[str, float]] = {}
    for i, name in enumerate(names):
        row = {
            "mean": float(flat[:, i].mean()),
            "sd": float(flat[:, i].std(ddof=1)) if flat.shape[0] > 1 else math.nan,
            "q5": float(quantiles[0, i]),
            "median": float(quantiles[1, i]),
            "q95": float(quantiles[2, i]),
        }
        row.update({key: float(values[i]) for key, values in diag.items()})
        out[name] = row
    return out
