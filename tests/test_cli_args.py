"""Tests of the fieldhmc command line with a fake ``fieldhmc.workflow`` module."""

import json
import logging
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fieldhmc
from fieldhmc import cli
from fieldhmc.config import Config, dump_yaml
from tests.cli_subprocess import run_bad_then_good

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"
SUBCOMMANDS = ["simulate", "run", "resume", "diagnose", "plot", "config-schema", "validate"]


class FakeWorkflow(types.ModuleType):
    """Stands in for fieldhmc.workflow (which imports TensorFlow); records calls."""

    def __init__(self) -> None:
        super().__init__("fieldhmc.workflow")
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.error: BaseException | None = None

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if self.error is not None:
            raise self.error

    def simulate(self, config: Config, out_dir: Path, *, overwrite: bool = False) -> None:
        self._record("simulate", config, out_dir, overwrite=overwrite)

    def run(self, config: Config, out_dir: Path, *, overwrite: bool = False) -> None:
        self._record("run", config, out_dir, overwrite=overwrite)

    def resume(self, run_dir: Path, *, num_results: int | None = None) -> None:
        self._record("resume", run_dir, num_results=num_results)

    def diagnose(self, run_dir: Path) -> None:
        self._record("diagnose", run_dir)

    def plot(self, run_dir: Path) -> None:
        self._record("plot", run_dir)


@pytest.fixture(autouse=True)
def _restore_global_state(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``main`` sets logger levels and TensorFlow's environment; undo that for other
    tests."""
    for name in ("TF_CPP_MIN_LOG_LEVEL", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"):
        monkeypatch.setenv(name, "unset")  # records the original value
        monkeypatch.delenv(name)
    loggers = [logging.getLogger(), logging.getLogger("fieldhmc")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


@pytest.fixture
def workflow(monkeypatch: pytest.MonkeyPatch) -> FakeWorkflow:
    fake = FakeWorkflow()
    monkeypatch.setitem(sys.modules, "fieldhmc.workflow", fake)
    monkeypatch.setattr(fieldhmc, "workflow", fake, raising=False)
    return fake


def _config_file(directory: Path, **sections: Any) -> Path:
    raw: dict[str, Any] = {
        "grid": {"shape": [8, 8, 8], "box_size": 50.0},
        "sampler": {"num_chains": 2, "num_burnin_steps": 2, "num_results": 3},
        "outputs": {"directory": str(directory / "default_out")},
    }
    raw.update(sections)
    path = directory / "config.yaml"
    path.write_text(dump_yaml(raw))
    return path


def _bad_config_file(directory: Path) -> Path:
    path = directory / "bad.yaml"
    path.write_text("grid:\n  shape: [8, 8, 8]\nsampler:\n  num_chains: 0\n")
    return path


def _stderr_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------------------
# Validation first
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "simulate"])
def test_malformed_config_exits_2_without_side_effects(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    out = tmp_path / "out"
    code = cli.main([command, str(_bad_config_file(tmp_path)), "--out", str(out)])
    assert code == 2
    line = _stderr_line(capsys)
    assert line == "config error: sampler.num_chains: must be >= 1 (got 0)"
    assert not out.exists()
    assert workflow.calls == []


def test_malformed_config_no_traceback_even_verbose(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["-v", "run", str(_bad_config_file(tmp_path))]) == 2
    assert _stderr_line(capsys).startswith("config error: sampler.num_chains:")


def test_missing_config_and_bad_override(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "file not found" in _stderr_line(capsys)
    path = _config_file(tmp_path)
    assert cli.main(["run", str(path), "--set", "sampler.bogus=1"]) == 2
    assert _stderr_line(capsys).startswith("config error: sampler.bogus: unknown key")
    assert workflow.calls == []


def test_validation_runs_before_tensorflow_import(tmp_path: Path) -> None:
    """In a fresh interpreter: bad and good configs are checked without TensorFlow."""
    bad = _bad_config_file(tmp_path)
    good = CONFIGS_DIR / "quickstart.yaml"
    out = tmp_path / "out"
    result = run_bad_then_good(bad, good, out)
    assert result.returncode == 0, result.stderr
    assert "no-tensorflow" in result.stdout
    assert result.stderr.strip().splitlines() == [
        "config error: sampler.num_chains: must be >= 1 (got 0)"
    ]
    assert not out.exists()


def test_python_dash_m_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fieldhmc", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: fieldhmc" in result.stdout


# ---------------------------------------------------------------------------------------
# Output directory handling and library calls
# ---------------------------------------------------------------------------------------


def test_run_refuses_non_empty_output_dir(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("user data")
    code = cli.main(["run", str(_config_file(tmp_path)), "--out", str(out)])
    assert code == 2
    line = _stderr_line(capsys)
    assert line.startswith("error: output directory is not empty") and "--overwrite" in line
    assert workflow.calls == []
    assert (out / "precious.txt").read_text() == "user data"


def test_simulate_refuses_non_empty_output_dir(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "x").write_text("")
    assert cli.main(["simulate", str(_config_file(tmp_path)), "--out", str(out)]) == 2
    assert "--overwrite" in _stderr_line(capsys)
    assert workflow.calls == []


def test_output_path_that_is_a_file(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "file"
    out.write_text("")
    assert cli.main(["run", str(_config_file(tmp_path)), "--out", str(out), "--overwrite"]) == 2
    assert "not a directory" in _stderr_line(capsys)


def test_overwrite_passes_through(tmp_path: Path, workflow: FakeWorkflow) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("")
    assert cli.main(["run", str(_config_file(tmp_path)), "--out", str(out), "--overwrite"]) == 0
    ((name, (config, out_dir), kwargs),) = workflow.calls
    assert name == "run" and out_dir == out and kwargs == {"overwrite": True}
    assert config.outputs.directory == out
    assert (out / "old.txt").exists()  # the CLI never deletes anything


def test_empty_existing_output_dir_is_fine(tmp_path: Path, workflow: FakeWorkflow) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert cli.main(["simulate", str(_config_file(tmp_path)), "--out", str(out)]) == 0
    ((name, (config, out_dir), kwargs),) = workflow.calls
    assert (name, out_dir, kwargs) == ("simulate", out, {"overwrite": False})
    assert isinstance(config, Config)


def test_set_reaches_workflow_run(tmp_path: Path, workflow: FakeWorkflow) -> None:
    path = _config_file(tmp_path)
    code = cli.main(
        [
            "run",
            str(path),
            "--set",
            "sampler.num_results=7",
            "--set",
            "sampler.step_size=2e-2",
            "--set",
            "precision=float64",
            "--set",
            "grid.shape=[6, 8, 10]",
        ]
    )
    assert code == 0
    ((name, (config, out_dir), kwargs),) = workflow.calls
    assert name == "run"
    assert config.sampler.num_results == 7
    assert config.sampler.step_size == 0.02
    assert config.precision == "float64"
    assert config.grid.shape == (6, 8, 10)
    assert out_dir == tmp_path / "default_out"  # outputs.directory when --out is absent
    assert kwargs == {"overwrite": False}


def test_relative_out_is_relative_to_working_directory(
    tmp_path: Path, workflow: FakeWorkflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _config_file(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert cli.main(["run", str(path), "--out", "runs/a"]) == 0
    ((_, (config, out_dir), _),) = workflow.calls
    assert out_dir == work / "runs" / "a" == config.outputs.directory


def _resumable_run_dir(directory: Path) -> Path:
    """A run directory as far as ``resume`` checks it before TensorFlow starts."""
    run_dir = directory / "run"
    (run_dir / "checkpoint").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(_config_file(directory).read_text())
    meta = np.frombuffer(b"{}", np.uint8)
    np.savez(run_dir / "checkpoint" / "state.npz", x=np.zeros(3), __meta__=meta)
    return run_dir


def test_resume_diagnose_plot(tmp_path: Path, workflow: FakeWorkflow) -> None:
    run_dir = _resumable_run_dir(tmp_path)
    assert cli.main(["resume", str(run_dir), "--num-results", "40"]) == 0
    assert cli.main(["resume", str(run_dir)]) == 0
    assert cli.main(["diagnose", str(run_dir)]) == 0
    assert cli.main(["-q", "plot", str(run_dir)]) == 0
    assert workflow.calls == [
        ("resume", (run_dir,), {"num_results": 40}),
        ("resume", (run_dir,), {"num_results": None}),
        ("diagnose", (run_dir,), {}),
        ("plot", (run_dir,), {}),
    ]


@pytest.mark.parametrize("command", ["resume", "diagnose", "plot"])
def test_missing_run_dir(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert cli.main([command, str(tmp_path / "nope")]) == 2
    assert _stderr_line(capsys).startswith("error: run directory not found")
    assert workflow.calls == []


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_resume_num_results_must_be_positive(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    assert cli.main(["resume", str(tmp_path), "--num-results", value]) == 2
    assert "positive integer" in capsys.readouterr().err
    assert workflow.calls == []


@pytest.mark.parametrize(
    "error", [ValueError("bad data\nsecond line"), FileNotFoundError("no checkpoint")]
)
def test_library_errors_are_one_line(
    tmp_path: Path,
    workflow: FakeWorkflow,
    capsys: pytest.CaptureFixture[str],
    error: Exception,
) -> None:
    workflow.error = error
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert cli.main(["diagnose", str(run_dir)]) == 2
    line = _stderr_line(capsys)
    assert line == "error: " + " ".join(str(error).split())


def test_library_error_traceback_with_verbose(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str]
) -> None:
    workflow.error = ValueError("bad data")
    assert cli.main(["-v", "run", str(_config_file(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.strip().splitlines()[-1] == "error: bad data"


def test_internal_errors_are_one_line_exit_1(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str]
) -> None:
    workflow.error = RuntimeError("a bug")
    assert cli.main(["run", str(_config_file(tmp_path)), "--overwrite"]) == 1
    line = _stderr_line(capsys)
    assert line.startswith("internal error: RuntimeError: a bug") and "--debug" in line
    assert cli.main(["run", str(_config_file(tmp_path)), "--overwrite", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "raise self.error" in err
    assert err.strip().splitlines()[-1] == "internal error: RuntimeError: a bug"


# ---------------------------------------------------------------------------------------
# Informational commands and parsing
# ---------------------------------------------------------------------------------------


def test_config_schema_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config-schema"]) == 0
    out = capsys.readouterr().out
    assert "sampler.num_chains: int = 4" in out
    assert "model.likelihood.mask.generate.fraction" in out


def test_config_schema_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config-schema", "--json"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert set(schema["properties"]) == {
        "grid",
        "model",
        "data",
        "sampler",
        "outputs",
        "precision",
        "distribution",
    }


def test_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _config_file(tmp_path)
    assert cli.main(["validate", str(path), "--set", "sampler.kind=nuts"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ok: {path}") and "nuts x 2 chains" in out
    assert cli.main(["validate", str(_bad_config_file(tmp_path))]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "config error: sampler.num_chains: must be >= 1 (got 0)"


@pytest.mark.parametrize("path", sorted(CONFIGS_DIR.glob("*.yaml")), ids=lambda path: path.name)
def test_validate_shipped_configs(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


@pytest.mark.parametrize("command", [None, *SUBCOMMANDS])
def test_help_exits_0_with_examples(
    capsys: pytest.CaptureFixture[str], command: str | None
) -> None:
    argv = ["--help"] if command is None else [command, "--help"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fieldhmc")
    assert "examples:" in out


def test_verbosity_flags_before_or_after_command(
    tmp_path: Path, workflow: FakeWorkflow, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config_file(tmp_path)
    assert cli.main(["-q", "validate", str(path)]) == 0
    assert cli.main(["validate", "-q", str(path)]) == 0
    assert cli.main(["validate", "-vv", str(path)]) == 0
    capsys.readouterr()
    assert cli.main(["-v", "-q", "validate", str(path)]) == 2  # mutually exclusive
    assert "not allowed with" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["simulate", "config.yaml"],  # --out is required
        ["run"],
        ["run", "c.yaml", "--set"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_tf_log_level_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    assert cli.main(["config-schema"]) == 0
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"  # also E-level: cuInit on CPU
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    assert cli.main(["config-schema"]) == 0
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert os.environ["TF_ONEDNN_USE_SYSTEM_ALLOCATOR"] == "1"  # with -v too
    monkeypatch.setenv("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "0")  # a user's choice stays
    assert cli.main(["-v", "config-schema"]) == 0
    assert os.environ["TF_ONEDNN_USE_SYSTEM_ALLOCATOR"] == "0"


FREED_BUFFERS = """
    from fieldhmc import cli
    {setup}
    import tensorflow as tf

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

    tf.random.normal([8]).numpy()
    before = rss()
    z = [tf.random.normal([16, 1024, 1024]) for _ in range(4)]  # 4 x 64 MiB
    grown = rss() - before
    del z
    print(grown, rss() - before)
"""


def test_tf_environment_returns_freed_buffers_to_the_system() -> None:
    """oneDNN builds keep freed buffers in a BFC pool (about 256 MiB stay resident here
    without the CLI's environment, checked); with it, RSS falls back after the free."""
    env = {k: v for k, v in os.environ.items() if k != "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"}
    code = textwrap.dedent(FREED_BUFFERS.format(setup="cli.tf_environment()"))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    grown, kept = map(float, out.stdout.split())
    assert grown > 200  # the control: the tensors were resident
    assert kept < 64, f"{kept:.0f} MiB of freed tensors stay resident"


def test_logging_levels(tmp_path: Path) -> None:
    path = str(_config_file(tmp_path))
    package_logger = logging.getLogger("fieldhmc")
    assert cli.main(["validate", path]) == 0
    assert package_logger.level == logging.INFO
    assert cli.main(["-q", "validate", path]) == 0
    assert package_logger.level == logging.WARNING
    assert cli.main(["-v", "validate", path]) == 0
    assert package_logger.level == logging.DEBUG
