"""How long an MCP server's close may take: apart, for the facade (`backend`, which must
not import the mcp SDK) and the session and server (which do) to share."""

CLOSE_DEADLINE_S = 5.0  # the longest a stdio server's `stop` takes, and then some
