"""Envelope: our own request shape, and the options every shape carries.

The plain envelope `{id, tool, arguments, ...}` carries its options at its top level or
under `toolbus` (the same option in both places must agree); beside a provider's shape
they live only under `toolbus`, a name no provider uses. Either way they are checked
here, with the problems reported path by path and bounded.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from toolbus.wire.contracts import Options, Request
from toolbus.wire.errors import BadRequest
from toolbus.wire.untrusted import shown

# Bounds on what a refusal echoes back: a hostile body must not make a huge reply.
MAX_PATH_CHARS = 200
MAX_REPORTED_ERRORS = 20
MAX_SHOWN_KEYS = 20
# The envelope's own keys: any other key beside no `arguments` was meant as an argument.
ENVELOPE_KEYS = frozenset(Request.model_fields)


def request(body: dict[str, Any], *, list_tools: bool) -> Request:
    """The envelope, its `toolbus` options merged in."""
    if "arguments" not in body and not list_tools:
        _refuse_loose_arguments(body)
    try:
        envelope = Request.model_validate(body)
    except RecursionError:
        raise BadRequest("arguments are nested too deeply") from None
    except ValidationError as exc:
        raise BadRequest("request envelope is invalid", errors=_problems(exc)) from None
    return _merged(envelope)


def options(raw: object) -> Options:
    """A provider message's `toolbus` object."""
    if raw is None:
        return Options()
    try:
        return Options.model_validate(raw)
    except ValidationError as exc:
        raise BadRequest("the `toolbus` options are invalid", errors=_problems(exc)) from None


def _merged(envelope: Request) -> Request:
    """Options under `toolbus` join the top level's; the same option twice must agree."""
    nested = envelope.toolbus
    if nested is None:
        return envelope
    given = nested.model_dump(exclude_unset=True)
    clashes = [
        name
        for name, value in given.items()
        if name in envelope.model_fields_set and getattr(envelope, name) != value
    ]
    if clashes:
        raise BadRequest(
            "an option is given twice with different values",
            reason="conflicting_options",
            options=clashes,
        )
    return envelope.model_copy(update=given)


def _refuse_loose_arguments(body: dict[str, Any]) -> None:
    """`{"tool": "lamp", "level": 3}`: the caller meant `level` as an argument."""
    loose = [key for key in body if key not in ENVELOPE_KEYS]
    if loose:
        raise BadRequest(
            "put the tool's arguments under `arguments`",
            reason="arguments_not_nested",
            keys=[shown(key, MAX_PATH_CHARS) for key in loose[:MAX_SHOWN_KEYS]],
        )


def _problems(exc: ValidationError) -> list[dict[str, str]]:
    return [
        {"path": ".".join(str(p) for p in err["loc"])[:MAX_PATH_CHARS], "problem": err["msg"]}
        for err in exc.errors(include_url=False, include_input=False)[:MAX_REPORTED_ERRORS]
    ]
