"""Configuration: one settings model, read once at the entry point.

Sources, strongest first: command-line flags, `TOOLBUS_*` environment variables,
the config file (TOML or JSON), defaults. MCP servers use the `mcpServers` shape
that MCP clients such as Claude Desktop use, so their config files load as they are.

The parts: `settings` (the model), `loading` (reading files and the environment into
it), `problems` (why a configuration is refused, as data), `tools` (`[guards]`,
`[tools.NAME]` and the one lookup rule for per-tool tables), `servers` (`mcpServers`,
`[mcp]`).
Everything is importable from here.

May import: the wire (toolbus.wire) only.
"""

from toolbus.config.loading import load_settings, read_config_file
from toolbus.config.problems import ConfigError, ConfigProblem
from toolbus.config.servers import McpPolicy, McpServerConfig
from toolbus.config.settings import DEFAULT_BROKER_URL, Settings
from toolbus.config.tools import (
    ALL_COERCIONS,
    DEFAULT_FORBIDDEN_PATTERN,
    DEFAULT_GUARDS,
    NO_TOOL_SETTINGS,
    Coercion,
    CoercionName,
    GuardPreset,
    GuardSettings,
    ParameterSettings,
    ToolSettings,
    complete_guards,
    for_tool,
    tool_settings,
)
from toolbus.wire.broker import BrokerUrl

__all__ = [
    "ALL_COERCIONS",
    "DEFAULT_BROKER_URL",
    "DEFAULT_FORBIDDEN_PATTERN",
    "DEFAULT_GUARDS",
    "NO_TOOL_SETTINGS",
    "BrokerUrl",
    "Coercion",
    "CoercionName",
    "ConfigError",
    "ConfigProblem",
    "GuardPreset",
    "GuardSettings",
    "McpPolicy",
    "McpServerConfig",
    "ParameterSettings",
    "Settings",
    "ToolSettings",
    "complete_guards",
    "for_tool",
    "load_settings",
    "read_config_file",
    "tool_settings",
]
