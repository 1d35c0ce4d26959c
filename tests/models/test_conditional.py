"""The conditional parametrisations (``conditional``, ``conditional_scale``) against NumPy."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from fieldhmc.models import ForwardFieldModel, GaussianFieldModel, GaussianLikelihood, Grid
from fieldhmc.ops import HermitianPacking
from tests.models.conftest import HYPER_PRIORS, LIKELIHOODS, build_model, make_power

CONDITIONAL = ("conditional", "conditional_scale")


def surrogate_np(reference, model, data, log_amplitude, index, gain=1.0):
    """NumPy ``(s, w, mu)`` of the surrogate, half-spectrum, from the likelihood's
    definition (mask, sigma map or Poisson rate), independently of the model code."""
    lik = reference.likelihood
    shape = reference.grid_shape
    mask = np.ones(shape) if lik.get("mask") is None else lik["mask"]
    if lik["kind"] == "gaussian":
        sigma = np.broadcast_to(lik["sigma"], shape)
        weights = np.where(mask > 0, 1.0 / np.where(mask > 0, sigma, 1.0) ** 2, 0.0)
        weighted = weights * np.where(mask > 0, data, 0.0)
    else:  # Poisson counts: W = nbar m, W d_eff = c - nbar m on observed voxels
        weights = lik["mean_density"] * mask
        weighted = np.where(mask > 0, data - weights, 0.0)
    wbar = weights.mean()
    s = reference.signal_variance(log_amplitude, index)
    w = 1.0 / (1.0 / np.where(s > 0, s, 1.0) + gain**2 * wbar)
    w = np.where(s > 0, w, 0.0)
    mu = w * gain * np.fft.rfftn(weighted, norm="ortho")
    if model.parametrization == "conditional_scale":
        mu = np.zeros_like(mu)
    return s, w, mu


def conditional_log_prob_np(reference, model, field, data, log_amplitude, index):
    """Reference log density of a conditional latent, over the real coordinates:
    :math:`y_j = \\mu_j + \\sqrt{w_{k(j)}} x_j \\sim \\mathcal N(0, s_{k(j)})` plus the
    Jacobian :math:`\\frac12 \\sum_j \\ln w_{k(j)}`; the mean coordinate standard normal."""
    packing = HermitianPacking(reference.grid_shape)
    s, w, mu = surrogate_np(reference, model, data, log_amplitude, index)
    j = packing.mode_of_real
    is_mean = j == 0
    mu_real = packing.real_from_modes(tf.constant(mu)).numpy().reshape(-1)
    x = field.reshape(-1)
    y = mu_real + np.sqrt(w.reshape(-1)[j]) * x
    lp = stats.norm.logpdf(x[is_mean]).sum()
    lp += stats.norm.logpdf(y[~is_mean], 0.0, np.sqrt(s.reshape(-1)[j][~is_mean])).sum()
    lp += 0.5 * np.log(w.reshape(-1)[j][~is_mean]).sum()
    # likelihood and hyperprior: the non-centred reference at the same delta
    x_nc = np.where(is_mean, 0.0, y / np.sqrt(np.where(is_mean, 1.0, s.reshape(-1)[j])))
    reference = copy.copy(reference)
    reference.parametrization = "noncentred"
    nc = reference.log_prob(x_nc.reshape(field.shape), data, log_amplitude, index)
    return lp + nc - stats.norm.logpdf(x_nc).sum()
