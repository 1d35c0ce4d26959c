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

# Measured by ``benchmarks/memory.py`` (system allocator, HMC, 20 stored draws per
# chain, full run + diagnose + plot + Wiener reference; whole-run peak RSS, MiB):
#   64³ x 1: 1344   64³ x 4: 1516   128³ x 1: 1717   128³ x 4: 2029
#   256³ x 1: 4311   256³ x 4: 6810.
# Per chain (4 - 1 chains): 13.0 fields at 128³ and 256³. The rest, fitted over those
# two sizes: 1347 MiB (1.41 GB) + 33.3 fields. From 128³ up every run's peak is its
# sampling phase (the compiled chunk on top of model, data, state and running moments);
# diagnose, plot and the Wiener reference stay below it (256³ x 1: 39.7, 25.9 and 43.1
# fields, against 54.3). At 64³ diagnose's non-field memory (~0.5 GB) sets the peak,
# hence the baseline above the fit. The constants are the fits rounded up (stated
# margin: estimates 1.07-1.13x the measured peaks), so a config that fits is not
# refused: 256³ x 4 estimates 8.0 GB (measured 7.1), 256³ x 1 5.1 GB (4.5), 64³ x 4
# 1.7 GB (1.6); 512³ x 1 29 GB.

#: RSS of a run before any field exists: TensorFlow, XLA compiling the chunk, the
#: diagnostics and plotting stack (fit: 1.41 GB; 64³ runs peak at 1.4-1.6 GB).
BASELINE_BYTES = 1.6e9
#: Field-sized buffers independent of the number of chains (fit: 33.3): model constants,
#: data, preconditioner, the float64 running mean and M2 of the field draws, the
#: compiled programs' constants, what the first chunk leaves resident.
FIXED_FIELDS = 37.0
#: Field-sized buffers per chain (fit: 13.0): state and gradient (carried in place, see
#: ``samplers.driver._Carry``), momentum, proposal, the FFT temporaries and the model's
#: float64 terms of one leapfrog step (~9 per chain in the compiled chunk's
#: preallocated temp), the stored-draw slot, the checkpoint's host copies.
PER_CHAIN_FIELDS = 14.5


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
