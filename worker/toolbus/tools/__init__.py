"""Built-in local tools, useful everywhere.

May import: the wire and the layer below it (transport, config, observability, dedup).
"""

from toolbus.tools.builtin import BUILTIN_TOOLS

__all__ = ["BUILTIN_TOOLS"]
