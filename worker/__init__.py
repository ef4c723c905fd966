"""toolbus: executes AI tool calls arriving over MQTT through local tools and MCP servers.

The public names load on first use (PEP 562): `toolbus health`, run every few seconds by
a container's health check, and the other commands start without importing the client,
the wire models and the transport they do not need.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolbus.backends.local import LocalTool, tool
    from toolbus.broker import BrokerUrl
    from toolbus.client import Client
    from toolbus.contracts import CallsReply, ErrorCode, Reply, ReplyFormat, Request, ToolsFormat
    from toolbus.errors import NoReply, ToolbusError
    from toolbus.requester import Retry

try:
    __version__ = version("toolbus")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0"

_HOMES = {
    "LocalTool": "toolbus.backends.local",
    "tool": "toolbus.backends.local",
    "BrokerUrl": "toolbus.broker",
    "Client": "toolbus.client",
    "CallsReply": "toolbus.contracts",
    "ErrorCode": "toolbus.contracts",
    "Reply": "toolbus.contracts",
    "ReplyFormat": "toolbus.contracts",
    "Request": "toolbus.contracts",
    "ToolsFormat": "toolbus.contracts",
    "NoReply": "toolbus.errors",
    "ToolbusError": "toolbus.errors",
    "Retry": "toolbus.requester",
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
    "Reply",
    "ReplyFormat",
    "Request",
    "Retry",
    "ToolbusError",
    "ToolsFormat",
    "__version__",
    "tool",
]
