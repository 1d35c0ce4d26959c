"""Tests of fieldhmc.config: shipped configs, defaults, overrides, round trip, errors."""

import copy
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fieldhmc.config import (
    Config,
    ConfigError,
    config_from_dict,
    dump_yaml,
    load_config,
    read_yaml,
    schema_text,
    write_yaml,
)

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = sorted(CONFIGS_DIR.glob("*.yaml"))
GRID = (8, 6, 5)  # small, non-cubic, odd last axis
DELETE = object()


def _base() -> dict[str, Any]:
    """A small valid raw config; the malformed cases below each break one thing."""
    return {
        "grid": {"shape": list(GRID), "box_size": 50.0},
        "model": {"likelihood": {"kind": "gaussian", "sigma": 1.0}},
        "sampler": {"kind": "hmc", "num_chains": 2},
        "outputs": {"directory": "runs/test"},
    }


def _assign(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node = raw
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    if value is DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value


def _with(**changes: Any) -> dict[str, Any]:
    """``_base()`` with ``a__b__c=value`` assignments applied (``__`` for dots)."""
    raw = _base()
    for key, value in changes.items():
        _assign(raw, key.replace("__", "."), value)
    return raw


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """Directory holding the input files referenced (by relative name) in the cases."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "sigma.npy", np.full(GRID, 0.5))
    np.save(tmp_path / "mask.npy", (rng.uniform(size=GRID) > 0.3).astype(np.float32))
    np.save(tmp_path / "data.npy", rng.normal(size=GRID))
    np.savez(tmp_path / "data.npz", field=rng.normal(size=GRID))
    np.save(tmp_path / "wrong_shape.npy", np.ones((4, 4, 4)))
    with_nan = np.ones(GRID)
    with_nan[0, 0, 0] = np.nan
    np.save(tmp_path / "nan.npy", with_nan)
    with_inf = np.ones(GRID)
    with_inf[1, 1, 1] = np.inf
    np.save(tmp_path / "inf.npy", with_inf)
    negative = np.ones(GRID)
    negative[2, 2, 2] = -1.0
    np.save(tmp_path / "negative.npy", negative)
    np.save(tmp_path / "zeros.npy", np.zeros(GRID))
    np.save(tmp_path / "above_one.npy", np.full(GRID, 1.5))
    np.save(tmp_path / "complex.npy", np.ones(GRID, dtype=np.complex64))
    (tmp_path / "not_npy.txt").write_text("1 2\n")
    k = np.geomspace(0.01, 2.0, 20)
    np.savetxt(tmp_path / "pk.txt", np.column_stack([k, 100.0 * k**-1.5]))
    np.savetxt(tmp_path / "pk_3col.txt", np.column_stack([k, k, k]))
    np.savetxt(tmp_path / "pk_decreasing.txt", np.column_stack([k[::-1], k]))
    return tmp_path


# ---------------------------------------------------------------------------------------
# Shipped configs and defaults
# ---------------------------------------------------------------------------------------


def test_expected_configs_are_shipped() -> None:
    names = {path.name for path in SHIPPED}
    assert {
        "quickstart.yaml",
        "gaussian_64.yaml",
        "masked_64.yaml",
        "hierarchical_64.yaml",
        "lognormal_poisson_64.yaml",
    } <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_shipped_config_validates_and_round_trips(path: Path) -> None:
    config = load_config(path)
    assert config_from_dict(config.to_dict(), Path("/nonexistent")) == config
    assert config.outputs.directory.is_absolute()


def test_quickstart_is_small() -> None:
    config = load_config(CONFIGS_DIR / "quickstart.yaml")
    assert config.grid.shape == (32, 32, 32)
    assert config.grid.box_size == (100.0, 100.0, 100.0)
    assert config.sampler.kind == "hmc"
    assert config.sampler.preconditioner == "posterior"
    assert config.sampler.num_chains == 4
    # Cost in gradient evaluations per chain: iterations x the mean jittered length
    # (L + 1) / 2. 750 x 12.5 on 32³ x 4 chains run in ~40 s on 2 quiet cores.
    s = config.sampler
    assert s.jitter_leapfrog
    assert (s.num_burnin_steps + s.num_results) * (s.num_leapfrog_steps + 1) / 2 <= 10_000
    assert config.outputs.directory.parts[-2:] == ("runs", "quickstart")


def test_shipped_configs_cover_the_models() -> None:
    masked = load_config(CONFIGS_DIR / "masked_64.yaml")
    assert masked.model.likelihood.kind == "masked_gaussian"
    assert masked.model.likelihood.mask is not None
    assert masked.model.likelihood.mask.generate is not None
    assert masked.model.likelihood.mask.generate.kind == "slab"
    assert masked.model.likelihood.mask.generate.fraction == pytest.approx(0.2)
    hierarchical = load_config(CONFIGS_DIR / "hierarchical_64.yaml")
    assert hierarchical.model.hyperparameters.log_amplitude.sample
    assert hierarchical.model.hyperparameters.index.sample
    poisson = load_config(CONFIGS_DIR / "lognormal_poisson_64.yaml")
    assert poisson.model.likelihood.kind == "lognormal_poisson"
    assert poisson.model.likelihood.sigma is None


def test_defaults() -> None:
    config = config_from_dict({}, ".")
    assert config == Config()
    assert config.grid.shape == (32, 32, 32)
    assert config.grid.box_size == (100.0, 100.0, 100.0)
    assert config.model.parametrisation == "noncentred"
    assert config.model.power.kind == "power_law"
    assert config.model.power.amplitude == 1000.0
    assert config.model.power.index == -1.5
    assert config.model.power.k_pivot == 0.1
    assert config.model.power.k_turnover is None  # only for kind=turnover
    hyper = config.model.hyperparameters
    assert not hyper.is_any_sampled
    assert hyper.log_amplitude.prior_loc == pytest.approx(math.log(1000.0))
    assert hyper.log_amplitude.prior_scale == 1.0
    assert hyper.index.prior_loc == -1.5
    assert hyper.index.prior_scale == 0.5
    likelihood = config.model.likelihood
    assert (likelihood.kind, likelihood.sigma, likelihood.sigma_map) == ("gaussian", 1.0, None)
    assert likelihood.mask is None and likelihood.nbar is None
    assert (config.data.source, config.data.seed, config.data.path) == ("simulate", 42, None)
    sampler = config.sampler
    assert sampler.kind == "hmc" and sampler.num_chains == 4
    assert (sampler.num_burnin_steps, sampler.num_results) == (200, 500)
    assert (sampler.num_leapfrog_steps, sampler.jitter_leapfrog) == (16, False)
    # options of other kinds are not part of the hmc section
    assert not hasattr(sampler, "max_tree_depth") and not hasattr(sampler, "step_size_jitter")
    assert sampler.target_accept_prob == 0.65
    assert (sampler.step_size, sampler.preconditioner, sampler.init) == (0.1, "posterior", "prior")
    assert (sampler.init_jitter, sampler.seed, sampler.thin) == (0.0, 0, 1)
    assert sampler.chunk_size == "auto"
    assert config.outputs.directory == Path.cwd() / "runs" / "default"
    assert config.outputs.store_fields is True
    assert (config.outputs.field_thin, config.outputs.tracked_modes) == (10, 8)
    assert config.precision == "float32"


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("hmc", 0.65), ("chees", 0.65), ("snaper", 0.65), ("nuts", 0.8), ("fieldnuts", 0.8)],
)
def test_kind_dependent_defaults(kind: str, expected: float) -> None:
    sampler = config_from_dict({"sampler": {"kind": kind}}, ".").sampler
    assert sampler.target_accept_prob == expected
    assert hasattr(sampler, "num_leapfrog_steps") == (kind == "hmc")
    assert (getattr(sampler, "max_tree_depth", None) == 10) == (kind in ("nuts", "fieldnuts"))
    assert (getattr(sampler, "step_size_jitter", None) == 0.0) == (kind == "fieldnuts")


@pytest.mark.parametrize("kind", ["mclmc", "mams"])
def test_microcanonical_kinds(kind: str) -> None:
    sampler = config_from_dict({"sampler": {"kind": kind}}, ".").sampler
    assert sampler.trajectory_length == 1.0 and sampler.integrator == "minimal_norm"
    assert getattr(sampler, "target_accept_prob", None) == (None if kind == "mclmc" else 0.9)
    assert getattr(sampler, "desired_energy_var", None) == (5e-4 if kind == "mclmc" else None)
    assert not hasattr(sampler, "num_leapfrog_steps") and not hasattr(sampler, "max_tree_depth")
    with pytest.raises(ConfigError, match="sampler.preconditioner: diagonal"):
        config_from_dict({"sampler": {"kind": kind, "preconditioner": "diagonal"}}, ".")
    with pytest.raises(ConfigError, match="sampler.integrator"):
        config_from_dict({"sampler": {"kind": kind, "integrator": "yoshida"}}, ".")
    other = {"desired_energy_var": 1e-3} if kind == "mams" else {"target_accept_prob": 0.9}
    with pytest.raises(ConfigError, match=f"sampler.{next(iter(other))}: only used when"):
        config_from_dict({"sampler": {"kind": kind, **other}}, ".")
    with pytest.raises(ConfigError, match="sampler.trajectory_length: only used when"):
        config_from_dict({"sampler": {"kind": "hmc", "trajectory_length": 2.0}}, ".")


def test_mams_warmup_stop_option() -> None:
    """mams ends warm-up on converged estimates by default; fixed keeps the count; any
    other value, or the option on another kind, is a config error naming it."""
    assert config_from_dict({"sampler": {"kind": "mams"}}, ".").sampler.warmup_stop == "converged"
    raw = {"sampler": {"kind": "mams", "warmup_stop": "fixed"}}
    assert config_from_dict(raw, ".").sampler.warmup_stop == "fixed"
    with pytest.raises(ConfigError, match="sampler.warmup_stop"):
        config_from_dict({"sampler": {"kind": "mams", "warmup_stop": "early"}}, ".")
    with pytest.raises(ConfigError, match="sampler.warmup_stop: only used when"):
        config_from_dict({"sampler": {"kind": "mclmc", "warmup_stop": "fixed"}}, ".")


def test_kind_dependent_likelihood_and_power_defaults(files: Path) -> None:
    poisson = config_from_dict({"model": {"likelihood": {"kind": "lognormal_poisson"}}}, files)
    assert poisson.model.likelihood.nbar == 2.0 and poisson.model.likelihood.sigma is None
    raw = _with(model__likelihood__sigma=DELETE, model__likelihood__sigma_map="sigma.npy")
    assert config_from_dict(raw, files).model.likelihood.sigma is None
    turnover = config_from_dict({"model": {"power": {"kind": "turnover"}}}, files)
    assert turnover.model.power.k_turnover == 0.05
    tabulated = config_from_dict(_with(model__power={"kind": "tabulated", "file": "pk.txt"}), files)
    assert tabulated.model.power.file == files / "pk.txt"


def test_box_size_per_axis_and_explicit_prior_loc() -> None:
    raw = {
        "grid": {"shape": [4, 6, 9], "box_size": [10, 20.5, 30]},
        "model": {"hyperparameters": {"index": {"sample": True, "prior_loc": -2.0}}},
    }
    config = config_from_dict(raw, ".")
    assert config.grid.shape == (4, 6, 9)
    assert config.grid.box_size == (10.0, 20.5, 30.0)
    assert config.model.hyperparameters.index.prior_loc == -2.0


def test_config_is_frozen() -> None:
    config = Config()
    with pytest.raises(ValueError, match="frozen"):
        config.sampler.num_chains = 3  # type: ignore[misc]


def test_explicit_null_means_default_or_unused() -> None:
    raw = {"sampler": {"kind": "nuts", "num_leapfrog_steps": None, "target_accept_prob": None}}
    sampler = config_from_dict(raw, ".").sampler
    assert not hasattr(sampler, "num_leapfrog_steps") and sampler.target_accept_prob == 0.8
    hmc = config_from_dict({"sampler": {"max_tree_depth": None, "num_leapfrog_steps": None}}, ".")
    assert not hasattr(hmc.sampler, "max_tree_depth") and hmc.sampler.num_leapfrog_steps == 16


# ---------------------------------------------------------------------------------------
# Files, paths, overrides, YAML helpers
# ---------------------------------------------------------------------------------------


def _write_config(directory: Path, raw: dict[str, Any], name: str = "config.yaml") -> Path:
    path = directory / name
    path.write_text(dump_yaml(raw))
    return path


def test_relative_paths_resolve_against_config_dir(files: Path, tmp_path: Path) -> None:
    raw = _with(
        model__likelihood={"kind": "masked_gaussian", "sigma_map": "sigma.npy"},
        data={"source": "file", "path": "data.npz", "key": "field"},
    )
    raw["model"]["likelihood"]["mask"] = {"file": "mask.npy"}
    path = _write_config(files, raw)
    config = load_config(path)
    likelihood = config.model.likelihood
    assert likelihood.sigma_map == files / "sigma.npy"
    assert likelihood.mask is not None and likelihood.mask.file == files / "mask.npy"
    assert config.data.path == files / "data.npz"
    # outputs.directory, an output, is relative to the working directory like --out
    assert config.outputs.directory == Path.cwd() / "runs" / "test"
    assert config_from_dict(config.to_dict(), tmp_path / "elsewhere") == config


def test_relative_path_from_other_working_directory(
    files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write_config(files, _with(data={"source": "file", "path": "data.npy"}))
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    config = load_config(os.path.relpath(path, other))
    assert config.data.path == files / "data.npy"
    assert config.outputs.directory == other / "runs" / "test"


def test_data_file_formats(tmp_path: Path) -> None:
    import h5py

    data = np.random.default_rng(1).normal(size=GRID)
    np.save(tmp_path / "d.npy", data)
    np.savez(tmp_path / "d.npz", obs=data)
    with h5py.File(tmp_path / "d.h5", "w") as handle:
        handle["obs"] = data
        handle["small"] = data[:2]
    for name, key in [("d.npy", "ignored"), ("d.npz", "obs"), ("d.h5", "obs")]:
        raw = _with(data={"source": "file", "path": name, "key": key})
        assert config_from_dict(raw, tmp_path).data.path == tmp_path / name
    # NaN is allowed on masked voxels only; without a mask every voxel is observed
    data[0, 0, 0] = np.nan
    np.savez(tmp_path / "nan.npz", obs=data)
    with h5py.File(tmp_path / "nan.h5", "w") as handle:
        handle["obs"] = data
    for name in ("nan.npz", "nan.h5"):
        with pytest.raises(ConfigError) as info:
            config_from_dict(_with(data={"source": "file", "path": name, "key": "obs"}), tmp_path)
        _assert_one_line_naming(info.value, "data.path")
        assert "(0, 0, 0)" in str(info.value)
    with pytest.raises(ConfigError) as info:
        config_from_dict(_with(data={"source": "file", "path": "d.h5", "key": "x"}), tmp_path)
    _assert_one_line_naming(info.value, "data.key")
    with pytest.raises(ConfigError) as info:
        config_from_dict(_with(data={"source": "file", "path": "d.h5", "key": "small"}), tmp_path)
    _assert_one_line_naming(info.value, "data.path")


def test_with_output_directory_and_summary(tmp_path: Path) -> None:
    config = config_from_dict(_base(), tmp_path)
    moved = config.with_output_directory(tmp_path / "elsewhere")
    assert moved.outputs.directory == tmp_path / "elsewhere"
    assert moved.sampler == config.sampler and config.outputs.directory != moved.outputs.directory
    assert "8x6x5 grid" in config.summary() and "hmc x 2 chains" in config.summary()


def test_round_trip_through_yaml(files: Path, tmp_path: Path) -> None:
    raw = _with(
        model__likelihood={"kind": "lognormal_poisson", "nbar": 3.5},
        sampler={"kind": "fieldnuts", "step_size_jitter": 0.1, "num_chains": 3},
    )
    raw["model"]["likelihood"]["mask"] = {"generate": {"kind": "sphere", "fraction": 0.3}}
    config = config_from_dict(raw, files)
    out = tmp_path / "run" / "config.yaml"
    out.parent.mkdir()
    write_yaml(config.to_dict(), out)
    assert [p.name for p in out.parent.iterdir()] == ["config.yaml"]  # no temp files left
    assert load_config(out) == config
    assert read_yaml(out) == config.to_dict()


def test_dump_yaml_plain_types() -> None:
    text = dump_yaml({"shape": (4, 4, 4), "path": Path("/a/b"), "x": np.float32(0.5), "n": None})
    assert read_yaml_text(text) == {"shape": [4, 4, 4], "path": "/a/b", "x": 0.5, "n": None}
    assert "shape: [4, 4, 4]" in text


def read_yaml_text(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def test_exponent_floats_are_floats(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  power:\n    amplitude: 1e3\n    k_pivot: 5E-2\n")
    power = load_config(path).model.power
    assert (power.amplitude, power.k_pivot) == (1000.0, 0.05)


@pytest.mark.parametrize(
    ("assignment", "attribute", "expected"),
    [
        ("sampler.num_results=123", ("sampler", "num_results"), 123),
        ("sampler.step_size=0.25", ("sampler", "step_size"), 0.25),
        ("sampler.step_size=2e-3", ("sampler", "step_size"), 0.002),
        ("outputs.store_fields=false", ("outputs", "store_fields"), False),
        ("sampler.jitter_leapfrog=true", ("sampler", "jitter_leapfrog"), True),
        ("grid.shape=[16, 12, 9]", ("grid", "shape"), (16, 12, 9)),
        ("grid.box_size=[1, 2, 3]", ("grid", "box_size"), (1.0, 2.0, 3.0)),
        ("precision=float64", ("precision",), "float64"),
        ("sampler.kind=nuts", ("sampler", "kind"), "nuts"),
        ("model.hyperparameters.index.sample=true", ("model", "hyperparameters", "index"), None),
    ],
)
def test_overrides(
    tmp_path: Path, assignment: str, attribute: tuple[str, ...], expected: Any
) -> None:
    raw = _base()
    raw["sampler"] = {"num_chains": 2}
    path = _write_config(tmp_path, raw)
    value: Any = load_config(path, [assignment])
    for name in attribute:
        value = getattr(value, name)
    if expected is None:
        assert value.sample is True
    else:
        assert value == expected and type(value) is type(expected)


def test_overrides_apply_in_order_and_create_sections(tmp_path: Path) -> None:
    path = _write_config(tmp_path, {"sampler": {"num_results": 10}})
    config = load_config(
        path,
        [
            "sampler.num_results=20",
            "sampler.num_results=30",
            "model.likelihood.kind=masked_gaussian",
            "model.likelihood.mask.generate={kind: random, fraction: 0.5}",
        ],
    )
    assert config.sampler.num_results == 30
    mask = config.model.likelihood.mask
    assert mask is not None and mask.generate is not None and mask.generate.kind == "random"


def test_override_paths_are_relative_to_working_directory(
    files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_dir = tmp_path / "configs"
    config_dir.mkdir()
    path = _write_config(config_dir, _base())
    monkeypatch.chdir(files)
    config = load_config(path, ["data.source=file", "data.path=data.npy"])
    assert config.data.path == files / "data.npy"


@pytest.mark.parametrize(
    ("assignment", "key"),
    [
        ("sampler.num_stepz=3", "sampler.num_stepz"),
        ("nosuchsection.x=1", "nosuchsection.x"),
        ("sampler.kind.deeper=1", "sampler.kind.deeper"),
        ("model.likelihood.mask.generate.size=3", "model.likelihood.mask.generate.size"),
        ("sampler.num_results", "--set"),
        ("=3", "--set"),
        ("sampler.num_results=[1, 2", "sampler.num_results (--set value)"),
        ("sampler.num_results=abc", "sampler.num_results"),
    ],
)
def test_bad_overrides(tmp_path: Path, assignment: str, key: str) -> None:
    path = _write_config(tmp_path, _base())
    with pytest.raises(ConfigError) as info:
        load_config(path, [assignment])
    _assert_one_line_naming(info.value, key)


def test_schema_text_lists_every_key() -> None:
    text = schema_text()
    for key in (
        "grid.shape",
        "grid.box_size",
        "model.parametrisation",
        "model.power.k_turnover",
        "model.hyperparameters.log_amplitude.prior_scale",
        "model.likelihood.mask.generate.fraction",
        "model.likelihood.nbar",
        "data.key",
        "sampler.step_size_jitter",
        "sampler.target_accept_prob",
        "outputs.tracked_modes",
        "precision",
    ):
        assert f"\n{key}:" in text, key
    assert "sampler.num_chains: int = 4" in text
    # a kind's own option is listed with the kinds that take it, with its default
    assert "sampler.target_accept_prob: float | null = null  [kind: hmc, chees, snaper]" in text
    assert "null means 0.65." in text and "null means 0.9." in text
    assert "sampler.max_tree_depth: int = 10  [kind: nuts, fieldnuts]" in text


# ---------------------------------------------------------------------------------------
# Malformed configs
# ---------------------------------------------------------------------------------------


def _assert_one_line_naming(error: ConfigError, key: str) -> None:
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"config error: {key}: "), message
    assert error.key == key


_MALFORMED: list[tuple[str, dict[str, Any], str, str]] = [
    # (id, raw config, dotted key named, fragment of the message)
    ("unknown-top", _with(sampling={}), "sampling", "did you mean 'sampler'"),
    ("unknown-grid", _with(grid__size=[8, 8, 8]), "grid.size", "unknown key"),
    ("unknown-power", _with(model__power__amp=1.0), "model.power.amp", "unknown key"),
    (
        "unknown-hyper",
        _with(model__hyperparameters__index__mean=0.0),
        "model.hyperparameters.index.mean",
        "unknown key",
    ),
    (
        "unknown-mask-generate",
        _with(
            model__likelihood__kind="masked_gaussian",
            model__likelihood__mask={"generate": {"kind": "slab", "frac": 0.1}},
        ),
        "model.likelihood.mask.generate.frac",
        "did you mean 'fraction'",
    ),
    (
        "unknown-sampler",
        _with(sampler__num_leapfrog=4),
        "sampler.num_leapfrog",
        "num_leapfrog_steps",
    ),
    ("unknown-data", _with(data__file="x.npy"), "data.file", "unknown key"),
    ("unknown-outputs", _with(outputs__dir="x"), "outputs.dir", "did you mean 'directory'"),
    ("section-not-mapping", _with(sampler=5), "sampler", "must be a mapping"),
    ("shape-two-ints", _with(grid__shape=[8, 8]), "grid.shape", "list of 3 integers"),
    ("shape-too-small", _with(grid__shape=[1, 8, 8]), "grid.shape[0]", ">= 2 (got 1)"),
    ("shape-float", _with(grid__shape=[8, 8.0, 8]), "grid.shape[1]", "integer"),
    ("shape-string", _with(grid__shape="32"), "grid.shape", "list of 3 integers"),
    ("box-negative", _with(grid__box_size=-1.0), "grid.box_size[0]", "> 0"),
    ("box-two", _with(grid__box_size=[1.0, 2.0]), "grid.box_size", "list of 3 numbers"),
    ("box-bool", _with(grid__box_size=True), "grid.box_size", "got true"),
    (
        "parametrisation",
        _with(model__parametrisation="central"),
        "model.parametrisation",
        "'central'",
    ),
    ("power-kind", _with(model__power__kind="bbks"), "model.power.kind", "'bbks'"),
    ("amplitude-zero", _with(model__power__amplitude=0), "model.power.amplitude", "> 0"),
    ("amplitude-string", _with(model__power__amplitude="big"), "model.power.amplitude", "'big'"),
    (
        "amplitude-inf",
        _with(model__power__amplitude=float("inf")),
        "model.power.amplitude",
        "finite",
    ),
    ("k-pivot-negative", _with(model__power__k_pivot=-0.1), "model.power.k_pivot", "> 0"),
    ("tabulated-no-file", _with(model__power__kind="tabulated"), "model.power.file", "required"),
    ("file-for-power-law", _with(model__power__file="pk.txt"), "model.power.file", "tabulated"),
    (
        "k-turnover-for-power-law",
        _with(model__power__k_turnover=0.02),
        "model.power.k_turnover",
        "model.power.kind=turnover",
    ),
    (
        "tabulated-missing-file",
        _with(model__power={"kind": "tabulated", "file": "nope.txt"}),
        "model.power.file",
        "file not found",
    ),
    (
        "tabulated-three-columns",
        _with(model__power={"kind": "tabulated", "file": "pk_3col.txt"}),
        "model.power.file",
        "two columns",
    ),
    (
        "tabulated-decreasing-k",
        _with(model__power={"kind": "tabulated", "file": "pk_decreasing.txt"}),
        "model.power.file",
        "increasing",
    ),
    (
        "tabulated-sampled-index",
        _with(
            model__power={"kind": "tabulated", "file": "pk.txt"},
            model__hyperparameters__index__sample=True,
        ),
        "model.hyperparameters.index.sample",
        "tabulated",
    ),
    (
        "prior-scale-zero",
        _with(model__hyperparameters__index__prior_scale=0.0),
        "model.hyperparameters.index.prior_scale",
        "> 0",
    ),
    (
        "sample-not-bool",
        _with(model__hyperparameters__log_amplitude__sample="yes"),
        "model.hyperparameters.log_amplitude.sample",
        "true or false",
    ),
    (
        "likelihood-kind",
        _with(model__likelihood__kind="poisson"),
        "model.likelihood.kind",
        "poisson",
    ),
    ("sigma-negative", _with(model__likelihood__sigma=-1.0), "model.likelihood.sigma", "> 0"),
    (
        "sigma-and-sigma-map",
        _with(model__likelihood__sigma_map="sigma.npy"),
        "model.likelihood.sigma",
        "not both",
    ),
    (
        "sigma-with-poisson",
        _with(model__likelihood__kind="lognormal_poisson"),
        "model.likelihood.sigma",
        "gaussian",
    ),
    (
        "sigma-map-with-poisson",
        _with(
            model__likelihood={"kind": "lognormal_poisson", "sigma_map": "sigma.npy"},
        ),
        "model.likelihood.sigma_map",
        "gaussian",
    ),
    (
        "nbar-with-gaussian",
        _with(model__likelihood__nbar=2.0),
        "model.likelihood.nbar",
        "lognormal_poisson",
    ),
    (
        "nbar-zero",
        _with(model__likelihood={"kind": "lognormal_poisson", "nbar": 0.0}),
        "model.likelihood.nbar",
        "> 0",
    ),
    (
        "masked-without-mask",
        _with(model__likelihood__kind="masked_gaussian"),
        "model.likelihood.mask",
        "required",
    ),
    (
        "mask-with-gaussian",
        _with(model__likelihood__mask={"file": "mask.npy"}),
        "model.likelihood.mask",
        "masked_gaussian",
    ),
    (
        "mask-file-and-generate",
        _with(
            model__likelihood__kind="masked_gaussian",
            model__likelihood__mask={"file": "mask.npy", "generate": {"kind": "slab"}},
        ),
        "model.likelihood.mask",
        "exactly one",
    ),
    (
        "mask-fraction-one",
        _with(
            model__likelihood__kind="masked_gaussian",
            model__likelihood__mask={"generate": {"kind": "slab", "fraction": 1.0}},
        ),
        "model.likelihood.mask.generate.fraction",
        "< 1",
    ),
    (
        "mask-generate-kind-missing",
        _with(
            model__likelihood__kind="masked_gaussian",
            model__likelihood__mask={"generate": {"fraction": 0.5}},
        ),
        "model.likelihood.mask.generate.kind",
        "required",
    ),
    (
        "sigma-map-missing",
        _with(model__likelihood={"sigma_map": "nope.npy"}),
        "model.likelihood.sigma_map",
        "file not found",
    ),
    (
        "sigma-map-not-npy",
        _with(model__likelihood={"sigma_map": "not_npy.txt"}),
        "model.likelihood.sigma_map",
        ".npy",
    ),
    (
        "sigma-map-shape",
        _with(model__likelihood={"sigma_map": "wrong_shape.npy"}),
        "model.likelihood.sigma_map",
        "does not match grid.shape",
    ),
    (
        "sigma-map-nan",
        _with(model__likelihood={"sigma_map": "nan.npy"}),
        "model.likelihood.sigma_map",
        "NaN",
    ),
    (
        "sigma-map-inf",
        _with(model__likelihood={"sigma_map": "inf.npy"}),
        "model.likelihood.sigma_map",
        "Inf",
    ),
    (
        "sigma-map-negative",
        _with(model__likelihood={"sigma_map": "negative.npy"}),
        "model.likelihood.sigma_map",
        "> 0",
    ),
    (
        "sigma-map-complex",
        _with(model__likelihood={"sigma_map": "complex.npy"}),
        "model.likelihood.sigma_map",
        "real numbers",
    ),
    (
        "mask-all-zero",
        _with(model__likelihood={"kind": "masked_gaussian", "mask": {"file": "zeros.npy"}}),
        "model.likelihood.mask.file",
        "zero everywhere",
    ),
    (
        "mask-above-one",
        _with(model__likelihood={"kind": "masked_gaussian", "mask": {"file": "above_one.npy"}}),
        "model.likelihood.mask.file",
        "0 or 1",
    ),
    (
        "mask-shape",
        _with(model__likelihood={"kind": "masked_gaussian", "mask": {"file": "wrong_shape.npy"}}),
        "model.likelihood.mask.file",
        "does not match",
    ),
    (
        "mask-nan",
        _with(model__likelihood={"kind": "masked_gaussian", "mask": {"file": "nan.npy"}}),
        "model.likelihood.mask.file",
        "NaN",
    ),
    ("data-source", _with(data__source="url"), "data.source", "'url'"),
    ("data-file-no-path", _with(data__source="file"), "data.path", "required"),
    (
        "data-path-missing",
        _with(data={"source": "file", "path": "nope.npy"}),
        "data.path",
        "not found",
    ),
    ("data-path-suffix", _with(data={"source": "file", "path": "pk.txt"}), "data.path", ".npy"),
    (
        "data-path-with-simulate",
        _with(data={"source": "simulate", "path": "data.npy"}),
        "data.path",
        "data.source=file",
    ),
    (
        "data-npz-key",
        _with(data={"source": "file", "path": "data.npz", "key": "delta"}),
        "data.key",
        "'delta' not found",
    ),
    (
        "data-shape",
        _with(data={"source": "file", "path": "wrong_shape.npy"}),
        "data.path",
        "does not match",
    ),
    ("data-seed-negative", _with(data__seed=-1), "data.seed", ">= 0"),
    ("sampler-kind", _with(sampler__kind="mala"), "sampler.kind", "'mala'"),
    ("num-chains-zero", _with(sampler__num_chains=0), "sampler.num_chains", "must be >= 1 (got 0)"),
    (
        "chees-one-chain",
        _with(sampler={"kind": "chees", "num_chains": 1}),
        "sampler.num_chains",
        ">= 2",
    ),
    (
        "snaper-one-chain",
        _with(sampler={"kind": "snaper", "num_chains": 1}),
        "sampler.num_chains",
        ">= 2",
    ),
    (
        "leapfrog-for-nuts",
        _with(sampler={"kind": "nuts", "num_leapfrog_steps": 16}),
        "sampler.num_leapfrog_steps",
        "sampler.kind=hmc (here sampler.kind=nuts)",
    ),
    (
        "jitter-leapfrog-for-chees",
        _with(sampler={"kind": "chees", "jitter_leapfrog": False}),
        "sampler.jitter_leapfrog",
        "sampler.kind=hmc",
    ),
    (
        "tree-depth-for-hmc",
        _with(sampler__max_tree_depth=10),
        "sampler.max_tree_depth",
        "nuts or fieldnuts",
    ),
    (
        "tree-depth-for-snaper",
        _with(sampler={"kind": "snaper", "max_tree_depth": 5}),
        "sampler.max_tree_depth",
        "nuts or fieldnuts",
    ),
    (
        "tree-depth-too-deep",
        _with(sampler={"kind": "nuts", "max_tree_depth": 16}),
        "sampler.max_tree_depth",
        "<= 15",
    ),
    (
        "step-size-jitter-for-nuts",
        _with(sampler={"kind": "nuts", "step_size_jitter": 0.0}),
        "sampler.step_size_jitter",
        "fieldnuts",
    ),
    (
        "step-size-jitter-one",
        _with(sampler={"kind": "fieldnuts", "step_size_jitter": 1.0}),
        "sampler.step_size_jitter",
        "< 1",
    ),
    (
        "target-accept-one",
        _with(sampler__target_accept_prob=1.0),
        "sampler.target_accept_prob",
        "< 1",
    ),
    ("step-size-zero", _with(sampler__step_size=0.0), "sampler.step_size", "> 0"),
    ("leapfrog-zero", _with(sampler__num_leapfrog_steps=0), "sampler.num_leapfrog_steps", ">= 1"),
    ("results-zero", _with(sampler__num_results=0), "sampler.num_results", ">= 1"),
    ("burnin-negative", _with(sampler__num_burnin_steps=-1), "sampler.num_burnin_steps", ">= 0"),
    ("results-string", _with(sampler__num_results="500"), "sampler.num_results", "'500'"),
    ("results-bool", _with(sampler__num_results=True), "sampler.num_results", "got true"),
    ("thin-zero", _with(sampler__thin=0), "sampler.thin", ">= 1"),
    ("chunk-zero", _with(sampler__chunk_size=0), "sampler.chunk_size", ">= 1 or auto (got 0)"),
    ("chunk-word", _with(sampler__chunk_size="big"), "sampler.chunk_size", "(got 'big')"),
    ("chunk-float", _with(sampler__chunk_size=2.5), "sampler.chunk_size", "(got 2.5)"),
    ("chunk-bool", _with(sampler__chunk_size=True), "sampler.chunk_size", "(got true)"),
    (
        "checkpoint-seconds-negative",
        _with(sampler__checkpoint_seconds=-1.0),
        "sampler.checkpoint_seconds",
        ">= 0",
    ),
    (
        "checkpoint-seconds-nan",
        _with(sampler__checkpoint_seconds=float("nan")),
        "sampler.checkpoint_seconds",
        "finite",
    ),
    ("preconditioner", _with(sampler__preconditioner="full"), "sampler.preconditioner", "'full'"),
    ("init-kind", _with(sampler__init="random"), "sampler.init", "'random'"),
    ("init-jitter-negative", _with(sampler__init_jitter=-0.1), "sampler.init_jitter", ">= 0"),
    (
        "wiener-with-poisson",
        _with(model__likelihood={"kind": "lognormal_poisson"}, sampler__init="wiener"),
        "sampler.init",
        "gaussian likelihood",
    ),
    (
        "wiener-with-sampled-amplitude",
        _with(model__hyperparameters__log_amplitude__sample=True, sampler__init="wiener"),
        "sampler.init",
        "fixed hyperparameters",
    ),
    ("field-thin-zero", _with(outputs__field_thin=0), "outputs.field_thin", ">= 1"),
    ("tracked-negative", _with(outputs__tracked_modes=-1), "outputs.tracked_modes", ">= 0"),
    ("tracked-too-many", _with(outputs__tracked_modes=10**6), "outputs.tracked_modes", "Fourier"),
    ("store-fields-string", _with(outputs__store_fields="maybe"), "outputs.store_fields", "maybe"),
    ("outputs-directory-int", _with(outputs__directory=3), "outputs.directory", "path"),
    ("precision", _with(precision="float16"), "precision", "'float16'"),
]


def test_malformed_table_is_large() -> None:
    assert len(_MALFORMED) >= 30
    assert len({case[0] for case in _MALFORMED}) == len(_MALFORMED)


@pytest.mark.parametrize(
    ("raw", "key", "fragment"),
    [case[1:] for case in _MALFORMED],
    ids=[case[0] for case in _MALFORMED],
)
def test_malformed_config(files: Path, raw: dict[str, Any], key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(copy.deepcopy(raw), files)
    _assert_one_line_naming(info.value, key)
    assert fragment in str(info.value)
    # the same config, written to YAML, fails the same way
    with pytest.raises(ConfigError) as again:
        load_config(_write_config(files, raw, "case.yaml"))
    assert str(again.value) == str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("grid:\n  shape: [8, 8, 8\n", "invalid YAML at line"),
        ("grid:\n  shape: [8, 8, 8]\n box_size: 3\n", "invalid YAML at line 3"),
        ("grid: {shape: [8, 8, 8]}\ngrid: {box_size: 3.0}\n", "duplicate key 'grid'"),
        ("sampler:\n\tkind: hmc\n", "invalid YAML at line 2"),
        ("", "empty config file"),
        ("# only a comment\n", "empty config file"),
        ("- grid\n- model\n", "top level must be a mapping"),
        ("just a string\n", "top level must be a mapping"),
        ("!!python/object/apply:os.system ['true']\n", "invalid YAML"),
    ],
    ids=[
        "unclosed-list",
        "bad-indent",
        "duplicate-key",
        "tab-indent",
        "empty",
        "comment-only",
        "list-top-level",
        "scalar-top-level",
        "unsafe-tag",
    ],
)
def test_malformed_yaml_file(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    _assert_one_line_naming(info.value, str(path))
    assert fragment in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    _assert_one_line_naming(info.value, str(path))
    assert "file not found" in str(info.value)


def test_config_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_non_mapping_raw_dict() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict([1, 2], ".")  # type: ignore[arg-type]
    _assert_one_line_naming(info.value, "config")


def test_config_error_is_value_error() -> None:
    error = ConfigError("sampler.num_chains", "must be >= 1\n(got 0)")
    assert isinstance(error, ValueError)
    assert str(error) == "config error: sampler.num_chains: must be >= 1 (got 0)"


def test_metric_pooling_option() -> None:
    """sampler.metric_pooling: shells by default, none on request, anything else refused
    naming the key; the workflow passes the model's groups only to a windowed metric."""
    from fieldhmc import workflow
    from fieldhmc.samplers import SamplerSettings

    assert config_from_dict({}, ".").sampler.metric_pooling == "shells"
    none = config_from_dict({"sampler": {"metric_pooling": "none"}}, ".")
    assert none.sampler.metric_pooling == "none"
    with pytest.raises(ConfigError, match="sampler.metric_pooling"):
        config_from_dict({"sampler": {"metric_pooling": "modes"}}, ".")

    class Model:
        def metric_groups(self):
            return ["groups"]

    shells = config_from_dict({}, ".")
    windowed, fixed = SamplerSettings(adapt_diagonal=True), SamplerSettings()
    assert workflow._metric_groups(shells, Model(), windowed) == ["groups"]
    assert workflow._metric_groups(shells, Model(), fixed) is None
    assert workflow._metric_groups(none, Model(), windowed) is None
