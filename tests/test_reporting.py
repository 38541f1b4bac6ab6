"""flows/reporting.py without a Prefect API: the exit code of each final state, the state
messages, and markdown artifacts that data cannot reshape."""

from __future__ import annotations

import datetime as dt
import uuid
from types import SimpleNamespace
from typing import Any

import click
import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token
from prefect.states import Cancelled, Completed, Crashed, Failed, Running, State

from fleet_import.importing import context
from fleet_import.store.details import FailureKind
from flows import reporting
from flows.reporting import EXIT_CODES, ExitCode, escape_markdown, exit_code_for, state_for
from tests.helpers import stored_batch

BATCH = uuid.UUID("00000000-0000-4000-8000-000000000001")
HOSTILE = ["[/bold]", "[/red]", "trips [bold]x.csv", "a|b", "two\nlines", "`x`", "# h", "<b>"]


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (Completed(), 0),
        (Failed(), 1),
        (Crashed(), 1),
        (Failed(name="NotResumable"), 1),
        (Completed(name="Skipped"), 3),
        (Completed(name="NotClaimed"), 3),
        (Completed(name="Committed"), 4),
        (Completed(name="AlreadyLoaded"), 5),
        # Failed states a script must tell from a failure: review, unknown, refusal.
        (Failed(name="Held"), 6),
        (Failed(name="CommitUnknown"), 7),
        (Failed(name="Refused"), 9),
        # Not in the table: never a success.
        (Completed(name="SomethingNew"), 1),
        (Cancelled(), 1),
        (Running(), 1),
        (Failed(name="Completed"), 1),
    ],
    ids=lambda value: value.name if isinstance(value, State) else str(value),
)
def test_exit_code_of_each_final_state(state: State, code: int) -> None:
    assert exit_code_for(state) == code


def test_no_state_takes_the_usage_error_code() -> None:
    assert ExitCode.USAGE_ERROR == click.UsageError.exit_code == 2
    assert ExitCode.USAGE_ERROR not in EXIT_CODES.values()


OUTCOMES: list[Any] = [
    context.Committed(BATCH, "fleet_s3:s3://b/a/", {"trips": 3}, {}, published=True),
    context.Committed(BATCH, "fleet_s3:s3://b/a/", {"trips": 3}, {}),
    context.Failed(BATCH, FailureKind.FAILED_PRE_COMMIT, "trips.csv: bad"),
    context.NotClaimed(BATCH, "worker-2", dt.datetime.now(dt.UTC)),
    context.Skipped("fleet_s3:s3://b/a/", BATCH),
    context.NothingToDo(BATCH, "succeeded"),
    context.AlreadyLoaded("fleet_s3:s3://b/a/", BATCH),
]


@pytest.mark.parametrize("outcome", OUTCOMES, ids=lambda o: type(o).__name__)
def test_every_state_the_flows_return_has_an_exit_code(outcome: Any) -> None:
    assert state_for(outcome).name in EXIT_CODES


def test_committed_says_the_batch_still_runs_and_what_publishes_it() -> None:
    state = state_for(OUTCOMES[1])
    assert exit_code_for(state) == ExitCode.PUBLICATION_PENDING
    assert "still running" in state.message and "publication is pending" in state.message
    assert "drain-publications" in state.message
    assert f"fleet-import resume {BATCH}" in state.message


# -- markdown ----------------------------------------------------------------------------------

_MARKDOWN = MarkdownIt("commonmark").enable("table")
_NEWLINE = " \u21b5 "  # how escape_markdown shows a line break


def _plain_text(inline: Token) -> str:
    """The text of an inline token that markdown reads as plain text (no link, code, HTML,
    emphasis or line break)."""
    children = inline.children or []
    assert {child.type for child in children} <= {"text", "text_special"}, children
    return "".join(child.content for child in children)


def _table_rows(markdown: str) -> list[list[str]]:
    """The body rows of the markdown's first table, as the plain text of each cell."""
    rows: list[list[str]] = []
    in_body = False
    for token in _MARKDOWN.parse(markdown):
        if token.type == "tbody_open":
            in_body = True
        elif token.type == "tr_open" and in_body:
            rows.append([])
        elif token.type == "inline" and in_body:
            rows[-1].append(_plain_text(token))
    return rows


def _paragraph(markdown: str) -> str:
    """The plain text of markdown that must read as one paragraph."""
    tokens = _MARKDOWN.parse(markdown)
    assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"], tokens
    return _plain_text(tokens[1])


def test_a_pipe_and_a_newline_stay_in_their_cell() -> None:
    cell = escape_markdown("a|b\nc")
    assert "\n" not in cell
    rows = _table_rows(f"| x | y |\n| --- | --- |\n| {cell} | 2 |\n")
    assert rows == [[f"a|b{_NEWLINE}c", "2"]]


@pytest.mark.parametrize("value", [*HOSTILE, "ends in \\", "\\|", "1. item", "- item", "&lt;"])
def test_escaped_text_renders_as_itself(value: str) -> None:
    shown = value.replace("\n", _NEWLINE)
    assert _table_rows(f"| x |\n| --- |\n| {escape_markdown(value)} |\n") == [[shown]]
    assert _paragraph(escape_markdown(value)) == shown


def test_artifacts_show_hostile_rejects_and_failure_verbatim(monkeypatch) -> None:
    markdown: dict[str, str] = {}
    monkeypatch.setattr(reporting, "create_table_artifact", lambda *a, **k: None)
    monkeypatch.setattr(
        reporting,
        "create_markdown_artifact",
        lambda text, key, **_: markdown.__setitem__(key, text),
    )
    sample = [
        {"file": name, "line": 2, "column": "[/bold]", "reason": "a|b\nc", "value": name}
        for name in HOSTILE
    ]
    batch = stored_batch(
        "failed",
        {
            "rejects": {"count": len(sample), "uri": "s3://stage/`x`/", "sample": sample},
            "failure": {"kind": "failed_pre_commit", "error": "trips [bold]x.csv: [/red]\n# h"},
        },
    )
    ctx = SimpleNamespace(repo=SimpleNamespace(get=lambda _: batch), gates=None)
    rt = SimpleNamespace(ctx=ctx)
    reporting.publish_artifacts(rt, BATCH)  # type: ignore[arg-type]

    rows = _table_rows(markdown["batch-rejects"])
    one_line = [name.replace("\n", _NEWLINE) for name in HOSTILE]
    assert rows == [[name, "2", "[/bold]", f"a|b{_NEWLINE}c", name] for name in one_line]
    heading, body = markdown["batch-failure"].split("\n\n")
    assert heading == f"# batch {BATCH} failed (failed\\_pre\\_commit)"
    assert _paragraph(body) == f"trips [bold]x.csv: [/red]{_NEWLINE}# h"


def test_the_resume_hint_follows_the_outcome_not_its_text() -> None:
    """An S3 `ExpiredToken` in a failed step's error leaves the batch resumable; an expired
    publication is not, whatever its message says."""
    resumable = context.Failed(
        BATCH, FailureKind.FAILED_PUBLICATION, "notify: ExpiredToken", resumable=True
    )
    assert f"resumable: fleet-import resume {BATCH}" in state_for(resumable).message
    # ... and the way in for someone in the UI rather than a shell.
    assert f"resume-publication deployment with batch_id={BATCH}" in state_for(resumable).message
    expired = context.Failed(BATCH, FailureKind.FAILED_PUBLICATION, "a newer batch", expired=True)
    assert "resumable" not in state_for(expired).message


def test_already_loaded_names_the_owner_and_has_its_own_code() -> None:
    state = state_for(context.AlreadyLoaded("fleet_s3:s3://b/a/", BATCH))
    assert state.name == "AlreadyLoaded" and str(BATCH) in state.message
    assert exit_code_for(state) == ExitCode.ALREADY_LOADED == 5


# -- a batch's story ---------------------------------------------------------------------------


def _batch(status: str, **details: Any) -> Any:
    return stored_batch(status, details, id=BATCH)


@pytest.mark.parametrize(
    ("status", "details", "shown"),
    [
        ("running", {}, "running"),
        ("running", {"redshift_committed": True}, "committed"),  # stored before the rename
        ("running", {"warehouse_committed": True}, "committed"),
        ("running", {"redshift_committed": True, "resumes": 1}, "committed (resumed)"),
        ("succeeded", {}, "succeeded"),
        ("succeeded", {"resumes": 2}, "succeeded (resumed)"),
        (
            "failed",
            {"failure": {"kind": "failed_publication", "error": "x"}},
            "failed (failed_publication)",
        ),
        ("failed", {"superseded_by": str(uuid.uuid4()), "failure": {"kind": "k"}}, "superseded"),
        ("failed", {"publication_expired": True}, "expired"),
    ],
)
def test_a_batch_story_names_what_the_batch_is_now(status, details, shown) -> None:
    from fleet_import.store.batch_state import shown_status

    assert shown_status(_batch(status, **details)) == shown


def test_story_keys_are_valid_artifact_keys() -> None:
    from prefect.client.schemas.actions import ArtifactCreate

    from flows.story import story_key, tenant_key

    assert tenant_key("acme_eu") == "tenant-acme-eu-batches"
    for key in (story_key(BATCH), tenant_key("acme_eu")):
        assert ArtifactCreate(key=key).key == key  # Prefect validates the key


def test_the_story_shows_a_failure_verbatim_and_links_the_runs(monkeypatch) -> None:
    from flows import story

    made, resumed = uuid.uuid4(), uuid.uuid4()
    monkeypatch.setattr(story, "_this_run", lambda: {resumed})
    batch = _batch(
        "succeeded",
        flow_run_id=str(made),
        resumes=1,
        row_counts={"trips": 1200},
        last_failure={"kind": "failed_publication", "error": "trips [bold]x|y\n# h"},
    )
    markdown = story.story_markdown(batch, {made: "import/acme/2026-07-22", resumed: "resume/x"})
    assert markdown.startswith(f"# batch {BATCH}: succeeded (resumed)\n")
    assert f"- **made by**: [import/acme/2026-07-22](/runs/flow-run/{made})" in markdown
    assert f"- **succeeded (resumed) by**: [resume/x](/runs/flow-run/{resumed})" in markdown
    assert "- **rows**: 1,200 trips" in markdown
    (failure,) = [line for line in markdown.splitlines() if "failure before the resume" in line]
    assert (
        _paragraph(failure.split(": ", 1)[1]) == f"failed_publication: trips [bold]x|y{_NEWLINE}# h"
    )


def test_a_takeover_that_published_the_abandoned_batch_says_so_in_its_final_line() -> None:
    """Exit 5 either way; the line must not read as though nothing happened."""
    plain = state_for(context.AlreadyLoaded("fleet_s3:s3://b/a/", BATCH))
    took_over = state_for(
        context.AlreadyLoaded("fleet_s3:s3://b/a/", BATCH, finished_abandoned=True)
    )
    assert exit_code_for(took_over) == exit_code_for(plain) == 5
    assert f"took over abandoned batch {BATCH}" in took_over.message
    assert "published it" in took_over.message
    assert "took over" not in plain.message
