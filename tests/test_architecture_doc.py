"""docs/architecture.md names only files that exist (issue 29 item 5: it had drifted).

A path is a backquoted span with a ``/`` in it or a file name with a suffix: relative to
the repository, to ``client/`` (the SDK's package, ``herald/…``) or to ``docs/``; a bare
file name (``membership.py``, named in its package's section) must be a file somewhere in
the repository. Not paths: spans with a space, a placeholder (``<topic>``) or a wildcard,
etcd keys (``nodes/``: one name and a slash) and places outside the repository
(``../shared/…``). ``tests/cluster/checker.py::check_replicas`` names its file.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
_SPAN = re.compile(r"`([^`\n]+)`")
_FILE = re.compile(r"\.(py|md|toml|json|jsonl|js|html|css|txt)$")


def _paths(text: str) -> set[str]:
    paths: set[str] = set()
    for span in _SPAN.findall(text):
        path = span.split("::")[0]
        if any(c in path for c in " <>*{}…(") or path.startswith("../"):
            continue
        inner_slash = "/" in path.rstrip("/")
        if inner_slash or _FILE.search(path):
            paths.add(path)
    return paths


def _exists(path: str) -> bool:
    if any((base / path).exists() for base in (ROOT, ROOT / "client", ROOT / "docs")):
        return True
    if "/" not in path:
        folders = (d for d in ROOT.iterdir() if d.is_dir() and not d.name.startswith("."))
        return any(found.is_file() for folder in folders for found in folder.rglob(path))
    return False


def test_paths_are_found() -> None:
    text = (
        "`storage/topic.py`, `herald/protocol/limits.py`, `membership.py`, `nodes/`, `<data_dir>/x`"
    )
    assert _paths(text) == {"storage/topic.py", "herald/protocol/limits.py", "membership.py"}
    assert all(_exists(path) for path in _paths(text))
    assert not _exists("delivery/README")


def test_every_path_named_in_the_architecture_exists() -> None:
    missing = sorted(path for path in _paths(DOC.read_text(encoding="utf-8")) if not _exists(path))
    assert missing == []
