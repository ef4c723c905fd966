"""Incoming: the tool calls of one message, in whatever shape a provider's SDK emits them.

`read(body)` recognises, from the parsed JSON payload:
- Anthropic: a `tool_use` block, a list of content blocks, an assistant message (a
  `Message`, or a `MessageParam`-like `{"role": "assistant", "content": [...]}`);
- OpenAI Chat Completions: a tool call, an assistant message with any number of
  `tool_calls`, a whole `ChatCompletion` (its first choice), a list of tool calls;
- OpenAI Responses: a `function_call` item, a response's `output` list, a whole `Response`;
- Ollama: a tool call (no id, arguments as an object), a message with `tool_calls`, a
  whole chat response (its `message`);
- anything else is our own envelope, read by `toolbus.doors.envelope.decode`.

Provider fields we do not use (an Anthropic block's `caller`, a response's `usage`) mean
nothing here: our options travel beside them under a `toolbus` object, whose name no
provider uses. What a call got wrong (no name, arguments that are not a JSON object) is
that call's own problem, answered in its place; the message's other calls still run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from toolbus.wire.contracts import ReplyFormat
from toolbus.wire.errors import BadRequest

MAX_NAME_CHARS = 200  # as the envelope's `tool`

# The content blocks and output items that are not tool calls, and are ignored.
_ANTHROPIC_CALL = "tool_use"
_RESPONSES_CALL = "function_call"


@dataclass(frozen=True, slots=True)
class Wanted:
    """One tool call as the model asked for it."""

    id: str | None  # the provider's id for it (`toolu_…`, `call_…`); Ollama gives none
    name: str  # as the model wrote it; "" when it gave none usable (`problem` says so)
    arguments: dict[str, Any]
    problem: BadRequest | None = None


@dataclass(frozen=True, slots=True)
class Shape:
    """What a message holds: whose shape, its calls, its own id, our options."""

    format: ReplyFormat
    calls: tuple[Wanted, ...] | None  # None: our own envelope
    id: str | None = None  # the message's own id (`msg_…`, `chatcmpl-…`, `resp_…`)
    options: object = None  # the raw `toolbus` object, for the envelope model to check


ENVELOPE = Shape(ReplyFormat.TOOLBUS, None)


def read(body: object) -> Shape:  # noqa: PLR0911 -- one return per shape: a flat dispatch
    """The shape of a parsed payload (an object or a list); `BadRequest` when it has none."""
    if isinstance(body, list):
        return _listed(body, None, None)
    if not isinstance(body, dict):
        raise BadRequest(f"payload must be a JSON object or list, got {type(body).__name__}")
    if "tool" in body:  # our envelope's own key: no provider's shape has it
        return ENVELOPE
    options = body.get("toolbus")
    kind = body.get("type")
    if kind == _ANTHROPIC_CALL:
        return Shape(ReplyFormat.ANTHROPIC, (_anthropic(body),), options=options)
    if kind == _RESPONSES_CALL:
        return Shape(ReplyFormat.OPENAI_RESPONSES, (_responses(body),), options=options)
    ident = body.get("id")
    if "choices" in body:  # a ChatCompletion: its first choice's message
        return _chat_completion(body, options)
    if isinstance(body.get("message"), dict) and "tool_calls" in body["message"]:
        # An Ollama chat response: Ollama's, whether or not newer servers give call ids.
        return _chat_message(body["message"], ident, options, ReplyFormat.OLLAMA)
    if "tool_calls" in body:
        return _chat_message(body, ident, options)
    if isinstance(body.get("function"), dict):
        return _chat_calls([body], None, options)
    if isinstance(body.get("output"), list) and (kind is None or body.get("object") == "response"):
        return _listed(body["output"], ident, options, expect=ReplyFormat.OPENAI_RESPONSES)
    if isinstance(body.get("content"), list) and (kind == "message" or "role" in body):
        return _listed(body["content"], ident, options, expect=ReplyFormat.ANTHROPIC)
    if "role" in body or kind == "message":  # a provider's message that asks for no tool
        raise BadRequest("the message holds no tool calls", reason="no_tool_calls")
    return ENVELOPE


def holder(items: list[Any]) -> dict[str, Any]:
    """The object a provider keeps such a list in (an Anthropic message's `content`, a
    response's `output`, a Chat message's `tool_calls`): where a `toolbus` object can
    sit beside it. The client sends bare lists this way."""
    kind = _list_kind(items)
    if kind is ReplyFormat.OPENAI_RESPONSES:
        return {"output": items}
    if kind is ReplyFormat.OPENAI:
        return {"role": "assistant", "tool_calls": items}
    return {"role": "assistant", "content": items}


def _list_kind(items: list[Any]) -> ReplyFormat | None:
    """Whose list it is, by its calls: Anthropic, Responses, Chat (OPENAI), or None."""
    kinds = {item.get("type") for item in items if isinstance(item, dict)}
    if _ANTHROPIC_CALL in kinds:
        return ReplyFormat.ANTHROPIC
    if _RESPONSES_CALL in kinds:
        return ReplyFormat.OPENAI_RESPONSES
    if items and all(isinstance(item, dict) and "function" in item for item in items):
        return ReplyFormat.OPENAI
    return None


def _listed(
    items: list[Any], ident: object, options: object, expect: ReplyFormat | None = None
) -> Shape:
    """A list of Anthropic content blocks, Responses output items or Chat tool calls."""
    if not all(isinstance(item, dict) for item in items):
        raise BadRequest("each item of the list must be an object", reason="not_an_object")
    kind = expect or _list_kind(items)
    if kind is ReplyFormat.ANTHROPIC:
        calls = tuple(_anthropic(item) for item in items if item.get("type") == _ANTHROPIC_CALL)
        return _shape(ReplyFormat.ANTHROPIC, calls, ident, options)
    if kind is ReplyFormat.OPENAI_RESPONSES:
        calls = tuple(_responses(item) for item in items if item.get("type") == _RESPONSES_CALL)
        return _shape(ReplyFormat.OPENAI_RESPONSES, calls, ident, options)
    if kind is ReplyFormat.OPENAI:
        return _chat_calls(items, ident, options)
    raise BadRequest("the list holds no tool calls", reason="no_tool_calls")


def _shape(fmt: ReplyFormat, calls: tuple[Wanted, ...], ident: object, options: object) -> Shape:
    if not calls:
        raise BadRequest("the message holds no tool calls", reason="no_tool_calls")
    return Shape(fmt, calls, ident if isinstance(ident, str) else None, options)


def _chat_completion(body: dict[str, Any], options: object) -> Shape:
    choices = body["choices"]
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadRequest("`choices` must hold at least one choice", reason="no_tool_calls")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise BadRequest("the first choice has no message", reason="no_tool_calls")
    return _chat_message(message, body.get("id"), options)


def _chat_message(
    message: dict[str, Any], ident: object, options: object, fmt: ReplyFormat | None = None
) -> Shape:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        raise BadRequest("`tool_calls` must be a list", reason="no_tool_calls")
    if not all(isinstance(call, dict) for call in calls):
        raise BadRequest("each of `tool_calls` must be an object", reason="not_an_object")
    return _chat_calls(calls, ident, options, fmt)


def _chat_calls(
    calls: list[dict[str, Any]], ident: object, options: object, fmt: ReplyFormat | None = None
) -> Shape:
    """Chat Completions calls carry ids; Ollama's do not (and give arguments as objects)."""
    if fmt is None:
        fmt = ReplyFormat.OPENAI if calls and all("id" in c for c in calls) else ReplyFormat.OLLAMA
    return _shape(fmt, tuple(_chat_call(call) for call in calls), ident, options)


def _chat_call(call: dict[str, Any]) -> Wanted:
    ident = _id(call.get("id"))
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, dict):
        return _problem(ident, function, "only function tool calls can run here", "not_a_function")
    return _wanted(ident, function.get("name"), function.get("arguments"), "function.arguments")


def _anthropic(block: dict[str, Any]) -> Wanted:
    return _wanted(_id(block.get("id")), block.get("name"), block.get("input"), "input")


def _responses(item: dict[str, Any]) -> Wanted:
    return _wanted(_id(item.get("call_id")), item.get("name"), item.get("arguments"), "arguments")


def _wanted(ident: str | None, name: object, arguments: object, where: str) -> Wanted:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        return _problem(ident, name, "the call names no usable tool", "no_tool_name")
    if arguments is None:
        arguments = {}
    elif isinstance(arguments, str):  # OpenAI's and Responses' arguments are JSON text
        try:
            arguments = strict_json(arguments, f"`{where}`") if arguments.strip() else {}
        except BadRequest as error:
            return Wanted(ident, name, {}, error)
    if not isinstance(arguments, dict):
        return _problem(ident, name, f"`{where}` must be a JSON object", "arguments_not_an_object")
    return Wanted(ident, name, arguments)


def _problem(ident: str | None, name: object, message: str, reason: str) -> Wanted:
    usable = name if isinstance(name, str) and len(name) <= MAX_NAME_CHARS else ""
    return Wanted(ident, usable, {}, BadRequest(message, reason=reason))


def _id(value: object) -> str | None:
    """A provider's call id; a non-string one is refused with the message (see decode)."""
    if value is None or isinstance(value, str):
        return value
    raise BadRequest("a tool call's id must be a string", reason="bad_call_id")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A JSON number as a float, if there is one: `1e999999` is valid JSON that Python
    reads as infinity, which would reach a tool and make a reply that is not JSON."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text[:20]} is too large a number")
    return number


# Made once: `json.loads` with an argument builds a new decoder for every call.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite)


def strict_json(text: str, what: str) -> Any:
    """Strict JSON (Python would otherwise accept NaN and Infinity), bounded in depth."""
    try:
        return _DECODER.decode(text)
    except ValueError as exc:
        raise BadRequest(f"{what} is not JSON: {exc}", reason="not_json") from None
    except RecursionError:
        raise BadRequest(f"{what} is nested too deeply", reason="too_deep") from None


# Every number as its text: for reading what a message refused for a number Python cannot
# hold (`1e999999`, an int past 4 300 digits) says around it, e.g. a 3.1.1 `reply_to`.
_NUMBERS_AS_TEXT = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=str, parse_int=str)


def numbers_as_text(payload: bytes) -> object:
    """The payload's JSON with numbers left as text; None if it is not JSON even so."""
    try:
        return _NUMBERS_AS_TEXT.decode(payload.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
