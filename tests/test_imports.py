"""Each name is imported from the module that defines it: no module re-exports what it
imported (`from m import name`, `m.name` through an imported module, or `__all__`), so
following an import leads to the definition, never through a hub."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OURS = ("fleet_import", "flows", "fleet_cli", "blocks")
SCANNED = (*OURS, "tests", "benchmarks", "migrations")


def _module_file(name: str) -> Path | None:
    path = REPO.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _top_level(tree: ast.Module) -> Iterator[ast.AST]:
    """The module's own statements, those under a top-level `if`/`try`/`with` included."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If | ast.Try | ast.With):
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(node, field, []))
        if isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)


def _names_defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in _top_level(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


@cache
def _defined(module: str) -> frozenset[str]:
    """The names `module` defines (not those it imports)."""
    path = _module_file(module)
    assert path is not None
    return frozenset(_names_defined(ast.parse(path.read_text(encoding="utf-8"))))


def _defines(module: str, name: str) -> bool:
    """`module` defines `name`, or has it as a submodule (a dunder is every module's)."""
    return (
        name in _defined(module)
        or name.startswith("__")
        or _module_file(f"{module}.{name}") is not None
    )


def _imported_modules(tree: ast.Module) -> dict[str, str]:
    """Local name -> our module, for every module imported whole (`import a.b as m`,
    `from a import b`)."""
    modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name.startswith(OURS) and _module_file(alias.name):
                    modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if node.module.startswith(OURS) and _module_file(full):
                    modules[alias.asname or alias.name] = full
    return modules


def reexports(source: str, where: Path) -> list[str]:
    """Where the module at `where` (relative to the repository) takes a name from one of our
    modules that does not define it."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.split(".")[0] in OURS
            and _module_file(node.module)
        ):
            found += [
                f"{where}:{node.lineno}: {a.name} from {node.module}"
                for a in node.names
                if not _defines(node.module, a.name)
            ]
    # Tests reach through a module for what they patch there (`monkeypatch.setattr(m, ...)`).
    modules = _imported_modules(tree) if where.parts[0] in OURS else {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and not _defines(modules[node.value.id], node.attr)
        ):
            found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
    own = _names_defined(tree)
    for node in _top_level(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            listed = [e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)]
            found += [f"{where}: __all__ lists {n}" for n in listed if n not in own]
    return found


def test_every_name_is_imported_from_the_module_that_defines_it() -> None:
    files = [p for root in SCANNED for p in sorted((REPO / root).rglob("*.py"))]
    assert len(files) > 300
    wrong = [
        line
        for path in files
        for line in reexports(path.read_text(encoding="utf-8"), path.relative_to(REPO))
    ]
    assert not wrong, "taken from a module that does not define it:\n" + "\n".join(wrong)


def test_the_check_sees_each_way_of_reexporting() -> None:
    hub = (
        "from fleet_import.importing import driver as pipeline\n"
        "from fleet_import.warehouse.base import WarehouseError, WarehouseSession\n"
        "__all__ = ['WarehouseError', 'here']\n"
        "here = pipeline.Claimed, pipeline.import_batch\n"
    )
    assert sorted(reexports(hub, Path("flows/hub.py"))) == [
        "flows/hub.py: __all__ lists WarehouseError",
        "flows/hub.py:2: WarehouseError from fleet_import.warehouse.base",
        "flows/hub.py:4: pipeline.Claimed",
    ]
