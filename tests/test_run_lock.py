"""The run-directory lock (issue 27): one process per run directory, nothing touched by
the refused one, stale locks taken over, the live run undisturbed."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import h5py
import numpy as np
import pytest

import fieldhmc
from fieldhmc import cli, io
from fieldhmc.config import dump_yaml

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@contextlib.contextmanager
def foreign_lock(root: Path, pid: int):
    """Hold ``root``'s lock as another process would: a separate open file description
    (flock locks conflict between descriptions even within one process)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / io.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, f"{pid}\n".encode())
    try:
        yield
    finally:
        os.close(fd)


def _fingerprint(root: Path) -> dict[str, object]:
    return {
        str(p.relative_to(root)): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mtime_ns,
        )
        if p.is_file()
        else "dir"
        for p in sorted(root.rglob("*"))
    }


def _config(directory: Path, **sampler) -> Path:
    raw = {
        "grid": {"shape": [8, 8, 8], "box_size": 50.0},
        "sampler": {
            "num_chains": 2,
            "num_burnin_steps": 20,
            "num_results": 40,
            "num_leapfrog_steps": 4,
            "chunk_size": 10,
            **sampler,
        },
        "outputs": {"field_thin": 5, "tracked_modes": 2},
    }
    path = directory / "config.yaml"
    path.write_text(dump_yaml(raw))
    return path


def _finished_run(root: Path) -> Path:
    """Files of a run as far as the CLI's checks see them (the workflow is not called)."""
    (root / "checkpoint").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "config.yaml").write_text(_config(root.parent).read_text())
    meta = np.frombuffer(b"{}", np.uint8)
    np.savez(root / "checkpoint" / "state.npz", x=np.ones(3), __meta__=meta)
    for name in ("samples.nc", "traces.h5", "fields.h5", "summary.json", "data/data.npy"):
        (root / name).write_bytes(os.urandom(64))
    return root


@pytest.fixture
def no_workflow(monkeypatch):
    """A ``fieldhmc.workflow`` that fails the test if any command gets that far."""
    fake = types.ModuleType("fieldhmc.workflow")

    def called(*args, **kwargs):
        raise AssertionError("the workflow was called on a locked run directory")

    for name in ("run", "simulate", "resume", "diagnose", "plot"):
        setattr(fake, name, called)
    monkeypatch.setitem(sys.modules, "fieldhmc.workflow", fake)
    monkeypatch.setattr(fieldhmc, "workflow", fake, raising=False)
    for name in ("TF_CPP_MIN_LOG_LEVEL", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    return fake


def _argv(command: str, config: Path, root: Path) -> list[str]:
    if command in ("run", "simulate"):
        return [command, str(config), "--out", str(root)]
    if command.endswith("--overwrite"):
        return [command.split()[0], str(config), "--out", str(root), "--overwrite"]
    return [command, str(root)]


@pytest.mark.parametrize(
    "command",
    ["run", "run --overwrite", "simulate --overwrite", "resume", "diagnose", "plot"],
)
def test_a_locked_run_directory_is_refused_and_untouched(tmp_path, no_workflow, capsys, command):
    root = _finished_run(tmp_path / "live")
    config = _config(tmp_path)
    holder = 4242
    with foreign_lock(root, holder):
        before = _fingerprint(root)
        code = _refused_without_waiting(_argv(command, config, root))
        assert _fingerprint(root) == before  # nothing written, nothing deleted
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: run directory {root} is in use by process {holder}"), line


def _refused_without_waiting(argv: list[str]) -> int:
    """``cli.main(argv)``'s exit code, asserting it returned while the lock is still held.

    A CLI that waited for the holder would never return here (the holder is this test):
    the call runs in a thread, and one still alive after a minute fails the test. (A
    wall-time bound of 2 s failed on a loaded 2-core box at 2.26 s; the bound is there
    to tell waiting from returning, not to time the refusal.)"""
    out: dict[str, int] = {}
    thread = threading.Thread(target=lambda: out.update(code=cli.main(argv)), daemon=True)
    thread.start()
    thread.join(60.0)
    assert not thread.is_alive(), "the CLI waited for the lock's holder instead of refusing"
    return out["code"]


@pytest.mark.parametrize("step", ["diagnose", "plot"])
def test_workflow_diagnose_and_plot_from_python_take_the_lock(tmp_path, step):
    """Called from Python (not the CLI), diagnose and plot hold the lock too: on a
    directory another process holds they raise before reading or writing anything."""
    from fieldhmc import workflow

    root = _finished_run(tmp_path / "live")
    with foreign_lock(root, 4343):
        before = _fingerprint(root)
        with pytest.raises(io.RunDirectoryLocked, match="process 4343"):
            getattr(workflow, step)(root)
        assert _fingerprint(root) == before


def test_a_fresh_directory_locked_by_a_run_that_has_not_written_yet(tmp_path, no_workflow, capsys):
    """The lock file alone: the directory counts as empty, and the run is still refused."""
    root = tmp_path / "starting"
    with foreign_lock(root, 777):
        assert io.is_empty_run_directory(root)
        assert cli.main(["run", str(_config(tmp_path)), "--out", str(root)]) == 2
        assert [p.name for p in root.iterdir()] == [io.LOCK_NAME]
    assert "in use by process 777" in capsys.readouterr().err


def test_stale_lock_is_taken_over_with_the_live_pid(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / io.LOCK_NAME).write_text("999999999\n")  # a dead holder: no flock on it
    io.check_not_locked(root)
    with io.lock_run_directory(root) as locked:
        assert locked == root
        assert (root / io.LOCK_NAME).read_text() == f"{os.getpid()}\n"
        with io.lock_run_directory(root):  # re-entrant within the holder
            pass
        with pytest.raises(BlockingIOError):  # still held after the inner block
            fd = os.open(root / io.LOCK_NAME, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
    fd = os.open(root / io.LOCK_NAME, os.O_RDONLY)  # released on exit
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from fieldhmc import io
    try:
        with io.lock_run_directory(sys.argv[1], create=True):
            print("locked", flush=True)
            time.sleep(float(sys.argv[2]))
    except io.RunDirectoryLocked as exc:
        print(f"refused {exc.pid}", flush=True)
        sys.exit(2)
    """
)


def test_two_processes_started_together_one_wins(tmp_path):
    root = tmp_path / "new"  # does not exist yet: both create it
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(root), "120"],
            stdout=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for _ in range(2)
    ]
    try:  # the winner holds the lock until stopped, so the two always overlap
        deadline = time.monotonic() + 60
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.02)
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        assert loser.returncode == 2
        assert loser.stdout.read().strip() == f"refused {winner.pid}"
        assert winner.poll() is None and winner.stdout.readline().strip() == "locked"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def test_a_killed_holder_releases_the_lock(tmp_path):
    root = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(root), "60"], stdout=subprocess.PIPE, env=ENV
    )
    try:
        assert proc.stdout.readline().strip() == b"locked"
        with pytest.raises(io.RunDirectoryLocked, match=f"process {proc.pid}"):
            io.check_not_locked(root)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert (root / io.LOCK_NAME).read_text() == f"{proc.pid}\n"  # stale
    with io.lock_run_directory(root):
        assert (root / io.LOCK_NAME).read_text() == f"{os.getpid()}\n"


# --- the full version: a live run in a subprocess --------------------------------------
def _fieldhmc(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fieldhmc", "-q", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        **kwargs,
    )


def _draws(root: Path) -> dict[str, np.ndarray]:
    out = {}
    for name in ("traces.h5", "fields.h5"):
        with h5py.File(root / name, "r") as f:
            out.update({f"{name}/{k}": f[k][()] for k in f})
    return out


@pytest.mark.slow
def test_live_run_is_kept_apart_and_finishes_bit_identical(tmp_path):
    """Two runs started together on one --out, then `run --overwrite`, `resume`,
    `diagnose` and `plot` while the winner samples: all refused, naming its pid; the
    winner's draws equal an undisturbed run's bit for bit."""
    config = _config(tmp_path, num_results=200)
    live = tmp_path / "live"
    a, b = (
        _fieldhmc("run", str(config), "--out", str(live)),
        _fieldhmc("run", str(config), "--out", str(live)),
    )
    deadline = time.monotonic() + 60
    while a.poll() is None and b.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    loser, winner = (a, b) if a.poll() is not None else (b, a)
    _, err = loser.communicate(timeout=60)
    assert loser.returncode == 2, err
    assert err.strip().splitlines() == [
        f"error: run directory {live} is in use by process {winner.pid} (a run, resume, "
        "diagnose or plot still going); wait for it to finish or stop it first"
    ]
    for argv in (
        ["run", str(config), "--out", str(live), "--overwrite"],
        ["resume", str(live)],
        ["diagnose", str(live)],
        ["plot", str(live)],
    ):
        intruder = _fieldhmc(*argv)
        _, err = intruder.communicate(timeout=60)
        assert intruder.returncode == 2, err
        assert f"in use by process {winner.pid}" in err and len(err.strip().splitlines()) == 1
    assert winner.poll() is None, "the live run ended before the intruders were refused"
    _, err = winner.communicate(timeout=600)
    assert winner.returncode == 0, err
    quiet = _fieldhmc("run", str(config), "--out", str(tmp_path / "undisturbed"))
    _, err = quiet.communicate(timeout=600)
    assert quiet.returncode == 0, err
    got, want = _draws(live), _draws(tmp_path / "undisturbed")
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
