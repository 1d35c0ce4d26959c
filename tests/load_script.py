"""Load one of the repository's scripts (``benchmarks/``, ``scripts/``) as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """The script at ``path`` (relative to the repository root, or absolute) executed as
    a fresh module named ``name`` (default: the file's stem) on every call."""
    path = Path(path)
    path = path if path.is_absolute() else ROOT / path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
