"""Configuration problems: why a configuration is refused, as data, one line each.

A `ConfigProblem` names where the value came from (a file, an environment variable,
a flag), the key as a dotted path (`tools.echo.timeout_s`), what was expected and what
was given, and, for a key that is not ours, the valid key it most resembles (difflib).
Values are shortened, and never shown for keys that may hold secrets (passwords,
tokens, an MCP server's `env` and `headers`, the broker URL with its credentials).
`ConfigError` carries every problem found; the command line prints one per line.
"""

from __future__ import annotations

import difflib
import json
import re
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from toolbus.wire.untrusted import printable

ProblemKind = Literal["unreadable", "unknown_key", "invalid_value", "unknown_variable"]

SIMILAR = 0.6  # difflib's own default: close enough to suggest
TYPO = 0.8  # close enough to be a misspelling, where a foreign key is otherwise allowed
GIVEN_MAX_CHARS = 40
# A key holding a secret, or a value that may carry one, is named but never shown.
_SECRET_WORDS = re.compile(r"pass|secret|token|key|auth|credential|cookie", re.IGNORECASE)
_SECRET_KEYS = frozenset({"broker_url", "dedup_store", "url", "env", "headers"})
# Wherever it sits, a value with a URL's user information (`scheme://user:pw@host`) is a
# credential: `dedup_store = "redis://:pw@..."`, an MCP server's `url`.
_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*@")


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One reason a configuration is refused (or, `fatal` False, only warned about).

    `source`: the file as given, `environment variable TOOLBUS_X`, a flag (`--broker`),
    or "" for the settings as a whole. `key`: the dotted path ("" for the whole).
    `suggestion`: the valid key meant, as a dotted path, for an unknown key.
    """

    kind: ProblemKind
    source: str
    key: str = ""
    expected: str = ""
    given: str | None = None
    suggestion: str | None = None
    line: int | None = None
    column: int | None = None
    fatal: bool = True

    def __str__(self) -> str:
        # One line, whatever a file's keys hold: its author chose them, and a terminal
        # would run their escape sequences (or a `\n` would forge a line of its own).
        return printable(self._text())

    def _text(self) -> str:
        hint = f"; did you mean `{self.suggestion}`?" if self.suggestion else ""
        where = f" in {self.source}" if self.source else ""
        if self.kind == "unknown_key":
            return f"unknown key `{self.key}`{where}{hint}"
        if self.kind == "unknown_variable":
            ignored = "" if self.fatal else " (ignored)"
            return f"environment variable `{self.key}` names no setting{ignored}{hint}"
        if self.kind == "unreadable":
            at = f", line {self.line}, column {self.column}" if self.line is not None else ""
            return f"{self.source}{at}: {self.expected}"
        given = f", given {self.given}" if self.given is not None else ""
        subject = f"`{self.key}`{where}: " if self.key else (f"{self.source}: " if where else "")
        return f"{subject}{self.expected}{given}"


class ConfigError(ValueError):
    """The configuration is refused; `problems` says why, each on its own line."""

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


def closest(name: str, valid: Iterable[str], cutoff: float = SIMILAR) -> str | None:
    """The valid name `name` most resembles, if any does (case aside)."""
    by_lower = {v.lower(): v for v in valid}
    found = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[found[0]] if found else None


def dotted(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc)


def is_secret(loc: Sequence[int | str]) -> bool:
    return any(
        isinstance(part, str) and (part in _SECRET_KEYS or _SECRET_WORDS.search(part))
        for part in loc
    )


def shorten(value: Any) -> str:
    """A value as the file would spell it, cut to `GIVEN_MAX_CHARS`."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= GIVEN_MAX_CHARS else text[: GIVEN_MAX_CHARS - 1] + "…"


def keys_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys valid at the level of `loc`'s last part, walking `model`'s fields
    (a `dict[str, X]` level is any key; a list level an index)."""
    annotation: Any = model
    for part in loc[:-1]:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = _field(annotation, str(part))
            if field is None:
                return []
            annotation = field
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
        elif get_origin(annotation) is list:
            annotation = get_args(annotation)[0]
        else:
            return []
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [f.alias or name for name, f in annotation.model_fields.items()]
    return []


def _field(model: type[BaseModel], key: str) -> Any:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field.annotation
    return None


def _unwrap(annotation: Any) -> Any:
    """`X | None` as `X`; anything else as it is."""
    if get_origin(annotation) in (Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return inner[0] if len(inner) == 1 else annotation
    return annotation


def problem_from_error(
    error: ErrorDetails, source: str, model: type[BaseModel], prefix: Sequence[str] = ()
) -> ConfigProblem:
    """One pydantic error as a problem (`prefix`: the loc of the validated model)."""
    loc = (*prefix, *error["loc"])
    key = dotted(loc)
    if error["type"] == "extra_forbidden":
        near = closest(str(loc[-1]), keys_at(model, loc))
        return ConfigProblem(
            "unknown_key", source, key, suggestion=dotted((*loc[:-1], near)) if near else None
        )
    shown = error.get("input") if loc and not is_secret(loc) else None
    if isinstance(shown, str) and _USERINFO.search(shown):
        shown = None
    return ConfigProblem(
        "invalid_value",
        source if loc else "",
        key,
        expected=expected(error),
        given=None if shown is None or isinstance(shown, dict) else shorten(shown),
    )


# What a value should have been, for the error types pydantic words around its internals.
_EXPECTED = {
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "bool_parsing": "expected true or false",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "missing": "a value is required",
}


# Bounds, worded from the error's context: (type, its context key, the wording).
_BOUNDS = (
    ("greater_than", "gt", "more than"),
    ("greater_than_equal", "ge", "at least"),
    ("less_than", "lt", "less than"),
    ("less_than_equal", "le", "at most"),
    ("literal_error", "expected", "one of"),
)


def expected(error: ErrorDetails) -> str:
    """Pydantic's reason in our words: no `Value error,`, no class names, no URL."""
    known = _EXPECTED.get(error["type"])
    if known is not None:
        return known
    context = error.get("ctx", {})
    for kind, key, words in _BOUNDS:
        if error["type"] == kind and key in context:
            bound = context[key]
            return f"expected {words} {f'{bound:g}' if isinstance(bound, float) else bound}"
    message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if message.startswith("Input should be "):
        return "expected " + message.removeprefix("Input should be ")
    return message
