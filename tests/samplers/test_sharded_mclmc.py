"""The mesh path's pieces of MCLMC / MAMS are ``fieldhmc.samplers.mclmc``'s.

The sharded transitions themselves run on virtual devices in a subprocess
(``tests/samplers/sharded_cases.py``, asserted in ``test_sharded.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from fieldhmc.samplers import mclmc


def test_float64_kernel_parameters_are_not_rounded_to_float32():
    """A float64 MAMS kernel's target acceptance, initial L (and MCLMC's tolerance) are
    the float64 values given: ``tf.cast(0.9, tf.float64)`` goes through float32
    (0.89999998), which moved the tuned step size of float64 runs by ~2e-8."""
    target = tfp.distributions.MultivariateNormalDiag(tf.constant([0.0, 1.0, 2.0], tf.float64))
    kernel = mclmc.MetropolisAdjustedMicrocanonical(
        target.log_prob,
        step_size=tf.constant(0.7, tf.float64),
        trajectory_length=1.1,
        num_adaptation_steps=10,
        target_accept_prob=0.9,
    )
    x = tf.zeros([4, 3], tf.float64)
    r = kernel.bootstrap_results(x)
    assert float(r.trajectory_length) == 1.1
    _, r = kernel.one_step(x, r, seed=tf.constant([1, 2], tf.int32))
    accept = np.mean(np.exp(np.minimum(r.log_accept_ratio.numpy(), 0.0)))
    # First dual-averaging step (da_t = 1): avg_error = (target - accept) / 11.
    assert float(r.tuning.avg_error) == pytest.approx((0.9 - accept) / 11.0, rel=1e-14, abs=1e-16)


@pytest.mark.parametrize("shape", [(2, 16, 16, 16), (3, 12, 20, 9), (2, 4, 4, 6)])
def test_recorded_coordinates_are_the_kernels(shape):
    """The segment sum that picks stage 3's coordinates == mclmc._subset (strides 8, 4, 1),
    exactly (plain tensors; the 4-device case runs in sharded_cases)."""
    from fieldhmc.samplers.sharded_mclmc import ShardedMicrocanonical

    def value_and_gradient(x):
        return tf.reduce_sum(tf.cast(x, tf.float64) ** 2, axis=[1, 2, 3]), x

    x = np.random.default_rng(0).standard_normal(shape)
    kernel = ShardedMicrocanonical(
        "mams",
        value_and_gradient,
        shape,
        tf.float64,
        None,
        step_size=0.1,
        trajectory_length=1.0,
        num_adaptation_steps=10,
    )
    expected = mclmc._subset([tf.constant(x)], 512).numpy()
    np.testing.assert_array_equal(kernel._subset(tf.constant(x)).numpy(), expected)


def test_mesh_path_has_no_second_tuner_or_integrator():
    """The mesh modules do not define a velocity update, integrator, autocorrelation time
    or dual averaging of their own, and do not import each other in a cycle."""
    import ast
    import inspect

    from fieldhmc.samplers import sharded, sharded_mclmc

    names = set()
    imports = {}
    for module in (sharded, sharded_mclmc):
        tree = ast.parse(inspect.getsource(module))
        names |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        imports[module.__name__] = {
            n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        }
    for name in ("_velocity_update", "autocorrelation_time", "dual_averaging_update"):
        assert name not in names
    assert "fieldhmc.samplers.sharded" not in imports["fieldhmc.samplers.sharded_mclmc"]
