"""Every bad input file and unusable run directory: one line naming the key, exit 2,
nothing written or deleted, before TensorFlow is imported (issue 27).

All cases run from ONE fresh interpreter (``_DRIVER``), which imports the CLI and forks
a child per case (so that no case sees what another imported); the child calls
``fieldhmc.cli.main`` and records its exit status, its stderr, its wall time, whether TensorFlow got
imported and a fingerprint of every watched directory before and after. The tests then
check one case each. A real ``python -m fieldhmc`` subprocess is timed as well
(interpreter start included). Times are CPU seconds (< 2; TensorFlow's import alone
takes ~5), with a loose wall-clock bound, since the machine may be shared.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from fieldhmc.config import dump_yaml

SHAPE = (8, 8, 8)
# The time to the message: CPU seconds of the process (importing TensorFlow alone takes
# ~5 CPU s), and a loose wall-clock bound -- the machine the tests share may be loaded.
MAX_SECONDS = 2.0
MAX_WALL_SECONDS = 10.0

_DRIVER = textwrap.dedent(
    """
    import hashlib, json, os, sys, tempfile, time
    from pathlib import Path

    def fingerprint(paths):
        out = {}
        for root in paths:
            root = Path(root)
            if not root.exists():
                out[str(root)] = None
                continue
            for p in sorted(root.rglob("*")):
                if p.is_file():
                    st = p.stat()
                    digest = hashlib.sha256(p.read_bytes()).hexdigest()
                    out[str(p)] = [digest, st.st_mtime_ns]
                else:
                    out[str(p)] = "dir"
        return out

    cases = json.loads(Path(sys.argv[1]).read_text())
    t_import = time.perf_counter()
    from fieldhmc import cli
    import_seconds = time.perf_counter() - t_import
    results = {}
    for case in cases:  # each in a forked child: a case never sees another's imports
        before = fingerprint(case["watch"])
        out_path = Path(tempfile.mkdtemp()) / "result.json"
        pid = os.fork()
        if pid == 0:
            with tempfile.TemporaryFile() as err:
                os.dup2(err.fileno(), 2)
                t0, cpu0 = time.perf_counter(), time.process_time()
                try:
                    code = cli.main(case["argv"])
                except BaseException as exc:  # a traceback: recorded
                    import traceback
                    traceback.print_exc()
                    code = f"raised {type(exc).__name__}"
                seconds = time.perf_counter() - t0
                cpu_seconds = time.process_time() - cpu0
                sys.stderr.flush()
                err.seek(0)
                stderr = err.read().decode()
            tf = sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")
            out_path.write_text(json.dumps(
                {"code": code, "stderr": stderr, "seconds": seconds,
                 "cpu_seconds": cpu_seconds, "tensorflow": tf[:3]}
            ))
            os._exit(0)
        os.waitpid(pid, 0)
        results[case["id"]] = {
            **json.loads(out_path.read_text()),
            "unchanged": fingerprint(case["watch"]) == before,
        }
    Path(sys.argv[2]).write_text(json.dumps({"import_seconds": import_seconds, **results}))
    """
)


def _config(directory: Path, name: str = "cfg.yaml", **likelihood) -> Path:
    raw = {
        "grid": {"shape": list(SHAPE), "box_size": 50.0},
        "model": {"likelihood": {"kind": "masked_gaussian", "mask": {"file": "mask.npy"}}},
        "data": {"source": "file", "path": "data.npy"},
        "sampler": {"num_chains": 2, "num_burnin_steps": 2, "num_results": 3},
    }
    raw["model"]["likelihood"].update(likelihood)
    path = directory / name
    path.write_text(dump_yaml(raw))
    return path


def _good_files(d: Path, nan_where_masked: bool = False) -> None:
    """Valid mask, data and sigma map (finite everywhere unless ``nan_where_masked``:
    each bad-input case then fails for its own reason on code of any age)."""
    rng = np.random.default_rng(0)
    mask = np.ones(SHAPE)
    mask[:3] = 0
    data = rng.normal(size=SHAPE)
    sigma = np.full(SHAPE, 1.5)
    if nan_where_masked:  # allowed: masked voxels are ignored
        data[mask == 0] = np.nan
        sigma[mask == 0] = np.nan
    np.save(d / "mask.npy", mask)
    np.save(d / "data.npy", data)
    np.save(d / "sigma.npy", sigma)


def _bad_files(d: Path) -> dict[str, Path]:
    """name -> file; one bad property each."""
    good = np.load(d / "data.npy")
    files = {}

    def save(name, array):
        files[name] = d / f"{name}.npy"
        np.save(files[name], array)

    observed_nan = good.copy()
    observed_nan[5, 5, 5] = np.nan
    save("nan_observed", observed_nan)
    observed_inf = good.copy()
    observed_inf[4, 1, 2] = np.inf
    save("inf_observed", observed_inf)
    half = np.load(d / "mask.npy")
    half[6, 6, 6] = 0.5
    save("mask_half", half)
    save("wrong_shape", np.ones((8, 8, 7)))
    save("scalar", np.float64(1.0))
    files["empty"] = d / "empty.npy"
    files["empty"].write_bytes(b"")
    whole = (d / "data.npy").read_bytes()
    files["truncated"] = d / "truncated.npy"
    files["truncated"].write_bytes(whole[: len(whole) // 2])
    files["truncated_header"] = d / "truncated_header.npy"
    files["truncated_header"].write_bytes(whole[:40])
    files["text"] = d / "text.npy"
    files["text"].write_text("1 2 3\n")
    files["empty_npz"] = d / "empty.npz"
    files["empty_npz"].write_bytes(b"")
    return files


DATA, MASK, SIGMA = "data.path", "model.likelihood.mask.file", "model.likelihood.sigma_map"
# (case id, config key the file goes to, bad file, fragment of the message)
FILE_CASES = [
    ("data-nan-in-observed-voxel", DATA, "nan_observed", "(5, 5, 5)"),
    ("data-inf-in-observed-voxel", DATA, "inf_observed", "(4, 1, 2)"),
    ("mask-not-binary", MASK, "mask_half", "0.5"),
    ("data-empty", DATA, "empty", "empty"),
    ("sigma-map-empty", SIGMA, "empty", "empty"),
    ("mask-empty", MASK, "empty", "empty"),
    ("data-npz-empty", DATA, "empty_npz", "empty"),
    ("data-truncated", DATA, "truncated", "truncated"),
    ("sigma-map-truncated", SIGMA, "truncated", "truncated"),
    ("mask-truncated", MASK, "truncated", "truncated"),
    ("data-truncated-header", DATA, "truncated_header", "truncated_header.npy"),
    ("mask-truncated-header", MASK, "truncated_header", "truncated_header.npy"),
    ("data-not-an-array", DATA, "text", "not a NumPy .npy"),
    ("sigma-map-not-an-array", SIGMA, "text", "not a NumPy .npy"),
    ("mask-not-an-array", MASK, "text", "not a NumPy .npy"),
    ("data-0d-array", DATA, "scalar", "does not match grid.shape"),
    ("data-shape", DATA, "wrong_shape", "does not match grid.shape"),
    ("sigma-map-shape", SIGMA, "wrong_shape", "does not match grid.shape"),
    ("mask-shape", MASK, "wrong_shape", "does not match grid.shape"),
]
COMMANDS = ["validate", "run", "simulate"]


def _previous_run(d: Path) -> Path:
    """A directory holding an earlier run's files and a user's file (never to be lost)."""
    out = d / "previous_run"
    (out / "data").mkdir(parents=True)
    (out / "samples.nc").write_bytes(b"earlier draws")
    (out / "data" / "data.npy").write_bytes(b"earlier data")
    (out / "notes.txt").write_text("the user's own file")
    return out


def _run_dir_with_checkpoint(d: Path, name: str, checkpoint: bytes | None) -> Path:
    run = d / name
    (run / "checkpoint").mkdir(parents=True)
    (run / "config.yaml").write_text((d / "cfg.yaml").read_text())
    (run / "samples.nc").write_bytes(b"draws so far")
    if checkpoint is not None:
        (run / "checkpoint" / "state.npz").write_bytes(checkpoint)
    return run


def _cases(d: Path) -> tuple[list[dict], dict[str, tuple[str, str]]]:
    """Driver cases and, per case id, (config key or error kind, message fragment)."""
    _good_files(d)
    good = _config(d, sigma_map="sigma.npy")
    bad = _bad_files(d)
    previous = _previous_run(d)
    cases, expect = [], {}
    for case_id, key, name, fragment in FILE_CASES:
        set_key = {DATA: "data.path", MASK: "model.likelihood.mask.file", SIGMA: SIGMA}[key]
        override = ["--set", f"{set_key}={bad[name]}"]
        for command in COMMANDS:
            ident = f"{command}:{case_id}"
            if command == "validate":
                argv = ["validate", str(good), *override]
                watch = [str(d / "fresh")]
            elif command == "run":  # --overwrite on an earlier run: nothing may go
                argv = ["run", str(good), "--out", str(previous), "--overwrite", *override]
                watch = [str(previous)]
            else:
                argv = ["simulate", str(good), "--out", str(d / "fresh"), *override]
                watch = [str(d / "fresh")]
            cases.append({"id": ident, "argv": argv, "watch": [*watch, str(bad[name])]})
            expect[ident] = (key, fragment)
    # Run directories: a resume that cannot read its checkpoint says how to restart.
    for name, content, fragment in [
        ("empty-checkpoint", b"", "empty (0 bytes)"),
        ("truncated-checkpoint", _valid_checkpoint(d)[:200], "unreadable"),
        ("missing-checkpoint", None, "no checkpoint"),
    ]:
        run = _run_dir_with_checkpoint(d, name, content)
        ident = f"resume:{name}"
        cases.append({"id": ident, "argv": ["resume", str(run)], "watch": [str(run)]})
        expect[ident] = ("error", fragment)
    huge = _simple_config(d, "huge.yaml", (2048, 2048, 2048))
    small = _simple_config(d, "small.yaml", SHAPE)
    unwritable = _unwritable_dir(d)
    target = unwritable / "out" if os.geteuid() == 0 else unwritable
    for command in ("simulate", "run"):
        out = d / f"huge_{command}"
        ident = f"{command}:memory"
        cases.append(
            {"id": ident, "argv": [command, str(huge), "--out", str(out)], "watch": [str(out)]}
        )
        expect[ident] = ("error", "estimated peak memory")
        ident = f"{command}:unwritable-output"
        argv = [command, str(small), "--out", str(target)]
        cases.append({"id": ident, "argv": argv, "watch": [str(target)]})
        expect[ident] = ("error", "cannot write to run directory")
    return cases, expect


def _simple_config(d: Path, name: str, shape) -> Path:
    raw = {"grid": {"shape": list(shape)}, "sampler": {"num_chains": 2, "num_results": 3}}
    path = d / name
    path.write_text(dump_yaml(raw))
    return path


def _valid_checkpoint(d: Path) -> bytes:
    path = d / "valid_state.npz"
    np.savez(path, state=np.arange(1000.0), __meta__=np.frombuffer(b"{}", np.uint8))
    return path.read_bytes()


def _unwritable_dir(d: Path) -> Path:
    """An existing directory this process cannot write to (root ignores permissions,
    so then a sysfs directory, where even root cannot create entries)."""
    if os.geteuid() == 0:
        return Path("/sys/kernel")
    path = d / "read_only"
    path.mkdir()
    path.chmod(0o555)
    return path


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> tuple[dict, dict]:
    d = tmp_path_factory.mktemp("bad_inputs")
    cases, expect = _cases(d)
    case_file, result_file = d / "cases.json", d / "results.json"
    case_file.write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(case_file), str(result_file)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=d,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(result_file.read_text()), expect


def _ids(prefixes) -> list[str]:
    out = []
    for command in prefixes:
        out += [f"{command}:{case[0]}" for case in FILE_CASES]
    return out


@pytest.mark.parametrize(
    "case",
    [
        *_ids(COMMANDS),
        "resume:empty-checkpoint",
        "resume:truncated-checkpoint",
        "resume:missing-checkpoint",
        "simulate:memory",
        "run:memory",
        "simulate:unwritable-output",
        "run:unwritable-output",
    ],
)
def test_bad_input_is_one_line_exit_2_before_tensorflow(results, case):
    found, expect = results
    r = found[case]
    key, fragment = expect[case]
    lines = r["stderr"].strip().splitlines()
    assert r["code"] == 2, r["stderr"]
    assert len(lines) == 1, r["stderr"]
    line = lines[0]
    if key == "error":
        assert line.startswith("error: "), line
    else:
        assert line.startswith(f"config error: {key}: "), line
    assert fragment in line, line
    assert r["unchanged"], f"{case} wrote or deleted something"
    assert r["tensorflow"] == [], r["tensorflow"]
    assert r["cpu_seconds"] < MAX_SECONDS, r["cpu_seconds"]
    assert r["seconds"] < MAX_WALL_SECONDS, r["seconds"]
    if case.startswith("resume:"):
        assert "--overwrite" in line  # says how to restart


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_cli_subprocess_time_to_the_message(tmp_path):
    """Interpreter start included: a bad data file is reported within 2 s."""
    _good_files(tmp_path)
    good = _config(tmp_path)
    bad = _bad_files(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for name, key in [("nan_observed", "data.path"), ("empty", "model.likelihood.mask.file")]:
        t0, cpu0 = time.perf_counter(), _children_cpu()
        proc = subprocess.run(
            [sys.executable, "-m", "fieldhmc", "run", str(good), "--out", str(tmp_path / "o")]
            + ["--set", f"{key}={bad[name]}"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        seconds, cpu_seconds = time.perf_counter() - t0, _children_cpu() - cpu0
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"config error: {key}: ")
        assert cpu_seconds < MAX_SECONDS, cpu_seconds  # interpreter start included
        assert seconds < MAX_WALL_SECONDS, seconds
        assert not (tmp_path / "o").exists()


def test_nan_in_masked_voxels_is_accepted_by_validate(tmp_path, capsys):
    from fieldhmc import cli

    _good_files(tmp_path, nan_where_masked=True)
    assert cli.main(["validate", str(_config(tmp_path, sigma_map="sigma.npy"))]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
