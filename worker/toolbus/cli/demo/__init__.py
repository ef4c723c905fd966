"""The bundled demo MCP device server."""
