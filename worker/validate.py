"""Validate: arguments against the tool's JSON schema, with validators compiled once."""

from __future__ import annotations

import logging
from typing import Any

from jsonschema import exceptions as jsonschema_exceptions
from jsonschema import validators
from jsonschema.protocols import Validator

from worker.errors import InvalidArguments

log = logging.getLogger("toolbus.validate")

MAX_REPORTED_ERRORS = 20


def compile_validator(tool_name: str, schema: dict[str, Any]) -> Validator | None:
    """The validator for a schema (Draft 2020-12 unless `$schema` says otherwise).

    A schema that is itself invalid is reported once and not enforced: the tool's
    own backend then remains the judge, as it would be without toolbus.
    """
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema_exceptions.SchemaError as exc:
        log.warning(
            "tool %s has an invalid input schema, not validating: %s", tool_name, exc.message
        )
        return None
    return cls(schema)


def check_arguments(
    tool_name: str, validator: Validator | None, schema: dict[str, Any], arguments: dict[str, Any]
) -> None:
    if validator is None:
        return
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    problems: list[dict[str, Any]] = [
        {
            "path": "/".join(str(p) for p in error.absolute_path) or "(root)",
            "problem": error.message,
            "expected": {str(error.validator): error.validator_value},
        }
        for error in errors[:MAX_REPORTED_ERRORS]
    ]
    raise InvalidArguments(
        f"arguments for {tool_name} do not match its schema: "
        + "; ".join(f"{p['path']}: {p['problem']}" for p in problems[:3]),
        errors=problems,
        signature=signature(schema),
    )


def signature(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """A compact description of a tool's parameters, so a model can retry correctly."""
    required = set(schema.get("required", []))
    params = []
    for name, prop in (schema.get("properties") or {}).items():
        entry: dict[str, Any] = {"name": name, "required": name in required}
        if isinstance(prop, dict):
            if "type" in prop:
                entry["type"] = prop["type"]
            elif "anyOf" in prop:
                entry["type"] = [p.get("type") for p in prop["anyOf"] if isinstance(p, dict)]
            if "enum" in prop:
                entry["enum"] = prop["enum"]
        params.append(entry)
    return params
