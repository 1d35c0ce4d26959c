"""mclmc's, mams' and hmc's field outputs read the field their target's last evaluation
made (``one_step_with_aux`` of the microcanonical kernels, ``EndPointTap``,
``Sampler._field_tap``)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.samplers.driver import FieldOutputs, Sampler, SamplerSettings
from fieldhmc.samplers.storage import MemorySink
from tests.samplers.test_driver import SD, _init, gaussian_target

MARKER = 1000.0  # what a marking target adds to the field it hands the kernel
WALL = 6.0  # the walled target's log density is -inf where x[:, -1] > WALL (MU 1, SD 5)


class FieldTarget:
    """``gaussian_target`` with :class:`~fieldhmc.models.field_model.PinnedTarget`'s
    field protocol; the field is ``x``. ``marker`` is added to the field the log density
    hands out (not a valid target: it shows where a stored field came from); ``wall``
    makes steps past it non-finite (mclmc undoes them)."""

    def __init__(self, computes_field=True, marker=0.0, wall=False):
        self.computes_field = computes_field
        self.marker, self.wall = marker, wall

    def __call__(self, x, h):
        lp = gaussian_target(x, h)
        if self.wall:
            lp = tf.where(x[:, -1] > WALL, tf.constant(-np.inf, tf.float64), lp)
        return lp

    def log_prob_and_field(self, x, h):
        return self(x, h), x + self.marker

    def field_from_latents(self, x, h):
        return x


def _run(target, tmp_path, name, **kw):
    settings = SamplerSettings(
        **{
            "kind": "mclmc",
            "num_chains": 4,
            "num_burnin_steps": 40,
            "num_results": 30,
            "chunk_size": 15,
            "field_thin": 2,
            "seed": 3,
            **kw,
        }
    )
    outputs = FieldOutputs(
        field_fn=target.field_from_latents,
        power_fn=lambda v: tf.reduce_sum(v**2, axis=-1, keepdims=True),
    )
    sampler = Sampler(target, settings, ["x", "h"], [SD, np.float32(2.0)], outputs)
    sink = MemorySink()
    out = sampler.run(sink, tmp_path / name, _init(), progress=False)
    return sampler, out, sink.stacked_traces(), sink.stacked_fields()


def test_stored_fields_and_moments_come_from_the_kernel_and_change_no_draw(tmp_path):
    """With a target that makes the field, the stored field draws, their P(k) and the
    running moments are those its evaluation handed the kernel (the marker shows it),
    and the chain is the one without the tap, to the bit."""
    plain, base, traces, fields = _run(FieldTarget(computes_field=False), tmp_path, "plain")
    marked, got, traces_m, fields_m = _run(FieldTarget(marker=MARKER), tmp_path, "marked")
    assert plain._field_tap() == (None, False) and marked._field_tap() == ("kernel", False)
    assert fields.shape == (15, 4, SD.size)
    for name in traces:
        if name != "power":  # P(k) reads the (marked) field
            np.testing.assert_array_equal(traces_m[name], traces[name], err_msg=name)
    power = (fields_m.astype(np.float64) ** 2).sum(axis=-1)  # of the stored draws
    np.testing.assert_allclose(traces_m["power"][::2, :, 0], power, rtol=1e-6)
    for p, q in zip(got.latent_state, base.latent_state, strict=True):
        np.testing.assert_array_equal(p, q)
    # the marked field: x + 1000 in float32 (ulp 6e-5 there)
    np.testing.assert_allclose(fields_m, fields + MARKER, atol=2e-4)
    np.testing.assert_allclose(got.field_mean, base.field_mean + MARKER, atol=2e-4)
    np.testing.assert_allclose(got.field_var, base.field_var, rtol=1e-2, atol=1e-3)


def test_a_step_undone_makes_its_field_again(tmp_path):
    """Where a chain's step was undone (non-finite past the wall) the state is the
    previous one, whose field the kernel did not make: the driver makes every chain's
    field itself on that transition (no marker), and reads the kernel's elsewhere."""
    _, out, traces, fields = _run(
        FieldTarget(marker=MARKER, wall=True), tmp_path, "wall", field_thin=1
    )
    undone = traces["diverging"].any(axis=1)  # ~finite (|dE| > 1000 never on this target)
    marked = fields.mean(axis=(1, 2)) > MARKER / 2
    assert undone.any() and not undone.all(), undone
    np.testing.assert_array_equal(marked, ~undone)
    assert np.all(out.latent_state[0][:, -1] <= WALL)
    # the remade fields are states of the walled target: the wall holds
    assert np.all(fields[undone][..., -1] <= WALL)


@pytest.mark.parametrize(
    "kind, options, tap",
    [
        ("mclmc", {}, ("kernel", False)),
        ("mclmc", {"stats_every": 1}, ("kernel", True)),
        ("mams", {}, ("kernel", True)),
        ("hmc", {}, ("end_point", True)),
        ("hmc", {"jitter_leapfrog": True}, ("end_point", True)),
        ("hmc", {"stats_every": 2}, ("end_point", False)),
        ("fieldnuts", {}, (None, False)),
    ],
)
def test_which_kernels_hand_out_the_field(kind, options, tap):
    """mclmc's and mams' kernels hand out their proposal's field, hmc's target's last
    evaluation is read; the current field is kept through the chunk where the running
    moments read one every transition. The NUTS kinds make the field from the state."""
    target = FieldTarget()
    settings = SamplerSettings(
        kind=kind, num_chains=2, num_burnin_steps=4, num_results=4, **options
    )
    outputs = FieldOutputs(field_fn=target.field_from_latents, power_fn=lambda v: v[:, :1])
    sampler = Sampler(target, settings, ["x", "h"], [SD, np.float32(2.0)], outputs)
    assert sampler._field_tap() == tap


@pytest.mark.parametrize(
    "kind, options",
    [
        ("hmc", {"num_leapfrog_steps": 3}),
        ("hmc", {"num_leapfrog_steps": 3, "jitter_leapfrog": True}),
        ("hmc", {"num_leapfrog_steps": 3, "stats_every": 2}),
        ("mams", {"warmup_stop": "fixed"}),
    ],
)
def test_the_accepted_proposals_field_is_kept(tmp_path, kind, options):
    """The stored fields are those the proposals' evaluations made (marked) where they
    were accepted, and a rejected proposal's field is never kept. Kept through the chunk
    (running moments every transition): marked from a chain's first accepted proposal
    in a chunk on, the field made from the chunk's first state (unmarked) before it.
    Otherwise (``stats_every`` 2): marked where every chain's proposal was accepted,
    made from the state (unmarked) elsewhere. The draws are those without the tap, to
    the bit."""
    kw = {"kind": kind, "num_burnin_steps": 30, "num_results": 30, "field_thin": 1, **options}
    plain, base, traces, fields = _run(FieldTarget(computes_field=False), tmp_path, "p", **kw)
    marked, got, traces_m, fields_m = _run(FieldTarget(marker=MARKER), tmp_path, "m", **kw)
    kept = "stats_every" not in options
    assert plain._field_tap() == (None, False) and marked._field_tap()[1] == kept
    for name in traces:
        if name != "power":
            np.testing.assert_array_equal(traces_m[name], traces[name], err_msg=name)
    accepted = traces["is_accepted"]  # [30, 4]: two chunks of 15 (steps 30-44, 45-59)
    assert 0 < accepted.mean() < 1, accepted.mean()
    if kept:
        mark = np.concatenate(
            [np.logical_or.accumulate(accepted[c : c + 15], axis=0) for c in (0, 15)]
        )
    else:
        mark = np.broadcast_to(accepted.all(axis=1, keepdims=True), accepted.shape)
    assert mark.any() and not mark.all()
    np.testing.assert_allclose(fields_m, fields + MARKER * mark[..., None], atol=2e-4)
    if kept:  # the running mean pools chains and draws
        np.testing.assert_allclose(
            got.field_mean, base.field_mean + MARKER * mark.mean(), atol=2e-4
        )


def test_end_point_tap_reads_only_its_callers_graph():
    """An evaluation inside a loop's own graph (TFP's leapfrog, whose last step is in its
    while loop) cannot be read outside it: ``read`` gives None there, and the proposal's
    aux after FieldHamiltonianMonteCarlo's step (its leapfrog's last step is not)."""
    import tensorflow_probability as tfp

    from fieldhmc.samplers.kernels import EndPointTap, FieldHamiltonianMonteCarlo

    def target(x):
        return -0.5 * tf.reduce_sum(x**2, axis=-1), 2.0 * x

    x0 = tf.ones([3, 5])
    for cls, readable in [
        (FieldHamiltonianMonteCarlo, True),
        (tfp.mcmc.HamiltonianMonteCarlo, False),
    ]:

        @tf.function
        def step(x, cls=cls):
            tap = EndPointTap(target)
            kernel = cls(tap, step_size=0.1, num_leapfrog_steps=3)
            _, results = kernel.one_step(x, kernel.bootstrap_results(x), seed=[1, 2])
            return tap.read(), results.proposed_state

        aux, proposal = step(x0)
        assert (aux is not None) == readable, cls
        if readable:
            np.testing.assert_allclose(aux, 2.0 * proposal, rtol=1e-6)


@pytest.mark.parametrize("kind", ["hmc", "mams"])
def test_one_program_and_two_draw_the_same_with_the_tap(tmp_path, kind):
    """With the field read from the kernel (and kept through the chunk), one program for
    both phases and a post-warm-up program of their own still make the same transitions
    and outputs, to the bit: the proposal's last step rounds the same whatever program
    it is compiled into (mams runs it in a loop of its own)."""
    from tests.samplers.test_driver import _assert_same_bytes, _short_sampler

    target = FieldTarget()
    outputs = FieldOutputs(
        field_fn=target.field_from_latents,
        power_fn=lambda f: tf.reduce_mean(f**2, -1, keepdims=True),
    )
    runs = []
    for separate in (True, False):
        sampler = _short_sampler(
            kind, outputs, target, field_thin=3, separate_sampling_program=separate
        )
        assert sampler._field_tap() == (("end_point" if kind == "hmc" else "kernel"), True)
        sink = MemorySink()
        runs += [sink, sampler.run(sink, tmp_path / str(separate), _init(chains=2), progress=False)]
    _assert_same_bytes(*runs)
