"""A model that stands in for the providers' APIs: just enough of Anthropic's Messages
API and OpenAI's Chat Completions and Responses APIs for an agent loop to run offline.

The SDKs talk to it over real HTTP (`ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL`). Its first
answer asks for two `echo` calls, as a model would; once the conversation holds tool
results, it answers with `FINAL` and the results' text, so what the tools said has to
travel all the way round. A request that lists no tools is a tool's sampling request
answered by the caller's model: it is answered `SAMPLED` and the last message's text.
Every request body is kept for the test to judge. Its answers are built with the SDKs'
own models (`model_validate`), so they are what the APIs send.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

FINAL = "All done, the tools said:"
ECHOED = ("hello", "again")  # the texts the model asks `echo` to send back
TOOL = "echo"
SAMPLED = "Sampled:"  # how an answer to a request without tools starts


class ModelStandIn:
    """`with ModelStandIn() as model:` serving on `model.url` until the block ends."""

    def __init__(self) -> None:
        self.requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.answers: dict[str, list[dict[str, Any]]] = defaultdict(list)
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                route = _ROUTES.get(self.path)
                if route is None:
                    self._send(404, {"error": {"message": f"no {self.path} here"}})
                    return
                standin.requests[self.path].append(body)
                try:
                    answer = route(body)
                except LookupError as exc:  # no `echo` among the tools: say so loudly
                    self._send(400, {"error": {"type": "invalid_request", "message": str(exc)}})
                    return
                standin.answers[self.path].append(answer)
                self._send(200, answer)

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test judges the requests; no log lines on stderr

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="model-standin"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ModelStandIn:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def _tool_named(tools: list[dict[str, Any]], *path: str) -> str:
    """The listed tool whose name (at `path` in its definition) is `echo`."""
    for definition in tools:
        value: Any = definition
        for key in path:
            value = value.get(key, {}) if isinstance(value, dict) else {}
        if value == TOOL:
            return TOOL
    raise LookupError(f"the request lists no tool named {TOOL!r}")


def _final_text(results: list[str]) -> str:
    return f"{FINAL} {' | '.join(results)}"


def _messages(body: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's Messages API."""
    last = body["messages"][-1]
    content = last["content"] if isinstance(last["content"], list) else []
    results = [block for block in content if block.get("type") == "tool_result"]
    if "tools" not in body:
        stop = "end_turn"
        blocks: list[dict[str, Any]] = [
            {"type": "text", "text": f"{SAMPLED} {_text_of(last['content'])}"}
        ]
    elif results:
        _tool_named(body["tools"], "name")  # still listed
        said = [_text_of(block.get("content")) for block in results]
        blocks = [{"type": "text", "text": _final_text(said)}]
        stop = "end_turn"
    else:
        name = _tool_named(body.get("tools", []), "name")
        blocks = [{"type": "text", "text": "Let me call the tool."}]
        blocks += [
            {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": {"text": text}}
            for n, text in enumerate(ECHOED)
        ]
        stop = "tool_use"
    turn = len(body["messages"])
    return Message.model_validate(
        {
            "id": f"msg_{turn}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    ).model_dump(mode="json")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _chat(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's Chat Completions API."""
    results = [m for m in body["messages"] if m.get("role") == "tool"]
    if "tools" not in body:
        said = f"{SAMPLED} {_text_of(body['messages'][-1].get('content'))}"
        message: dict[str, Any] = {"role": "assistant", "content": said}
        finish = "stop"
    elif results:
        message = {
            "role": "assistant",
            "content": _final_text([_text_of(m.get("content")) for m in results]),
        }
        finish = "stop"
    else:
        name = _tool_named(body.get("tools", []), "function", "name")
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{n}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps({"text": text})},
                }
                for n, text in enumerate(ECHOED)
            ],
        }
        finish = "tool_calls"
    return ChatCompletion.model_validate(
        {
            "id": f"chatcmpl-{len(body['messages'])}",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
        }
    ).model_dump(mode="json")


def _responses(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's Responses API."""
    name = _tool_named(body.get("tools", []), "name")
    items = body["input"] if isinstance(body["input"], list) else []
    results = [i for i in items if i.get("type") == "function_call_output"]
    if results:
        output: list[dict[str, Any]] = [
            {
                "type": "message",
                "id": "msg_final",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {
                        "type": "output_text",
                        "text": _final_text([_text_of(i.get("output")) for i in results]),
                        "annotations": [],
                    }
                ],
            }
        ]
    else:
        output = [
            {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": name,
                "arguments": json.dumps({"text": text}),
                "status": "completed",
            }
            for n, text in enumerate(ECHOED)
        ]
    return Response.model_validate(
        {
            "id": f"resp_{len(items)}",
            "object": "response",
            "created_at": 1,
            "model": body["model"],
            "status": "completed",
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],  # the real API echoes them; the loop never reads them back
            "output": output,
        }
    ).model_dump(mode="json")


_ROUTES = {
    "/v1/messages": _messages,
    "/v1/chat/completions": _chat,
    "/v1/responses": _responses,
}
