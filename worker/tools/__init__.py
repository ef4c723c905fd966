"""Built-in local tools, useful everywhere."""

from toolbus.tools.builtin import BUILTIN_TOOLS

__all__ = ["BUILTIN_TOOLS"]
