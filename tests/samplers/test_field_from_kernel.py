"""mclmc's field outputs read the field its target's last evaluation made
(``MicrocanonicalLangevin.one_step_with_aux``, ``Sampler._field_from_kernel``)."""

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
    assert not plain._field_from_kernel() and marked._field_from_kernel()
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


@pytest.mark.parametrize("kind", ["mams", "hmc"])
def test_only_kernels_that_hand_out_the_field_read_it(kind):
    """mams and the HMC kinds make the field themselves: their kernels have no
    ``one_step_with_aux``."""
    target = FieldTarget()
    settings = SamplerSettings(kind=kind, num_chains=2, num_burnin_steps=4, num_results=4)
    outputs = FieldOutputs(field_fn=target.field_from_latents, power_fn=lambda v: v[:, :1])
    sampler = Sampler(target, settings, ["x", "h"], [SD, np.float32(2.0)], outputs)
    assert not sampler._field_from_kernel()
