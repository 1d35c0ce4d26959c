"""A dense metric for the block of sampled scalar parameters, adapted in warm-up windows.

``sampler.preconditioner: dense_params``: the field latent keeps its windowed diagonal
metric, and the parameters (the state parts of shape ``[chains]``: P(k)
hyperparameters, cosmology, forward-model parameters) get a dense one. With the block's
windowed covariance regularised as Stan's dense metric,

.. math:: \\Sigma_{\\rm reg} = \\frac{n}{n + 5} \\hat\\Sigma + 10^{-3} \\frac{5}{n + 5} I,

split into scales and a correlation factor, :math:`\\Sigma_{\\rm reg} = S R S` with
:math:`S = {\\rm diag}(\\Sigma_{\\rm reg})^{1/2}` and :math:`R = L L^T` (Cholesky), the
kernels run on

.. math:: x_{\\rm block} = S\\, L\\, u_{\\rm block}, \\qquad
          u_{\\rm block} = L^{-1} (x_{\\rm block} / S),

and every other part on ``u = x / scale`` as with the diagonal metric. ``S`` are the
block's entries of the per-part scales (their diagonal metric, :math:`L = I` before the
first window), so the diagonal metric is the case :math:`L = I`. The map is linear with
a constant Jacobian: the target in ``u`` is the model's at ``x(u)`` (no log-det term).
The kernels keep their identity metric. ``L`` is float64 (``[p, p]``, ``p`` the number
of scalar parts); the block is mixed in float64 and cast to the state dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

__all__ = [
    "dense_window_estimate",
    "mix",
    "mix_numpy",
    "unmix",
    "unmix_numpy",
    "welford_block_update",
    "zero_block_moments",
]


def zero_block_moments(num_params: int) -> list[np.ndarray]:
    """``[mean [p], comoment [p, p]]`` of the block, float64 (the count is the window's)."""
    return [np.zeros([num_params], np.float64), np.zeros([num_params, num_params], np.float64)]


def welford_block_update(count, mean, comoment, block):
    """Merge one step's chains ``block [chains, p]`` (float64) into the block's running
    mean and co-moment :math:`C = \\sum (x - \\bar x)(x - \\bar x)^T`, pooled over chains
    (Chan et al. 1979); ``count`` is the number of draws merged before this step."""
    block = tf.cast(block, tf.float64)
    nb = tf.cast(tf.shape(block)[0], tf.float64)
    total = count + nb
    mb = tf.reduce_mean(block, axis=0)
    centred = block - mb
    cb = tf.matmul(centred, centred, transpose_a=True)
    d = mb - mean
    new_mean = mean + d * nb / total
    new_comoment = comoment + cb + d[:, None] * d[None, :] * (count * nb / total)
    return new_mean, new_comoment


def dense_window_estimate(count: float, comoment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A window's block metric: scales ``S [p]`` and the lower Cholesky factor ``L [p, p]``
    of the correlation of the regularised covariance (float64).

    Parameters
    ----------
    count : float
        Draws in the window (all chains).
    comoment : ndarray
        ``[p, p]`` co-moment of the window's draws (:func:`welford_block_update`).
    """
    comoment = np.asarray(comoment, np.float64)
    p = comoment.shape[0]
    cov = comoment / max(count - 1.0, 1.0)
    cov = 0.5 * (cov + cov.T)
    cov = (count / (count + 5.0)) * cov + 1e-3 * (5.0 / (count + 5.0)) * np.eye(p)
    scales = np.sqrt(np.diag(cov))
    corr = cov / np.outer(scales, scales)
    return scales, np.linalg.cholesky(corr)


def _block(parts, idx: Sequence[int]):
    return tf.stack([tf.cast(parts[i], tf.float64) for i in idx], axis=-1)  # [chains, p]


def _scatter(parts, idx: Sequence[int], block):
    out = list(parts)
    for j, i in enumerate(idx):
        out[i] = tf.cast(block[:, j], parts[i].dtype)
    return out


def mix(u_parts, factor, idx: Sequence[int]) -> list:
    """``u -> L u`` on the block (parts ``idx``, each ``[chains]``); other parts as given."""
    return _scatter(u_parts, idx, tf.matmul(_block(u_parts, idx), factor, transpose_b=True))


def unmix(w_parts, factor, idx: Sequence[int]) -> list:
    """``w -> L^{-1} w`` on the block: the inverse of :func:`mix`."""
    solved = tf.linalg.triangular_solve(factor, tf.transpose(_block(w_parts, idx)), lower=True)
    return _scatter(w_parts, idx, tf.transpose(solved))


def mix_numpy(u_parts, factor: np.ndarray, idx: Sequence[int]) -> list[np.ndarray]:
    """:func:`mix` in NumPy (host side)."""
    out = [np.asarray(p) for p in u_parts]
    block = np.stack([out[i].astype(np.float64) for i in idx], axis=-1) @ factor.T
    for j, i in enumerate(idx):
        out[i] = block[:, j].astype(out[i].dtype)
    return out


def unmix_numpy(w_parts, factor: np.ndarray, idx: Sequence[int]) -> list[np.ndarray]:
    """:func:`unmix` in NumPy (host side)."""
    out = [np.asarray(p) for p in w_parts]
    block = np.stack([out[i].astype(np.float64) for i in idx], axis=-1)
    solved = np.linalg.solve(factor, block.T).T
    for j, i in enumerate(idx):
        out[i] = solved[:, j].astype(out[i].dtype)
    return out
