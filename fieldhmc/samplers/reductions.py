"""Placing and reading tensors of a state that may live on a DTensor mesh.

The reductions themselves are the kernels' (:func:`fieldhmc.samplers.mclmc.dot64`: a
float64 ``reduce_sum`` per chain, which on a mesh DTensor turns into a global sum);
these helpers move the replicated scalars and the field-sized arrays between the host
and the mesh.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from fieldhmc.ops import sharded

__all__ = ["host", "replicate"]


def replicate(value, mesh: dtensor.Mesh | None) -> tf.Tensor:
    """``value`` as a tensor replicated on ``mesh`` (a plain tensor without one)."""
    t = tf.convert_to_tensor(value)
    if mesh is None or dtensor.is_dtensor(t):
        return t
    return dtensor.copy_to_mesh(t, dtensor.Layout.replicated(mesh, t.shape.rank))


def host(t) -> np.ndarray:
    """A (DTensor or plain) tensor's global value as a NumPy copy."""
    if isinstance(t, np.ndarray | np.generic | float | int):
        return np.array(t, copy=True)
    if dtensor.is_dtensor(t):
        return np.array(sharded.gather(t), copy=True)
    return np.array(t.numpy(), copy=True)
