"""Backends: where a tool actually runs (in-process, or on an MCP server)."""
