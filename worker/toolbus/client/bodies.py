"""Bodies: a provider's message (an SDK's objects, a dict, a list) as the JSON object
`toolbus.Client.run_tool_calls` publishes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolbus.wire.formats.incoming import holder


def provider_body(message: Any) -> dict[str, Any]:
    """A provider's message as the JSON object to publish: SDK objects as their
    `model_dump(mode="json")`, wherever they sit (a dict holding a `content` list of
    blocks, say); a bare list as the message that holds it."""
    plain = _plain(message)
    if isinstance(plain, dict):
        return plain
    if isinstance(plain, list):
        return holder(plain)
    raise TypeError(f"a provider message is an object or a list, not {type(message).__name__}")


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
