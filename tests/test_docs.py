"""README.md and docs/*.md against the repository: every path, module and `fleet-import`
command they name exists, nothing points outside the repository, and the pages stay
readable (a short README, no table cell too long to read).

Docs drift silently: a module moves, a command is renamed, and a reader follows the page
into nothing. This reads the pages and the typer app only (no server, no subprocess), so it
runs with the fast tests.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])

README_MAX_LINES = 300
TABLE_CELL_MAX_CHARS = 300

TOP_DIRS = (
    "fleet_import", "fleet_cli", "flows", "blocks", "deployments", "migrations", "tests",
    "benchmarks", "docs", ".ci",
)  # fmt: skip
TOP_FILES = ("README.md", "prefect.yaml", "pyproject.toml", "Makefile", "alembic.ini")
PATH_EXTENSIONS = (
    ".py", ".md", ".sql", ".yaml", ".yml", ".json", ".service", ".toml", ".ini", ".mako",
)  # fmt: skip
MODULE_ROOTS = ("fleet_import", "fleet_cli", "flows", "blocks")
FORBIDDEN = ("../shared", "DESIGN.md", "NOTES.md", "STYLE.md")
OUTSIDE = re.compile(r"\bDESIGN\b|\.\./shared|\b(NOTES|STYLE)\.md\b")
"""In a source file: a `DESIGN` cited as a document, the shared notes (prose may say
"the design")."""
STORED_SPELLING = re.compile(
    r"""(["'`])normalis(e|ed)\1|normalise-progress|normalise/|-normalise-"""
)
"""What keeps the old spelling: it is stored or recorded (see test_normalize_has_one_spelling)."""

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
URL = re.compile(r"^[a-z][a-z0-9+.-]*://|^mailto:", re.IGNORECASE)
DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
LINE_SUFFIX = re.compile(r":\d+(-\d+)?$")
LEADING_PUNCTUATION = "(['\"`"
TRAILING_PUNCTUATION = ")],;:.!?'\"`"
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|^<.*>$|^\.\.\.$|^…$")


@dataclass(frozen=True)
class Mention:
    """Something a page names, and where, so a failure says which page and line."""

    doc: Path
    line: int
    text: str
    in_fence: bool = False

    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


# -- reading the pages -------------------------------------------------------------------------


def prose_and_fences(text: str) -> tuple[str, list[tuple[int, str]]]:
    """The page with its fenced blocks blanked (line numbers kept), and the fenced lines."""
    prose, fenced, inside = [], [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            inside = not inside
            prose.append("")
        elif inside:
            fenced.append((number, line))
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), fenced


def code_spans(doc: Path) -> Iterator[Mention]:
    """Inline code spans outside fenced blocks; a span may wrap within its paragraph."""
    prose, _ = prose_and_fences(doc.read_text("utf-8"))
    for paragraph in re.finditer(r"(?:[^\n]+\n?)+", prose):
        for span in CODE_SPAN.finditer(paragraph.group()):
            line = prose.count("\n", 0, paragraph.start() + span.start()) + 1
            yield Mention(doc, line, " ".join(span.group(2).split()))


def link_targets(doc: Path) -> Iterator[Mention]:
    prose, _ = prose_and_fences(doc.read_text("utf-8"))
    for match in LINK.finditer(prose):
        yield Mention(doc, prose.count("\n", 0, match.start()) + 1, match.group(1))


def fenced_lines(doc: Path) -> Iterator[Mention]:
    for number, line in prose_and_fences(doc.read_text("utf-8"))[1]:
        yield Mention(doc, number, line, in_fence=True)


def tokens(text: str) -> Iterator[str]:
    """A span's words without the prose around them: `(see tests/faults/).` -> the path. A
    leading dot stays (`.ci/run`), and so do braces, which mark a template."""
    for word in text.split():
        word = word.lstrip(LEADING_PUNCTUATION).rstrip(TRAILING_PUNCTUATION)
        if word:
            yield word


# -- paths ----------------------------------------------------------------------------------


def repo_path(token: str) -> str | None:
    """The repository path a code-span token names, or None when it names none (a URL, an S3
    key, a template such as `{tenant}/fleet/{yyyy-mm-dd}/`, `$TMPDIR/...`, `.fleet-demo/...`)."""
    if URL.match(token) or token.startswith(("$", "~", "/", ".venv", ".fleet-demo")):
        return None
    token = LINE_SUFFIX.sub("", token.split("#", 1)[0]).rstrip(",;:.)")
    if any(c in token for c in "{}<>$…") or "..." in token:
        return None
    if token in TOP_FILES:
        return token
    first, _, rest = token.partition("/")
    if first in TOP_DIRS and (rest or token.endswith("/")):
        return token
    return None


def path_problem(path: str, base: Path) -> str | None:
    """Why `path`, relative to `base`, is not in the repository; None when it is."""
    target = (base / path.rstrip("/")).resolve()
    if not target.is_relative_to(REPO):
        return "points outside the repository"
    if "*" in path:
        matches = list(base.glob(path))
        return None if matches else "matches no file"
    if not target.exists():
        return "does not exist"
    if path.endswith("/") and not target.is_dir():
        return "is not a directory"
    return None


def named_paths() -> Iterator[tuple[Mention, str, Path]]:
    """Every (mention, path, base) the pages name: code-span paths are relative to the
    repository, link targets to the page that holds them."""
    for doc in DOCS:
        for span in code_spans(doc):
            for token in tokens(span.text):
                path = repo_path(token)
                if path is not None:
                    yield span, path, REPO
        for link in link_targets(doc):
            target = link.text.split("#", 1)[0]
            if target and not URL.match(target):
                yield link, LINE_SUFFIX.sub("", target), doc.parent


def test_every_named_path_exists() -> None:
    checked = list(named_paths())
    missing = [
        f"{m.where()}: `{path}` {problem}"
        for m, path, base in checked
        if (problem := path_problem(path, base)) is not None
    ]
    assert len(checked) > 50, f"the path check found only {len(checked)} paths"
    assert not missing, f"of {len(checked)} paths named, these are wrong:\n" + "\n".join(missing)


def test_the_path_check_knows_a_path() -> None:
    """The check itself: what counts as a repository path, and a wrong one is caught."""
    not_paths = ["s3://fleet-landing/acme/", "{tenant}/fleet/{yyyy-mm-dd}/", "$TMPDIR/x"]
    not_paths += [".fleet-demo/pgdata", "https://example.com/a.md", "importing.driver", "acme"]
    for token in not_paths:
        assert repo_path(token) is None, token
    assert repo_path("fleet_import/importing/driver.py:12") == "fleet_import/importing/driver.py"
    assert repo_path("docs/faults.md#prefect-api") == "docs/faults.md"
    assert [repo_path(t) for t in tokens("(see .ci/run, tests/faults/).")] == [
        None, ".ci/run", "tests/faults/",
    ]  # fmt: skip
    assert path_problem("tests/faults/", REPO) is None
    assert path_problem("tests/test_docs.py/", REPO) == "is not a directory"
    assert path_problem("tests/no_such_file.py", REPO) == "does not exist"
    assert path_problem("../../elsewhere.md", REPO / "docs") == "points outside the repository"


def heading_anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to '-'."""
    prose, _ = prose_and_fences(doc.read_text("utf-8"))
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", prose, re.MULTILINE):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_every_linked_anchor_exists() -> None:
    wrong = []
    for doc in DOCS:
        for link in link_targets(doc):
            target, _, anchor = link.text.partition("#")
            if not anchor or URL.match(target):
                continue
            page = (doc.parent / target).resolve() if target else doc
            if page.suffix == ".md" and page.is_file() and anchor not in heading_anchors(page):
                wrong.append(f"{link.where()}: `{link.text}`: no heading with that anchor")
    assert not wrong, "\n".join(wrong)


# -- modules --------------------------------------------------------------------------------


CORE_PARTS = frozenset(
    p.stem for p in (REPO / "fleet_import").iterdir() if p.suffix == ".py" or p.is_dir()
) - {"__init__", "__pycache__"}


def dotted_names() -> Iterator[tuple[Mention, str]]:
    """Dotted module names: any `fleet_import.`, `fleet_cli.`, `flows.` or `blocks.` token,
    and a span that is only a dotted name inside the core (`importing.driver`)."""
    for doc in DOCS:
        for span in code_spans(doc):
            words = list(tokens(span.text))
            for word in words:
                name = word.removesuffix("()")
                if not DOTTED.match(name) or name.endswith(PATH_EXTENSIONS):
                    continue
                root = name.split(".", 1)[0]
                if root in MODULE_ROOTS:
                    yield span, name
                elif len(words) == 1 and root in CORE_PARTS:
                    yield span, "fleet_import." + name


def resolves(name: str) -> bool:
    """A module, or an attribute (a class, a function, a class's method) of one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_named_module_resolves() -> None:
    checked = list(dotted_names())
    wrong = [f"{m.where()}: `{name}` does not resolve" for m, name in checked if not resolves(name)]
    assert len(checked) > 20, f"the module check found only {len(checked)} names"
    assert not wrong, f"of {len(checked)} module names, these are wrong:\n" + "\n".join(wrong)


# -- commands -------------------------------------------------------------------------------


def fleet_import_commands(top_commands: Iterable[str]) -> Iterator[Mention]:
    """Each `fleet-import ...` a code span or a fenced line names, up to the end of the span
    or line (a fenced line's `# comment` left out); and a span that starts with a command's
    name and says more (`batches approve BATCH_ID`, `run --no-guard`), as prose shortens it."""
    top = set(top_commands)
    for doc in DOCS:
        sources = [*code_spans(doc), *fenced_lines(doc)]
        for source in sources:
            words = source.text.split()
            if not source.in_fence and len(words) > 1 and words[0] in top:
                yield Mention(source.doc, source.line, "fleet-import " + source.text)
            texts = [source.text]
            if source.in_fence:  # a shell line, or a message whose code spans name commands
                line = source.text.split(" #", 1)[0]
                texts = [m.group(2) for m in CODE_SPAN.finditer(line)] if "`" in line else [line]
            for text in texts:
                words = text.split()
                for i, word in enumerate(words):
                    if word.strip("(") in ("fleet-import", ".venv/bin/fleet-import"):
                        yield Mention(source.doc, source.line, " ".join(words[i:]))


def options_of(command: Any) -> set[str]:
    names = {"--help"}
    for param in command.params:
        names.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("-"))
    return names


def command_problem(words: list[str], root: Any) -> str | None:
    """Why these words after `fleet-import` name no command or option; None when they do."""
    command, path, depth = root, "fleet-import", 0
    for raw in words[1:]:
        if raw in ("|", "||", "&&", ";") and depth == 0:
            break  # a shell pipe or list: the command ended
        depth += raw.count("[") - raw.count("]")
        word = raw.strip("[](),;:`'\"")
        if not word or word == "|":
            continue
        if word.startswith("-"):
            for option in word.split("|"):
                option = option.split("=", 1)[0]
                if option.startswith("-") and option not in options_of(command):
                    return f"`{option}` is not an option of `{path}`"
            continue
        subcommands = getattr(command, "commands", None)
        if not subcommands:
            continue  # an argument, or an option's value, of a leaf command
        if PLACEHOLDER.match(word):
            return None  # `fleet-import COMMAND --help`: nothing more to check
        for name in word.split("|"):
            if name not in subcommands:
                return f"`{name}` is not a command of `{path}`"
        command, path = subcommands[word.split("|")[0]], f"{path} {word.split('|')[0]}"
    return None


@pytest.fixture(scope="module")
def cli() -> Any:
    from fleet_cli.cli import app

    return typer.main.get_command(app)


def test_every_named_command_exists(cli: Any) -> None:
    checked = list(fleet_import_commands(cli.commands))
    wrong = [
        f"{m.where()}: `{m.text}`: {problem}"
        for m in checked
        if (problem := command_problem(m.text.split(), cli)) is not None
    ]
    assert len(checked) > 20, f"the command check found only {len(checked)} commands"
    assert not wrong, f"of {len(checked)} commands named, these are wrong:\n" + "\n".join(wrong)


def test_the_command_check_knows_right_from_wrong(cli: Any) -> None:
    """The check itself: a wrong command or option is caught, placeholders are not."""
    ok = ["fleet-import batches show BATCH_ID --json", "fleet-import tenants list|show TENANT"]
    ok += ["fleet-import tables migrate [--tenant T | --database D] [--apply]"]
    ok += ["fleet-import batches list --json | jq -r .", "fleet-import"]
    for words in ok:
        assert command_problem(words.split(), cli) is None, words
    for words in ["fleet-import batch list", "fleet-import run --tenants a", "fleet-import db up"]:
        assert command_problem(words.split(), cli) is not None, words


# -- what the pages may say, and how ---------------------------------------------------------


def test_nothing_refers_outside_the_repository() -> None:
    found = [
        f"{doc.relative_to(REPO)}:{n}: {bad}"
        for doc in DOCS
        for n, line in enumerate(doc.read_text("utf-8").splitlines(), start=1)
        for bad in FORBIDDEN
        if bad.lower() in line.lower()
    ]
    assert not found, "\n".join(found)


def source_files() -> list[Path]:
    """Every file of the repository a reader opens (code, SQL, settings, pages), this one
    left out: it names what it looks for."""
    return [
        path
        for top in TOP_DIRS
        for path in sorted((REPO / top).rglob("*"))
        if path.suffix in PATH_EXTENSIONS and path.is_file() and path != Path(__file__)
    ] + [REPO / name for name in TOP_FILES]


def test_no_source_refers_outside_the_repository() -> None:
    """Docstrings and comments state their rule; none points at a page the repository does
    not have (a `DESIGN` section, the shared notes)."""
    sources = source_files()
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()[:80]}"
        for path in sources
        for n, line in enumerate(path.read_text("utf-8").splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert len(sources) > 300
    assert not found, "\n".join(found)


def test_normalize_has_one_spelling() -> None:
    """The package is `normalize`: names and prose spell it so. Only what is stored or
    recorded keeps "normalise": the batch phase `"normalised"`, the step and task name
    `"normalise"` (a fault cell's id names it too) and the artifact key."""
    sources = source_files()
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()[:80]}"
        for path in sources
        for n, line in enumerate(path.read_text("utf-8").splitlines(), start=1)
        if "normalis" in STORED_SPELLING.sub("", line).lower()
    ]
    assert not found, "\n".join(found)


def test_the_readme_is_short() -> None:
    lines = len((REPO / "README.md").read_text("utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def table_cells(doc: Path) -> Iterator[tuple[int, str]]:
    prose, _ = prose_and_fences(doc.read_text("utf-8"))
    for number, line in enumerate(prose.splitlines(), start=1):
        if line.lstrip().startswith("|"):
            for cell in re.split(r"(?<!\\)\|", line.strip().strip("|")):
                yield number, cell.strip()


def test_no_table_cell_is_too_long() -> None:
    long = [
        f"{doc.relative_to(REPO)}:{n}: a cell of {len(cell)} characters: {cell[:60]}..."
        for doc in DOCS
        for n, cell in table_cells(doc)
        if len(cell) > TABLE_CELL_MAX_CHARS
    ]
    assert not long, f"cells over {TABLE_CELL_MAX_CHARS} characters:\n" + "\n".join(long)


def test_every_setting_is_in_the_configuration_page() -> None:
    """docs/configuration.md lists every setting the core reads, by its variable."""
    from fleet_import.config import Settings

    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [name for name in Settings.model_fields if f"FLEET_{name.upper()}" not in page]
    assert not missing, f"settings docs/configuration.md does not name: {missing}"
