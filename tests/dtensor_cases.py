"""``python -m tests.dtensor_cases``: every default-run DTensor case in one process.

Prints ``{"ops": ..., "samplers": ...}`` as one JSON line (see
``tests/ops/sharded_cases.py`` and ``tests/samplers/sharded_cases.py``).
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from fieldhmc.ops import sharded as sh
    from tests.ops import sharded_cases as ops_cases
    from tests.samplers import sharded_cases as sampler_cases

    sh.make_mesh(4)
    out = {"ops": ops_cases.results(), "samplers": sampler_cases.results(slow=False)}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
