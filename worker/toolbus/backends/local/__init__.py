"""Local backend: async Python functions registered as tools, beside the MCP backend.

functions  `@tool`, schemas from type hints, the `toolbus.tools` entry points
builtin    the tools every worker has (`echo`, `current_datetime`)
"""

from toolbus.backends.local.builtin import BUILTIN_TOOLS

__all__ = ["BUILTIN_TOOLS"]
