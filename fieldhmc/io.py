"""Run-directory layout, atomic writes and ArviZ export.

A run directory::

    config.yaml        the fully resolved config, plus versions of fieldhmc/TF/TFP
    data/              truth.npy, data.npy, mask.npy, sigma_map.npy, truth_latents.npz
    traces.h5          streamed per-draw traces [draw, chain, ...] (internal)
    fields.h5          thinned field draws [draw, chain, n0, n1, n2]; posterior mean, var
    samples.nc         ArviZ InferenceData: posterior (hyperparameters, tracked modes),
                       sample_stats (lp, acceptance_rate, diverging, energy, step_size,
                       tree_depth, n_steps)
    power.nc           per-draw binned P(k) [chain, draw, k] and reference spectra
    summary.json       diagnostics (machine-readable)
    report.txt         the printed diagnostics table
    plots/*.png
    checkpoint/        sampler state after the last chunk (resume reads it)
    tensorboard/       per-chunk scalars, when outputs.tensorboard is true

Every file is written to a temporary name in its directory and renamed into place,
so an interrupted write never leaves a half-written file behind. ``samples.nc`` and
``power.nc`` are plain netCDF4 (``az.from_netcdf`` / ``xarray.open_dataset`` read
them without fieldhmc installed).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

__all__ = [
    "OWNED_NAMES",
    "RunDirectory",
    "atomic_write",
    "prepare_run_directory",
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
    if run.root.exists() and any(run.root.iterdir()):
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
