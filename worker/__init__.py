"""toolbus: executes AI tool calls arriving over MQTT through local tools and MCP servers."""

from importlib.metadata import PackageNotFoundError, version

from toolbus.backends.local import LocalTool, tool
from toolbus.contracts import ErrorCode, Reply, Request
from toolbus.errors import ToolbusError

try:
    __version__ = version("toolbus")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0"

__all__ = ["ErrorCode", "LocalTool", "Reply", "Request", "ToolbusError", "__version__", "tool"]
