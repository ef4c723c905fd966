"""toolbus: executes AI tool calls arriving over MQTT through local tools and MCP servers.

The public names load on first use (PEP 562): `toolbus health`, run every few seconds by
a container's health check, and the other commands start without importing the client,
the wire models and the transport they do not need.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolbus.backends.local.functions import LocalTool, elicit, progress, tool
    from toolbus.client.client import Client
    from toolbus.client.requester import Retry
    from toolbus.wire.broker import BrokerUrl
    from toolbus.wire.contracts import (
        CallsReply,
        ErrorCode,
        Progress,
        Reply,
        ReplyFormat,
        Request,
        ToolsFormat,
    )
    from toolbus.wire.errors import NoReply, ToolbusError

try:
    __version__ = version("toolbus")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0"

_HOMES = {
    "LocalTool": "toolbus.backends.local.functions",
    "tool": "toolbus.backends.local.functions",
    "progress": "toolbus.backends.local.functions",
    "elicit": "toolbus.backends.local.functions",
    "BrokerUrl": "toolbus.wire.broker",
    "Client": "toolbus.client.client",
    "CallsReply": "toolbus.wire.contracts",
    "ErrorCode": "toolbus.wire.contracts",
    "Progress": "toolbus.wire.contracts",
    "Reply": "toolbus.wire.contracts",
    "ReplyFormat": "toolbus.wire.contracts",
    "Request": "toolbus.wire.contracts",
    "ToolsFormat": "toolbus.wire.contracts",
    "NoReply": "toolbus.wire.errors",
    "ToolbusError": "toolbus.wire.errors",
    "Retry": "toolbus.client.requester",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'toolbus' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "BrokerUrl",
    "CallsReply",
    "Client",
    "ErrorCode",
    "LocalTool",
    "NoReply",
    "Progress",
    "Reply",
    "ReplyFormat",
    "Request",
    "Retry",
    "ToolbusError",
    "ToolsFormat",
    "__version__",
    "elicit",
    "progress",
    "tool",
]
