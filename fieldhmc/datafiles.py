"""The user's input arrays (data, mask, sigma map): read and checked with NumPy only.

One set of rules, used twice: :mod:`fieldhmc.config` runs :func:`check_inputs` while it
validates a config (``validate``, ``run`` and ``simulate`` alike, before TensorFlow is
imported), and :mod:`fieldhmc.workflow` reads the arrays for the model with
:func:`load_mask`, :func:`load_sigma_map` and :func:`load_data`, which apply the same
checks and then clean what the likelihood ignores.

The mask is 1 for an observed voxel and 0 for a masked one (a completeness in
``[0, 1]`` for ``lognormal_poisson``, where 0 is unobserved). Masked voxels carry no
information, so their values in the data and the sigma map may be anything (NaN
included): :func:`load_data` sets masked data to 0 and :func:`load_sigma_map` masked
sigmas to 1, the values the likelihood would give them. Every problem is a
:class:`DataFileError` naming the config key of the file, e.g.::

    model.likelihood.mask.file: values must be 0 or 1 for a gaussian likelihood ...

This module must not import TensorFlow, nor any part of fieldhmc that does.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "DATA_KEY",
    "MASK_KEY",
    "SIGMA_MAP_KEY",
    "DataFileError",
    "check_inputs",
    "load_data",
    "load_mask",
    "load_sigma_map",
]

DATA_KEY = "data.path"
MASK_KEY = "model.likelihood.mask.file"
SIGMA_MAP_KEY = "model.likelihood.sigma_map"
#: Planes of axis 0 checked at a time (a memory-mapped .npy is never read whole).
_SLAB_BYTES = 64 * 2**20


class DataFileError(ValueError):
    """A bad input file, as one line naming its config key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = " ".join(str(message).split())
        super().__init__(f"{self.key}: {self.message}")


def _read_npy(path: Path, key: str) -> np.ndarray:
    """Memory-map a ``.npy`` file; empty, truncated and non-array files are one line."""
    path = Path(path)
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise DataFileError(key, f"cannot read {path}: {exc.strerror or exc}") from None
    if size == 0:
        raise DataFileError(key, f"{path} is empty (0 bytes), not a .npy array")
    try:
        with open(path, "rb") as f:
            is_npy = f.read(6) == b"\x93NUMPY"
        if not is_npy:
            raise DataFileError(key, f"{path} is not a NumPy .npy array file")
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except DataFileError:
        raise
    except ValueError as exc:
        if "mmap length" in str(exc):
            raise DataFileError(
                key, f"{path} is truncated (shorter than its header says; was it fully written?)"
            ) from None
        raise DataFileError(key, f"cannot read {path} as a .npy array: {exc}") from None
    except (OSError, EOFError) as exc:
        raise DataFileError(key, f"cannot read {path} as a .npy array: {exc}") from None


def _read_data_array(path: Path, array_key: str) -> np.ndarray:
    """The data array of a ``.npy`` (memory-mapped), ``.npz`` or HDF5 file."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return _read_npy(path, DATA_KEY)
    if os.path.getsize(path) == 0:
        raise DataFileError(DATA_KEY, f"{path} is empty (0 bytes)")
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as archive:
                names = list(archive.files)
                if array_key not in names:
                    raise DataFileError(
                        "data.key",
                        f"array {array_key!r} not found in {path} (available: {', '.join(names)})",
                    )
                return archive[array_key]
        except DataFileError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise DataFileError(DATA_KEY, f"cannot read {path} as .npz: {exc}") from None
    import h5py  # only for HDF5 data; keeps `import fieldhmc.config` light

    try:
        with h5py.File(path, "r") as handle:
            if array_key not in handle or not isinstance(handle[array_key], h5py.Dataset):
                names = ", ".join(handle.keys())
                raise DataFileError(
                    "data.key", f"dataset {array_key!r} not found in {path} (available: {names})"
                )
            return handle[array_key][()]
    except DataFileError:
        raise
    except OSError as exc:
        raise DataFileError(DATA_KEY, f"cannot read {path} as HDF5: {exc}") from None


def _check_array(array: np.ndarray, key: str, path: Path, grid_shape: Sequence[int]) -> np.ndarray:
    if tuple(array.shape) != tuple(grid_shape):
        raise DataFileError(
            key,
            f"array shape {tuple(array.shape)} in {path} does not match grid.shape "
            f"{tuple(grid_shape)}",
        )
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_) or np.iscomplexobj(
        array
    ):
        raise DataFileError(key, f"must hold real numbers (got dtype {array.dtype} in {path})")
    return array


def _slabs(array: np.ndarray):
    """``(slice, block)`` over axis 0, each block read into memory as float64."""
    step = max(1, _SLAB_BYTES // max(1, array[0].size * 8))
    for start in range(0, len(array), step):
        sl = slice(start, start + step)
        yield sl, np.asarray(array[sl], dtype=np.float64)


def _first_bad(bad: np.ndarray, offset: int) -> tuple[int, ...]:
    i = tuple(int(j) for j in np.argwhere(bad)[0])
    return (i[0] + offset, *i[1:])


def _check_mask(mask: np.ndarray, path: Path, binary: bool, kind: str) -> None:
    low, high = np.inf, -np.inf
    for sl, block in _slabs(mask):
        if not np.isfinite(block).all():
            where = _first_bad(~np.isfinite(block), sl.start)
            raise DataFileError(MASK_KEY, f"contains NaN or Inf (first at voxel {where}) in {path}")
        bad = (block != 0) & (block != 1) if binary else (block < 0) | (block > 1)
        if bad.any():
            where = _first_bad(bad, sl.start)
            value = block[(where[0] - sl.start, *where[1:])]
            allowed = "0 or 1" if binary else "in [0, 1]"
            raise DataFileError(
                MASK_KEY,
                f"values must be {allowed} for a {kind} likelihood (1 = observed, 0 = masked); "
                f"found {value:g} at voxel {where} in {path}",
            )
        low, high = min(low, float(block.min())), max(high, float(block.max()))
    if high == 0:
        raise DataFileError(MASK_KEY, f"mask is zero everywhere, nothing is observed: {path}")


def _observed(mask: np.ndarray | None, sl: slice) -> np.ndarray | bool:
    return True if mask is None else np.asarray(mask[sl]) > 0


def _scan(array: np.ndarray, bad_fn) -> tuple[int, tuple[int, ...] | None, float]:
    """``(count, first index, first value)`` of the voxels where ``bad_fn(slice, block)``."""
    count, first, value = 0, None, float("nan")
    for sl, block in _slabs(array):
        bad = bad_fn(sl, block)
        n = int(np.count_nonzero(bad))
        if n and first is None:
            first = _first_bad(bad, sl.start)
            value = float(block[(first[0] - sl.start, *first[1:])])
        count += n
    return count, first, value


def _check_sigma_map(sigma: np.ndarray, path: Path, mask: np.ndarray | None) -> None:
    count, first, value = _scan(
        sigma, lambda sl, b: ~(np.isfinite(b) & (b > 0)) & _observed(mask, sl)
    )
    if count:
        where = "observed voxels (mask = 1)" if mask is not None else "voxels (no mask)"
        raise DataFileError(
            SIGMA_MAP_KEY,
            f"noise standard deviations must be finite (no NaN or Inf) and > 0; {count} "
            f"{where} are not, "
            f"first {value:g} at {first}, in {path}",
        )


def _check_data(data: np.ndarray, path: Path, mask: np.ndarray | None, counts: bool) -> None:
    count, first, _ = _scan(data, lambda sl, b: ~np.isfinite(b) & _observed(mask, sl))
    if count:
        where = "observed voxels (mask = 1)" if mask is not None else "voxels (no mask)"
        raise DataFileError(
            DATA_KEY,
            f"NaN or Inf at {count} {where}, first at {first}, in {path}; only masked "
            "voxels (mask = 0) may hold NaN",
        )
    if counts:
        count, first, value = _scan(
            data, lambda sl, b: ((b < 0) | (b != np.round(b))) & _observed(mask, sl)
        )
        if count:
            raise DataFileError(
                DATA_KEY,
                f"Poisson counts must be non-negative integers on observed voxels; {count} "
                f"are not, first {value:g} at {first}, in {path}",
            )


def _likelihood_rules(likelihood_kind: str) -> tuple[bool, bool]:
    """``(binary_mask, counts)`` of a ``model.likelihood.kind``."""
    is_poisson = likelihood_kind == "lognormal_poisson"
    return not is_poisson, is_poisson


def load_mask(
    path: str | os.PathLike, grid_shape: Sequence[int], likelihood_kind: str
) -> np.ndarray:
    """Read and check a mask file (memory-mapped, read-only).

    Parameters
    ----------
    path : path-like
        ``.npy`` of ``grid_shape``: 1 observed, 0 masked; only 0 and 1 for the Gaussian
        likelihoods, a completeness in ``[0, 1]`` for ``lognormal_poisson``; not all 0.
    grid_shape : sequence of int
    likelihood_kind : str
        ``model.likelihood.kind``.

    Raises
    ------
    DataFileError
        Naming ``model.likelihood.mask.file``.
    """
    path = Path(path)
    mask = _check_array(_read_npy(path, MASK_KEY), MASK_KEY, path, grid_shape)
    binary, _ = _likelihood_rules(likelihood_kind)
    _check_mask(mask, path, binary, likelihood_kind)
    return mask


def load_sigma_map(
    path: str | os.PathLike, grid_shape: Sequence[int], mask: np.ndarray | None = None
) -> np.ndarray:
    """Read and check a sigma map; float64, masked voxels (``mask == 0``) set to 1.

    Sigma must be finite and > 0 on observed voxels (everywhere without a mask); masked
    voxels may hold anything.

    Raises
    ------
    DataFileError
        Naming ``model.likelihood.sigma_map``.
    """
    path = Path(path)
    sigma = _check_array(_read_npy(path, SIGMA_MAP_KEY), SIGMA_MAP_KEY, path, grid_shape)
    _check_sigma_map(sigma, path, mask)
    sigma = np.asarray(sigma, dtype=np.float64)
    return sigma if mask is None else np.where(np.asarray(mask) > 0, sigma, 1.0)


def load_data(
    path: str | os.PathLike,
    array_key: str,
    grid_shape: Sequence[int],
    likelihood_kind: str,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Read and check the observed data; float64, masked voxels (``mask == 0``) set to 0.

    Parameters
    ----------
    path : path-like
        ``.npy``, ``.npz`` or ``.h5``/``.hdf5`` file.
    array_key : str
        ``data.key``: the array inside ``.npz``/HDF5 files.
    grid_shape : sequence of int
    likelihood_kind : str
        ``model.likelihood.kind`` (``lognormal_poisson`` data are counts).
    mask : np.ndarray, optional
        The mask (1 observed, 0 masked); data may be anything where it is 0.

    Raises
    ------
    DataFileError
        Naming ``data.path`` (or ``data.key``): unreadable, wrong shape or dtype, NaN or
        Inf on an observed voxel, counts that are not non-negative integers.
    """
    path = Path(path)
    data = _check_array(_read_data_array(path, array_key), DATA_KEY, path, grid_shape)
    _, counts = _likelihood_rules(likelihood_kind)
    _check_data(data, path, mask, counts)
    data = np.asarray(data, dtype=np.float64)
    return data if mask is None else np.where(np.asarray(mask) > 0, data, 0.0)


def check_inputs(
    grid_shape: Sequence[int],
    likelihood_kind: str,
    *,
    data_path: str | os.PathLike | None = None,
    data_key: str = "data",
    mask_path: str | os.PathLike | None = None,
    sigma_map_path: str | os.PathLike | None = None,
    has_generated_mask: bool = False,
) -> None:
    """Check every input file of a config together (the mask decides what is observed).

    Reads in slabs of memory-mapped ``.npy`` files; ``.npz``/HDF5 data are read whole.
    A generated mask (``mask.generate``, ``has_generated_mask``) is made by the models
    (TensorFlow), so here its data and sigma map are only read and checked for shape and
    dtype; their values are checked by the workflow on the generated mask's observed
    voxels (:func:`load_data`, :func:`load_sigma_map`: the same rules, the same keys).

    Raises
    ------
    DataFileError
        The first problem, naming the file's config key.
    """
    mask = None if mask_path is None else load_mask(mask_path, grid_shape, likelihood_kind)
    _, counts = _likelihood_rules(likelihood_kind)
    if sigma_map_path is not None:
        path = Path(sigma_map_path)
        sigma = _check_array(_read_npy(path, SIGMA_MAP_KEY), SIGMA_MAP_KEY, path, grid_shape)
        if not has_generated_mask:
            _check_sigma_map(sigma, path, mask)
    if data_path is not None:
        path = Path(data_path)
        data = _check_array(_read_data_array(path, data_key), DATA_KEY, path, grid_shape)
        if not has_generated_mask:
            _check_data(data, path, mask, counts)
