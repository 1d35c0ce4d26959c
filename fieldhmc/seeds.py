"""Stateless seeds: one place that turns user seeds into TFP's ``[2]`` int32 form.

``tfp.random.sanitize_seed(int)`` goes through a *stateful* op in eager mode, so the
same Python int gives different draws on repeated calls within one process (TFP 0.25).
Every fieldhmc entry point that takes a seed converts it here instead.
"""

from __future__ import annotations

import numbers

import numpy as np
import tensorflow_probability as tfp

__all__ = ["as_stateless", "stateless_seed"]


def stateless_seed(seed: int) -> np.ndarray:
    """A non-negative Python int as a stateless ``[2]`` int32 seed (deterministic)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    return np.array([seed & 0x7FFFFFFF, (seed >> 31) & 0x7FFFFFFF], np.int32)


def as_stateless(seed):
    """Any seed TFP accepts, with Python/NumPy ints made reproducible.

    Ints go through `stateless_seed`; ``[2]``-shaped seeds (arrays, tensors) go
    through ``tfp.random.sanitize_seed`` unchanged.
    """
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        seed = stateless_seed(seed)
    return tfp.random.sanitize_seed(seed)
