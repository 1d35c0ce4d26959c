"""MAMS's tuner on an iid Gaussian: the trajectory length must not collapse.

On :math:`\\mathcal N(0, I_d)` the isokinetic dynamics move the state by one unit
per unit time, so time :math:`t` is HMC time :math:`t / \\sqrt d`. With a full
velocity refresh and a trajectory length uniform in :math:`(0, 2L)` the lag-1
autocorrelation of every coordinate is :math:`\\rho = \\sin(2T)/(2T)` with
:math:`T = L/\\sqrt d`, and the gradients per effective sample scale as
:math:`T (1 + \\rho)/(1 - \\rho)`, which falls monotonically up to :math:`T \\approx 2`
(3.0 at :math:`T` = 0.9, 1.9 at 1.3, 1.4 at 2). The moment stage sets
:math:`L = 1.3 \\sqrt{\\sum_i \\mathrm{Var}[x_i]} = 1.3 \\sqrt d`; a final
:math:`L < \\sqrt d` is a collapse that costs ESS per gradient. The test fails on the
tuner that applied BlackJAX's ``0.5 L \\tau`` rule without a floor (final
:math:`L \\approx 0.95 \\sqrt d` here, 1.4 integration steps per transition).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.samplers.mclmc import MetropolisAdjustedMicrocanonical

DIM = 4096
CHAINS = 4
WARMUP = 300


@pytest.fixture(scope="module")
def tuned():
    """Per-transition step size and ``L`` over the warm-up, plus the kernel."""

    def target(x):
        return -0.5 * tf.reduce_sum(tf.square(x), axis=-1)

    root_d = math.sqrt(DIM)
    kernel = MetropolisAdjustedMicrocanonical(
        target, step_size=0.1 * root_d, trajectory_length=root_d, num_adaptation_steps=WARMUP
    )
    x = tf.random.stateless_normal([CHAINS, DIM], [1, 2])
    results = kernel.bootstrap_results(x)

    @tf.function(jit_compile=True)
    def run(x, r):
        def body(i, x, r, eps, big_l, grads):
            x, r = kernel.one_step(x, r, seed=tf.stack([7, i]))
            eps = eps.write(i, r.step_size)
            big_l = big_l.write(i, r.trajectory_length)
            return i + 1, x, r, eps, big_l, grads + r.num_gradient_evaluations

        arrays = [tf.TensorArray(tf.float32, size=WARMUP) for _ in range(2)]
        _, x, r, eps, big_l, grads = tf.while_loop(
            lambda i, *_: i < WARMUP, body, (tf.constant(0), x, r, *arrays, tf.constant(0))
        )
        return eps.stack(), big_l.stack(), grads

    eps, big_l, grads = run(x, results)
    return kernel, np.asarray(eps) / root_d, np.asarray(big_l) / root_d, int(grads)


def test_moment_stage_sets_l_to_the_typical_set_scale(tuned):
    kernel, _, length, _ = tuned
    after_moments = length[kernel.stage_ends[1] - 1]
    assert 0.65 <= after_moments <= 2.6, f"L/sqrt(d) after the moment stage = {after_moments:.3f}"


def test_final_trajectory_length_does_not_collapse(tuned):
    kernel, eps, length, _ = tuned
    after_moments = length[kernel.stage_ends[1] - 1]
    final_l, final_eps = length[-1], eps[-1]
    assert final_l >= 0.99 * after_moments and final_l >= 1.0, (
        f"final L/sqrt(d) = {final_l:.3f} below the moment-stage {after_moments:.3f}"
    )
    assert final_l <= 2.0 * after_moments + 1e-6, f"final L/sqrt(d) = {final_l:.3f}"
    assert final_l / final_eps >= 2.0, f"L/eps = {final_l / final_eps:.2f} integration steps"


def test_autocorrelation_stage_runs_at_the_dual_averaged_step(tuned):
    """Stage 3 must not run at a step shrunk with ``L`` (BlackJAX's rescaling, which at
    the initial ``L / eps = 10`` left it at 10 integration steps of a quarter of the
    accepted step: gradients spent on a different integrator than the one sampled)."""
    kernel, eps, length, _ = tuned
    _, end2, end3, _ = kernel.stage_ends
    stage3 = length[end2:end3] / eps[end2:end3]
    assert np.all(stage3 <= 5.0), f"stage-3 L/eps up to {stage3.max():.1f}"
