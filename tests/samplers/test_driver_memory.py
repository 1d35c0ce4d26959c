"""Memory of the sampling phase: what the compiled chunk carries, in multiples of the state.

Two mechanisms keep the sampling phase near the physical need, and each test fails
without its mechanism: the kernel results carry only what the next step reads (the
HMC kinds' proposal and momenta are dropped, see ``kernels.slim_results``), and the
carried state lives in ``tf.Variable`` s that the XLA-compiled chunk updates in place
(``driver._Carry``), so no state-sized argument of the chunk exists twice.
"""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from fieldhmc.samplers.checkpoint import load_checkpoint
from fieldhmc.samplers.driver import FieldOutputs, Sampler, SamplerSettings
from fieldhmc.samplers.storage import MemorySink

GRID = (16, 16, 16)
CHAINS = 2


def _target(x, h):
    z = tf.cast(x, tf.float64)
    return -0.5 * tf.reduce_sum(z**2, axis=[1, 2, 3]) - 0.5 * tf.cast(h, tf.float64) ** 2


def _hmc_sampler(outputs=None, **settings):
    """HMC on ``_target`` (a field and a scalar), ``CHAINS`` chains."""
    return Sampler(
        _target,
        SamplerSettings(kind="hmc", num_chains=CHAINS, **settings),
        ["field", "h"],
        [np.ones(GRID, np.float32), np.float32(1.0)],
        outputs,
    )


@pytest.fixture(scope="module")
def hmc_run(tmp_path_factory):
    sampler = _hmc_sampler(num_burnin_steps=2, num_results=2, num_leapfrog_steps=2, chunk_size=4)
    rng = np.random.default_rng(0)
    init = [
        rng.standard_normal((CHAINS, *GRID)).astype(np.float32),
        np.zeros(CHAINS, np.float32),
    ]
    directory = tmp_path_factory.mktemp("ckpt")
    sampler.run(MemorySink(), Path(directory), init, progress=False)
    return sampler, Path(directory)


def test_checkpointed_kernel_results_hold_only_the_gradient(hmc_run):
    # TFP's HMC results held 7 state-sized tensors per chain (accepted gradient and
    # momenta, proposed state, gradient and momenta); the next step reads 1.
    _, directory = hmc_run
    arrays, _ = load_checkpoint(directory)
    state_bytes = arrays["x0"].nbytes + arrays["x1"].nbytes
    results_bytes = sum(a.nbytes for k, a in arrays.items() if k.startswith("results"))
    assert results_bytes < 1.1 * state_bytes, results_bytes / state_bytes


def _entry_signature(hlo: str):
    """(parameter shapes, {aliased parameter indices}) of an HLO module's entry."""
    header = hlo.splitlines()[0]
    layout = re.search(r"entry_computation_layout=\{\((.*)\)->", header).group(1)
    params = re.findall(r"(\w+\[[\d,]*\])", re.sub(r"/\*index=\d+\*/", "", layout))
    aliased = {int(p) for p in re.findall(r"\{\d+\}: \((\d+), \{\}, may-alias\)", header)}
    return params, aliased


def test_chunk_updates_the_carried_state_in_place(hmc_run):
    # Passed as arguments and returned, the state and its gradient existed as the
    # argument, the loop's copy and the result (tf.function donates nothing); as
    # variables assigned by the compiled chunk, their buffers are aliased in place.
    sampler, _ = hmc_run
    args = (
        [tf.ones(GRID, tf.float32), tf.ones([], tf.float32)],
        tf.zeros([CHAINS], tf.float64),
        tf.zeros([CHAINS], tf.float64),
        tf.constant([0, 0]),
        tf.constant(0),
        tf.constant(4),
        tf.constant(sampler.settings.num_burnin_steps),  # num_burnin
    )
    hlo = sampler._chunk.experimental_get_compiler_ir(*args)(stage="hlo")
    params, aliased = _entry_signature(hlo)
    state_sized = [i for i, p in enumerate(params) if p == f"f32[{CHAINS},16,16,16]"]
    assert len(state_sized) == 2, params  # the state and its gradient, nothing else
    assert set(state_sized) <= aliased, (state_sized, sorted(aliased))


class _FieldShapesSink(MemorySink):
    """Keeps the traces; of the field draws only their count (as a disk sink does,
    which writes them and lets them go)."""

    def __init__(self):
        super().__init__()
        self.num_fields = 0

    def append_fields(self, fields):
        self.num_fields += len(fields)


def test_the_sink_reads_the_chunks_field_buffer_without_copying_it(tmp_path):
    # Each chunk's stored field draws reach the sink as a view of the chunk's output:
    # numpy()'s copy of the whole buffer (fresh pages every chunk) was 8% of a 64³
    # mclmc run's wall time. NumPy's allocations show in tracemalloc, TensorFlow's do
    # not. In draws (every chain's field): a copy of one chunk's buffer is 32 (a peak
    # of 34 with it), the rest of a run (checkpoints: state, gradient, running
    # moments) about 7.
    outputs = FieldOutputs(
        field_fn=lambda x, h: x, power_fn=lambda f: tf.reduce_mean(f**2, [-3, -2, -1])[:, None]
    )
    sampler = _hmc_sampler(
        outputs,
        num_burnin_steps=0,
        num_results=64,
        num_leapfrog_steps=1,
        chunk_size=32,
        field_thin=1,
    )
    init = [np.zeros((CHAINS, *GRID), np.float32), np.zeros(CHAINS, np.float32)]
    sampler.run(_FieldShapesSink(), tmp_path / "compile", init, progress=False, max_chunks=1)
    sink = _FieldShapesSink()
    tracemalloc.start()
    try:
        sampler.run(sink, tmp_path / "run", init, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sink.num_fields == 64
    draw_bytes = CHAINS * np.prod(GRID) * 4  # one draw: every chain's float32 field
    assert peak < 16 * draw_bytes, peak / draw_bytes
