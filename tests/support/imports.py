"""The package's imports as the layout tests read them: from the source, wherever in a file."""

from __future__ import annotations

import ast
from pathlib import Path


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every repromatrix module ``path`` imports, wherever in the file the import is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from pkg import submodule` imports the submodule; `from mod import name`, mod.
            subs = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [s for s in subs if s in known] or [node.module]
        else:
            continue
        found.update(name for name in names if name in known)
    return found
