"""Run-directory layout, atomic writes and ArviZ export.

A run directory::

    config.yaml        the fully resolved config, plus versions of fieldhmc/TF/TFP
    data/              truth.npy, data.npy, mask.npy, sigma_map.npy, truth_latents.npz
    traces.h5          streamed per-draw traces [draw, chain, ...] (internal)
    fields.h5          thinned field draws [draw, chain, n0, n1, n2]; posterior mean, var
    samples.nc         ArviZ InferenceData: posterior (hyperparameters, tracked modes;
                       no group when there are none), sample_stats (lp, acceptance_rate,
                       diverging, energy, step_size, tree_depth, n_steps)
    power.nc           per-draw binned P(k) [chain, draw, k] and reference spectra
    summary.json       diagnostics (machine-readable)
    report.txt         the printed diagnostics table
    plots/*.png
    checkpoint/        sampler state after the last chunk (resume reads it)
    tensorboard/       per-chunk scalars, when outputs.tensorboard is true
    .fieldhmc.lock     the run-directory lock (holds the pid of the last holder)

Every command that writes or reads a run (``run``, ``resume``, ``simulate``,
``diagnose``, ``plot``) holds an exclusive ``fcntl.flock`` on ``.fieldhmc.lock`` for its
whole life (:func:`lock_run_directory`): a second process gets
:class:`RunDirectoryLocked` naming the holder's pid and touches nothing, and
``--overwrite`` never deletes a run that is still going. The OS drops the lock when
its holder dies, however it dies, so a stale lock file is simply taken over. The file
itself is never deleted (a process waiting on the old inode would then lock a
different file than a newcomer).

Every file is written to a temporary name in its directory and renamed into place,
so an interrupted write never leaves a half-written file behind. ``samples.nc`` and
``power.nc`` are plain netCDF4 (``az.from_netcdf`` / ``xarray.open_dataset`` read
them without fieldhmc installed).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np

__all__ = [
    "LOCK_NAME",
    "OWNED_NAMES",
    "RunDirectory",
    "RunDirectoryError",
    "RunDirectoryLocked",
    "atomic_write",
    "check_not_locked",
    "check_resumable",
    "is_empty_run_directory",
    "lock_run_directory",
    "prepare_run_directory",
    "read_inference_data",
    "write_json",
    "write_npy",
]

OWNED_NAMES = (
    "config.yaml",
    "data",
    "traces.h5",
    "fields.h5",
    "samples.nc",
    "power.nc",
    "summary.json",
    "report.txt",
    "plots",
    "checkpoint",
    "tensorboard",
)


LOCK_NAME = ".fieldhmc.lock"
#: ``checkpoint/<name>``: the sampler's checkpoint, written by
#: :mod:`fieldhmc.samplers.checkpoint` (which takes the name from here) and checked by
#: :func:`check_resumable` before TensorFlow starts.
CHECKPOINT_FILE = "state.npz"


class RunDirectoryError(Exception):
    """A run directory that cannot be used as asked (one line; the CLI exits 2)."""


class RunDirectoryLocked(RunDirectoryError):
    """Another live process holds the run directory's lock."""

    def __init__(self, root: Path, pid: int | None):
        self.root = root
        self.pid = pid
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(
            f"run directory {root} is in use by {holder} (a run, resume, diagnose or plot "
            "still going); wait for it to finish or stop it first"
        )


class RunDirectory:
    """Paths of one run directory (see the module docstring for the layout)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()

    config = property(lambda self: self.root / "config.yaml")
    data_dir = property(lambda self: self.root / "data")
    traces = property(lambda self: self.root / "traces.h5")
    fields = property(lambda self: self.root / "fields.h5")
    samples = property(lambda self: self.root / "samples.nc")
    power = property(lambda self: self.root / "power.nc")
    summary = property(lambda self: self.root / "summary.json")
    report = property(lambda self: self.root / "report.txt")
    plots = property(lambda self: self.root / "plots")
    checkpoint = property(lambda self: self.root / "checkpoint")
    lock = property(lambda self: self.root / LOCK_NAME)

    def data(self, name: str) -> Path:
        return self.data_dir / f"{name}.npy"

    def load_data(self, name: str) -> np.ndarray | None:
        path = self.data(name)
        return np.load(path) if path.exists() else None


def prepare_run_directory(root: str | os.PathLike, overwrite: bool) -> RunDirectory:
    """Create ``root`` for a new run.

    An existing non-empty directory is refused unless ``overwrite``; then only the
    entries fieldhmc owns (:data:`OWNED_NAMES`) are removed -- anything else the
    user keeps there is left alone.
    """
    run = RunDirectory(root)
    if run.root.exists() and not run.root.is_dir():
        raise FileExistsError(f"{run.root} exists and is not a directory")
    if run.root.exists() and not is_empty_run_directory(run.root):
        if not overwrite:
            raise FileExistsError(
                f"run directory {run.root} exists and is not empty (use --overwrite)"
            )
        import shutil

        for name in OWNED_NAMES:
            path = run.root / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    run.root.mkdir(parents=True, exist_ok=True)
    return run


def is_empty_run_directory(root: str | os.PathLike) -> bool:
    """True if ``root`` holds nothing but (perhaps) the lock file."""
    return all(entry.name == LOCK_NAME for entry in Path(root).iterdir())


# Locks this process holds: root -> [fd, depth]. Re-entrant, so that the CLI can take the
# lock before TensorFlow starts and workflow.run (which also takes it, for callers from
# Python) runs inside it: two flocks on two descriptors of one file would exclude each
# other even within one process.
_HELD: dict[Path, list[int]] = {}


def _read_pid(fd: int) -> int | None:
    """The pid a holder wrote; it writes it just after locking, so wait a moment."""
    deadline = time.monotonic() + 1.0
    while True:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def _probe(root: Path) -> int | None:
    """The pid of another process holding ``root``'s lock, or None; creates nothing."""
    if root in _HELD:
        return None
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDONLY)
    except OSError:  # no lock file (or unreadable): nobody can hold it
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _read_pid(fd)
        return pid if pid is not None else -1
    finally:
        os.close(fd)  # also drops the shared lock, if it was taken
    return None


def check_not_locked(root: str | os.PathLike) -> None:
    """Raise :class:`RunDirectoryLocked` if another process holds ``root``'s lock.

    A check that writes nothing, for refusing early (before TensorFlow starts); only
    :func:`lock_run_directory` excludes other processes.
    """
    root = Path(os.path.abspath(root))
    pid = _probe(root)
    if pid is not None:
        raise RunDirectoryLocked(root, None if pid < 0 else pid)


@contextlib.contextmanager
def lock_run_directory(root: str | os.PathLike, create: bool = False) -> Iterator[Path]:
    """Hold the run directory's exclusive lock for the ``with`` block (re-entrant).

    Parameters
    ----------
    root : path-like
        The run directory.
    create : bool
        Create ``root`` (and parents) if missing (``run``, ``simulate``); else it must
        exist.

    Raises
    ------
    RunDirectoryLocked
        Another live process holds the lock (its pid is in the message).
    RunDirectoryError
        ``root`` cannot be created or written (read-only, no permission).
    """
    root = Path(os.path.abspath(root))
    held = _HELD.get(root)
    if held is not None:
        held[1] += 1
        try:
            yield root
        finally:
            held[1] -= 1
        return
    created = create and not root.exists()
    try:
        if create:
            root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, _file_mode())
    except OSError as exc:
        raise RunDirectoryError(
            f"cannot write to run directory {root}: {exc.strerror or exc}"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _read_pid(fd)
        os.close(fd)
        raise RunDirectoryLocked(root, pid) from None
    # The live holder's pid (a dead holder's stale pid is overwritten here).
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[root] = [fd, 1]
    try:
        yield root
    except BaseException:
        if created:
            _remove_if_only_lock(root)
        raise
    finally:
        del _HELD[root]
        os.close(fd)  # releases the lock


def _remove_if_only_lock(root: Path) -> None:
    """Remove a directory this process created for a command that failed before writing
    anything (a bad forward function, say): a refused run leaves nothing behind. Done
    while the lock is still held, so no other process can be using the directory."""
    with contextlib.suppress(OSError):
        if is_empty_run_directory(root):
            (root / LOCK_NAME).unlink()
            root.rmdir()


def check_resumable(root: str | os.PathLike) -> None:
    """Check, before TensorFlow starts, that ``resume`` can read the run's checkpoint.

    Raises
    ------
    RunDirectoryError
        No ``config.yaml``; a missing, empty or truncated checkpoint, or one without
        readable metadata (the message says how to restart the run).
    """
    run = RunDirectory(root)
    if not run.config.exists():
        raise RunDirectoryError(f"{run.root} is not a fieldhmc run directory (no config.yaml)")
    path = run.checkpoint / CHECKPOINT_FILE
    restart = f"restart the run with `fieldhmc run {run.config} --out {run.root} --overwrite`"
    if not path.exists():
        raise RunDirectoryError(
            f"no checkpoint at {path}: the run stopped before its first chunk was saved; {restart}"
        )
    import zipfile

    # The archive's directory (at its end: a truncated file loses it) and the small
    # metadata entry; the state arrays themselves (GBs at 256³) are not read here.
    try:
        with np.load(path, allow_pickle=False) as archive:
            json.loads(bytes(archive["__meta__"]).decode())
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        size = path.stat().st_size
        what = "empty (0 bytes)" if size == 0 else f"unreadable ({type(exc).__name__}: {exc})"
        raise RunDirectoryError(f"checkpoint {path} is {what}; {restart}") from None


def _file_mode() -> int:
    """Permissions a plain ``open(path, "w")`` would give: ``0o666`` minus the umask."""
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: Path, write_fn: Callable[[Path], None]) -> Path:
    """Call ``write_fn(tmp)`` on a temporary file beside ``path``, fsync, rename.

    The directory entry is fsync'ed too, so a crash leaves either the old or the
    new file, never a torn one. The file gets the permissions of any other output
    (``0o666`` minus the umask), not the owner-only ``0o600`` of the temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp)
    try:
        write_fn(tmp)
        os.chmod(tmp, _file_mode())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def write_npy(path: Path, array: np.ndarray) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(array))

    return atomic_write(path, write)


def write_json(path: Path, obj) -> Path:
    def write(tmp: Path) -> None:
        tmp.write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n")

    return atomic_write(path, write)


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_inference_data(
    path: Path,
    posterior: Mapping[str, np.ndarray],
    sample_stats: Mapping[str, np.ndarray],
    attrs: Mapping[str, str] | None = None,
) -> Path:
    """Write an ArviZ InferenceData (netCDF4) from ``[draw, chain]`` arrays.

    Arrays are transposed to ArviZ's ``(chain, draw, ...)``. Names with characters
    netCDF dislikes (``mode[1,2,3].real``) are kept: netCDF4 allows them.
    """
    import arviz as az

    def to_chain_draw(d):
        return {k: np.swapaxes(np.asarray(v), 0, 1) for k, v in d.items()}

    idata = az.from_dict(
        posterior=to_chain_draw(posterior),
        sample_stats=to_chain_draw(sample_stats),
        attrs=dict(attrs or {}),
    )
    return atomic_write(path, lambda tmp: idata.to_netcdf(str(tmp), engine="h5netcdf"))


def read_inference_data(path: Path) -> tuple[dict, dict, dict]:
    """``samples.nc`` as ``(posterior, sample_stats, attrs)``, arrays ``[chain, draw, ...]``.

    ArviZ writes no group for an empty dict: a run with ``outputs.tracked_modes: 0`` and
    no sampled hyperparameters has no ``posterior`` group, read here as ``{}``.
    """
    import arviz as az

    idata = az.from_netcdf(str(path))

    def group(name):
        ds = getattr(idata, name, None)
        return {} if ds is None else {k: ds[k].values for k in ds.data_vars}

    return group("posterior"), group("sample_stats"), dict(getattr(idata, "attrs", None) or {})


def write_power(
    path: Path,
    k: np.ndarray,
    power_draws: np.ndarray,
    nmodes: np.ndarray,
    references: Mapping[str, np.ndarray],
) -> Path:
    """Per-draw binned P(k) ``[draw, chain, k]`` plus reference spectra, as netCDF4."""
    import xarray as xr

    data_vars = {
        "power": (("chain", "draw", "k"), np.swapaxes(power_draws, 0, 1)),
        "nmodes": (("k",), np.asarray(nmodes)),
    }
    for name, value in references.items():
        data_vars[name] = (("k",), np.asarray(value, dtype=np.float64))
    ds = xr.Dataset(
        data_vars,
        coords={"k": np.asarray(k)},
        attrs={"units_k": "h/Mpc", "units_power": "(Mpc/h)^3"},
    )
    return atomic_write(path, lambda tmp: ds.to_netcdf(str(tmp), engine="h5netcdf"))
