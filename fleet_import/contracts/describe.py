"""Pydantic's validation errors, told to the person who edits the YAML that caused them.

Pydantic locates an error as a tuple (`('columns', 3, 'type')`) and words it for a Python
programmer ("Input should be a valid tuple"); whoever fixes a contract file needs the field
path as they see it (`columns[3].type`) and YAML's words.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

_EXPECTED = {
    "tuple_type": "expected a list",
    "list_type": "expected a list",
    "model_type": "expected a mapping of fields",
    "dict_type": "expected a mapping of fields",
    "bool_type": "expected true or false",
    "string_type": "expected text",
    "int_type": "expected a whole number",
}


def label(what: str, raw: object) -> str:
    """`datasets[1] (trips)`: where a definition sits, and its name when it has one."""
    name = raw.get("name") if isinstance(raw, Mapping) else None
    if not isinstance(name, str):
        return what
    return f"{what} ({name if name.isidentifier() else repr(name)})"


def describe(exc: ValidationError, model: type[BaseModel], where: str) -> str:
    """`where: field.path: problem` for each error, joined into one line."""
    problems = []
    for error in exc.errors(include_url=False):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        problem = _problem(error, _model_at(model, error["loc"]))
        problems.append(f"{where}: {path.lstrip('.') + ': ' if path else ''}{problem}")
    return "; ".join(problems)


def _problem(error: ErrorDetails, model: type[BaseModel]) -> str:
    kind = error["type"]
    if kind == "value_error":  # the model's own validators word theirs for the reader already
        return str(error.get("ctx", {}).get("error", error["msg"]))
    if kind == "missing":
        return "required, but missing"
    if kind == "extra_forbidden":
        known = list(model.model_fields)
        close = difflib.get_close_matches(str(error["loc"][-1]), known, n=1)
        if close:
            return f"unknown field (did you mean {close[0]!r}?)"
        return f"unknown field (one of {', '.join(known)})"
    return f"invalid value {error['input']!r} ({_EXPECTED.get(kind, error['msg'])})"


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The model that holds the field `loc` ends with, so an unknown key is compared with
    the keys that would have been right there."""
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        inner = [t for t in _types_in(field.annotation) if _is_model(t)] if field else []
        model = inner[0] if inner else model
    return model


def _types_in(annotation: Any) -> Iterator[Any]:
    yield annotation
    for arg in get_args(annotation):
        yield from _types_in(arg)


def _is_model(candidate: Any) -> bool:
    return isinstance(candidate, type) and issubclass(candidate, BaseModel)
