"""MAMS' convergence stop: warm-up ends once the tuner's estimates have converged.

The exactness of the draws after the stop is tested against the analytic 8³ posterior
in ``tests/samplers/test_posterior.py`` (mams runs the converged stop by default, and
that test also fails if the stop never fires there). Here, on a 512-dimensional
Gaussian, the driver's side: sampling starts where the tuner stopped, ``num_results``
draws still come out, a run killed before or right after the stop resumes to the
same bytes, and ``warmup_stop: fixed`` runs the whole count.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.samplers import Sampler, SamplerSettings
from fieldhmc.samplers.storage import H5TraceSink, read_traces

D = 512
SD = np.geomspace(0.3, 3.0, D).astype(np.float32)
BURNIN, RESULTS, CHUNK = 150, 40, 25


def target(x):
    return -0.5 * tf.reduce_sum(tf.square(x / SD), axis=-1)


def _sampler(warmup_stop: str, **kw) -> Sampler:
    settings = SamplerSettings(
        kind="mams",
        num_chains=4,
        num_burnin_steps=BURNIN,
        num_results=RESULTS,
        chunk_size=CHUNK,
        seed=5,
        warmup_stop=warmup_stop,
        **kw,
    )
    return Sampler(target, settings, ["x"], [np.ones(D, np.float32)])


def _init():
    return [3.0 * np.random.default_rng(1).standard_normal((4, D)).astype(np.float32)]


def _run(sampler, directory: Path, **kw):
    sink = H5TraceSink(directory / "traces.h5")
    init = None if kw.get("resume") else _init()
    out = sampler.run(sink, directory / "checkpoint", init, progress=False, **kw)
    return out, read_traces(directory / "traces.h5") if out.num_draws else None


@pytest.fixture(scope="module")
def converged(tmp_path_factory):
    """One compiled sampler (converged stop) and its uninterrupted run."""
    sampler = _sampler("converged")
    out, traces = _run(sampler, tmp_path_factory.mktemp("full"))
    return sampler, out, traces


def test_stop_fires_before_the_maximum_and_all_draws_come_out(converged):
    _, out, traces = converged
    assert out.complete
    assert out.num_warmup_steps < BURNIN, "the convergence stop never fired"
    assert out.step == out.num_warmup_steps + RESULTS
    assert out.num_draws == RESULTS and traces["lp"].shape == (RESULTS, 4)
    # Warm-up gradients are those of the transitions before the stop, sampling's after.
    assert 0 < out.warmup_gradient_evaluations < out.gradient_evaluations
    # The tuned step keeps MAMS near its acceptance target after the stop.
    assert 0.75 < float(np.mean(traces["acceptance_rate"])) < 0.99


@pytest.fixture(scope="module")
def resumer():
    """A second sampler, as a new process would build: it resumes the killed runs."""
    return _sampler("converged")


@pytest.mark.parametrize("chunks", [2, "at_stop"])
def test_resume_across_the_stop_is_bit_identical(tmp_path, converged, resumer, chunks):
    """Killed inside warm-up (the resumed run crosses the stop) or right after the chunk
    that stopped it: another sampler resumes to the same bytes and warm-up length."""
    sampler, full, traces = converged
    at_stop = chunks == "at_stop"
    if at_stop:  # the chunk the stop cut short is the last warm-up one
        chunks = -(-full.num_warmup_steps // CHUNK)
    partial, _ = _run(sampler, tmp_path, max_chunks=chunks)
    assert not partial.complete
    assert (partial.step == full.num_warmup_steps) == at_stop
    resumed, traces_r = _run(resumer, tmp_path, resume=True)
    assert resumed.complete and resumed.num_warmup_steps == full.num_warmup_steps
    assert traces.keys() == traces_r.keys()
    for name in traces:
        assert traces[name].tobytes() == traces_r[name].tobytes(), name
    for a, b in zip(full.latent_state, resumed.latent_state, strict=True):
        assert a.tobytes() == b.tobytes()
    assert full.tuned == resumed.tuned
    assert full.warmup_gradient_evaluations == resumed.warmup_gradient_evaluations


def test_separate_sampling_program_draws_the_same(tmp_path, converged):
    """Warm-up and sampling as two programs (the warm-up one stops where the tuner
    converged, the sampling one has no tuner): the same bytes as one program."""
    _, full, traces = converged
    sampler = _sampler("converged", separate_sampling_program=True)
    assert sampler._chunk is not sampler._sampling_chunk
    out, traces_2 = _run(sampler, tmp_path)
    assert out.num_warmup_steps == full.num_warmup_steps
    for name in traces:
        assert traces[name].tobytes() == traces_2[name].tobytes(), name
    for a, b in zip(full.latent_state, out.latent_state, strict=True):
        assert a.tobytes() == b.tobytes()


def test_fixed_runs_the_whole_count(tmp_path, converged):
    _, conv, _ = converged
    out, traces = _run(_sampler("fixed"), tmp_path)
    assert out.complete and out.num_warmup_steps == BURNIN and out.step == BURNIN + RESULTS
    assert traces["lp"].shape == (RESULTS, 4)
    assert out.warmup_gradient_evaluations > conv.warmup_gradient_evaluations


def test_bad_warmup_stop_is_refused():
    with pytest.raises(ValueError, match="warmup_stop"):
        SamplerSettings(kind="mams", warmup_stop="sometimes")


def test_checkpoint_of_other_results_is_refused(tmp_path, converged, resumer):
    """A checkpoint whose kernel results have another number of tensors (e.g. mams'
    written before the tuner carried its stop's state) is refused in one message."""
    import json

    sampler, _, _ = converged
    _run(sampler, tmp_path, max_chunks=1)
    path = tmp_path / "checkpoint" / "state.npz"
    with np.load(path) as z:
        arrays = dict(z)
    meta = json.loads(bytes(arrays["__meta__"]).decode())
    last = meta["num_results_flat"] - 1
    del arrays[f"results{last}"]
    meta["num_results_flat"] = last
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="kernel-result tensors"):
        _run(resumer, tmp_path, resume=True)
