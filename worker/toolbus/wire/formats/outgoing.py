"""Outgoing: our per-call replies as what the integrator appends to the conversation.

`conversation(format, answered)` is the one entry point. Each reply is first read once,
provider-neutrally, as a list of parts (text, images); each provider's shape is then a
small rendering of those parts:

- anthropic: one `{"role": "user"}` message of `tool_result` blocks (`is_error` on failure);
- openai: a Chat Completions `{"role": "tool"}` message per call, and, since tool messages
  cannot carry images there, one `{"role": "user"}` message after them with the images;
- openai-responses: a `function_call_output` item per call (a string, or a list of
  `input_text` and `input_image` when there are images);
- ollama: a `{"role": "tool", "tool_name"}` message per call, images in `images`.

What a provider cannot take (audio, an image type it refuses) becomes a short text saying
what was left out, never a part the provider's API would refuse. A failure becomes text the
model can act on: the code, the message, and for `invalid_arguments` the problems and the
tool's parameters, bounded to `MAX_ERROR_CHARS`.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from toolbus.wire.contracts import ContentItem, ErrorBody, ErrorCode, Reply, ReplyFormat
from toolbus.wire.untrusted import shown

MAX_ERROR_CHARS = 4_000
"""The most an error's text may take: a hostile tool's message or a huge `details` must not
become a huge message in the model's context."""
# Each part's share of it, so a huge message cannot crowd out the parameters the model
# needs to correct its call: the first line, each list (problems, parameters), one entry.
_MESSAGE_CHARS = 1_000
_LIST_CHARS = 1_400
_LINE_CHARS = 400
_ENUM_SHOWN = 20  # values of one parameter's enum named in an error; the rest counted
NOTHING_RETURNED = "(the tool succeeded and returned nothing)"

# The image types each provider takes (its API refuses the others).
_ANTHROPIC_IMAGES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_OPENAI_IMAGES = _ANTHROPIC_IMAGES  # PNG, JPEG, WEBP and non-animated GIF
_OLLAMA_IMAGES = frozenset({"image/jpeg", "image/png"})  # what its vision models decode
# How each of those starts (WebP: `RIFF`, four size bytes, `WEBP`).
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


@dataclass(frozen=True, slots=True)
class Answered:
    """One call of a provider-shaped message, and our reply to it."""

    call_id: str
    """The id the provider gave the call (Anthropic `tool_use` id, Chat `tool_call` id,
    Responses `call_id`); for Ollama, whose calls carry none, a generated one."""
    name: str
    """The tool name as the model sent it (Ollama's `tool_name`), not our canonical name."""
    reply: Reply


def conversation(format: ReplyFormat, answered: Sequence[Answered]) -> list[dict[str, JsonValue]]:
    """What to append to the conversation, in the calls' order; [] for `ReplyFormat.TOOLBUS`."""
    if format == ReplyFormat.TOOLBUS:
        return []
    render, accepted = _RENDERERS[format]
    return render([(one, _parts(one.reply, accepted)) for one in answered])


# -- a reply, provider-neutral ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Image:
    media_type: str
    data: str  # base64

    @property
    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{self.data}"


_Part = str | _Image


def _parts(reply: Reply, accepted: frozenset[str]) -> list[_Part]:
    """The reply as text and images, in order; never empty, never a blank text."""
    if not reply.ok:
        return [error_text(reply.error)]
    parts: list[_Part] = []
    result = reply.result
    if result is not None:
        if result.text.strip():
            parts.append(result.text)
        elif result.structured is not None:
            parts.append(json.dumps(result.structured, ensure_ascii=False, separators=(",", ":")))
        for item in result.content or ():
            part = _content_part(item, accepted)
            if isinstance(part, str) and parts and isinstance(parts[-1], str):
                parts[-1] = f"{parts[-1]}\n{part}"
            else:
                parts.append(part)
    return parts or [NOTHING_RETURNED]


def _content_part(item: ContentItem, accepted: frozenset[str]) -> _Part:
    """One non-text item of a result as an image, or as text (what it holds, or a note of
    what was left out)."""
    kind = shown(item.type, 40)
    mime = shown(item.mime_type, 80) if item.mime_type else None
    if item.data and (item.type == "image" or (mime or "").lower().startswith("image/")):
        image = _image(item.data)
        if image is not None and image.media_type in accepted:
            return image
        label = f"{mime} image" if mime else "image"
        return f"[{label} left out: only {', '.join(sorted(accepted))} can be passed on]"
    if item.type == "resource" and item.text is not None and item.text.strip():
        return f"[resource {shown(item.uri or '', 300)}]\n{item.text}"
    if item.type == "resource_link" and item.uri:
        named = f"{shown(item.name, 200)}: " if item.name else ""
        return f"[link: {named}{shown(item.uri, 300)}{f' ({mime})' if mime else ''}]"
    what = f"{kind} {shown(item.uri, 300)}" if item.uri else kind
    what += f" ({mime})" if mime else ""
    return f"[{what} content left out: it cannot be passed on to the model]"


def _image(data: str) -> _Image | None:
    """The image base64 `data` holds, typed by its bytes; None when it is not base64 or not
    a PNG, JPEG, GIF or WebP.

    The bytes decide, not the label: a provider refuses the whole request (the model's next
    turn, not just this result) for an image that does not decode or whose bytes are not
    the type it was declared as.
    """
    compact = "".join(data.split())  # base64 wrapped at 76 columns (MIME) is still base64
    try:
        raw = binascii.a2b_base64(compact, strict_mode=True)
    except ValueError:  # binascii.Error, or a character outside ASCII
        return None
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return _Image("image/webp", compact)
    for magic, media_type in _MAGIC:
        if raw.startswith(magic):
            return _Image(media_type, compact)
    return None


# -- errors, as text a model can act on -------------------------------------------------


def error_text(error: ErrorBody | None) -> str:
    """`error (code): message`, then what helps the model retry, each part bounded."""
    if error is None:  # not produced by the worker, but a reply could say ok=false alone
        return "error: the call failed"
    head = _cut(f"error ({error.code.value}): {error.message}", _MESSAGE_CHARS)
    sections = [head]
    details = error.details
    if error.code == ErrorCode.INVALID_ARGUMENTS:
        problems = _problems(details.get("errors")) + _problems(details.get("violations"))
        # The validator's message names the first few itself: said once is enough.
        sections.append(_listed("problems", [p for p in problems if p not in head]))
        # `parameters` is the contract; `signature` its older spelling, same entries.
        parameters = _parameters(details.get("parameters", details.get("signature")))
        sections.append(_listed("parameters", parameters))
    elif error.code == ErrorCode.UNKNOWN_TOOL:
        candidates = details.get("candidates")
        if isinstance(candidates, list) and candidates:
            named = ", ".join(map(_scalar, candidates))
            sections.append(_cut(f"tools with close names: {named}", _LIST_CHARS))
    elif error.code == ErrorCode.RATE_LIMITED:
        retry_after_ms = details.get("retry_after_ms")
        if isinstance(retry_after_ms, int | float):
            sections.append(f"retry after {retry_after_ms:g} ms")
    return _cut("\n".join(section for section in sections if section), MAX_ERROR_CHARS)


def _listed(title: str, lines: list[str]) -> str:
    """`title:` and a `- line` for each, within `_LIST_CHARS`; the lines left out counted."""
    if not lines:
        return ""
    listed = [f"{title}:"]
    used = len(listed[0])
    for index, line in enumerate(lines):
        entry = f"- {_cut(line, _LINE_CHARS)}"
        if used + 1 + len(entry) > _LIST_CHARS:
            listed.append(f"- ...(+{len(lines) - index} more)")
            break
        listed.append(entry)
        used += 1 + len(entry)
    return "\n".join(listed)


def _problems(entries: JsonValue) -> list[str]:
    """Validation problems (`{path, problem}`) and guard violations (`{path, rule}`)."""
    if not isinstance(entries, list):
        return []
    problems = []
    for entry in entries:
        if isinstance(entry, dict):
            path = _scalar(entry.get("path", "")) or "(root)"
            what = entry.get("problem", entry.get("rule"))
            problems.append(f"{path}: {_scalar(what)}" if what is not None else path)
    return problems


def _parameters(entries: JsonValue) -> list[str]:
    """`device (string, required, one of: lamp, fan): the device to switch` per parameter."""
    if not isinstance(entries, list):
        return []
    described = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        facts = []
        kind = entry.get("type")
        if isinstance(kind, list):  # older `signature`: a union's member types
            kind = "|".join(_scalar(member) for member in kind if member is not None)
        if kind:
            facts.append(_scalar(kind))
        if entry.get("required") is True:
            facts.append("required")
        enum = entry.get("enum")
        if isinstance(enum, list) and enum:
            named = ", ".join(_scalar(value) for value in enum[:_ENUM_SHOWN])
            more = len(enum) - _ENUM_SHOWN
            facts.append(f"one of: {named}" + (f" (+{more} more)" if more > 0 else ""))
        line = f"{entry['name']} ({', '.join(facts)})" if facts else str(entry["name"])
        description = entry.get("description")
        if isinstance(description, str) and description.strip():
            line += f": {' '.join(description.split())}"
        described.append(line)
    return described


def _scalar(value: JsonValue) -> str:
    """A detail value as the model reads it: strings bare, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _cut(text: str, limit: int) -> str:
    """`text`, or its first characters and how many were left out, within `limit`."""
    if len(text) <= limit:
        return text
    kept = limit - len(f"...(+{len(text)} chars)")  # the note can be no longer than this
    return text[:kept] + f"...(+{len(text) - kept} chars)"


# -- each provider's shape --------------------------------------------------------------

_Read = list[tuple[Answered, list[_Part]]]


def _anthropic(read: _Read) -> list[dict[str, JsonValue]]:
    blocks: list[JsonValue] = []
    for one, parts in read:
        content: list[JsonValue] = [
            {"type": "text", "text": part}
            if isinstance(part, str)
            else {
                "type": "image",
                "source": {"type": "base64", "media_type": part.media_type, "data": part.data},
            }
            for part in parts
        ]
        block: dict[str, JsonValue] = {
            "type": "tool_result",
            "tool_use_id": one.call_id,
            "content": content,
        }
        if not one.reply.ok:
            block["is_error"] = True
        blocks.append(block)
    return [{"role": "user", "content": blocks}]


def _openai(read: _Read) -> list[dict[str, JsonValue]]:
    messages: list[dict[str, JsonValue]] = []
    shown_images: list[JsonValue] = []
    for one, parts in read:
        texts: list[str] = []
        images: list[_Image] = []
        for part in parts:
            if isinstance(part, str):
                texts.append(part)
            else:
                images.append(part)
                texts.append(
                    f"[image {len(images)} ({part.media_type}) follows in the user message "
                    "after the tool results]"
                )
        messages.append({"role": "tool", "tool_call_id": one.call_id, "content": "\n".join(texts)})
        if images:
            shown_images.append(
                {
                    "type": "text",
                    "text": f"Images returned by tool call {one.call_id} ({one.name}):",
                }
            )
            shown_images += [
                {"type": "image_url", "image_url": {"url": image.data_url}} for image in images
            ]
    if shown_images:
        messages.append({"role": "user", "content": shown_images})
    return messages


def _openai_responses(read: _Read) -> list[dict[str, JsonValue]]:
    items: list[dict[str, JsonValue]] = []
    for one, parts in read:
        output: JsonValue
        if all(isinstance(part, str) for part in parts):
            output = "\n".join(part for part in parts if isinstance(part, str))
        else:
            output = [
                {"type": "input_text", "text": part}
                if isinstance(part, str)
                else {"type": "input_image", "image_url": part.data_url}
                for part in parts
            ]
        items.append({"type": "function_call_output", "call_id": one.call_id, "output": output})
    return items


def _ollama(read: _Read) -> list[dict[str, JsonValue]]:
    messages: list[dict[str, JsonValue]] = []
    for one, parts in read:
        message: dict[str, JsonValue] = {
            "role": "tool",
            "tool_name": one.name,
            "content": "\n".join(part for part in parts if isinstance(part, str)),
        }
        images: list[JsonValue] = [part.data for part in parts if isinstance(part, _Image)]
        if images:
            message["images"] = images
        messages.append(message)
    return messages


_Render = Callable[[_Read], list[dict[str, JsonValue]]]
_RENDERERS: dict[ReplyFormat, tuple[_Render, frozenset[str]]] = {
    ReplyFormat.ANTHROPIC: (_anthropic, _ANTHROPIC_IMAGES),
    ReplyFormat.OPENAI: (_openai, _OPENAI_IMAGES),
    ReplyFormat.OPENAI_RESPONSES: (_openai_responses, _OPENAI_IMAGES),
    ReplyFormat.OLLAMA: (_ollama, _OLLAMA_IMAGES),
}
