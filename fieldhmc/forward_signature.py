"""The keywords a user's forward function accepts, read from its source without
importing it (the config checks ``model.forward.params`` before TensorFlow starts).

This module must not import TensorFlow, nor anything that does.
"""

from __future__ import annotations

import ast
import importlib.machinery
import sys
from pathlib import Path

__all__ = ["accepted_keywords", "find_module_file"]


def find_module_file(module: str) -> Path | None:
    """The source file of ``module`` (dotted) found on ``sys.path`` without importing
    anything (not even its parent packages); ``None`` if it cannot be located."""
    if module in sys.modules:
        found = getattr(sys.modules[module], "__file__", None)
        return Path(found) if found and found.endswith(".py") else None
    path = None
    spec = None
    for part in module.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and str(origin).endswith(".py") else None


def accepted_keywords(target: str) -> tuple[str, set[str]] | None:
    """``(signature text, keyword names)`` that the function ``target`` accepts after
    ``delta``, read from its source with :mod:`ast` (nothing is imported); ``None`` if
    it cannot be told (not found, not a plain ``def`` at module level, or ``**kwargs``)."""
    module, _, attr = target.partition(":")
    path = Path(module) if module.endswith(".py") else find_module_file(module)
    if path is None or "." in attr:
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    found = None
    for node in tree.body:  # the last definition at module level wins, as on import
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == attr:
            found = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.Import | ast.ImportFrom):
            targets = getattr(node, "targets", [getattr(node, "target", None)])
            names = [getattr(t, "id", None) for t in targets]
            names += [(a.asname or a.name) for a in getattr(node, "names", [])]
            if attr in names:  # rebound to something else: cannot tell
                found = None
    if found is None or found.decorator_list or found.args.kwarg is not None:
        return None
    args = found.args
    # the first positional parameter is delta; the rest and the keyword-only ones are
    # keywords (other positional-only ones are not)
    keywords = {a.arg for a in args.args[max(0, 1 - len(args.posonlyargs)) :]}
    keywords |= {a.arg for a in args.kwonlyargs}
    shown = ", ".join(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs)
    return f"{attr}({shown})", keywords
