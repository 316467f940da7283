"""The environment variables a matrix (per lane, per GPU entry) and a scenario set for cells.

Each name and value passes a grammar when the file loads, so neither can become
shell, a YAML tag or template code wherever it goes (the harness spec's JSON, the
launched process's environment), and no secret is among them: a cell is given
none. A refused value is never repeated in the error (it may be a secret).
"""

from __future__ import annotations

from collections.abc import Callable

from repromatrix.grammars import check_env_name, check_env_value
from repromatrix.matrix.yamlsrc import Reader, YMap, YNode


def read_env(
    node: YNode | None,
    what: str,
    reader: Reader,
    check_name: Callable[[str], str | None] = check_env_name,
) -> dict[str, str]:
    """Variables by name (text or numbers), each name by ``check_name`` and each value by
    ``check_env_value``; a refused one is left out, its problem at its key or value."""
    if node is None:
        return {}
    env = reader.strings(node, what) or {}
    entries = {entry.key: entry for entry in node} if isinstance(node, YMap) else {}
    for name in list(env):
        entry = entries.get(name)
        if (why := check_name(name)) is not None:
            reader.error(
                entry.where if entry else node.where, f"{what} name {name!r} is refused: {why}"
            )
            del env[name]
        elif (why := check_env_value(env[name])) is not None:
            where = entry.value.where if entry else node.where
            reader.error(where, f"{what} `{name}`: its value is refused: {why}")
            del env[name]
    return env
