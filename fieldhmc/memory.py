"""Peak-memory estimate of a run, checked before anything starts (no TensorFlow import).

The estimate is ``baseline + field_bytes * (fixed + per_chain * chains)``, with the
multiples measured phase by phase by ``benchmarks/memory.py`` (the largest phase is
sampling: the compiled chunk, its kernel results and the driver's copies of the state).
Stored field draws add nothing: they stream to ``fields.h5`` and the diagnostics read
them back in slabs. The estimate is deliberately on the high side of the measurements,
so that a config that fits is not refused; ``--no-memory-check`` skips the check.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from fieldhmc.config import Config

__all__ = ["MemoryEstimate", "available_bytes", "check_memory", "estimate_peak_bytes"]

# Measured by ``benchmarks/memory.py`` (system allocator, HMC, 4 leapfrog steps, 20 stored
# draws per chain, the ``fieldhmc run`` path: sampling, export, diagnose, plot; whole-run
# peak RSS, MiB; 2026-12-04, benchmarks/README.md):
#   64³ x 1: 1369   64³ x 4: 1416   128³ x 1: 1615   128³ x 4: 1660
#   256³ x 1: 2691   256³ x 4: 4382   512³ x 1: 13054.
# One chain, from 256³ and 512³: 23.1 fields + 1.2 GB; at 64³ and 128³ diagnose's
# non-field memory (~0.5-0.8 GB) sets the peak, hence the higher baseline. Each chain
# more: 8.8 fields (256³ x 1 -> x 4). The chains of the 128³ and 256³ 4-chain runs had
# not converged (5 warm-up steps), so their field convergence test flagged nearly every
# mode: the worst case of diagnose.

#: RSS of a run before any field exists: TensorFlow, XLA compiling the chunk, the
#: diagnostics and plotting stack (64³ and 128³ runs peak at 1.3-1.6 GB).
BASELINE_BYTES = 1.6e9
#: Field-sized buffers independent of the number of chains (with one chain's 9.5 the 24
#: that cover 23.1 fitted): model constants, data, truth, preconditioner, what the
#: diagnostics hold.
FIXED_FIELDS = 14.5
#: Field-sized buffers per chain (8.8 measured): state and gradient (carried in place,
#: see ``samplers.driver._Carry``), momentum, proposal, the FFT temporaries of one
#: leapfrog step (the compiled chunk's preallocated temp), the float32 running mean and
#: M2, the stored-draw slot, the checkpoint's host copies.
PER_CHAIN_FIELDS = 9.5


@dataclass(frozen=True)
class MemoryEstimate:
    """A run's estimated peak resident memory, with what it is made of."""

    peak_bytes: float
    field_bytes: int
    num_fields: float

    def describe(self) -> str:
        return (
            f"~{self.peak_bytes / 1e9:.1f} GB ({self.num_fields:.0f} field-sized buffers of "
            f"{self.field_bytes / 2**20:.3g} MiB + {BASELINE_BYTES / 1e9:.1f} GB)"
        )


def estimate_peak_bytes(config: Config) -> MemoryEstimate:
    """Estimated peak RSS of ``fieldhmc run`` for ``config`` (sampling, diagnose, plot)."""
    itemsize = 8 if config.precision == "float64" else 4
    field_bytes = math.prod(config.grid.shape) * itemsize
    fields = FIXED_FIELDS + PER_CHAIN_FIELDS * config.sampler.num_chains
    return MemoryEstimate(BASELINE_BYTES + fields * field_bytes, field_bytes, fields)


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (bytes), else free pages; None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(config: Config, available: int | None = None) -> MemoryEstimate:
    """Raise ``MemoryError`` with a one-line message if the run cannot fit in memory.

    Parameters
    ----------
    config : Config
    available : int, optional
        Bytes available (default: :func:`available_bytes`). Unknown: never refused.
    """
    estimate = estimate_peak_bytes(config)
    if available is None:
        available = available_bytes()
    if available is not None and estimate.peak_bytes > available:
        n = "x".join(str(s) for s in config.grid.shape)
        raise MemoryError(
            f"estimated peak memory {estimate.describe()} for a {n} grid with "
            f"{config.sampler.num_chains} chains exceeds the {available / 1e9:.1f} GB "
            "available; use fewer chains or a smaller grid, or pass --no-memory-check"
        )
    return estimate
