"""Sampler kinds (:mod:`fieldhmc.samplers.kinds`), kernels, the chunked driver,
checkpoints, storage.

The names below are imported on first use, so that the TensorFlow-free parts (the kind
registry the config reads, the checkpoint file name) import without TensorFlow.
"""

import importlib

_EXPORTS = {
    "FieldOutputs": "driver",
    "RunResult": "driver",
    "Sampler": "driver",
    "SamplerSettings": "driver",
    "TraceSink": "driver",
    "adaptation_windows": "driver",
    "stateless_seed": "driver",
    "KINDS": "kinds",
    "build_kernel": "kinds",
    "default_target_accept_prob": "kinds",
    "whiten": "kernels",
    "MetropolisAdjustedMicrocanonical": "mclmc",
    "MicrocanonicalLangevin": "mclmc",
    "H5TraceSink": "storage",
    "MemorySink": "storage",
    "read_fields": "storage",
    "read_traces": "storage",
}

__all__ = sorted(_EXPORTS, key=lambda n: (not n.isupper(), n[0].islower(), n))


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
