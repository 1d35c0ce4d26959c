"""Every code block of docs/user-guide.md, run in order in one empty directory.

``python`` blocks share one namespace (as a notebook's cells); ``bash`` blocks hold only
``fieldhmc`` commands, run in-process through :func:`fieldhmc.cli.main` and expected to
exit 0; a ``yaml`` block whose first line is ``# file: NAME`` is written to ``NAME``.
The guide's grid is the real one (24x32x40); only the sampler settings are shortened,
by the substitutions in :data:`SHORTEN`, each of which must match the guide.
"""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from fieldhmc import cli
from fieldhmc.samplers.storage import MemorySink

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "user-guide.md"
#: (text in the guide, what the test runs instead): fewer chains, warm-up and draws.
SHORTEN = [
    ("  num_chains: 4\n", "  num_chains: 2\n"),
    ("num_burnin_steps: 300", "num_burnin_steps: 20"),
    ("num_results: 500", "num_results: 20"),
    ("num_leapfrog_steps: 16", "num_leapfrog_steps: 4"),
    ("field_thin: 10 ", "field_thin: 5 "),
    ("--num-results 1000", "--num-results 28"),
    ("    num_chains=4,\n", "    num_chains=2,\n"),
    ("num_burnin_steps=300,", "num_burnin_steps=20,"),
    ("num_results=500,", "num_results=20,"),
    ("num_leapfrog_steps=16,", "num_leapfrog_steps=4,"),
    ("field_thin=10,", "field_thin=5,"),
]
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def guide_blocks() -> list[tuple[str, str]]:
    text = GUIDE.read_text()
    for old, new in SHORTEN:
        assert old in text, f"SHORTEN entry no longer in the guide: {old!r}"
        text = text.replace(old, new)
    return _BLOCK.findall(text)


def _commands(body: str) -> list[list[str]]:
    """The ``fieldhmc`` commands of a bash block, as argument lists for ``cli.main``."""
    commands = []
    for line in body.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            assert argv[0] == "fieldhmc", f"bash blocks hold only fieldhmc commands: {line}"
            commands.append(argv[1:])
    return commands


def run_blocks(blocks: list[tuple[str, str]]) -> dict:
    namespace: dict = {"__name__": "user_guide"}
    for n, (lang, body) in enumerate(blocks):
        if lang == "python":
            exec(compile(body, f"{GUIDE.name}[block {n}]", "exec"), namespace)  # noqa: S102
        elif lang == "bash":
            for argv in _commands(body):
                assert cli.main(argv) == 0, argv
        elif lang == "yaml":
            first, _, rest = body.partition("\n")
            name = first.removeprefix("# file:").strip()
            assert first.startswith("# file:") and name, "a yaml block names its file"
            Path(name).write_text(rest)
        else:
            raise AssertionError(f"block {n}: a code block must say its language (got {lang!r})")
    return namespace


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory; undo what ``cli.main`` sets (logging, TF env)."""
    monkeypatch.chdir(tmp_path)
    for name in ("TF_CPP_MIN_LOG_LEVEL", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    loggers = [logging.getLogger(), logging.getLogger("fieldhmc")]
    levels = [logger.level for logger in loggers]
    yield tmp_path
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


def test_guide_blocks_are_all_runnable_kinds():
    blocks = guide_blocks()
    assert [lang for lang, _ in blocks].count("python") >= 4
    assert any("fieldhmc run " in body for lang, body in blocks if lang == "bash")
    for lang, body in blocks:
        if lang == "bash":
            assert _commands(body)


def test_guide_until_the_first_run(workdir):
    """Fast: the files, the config, validate and the one-line error (no TensorFlow)."""
    blocks = guide_blocks()
    first_run = next(
        n for n, (lang, body) in enumerate(blocks) if lang == "bash" and "fieldhmc run" in body
    )
    namespace = run_blocks(blocks[:first_run])
    data = np.load("data.npy")
    assert data.shape == (24, 32, 40) and np.isnan(data[np.load("mask.npy") == 0]).all()
    assert namespace["status"] == 2


@pytest.mark.slow
def test_user_guide_end_to_end(workdir):
    """The masked own-data round trip: 24x32x40, NaN in masked voxels, a sigma map --
    validate, run, read the outputs, extend, workflow.run and the Sampler from Python."""
    namespace = run_blocks(guide_blocks())
    from fieldhmc.config import load_config

    run = Path("runs/my_field")
    assert load_config(run / "config.yaml").sampler.num_results == 28  # re-runnable
    with __import__("h5py").File(run / "fields.h5", "r") as f:
        assert f["draws"].shape[1:] == (2, 24, 32, 40)
    assert namespace["fields"].shape[1:] == (2, 24, 32, 40)
    assert (Path("runs/my_field_seed1") / "samples.nc").exists()


def test_memory_sink_without_field_draws_says_why():
    sink = MemorySink()
    with pytest.raises(ValueError, match="no traces"):
        sink.stacked_traces()
    sink.append({"lp": np.zeros((3, 2))})
    assert sink.stacked_traces()["lp"].shape == (3, 2)
    with pytest.raises(ValueError, match=r"FieldOutputs\(field_fn, power_fn, store_fields=True\)"):
        sink.stacked_fields()
