"""`toolbus call`'s prompts (cli/prompts.py) with a scripted person: what each kind of
question asks, what the answers become, and that a server's text runs no terminal control."""

from __future__ import annotations

from typing import Any

from mcp.types import CreateMessageResult, ElicitResult

from toolbus.cli.prompts import SAMPLED_BY, TRIES, Prompter


class Person:
    """Types `lines` in turn (then no more: the end of input); keeps what was shown."""

    def __init__(self, *lines: str) -> None:
        self.lines = list(lines)
        self.shown: list[str] = []

    def ask(self, prompt: str) -> str | None:
        self.shown.append(prompt)
        return self.lines.pop(0) if self.lines else None

    def say(self, text: str) -> None:
        self.shown.append(text)

    def prompter(self) -> Prompter:
        return Prompter(self.ask, self.say)


FORM = {
    "mode": "form",
    "message": "Which Switch One?",
    "requestedSchema": {
        "type": "object",
        "properties": {
            "device": {"type": "string", "enum": ["hall", "porch"], "title": "Device"},
            "level": {"type": "integer", "minimum": 0, "maximum": 100},
            "ratio": {"type": "number"},
            "confirm": {"type": "boolean", "default": False},
            "rooms": {"type": "array", "items": {"anyOf": [{"const": "k", "title": "Kitchen"}]}},
            "note": {"type": "string"},
            "mood": {"type": "string", "oneOf": [{"const": "ok", "title": "Fine"}]},
        },
        "required": ["device", "level", "ratio", "mood"],
    },
}


def test_a_form_is_asked_field_by_field_by_type() -> None:
    person = Person("", "2", "high", "40", "0.5", "", "Kitchen", "", "Fine")
    result = person.prompter().elicit(FORM)
    assert result == {
        "action": "accept",
        "content": {
            "device": "porch",
            "level": 40,
            "ratio": 0.5,
            "confirm": False,
            "rooms": ["k"],
            "mood": "ok",
        },
    }
    ElicitResult.model_validate(result)
    assert any("not an integer" in line for line in person.shown)


def test_a_form_declined_cancelled_or_given_up() -> None:
    assert Person("d").prompter().elicit(FORM) == {"action": "decline"}
    assert Person("c").prompter().elicit(FORM) == {"action": "cancel"}
    assert Person("a").prompter().elicit(FORM) == {"action": "cancel"}  # input ended
    unreadable = Person("a", "1", *["x"] * TRIES)  # the level never an integer
    assert unreadable.prompter().elicit(FORM) == {"action": "cancel"}
    required = Person("a", *[""] * TRIES)
    assert required.prompter().elicit(FORM) == {"action": "cancel"}


def test_a_url_is_shown_and_going_on_is_asked() -> None:
    params = {
        "mode": "url",
        "message": "Sign in",
        "url": "https://x.example/a",
        "elicitationId": "e",
    }
    person = Person("a")
    assert person.prompter().elicit(params) == {"action": "accept"}
    assert "  open: https://x.example/a" in person.shown
    assert Person("d").prompter().elicit(params) == {"action": "decline"}
    assert Person().prompter().elicit(params) == {"action": "cancel"}


def test_sampling_takes_the_typed_completion_or_declines() -> None:
    params: dict[str, Any] = {
        "messages": [
            {"role": "user", "content": {"type": "text", "text": "Summarize this"}},
            {"role": "user", "content": {"type": "image", "data": "AA==", "mimeType": "image/png"}},
        ],
        "systemPrompt": "Be brief.",
        "maxTokens": 50,
    }
    person = Person("It is", "summarized.", "")
    result = person.prompter().sample(params)
    assert result is not None
    parsed = CreateMessageResult.model_validate(result)
    assert parsed.model == SAMPLED_BY and parsed.content.type == "text"
    assert result["content"]["text"] == "It is\nsummarized."
    assert "  user: Summarize this" in person.shown and "  user: [image]" in person.shown
    assert Person("").prompter().sample(params) is None
    assert Person().prompter().sample(params) is None


def test_an_approval_is_yes_only_when_said() -> None:
    call = {"tool": "wipe", "arguments": {"disk": "b"}}
    assert Person("y").prompter().approve(call) is True
    assert Person("yes").prompter().approve(call) is True
    assert Person("").prompter().approve(call) is False
    assert Person("n").prompter().approve(call) is False
    assert Person().prompter().approve(call) is False


def test_what_a_server_chose_runs_no_terminal_control() -> None:
    hostile = "\x1b[2J\x1b]0;owned\x07"
    person = Person("c")
    person.prompter().elicit({"message": hostile, "requestedSchema": {}})
    person.prompter().approve({"tool": hostile, "arguments": {"x": hostile}})
    person.prompter().sample({"messages": [{"role": hostile, "content": {"type": hostile}}]})
    assert not any("\x1b" in line or "\x07" in line for line in person.shown)
    assert any("\\u001b[2J" in line for line in person.shown)
