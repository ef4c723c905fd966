"""The providers' own types as judges of what we append to a conversation.

Each check validates an item with the SDK's parameter type (pydantic `TypeAdapter` over
the TypedDicts, `ollama.Message` for Ollama), offline. Two leniencies of those adapters
are closed here, so a check that passes means the SDK would send exactly our item:

- `Iterable[...]` fields (an Anthropic `tool_result`'s `content`, a user message's parts)
  come back as lazy `ValidatorIterator`s, judged only when iterated: `materialized`
  iterates them all;
- TypedDicts drop keys they do not know (`is_eror` passes as nothing): the validated
  value must equal the item, so a misspelled or foreign key fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ollama
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam
from pydantic import TypeAdapter

from toolbus.contracts import ReplyFormat

ANTHROPIC_MESSAGE: TypeAdapter[Any] = TypeAdapter(MessageParam)
CHAT_MESSAGE: TypeAdapter[Any] = TypeAdapter(ChatCompletionMessageParam)
RESPONSES_INPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseInputItemParam)


def materialized(value: Any) -> Any:
    """`value` with every lazy iterator consumed (and so validated) into a list."""
    if isinstance(value, dict):
        return {key: materialized(item) for key, item in value.items()}
    if isinstance(value, list | tuple | Iterator):
        return [materialized(item) for item in value]
    return value


def strictly(adapter: TypeAdapter[Any], item: dict[str, Any]) -> None:
    """Raises unless `adapter` accepts `item` whole: every part judged, no key dropped."""
    validated = materialized(adapter.validate_python(item))
    assert validated == item, f"the SDK type keeps only {validated!r} of {item!r}"


def ollama_message(item: dict[str, Any]) -> None:
    """Raises unless `ollama.Message` takes `item` as the client does (base64 strings in
    `images` become `ollama.Image`s) and sends back exactly it."""
    given = dict(item)
    if "images" in given:
        given["images"] = [ollama.Image(value=image) for image in given["images"]]
    message = ollama.Message.model_validate(given)
    assert message.model_dump(exclude_none=True) == item


def check(format: ReplyFormat, item: dict[str, Any]) -> None:
    """One appended item judged by its provider's SDK."""
    if format == ReplyFormat.ANTHROPIC:
        strictly(ANTHROPIC_MESSAGE, item)
    elif format == ReplyFormat.OPENAI:
        strictly(CHAT_MESSAGE, item)
    elif format == ReplyFormat.OPENAI_RESPONSES:
        strictly(RESPONSES_INPUT_ITEM, item)
    elif format == ReplyFormat.OLLAMA:
        ollama_message(item)
    else:
        raise AssertionError(f"nothing to append in {format}")
