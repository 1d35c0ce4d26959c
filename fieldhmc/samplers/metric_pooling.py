"""A windowed diagonal metric pooled over coordinates the model declares alike.

One warm-up window of ``n`` draws estimates each coordinate's variance with a relative
standard error of about :math:`\\sqrt{2/n}` (more with autocorrelated draws). Over the
:math:`d` coordinates of a field the worst estimates are off by several times that (Stan's
schedule gives a 150-transition warm-up one window of 25 transitions: with 4 chains 14%
for independent draws, about ±60% at the extremes of 32³ coordinates), and the
coordinates whose scale came out too small mix slowest and set the min ESS.

:func:`shrink_to_groups` shrinks each coordinate's variance toward the mean of its group
(a field latent's coordinates whose modes share :math:`|k|`,
:meth:`fieldhmc.models.FieldModel.metric_groups`) by the positive-part James–Stein factor
(Efron & Morris 1973)

.. math::

    \\hat v_j = \\bar v_g + (1 - \\lambda_g)(v_j - \\bar v_g), \\qquad
    \\lambda_g = \\min\\Big(1, \\frac{2 \\bar v_g^2 / (n - 1)}{s_g^2}\\Big),

:math:`s_g^2` the spread of the group's estimates and :math:`2\\bar v_g^2/(n-1)` the part of
it independent draws' sampling noise alone explains. Where the group's true variances
differ (a mask, redshift-space distortions) the spread exceeds the noise and the estimates
stay nearly as they are; autocorrelated draws make noise look like spread, so the
shrinkage errs toward keeping the estimates.
"""

from __future__ import annotations

import numpy as np


def shrink_to_groups(var, count: float, groups) -> np.ndarray:
    """Per-coordinate variances ``var`` of a window of ``count`` draws, each shrunk toward
    its group's mean (float64, ``var``'s shape).

    Parameters
    ----------
    var : array
        Windowed variance estimates, one per coordinate.
    count : float
        Draws in the window (chains × transitions).
    groups : array of int
        A group label per coordinate, ``var``'s size; a group of one is kept as it is.
    """
    v = np.asarray(var, np.float64)
    labels = np.asarray(groups).reshape(-1)
    if labels.size != v.size:
        raise ValueError(f"groups has {labels.size} labels for {v.size} variances")
    _, inv = np.unique(labels, return_inverse=True)
    flat = v.reshape(-1)
    size = np.bincount(inv).astype(np.float64)
    mean = np.bincount(inv, flat) / size
    dev = flat - mean[inv]
    spread = np.bincount(inv, dev * dev) / np.maximum(size - 1.0, 1.0)
    noise = 2.0 * mean * mean / max(count - 1.0, 1.0)
    ratio = np.divide(noise, spread, out=np.ones_like(noise), where=spread > 0)
    lam = np.where(size > 1, np.minimum(1.0, ratio), 0.0)
    return (mean[inv] + (1.0 - lam[inv]) * dev).reshape(v.shape)
