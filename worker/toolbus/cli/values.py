"""What the user typed on `toolbus call`, read as the call's arguments.

httpie's convention: `key=value` is the text `value`, always (`text=true` sends
`"true"`, `n=5` sends `"5"`; the worker's normalization turns text into the number or
boolean a schema asks for); `key:=JSON` is the JSON value (`n:=5`, `on:=true`,
`tags:='["a"]'`). `--json` takes a whole object. JSON that has no JSON form of its own
is refused as a usage error naming the pair or the flag: `NaN`, `Infinity` and numbers
too large for a double (`1e400`) would be sent as invalid JSON, or as a different number.

Light on purpose: argparse calls these while `toolbus` builds its parser, for every
command.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def pair(text: str) -> tuple[str, Any]:
    """`key=value` -> (key, "value"); `key:=JSON` -> (key, the JSON value)."""
    key, sep, value = text.partition("=")
    if not sep or not key or key == ":":
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value or key:=JSON")
    if not key.endswith(":"):
        return key, value
    try:
        return key[:-1], strict_json(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def json_object(text: str) -> dict[str, Any]:
    """`--json`'s value: a JSON object."""
    try:
        loaded = strict_json(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not isinstance(loaded, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return loaded


def arguments(pairs: list[tuple[str, Any]], json_args: dict[str, Any] | None) -> dict[str, Any]:
    """The call's arguments: `--json`'s object, then each pair over it."""
    return {**(json_args or {}), **dict(pairs)}


def strict_json(text: str) -> Any:
    """`text` as JSON, refusing what has no JSON form: NaN, Infinity, and a number that
    overflows a double (Python reads `1e400` as infinity)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is too large for a JSON number (a double)")
    return number
