"""Streaming storage of traces and thinned field draws in HDF5 (constant memory).

``traces.h5`` holds one resizable dataset per traced quantity with shape
``[draw, chain, ...]``; ``fields.h5`` holds thinned field draws
``[draw, chain, n0, n1, n2]`` and, at the end, the running posterior mean and
variance. Each append is flushed; on resume the datasets are truncated back to the
lengths recorded in the last checkpoint, so a kill between an append and its
checkpoint never duplicates draws.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

__all__ = ["ChainDrawView", "H5TraceSink", "MemorySink", "read_fields", "read_traces"]


class MemorySink:
    """In-memory sink (interactive use, tests, benchmarks): keeps every append."""

    def __init__(self):
        self.traces: list[dict[str, np.ndarray]] = []
        self.fields: list[np.ndarray] = []

    def truncate(self, num_draws: int, num_field_draws: int) -> None:
        """Nothing to truncate: a memory sink does not outlive its process."""

    def append(self, traces: dict[str, np.ndarray]) -> None:
        self.traces.append(traces)

    def append_fields(self, fields: np.ndarray) -> None:
        self.fields.append(fields)

    def stacked_traces(self) -> dict[str, np.ndarray]:
        """All traces concatenated along the draw axis."""
        if not self.traces:
            raise ValueError("no traces in this MemorySink: Sampler.run has not stored a draw yet")
        return {k: np.concatenate([t[k] for t in self.traces]) for k in self.traces[0]}

    def stacked_fields(self) -> np.ndarray:
        """All field draws ``[draw, chain, ...]``.

        Raises
        ------
        ValueError
            No field draws were stored: the sampler stores them only when it was built
            with ``FieldOutputs(..., store_fields=True)``.
        """
        if not self.fields:
            raise ValueError(
                "no field draws in this MemorySink: a Sampler stores field draws only when "
                "built with FieldOutputs(field_fn, power_fn, store_fields=True); without "
                "them, Sampler.run's summary['latent_state'] holds the final state"
            )
        return np.concatenate(self.fields)


class H5TraceSink:
    """Append-only HDF5 sink implementing :class:`fieldhmc.samplers.driver.TraceSink`."""

    def __init__(self, trace_path: Path, field_path: Path | None = None):
        self.trace_path = Path(trace_path)
        self.field_path = None if field_path is None else Path(field_path)

    @staticmethod
    def _append(path: Path, name: str, values: np.ndarray) -> None:
        with h5py.File(path, "a") as f:
            if name not in f:
                f.create_dataset(
                    name,
                    data=values,
                    maxshape=(None, *values.shape[1:]),
                    chunks=(max(1, min(len(values), 64)), *values.shape[1:])
                    if values.ndim > 2
                    else True,
                )
            else:
                ds = f[name]
                n = ds.shape[0]
                ds.resize(n + len(values), axis=0)
                ds[n:] = values
            f.flush()

    def append(self, traces: dict[str, np.ndarray]) -> None:
        for name, values in traces.items():
            self._append(self.trace_path, name, np.asarray(values))

    def append_fields(self, fields: np.ndarray) -> None:
        """Append ``[draw, chain, ...]`` field draws, one (draw, chain) chunk at a time.

        One HDF5 chunk per (draw, chain): a reader streams draw by draw or over slabs of
        voxels, and no chunk outgrows HDF5's 4 GB limit (8 draws of 512³ would).
        """
        if self.field_path is None:
            return
        fields = np.asarray(fields)
        with h5py.File(self.field_path, "a") as f:
            if "draws" not in f:
                f.create_dataset(
                    "draws",
                    shape=(0, *fields.shape[1:]),
                    maxshape=(None, *fields.shape[1:]),
                    dtype=fields.dtype,
                    chunks=(1, 1, *fields.shape[2:]),
                )
            ds = f["draws"]
            n = ds.shape[0]
            ds.resize(n + len(fields), axis=0)
            # One field per write: HDF5 converts and buffers no more than one chunk.
            for d in range(len(fields)):
                for c in range(fields.shape[1]):
                    ds[n + d, c] = fields[d, c]
            f.flush()

    def truncate(self, num_draws: int, num_field_draws: int) -> None:
        for path, n in ((self.trace_path, num_draws), (self.field_path, num_field_draws)):
            if path is None or not path.exists():
                continue
            with h5py.File(path, "a") as f:
                for name in ("draws",) if path == self.field_path else list(f):
                    if name in f and f[name].shape[0] > n:
                        f[name].resize(n, axis=0)

    def write_field_moments(self, mean: np.ndarray, var: np.ndarray) -> None:
        if self.field_path is None:
            return
        with h5py.File(self.field_path, "a") as f:
            for name, value in (("mean", mean), ("var", var)):
                if name in f:
                    del f[name]
                f.create_dataset(name, data=value)


def read_traces(path: Path) -> dict[str, np.ndarray]:
    """All traces as ``{name: array [draw, chain, ...]}``."""
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in f}


def read_fields(path: Path, names: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """``draws`` [draw, chain, ...] (may be absent), ``mean`` and ``var`` if written.

    ``names`` restricts what is read (the draws can be large).
    """
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in f if names is None or name in names}


class ChainDrawView:
    """Stored field draws ``[draw, chain, ...]`` seen as ``[chain, draw, ...]``, read lazily.

    Nothing is read until indexed; ``view[j, d]`` reads one draw, ``view[:, :, a:b]`` a
    slab of every draw (``[chain, draw, b - a, ...]``). The diagnostics stream over it
    in slabs (see :func:`fieldhmc.diagnostics.convergence._column_blocks`) instead of
    loading every stored field.

    Parameters
    ----------
    dataset : h5py.Dataset
        ``draws`` of ``fields.h5``, shape ``[draw, chain, n0, n1, n2]``.
    """

    def __init__(self, dataset):
        self._ds = dataset
        d, c = dataset.shape[:2]
        self.shape = (c, d, *dataset.shape[2:])
        self.dtype = dataset.dtype
        self.ndim = dataset.ndim
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        key = key + (slice(None),) * max(0, 2 - len(key))
        chain, draw = key[0], key[1]
        out = self._ds[(draw, chain, *key[2:])]
        if not isinstance(chain, int | np.integer) and not isinstance(draw, int | np.integer):
            out = np.swapaxes(out, 0, 1)
        return out
