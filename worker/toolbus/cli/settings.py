"""The settings a command runs with: flags > environment > files > defaults, and why they
were refused, as one line per problem."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    from toolbus.transport import BrokerRefused


def config_errors(exc: ValidationError) -> str:
    """Settings validated outside `load_settings`: each error as a `ConfigProblem`."""
    from toolbus.config import Settings
    from toolbus.config.problems import problem_from_error

    errors = exc.errors(include_url=False)
    return "; ".join(str(problem_from_error(e, "", Settings)) for e in errors)


def _settings(args: argparse.Namespace) -> Any:
    from toolbus.config import load_settings
    from toolbus.config.loading import environment_problems

    settings = load_settings(
        getattr(args, "config", None),
        getattr(args, "mcp_config", None),
        broker_url=getattr(args, "broker", None),
        processes=getattr(args, "processes", None),
    )
    for problem in environment_problems(os.environ):  # the fatal ones refused above
        print(f"toolbus: warning: {problem}", file=sys.stderr)
    return settings


def client_id(args: argparse.Namespace, settings: Any) -> str | None:
    """The MQTT client id of `call`, `tools` and `status`: `--client-id`, else the
    `client_id` setting (`TOOLBUS_CLIENT_ID`), else the login where the caller is the
    topic's (a broker binding logins to client ids, as the shipped dynamic security
    does, binds a caller's login to its own name), else None (random)."""
    given = getattr(args, "client_id", None) or settings.client_id
    if given:
        return str(given)
    if settings.caller_identity == "topic" and settings.broker.username:
        return str(settings.broker.username)
    return None


def refused(settings: Any, client_id: str, exc: BrokerRefused) -> str:
    """A refused login, with the client id it came with: a broker that binds logins to
    client ids refuses the right password on another id, and says only "not authorized"."""
    said = f"the broker at {settings.broker} refused us: {exc}"
    if exc.reason_code is None:
        return said  # a certificate or a TLS file: the client id has nothing to do with it
    login = settings.broker.username or "(none)"
    return (
        f"{said} (login {login}, client id {client_id}; --client-id or TOOLBUS_CLIENT_ID "
        "sets the client id)"
    )
