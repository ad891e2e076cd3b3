"""The modules of Herald's packages import each other without a circle.

Every import counts — at the top, inside a function, under ``TYPE_CHECKING``: a circle
hidden in a function is still two modules that cannot be read, tested or moved apart
(issue 25: ``cluster.etcd`` ↔ ``cluster.etcd_watch``). Read from the source with
:mod:`ast`; nothing is imported.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Each package's folder and the name its modules are imported under: the SDK's modules
# are `herald.*` (client/herald/), not `client.herald.*`.
PACKAGES = {
    "server": "server",
    "delivery": "delivery",
    "storage": "storage",
    "subscribers": "subscribers",
    "cluster": "cluster",
    "client/herald": "herald",
    "web_console": "web_console",
    "spark_bridge": "spark_bridge",
}
# client/herald/spark is a link to spark_bridge/: one package under two names.
ALIASES = {"herald.spark": "spark_bridge"}


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):  # rglob does not follow the link
            parts = (name, *path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _canonical(module: str) -> str:
    for alias, name in ALIASES.items():
        if module == alias or module.startswith(alias + "."):
            return name + module[len(alias) :]
    return module


def _absolute(node: ast.ImportFrom, importer: str, path: Path) -> str:
    """The module an import names, a relative one resolved against the importer's package."""
    if node.level == 0:
        return _canonical(node.module or "")
    package = importer.split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def _known(module: str, modules: dict[str, Path]) -> str | None:
    """The module itself, or the nearest package of ours that holds a name imported from it."""
    while module and module not in modules:
        module = module.rpartition(".")[0]
    return module or None


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(
                known
                for alias in node.names
                if (known := _known(_canonical(alias.name), modules)) is not None
            )
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, name, path)
            if (known := _known(module, modules)) is not None:
                found.add(known)
            for alias in node.names:  # `from cluster import etcd` names a module too
                if f"{module}.{alias.name}" in modules:
                    found.add(f"{module}.{alias.name}")
    found.discard(name)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_circles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


def test_no_module_imports_itself_through_others() -> None:
    modules = _modules()
    assert {"cluster.etcd", "herald.protocol", "spark_bridge.arrow"} <= modules.keys()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _circles(graph) == []


# --- the layering (docs/architecture.md, "Imports run …") ---------------------------------
#
# What each part may import of ours besides itself. The SDK counts as three parts: its
# bottom package herald.protocol (every layer may import it), herald.lifecycle (every layer
# that runs background work), and the rest of it, the client. Each part's ruff.toml bans
# the rest, so that an editor shows the error where it is typed; the test below holds
# those bans to this table.
MAY_IMPORT: dict[str, set[str]] = {
    "herald.protocol": set(),
    "herald.lifecycle": {"herald.protocol"},
    "herald": {"herald.protocol", "herald.lifecycle"},
    "storage": {"herald.protocol"},
    "delivery": {"storage", "herald.protocol", "herald.lifecycle"},
    "subscribers": {"delivery", "storage", "herald.protocol", "herald.lifecycle"},
    "cluster": {"storage", "herald.protocol", "herald.lifecycle"},
    "server": {
        "subscribers",
        "delivery",
        "storage",
        "cluster",
        "web_console",
        "herald",
        "herald.protocol",
        "herald.lifecycle",
    },
    "web_console": {"herald", "herald.protocol", "herald.lifecycle"},
    "spark_bridge": {"herald", "herald.protocol", "herald.lifecycle"},
}
RUFF_CONFIGS = {
    "herald.protocol": "client/herald/protocol/ruff.toml",
    "herald": "client/herald/ruff.toml",
    "storage": "storage/ruff.toml",
    "delivery": "delivery/ruff.toml",
    "subscribers": "subscribers/ruff.toml",
    "cluster": "cluster/ruff.toml",
    "server": "server/ruff.toml",
    "web_console": "web_console/ruff.toml",
    "spark_bridge": "spark_bridge/ruff.toml",
}


def _part(module: str) -> str:
    for part in ("herald.protocol", "herald.lifecycle"):
        if module == part or module.startswith(part + "."):
            return part
    return module.partition(".")[0]


def _names(part: str) -> set[str]:
    """The import names that reach ``part`` (the names a ban must list)."""
    if part == "spark_bridge":
        return {"spark_bridge", "herald.spark"}
    if part != "herald":
        return {part}
    sdk = ROOT / "client" / "herald"
    modules = {p.stem for p in sdk.glob("*.py")} | {
        p.name for p in sdk.iterdir() if (p / "__init__.py").is_file()
    }
    return {f"herald.{m}" for m in modules - {"__init__", "protocol", "lifecycle", "spark"}}


def test_no_package_imports_against_the_layering() -> None:
    modules = _modules()
    climbs = sorted(
        f"{name} imports {imported}"
        for name, path in modules.items()
        for imported in _imports(name, path, modules)
        if _part(imported) != _part(name) and _part(imported) not in MAY_IMPORT[_part(name)]
    )
    assert climbs == []


def test_each_part_bans_in_ruff_what_the_layering_forbids() -> None:
    for part, config in RUFF_CONFIGS.items():
        with (ROOT / config).open("rb") as file:
            banned = set(tomllib.load(file)["lint"]["flake8-tidy-imports"]["banned-api"])
        forbidden = set(MAY_IMPORT) - MAY_IMPORT[part] - {part}
        missing = {name for other in forbidden for name in _names(other)} - banned
        assert missing == set(), f"{config} lets {part} import {sorted(missing)}"
