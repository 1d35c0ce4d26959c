"""While-loop nesting of instructions in XLA's optimized HLO text (for tests that check
what runs inside a loop of zero or one trips and what was hoisted out of it)."""

from __future__ import annotations

import re

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_CALLEE = re.compile(
    r"(condition|body|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


def while_depths(hlo: str, pattern: str) -> list[int]:
    """For each instruction line matching the regex ``pattern``: the number of while
    bodies between ``ENTRY`` and the computation it sits in (0: the entry itself)."""
    computations: dict[str, list[str]] = {}
    entry, name = None, None
    for line in hlo.splitlines():
        m = _COMPUTATION.match(line)
        if m and not line.startswith(" "):
            name = m.group(1)
            computations[name] = []
            if line.startswith("ENTRY"):
                entry = name
        elif name is not None and line.startswith(" "):
            computations[name].append(line)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    depth = {entry: 0}
    todo = [entry]
    while todo:
        comp = todo.pop()
        for line in computations[comp]:
            callees = [(k, c) for k, c in _CALLEE.findall(line)]
            for branches in _BRANCHES.findall(line):
                callees += [("branch", c.strip().lstrip("%")) for c in branches.split(",")]
            for kind, callee in callees:
                d = depth[comp] + (kind == "body")
                if callee in computations and depth.get(callee, -1) < d:
                    depth[callee] = d
                    todo.append(callee)
    rx = re.compile(pattern)
    return [
        depth[comp]
        for comp, lines in computations.items()
        if comp in depth
        for line in lines
        if rx.search(line)
    ]
