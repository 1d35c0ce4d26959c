"""Kernel builders: whitened metric survives wrapping, jitter, Stan-sign energies."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from fieldhmc.samplers.driver import Sampler, SamplerSettings
from fieldhmc.samplers.kernels import shift_target_log_prob, whiten
from fieldhmc.samplers.kinds import build_kernel
from fieldhmc.samplers.storage import MemorySink

D = 16
SD = np.geomspace(0.1, 10.0, D)


def _run(kind, scale, num_results=3, **kw):
    settings = SamplerSettings(
        kind=kind,
        num_chains=2,
        num_burnin_steps=0,
        num_results=num_results,
        num_leapfrog_steps=5,
        chunk_size=3,
        max_tree_depth=4,
        **kw,
    )

    def target(x):
        return -0.5 * tf.reduce_sum(tf.cast((x / scale) ** 2, tf.float64), axis=-1)

    sampler = Sampler(target, settings, ["x"], [scale])
    init = [np.full((2, D), 0.3) * scale]
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as d:
        out = sampler.run(sink, Path(d), init, progress=False)
    return out.latent_state[0], sink.traces[0]


@pytest.mark.parametrize("kind", ["hmc", "nuts", "fieldnuts"])
def test_metric_survives_step_size_adaptation_wrapper(kind):
    """The workaround for TFP's PNUTS bug: our metric is a whitening of the target,
    so wrapping in DualAveragingStepSizeAdaptation cannot drop it. With the exact
    metric the whitened dynamics are scale-free: results equal the unit run x SD."""
    scaled, _ = _run(kind, SD)
    unit, _ = _run(kind, np.ones(D))
    np.testing.assert_allclose(scaled, unit * SD, rtol=1e-9)
    assert not np.allclose(scaled, unit)


def test_tfp_pnuts_drops_its_metric_when_wrapped():
    """Upstream TFP 0.25 bug (no upstream issue found; see
    tensorflow_probability/python/experimental/mcmc/preconditioned_nuts.py): PNUTS
    keeps ``momentum_distribution`` outside ``self._parameters``, and
    DualAveragingStepSizeAdaptation rebuilds the inner kernel from ``parameters``,
    so chains with and without a mass matrix come out bit-identical. If this test
    starts failing, TFP fixed it and fieldhmc's whitening could be revisited."""
    tfd = tfp.distributions

    def target(x):
        return tf.reduce_sum(-0.5 * (x / SD) ** 2, axis=-1)

    def run(momentum_distribution):
        kernel = tfp.experimental.mcmc.PreconditionedNoUTurnSampler(
            target,
            step_size=0.1,
            max_tree_depth=4,
            momentum_distribution=momentum_distribution,
        )
        kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(kernel, num_adaptation_steps=3)
        # Graph mode (the bug is in Python-side kernel construction): eager NUTS is ~10x slower.
        sample = tf.function(
            lambda: tfp.mcmc.sample_chain(
                5, tf.ones([2, D], tf.float64), kernel=kernel, trace_fn=None, seed=[1, 2]
            ),
            autograph=False,
        )
        return sample().numpy()

    metric = tfd.MultivariateNormalDiag(scale_diag=tf.constant(1.0 / SD))
    np.testing.assert_array_equal(run(metric), run(None))


def test_jittered_hmc_draws_lengths_reproducibly():
    _, a = _run("hmc", np.ones(D), num_results=3, jitter_leapfrog=True)
    _, b = _run("hmc", np.ones(D), num_results=3, jitter_leapfrog=True)
    np.testing.assert_array_equal(a["n_steps"], b["n_steps"])
    settings_steps = 5
    assert np.all((a["n_steps"] >= 1) & (a["n_steps"] <= settings_steps))


@pytest.fixture(scope="module")
def traces_by_kind():
    kinds = ("hmc", "nuts", "fieldnuts", "chees", "snaper")
    return {kind: _run(kind, SD, num_results=6)[1] for kind in kinds}


@pytest.mark.parametrize("kind", ["hmc", "nuts", "fieldnuts", "chees", "snaper"])
def test_energy_has_stans_sign(traces_by_kind, kind):
    """H = -log p + K with K >= 0, so energy >= -lp of the trajectory's start; over a
    few steps -lp is O(D/2) and K is O(D/2): the energy must exceed -lp on average."""
    t = traces_by_kind[kind]
    assert np.all(np.isfinite(t["energy"]))
    assert np.mean(t["energy"] + t["lp"]) > 0
    assert np.all(t["n_steps"] >= 1)
    if kind in ("nuts", "fieldnuts"):
        assert np.all(t["tree_depth"] >= 1)


def test_divergences_are_flagged_for_hmc():
    settings = SamplerSettings(
        kind="hmc",
        num_chains=2,
        num_burnin_steps=0,
        num_results=3,
        num_leapfrog_steps=20,
        chunk_size=3,
        step_size=50.0,
    )

    def target(x):  # stiff: a huge step explodes the energy
        return -0.5 * tf.reduce_sum(tf.cast((x * 100.0) ** 2, tf.float64), axis=-1)

    sampler = Sampler(target, settings, ["x"], [np.ones(D)])
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as d:
        sampler.run(sink, Path(d), [np.full((2, D), 0.01)], progress=False)
    assert sink.traces[0]["diverging"].all()
    assert (sink.traces[0]["acceptance_rate"] < 1e-6).all()


def test_shift_target_log_prob_reaches_nested_results():
    def target(x):
        return -0.5 * tf.reduce_sum(tf.cast(x**2, tf.float64), axis=-1)

    shifted = whiten(target, [tf.ones([D], tf.float64)], tf.zeros([2], tf.float64), tf.float64)
    kernel = build_kernel("hmc", shifted, step_size=0.1, num_adaptation_steps=5)
    results = kernel.bootstrap_results([tf.ones([2, D], tf.float64)])
    moved = shift_target_log_prob(results, tf.constant([1.0, 2.0], tf.float64))
    before = results.inner_results.accepted_results.target_log_prob.numpy()
    after = moved.inner_results.accepted_results.target_log_prob.numpy()
    np.testing.assert_allclose(after - before, [1.0, 2.0])


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="kind"):
        build_kernel("mala", lambda x: x, step_size=0.1, num_adaptation_steps=1)
    with pytest.raises(ValueError, match="chees"):
        SamplerSettings(kind="chees", num_chains=1)


def test_standard_normal_is_the_normal_quantile_of_symmetric_levels():
    """Each float32 draw, eager and under XLA, is the float64 normal quantile of its
    24-bit level (sign bit times the quantile of (2k + 1) 2^-25) to float32 accuracy;
    moments agree with N(0, 1) within 4 MCSE."""
    from fieldhmc.samplers.kernels import standard_normal
    from tests.samplers.test_threefry import assert_quantiles_of_bits

    seed = tf.constant([7, 11])
    shape = [4, 1 << 18]
    bits = tf.random.stateless_uniform(
        shape, seed, minval=None, maxval=None, dtype=tf.uint32, alg="philox"
    ).numpy()
    assert_quantiles_of_bits(standard_normal, seed, bits)
    assert standard_normal([3], seed, tf.float64).dtype == tf.float64


def test_kinetic_energy_change_is_float64_where_tfps_is_not():
    """TFP 0.25's HMC sums the two kinetic energies in float32 (hmc.py,
    ``_compute_log_acceptance_correction``): with 2^21 coordinates per chain each sum is
    ~1e6 (float32 spacing 0.06) and its difference is off by ~1e-2. Ours stays within
    1e-4 of the exact value; if TFP fixes this, the first assertion fails and
    ``kinetic_energy_change`` can go."""
    from tensorflow_probability.python.mcmc import hmc as tfp_hmc

    from fieldhmc.samplers.kernels import kinetic_energy_change

    shape = [4, 1 << 21]
    p0 = tf.random.stateless_normal(shape, [1, 2])
    p1 = p0 + 1e-3 * tf.random.stateless_normal(shape, [3, 4])
    a, b = p0.numpy().astype(np.float64), p1.numpy().astype(np.float64)
    exact = 0.5 * (np.sum(a * a, axis=1) - np.sum(b * b, axis=1))
    theirs = tf.function(
        lambda x, y: tfp_hmc._compute_log_acceptance_correction([x], [y], 1), jit_compile=True
    )(p0, p1).numpy()
    ours = tf.function(lambda x, y: kinetic_energy_change([x], [y]), jit_compile=True)(p0, p1)
    assert ours.dtype == tf.float32
    assert np.max(np.abs(theirs - exact)) > 1e-3
    np.testing.assert_allclose(ours.numpy(), exact, atol=1e-4)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_field_hmc_is_tfp_hmc_but_for_the_momentum_draw(monkeypatch, dtype):
    """FieldHamiltonianMonteCarlo is TFP's HMC step with two pieces replaced for float32
    states: with TFP's momentum draw patched in, states, log densities and acceptance
    agree; float64 states take TFP's step unchanged (bit-identical)."""
    from tensorflow_probability.python.internal import samplers as tfp_samplers

    from fieldhmc.samplers import kernels

    if dtype == tf.float32:
        monkeypatch.setattr(
            kernels,
            "standard_normal",
            lambda shape, seed, dtype: tfp_samplers.normal(shape, dtype=dtype, seed=seed),
        )
    scale = tf.constant(SD, dtype)

    def target(x):
        return -0.5 * tf.reduce_sum((x / scale) ** 2, axis=-1)

    x0 = tf.constant(np.full((3, D), 0.7) * SD, dtype)
    out = []
    for cls in (kernels.FieldHamiltonianMonteCarlo, tfp.mcmc.HamiltonianMonteCarlo):
        kernel = cls(target, step_size=tf.constant(0.03, dtype), num_leapfrog_steps=4)
        x, r = kernel.one_step(x0, kernel.bootstrap_results(x0), seed=tf.constant([5, 6]))
        out.append([x.numpy(), r.accepted_results.target_log_prob.numpy(), r.log_accept_ratio])
    if dtype == tf.float64:
        for a, b in zip(out[0], out[1], strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    else:
        np.testing.assert_array_equal(out[0][0], out[1][0])
        np.testing.assert_array_equal(out[0][1], out[1][1])
        np.testing.assert_allclose(out[0][2].numpy(), out[1][2].numpy(), atol=1e-5)


@pytest.mark.parametrize("shape", [[2, 16, 16, 16], [2, 5, 6, 6], [3, 5, 5, 5], [1, 3, 4, 4]])
def test_standard_normal_draws_by_slabs_bit_identically(shape):
    """Under XLA the field-shaped draw is made slab by slab ([n1, n2] at a time, the
    Philox counter advanced to the slab's first word): bit-identical to drawing all
    words at once, and no field-sized uint32 buffer (nor its erfinv intermediates)
    exists. Slabs of a size not divisible by 4 fall back to the one-shot draw."""
    import re

    from fieldhmc.samplers.kernels import standard_normal
    from fieldhmc.samplers.threefry import normal_of_bits

    seed = tf.constant([7, 11])
    ours = tf.function(lambda s: standard_normal(shape, s), jit_compile=True)
    whole = tf.function(
        lambda s: normal_of_bits(
            tf.random.stateless_uniform(
                shape, s, minval=None, maxval=None, dtype=tf.uint32, alg="philox"
            )
        ),
        jit_compile=True,
    )
    np.testing.assert_array_equal(ours(seed).numpy(), whole(seed).numpy())
    # Eager: Eigen's scalar and vector ndtri may differ in the last bit at slab ends.
    np.testing.assert_allclose(standard_normal(shape, seed), whole.python_function(seed), rtol=3e-7)
    size = int(np.prod(shape))
    slab = shape[-2] * shape[-1]
    if slab % 4 == 0:
        hlo = ours.experimental_get_compiler_ir(seed)(stage="optimized_hlo")
        words = [
            np.prod([int(d) for d in m.split(",")]) for m in re.findall(r"u32\[([\d,]+)\]", hlo)
        ]
        assert max(words) <= slab < size


def test_hmc_step_does_not_keep_the_initial_momentum_through_the_trajectory():
    """The compiled float32 HMC step reads the initial momentum only before the leapfrog
    loop (its kinetic energy is summed right after the draw): no field-sized value made
    before the loop, other than the arguments, is read after it. TFP's correction, and
    ours before, read (p0 - p1)(p0 + p1) after the loop: one more field-sized buffer
    per chain live through the whole trajectory."""
    import re

    from fieldhmc.samplers.kernels import FieldHamiltonianMonteCarlo

    shape = [2, 16, 16, 16]

    def step(x, seed):
        def target(u):
            return tf.cast(-0.5 * tf.reduce_sum(tf.cast(u, tf.float64) ** 2, [1, 2, 3]), u.dtype)

        kernel = FieldHamiltonianMonteCarlo(target, step_size=0.1, num_leapfrog_steps=3)
        y, results = kernel.one_step(x, kernel.bootstrap_results(x), seed=seed)
        return y, results.log_accept_ratio

    compiled = tf.function(step, jit_compile=True)
    args = (tf.ones(shape), tf.constant([1, 2]))
    hlo = compiled.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
    entry = [
        re.sub(r", metadata=\{[^}]*\}", "", line)
        for line in hlo[hlo.index("\nENTRY") :].splitlines()
    ]
    loop = max(i for i, line in enumerate(entry) if " while(" in line and "leapfrog" in line)
    field = "f32[" + ",".join(map(str, shape)) + "]"
    before = {
        m.group(1)
        for line in entry[:loop]
        if (m := re.match(r"\s*(%\S+) = " + re.escape(field), line)) and " parameter(" not in line
    }
    read_after = {name for line in entry[loop + 1 :] for name in re.findall(r"%[\w.\-]+", line)}
    assert before, "no field-sized values before the leapfrog loop: test out of date"
    assert not before & read_after


def test_field_hmc_needs_a_leapfrog_step():
    """Its leapfrog takes the last step after the loop, so zero steps is refused (TFP's
    HMC would return the state unchanged)."""
    from fieldhmc.samplers.kernels import FieldHamiltonianMonteCarlo

    with pytest.raises(ValueError, match="num_leapfrog_steps must be >= 1, got 0"):
        FieldHamiltonianMonteCarlo(lambda x: -0.5 * tf.reduce_sum(x**2, -1), 0.1, 0)
