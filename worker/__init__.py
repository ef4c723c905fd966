"""toolbus: executes AI tool calls arriving over MQTT through local tools and MCP servers."""

from importlib.metadata import PackageNotFoundError, version

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
