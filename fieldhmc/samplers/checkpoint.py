"""Atomic checkpoints of a sampler's complete state (arrays in one ``.npz``).

A checkpoint holds the latent state, the flattened kernel results (adaptation
state included), the metric, the running field statistics and counters. Writes go
to a temporary file in the same directory, are fsync'ed, then renamed over the
old checkpoint: a run killed at any moment leaves either the previous or the new
checkpoint, never a torn one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fieldhmc.io import CHECKPOINT_FILE, atomic_write

__all__ = ["load_checkpoint", "save_checkpoint"]


def save_checkpoint(directory: Path, arrays: dict[str, np.ndarray], meta: dict) -> Path:
    """Save named arrays plus JSON metadata as ``directory/<io.CHECKPOINT_FILE>`` atomically."""
    payload = {k: np.asarray(v) for k, v in arrays.items()}
    payload["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)

    def write(tmp: Path) -> None:
        # Straight to the file, array by array: an in-memory archive first would hold
        # a second copy of the whole state (two copies, with ``getvalue``).
        with open(tmp, "wb") as f:
            np.savez(f, **payload)

    path = Path(directory) / CHECKPOINT_FILE
    atomic_write(path, write)
    return path


def load_checkpoint(directory: Path) -> tuple[dict[str, np.ndarray], dict]:
    """Load ``directory/<io.CHECKPOINT_FILE>``; raises ``FileNotFoundError`` naming the path."""
    path = Path(directory) / CHECKPOINT_FILE
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "__meta__"}
        meta = json.loads(bytes(data["__meta__"]).decode())
    return arrays, meta
