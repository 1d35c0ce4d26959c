"""Host-side pieces of the sharded MCLMC / MAMS tuners against ``fieldhmc.samplers.mclmc``.

The sharded transitions themselves run on virtual devices in a subprocess
(``tests/samplers/sharded_cases.py``, asserted in ``test_sharded.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from fieldhmc.samplers import mclmc
from fieldhmc.samplers.sharded_mclmc import autocorrelation_time, num_integration_steps


@pytest.mark.parametrize(("reduce_np", "reduce_tf"), [(np.mean, None), (np.max, tf.reduce_max)])
@pytest.mark.parametrize("chains", [1, 4])
def test_autocorrelation_time_is_the_kernels(reduce_np, reduce_tf, chains):
    """The NumPy port == mclmc._autocorrelation_time (float64), on AR(1) chains whose
    coordinates have different correlation (rho 0 .. 0.9) and chain offsets."""
    rng = np.random.default_rng(3)
    n, k = 41, 12
    rho = np.linspace(0.0, 0.9, k)
    x = np.zeros((n, chains, k))
    x[0] = rng.standard_normal((chains, k))
    for t in range(1, n):
        x[t] = rho * x[t - 1] + np.sqrt(1 - rho**2) * rng.standard_normal((chains, k))
    x += 0.3 * rng.standard_normal((1, chains, 1))
    args = () if reduce_tf is None else (reduce_tf,)
    expected = float(mclmc._autocorrelation_time(tf.constant(x), *args))
    ours = autocorrelation_time(x, reduce_np)
    assert ours == pytest.approx(expected, rel=1e-12)
    assert ours > 1.5  # the slow coordinates count


def test_num_integration_steps_is_the_kernels():
    """N = ceil(U s) on the host == mclmc._num_integration_steps for the same uniform."""
    seeds = [tf.constant([i, 7], tf.int32) for i in range(40)]
    for mean in (0.4, 1.0, 1.3, 2.7, 10.2, 37.5):
        for seed in seeds:
            u = tf.random.stateless_uniform([], seed, dtype=tf.float64, alg="philox")
            expected = int(mclmc._num_integration_steps(tf.constant(mean, tf.float64), seed))
            assert num_integration_steps(mean, float(u)) == expected


def test_float64_kernel_parameters_are_not_rounded_to_float32():
    """A float64 MAMS kernel's target acceptance, initial L (and MCLMC's tolerance) are
    the float64 values given: ``tf.cast(0.9, tf.float64)`` goes through float32
    (0.89999998), which moved the tuned step size of float64 runs by ~2e-8 and made the
    sharded port (host float64 tuner) disagree with the kernel at 1e-7."""
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
