"""Run-directory files: atomic writes that respect the umask."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fieldhmc import config, io


@pytest.fixture
def umask():
    """Set the process umask for one test and restore it."""
    saved = os.umask(0o022)
    os.umask(saved)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(saved)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_written_files_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    expected = 0o666 & ~mask
    written = [
        io.write_json(tmp_path / "summary.json", {"a": 1}),
        io.write_text(tmp_path / "report.txt", "ok\n"),
        io.write_npy(tmp_path / "data" / "truth.npy", np.arange(3.0)),
        # a writer that replaces the temporary file (as netCDF/HDF5 and savefig do)
        io.atomic_write(tmp_path / "plots" / "a.png", lambda tmp: tmp.write_bytes(b"png")),
        # configs written directly (sweep/sbc job configs, user scripts)
        config.write_yaml({"a": 1}, tmp_path / "config.yaml"),
    ]
    for path in written:
        assert _mode(path) == expected, (path.name, oct(_mode(path)))
    # a plain open() in the same directory gets the same mode
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert _mode(plain) == expected
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_overwrite_is_atomic_and_keeps_no_temporary(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "summary.json"
    io.write_json(path, {"a": 1})

    def failing(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        io.atomic_write(path, failing)
    assert path.read_text() == '{\n  "a": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_config_yaml_of_a_run_follows_the_umask(tmp_path, umask, monkeypatch):
    from fieldhmc import config as cfg
    from fieldhmc import workflow

    monkeypatch.setattr(workflow, "_versions", lambda: {"fieldhmc": "test"})
    umask(0o022)
    config = cfg.load_config(Path(__file__).parents[1] / "configs" / "quickstart.yaml")
    run = io.RunDirectory(tmp_path)
    workflow._write_config(run, config)
    assert _mode(run.config) == 0o644
    assert cfg.read_yaml(run.config)["versions"] == {"fieldhmc": "test"}


def test_checkpoint_module_is_tensorflow_free_and_writes_the_io_name(tmp_path):
    """io checks the checkpoint before TensorFlow starts: the sampler's checkpoint module
    writes the file io names, and importing it does not start TensorFlow."""
    code = (
        "import sys; from fieldhmc.samplers import checkpoint; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
        f"print(checkpoint.save_checkpoint({str(tmp_path)!r}, {{}}, {{}}).name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == io.CHECKPOINT_FILE


def test_resumable_checkpoint_round_trip(tmp_path):
    from fieldhmc.samplers.checkpoint import save_checkpoint

    run = io.RunDirectory(tmp_path)
    run.config.write_text("grid: {shape: [8, 8, 8]}\n")
    run.checkpoint.mkdir()
    save_checkpoint(run.checkpoint, {"x": np.arange(10.0)}, {"step": 3})
    io.check_resumable(tmp_path)  # a real checkpoint passes
    path = run.checkpoint / io.CHECKPOINT_FILE
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(io.RunDirectoryError, match="--overwrite"):
        io.check_resumable(tmp_path)
