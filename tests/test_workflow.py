"""End to end through the CLI: every shipped config on a shrunken grid, resume, overwrite."""

from __future__ import annotations

import json
import math
import shutil
import weakref
from pathlib import Path

import h5py
import numpy as np
import pytest

from fieldhmc import cli, io, workflow
from fieldhmc.config import load_config
from fieldhmc.samplers.driver import Sampler
from fieldhmc.samplers.kinds import MICROCANONICAL_KINDS

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
SHRINK = [
    "grid.shape=[8,8,8]",
    "sampler.num_burnin_steps=20",
    "sampler.num_results=24",
    "sampler.chunk_size=12",
    "sampler.num_chains=2",
    "outputs.field_thin=2",
]


def _run(config: Path, out: Path, *extra: str) -> int:
    argv = ["-q", "run", str(config), "--out", str(out)]
    for item in [*SHRINK, *extra]:
        argv += ["--set", item]
    return cli.main(argv)


#: Filled by ``quick_run``: for each model ``run`` built, whether it was still alive
#: when ``diagnose`` started, and for each sampler, whether alive at the export.
QUICK_RUN_MODELS_ALIVE: list[bool] = []
QUICK_RUN_SAMPLERS_ALIVE: list[bool] = []
#: Filled by ``quick_run``: the large non-splat constants embedded in the compiled chunk.
QUICK_RUN_EMBEDDED: list[tuple[str, list[int]]] = []
_VALUE_FIELDS = ("float_val", "double_val", "int_val", "int64_val", "bool_val", "scomplex_val")


def _embedded_constants(fn, min_size: int) -> list[tuple[str, list[int]]]:
    """(name, shape) of the graph constants of ``fn``'s traces with ``>= min_size``
    elements that are not splats (XLA lowers a splat to a broadcast of one value)."""
    found = []
    for concrete in fn._list_all_concrete_functions():  # private, but the only listing
        graph = concrete.graph.as_graph_def()
        nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
        for node in nodes:
            tensor = node.attr["value"].tensor
            shape = [d.size for d in tensor.tensor_shape.dim]
            splat = not tensor.tensor_content and all(
                len(getattr(tensor, name)) <= 2 for name in _VALUE_FIELDS
            )
            if node.op == "Const" and math.prod(shape) >= min_size and not splat:
                found.append((node.name, shape))
    return found


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    """One shrunken quickstart run shared by the tests that only read it (or copy it)."""
    out = tmp_path_factory.mktemp("quick") / "run"
    built, build, diagnose = [], workflow.build_model, workflow.diagnose
    samplers, build_sampler, export = [], workflow.build, workflow.export

    def recording_build_sampler(*args, **kwargs):
        built = build_sampler(*args, **kwargs)
        samplers.append(weakref.ref(built.sampler))
        return built

    def checking_export(*args, **kwargs):
        QUICK_RUN_SAMPLERS_ALIVE.extend(ref() is not None for ref in samplers)
        return export(*args, **kwargs)

    def recording_build(*args, **kwargs):
        model = build(*args, **kwargs)
        built.append(weakref.ref(model))
        return model

    def checking_diagnose(*args, **kwargs):
        if not QUICK_RUN_MODELS_ALIVE:
            QUICK_RUN_MODELS_ALIVE.extend(ref() is not None for ref in built)
        return diagnose(*args, **kwargs)

    sampler_run = Sampler.run

    def scanning_run(self, *args, **kwargs):
        out = sampler_run(self, *args, **kwargs)
        for chunk in (self._chunk, self._sampling_chunk):  # warm-up and post-warm-up
            QUICK_RUN_EMBEDDED.extend(_embedded_constants(chunk, min_size=8**3 // 4))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Sampler, "run", scanning_run)
        mp.setattr(workflow, "build_model", recording_build)
        mp.setattr(workflow, "diagnose", checking_diagnose)
        mp.setattr(workflow, "build", recording_build_sampler)
        mp.setattr(workflow, "export", checking_export)
        assert _run(ROOT / "configs" / "quickstart.yaml", out) == 0
    return out


def test_run_releases_the_model_before_diagnose(quick_run):
    # diagnose and plot read everything back from the run directory; the model's
    # constants (~12 fields at 256³, with the data and truth) were held through them.
    assert QUICK_RUN_MODELS_ALIVE == [False]
    # the sampler's carried state (state, gradient, float64 field moments: 12 fields at
    # 256³ x 4 chains) and compiled chunk were held through the export
    assert QUICK_RUN_SAMPLERS_ALIVE == [False]


def test_compiled_chunk_embeds_no_field_sized_constants(quick_run):
    # A tensor made while the chunk is traced (the field's sqrt(s_k) and mode signs, the
    # P(k) bins' segment ids) is embedded in the XLA program and stays resident about 7
    # times over (64 MiB -> 444 MiB measured): 13-16 fields at 256³. Made eagerly, they
    # are captured as inputs.
    assert QUICK_RUN_EMBEDDED == []


# galaxy_clustering_64 is galaxy_clustering_16's model on a larger grid: at the test's 8³
# the two runs are the same program (~50 s of XLA compile each), so the 64 one is slow.
_SLOW_CONFIGS = ("galaxy_clustering_64",)


@pytest.mark.parametrize(
    "config",
    [pytest.param(c, marks=pytest.mark.slow) if c.stem in _SLOW_CONFIGS else c for c in CONFIGS],
    ids=[c.stem for c in CONFIGS],
)
def test_shipped_config_runs_end_to_end(config, tmp_path, request):
    import arviz as az

    if config.stem == "quickstart":  # the shared run is exactly this one
        out = request.getfixturevalue("quick_run")
    else:
        out = tmp_path / "run"
        assert _run(config, out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_chains"] == 2 and summary["num_draws"] == 24
    for name in ("traces", "power_spectrum", "autocorrelation"):
        assert (out / "plots" / f"{name}.png").stat().st_size > 5000
    idata = az.from_netcdf(out / "samples.nc")
    stats = set(idata.sample_stats.data_vars)
    assert {"lp", "acceptance_rate", "diverging", "step_size", "n_steps"} <= stats
    kind = load_config(config).sampler.kind
    # HMC-family kernels record the Hamiltonian; microcanonical ones its error per step
    assert ("energy_error" if kind in MICROCANONICAL_KINDS else "energy") in stats, kind
    assert idata.posterior.sizes["chain"] == 2 and idata.posterior.sizes["draw"] == 24
    assert "tensorflow" in (out / "config.yaml").read_text()  # versions recorded
    with h5py.File(out / "fields.h5", "r") as f:
        assert f["mean"].shape == (8, 8, 8)
        assert np.all(np.isfinite(f["var"][()]))


def test_samples_nc_opens_without_fieldhmc(quick_run, tmp_path):
    """az.from_netcdf in a fresh interpreter that cannot import fieldhmc."""
    import subprocess
    import sys

    out = quick_run
    code = (
        "import sys; sys.modules['fieldhmc'] = None\n"
        "import arviz as az\n"
        f"d = az.from_netcdf({str(out / 'samples.nc')!r})\n"
        "print(sorted(d.sample_stats.data_vars))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "diverging" in res.stdout


def test_overwrite_protection_keeps_results(quick_run, tmp_path, capsys):
    out = tmp_path / "run"
    quick = ROOT / "configs" / "quickstart.yaml"
    shutil.copytree(quick_run, out)
    before = (out / "summary.json").read_bytes()
    (out / "my_notes.txt").write_text("keep me")
    capsys.readouterr()
    assert _run(quick, out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not empty" in err[0] and "--overwrite" in err[0]
    assert (out / "summary.json").read_bytes() == before


def test_overwrite_never_deletes_user_files(tmp_path):
    out = tmp_path / "run"
    quick = ROOT / "configs" / "quickstart.yaml"
    out.mkdir()
    (out / "my_notes.txt").write_text("keep me")
    argv = ["-q", "run", str(quick), "--out", str(out), "--overwrite"]
    for item in SHRINK:
        argv += ["--set", item]
    assert cli.main(argv) == 0
    assert (out / "my_notes.txt").read_text() == "keep me"
    assert (out / "summary.json").exists()


def test_resume_after_kill_matches_uninterrupted(quick_run, tmp_path, monkeypatch):
    from fieldhmc.samplers import Sampler

    quick = ROOT / "configs" / "quickstart.yaml"
    full = quick_run

    real_run = Sampler.run

    def killed_run(self, *args, **kwargs):
        kwargs["max_chunks"] = 3
        real_run(self, *args, **kwargs)
        raise KeyboardInterrupt  # the process dies after its third checkpoint

    monkeypatch.setattr(Sampler, "run", killed_run)
    killed = tmp_path / "killed"
    assert _run(quick, killed) == 130  # the CLI reports the interrupt, exit 130
    monkeypatch.setattr(Sampler, "run", real_run)
    assert not (killed / "summary.json").exists()
    assert cli.main(["-q", "resume", str(killed)]) == 0
    with h5py.File(full / "traces.h5") as a, h5py.File(killed / "traces.h5") as b:
        assert set(a) == set(b)
        for name in a:
            assert a[name][()].tobytes() == b[name][()].tobytes(), name


def test_resume_extends_a_finished_run(quick_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(quick_run, out)
    assert cli.main(["-q", "resume", str(out), "--num-results", "36"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_draws"] == 36


def test_simulate_diagnose_and_plot_commands(quick_run, tmp_path):
    quick = ROOT / "configs" / "quickstart.yaml"
    sim = tmp_path / "sim"
    argv = ["-q", "simulate", str(quick), "--out", str(sim)]
    for item in SHRINK:
        argv += ["--set", item]
    assert cli.main(argv) == 0
    assert np.load(sim / "data" / "truth.npy").shape == (8, 8, 8)
    assert np.load(sim / "data" / "data.npy").shape == (8, 8, 8)

    out = tmp_path / "run"
    shutil.copytree(quick_run, out)
    (out / "summary.json").unlink()
    for png in (out / "plots").glob("*.png"):
        png.unlink()
    assert cli.main(["-q", "diagnose", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["num_draws"] == 24
    assert cli.main(["-q", "plot", str(out)]) == 0
    assert len(list((out / "plots").glob("*.png"))) >= 4
    assert "num_results: 24" in (out / "config.yaml").read_text()  # the --set override


def test_loading_data_from_file_with_tensorboard_scalars(tmp_path):
    """Data from an .npz file; the same run (one compile for two features) also writes
    TensorBoard scalars."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal((8, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "obs.npz", data=data)
    out = tmp_path / "run"
    extra = ["data.source=file", f"data.path={tmp_path / 'obs.npz'}", "outputs.tensorboard=true"]
    assert _run(ROOT / "configs" / "quickstart.yaml", out, *extra) == 0
    np.testing.assert_array_equal(np.load(out / "data" / "data.npy"), data)
    assert not (out / "data" / "truth.npy").exists()
    events = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100


def test_nan_in_data_file_is_a_one_line_error(tmp_path, capsys):
    data = np.zeros((8, 8, 8), np.float32)
    data[1, 2, 3] = np.nan
    np.save(tmp_path / "obs.npy", data)
    out = tmp_path / "run"
    code = _run(
        ROOT / "configs" / "quickstart.yaml",
        out,
        "data.source=file",
        f"data.path={tmp_path / 'obs.npy'}",
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nan" in err[0].lower()
    assert not out.exists()


@pytest.mark.parametrize("kind", ["mclmc", pytest.param("mams", marks=pytest.mark.slow)])
def test_microcanonical_run_states_what_it_is(kind, tmp_path):
    """summary.json says whether the kernel is adjusted, its bias tolerance, the tuned
    values and their cost; the health check reports Var[dE]/d, not acceptance/E-BFMI."""
    out = tmp_path / "run"
    extra = [f"sampler.kind={kind}", "sampler.num_leapfrog_steps=null"]
    extra += ["sampler.jitter_leapfrog=null", "sampler.target_accept_prob=null"]
    extra += ["sampler.num_burnin_steps=30"]
    assert _run(ROOT / "configs" / "quickstart.yaml", out, *extra) == 0
    summary = json.loads((out / "summary.json").read_text())
    meta = summary["metadata"]
    assert meta["sampler"] == kind and meta["adjusted"] is (kind == "mams")
    assert meta["bias_tolerance"] == (5e-4 if kind == "mclmc" else None)
    tuned = meta["tuning"]["tuned"]
    assert tuned["dimension"] == 512 and tuned["step_size"] > 0 and tuned["trajectory_length"] > 0
    assert meta["tuning"]["warmup_gradient_evaluations"] > 0
    sampler = summary["sampler"]
    assert sampler["ebfmi"] is None
    assert (sampler["acceptance"] is None) == (kind == "mclmc")
    energy = sampler["energy_error_var_per_dim"]
    assert len(energy["per_chain"]) == 2 and all(v >= 0 for v in energy["per_chain"])
    report = (out / "report.txt").read_text()
    assert ("UNADJUSTED" in report) == (kind == "mclmc")
    assert "Var[dE]/d" in report


def test_run_with_nothing_in_the_posterior_group(tmp_path):
    """outputs.tracked_modes 0 and no sampled hyperparameters: ArviZ writes samples.nc
    without a posterior group, and diagnose / plot read it as empty (they raised
    AttributeError: 'InferenceData' object has no attribute 'posterior'). Every sampler
    kind and thin hit this; mclmc with thin 3 is the reported run."""
    out = tmp_path / "run"
    extra = ["sampler.kind=mclmc", "sampler.thin=3", "outputs.tracked_modes=0"]
    extra += ["sampler.num_leapfrog_steps=null", "sampler.jitter_leapfrog=null"]
    extra += ["sampler.target_accept_prob=null"]
    assert _run(ROOT / "configs" / "quickstart.yaml", out, *extra) == 0
    posterior, stats, _ = io.read_inference_data(out / "samples.nc")
    assert posterior == {}
    assert stats["lp"].shape == (2, 8)  # 24 results, every 3rd kept
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metadata"]["sampler"] == "mclmc"
    assert (out / "report.txt").exists() and (out / "plots" / "traces.png").exists()


@pytest.mark.parametrize(
    ("config", "packed"), [("quickstart.yaml", True), ("hierarchical_64.yaml", False)]
)
def test_field_outputs_read_packed_modes_when_the_map_is_fixed(config, packed):
    """The sampler's per-draw P(k) and tracked modes: from the packed modes (the field
    latent times a fixed scale) when nothing but the field is sampled, else from the
    complex modes; either way the numbers of the field's rfft3d (8³)."""
    import tensorflow as tf

    from fieldhmc import models

    c = load_config(ROOT / "configs" / config, ["grid.shape=[8,8,8]"])
    model = workflow.build_model(c)
    draw = model.sample(seed=[3, 4], sample_shape=2)
    fo = workflow._field_outputs(c, model, model.target_log_prob_fn(draw["data"][0]))
    latents = [draw[n] for n in model.latent_names]
    spectral = fo.modes_fn(*latents)
    assert spectral.dtype.is_complex is not packed
    field = fo.field_fn(*latents)
    modes = tf.signal.rfft3d(field).numpy()
    expected = models.measure_power(field, model.grid).power.numpy()
    for got in (spectral, fo.spectral_of_field(field)):
        np.testing.assert_allclose(fo.power_fn(got).numpy(), expected, rtol=2e-5)
        idx = workflow.tracked_mode_indices(model.grid, c.outputs.tracked_modes)
        tracked = modes[:, idx[:, 0], idx[:, 1], idx[:, 2]]
        np.testing.assert_allclose(
            fo.tracked_fn(got).numpy(), tracked, rtol=0, atol=2e-5 * np.abs(tracked).max()
        )


HYPER = ("log_amplitude", "index")


@pytest.mark.parametrize(
    "overrides",
    [[], ["sampler.preconditioner=diagonal", "sampler.kind=fieldnuts"]],
    ids=["posterior", "diagonal"],
)
def test_posterior_metric_block_is_the_datas_laplace_fit_and_follows_repin(overrides):
    """configs/hierarchical_64.yaml at 8³: the posterior metric's scales for log A and n
    are the marginal widths of their Laplace fit at the data's posterior mode, the
    sampler's dense factor its correlation; a re-pinned (SBC) sampler gets the new
    data's fit without a new build. The windowed diagonal metric starts from the same."""
    config = load_config(
        ROOT / "configs" / "hierarchical_64.yaml", ["grid.shape=[8,8,8]", *overrides]
    )
    model = workflow.build_model(config)
    from fieldhmc.samplers import stateless_seed

    data = [np.asarray(model.sample(seed=stateless_seed(s))["data"]) for s in (5, 6)]
    built = workflow.build(config, data[0], model=model, repinnable=True)
    assert built.sampler.settings.adapt_diagonal is bool(overrides)

    def expected(d):
        names, _, cov = model.hyper_posterior_laplace(d)
        sd = np.sqrt(np.diag(cov))
        return sd, np.linalg.cholesky(cov / np.outer(sd, sd))

    for i, d in enumerate(data):
        if i:
            built.repin(d)
        sd, factor = expected(d)
        sampler = built.sampler
        hyper = [float(sampler.initial_scales[model.latent_names.index(n)]) for n in HYPER]
        np.testing.assert_allclose(hyper, sd, rtol=1e-6)
        np.testing.assert_allclose(sampler._initial_dense_factor, factor, rtol=1e-12)
    assert not np.allclose(expected(data[0])[0], expected(data[1])[0], rtol=1e-3)


def test_posterior_metric_block_of_a_forward_model_is_the_fiducial_fisher():
    """Where z = 0 is only the surrogate's mean (a forward model), no Laplace fit."""
    config = load_config(
        ROOT / "configs" / "galaxy_clustering_16.yaml",
        ["grid.shape=[8,8,8]", "sampler.preconditioner=posterior"],
    )
    model = workflow.build_model(config)
    data = np.asarray(workflow.obtain_data(config, model).data)
    names, cov = workflow._hyper_block(config, model, data)
    expected_names, expected = model.hyper_posterior_covariance()
    assert names == expected_names == ("Omega_m", "sigma8")
    np.testing.assert_array_equal(cov, expected)
    # the shipped windowed metric starts from the prior widths there (no fit to start from)
    shipped = load_config(ROOT / "configs" / "galaxy_clustering_16.yaml", ["grid.shape=[8,8,8]"])
    assert shipped.sampler.preconditioner == "diagonal"
    assert workflow._hyper_block(shipped, model, data) is None


@pytest.mark.parametrize(
    ("sampler", "cells", "expected"),
    [
        ({"kind": "mclmc"}, 16, 512),  # auto: 2**24 / (2 gradients x 4 chains x 16³)
        ({"kind": "mclmc"}, 32, 64),
        ({"kind": "mclmc", "chunk_size": 50}, 16, 50),  # a number is used as given
        ({"kind": "mclmc", "chunk_size": 7}, 32, 7),
        ({"kind": "fieldnuts"}, 16, 50),  # gradients per transition tuned: 50
        ({"kind": "hmc", "num_leapfrog_steps": 24, "jitter_leapfrog": True}, 16, 81),
        ({"kind": "hmc", "num_leapfrog_steps": 24, "jitter_leapfrog": True}, 32, 50),
    ],
)
def test_settings_resolve_chunk_size(tmp_path, sampler, cells, expected):
    """The config's ``chunk_size`` auto (the default) becomes the driver's chunk length
    for the kind and grid (:func:`~fieldhmc.samplers.driver.auto_chunk_size`); a number
    is used as given."""
    from fieldhmc.config import config_from_dict

    raw = {"grid": {"shape": [cells] * 3}, "sampler": {"num_results": 1000, **sampler}}
    assert workflow._settings(config_from_dict(raw, tmp_path)).chunk_size == expected
