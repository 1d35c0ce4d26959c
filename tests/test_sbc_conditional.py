"""SBC of the ``conditional`` parametrisation with a mask and a sigma map (slow).

configs/hierarchical_masked_64.yaml (log A and n sampled; 20% slab mask) at 8³ with a
per-voxel noise map, 60 realisations: the ranks of both hyperparameters, the log
likelihood, every P(k) bin and the tracked modes must be uniform (no test rejects at
family-wise level 1%). The surrogate is inexact here (mask, sigma map), so this checks
the parametrisation's Jacobian and data handling, not the surrogate's quality.
"""

from pathlib import Path

import numpy as np
import pytest

from fieldhmc import config as cfg
from fieldhmc import distributed, sweep

ROOT = Path(__file__).resolve().parents[1]
MASKED = ROOT / "configs" / "hierarchical_masked_64.yaml"
SMALL = [
    "grid.shape=[8,8,8]",
    "grid.box_size=25.0",  # the 64³ config's cell
    "sampler.kind=hmc",
    "sampler.max_tree_depth=null",
    "sampler.num_leapfrog_steps=8",
    "sampler.jitter_leapfrog=true",
    "sampler.num_chains=2",
    "sampler.num_burnin_steps=150",
    "sampler.num_results=100",
    "sampler.chunk_size=250",
    "outputs.field_thin=10",  # 10 draws x 2 chains = 20 ranked draws
    "outputs.tracked_modes=4",
]
NUM_REALISATIONS = 60


@pytest.mark.slow
def test_sbc_with_mask_and_sigma_map_does_not_reject(tmp_path):
    sigma = np.random.default_rng(4).uniform(1.5, 3.0, size=(8, 8, 8))
    np.save(tmp_path / "sigma.npy", sigma)
    config = cfg.load_config(
        MASKED,
        [
            *SMALL,
            "model.likelihood.sigma=null",
            f"model.likelihood.sigma_map={tmp_path / 'sigma.npy'}",
        ],
    )
    assert config.model.parametrisation == "conditional"
    with distributed.open_client(num_workers=2, threads_per_worker=1) as client:
        result = sweep.run_sbc(config, tmp_path / "sbc", NUM_REALISATIONS, client, progress=False)
    assert not result.failures
    ds = result.dataset
    names = [str(n) for n in ds.quantity.values]
    assert names[:2] == ["log_amplitude", "index"]
    assert sum(n.startswith("power[") for n in names) >= 5
    report = (result.out_dir / "sbc_report.txt").read_text()
    print(report)
    assert ds.attrs["p_family"] > 0.01, report
