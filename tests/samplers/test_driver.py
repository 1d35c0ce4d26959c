"""The chunked driver: correctness on known Gaussians, resume, seeds, no retracing."""

from __future__ import annotations

import functools
import gc
import signal
import weakref
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from fieldhmc.diagnostics import ess_bulk
from fieldhmc.samplers.checkpoint import load_checkpoint, save_checkpoint
from fieldhmc.samplers.driver import (
    FieldOutputs,
    Sampler,
    SamplerSettings,
    _ConcreteCall,
    _welford_update,
    _zero_welford,
    adaptation_windows,
    field_stats_every,
)
from fieldhmc.samplers.storage import H5TraceSink, MemorySink, read_fields, read_traces

D = 24
SD = np.geomspace(0.05, 5.0, D).astype(np.float32)
MU = np.linspace(-1, 1, D).astype(np.float32)


def gaussian_target(x, h):
    """Independent Gaussians N(MU, SD^2) plus a scalar N(0.5, 2^2); float64 reduction."""
    z = tf.cast((x - MU) / SD, tf.float64)
    zh = tf.cast((h - 0.5) / 2.0, tf.float64)
    return -0.5 * tf.reduce_sum(z**2, axis=-1) - 0.5 * zh**2


def _init(chains=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((chains, D)).astype(np.float32), np.zeros(chains, np.float32)]


def _sampler(scales=None, **kw):
    settings = SamplerSettings(
        **{
            "num_chains": 4,
            "num_burnin_steps": 150,
            "num_results": 400,
            "num_leapfrog_steps": 6,
            "chunk_size": 100,
            **kw,
        }
    )
    scales = scales or [SD, np.float32(2.0)]
    return Sampler(gaussian_target, settings, ["x", "h"], scales)


def _zscores(draws, mu, sd):
    """MCSE-scaled z-scores of the mean and variance of each coordinate.

    draws: [draw, chain, D]. The MCSE uses the rank-normalised bulk ESS (of x for the mean and
    of (x - mu)^2 for the variance).
    """
    post = np.moveaxis(draws, 0, 1)  # chain, draw, D
    ess_mean = ess_bulk(post)
    sq = (post - mu) ** 2
    ess_var = ess_bulk(sq)
    z_mean = (post.mean(axis=(0, 1)) - mu) / (sd / np.sqrt(ess_mean))
    z_var = (sq.mean(axis=(0, 1)) - sd**2) / (sd**2 * np.sqrt(2.0 / ess_var))
    return np.concatenate([np.ravel(z_mean), np.ravel(z_var)])


def _assert_standard_normal(z):
    """z ~ N(0, 1) iid: a chi-square test of sum z^2 and a bound on |z| > 4."""
    chi2 = float(np.sum(z**2))
    p = stats.chi2.sf(chi2, df=z.size) if chi2 > z.size else stats.chi2.cdf(chi2, df=z.size)
    assert 2 * p > 1e-3, f"sum z^2 = {chi2:.1f} for {z.size} z-scores (two-sided p={2 * p:.2g})"
    assert np.sum(np.abs(z) > 4) == 0, f"extreme z-scores: {z[np.abs(z) > 4]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, kw in {
        "hmc_exact_metric": {"kind": "hmc"},
        "hmc_adapted": {
            "kind": "hmc",
            "adapt_diagonal": True,
            "num_burnin_steps": 500,
            "scales": [np.ones(D, np.float32), np.float32(1.0)],
        },
        "nuts_exact_metric": {"kind": "nuts", "max_tree_depth": 6},
    }.items():
        sampler = _sampler(**kw)
        sink = MemorySink()
        summary = sampler.run(sink, tmp_path_factory.mktemp(name), _init(), progress=False)
        out[name] = (sampler, sink.stacked_traces(), summary)
    return out


@pytest.mark.parametrize("name", ["hmc_exact_metric", "hmc_adapted", "nuts_exact_metric"])
def test_moments_pass_mcse_scaled_z_tests(runs, name):
    _, traces, summary = runs[name]
    assert summary.complete
    # The scalar part is traced in full; the vector part via the final-state-free
    # route: compare the scalar and use the vector's exact Gaussian structure below.
    h = traces["h"][:, :, None]
    z = _zscores(h, np.array([0.5]), np.array([2.0]))
    assert np.all(np.abs(z) < 4.5), z
    assert traces["lp"].shape == (400, 4)
    assert not traces["diverging"].any()


def test_adapted_metric_recovers_scales(runs):
    _, _, summary = runs["hmc_adapted"]
    ratio = summary.scales[0] / SD
    # Windowed variance estimates from the last (~250-step) window: within 50% everywhere,
    # and unbiased on average across the 24 coordinates.
    assert np.all((ratio > 0.5) & (ratio < 1.5)), ratio
    assert abs(np.mean(np.log(ratio))) < 0.2


def test_vector_moments_with_z_scores(tmp_path):
    """Every coordinate of a 24-d Gaussian, mean and variance, by MCSE-scaled z-tests."""
    settings = SamplerSettings(
        kind="hmc",
        num_chains=4,
        num_burnin_steps=150,
        num_results=400,
        num_leapfrog_steps=6,
        chunk_size=100,
    )

    # Trace the vector part too: give it as 24 scalar parts via a wrapper target.
    def target(*parts):
        x = tf.stack(parts[:-1], axis=-1)
        return gaussian_target(x, parts[-1])

    names = [f"x{i}" for i in range(D)] + ["h"]
    scales = [*list(SD), np.float32(2.0)]
    sampler = Sampler(target, settings, names, scales)
    rng = np.random.default_rng(1)
    init = [rng.standard_normal(4).astype(np.float32) for _ in range(D)] + [np.zeros(4, np.float32)]
    sink = MemorySink()
    sampler.run(sink, tmp_path, init, progress=False)
    t = sink.stacked_traces()
    draws = np.stack([t[f"x{i}"] for i in range(D)], axis=-1)
    _assert_standard_normal(_zscores(draws, MU, SD))


def test_z_test_detects_a_wrong_target(tmp_path):
    """Power check: the same test rejects draws from a target 10% too wide."""
    rng = np.random.default_rng(2)
    draws = MU + 1.1 * SD * rng.standard_normal((400, 4, D))
    with pytest.raises(AssertionError):
        _assert_standard_normal(_zscores(draws.astype(np.float32), MU, SD))


def test_no_retracing_between_chunks(runs):
    for sampler, _, _ in runs.values():
        # Several chunks (plus window boundaries): one trace of each program.
        assert sampler._chunk.experimental_get_tracing_count() == 1
        assert sampler._sampling_chunk.experimental_get_tracing_count() == 1


def _run_traces(tmp_path: Path, seed: int, max_chunks=None, resume=False, sampler=None):
    sampler = sampler or _sampler(
        kind="hmc",
        seed=seed,
        adapt_diagonal=True,
        num_burnin_steps=120,
        num_results=80,
        chunk_size=40,
    )
    sink = H5TraceSink(tmp_path / "traces.h5")
    init = None if resume else _init()
    summary = sampler.run(
        sink, tmp_path / "checkpoint", init, progress=False, max_chunks=max_chunks, resume=resume
    )
    return sampler, summary


def _assert_bit_identical(tmp_path, full: dict, resumed: dict) -> None:
    """Traces in ``full/`` and ``killed/`` and the final states agree to the bit."""
    t_full = read_traces(tmp_path / "full" / "traces.h5")
    t_res = read_traces(tmp_path / "killed" / "traces.h5")
    assert t_full.keys() == t_res.keys()
    for name in t_full:
        assert t_full[name].tobytes() == t_res[name].tobytes(), name
    for a, b in zip(full.latent_state, resumed.latent_state, strict=True):
        assert a.tobytes() == b.tobytes()


def test_same_seed_identical_different_seed_differs(tmp_path):
    _, a = _run_traces(tmp_path / "a", seed=3)
    _, b = _run_traces(tmp_path / "b", seed=3)
    _, c = _run_traces(tmp_path / "c", seed=4)
    ta, tb, tc = (read_traces(tmp_path / d / "traces.h5") for d in "abc")
    for name in ta:
        np.testing.assert_array_equal(ta[name], tb[name])
    assert not np.array_equal(ta["h"], tc["h"])
    np.testing.assert_array_equal(a.latent_state[0], b.latent_state[0])


def test_resume_after_kill_is_bit_identical(tmp_path):
    sampler, full = _run_traces(tmp_path / "full", seed=5)
    # Kill after 3 chunks (inside warm-up, across a metric window), then resume with a
    # fresh sampler object, as a new process would.
    _, partial = _run_traces(tmp_path / "killed", seed=5, max_chunks=3)
    assert not partial.complete
    fresh = _sampler(
        kind="hmc", seed=5, adapt_diagonal=True, num_burnin_steps=120, num_results=80, chunk_size=40
    )
    _, resumed = _run_traces(tmp_path / "killed", seed=5, resume=True, sampler=fresh)
    assert resumed.complete
    _assert_bit_identical(tmp_path, full, resumed)


def test_resume_truncates_draws_written_after_the_checkpoint(tmp_path):
    _, full = _run_traces(tmp_path / "full", seed=6)
    sampler, _ = _run_traces(tmp_path / "killed", seed=6, max_chunks=6)  # into sampling
    # A checkpoint from before the slimmed results (no "layout" key) is refused in one
    # line, and left as it was.
    checkpoint = tmp_path / "killed" / "checkpoint"
    arrays, meta = load_checkpoint(checkpoint)
    old = {k: v for k, v in meta.items() if k != "layout"}
    save_checkpoint(checkpoint, arrays, old)
    with pytest.raises(ValueError, match="state layout 1, this fieldhmc reads layout 2"):
        _run_traces(tmp_path / "killed", seed=6, resume=True)
    assert load_checkpoint(checkpoint)[1] == old
    save_checkpoint(checkpoint, arrays, meta)
    # Simulate a kill between the trace append and the checkpoint: extra rows on disk.
    H5TraceSink(tmp_path / "killed" / "traces.h5").append(
        {k: v[:7] for k, v in read_traces(tmp_path / "killed" / "traces.h5").items()}
    )
    _run_traces(tmp_path / "killed", seed=6, resume=True)
    t_full = read_traces(tmp_path / "full" / "traces.h5")
    t_res = read_traces(tmp_path / "killed" / "traces.h5")
    for name in t_full:
        np.testing.assert_array_equal(t_full[name], t_res[name])


class _SinkActingAt(H5TraceSink):
    """Calls ``action()`` during its ``at``-th trace append (before it writes)."""

    def __init__(self, path, at, action):
        super().__init__(path)
        self.appends, self.at, self.action = 0, at, action

    def append(self, traces):
        self.appends += 1
        if self.appends == self.at:
            self.action()
        super().append(traces)


def _die():
    raise KeyboardInterrupt  # as a killed process would


def _record_checkpoints(monkeypatch) -> list:
    """The steps at which Sampler writes its checkpoints, in order, from now on."""
    written = []
    real = Sampler._checkpoint
    monkeypatch.setattr(
        Sampler, "_checkpoint", lambda self, d, rs: (written.append(rs.step), real(self, d, rs))
    )
    return written


def test_checkpoints_every_checkpoint_seconds_and_a_kill_between_them_resumes(
    tmp_path, monkeypatch
):
    """With checkpoint_seconds longer than the run, checkpoints follow the first chunk,
    the end of warm-up and the last chunk only; a run killed two sampling chunks after
    its last checkpoint (draws on disk past it) resumes to the uninterrupted draws."""
    settings = dict(
        kind="hmc",
        seed=9,
        adapt_diagonal=True,
        num_burnin_steps=120,
        num_results=120,
        chunk_size=40,
        checkpoint_seconds=1e6,
    )
    written = _record_checkpoints(monkeypatch)
    sampler = _sampler(**settings)
    _, full = _run_traces(tmp_path / "full", seed=9, sampler=sampler)
    assert written == [18, 120, 240]  # first chunk, end of warm-up, last (every chunk: 8)
    written.clear()
    sink = _SinkActingAt(tmp_path / "killed" / "traces.h5", 3, _die)  # the chunk 200-240
    with pytest.raises(KeyboardInterrupt):
        sampler.run(sink, tmp_path / "killed" / "checkpoint", _init(), progress=False)
    assert written == [18, 120]  # chunks 120-200's draws are on disk, past it
    assert len(read_traces(tmp_path / "killed" / "traces.h5")["lp"]) == 80
    # A fresh sampler resumes, as a new process would.
    _, resumed = _run_traces(tmp_path / "killed", seed=9, resume=True, sampler=_sampler(**settings))
    assert written == [18, 120, 160, 240]  # and the resumed process's first chunk
    _assert_bit_identical(tmp_path, full, resumed)


def test_ctrl_c_stops_at_the_chunks_end_with_a_checkpoint(tmp_path, monkeypatch):
    """SIGINT during a chunk's bookkeeping is held until the chunk is checkpointed
    (whatever checkpoint_seconds says); then run raises KeyboardInterrupt, restores the
    handler, and a resumed run reproduces the uninterrupted one."""
    settings = dict(kind="hmc", seed=10, num_burnin_steps=40, num_results=120, chunk_size=40)
    _, full = _run_traces(tmp_path / "full", seed=10, sampler=_sampler(**settings))
    written = _record_checkpoints(monkeypatch)
    sampler = _sampler(**settings, checkpoint_seconds=1e6)
    ctrl_c = functools.partial(signal.raise_signal, signal.SIGINT)
    sink = _SinkActingAt(tmp_path / "killed" / "traces.h5", 2, ctrl_c)  # the chunk 80-120
    # Python's own handler, as in a terminal (a background job inherits SIGINT ignored)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            sampler.run(sink, tmp_path / "killed" / "checkpoint", _init(), progress=False)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert written == [40, 120]  # the end of warm-up (also the first chunk), then Ctrl-C
    assert len(read_traces(tmp_path / "killed" / "traces.h5")["lp"]) == 80
    _, resumed = _run_traces(tmp_path / "killed", seed=10, resume=True, sampler=sampler)
    _assert_bit_identical(tmp_path, full, resumed)


def test_metric_is_in_use():
    """With the exact metric, the whitened dynamics do not depend on the scales: one
    HMC step on N(0, diag(SD^2)) equals one step on N(0, I) scaled by SD."""

    def run(scale):
        settings = SamplerSettings(
            kind="hmc",
            num_chains=2,
            num_burnin_steps=0,
            num_results=1,
            num_leapfrog_steps=5,
            chunk_size=1,
        )

        def target(x):
            return -0.5 * tf.reduce_sum(tf.cast((x / scale) ** 2, tf.float64), axis=-1)

        sampler = Sampler(target, settings, ["x"], [scale])
        init = [np.full((2, D), 0.3, np.float64) * scale]
        sink = MemorySink()
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            out = sampler.run(sink, Path(d), init, progress=False)
        return out.latent_state[0]

    scaled = run(SD.astype(np.float64))
    unit = run(np.ones(D))
    np.testing.assert_allclose(scaled, unit * SD, rtol=1e-10)
    assert not np.allclose(scaled, unit)


def test_adaptation_windows_follow_stan():
    assert adaptation_windows(10) == []
    w = adaptation_windows(1000)
    assert w[0] == (75, 100) and w[-1][1] == 950
    assert all(a[1] == b[0] for a, b in zip(w, w[1:], strict=False))
    short = adaptation_windows(100)
    assert short[0][0] == 15 and short[-1][1] == 90


def test_bad_initial_state_is_reported():
    sampler = _sampler(kind="hmc")
    init = _init()
    init[0][0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        sampler.run(MemorySink(), Path("/nonexistent"), init, progress=False)
    with pytest.raises(ValueError, match="chains"):
        sampler.run(MemorySink(), Path("/nonexistent"), _init(chains=3), progress=False)


@pytest.mark.parametrize("kind", ["mclmc", pytest.param("mams", marks=pytest.mark.slow)])
def test_microcanonical_resume_is_bit_identical(tmp_path, kind):
    """Killed inside the tuning stages, resumed by a fresh sampler: the same bytes.

    The tuner's whole state (predictor, dual averaging, moments, autocorrelation buffer)
    lives in the kernel results, so the resumed run must retune identically.
    """

    def make():
        return _sampler(kind=kind, seed=7, num_burnin_steps=80, num_results=40, chunk_size=20)

    first = make()  # the uninterrupted and the killed run share one compiled sampler
    _, full = _run_traces(tmp_path / "full", seed=7, sampler=first)
    _, partial = _run_traces(tmp_path / "killed", seed=7, max_chunks=3, sampler=first)
    assert not partial.complete
    _, resumed = _run_traces(tmp_path / "killed", seed=7, resume=True, sampler=make())
    assert resumed.complete
    _assert_bit_identical(tmp_path, full, resumed)
    assert full.tuned == resumed.tuned
    assert full.warmup_gradient_evaluations == resumed.warmup_gradient_evaluations > 0
    # The tuner moved both parameters away from their starting values.
    assert full.tuned["step_size"] != 0.1 and full.tuned["trajectory_length"] != 1.0


def _field_sampler(modes_fn=None, **kw):
    """mclmc on the D-vector target with field outputs: the field is ``x`` itself."""
    settings = SamplerSettings(
        kind="mclmc",
        num_chains=4,
        num_burnin_steps=40,
        num_results=37,
        chunk_size=15,
        field_thin=5,
        seed=9,
        **kw,
    )
    outputs = FieldOutputs(
        field_fn=lambda x, h: x,
        power_fn=lambda v: tf.reduce_sum(v**2, axis=-1, keepdims=True),
        tracked_fn=lambda v: tf.complex(v[:, :3], v[:, 3:6]),
        modes_fn=modes_fn,
    )
    return Sampler(gaussian_target, settings, ["x", "h"], [SD, np.float32(2.0)], outputs)


@pytest.fixture(scope="module")
def field_sampler():
    """One compiled ``_field_sampler()`` for the tests that run it fresh (it runs many
    times without retracing)."""
    return _field_sampler()


def test_mclmc_field_moments_every_kth_transition_and_resume(tmp_path, field_sampler):
    """mclmc (2 gradients per transition) updates the field's running moments every 5th
    post-warm-up transition only: they equal the moments of the stored field draws
    (field_thin = 5), not those of every transition; per-draw P(k) stays on every stored
    draw; a run killed mid-sampling and resumed gives the same bytes."""
    assert field_stats_every(SamplerSettings(kind="mclmc")) == 5
    assert field_stats_every(SamplerSettings(kind="mclmc", integrator="leapfrog")) == 10
    for kind in ("hmc", "nuts", "fieldnuts", "mams"):
        assert field_stats_every(SamplerSettings(kind=kind)) == 1
    # Field draws stored at least every 5th: the moments on a multiple of their cadence,
    # so that no transition makes a field for the moments alone.
    for thin, every in ((3, 3), (2, 4), (5, 5), (10, 5), (7, 5)):
        settings = SamplerSettings(kind="mclmc", field_thin=thin)
        assert field_stats_every(settings, stores_fields=True) == every, thin
        assert field_stats_every(settings) == 5  # no field stored

    def run(name, sampler, **kw):
        d = tmp_path / name
        sink = H5TraceSink(d / "traces.h5", d / "fields.h5")
        init = None if kw.get("resume") else _init()
        out = sampler.run(sink, d / "checkpoint", init, progress=False, **kw)
        return out, read_traces(d / "traces.h5"), read_fields(d / "fields.h5")

    sampler = field_sampler
    full, traces, fields = run("full", sampler)
    draws = fields["draws"].astype(np.float64).reshape(-1, D)  # every 5th transition
    assert fields["draws"].shape[:2] == (8, 4)  # ceil(37 / 5) draws of 4 chains
    assert full.field_moments_every == 5 and full.field_moments_draws == draws.shape[0]
    # Float32 states keep float32 moments (issue 14: half the memory); their Welford
    # rounding (~1e-7 relative here) is far below the gap to every transition's moments
    # (~0.2 sd with 32 draws), which this tells apart.
    assert full.field_mean.dtype == full.field_var.dtype == np.float32
    np.testing.assert_allclose(full.field_mean, draws.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(full.field_var, draws.var(axis=0, ddof=1), rtol=1e-5)
    # P(k) of every stored draw (thin = 1: every transition), none skipped.
    x_all = traces["power"][..., 0]
    assert x_all.shape == (37, 4) and np.all(x_all > 0)
    # Killed after 4 chunks (5 transitions into sampling), resumed by a fresh sampler.
    partial, _, _ = run("killed", sampler, max_chunks=4)
    assert not partial.complete and partial.step == 45
    resumed, traces_r, fields_r = run("killed", _field_sampler(), resume=True)
    for name in traces:
        assert traces[name].tobytes() == traces_r[name].tobytes(), name
    assert fields["draws"].tobytes() == fields_r["draws"].tobytes()
    for name in ("field_mean", "field_var"):
        assert getattr(full, name).tobytes() == getattr(resumed, name).tobytes(), name
    assert resumed.field_moments_draws == full.field_moments_draws


def test_one_program_copies_no_tuner_state(tmp_path, field_sampler):
    """mclmc in one program for warm-up and sampling (a small run's default): the tuner's
    per-chain moments and stage-3 buffer are not copied through a conditional on every
    transition. Under a tf.cond on the warm-up count the optimized HLO held 3 copies of
    the buffer (f32[12,4,25]) and 4 of [chains, D] (the moments; 1 is the state's)."""
    import re
    from collections import Counter

    assert field_sampler._chunk is field_sampler._sampling_chunk  # one program
    field_sampler.run(MemorySink(), tmp_path, _init(), progress=False)  # loads its state
    args = (
        [tf.constant(SD), tf.constant(np.float32(2.0))],
        tf.zeros([4], tf.float64),
        tf.zeros([4], tf.float64),
        tf.constant([0, 0]),
        tf.constant(0),
        tf.constant(15),
        tf.constant(40),  # num_burnin
    )
    hlo = field_sampler._chunk.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
    copies = Counter(re.findall(r"= (\w+\[[\d,]*\])\{[^}]*\} copy\(", hlo))
    rows = 12  # stage 3: 0.3 of 40 warm-up transitions
    assert copies[f"f32[{rows},4,{D + 1}]"] == 0, copies
    assert copies[f"f32[4,{D}]"] <= 1, copies


def test_power_and_tracked_modes_read_modes_fn(tmp_path, field_sampler):
    """With ``modes_fn`` the per-draw P(k) and tracked modes are computed from its output
    (here 2x, standing for a model's Fourier modes) on every stored draw, while the field
    draws, their moments, every other trace and the state are those of the run without
    it (the field is made only for the moments and stored draws)."""

    def run(name, sampler):
        sink = MemorySink()
        out = sampler.run(sink, tmp_path / name, _init(), progress=False)
        return out, sink.stacked_traces(), sink.stacked_fields()

    base, traces, fields = run("field", field_sampler)
    got, traces_m, fields_m = run("modes", _field_sampler(modes_fn=lambda x, h: 2.0 * x))
    assert sorted(traces) == sorted(traces_m)
    for name in traces:
        if name == "power":
            np.testing.assert_allclose(traces_m[name], 4.0 * traces[name], rtol=1e-6)
        elif name.startswith("tracked"):
            np.testing.assert_array_equal(traces_m[name], 2.0 * traces[name], err_msg=name)
        else:
            np.testing.assert_array_equal(traces_m[name], traces[name], err_msg=name)
    assert traces["power"].shape == (37, 4, 1) and traces["tracked_real"].shape == (37, 4, 3)
    np.testing.assert_array_equal(fields_m, fields)
    np.testing.assert_array_equal(got.field_mean, base.field_mean)
    np.testing.assert_array_equal(got.field_var, base.field_var)
    for p, q in zip(got.latent_state, base.latent_state, strict=True):
        np.testing.assert_array_equal(p, q)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_running_moments_keep_the_fields_dtype(dtype):
    """The field's running moments accumulate in the field's dtype: float64 fields to
    float64 rounding (as before issue 14), float32 fields in float32 (half the memory)."""
    rng = np.random.default_rng(3)
    draws = (3.0 + rng.standard_normal((60, 4, 5, 6))).astype(dtype)  # [step, chain, ...]
    acc = [tf.constant(a) for a in _zero_welford([(5, 6)], dtype)]
    for step in draws:
        acc = _welford_update(acc, [tf.constant(step)])
    count, mean, m2 = (np.asarray(a) for a in acc)
    flat = draws.astype(np.float64).reshape(-1, 5, 6)
    assert count.dtype == np.float64 and float(count) == flat.shape[0]
    assert mean.dtype == m2.dtype == dtype
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(mean, flat.mean(axis=0), rtol=tol)
    np.testing.assert_allclose(m2 / (count - 1), flat.var(axis=0, ddof=1), rtol=tol)


def test_a_finished_sampler_leaves_no_traced_graph_alive(tmp_path):
    """A target with a custom gradient (as the models' FFTs and packing have): once the
    sampler is gone, so are its traced graphs and what they captured -- the carried
    variables, the model's constants. TensorFlow's registry of custom gradients kept them
    for the life of the process (fieldhmc.ops.gradient_registry)."""
    from tensorflow.python.framework.func_graph import FuncGraph

    @tf.custom_gradient
    def identity(x):
        return tf.identity(x), lambda dy: dy

    def target(x, h):
        return gaussian_target(identity(x), h)

    settings = SamplerSettings(
        kind="hmc", num_chains=2, num_burnin_steps=2, num_results=2, chunk_size=4
    )

    def func_graphs():
        names = ("_lp64_impl", "_bootstrap_impl", "_chunk_impl")
        return {
            id(o): o
            for o in gc.get_objects()
            if isinstance(o, FuncGraph) and o.name.startswith(names)
        }

    before = func_graphs()  # other tests' samplers, alive or not
    sampler = Sampler(target, settings, ["x", "h"], [SD, np.float32(2.0)])
    sampler.run(MemorySink(), tmp_path, _init(chains=2), progress=False)
    graphs = [weakref.ref(g) for i, g in func_graphs().items() if i not in before]
    assert len(graphs) == 3  # lp64, bootstrap, the chunk (one program: a small run)
    del sampler
    gc.collect()
    assert [g().name for g in graphs if g() is not None] == []


# -- the post-warm-up program ---------------------------------------------------------

# One dual-averaged and one microcanonical kind by default (the cheapest to compile).
TUNED_KINDS = [
    "hmc",
    "mams",
    pytest.param("fieldnuts", marks=pytest.mark.slow),
    pytest.param("mclmc", marks=pytest.mark.slow),
]


def _short_sampler(kind: str, field_outputs=None, target=gaussian_target, **kw) -> Sampler:
    settings = SamplerSettings(
        kind=kind,
        num_chains=2,
        num_burnin_steps=20,
        num_results=30,
        num_leapfrog_steps=4,
        max_tree_depth=4,
        chunk_size=10,
        **kw,
    )
    return Sampler(target, settings, ["x", "h"], [SD, np.float32(2.0)], field_outputs)


def _record_tuners(monkeypatch) -> tuple[set, list]:
    """(chunk programs traced, the program each tuner call was traced into): the
    dual-averaging update (TFP's per-part step) and the microcanonical stages."""
    from tensorflow_probability.python.mcmc import dual_averaging_step_size_adaptation as da

    from fieldhmc.samplers import mclmc

    program, traced, tuners = [], set(), []

    def counting(original):
        def counted(self, *a, **k):
            tuners.append(program[-1])
            return original(self, *a, **k)

        return counted

    def marking(original, name):
        def marked(self, *a):
            program.append(name)
            traced.add(name)
            try:
                return original(self, *a)
            finally:
                program.pop()

        return marked

    for cls, name in (
        (da.DualAveragingStepSizeAdaptation, "_one_step_part"),
        (mclmc.MicrocanonicalLangevin, "_tune"),
        (mclmc.MetropolisAdjustedMicrocanonical, "_tune"),
    ):
        monkeypatch.setattr(cls, name, counting(getattr(cls, name)))
    for name in ("_chunk_impl", "_chunk_impl_sampling", "_chunk_impl_both"):
        monkeypatch.setattr(Sampler, name, marking(getattr(Sampler, name), name))
    return traced, tuners


def test_sampling_seconds_leave_out_the_chunk_that_compiles(tmp_path):
    """With a post-warm-up program of its own, the first sampling chunk a Sampler runs
    compiles it: its time and gradients are not in sampling_seconds /
    _batched_gradients, which would otherwise report seconds of compile as ms per
    gradient. A second run of the same Sampler times every chunk, and so does a first
    run with one program (compiled in warm-up)."""
    sampler = _short_sampler("hmc", separate_sampling_program=True)  # 30 draws, chunks of 10
    first = sampler.run(MemorySink(), tmp_path / "a", _init(chains=2), progress=False)
    assert first.sampling_batched_gradients == 20 * 4 and first.sampling_seconds > 0
    second = sampler.run(MemorySink(), tmp_path / "b", _init(chains=2), progress=False)
    assert second.sampling_batched_gradients == 30 * 4  # 4 leapfrog steps each
    one = _short_sampler("hmc", separate_sampling_program=False)
    first = one.run(MemorySink(), tmp_path / "c", _init(chains=2), progress=False)
    assert first.sampling_batched_gradients == 30 * 4


@pytest.mark.parametrize("kind", TUNED_KINDS)
def test_post_warmup_chunk_has_no_tuner_and_draws_the_same(tmp_path, monkeypatch, kind):
    """With a post-warm-up program of its own, the chunks after warm-up run without the
    tuner's code (traced into the warm-up chunk only) and make the same transitions as
    one program for both phases, whose kernel keeps its (finished) tuner after warm-up:
    every trace, the stored fields, their moments and the final state bit-identical."""
    outputs = FieldOutputs(
        field_fn=lambda x, h: x, power_fn=lambda f: tf.reduce_mean(f**2, -1, keepdims=True)
    )

    def run(directory, separate):
        sampler = _short_sampler(kind, outputs, field_thin=3, separate_sampling_program=separate)
        sink = MemorySink()
        summary = sampler.run(sink, directory, _init(chains=2), progress=False)
        return sink, summary

    with monkeypatch.context() as m:
        traced, tuners = _record_tuners(m)
        sink, summary = run(tmp_path / "frozen", separate=True)
    assert traced == {"_chunk_impl", "_chunk_impl_sampling"}
    assert "_chunk_impl" in tuners  # the counter sees the tuner where it is
    assert "_chunk_impl_sampling" not in tuners
    with monkeypatch.context() as m:
        traced, tuners = _record_tuners(m)
        one_sink, one_summary = run(tmp_path / "one", separate=False)
    assert traced == {"_chunk_impl_both"} and "_chunk_impl_both" in tuners
    _assert_same_bytes(sink, summary, one_sink, one_summary)
    assert summary.tuned == one_summary.tuned


def _assert_same_bytes(sink, summary, other_sink, other_summary):
    """Two runs' traces, stored fields, final state and field moments are equal."""
    a, b = sink.stacked_traces(), other_sink.stacked_traces()
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    np.testing.assert_array_equal(sink.stacked_fields(), other_sink.stacked_fields())
    for p, q in zip(summary.latent_state, other_summary.latent_state, strict=True):
        np.testing.assert_array_equal(p, q)
    np.testing.assert_array_equal(summary.field_mean, other_summary.field_mean)
    np.testing.assert_array_equal(summary.field_var, other_summary.field_var)


def test_concrete_call_follows_the_arguments_shapes():
    """The chunk's dispatcher calls one concrete function per argument shapes and
    dtypes, and the polymorphic function for Python values."""
    call = _ConcreteCall(tf.function(lambda x, ys: x * tf.add_n(ys), autograph=False))
    np.testing.assert_array_equal(call(tf.fill([2], 3.0), [tf.fill([2], 2.0)]), [6.0, 6.0])
    first = call._concrete
    np.testing.assert_array_equal(call(tf.fill([2], 1.0), [tf.fill([2], 5.0)]), [5.0, 5.0])
    assert call._concrete is first and call.experimental_get_tracing_count() == 1
    np.testing.assert_array_equal(call(tf.ones([3]), [tf.ones([3])]), np.ones(3))
    assert call._concrete is not first and call.experimental_get_tracing_count() == 2
    np.testing.assert_array_equal(
        call(tf.ones([2], tf.float64), [tf.ones([2], tf.float64)]), [1, 1]
    )
    assert call.experimental_get_tracing_count() == 3
    np.testing.assert_array_equal(call(tf.ones([2]), [2.0]), [2.0, 2.0])  # a Python value


def test_separate_sampling_program_rule():
    """A post-warm-up program of its own when post-warm-up transitions x state elements
    (all chains) reach 2**30; one program for smaller runs; the setting overrides."""
    from fieldhmc.samplers.driver import separate_sampling_program_for

    def rule(results, cells, chains=4, burnin=100):
        s = SamplerSettings(num_results=results, num_chains=chains, num_burnin_steps=burnin)
        return separate_sampling_program_for(s, cells)

    assert rule(1024, 64**3) and not rule(1000, 64**3) and rule(200, 128**3)
    assert not rule(10_000, 16**3) and not rule(40, 8**3)
    assert rule(40, 8**3, burnin=0)  # no warm-up: one program either way
    sampler = _short_sampler("hmc")
    assert sampler._chunk is sampler._sampling_chunk  # a small run: one program
    sampler = _short_sampler("hmc", separate_sampling_program=True)
    assert sampler._chunk is not sampler._sampling_chunk


def test_auto_chunk_size():
    """``chunk_size`` auto: 2**24 / (gradients per transition x chains x coordinates)
    transitions, within [50, 1000]; 50 where the kind's gradients per transition are
    tuned. Expected values worked out by hand."""
    from fieldhmc.samplers.driver import auto_chunk_size

    def size(kind, cells, results=1000, burnin=200, **options):
        s = SamplerSettings(
            kind=kind, num_chains=4, num_results=results, num_burnin_steps=burnin, **options
        )
        return auto_chunk_size(s, cells)

    # mclmc, minimal norm (2 gradients): 2**24 / (2 * 4 * 16**3) = 512; 32³: 64; 64³: 8
    assert (size("mclmc", 16**3), size("mclmc", 32**3), size("mclmc", 64**3)) == (512, 64, 50)
    assert size("mclmc", 16**3, integrator="leapfrog") == 1000  # 1024, capped
    # not capped by the run's length: an extended run keeps its chunks
    assert size("mclmc", 8**3, results=20, burnin=10) == size("mclmc", 8**3) == 1000
    # jittered hmc, 24 steps: (24 + 1) / 2 gradients on average -> 81.92 at 16³
    assert size("hmc", 16**3, num_leapfrog_steps=24, jitter_leapfrog=True) == 81
    assert size("hmc", 32**3, num_leapfrog_steps=24, jitter_leapfrog=True) == 50
    assert size("hmc", 8**3, num_leapfrog_steps=2) == 1000  # 2**24 / 4096, capped
    for kind in ("fieldnuts", "mams", "nuts"):  # gradients per transition tuned or varying
        assert size(kind, 8**3) == 50


def test_field_outputs_are_not_hoisted_out_of_their_loops(tmp_path):
    """The field outputs' work sits in loops of zero or one trips (``_loop_if``); XLA's
    loop-invariant code motion hoists what such a loop computes from its closure into
    the enclosing body, where it runs on every transition. The field reads the state
    through ``pinned_to``: in the compiled chunk (one program for both phases) the
    field's transform is inside a nested loop, and none is in the transition loop's body
    (the target has no transform of its own). Fails with the state read from the
    closure."""
    from tests.samplers.hlo_nesting import while_depths

    def field(x, h):  # one irfft per field, none in the target
        return tf.signal.irfft(tf.complex(x, tf.zeros_like(x)))

    outputs = FieldOutputs(
        field_fn=field, power_fn=lambda f: tf.reduce_mean(f**2, -1, keepdims=True)
    )
    sampler = _short_sampler("mclmc", outputs, thin=2, field_thin=3)
    assert sampler._chunk is sampler._sampling_chunk  # one program for both phases

    class Recorded(Exception):
        pass

    def record(*args):  # the chunk's arguments; compiled once, below, for its HLO
        raise Recorded(args)

    sampler._chunk = record
    with pytest.raises(Recorded) as call:
        sampler.run(MemorySink(), tmp_path, _init(chains=2), progress=False)
    hlo = sampler.runner.chunk.experimental_get_compiler_ir(*call.value.args[0])(
        stage="optimized_hlo"
    )
    depths = while_depths(hlo, r"fft_type=IRFFT")
    assert depths and min(depths) >= 2, depths  # 1: in the transition loop's body
