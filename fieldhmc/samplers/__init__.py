"""Kernel builders (HMC, NUTS, MCLMC, MAMS), the chunked driver, checkpoints, storage."""

from fieldhmc.samplers.driver import (
    FieldOutputs,
    Sampler,
    SamplerSettings,
    TraceSink,
    adaptation_windows,
    stateless_seed,
)
from fieldhmc.samplers.kernels import KINDS, build_kernel, default_target_accept_prob, whiten
from fieldhmc.samplers.mclmc import MetropolisAdjustedMicrocanonical, MicrocanonicalLangevin
from fieldhmc.samplers.storage import H5TraceSink, MemorySink, read_fields, read_traces

__all__ = [
    "KINDS",
    "FieldOutputs",
    "H5TraceSink",
    "MemorySink",
    "MetropolisAdjustedMicrocanonical",
    "MicrocanonicalLangevin",
    "Sampler",
    "SamplerSettings",
    "TraceSink",
    "adaptation_windows",
    "build_kernel",
    "default_target_accept_prob",
    "read_fields",
    "read_traces",
    "stateless_seed",
    "whiten",
]
