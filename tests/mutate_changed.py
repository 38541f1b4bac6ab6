"""`make mutate-changed`: mutmut only on the functions whose lines changed since a base.

The full mutation run (`make mutate`) takes hours on two cores; before they stop, developers
run the mutants of what they touched. mutmut 3 mutates functions and methods and names each
mutant after its function (`fleet_import.tenants.registry.x_load_registry__mutmut_3`,
`...registry.xǁTenantRegistryǁprefix_owners__mutmut_1`), and `mutmut run` takes globs of
those names: this script reads `git diff -U0` against the merge base with BASE (default
`origin/main`, else `main`; uncommitted changes count), finds the functions of the mutated
modules (pyproject's `[tool.mutmut] only_mutate`) whose lines changed, and runs
`mutmut run` on their globs only.

    .venv/bin/python -m tests.mutate_changed [--base REF] [--dry-run] [--max-children N]

Not a test module: pytest collects test_*.py files only (tests/test_mutate_changed.py).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
_BASES = ("origin/main", "main")


def changed_lines(diff: str) -> dict[str, set[int]]:
    """Path -> the new file's line numbers a `git diff -U0` adds or changes. A pure deletion
    marks the lines either side of it: the function it was cut from changed."""
    changed: dict[str, set[int]] = {}
    path: str | None = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            target = line[4:].strip()
            path = None if target == "/dev/null" else target.removeprefix("b/")
            continue
        hunk = _HUNK.match(line)
        if hunk is None or path is None:
            continue
        start = int(hunk.group(1))
        count = 1 if hunk.group(2) is None else int(hunk.group(2))
        lines = range(start, start + count) if count else (start, start + 1)
        changed.setdefault(path, set()).update(lines)
    return changed


def mutant_globs(module: str, source: str, lines: Iterable[int]) -> list[str]:
    """mutmut 3's name globs for the module-level functions and the methods of module-level
    classes (what it mutates; a nested function belongs to its enclosing one) that hold one
    of `lines`, decorators included."""
    wanted = set(lines)
    globs: list[str] = []

    def touched(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        return any(first <= line <= (node.end_lineno or node.lineno) for line in wanted)

    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and touched(node):
            globs.append(f"{module}.x_{node.name}__mutmut_*")
        elif isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef) and touched(member):
                    globs.append(f"{module}.x\u01c1{node.name}\u01c1{member.name}__mutmut_*")
    return globs


def module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def mutated_patterns(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """`only_mutate`: mutmut's own globs (fnmatch, so `*` crosses folders)."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return list(config["tool"]["mutmut"]["only_mutate"])


def is_mutated(path: str, patterns: Sequence[str]) -> bool:
    """A .py file that mutmut mutates: one of `only_mutate` matches it as mutmut matches."""
    return path.endswith(".py") and any(fnmatch.fnmatch(path, pattern) for pattern in patterns)


def default_base() -> str:
    for ref in _BASES:
        probe = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", ref], cwd=ROOT, capture_output=True
        )
        if probe.returncode == 0:
            return ref
    raise SystemExit(f"no base to diff against: none of {', '.join(_BASES)} exists; use --base")


def changed_globs(base: str) -> list[str]:
    merge_base = subprocess.run(
        ["git", "merge-base", base, "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    mutated = mutated_patterns()
    diff = subprocess.run(
        ["git", "diff", "-U0", "--no-color", "--no-ext-diff", merge_base, "--", "fleet_import"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    globs: list[str] = []
    for path, lines in sorted(changed_lines(diff).items()):
        if is_mutated(path, mutated) and (ROOT / path).is_file():
            source = (ROOT / path).read_text(encoding="utf-8")
            globs.extend(mutant_globs(module_name(path), source, lines))
    return globs


def survivors_of(results: str, globs: Sequence[str]) -> list[str]:
    """The lines of `mutmut results` (every mutant not killed, of every run kept in
    mutants/) whose mutant one of `globs` names: what the change left alive."""
    return [
        line.strip()
        for line in results.splitlines()
        if any(fnmatch.fnmatch(line.strip().split(":")[0], glob) for glob in globs)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the ref to diff against (default: origin/main, main)")
    parser.add_argument("--dry-run", action="store_true", help="print the globs, run nothing")
    parser.add_argument("--max-children", type=int, default=2, help="mutmut's parallel mutants")
    args = parser.parse_args(argv)
    globs = changed_globs(args.base or default_base())
    if not globs:
        print("no function of the mutated modules changed: no mutant to run")
        return 0
    print("\n".join(globs))
    if args.dry_run:
        return 0
    mutmut = Path(sys.executable).with_name("mutmut")
    run = subprocess.run(
        [str(mutmut), "run", "--max-children", str(args.max_children), *globs], cwd=ROOT
    )
    if run.returncode != 0:
        return run.returncode
    results = subprocess.run(
        [str(mutmut), "results"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    left = survivors_of(results, globs)
    print(f"{len(left)} mutants of the changed functions not killed (tests/README.md lists the")
    print("equivalent ones; `mutmut show NAME` prints one):")
    print("\n".join(left))
    return 0


if __name__ == "__main__":
    sys.exit(main())
