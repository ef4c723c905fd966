"""Prompts: `toolbus call` asking the person at the terminal what a tool asks its caller.

An elicitation in form mode asks for each field of its `requestedSchema` by its type
(text, a number, yes or no, one or more of a list); in URL mode it shows the URL and asks
whether to go on. A sampling request shows its messages and takes the completion the
person types as the model's. An approval shows the call and asks yes or no (no unless
said). Each starts with what the tool said, and every text a server chose is shown
escaped (`printable`): no terminal control of its own runs. An answer that cannot be
read is asked again, `TRIES` times in all; the end of input cancels (an elicitation) or
declines (sampling, approval). One question at a time, whatever the rounds hold.
`toolbus call` asks only when its standard input is a terminal (`cli/ask.py`).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from typing import Any

from toolbus.client.rounds import Callbacks
from toolbus.wire.untrusted import printable

TRIES = 3  # an answer that cannot be read is asked again, this many times in all
SAMPLED_BY = "toolbus-call-user"  # the `model` of a completion a person typed
Ask = Callable[[str], str | None]  # a prompt -> the line typed (no newline); None: no more


class Unreadable(ValueError):
    """What was typed is not a value of the field's type."""


class Prompter:
    """Asks through `ask` (a prompt, the line typed back) and tells through `say`."""

    def __init__(self, ask: Ask, say: Callable[[str], None]) -> None:
        self._ask, self._say = ask, say
        self._one_at_a_time = threading.Lock()  # calls at once on one client ask in turn

    @classmethod
    def terminal(cls) -> Prompter:
        """On standard error and input: standard output keeps the reply alone."""

        def ask(prompt: str) -> str | None:
            sys.stderr.write(prompt)
            sys.stderr.flush()
            line = sys.stdin.readline()
            return line.rstrip("\r\n") if line else None

        return cls(ask, lambda text: print(text, file=sys.stderr, flush=True))

    def callbacks(self) -> Callbacks:
        return {"on_input": self.elicit, "on_sampling": self.sample, "on_approval": self.approve}

    def elicit(self, params: dict[str, Any]) -> dict[str, Any]:
        """An `ElicitResult` for `elicitation/create`'s params."""
        with self._one_at_a_time:
            self._say(f"toolbus: the tool asks: {_shown(params.get('message'))}")
            if params.get("mode") == "url":
                self._say(f"  open: {_shown(params.get('url'))}")
                choice = self._choice("  opened it, and go on (a), decline (d) or cancel (c)? ")
                return {"action": choice}
            choice = self._choice("  answer (a), decline (d) or cancel (c)? [a] ", default="accept")
            if choice != "accept":
                return {"action": choice}
            content = self._form(params.get("requestedSchema"))
            return (
                {"action": "cancel"}
                if content is None
                else {"action": "accept", "content": content}
            )

    def sample(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """A `CreateMessageResult` the person types, or None: declined."""
        with self._one_at_a_time:
            self._say("toolbus: the tool asks for a model's completion; you answer as the model")
            if params.get("systemPrompt"):
                self._say(f"  system: {_shown(params['systemPrompt'])}")
            messages = params.get("messages")
            for message in messages if isinstance(messages, list) else []:
                if isinstance(message, dict):
                    self._say(
                        f"  {_shown(message.get('role'))}: {_content(message.get('content'))}"
                    )
            if params.get("maxTokens"):
                self._say(f"  (at most {_shown(params['maxTokens'])} tokens)")
            lines: list[str] = []
            prompt = "  your completion, ended by an empty line (none at all declines):\n> "
            while (line := self._ask(prompt)) is not None and line:
                lines.append(line)
                prompt = "> "
            if not lines:
                self._say("  declined")
                return None
            text = "\n".join(lines)
            return {
                "role": "assistant",
                "content": {"type": "text", "text": text},
                "model": SAMPLED_BY,
                "stopReason": "endTurn",
            }

    def approve(self, call: dict[str, Any]) -> bool:
        """Yes only when the person says so."""
        with self._one_at_a_time:
            arguments = json.dumps(call.get("arguments", {}), indent=2, ensure_ascii=False)
            self._say(f"toolbus: the call waits for your approval: {_shown(call.get('tool'))}")
            self._say(printable(f"  arguments: {arguments}", newlines=True))
            answer = self._ask("  run it? [y/N] ")
            return answer is not None and answer.strip().lower() in ("y", "yes")

    def _choice(self, prompt: str, default: str | None = None) -> str:
        """accept, decline or cancel; cancel when no more is typed."""
        for _ in range(TRIES):
            typed = self._ask(prompt)
            if typed is None:
                return "cancel"
            picked = {"a": "accept", "d": "decline", "c": "cancel"}.get(typed.strip().lower()[:1])
            if picked is not None or (not typed.strip() and default is not None):
                return picked or str(default)
        return "cancel"

    def _form(self, schema: object) -> dict[str, Any] | None:
        """Each field of the schema asked in turn; None: given up (the input ended)."""
        if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
            return {}
        required = schema.get("required")
        needed = set(required) if isinstance(required, list) else set()
        content: dict[str, Any] = {}
        for name, field in schema["properties"].items():
            spec = field if isinstance(field, dict) else {}
            found = self._field(str(name), spec, name in needed)
            if found is _GIVEN_UP:
                return None
            if found is not _SKIPPED:
                content[str(name)] = found
        return content

    def _field(self, name: str, spec: dict[str, Any], required: bool) -> Any:
        choices = _choices(spec)
        title = _shown(spec.get("title") or name)
        about = f" ({_shown(spec['description'])})" if spec.get("description") else ""
        if choices:
            listed = ", ".join(f"{n}) {_shown(label)}" for n, (_, label) in enumerate(choices, 1))
            self._say(f"  {title}{about}: {listed}")
        kind = spec.get("type", "string")
        hint = "numbers or values, comma-separated" if kind == "array" else _shown(kind)
        if "default" in spec:
            hint += f", default {_shown(json.dumps(spec['default']))}"
        elif not required:
            hint += ", may be left empty"
        for _ in range(TRIES):
            typed = self._ask(f"  {title}{'' if choices else about} [{hint}]: ")
            if typed is None:
                return _GIVEN_UP
            if not typed.strip():
                if "default" in spec:
                    return spec["default"]
                if not required:
                    return _SKIPPED
                self._say("  an answer is needed")
                continue
            try:
                return _value(typed.strip(), kind, choices)
            except Unreadable as exc:
                self._say(f"  {exc}")
        return _GIVEN_UP


_GIVEN_UP = object()  # a field the person could not, or would not, give
_SKIPPED = object()  # an optional field left empty


def _choices(spec: dict[str, Any]) -> list[tuple[Any, str]]:
    """A single or multiple choice's (value, label) pairs, as MCP's enum schemas spell them:
    `enum` (with the older `enumNames`), `oneOf` of `const`/`title`, or the same under
    an array's `items` (`enum`, `anyOf`)."""
    where = spec.get("items") if spec.get("type") == "array" else spec
    where = where if isinstance(where, dict) else {}
    if isinstance(where.get("enum"), list):
        names = where.get("enumNames")
        labels = names if isinstance(names, list) and len(names) == len(where["enum"]) else None
        return [(v, str(labels[n] if labels else v)) for n, v in enumerate(where["enum"])]
    options = where.get("oneOf") or where.get("anyOf")
    if isinstance(options, list):
        return [
            (o["const"], str(o.get("title", o["const"])))
            for o in options
            if isinstance(o, dict) and "const" in o
        ]
    return []


def _value(typed: str, kind: object, choices: list[tuple[Any, str]]) -> Any:
    """What was typed, as the field's type; `Unreadable` when it is none."""
    if kind == "array":
        return [_picked(part.strip(), choices) for part in typed.split(",") if part.strip()]
    if choices:
        return _picked(typed, choices)
    if kind == "boolean":
        return _yes_or_no(typed)
    try:
        if kind == "integer":
            return int(typed)
        if kind == "number":
            return float(typed)
    except ValueError:
        raise Unreadable(f"not {'an integer' if kind == 'integer' else 'a number'}") from None
    return typed


def _yes_or_no(typed: str) -> bool:
    if typed.lower() in ("y", "yes", "true", "1"):
        return True
    if typed.lower() in ("n", "no", "false", "0"):
        return False
    raise Unreadable("yes or no")


def _picked(typed: str, choices: list[tuple[Any, str]]) -> Any:
    if not choices:
        return typed
    if typed.isdigit() and 1 <= int(typed) <= len(choices):
        return choices[int(typed) - 1][0]
    for value, label in choices:
        if typed in (str(value), label):
            return value
    raise Unreadable("one of the numbers or values listed")


def _content(content: object) -> str:
    """A sampling message's content, as a line: its text, what else it holds by kind."""
    parts = content if isinstance(content, list) else [content]
    shown = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part, dict):
            shown.append(_shown(part.get("text")))
        else:
            shown.append(f"[{_shown(kind or 'content')}]")
    return " ".join(shown)


def _shown(value: object) -> str:
    return printable(value if isinstance(value, str) else str(value))
