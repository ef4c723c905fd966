"""Validate: arguments against the tool's JSON schema, compiled once per tool.

Calls are checked with jsonschema-rs (compiled, ~100x faster than pure Python here);
the `jsonschema` package checks the schema itself at registration, serves schemas
jsonschema-rs cannot compile, and backs the lenient-array item checks. Draft 2020-12
unless the schema's `$schema` says otherwise.
"""

from __future__ import annotations

import functools
import json
import logging
from itertools import islice
from typing import Any

import jsonschema_rs
from jsonschema import exceptions as jsonschema_exceptions
from jsonschema import validators
from jsonschema.protocols import Validator

from toolbus.wire.errors import InvalidArguments
from toolbus.wire.untrusted import shown

log = logging.getLogger("toolbus.validate")

MAX_REPORTED_ERRORS = 20
# Keywords that make a sub-schema mean something only inside its document.
_CONTEXTUAL = ('"$ref"', '"$dynamicRef"', '"$recursiveRef"', '"$id"', '"$anchor"')


class CompiledSchema:
    """A tool's input schema, ready to check arguments; `None` parts mean not enforced."""

    __slots__ = ("_fast", "reference", "schema")

    def __init__(self, tool_name: str, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.reference: Validator | None = _reference(tool_name, schema)
        self._fast: Any = None
        if self.reference is not None:
            try:
                self._fast = jsonschema_rs.validator_for(schema)
            except Exception as exc:
                log.info("tool %s: schema served by the reference validator (%s)", tool_name, exc)

    @property
    def enforced(self) -> bool:
        return self.reference is not None

    def problems(self, instance: Any) -> list[dict[str, Any]]:
        """Every way the instance breaks the schema (at most 20), with paths; empty if valid."""
        if self._fast is not None:
            if self._fast.is_valid(instance):
                return []
            return [
                {
                    "path": _path(error.instance_path),
                    "problem": shown(error.message),
                    "expected": _expected(self.schema, list(error.schema_path)),
                }
                for error in islice(self._fast.iter_errors(instance), MAX_REPORTED_ERRORS)
            ]
        if self.reference is None:
            return []
        errors = sorted(self.reference.iter_errors(instance), key=lambda e: list(e.absolute_path))
        return [
            {
                "path": _path(error.absolute_path),
                "problem": shown(error.message),
                "expected": {str(error.validator): error.validator_value},
            }
            for error in errors[:MAX_REPORTED_ERRORS]
        ]


def standalone_check(part: dict[str, Any], root: dict[str, Any]) -> Any | None:
    """A compiled jsonschema-rs validator for `part` of the schema `root`, in root's
    draft, when `part` refers to nothing outside itself; else (or if it does not
    compile) None, and the reference validator alone judges."""
    try:
        text = json.dumps(part)
    except (TypeError, ValueError):
        return None
    if any(keyword in text for keyword in _CONTEXTUAL):
        return None
    if "$schema" in root and "$schema" not in part:
        part = {**part, "$schema": root["$schema"]}
    try:
        return jsonschema_rs.validator_for(part)
    except Exception:  # not compilable by jsonschema-rs: the reference validator decides
        return None


def _reference(tool_name: str, schema: dict[str, Any]) -> Validator | None:
    """A schema that is itself invalid is reported once and not enforced: the tool's own
    backend then remains the judge, as it would be without toolbus."""
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        problem = _known_schema_problem(json.dumps(schema, sort_keys=True))
    except (TypeError, ValueError):  # not JSON (a hand-made local schema): checked uncached
        problem = _schema_problem(schema)
    if problem is not None:
        log.warning("tool %s has an invalid input schema, not validating: %s", tool_name, problem)
        return None
    return cls(schema)


@functools.lru_cache(maxsize=4096)
def _known_schema_problem(schema_text: str) -> str | None:
    """`_schema_problem`, remembered by the schema's canonical text.

    The meta-schema check is pure Python (about 2.5 ms a tool); an MCP server re-lists
    the same tools on every reconnect and tool-list change, so each schema pays it once.
    """
    return _schema_problem(json.loads(schema_text))


def _schema_problem(schema: dict[str, Any]) -> str | None:
    """Why a schema breaks its meta-schema, or None."""
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema_exceptions.SchemaError as exc:
        return str(exc.message)
    return None


def _path(parts: Any) -> str:
    # Keys are the caller's: bounded and printable, as every echoed string.
    return shown("/".join(str(p) for p in parts)) or "(root)"


def _expected(schema: dict[str, Any], schema_path: list[Any]) -> dict[str, Any]:
    """The keyword that failed and its value in the schema (e.g. `{"enum": [...]}`)."""
    node: Any = schema
    for part in schema_path:
        if (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and part < len(node)
        ):
            node = node[part]
        else:
            return {str(schema_path[-1]) if schema_path else "schema": None}
    return {str(schema_path[-1]) if schema_path else "schema": node}


def check_arguments(tool_name: str, compiled: CompiledSchema, arguments: dict[str, Any]) -> None:
    problems = compiled.problems(arguments)
    if not problems:
        return
    raise InvalidArguments(
        f"arguments for {tool_name} do not match its schema: "
        + "; ".join(f"{p['path']}: {p['problem']}" for p in problems[:3]),
        errors=problems,
    )
