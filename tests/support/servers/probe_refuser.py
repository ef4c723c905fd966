"""An MCP test server over streamable HTTP that answers a client's health probe with an
ordinary JSON-RPC error: alive, and saying so in its own words.

    python -m tests.support.servers.probe_refuser --port PORT [--legacy] [--code CODE]

`--legacy`: a server of 2025-11-25 (`server/discover` is "method not found", so a client
falls back to `initialize`), whose `ping` is answered with error CODE (-32601, "method
not found", is what a server that never implemented `ping` says). Otherwise a server of
2026-07-28 whose `server/discover` is answered once, for the client's negotiation, and
with error CODE for every later one (the modern era's probe). Without `--code` every
probe reaches the SDK and is answered. `--refuse-listen CODE`: every
`subscriptions/listen` (2026-07-28) is answered with error CODE.

The answers are written by an ASGI layer in front of the SDK's app, before the SDK sees
the request: no SDK internals. It prints "Uvicorn running" once it listens.

  hold      waits (bounded) until `probes` probes have been refused since it began,
            then answers how many were: a call in flight across refused probes
  sessions  how many sessions were opened (`initialize`, or the first `server/discover`)
  busy      fails with a server error of its own, -32000 (the code the SDK's client also
            uses for a connection it saw close)
  forget    the server forgets the session it is called on, as a restarted one has: every
            later request on it is answered HTTP 404 with the SDK's own JSON-RPC error body
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HOLD_BOUND_S = 30.0

server = MCPServer("toolbus-test-probe-refuser")
seen = {"refused": 0, "sessions": 0, "discovers": 0}


@server.tool()
async def hold(probes: int) -> dict[str, int]:
    """Answers once `probes` more probes have been refused (at most HOLD_BOUND_S)."""
    until = seen["refused"] + probes
    with anyio.move_on_after(HOLD_BOUND_S):
        while seen["refused"] < until:
            await anyio.sleep(0.02)  # polled: the counter is bumped by the ASGI layer
    return {"refused": seen["refused"]}


@server.tool()
async def sessions() -> dict[str, int]:
    """How many sessions clients have opened here."""
    return {"sessions": seen["sessions"]}


@server.tool()
async def busy() -> str:
    """Fails with -32000, the server's own words."""
    raise MCPError(-32000, "busy right now")


@server.tool()
async def forget() -> str:
    """Forgotten by the ASGI layer, which sees the session's id (see `RefuseProbes`)."""
    return "forgotten"


# What the SDK's session manager answers for a session id it does not know.
NOT_FOUND = {
    "jsonrpc": "2.0",
    "id": None,
    "error": {"code": -32600, "message": "Session not found"},
}


class RefuseProbes:
    """Answers the probe (and, for a legacy server, `server/discover`) with a JSON-RPC
    error, in a 200 response, as a server's handler that raised would."""

    def __init__(
        self, app: ASGIApp, *, legacy: bool, code: int | None, listen_code: int | None
    ) -> None:
        self.app, self.legacy, self.code, self.listen_code = app, legacy, code, listen_code
        self.forgotten: set[bytes] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, messages = await _read_body(receive)
        session = dict(scope["headers"]).get(b"mcp-session-id")
        if session is not None and session in self.forgotten:
            await _answer(send, 404, NOT_FOUND)
            return
        if session is not None and b'"forget"' in body:
            self.forgotten.add(session)  # from the next request on
        refusal = self._refusal(body)
        if refusal is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        await _answer(send, 200, refusal)

    def _refusal(self, body: bytes) -> dict[str, Any] | None:
        try:
            request = json.loads(body)
        except ValueError:
            return None
        if not isinstance(request, dict) or "id" not in request:
            return None
        method = request.get("method")
        if method == "initialize":
            seen["sessions"] += 1
        if method == "server/discover":
            if self.legacy:  # a 2025-11-25 server knows no server/discover
                return _error(request["id"], -32601, "Method not found")
            seen["discovers"] += 1
            if seen["discovers"] == 1:
                seen["sessions"] += 1
                return None  # the negotiation's: answered by the SDK
            if self.code is None:
                return None
            seen["refused"] += 1
            return _error(request["id"], self.code, "not now")
        if method == "subscriptions/listen" and self.listen_code is not None:
            return _error(request["id"], self.listen_code, "no subscriptions here")
        if method == "ping" and self.legacy and self.code is not None:
            seen["refused"] += 1
            return _error(request["id"], self.code, "no ping here")
        return None


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


async def _read_body(receive: Receive) -> tuple[bytes, list[Message]]:
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body"):
            return b"".join(chunks), messages


def _replay(messages: list[Message], rest: Receive) -> Receive:
    """The request's messages already read, then the connection's own (its disconnect)."""
    pending = list(messages)

    async def receive() -> Message:
        return pending.pop(0) if pending else await rest()

    return receive


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--legacy", action="store_true")
    parser.add_argument("--code", type=int)
    parser.add_argument("--refuse-listen", type=int)
    args = parser.parse_args()
    app = RefuseProbes(
        server.streamable_http_app(),
        legacy=args.legacy,
        code=args.code,
        listen_code=args.refuse_listen,
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="info")


if __name__ == "__main__":
    main()
