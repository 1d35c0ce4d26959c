"""Size and coupling figures of the fieldhmc package, from its syntax trees.

Prints, for ``fieldhmc/`` (or ``--root``):

* lines per module (non-blank, non-comment), longest first, and how many exceed 600;
* functions over 60 lines (their full span, docstring included);
* the places a sampler-kind string (``hmc``, ``nuts``, ``fieldnuts``, ``chees``,
  ``mclmc``, ``mams``, ``snaper``) is compared: ``==``/``!=``/``in``/``not in`` with
  such a string, a tuple/list/set of them, or a constant holding them (a literal or
  the kind registry's ``names_where(...)``), on either side, and ``match`` cases;
  those inside the kind registry (``fieldhmc/samplers/kinds/``) are counted apart;
* import cycles between fieldhmc modules (module-level and function-level imports
  alike, since both tie the modules together).

Run it on two commits to compare::

    python scripts/code_metrics.py            # the table
    python scripts/code_metrics.py --json     # the same figures, machine-readable
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = frozenset({"hmc", "nuts", "fieldnuts", "chees", "mclmc", "mams", "snaper"})
LONG_MODULE = 600
LONG_FUNCTION = 60
REGISTRY = "samplers/kinds/"  # the kind registry, relative to the package root


def _code_lines(source: str) -> int:
    return sum(
        1 for line in source.splitlines() if line.strip() and not line.strip().startswith("#")
    )


def _is_kind_literal(node: ast.AST, names: frozenset[str] = frozenset()) -> bool:
    """A kind string, a collection holding one, ``frozenset(...)`` of one, or a name
    bound to one of these (``names``, collected over the package)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in KINDS
    if isinstance(node, ast.Tuple | ast.List | ast.Set) and node.elts:
        return any(_is_kind_literal(e, names) for e in node.elts)
    if (
        isinstance(node, ast.Call)
        and node.args
        and getattr(node.func, "id", "")
        in (
            "frozenset",
            "set",
            "tuple",
        )
    ):
        return _is_kind_literal(node.args[0], names)
    if isinstance(node, ast.Call) and "names_where" in (
        getattr(node.func, "id", ""),
        getattr(node.func, "attr", ""),
    ):
        return True  # kind names selected from the registry
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in names
    return False


def kind_constant_names(tree: ast.AST) -> set[str]:
    """UPPER_CASE names assigned a kind literal (``MICRO_KINDS = ("mclmc", "mams")``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            if _is_kind_literal(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out.update(t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper())
    return out


def _imported_names(tree: ast.AST, constants: dict[str, set[str]]) -> set[str]:
    """Kind constants another module defines and this one imports by name."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in constants:
            out.update(a.asname or a.name for a in node.names if a.name in constants[node.module])
    return out


def kind_comparisons(tree: ast.AST, names: frozenset[str] = frozenset()) -> list[int]:
    """Line numbers where a kind string (or a constant holding kind strings) is compared."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
                if any(_is_kind_literal(n, names) for n in (node.left, *node.comparators)):
                    lines.append(node.lineno)
        elif isinstance(node, ast.match_case):
            pattern = node.pattern
            values = [pattern] + list(getattr(pattern, "patterns", []))
            if any(isinstance(p, ast.MatchValue) and _is_kind_literal(p.value) for p in values):
                lines.append(pattern.lineno)
    return sorted(lines)


def long_functions(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            span = node.end_lineno - node.lineno + 1
            if span > LONG_FUNCTION:
                out.append((node.name, span))
    return out


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, module: str, is_package: bool, package: str) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith(package))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            if name.startswith(package):
                out.add(name)
                out.update(f"{name}.{a.name}" for a in node.names)
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def measure(root: Path) -> dict:
    package = root.name
    modules, functions, kinds, graph = {}, [], [], {}
    files = sorted(root.rglob("*.py"))
    names = {_module_name(p, root): p for p in files}
    trees = {p: ast.parse(p.read_text()) for p in files}
    defined = {_module_name(p, root): kind_constant_names(t) for p, t in trees.items()}
    constants = sorted({n for v in defined.values() for n in v})
    for path in files:
        source = path.read_text()
        tree = trees[path]
        name = _module_name(path, root)
        rel = str(path.relative_to(root.parent))
        modules[rel] = _code_lines(source)
        functions += [(rel, f, n) for f, n in long_functions(tree)]
        local = frozenset(defined[name] | _imported_names(tree, defined))
        kinds += [(rel, line) for line in kind_comparisons(tree, local)]
        # package imports (``from fieldhmc.models import grid``) resolve to the module if
        # it exists, else to the package: the edge is to what is really executed
        targets = {t for t in _imports(tree, name, path.name == "__init__.py", package)}
        graph[name] = {t for t in targets if t in names and t != name}
    # a package's __init__ importing its own submodules is not a cycle of design
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    return {
        "modules": dict(sorted(modules.items(), key=lambda kv: -kv[1])),
        "modules_over_600": sum(n > LONG_MODULE for n in modules.values()),
        "functions_over_60": sorted(functions, key=lambda t: -t[2]),
        "kind_constants": constants,
        "kind_comparisons": kinds,
        "kind_comparisons_outside_registry": [k for k in kinds if not _in_registry(k[0])],
        "import_cycles": import_cycles(graph),
    }


def _in_registry(rel: str) -> bool:
    return rel.split("/", 1)[-1].startswith(REGISTRY)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT / "fieldhmc")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--top", type=int, default=15, help="rows of the module table")
    args = parser.parse_args(argv)
    m = measure(args.root)
    if args.json:
        print(json.dumps(m, indent=1))
        return 0
    print(f"modules: {len(m['modules'])}, over {LONG_MODULE} code lines: {m['modules_over_600']}")
    for rel, n in list(m["modules"].items())[: args.top]:
        print(f"  {n:6d}  {rel}")
    print(f"functions over {LONG_FUNCTION} lines: {len(m['functions_over_60'])}")
    for rel, f, n in m["functions_over_60"][: args.top]:
        print(f"  {n:6d}  {rel}:{f}")
    by_file: dict[str, list[int]] = {}
    for rel, line in m["kind_comparisons"]:
        by_file.setdefault(rel, []).append(line)
    registry = sum(len(v) for rel, v in by_file.items() if _in_registry(rel))
    print(f"kind-string comparisons: {len(m['kind_comparisons'])} in {len(by_file)} modules")
    print(
        f"  outside the kind registry (fieldhmc/{REGISTRY}): "
        f"{len(m['kind_comparisons']) - registry}"
    )
    print(f"  (through the constants {', '.join(m['kind_constants']) or 'none'} too)")
    for rel, lines in sorted(by_file.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(lines):4d}  {rel}  (lines {', '.join(map(str, lines))})")
    print(f"import cycles: {len(m['import_cycles'])}")
    for cycle in m["import_cycles"]:
        print("  " + " <-> ".join(cycle))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
