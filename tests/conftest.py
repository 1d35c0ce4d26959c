"""Suite-wide collection order: the longest test files first.

``make test`` runs two pytest workers that each take one whole file at a time (module
fixtures compile once). A long file collected last leaves one worker running it alone
at the end, so the files that take longest start first; every other file keeps
pytest's order. Serial runs are unaffected apart from the order.
"""

from __future__ import annotations

from pathlib import Path

#: Test files from the longest, as measured on the 2-core box (``--durations``);
#: a renamed or removed file here is ignored.
LONGEST_FIRST = (
    "test_workflow.py",
    "samplers/test_posterior.py",
    "samplers/test_nuts.py",
    "test_sweep.py",
    "ops/test_sharded.py",
    "samplers/test_driver.py",
    "samplers/test_kernels.py",
    "samplers/test_conditional_posterior.py",
    "samplers/test_sharded.py",
    "test_workflow_outputs.py",
    "test_scripts.py",
)


def pytest_collection_modifyitems(session, config, items):
    tests = Path(__file__).parent
    rank = {tests / name: i for i, name in enumerate(LONGEST_FIRST)}
    late = len(LONGEST_FIRST)
    # sorted() is stable: tests within a file, and the unlisted files, keep their order
    items[:] = sorted(items, key=lambda item: rank.get(Path(item.fspath), late))
