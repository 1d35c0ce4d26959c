"""Diagnostic plots for fieldhmc runs; the only module that imports matplotlib.

Every function takes plain NumPy data (as produced by the sampler or by
:mod:`fieldhmc.diagnostics`) and returns the :class:`~matplotlib.axes.Axes` it drew on,
or a :class:`~matplotlib.figure.Figure` for multi-panel plots. Single-panel functions accept
``ax=None``; then a new figure is created.

Figures are built with :class:`matplotlib.figure.Figure` directly rather than ``pyplot``:
nothing is registered with a GUI backend, no backend is chosen here (the CLI selects Agg),
and figures are freed when dropped. Save them with ``fig.savefig(path, dpi=...)``; use
``ax.figure`` to get the figure of an Axes.

Units: wavenumbers k in h/Mpc, power spectra P(k) in (Mpc/h)^3, lengths in Mpc/h.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from numpy.typing import ArrayLike
from scipy import stats

from fieldhmc.diagnostics import autocorrelation, cross_correlation, transfer_function
from fieldhmc.diagnostics.truth import MIN_MODES_PER_BIN
from fieldhmc.sbc import EcdfBand, rank_bins

__all__ = [
    "plot_autocorrelation",
    "plot_corner",
    "plot_cross_correlation",
    "plot_field_slices",
    "plot_kbin_convergence",
    "plot_power_spectrum",
    "plot_power_summary",
    "plot_rank",
    "plot_sbc_ecdf",
    "plot_sbc_ecdf_difference",
    "plot_sbc_rank_histogram",
    "plot_sbc_ranks",
    "plot_trace",
    "plot_traces",
    "plot_transfer_function",
]

K_LABEL = r"$k$ [$h\,\mathrm{Mpc}^{-1}$]"
P_LABEL = r"$P(k)$ [$(\mathrm{Mpc}/h)^3$]"
_AXIS_NAMES = ("x", "y", "z")


def _new_axes(ax: Axes | None, figsize: tuple[float, float] = (6.4, 4.4)) -> Axes:
    if ax is not None:
        return ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig.add_subplot()


def _float_array(values: Any) -> np.ndarray:
    """Array of floats; ``None`` entries (from summary.json) become NaN."""
    if isinstance(values, list | tuple):
        values = [np.nan if v is None else v for v in values]
    return np.asarray(values, dtype=float)


def _positive(values: np.ndarray) -> np.ndarray:
    """Mask non-positive values for log axes."""
    return np.where(values > 0, values, np.nan)


def _chain_draw(values: ArrayLike, name: str = "draws") -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (chain, draw), got {x.shape}")
    return x


def _finish_legend(ax: Axes, **kwargs: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(**kwargs)


# --------------------------------------------------------------------------------------
# Traces, ranks, autocorrelation, corner
# --------------------------------------------------------------------------------------


def plot_trace(
    draws: ArrayLike,
    ax: Axes | None = None,
    *,
    diverging: ArrayLike | None = None,
    label: str = "value",
) -> Axes:
    """Trace of one scalar, one line per chain, divergent iterations marked.

    Parameters
    ----------
    draws : array_like, shape (chain, draw) or (draw,)
        Post-warm-up draws.
    ax : Axes, optional
    diverging : array_like of bool, shape (chain, draw), optional
        Divergent transitions, marked with red crosses.
    label : str, default "value"
        Y-axis label (quantity name, with units if any).

    Returns
    -------
    Axes
    """
    ax = _new_axes(ax)
    x = _chain_draw(draws)
    iters = np.arange(x.shape[1])
    for chain, row in enumerate(x):
        ax.plot(iters, row, lw=0.7, alpha=0.85, label=f"chain {chain}")
    if diverging is not None:
        div = np.asarray(diverging, dtype=bool).reshape(x.shape)
        chains, its = np.nonzero(div)
        if its.size:
            ax.plot(
                its,
                x[chains, its],
                "x",
                color="red",
                ms=6,
                mew=1.5,
                label=f"divergent ({its.size})",
            )
    ax.set_xlim(0, max(x.shape[1] - 1, 1))
    ax.set_xlabel("iteration after warm-up")
    ax.set_ylabel(label)
    _finish_legend(ax, fontsize="small", ncols=min(x.shape[0] + 1, 5), loc="upper right")
    return ax


def plot_rank(
    draws: ArrayLike,
    ax: Axes | None = None,
    *,
    num_bins: int | None = None,
    label: str | None = None,
) -> Axes:
    """Rank plot: histogram per chain of the ranks of its draws among all chains.

    For well-mixed chains each histogram is uniform [1]_; the shaded band is the central
    95% range of a bin count under uniformity (binomial).

    Parameters
    ----------
    draws : array_like, shape (chain, draw)
    ax : Axes, optional
    num_bins : int, optional
        Number of rank bins (default ``min(20, draw // 5)``, at least 2).
    label : str, optional
        Title (quantity name).

    Returns
    -------
    Axes

    References
    ----------
    .. [1] Vehtari et al., arXiv:1903.08008.
    """
    ax = _new_axes(ax)
    x = _chain_draw(draws)
    c, n = x.shape
    ranks = stats.rankdata(x.reshape(-1)).reshape(c, n)
    bins = num_bins or max(2, min(20, n // 5))
    edges = np.linspace(0.5, c * n + 0.5, bins + 1)
    expected = n / bins
    lo, hi = stats.binom.ppf([0.025, 0.975], n, 1.0 / bins)
    ax.axhspan(lo, hi, color="0.85", zorder=0, label="95% band if uniform")
    ax.axhline(expected, color="0.4", ls="--", lw=1)
    for chain in range(c):
        counts, _ = np.histogram(ranks[chain], bins=edges)
        ax.stairs(counts, edges, lw=1.3, label=f"chain {chain}")
    ax.set_xlim(edges[0], edges[-1])
    ax.set_ylim(0, None)
    ax.set_xlabel("rank among all chains")
    ax.set_ylabel("draws per bin")
    if label:
        ax.set_title(label, fontsize="medium")
    return ax


def plot_traces(
    posterior: Mapping[str, ArrayLike],
    *,
    diverging: ArrayLike | None = None,
    var_names: Sequence[str] | None = None,
    max_vars: int = 12,
) -> Figure:
    """Trace plots (left) and rank plots (right) for several scalars.

    Parameters
    ----------
    posterior : mapping of str to array_like, each (chain, draw)
        Hyperparameters, ``lp`` and tracked modes.
    diverging : array_like of bool, shape (chain, draw), optional
        Divergent transitions, marked on every trace.
    var_names : sequence of str, optional
        Which quantities (default all, at most ``max_vars``).
    max_vars : int, default 12

    Returns
    -------
    Figure
        One row per quantity.
    """
    names = list(posterior if var_names is None else var_names)[:max_vars]
    if not names:
        raise ValueError("nothing to plot: posterior is empty")
    fig = Figure(figsize=(11, 2.3 * len(names) + 0.6), layout="constrained")
    axes = fig.subplots(len(names), 2, squeeze=False, width_ratios=[2.4, 1])
    for row, name in enumerate(names):
        plot_trace(posterior[name], axes[row, 0], diverging=diverging, label=name)
        plot_rank(posterior[name], axes[row, 1], label=name)
        for ax in axes[row]:
            legend = ax.get_legend()
            if legend is not None:
                legend.remove()
    handles, labels = axes[0, 0].get_legend_handles_labels()
    band = [
        (h, lab)
        for h, lab in zip(*axes[0, 1].get_legend_handles_labels(), strict=True)
        if lab.startswith("95%")
    ]
    for h, lab in band:
        handles.append(h)
        labels.append(f"rank {lab}")
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 6))
    fig.suptitle("Traces and rank plots (post-warm-up)")
    return fig


def plot_autocorrelation(
    posterior: Mapping[str, ArrayLike],
    ax: Axes | None = None,
    *,
    var_names: Sequence[str] | None = None,
    max_lag: int = 100,
) -> Axes:
    """Autocorrelation function (averaged over chains) of tracked quantities.

    Parameters
    ----------
    posterior : mapping of str to array_like, each (chain, draw)
    ax : Axes, optional
    var_names : sequence of str, optional
        Default all (legend gets crowded beyond ~10).
    max_lag : int, default 100

    Returns
    -------
    Axes
    """
    ax = _new_axes(ax)
    names = list(posterior if var_names is None else var_names)
    low = 0.0
    for name in names:
        acf = np.nanmean(autocorrelation(_chain_draw(posterior[name]), max_lag=max_lag), axis=0)
        ax.plot(np.arange(acf.size), acf, lw=1.3, label=name)
        low = min(low, float(np.nanmin(acf)) if np.isfinite(acf).any() else 0.0)
    ax.axhline(0.0, color="0.4", lw=0.8)
    ax.set_xlim(0, None)
    ax.set_ylim(min(-0.1, 1.1 * low), 1.05)
    ax.set_xlabel("lag [iterations]")
    ax.set_ylabel("autocorrelation (mean over chains)")
    _finish_legend(ax, fontsize="small", ncols=1 + len(names) // 8)
    return ax


def plot_corner(
    posterior: Mapping[str, ArrayLike],
    *,
    var_names: Sequence[str] | None = None,
    truths: Mapping[str, float] | None = None,
    num_bins: int = 30,
) -> Figure:
    """Corner plot: 1D histograms on the diagonal, 2D histograms below it.

    Parameters
    ----------
    posterior : mapping of str to array_like, each (chain, draw)
        Typically the hyperparameters.
    var_names : sequence of str, optional
    truths : mapping of str to float, optional
        True values, drawn as lines.
    num_bins : int, default 30

    Returns
    -------
    Figure
    """
    names = list(posterior if var_names is None else var_names)
    if not names:
        raise ValueError("nothing to plot: posterior is empty")
    truths = truths or {}
    values = {n: np.asarray(posterior[n], dtype=float).reshape(-1) for n in names}
    size = len(names)
    fig = Figure(figsize=(2.4 * size + 1.0, 2.4 * size + 0.6), layout="constrained")
    axes = fig.subplots(size, size, squeeze=False)
    for i, yname in enumerate(names):
        for j, xname in enumerate(names):
            ax = axes[i, j]
            if j > i:
                ax.set_axis_off()
                continue
            if i == j:
                ax.hist(values[xname], bins=num_bins, color="C0", histtype="stepfilled", alpha=0.6)
                ax.set_yticks([])
                if xname in truths:
                    ax.axvline(truths[xname], color="k", lw=1.2)
            else:
                ax.hist2d(values[xname], values[yname], bins=num_bins, cmap="Blues")
                if xname in truths:
                    ax.axvline(truths[xname], color="k", lw=1)
                if yname in truths:
                    ax.axhline(truths[yname], color="k", lw=1)
            if i == size - 1:
                ax.set_xlabel(xname)
            else:
                ax.tick_params(labelbottom=False)
            if j == 0 and i > 0:
                ax.set_ylabel(yname)
            elif j == 0:
                ax.set_ylabel("density")
            else:
                ax.tick_params(labelleft=False)
    if truths:
        axes[0, size - 1].legend(
            handles=[Patch(color="k", label="truth")], loc="upper right", frameon=False
        )
    fig.suptitle("Posterior of the hyperparameters")
    return fig


# --------------------------------------------------------------------------------------
# Power spectra
# --------------------------------------------------------------------------------------


def _band(ax: Axes, k: np.ndarray, samples: np.ndarray, color: str, name: str) -> np.ndarray:
    """Median line and 68/95% bands of ``samples`` (..., nbins); returns the quantiles."""
    flat = samples.reshape(-1, samples.shape[-1])
    with np.errstate(invalid="ignore"):
        q = np.nanquantile(flat, [0.025, 0.16, 0.5, 0.84, 0.975], axis=0)
    ax.fill_between(k, q[0], q[4], color=color, alpha=0.18, lw=0, label=f"{name} 95%")
    ax.fill_between(k, q[1], q[3], color=color, alpha=0.38, lw=0, label=f"{name} 68%")
    ax.plot(k, q[2], color=color, lw=1.8, label=f"{name} median")
    return q


def plot_power_spectrum(
    k: ArrayLike,
    power_draws: ArrayLike | None = None,
    ax: Axes | None = None,
    *,
    power_truth: ArrayLike | None = None,
    power_data: ArrayLike | None = None,
    power_input: ArrayLike | None = None,
    k_input: ArrayLike | None = None,
    power_wiener: ArrayLike | None = None,
) -> Axes:
    """Posterior P(k) band with truth, data, input spectrum and Wiener reference.

    Parameters
    ----------
    k : array_like, shape (nbins,)
        Bin centres in h/Mpc.
    power_draws : array_like, shape (chain, draw, nbins) or (draw, nbins), optional
        P(k) of each posterior draw in (Mpc/h)^3: median and 68/95% bands.
    ax : Axes, optional
    power_truth, power_data, power_wiener : array_like, shape (nbins,), optional
        P(k) of the true field, of the data, and of the Wiener-filter reference (e.g.
        the power of analytic posterior draws or of the Wiener mean).
    power_input : array_like, optional
        Input (model) P(k) curve, evaluated at ``k_input`` (default ``k``).
    k_input : array_like, optional

    Returns
    -------
    Axes
        Log-log axes.
    """
    ax = _new_axes(ax)
    k = np.asarray(k, dtype=float)
    if power_draws is not None:
        _band(ax, k, _positive(np.asarray(power_draws, dtype=float)), "C0", "posterior")
    if power_input is not None:
        kin = k if k_input is None else np.asarray(k_input, dtype=float)
        ax.plot(kin, _positive(_float_array(power_input)), "k:", lw=1.4, label="input $P(k)$")
    if power_wiener is not None:
        ax.plot(
            k,
            _positive(_float_array(power_wiener)),
            "-.",
            color="C1",
            lw=1.6,
            label="Wiener reference",
        )
    if power_data is not None:
        ax.plot(
            k,
            _positive(_float_array(power_data)),
            "s",
            color="0.45",
            ms=4,
            mfc="none",
            label="data",
        )
    if power_truth is not None:
        ax.plot(
            k, _positive(_float_array(power_truth)), "o-", color="k", ms=3.5, lw=1.0, label="truth"
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(k[k > 0].min() / 1.15, k.max() * 1.15)
    ax.set_xlabel(K_LABEL)
    ax.set_ylabel(P_LABEL)
    _finish_legend(ax, fontsize="small", loc="best")
    return ax


def plot_transfer_function(
    k: ArrayLike,
    transfer: ArrayLike,
    ax: Axes | None = None,
    *,
    transfer_mean_field: ArrayLike | None = None,
) -> Axes:
    """Transfer function :math:`T(k) = \\sqrt{P/P_\\mathrm{true}}`.

    Parameters
    ----------
    k : array_like, shape (nbins,)
        Bin centres in h/Mpc.
    transfer : array_like, shape (nbins,) or (..., nbins)
        T(k); with leading (chain, draw) axes a median and 68/95% band are drawn.
    ax : Axes, optional
    transfer_mean_field : array_like, shape (nbins,), optional
        T(k) of the posterior-mean field (suppressed where the data are noisy).

    Returns
    -------
    Axes
    """
    ax = _new_axes(ax)
    k = np.asarray(k, dtype=float)
    t = _float_array(transfer)
    top = 1.3
    if t.ndim > 1:
        q = _band(ax, k, t, "C0", "draws")
        top = max(top, float(np.nanmax(q[4])) * 1.05 if np.isfinite(q[4]).any() else top)
    else:
        ax.plot(k, t, "o-", color="C0", ms=3.5, label="$T(k)$")
        top = max(top, float(np.nanmax(t)) * 1.05 if np.isfinite(t).any() else top)
    if transfer_mean_field is not None:
        tm = _float_array(transfer_mean_field)
        ax.plot(k, tm, "s--", color="C2", ms=3.5, label="posterior mean field")
    ax.axhline(1.0, color="k", lw=0.9, ls="--")
    ax.set_xscale("log")
    ax.set_xlim(k[k > 0].min() / 1.15, k.max() * 1.15)
    ax.set_ylim(0.0, min(top, 3.0))
    ax.set_xlabel(K_LABEL)
    ax.set_ylabel(r"$T(k)=\sqrt{P/P_\mathrm{true}}$")
    _finish_legend(ax, fontsize="small", loc="best")
    return ax


def plot_cross_correlation(
    k: ArrayLike,
    correlation: ArrayLike,
    ax: Axes | None = None,
    *,
    label: str = "posterior mean × truth",
) -> Axes:
    """Cross-correlation coefficient :math:`r(k)` between two fields.

    Parameters
    ----------
    k : array_like, shape (nbins,)
        Bin centres in h/Mpc.
    correlation : array_like, shape (nbins,) or (..., nbins)
        r(k); with leading axes a median and 68/95% band are drawn.
    ax : Axes, optional
    label : str
        Legend label.

    Returns
    -------
    Axes
    """
    ax = _new_axes(ax)
    k = np.asarray(k, dtype=float)
    r = _float_array(correlation)
    if r.ndim > 1:
        q = _band(ax, k, r, "C3", label)
        low = np.nanmin(q[0]) if np.isfinite(q[0]).any() else 0.0
    else:
        ax.plot(k, r, "o-", color="C3", ms=3.5, label=label)
        low = np.nanmin(r) if np.isfinite(r).any() else 0.0
    ax.axhline(1.0, color="k", lw=0.9, ls="--")
    ax.axhline(0.0, color="0.5", lw=0.7)
    ax.set_xscale("log")
    ax.set_xlim(k[k > 0].min() / 1.15, k.max() * 1.15)
    ax.set_ylim(min(-0.05, 1.1 * float(low)), 1.05)
    ax.set_xlabel(K_LABEL)
    ax.set_ylabel(r"$r(k)=P_\times/\sqrt{P_1 P_2}$")
    _finish_legend(ax, fontsize="small", loc="lower left")
    return ax


def plot_power_summary(
    k: ArrayLike,
    power_draws: ArrayLike | None = None,
    *,
    power_truth: ArrayLike | None = None,
    power_data: ArrayLike | None = None,
    power_input: ArrayLike | None = None,
    k_input: ArrayLike | None = None,
    power_wiener: ArrayLike | None = None,
    power_mean: ArrayLike | None = None,
    power_cross: ArrayLike | None = None,
    num_modes: ArrayLike | None = None,
    min_modes: int = MIN_MODES_PER_BIN,
) -> Figure:
    """P(k) panel, plus T(k) and r(k) panels when the truth is known, and the modes per bin.

    Parameters
    ----------
    k, power_draws, power_truth, power_data, power_input, k_input, power_wiener
        As :func:`plot_power_spectrum`.
    power_mean : array_like, shape (nbins,), optional
        P(k) of the posterior-mean field.
    power_cross : array_like, shape (nbins,), optional
        Cross-spectrum of posterior mean and truth; with ``power_mean`` and
        ``power_truth`` gives the r(k) panel.
    num_modes : array_like, shape (nbins,), optional
        Modes per bin, counting :math:`\\mathbf k` and :math:`-\\mathbf k`: drawn in a
        bottom panel; bins with fewer than ``min_modes`` are left out of the other
        panels (their P, T and r are too noisy to read, see
        :data:`fieldhmc.diagnostics.truth.MIN_MODES_PER_BIN`) and marked by dotted lines.
    min_modes : int, default 10

    Returns
    -------
    Figure
    """
    k = np.asarray(k, dtype=float)
    keep = np.ones(k.size, dtype=bool)
    if num_modes is not None:
        keep = _float_array(num_modes) >= min_modes

    def binned(values):  # the bins that are shown; the input curve has its own k
        return None if values is None else _float_array(values)[..., keep]

    has_transfer = power_truth is not None and (power_draws is not None or power_mean is not None)
    has_corr = power_truth is not None and power_mean is not None and power_cross is not None
    rows = 1 + int(has_transfer) + int(has_corr) + int(num_modes is not None)
    ratios = [2.2] + [1.0] * (rows - 1)
    fig = Figure(figsize=(7.0, 3.2 + 2.0 * (rows - 1)), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False, height_ratios=ratios)[:, 0]
    shown = k[keep]
    plot_power_spectrum(
        shown,
        binned(power_draws),
        axes[0],
        power_truth=binned(power_truth),
        power_data=binned(power_data),
        power_input=power_input,
        k_input=k if k_input is None else k_input,
        power_wiener=binned(power_wiener),
    )
    row = 1
    truth = binned(power_truth)
    if has_transfer:
        draws_t = None if power_draws is None else transfer_function(binned(power_draws), truth)
        mean_t = None if power_mean is None else transfer_function(binned(power_mean), truth)
        if draws_t is not None:
            plot_transfer_function(shown, draws_t, axes[row], transfer_mean_field=mean_t)
        else:
            plot_transfer_function(shown, mean_t, axes[row])
        row += 1
    if has_corr:
        r = cross_correlation(binned(power_cross), binned(power_mean), truth)
        plot_cross_correlation(shown, r, axes[row])
        row += 1
    if num_modes is not None:
        _plot_mode_counts(k, _float_array(num_modes), min_modes, axes[row])
        for ax in axes:
            for i, kb in enumerate(k[~keep]):
                label = f"bin with < {min_modes} modes (not shown)" if i == 0 else None
                ax.axvline(kb, color="0.6", ls=":", lw=1.0, label=label)
        _finish_legend(axes[0], fontsize="small", loc="best")
        axes[0].set_xlim(k[k > 0].min() / 1.15, k.max() * 1.15)
    for ax in axes[:-1]:
        ax.set_xlabel("")
    return fig


def _plot_mode_counts(k: np.ndarray, num_modes: np.ndarray, min_modes: int, ax: Axes) -> Axes:
    """Modes per k-bin (log scale) with the fewest for which T(k), r(k) are shown."""
    ax.plot(k, np.where(num_modes > 0, num_modes, np.nan), "o-", color="0.3", ms=3.0, lw=1.0)
    ax.axhline(min_modes, color="C3", lw=0.9, ls="--", label=f"{min_modes} modes")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(K_LABEL)
    ax.set_ylabel("modes per bin")
    _finish_legend(ax, fontsize="small", loc="best")
    return ax


# --------------------------------------------------------------------------------------
# Field slices
# --------------------------------------------------------------------------------------


def plot_field_slices(
    posterior_mean: ArrayLike,
    posterior_std: ArrayLike | None = None,
    *,
    truth: ArrayLike | None = None,
    data: ArrayLike | None = None,
    mask: ArrayLike | None = None,
    axis: int = 2,
    index: int | None = None,
    box_size: float | Sequence[float] | None = None,
    field_label: str = r"$\delta$",
) -> Figure:
    """Slices through truth, data (masked region shaded), posterior mean, std and residual.

    Parameters
    ----------
    posterior_mean : array_like, shape (n0, n1, n2)
    posterior_std : array_like, shape (n0, n1, n2), optional
    truth : array_like, shape (n0, n1, n2), optional
    data : array_like, shape (n0, n1, n2), optional
    mask : array_like, shape (n0, n1, n2), optional
        Observation weight in [0, 1]; unobserved regions (0) are shaded grey and outlined
        on the data panel.
    axis : int, default 2
        Axis perpendicular to the slice.
    index : int, optional
        Slice position along ``axis`` (default: middle).
    box_size : float or 3 floats, optional
        Box side(s) in Mpc/h for the axis units; default cell indices.
    field_label : str
        Colour-bar label for field values.

    Returns
    -------
    Figure
        Panels: truth, data, posterior mean, posterior std, standardized residual
        (truth − mean)/std — those whose inputs are given. Truth, data and mean share a
        colour scale.
    """
    mean = np.asarray(posterior_mean, dtype=float)
    if mean.ndim != 3:
        raise ValueError(f"posterior_mean must be 3D (n0, n1, n2), got {mean.shape}")
    idx = mean.shape[axis] // 2 if index is None else int(index)
    plane = [a for a in range(3) if a != axis]

    def cut(field: ArrayLike) -> np.ndarray:
        return np.take(np.asarray(field, dtype=float), idx, axis=axis).T  # rows = 2nd axis

    if box_size is None:
        extent = [0, mean.shape[plane[0]], 0, mean.shape[plane[1]]]
        unit = "[cells]"
        position = f"{_AXIS_NAMES[axis]} = cell {idx}"
    else:
        side = np.broadcast_to(np.asarray(box_size, dtype=float), (3,))
        extent = [0, side[plane[0]], 0, side[plane[1]]]
        unit = r"[$\mathrm{Mpc}/h$]"
        cell = side[axis] / mean.shape[axis]
        position = f"{_AXIS_NAMES[axis]} = {(idx + 0.5) * cell:.1f} Mpc/h"

    panels: list[tuple[str, np.ndarray, str, str, tuple[float, float] | None]] = []
    shared = [cut(f) for f in (truth, data, mean) if f is not None]
    vmax = float(np.nanpercentile(np.abs(np.concatenate([s.ravel() for s in shared])), 99.5))
    vmax = vmax if vmax > 0 else 1.0
    if truth is not None:
        panels.append(("truth", cut(truth), field_label, "RdBu_r", (-vmax, vmax)))
    if data is not None:
        panels.append(("data", cut(data), field_label, "RdBu_r", (-vmax, vmax)))
    panels.append(("posterior mean", cut(mean), field_label, "RdBu_r", (-vmax, vmax)))
    if posterior_std is not None:
        std = cut(posterior_std)
        panels.append(("posterior std", std, f"std of {field_label}", "viridis", None))
        if truth is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                resid = (cut(truth) - cut(mean)) / std
            panels.append(
                ("standardized residual", resid, "(truth − mean) / std", "PuOr_r", (-4.0, 4.0))
            )

    ncols = min(len(panels), 3)
    nrows = -(-len(panels) // ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.7 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (title, image, clabel, cmap, limits) in zip(axes, panels, strict=False):
        vmin, vmax_ = limits if limits is not None else (None, None)
        im = ax.imshow(
            image,
            origin="lower",
            extent=extent,
            cmap=cmap,
            vmin=vmin,
            vmax=vmax_,
            interpolation="nearest",
            aspect="equal",
        )
        cbar = fig.colorbar(im, ax=ax, shrink=0.85)
        cbar.set_label(clabel)
        ax.set_title(title)
        ax.set_xlabel(f"{_AXIS_NAMES[plane[0]]} {unit}")
        ax.set_ylabel(f"{_AXIS_NAMES[plane[1]]} {unit}")
        if title == "data" and mask is not None:
            weight = np.clip(cut(mask), 0.0, 1.0)
            overlay = np.zeros(weight.shape + (4,))
            overlay[..., :3] = 0.35
            overlay[..., 3] = 0.75 * (1.0 - weight)
            ax.imshow(
                overlay, origin="lower", extent=extent, interpolation="nearest", aspect="equal"
            )
            ax.legend(
                handles=[Patch(color="0.35", alpha=0.75, label="masked")],
                loc="upper right",
                fontsize="small",
            )
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    fig.suptitle(f"Field slices at {position}")
    return fig


# --------------------------------------------------------------------------------------
# Convergence per k-bin
# --------------------------------------------------------------------------------------


def plot_kbin_convergence(
    field_summary: Mapping[str, Any],
    *,
    k: ArrayLike | None = None,
    rhat_threshold: float | None = None,
    min_ess: float | None = None,
) -> Figure:
    """R-hat and bulk ESS of the field modes per k-bin.

    Parameters
    ----------
    field_summary : mapping
        Output of :func:`fieldhmc.diagnostics.field_convergence` (or its JSON form in
        ``summary["field"]``): uses ``kbins`` (``r_hat_median``, ``r_hat_max``,
        ``ess_bulk_min``, ``ess_bulk_median``, and ``num_flagged`` when present: bins with
        modes flagged by the multiplicity-aware test are marked), ``k``, ``num_chains``,
        ``rhat_threshold``.
    k : array_like, shape (nbins,), optional
        Bin centres in h/Mpc (default ``field_summary["k"]``, else the bin index).
    rhat_threshold : float, optional
        Reference line (default from the summary, else 1.01).
    min_ess : float, optional
        Reference line (default 100 per chain).

    Returns
    -------
    Figure
        Two panels sharing the k axis.
    """
    bins = field_summary["kbins"]
    r_med = _float_array(bins["r_hat_median"])
    r_max = _float_array(bins["r_hat_max"])
    e_min = _float_array(bins["ess_bulk_min"])
    e_med = _float_array(bins["ess_bulk_median"])
    k_values = k if k is not None else field_summary.get("k")
    if k_values is not None:
        x = _float_array(k_values)
        xlabel = K_LABEL
    else:
        x = np.arange(r_med.size, dtype=float)
        xlabel = "k-bin index"
    threshold = rhat_threshold or field_summary.get("rhat_threshold") or 1.01
    chains = int(field_summary.get("num_chains") or 1)
    ess_line = min_ess if min_ess is not None else 100.0 * chains

    fig = Figure(figsize=(7.0, 6.0), layout="constrained")
    ax_r, ax_e = fig.subplots(2, 1, sharex=True)
    ax_r.plot(x, r_max, "o-", color="C3", ms=4, label="max over modes")
    ax_r.plot(x, r_med, "s-", color="C0", ms=4, label="median")
    # The single-quantity rule applies to a typical mode (the median); the maximum over
    # hundreds of converged modes exceeds it by chance. Modes are tested jointly against
    # converged chains of the same shape (see the report): mark the bins with flagged modes.
    ax_r.axhline(threshold, color="k", ls="--", lw=1, label=f"{threshold:g} (rule for the median)")
    flagged = bins.get("num_flagged")
    if flagged is not None:
        hit = np.nan_to_num(_float_array(flagged)) > 0
        if hit.any():
            ax_r.plot(x[hit], r_max[hit], "x", color="k", ms=9, label="bin with flagged modes")
    finite = np.concatenate([r_max[np.isfinite(r_max)], [threshold]])
    ax_r.set_ylim(
        min(0.995, float(np.min(finite)) - 0.005), max(1.05, float(np.max(finite))) + 0.01
    )
    ax_r.set_ylabel(r"$\hat{R}$ (rank-normalised, split)")
    ax_r.set_title("Convergence of the field modes per k-bin (real and imaginary parts)")
    _finish_legend(ax_r, fontsize="small", loc="upper left")

    ax_e.plot(x, _positive(e_min), "o-", color="C3", ms=4, label="min over modes")
    ax_e.plot(x, _positive(e_med), "s-", color="C0", ms=4, label="median")
    ax_e.axhline(
        ess_line, color="k", ls="--", lw=1, label=f"{ess_line:g} (100 per chain, for the median)"
    )
    ax_e.set_yscale("log")
    ax_e.set_ylabel("bulk ESS")
    ax_e.set_xlabel(xlabel)
    _finish_legend(ax_e, fontsize="small", loc="lower left")
    shown = x[np.isfinite(x)]
    if k_values is not None and shown.size and np.all(shown > 0):
        ax_e.set_xscale("log")
        # Chains that never moved (every draw rejected) give NaN R-hat and ESS in every
        # bin, so no line sets the x limits: matplotlib's default (0, 1) cannot be
        # log-scaled and drawing would raise. The bins' own k range always can.
        ax_e.set_xlim(float(shown.min()) / 1.1, float(shown.max()) * 1.1)
    return fig


# --------------------------------------------------------------------------------------
# Simulation-based calibration
# --------------------------------------------------------------------------------------


def plot_sbc_rank_histogram(
    ranks: ArrayLike,
    num_draws: int,
    ax: Axes | None = None,
    *,
    num_bins: int | None = None,
    label: str | None = None,
) -> Axes:
    """Histogram of SBC ranks (``[N]`` in ``0..L``) with the 99% band of a uniform bin.

    Bins are those of :func:`fieldhmc.sbc.rank_bins` (the chi-square test's); the band
    is the central 99% binomial range of each bin's count under uniformity [1]_.

    References
    ----------
    .. [1] Talts et al., arXiv:1804.06788.
    """
    ax = _new_axes(ax, (4.0, 3.0))
    r = np.asarray(ranks, np.int64).ravel()
    n = r.size
    edges = rank_bins(num_draws, n, num_bins)
    counts, _ = np.histogram(r, bins=edges)
    width = np.diff(edges) / (num_draws + 1)
    lo, hi = stats.binom.ppf(0.005, n, width), stats.binom.ppf(0.995, n, width)
    ax.stairs(hi, edges, baseline=lo, fill=True, color="0.85", label="99% if uniform")
    ax.stairs(n * width, edges, color="0.4", ls="--", lw=1)
    ax.stairs(counts, edges, lw=1.5, color="C0", label="ranks")
    ax.set_xlim(edges[0], edges[-1])
    ax.set_ylim(0, None)
    ax.set_xlabel(f"rank of truth among {num_draws} draws")
    ax.set_ylabel("realisations")
    if label:
        ax.set_title(label, fontsize="small")
    return ax


def plot_sbc_ecdf_difference(
    ranks: ArrayLike,
    num_draws: int,
    band: EcdfBand,
    ax: Axes | None = None,
    *,
    label: str | None = None,
) -> Axes:
    """ECDF of the fractional ranks minus the uniform CDF, with a simultaneous band.

    ``band`` comes from :func:`fieldhmc.sbc.ecdf_band` for the same ``N`` and ``L``;
    the ECDF leaves it with probability ``band.alpha`` under uniformity [1]_.

    References
    ----------
    .. [1] Säilynoja, Bürkner & Vehtari, arXiv:2103.10522.
    """
    ax = _new_axes(ax, (4.0, 3.0))
    r = np.asarray(ranks, np.int64).ravel()
    ecdf = np.cumsum(np.bincount(r, minlength=num_draws + 1))[:-1] / r.size
    z = band.z
    ax.fill_between(
        z,
        band.lower - z,
        band.upper - z,
        step="post",
        color="0.85",
        label=f"{100 * (1 - band.alpha):.0f}% simultaneous",
    )
    ax.axhline(0.0, color="0.4", ls="--", lw=1)
    ax.step(z, ecdf - z, where="post", color="C0", lw=1.5, label="ECDF - uniform")
    ax.set_xlim(0, 1)
    ax.set_xlabel("fractional rank")
    ax.set_ylabel("ECDF difference")
    if label:
        ax.set_title(label, fontsize="small")
    return ax


def _sbc_grid(names: Sequence[str]) -> tuple[Figure, list[Axes]]:
    ncols = min(4, len(names))
    nrows = -(-len(names) // ncols)
    fig = Figure(figsize=(3.3 * ncols, 2.6 * nrows + 0.5), layout="constrained")
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(len(names))]
    return fig, axes


def _sbc_title(name: str, pvalues: Mapping[str, tuple[float, float]] | None) -> str:
    if not pvalues or name not in pvalues:
        return name
    p_chi2, p_ecdf = pvalues[name]
    return f"{name}\np: chi2 {p_chi2:.2g}, ECDF {p_ecdf:.2g}"


def plot_sbc_ranks(
    ranks: ArrayLike,
    num_draws: int,
    names: Sequence[str],
    *,
    pvalues: Mapping[str, tuple[float, float]] | None = None,
) -> Figure:
    """One :func:`plot_sbc_rank_histogram` per quantity; ``ranks`` is ``[N, Q]``.

    ``pvalues`` maps a name to its (chi-square, ECDF) p-values for the panel titles.
    """
    r = np.asarray(ranks, np.int64)
    fig, axes = _sbc_grid(names)
    for q, (name, ax) in enumerate(zip(names, axes, strict=True)):
        plot_sbc_rank_histogram(r[:, q], num_draws, ax, label=_sbc_title(name, pvalues))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2)
    fig.suptitle(f"SBC rank histograms ({r.shape[0]} realisations)")
    return fig


def plot_sbc_ecdf(
    ranks: ArrayLike,
    num_draws: int,
    names: Sequence[str],
    band: EcdfBand,
    *,
    pvalues: Mapping[str, tuple[float, float]] | None = None,
) -> Figure:
    """One :func:`plot_sbc_ecdf_difference` per quantity; ``ranks`` is ``[N, Q]``."""
    r = np.asarray(ranks, np.int64)
    fig, axes = _sbc_grid(names)
    for q, (name, ax) in enumerate(zip(names, axes, strict=True)):
        plot_sbc_ecdf_difference(r[:, q], num_draws, band, ax, label=_sbc_title(name, pvalues))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2)
    fig.suptitle(f"SBC ECDF differences ({r.shape[0]} realisations)")
    return fig
