"""Backends: where a tool actually runs (in-process, or on an MCP server).

May import: the wire, transport, config, observability, dedup and tools.
"""
