"""MCP output with bounds: huge results, huge stdout and stderr lines, the servers' env.

The end-to-end cases run the real stdio server tests/support/servers/misbehaving.py under a
worker and a real broker; each asserts the wire error code, then that an ordinary call
on the same server still succeeds, and whether the session lived on (`connects`).
The pure parts (the line splitter, the id finder, environments, URLs) are tested alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.backends.test_mcp_faults import ServerStates, call, misbehaving
from tests.support.harness import Broker, free_port, make_settings, measured, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller
from tests.support.processes import start_http_demo, stop_process
from toolbus.backends.mcp.environment import basics, server_environment
from toolbus.backends.mcp.lines import END_BYTES, LineSplitter, Oversized, answered_id
from toolbus.backends.mcp.stderr import STDERR_LINE_CHARS
from toolbus.backends.mcp.stdio import line_limit_bytes
from toolbus.config import McpPolicy
from toolbus.observability.sdk import child_environment
from toolbus.observability.spans import server_attributes, url_without_secrets

SMALL_LIMIT_BYTES = 64 * 1024  # per server, so that a test needs only a few MB


@pytest_asyncio.fixture
async def client(broker: Broker) -> AsyncIterator[Caller]:
    async with Caller(broker.url) as c:
        yield c


def bounded(state: Path, limit_bytes: int = SMALL_LIMIT_BYTES, **env: str) -> dict[str, Any]:
    return {**misbehaving(state, **env), "max_result_bytes": limit_bytes}


async def still_serves(client: Caller, worker: Any, name: str, connects: int) -> None:
    """The next ordinary call succeeds, over the session counted so far."""
    after = await call(client, worker, "work", {"value": "after"})
    assert after["ok"], after
    assert after["result"]["text"] == "did after"
    assert worker.mcp.servers[name].connects == connects


# -- results over max_result_bytes -----------------------------------------------------


def test_the_default_limit_is_4_mib_and_lines_get_room_for_escaping() -> None:
    assert McpPolicy().max_result_bytes == 4 * 1024 * 1024
    assert line_limit_bytes(4 * 1024 * 1024) > 2 * 4 * 1024 * 1024


@pytest.mark.parametrize(
    ("tool", "mbytes", "parsed"),
    [
        ("big_result", 0.07, True),  # its line is under the line limit: parsed, then measured
        ("big_result", 1.0, False),  # over it: never parsed, the id read from its start
        ("big_answer_id_last", 1.0, False),  # never parsed, the id read from its end
    ],
    ids=["parsed", "id-first", "id-last"],
)
async def test_a_result_over_the_limit_is_a_tool_error_and_the_session_goes_on(
    broker: Broker, client: Caller, tmp_path: Path, tool: str, mbytes: float, parsed: bool
) -> None:
    settings = make_settings(broker, mcpServers={"big": bounded(tmp_path)})
    async with running_worker(settings) as worker:
        reply = await call(client, worker, tool, {"mbytes": mbytes})
        assert reply["error"]["code"] == "tool_error", reply
        details = reply["error"]["details"]
        assert details["limit_bytes"] == SMALL_LIMIT_BYTES
        assert details["received_bytes"] > SMALL_LIMIT_BYTES
        assert (details["received_bytes"] <= line_limit_bytes(SMALL_LIMIT_BYTES)) == parsed
        assert details["server"] == "big"
        await still_serves(client, worker, "big", connects=1)


async def test_50_mb_result_at_the_default_limit_answers_within_its_deadline(
    broker: Broker, client: Caller, tmp_path: Path
) -> None:
    """The audit's case: before, 166 s (95 s of CPU) and then 50 MB passed on whole."""
    settings = make_settings(broker, mcpServers={"huge": misbehaving(tmp_path)})
    async with running_worker(settings) as worker:
        began = time.monotonic()
        reply = await call(client, worker, "big_result", {"mbytes": 50}, timeout_s=30)
        measured(f"a 50 MB MCP result refused as tool_error in {time.monotonic() - began:.2f} s")
        assert reply["error"]["code"] == "tool_error", reply["error"]
        assert reply["error"]["details"]["limit_bytes"] == 4 * 1024 * 1024
        await still_serves(client, worker, "huge", connects=1)


# -- stdout lines over the bound that answer no call ---------------------------------


async def test_a_huge_garbage_line_is_counted_and_the_call_after_it_answers(
    broker: Broker, client: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"loud": bounded(tmp_path)})
    with watching("toolbus.mcp", "not JSON-RPC", logging.WARNING) as complaints:
        async with running_worker(settings) as worker:
            began = time.monotonic()
            reply = await call(client, worker, "stdout_flood", {"mbytes": 20}, timeout_s=30)
            measured(f"a 20 MB garbage stdout line skipped in {time.monotonic() - began:.2f} s")
            assert reply["ok"] and reply["result"]["text"] == "after a garbage line", reply
            assert worker.mcp.servers["loud"].bad_stdout_lines == 1
            await still_serves(client, worker, "loud", connects=1)
    [complaint] = complaints.records
    assert len(complaint.getMessage()) < 1000  # the start of the line, not 20 MB of it


async def test_a_huge_message_answering_no_call_restarts_the_session_and_says_so(
    broker: Broker, client: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"chatty": bounded(tmp_path)})
    async with running_worker(settings) as worker:
        states = ServerStates(client, worker, "chatty")
        await client.subscribe(states.topic)  # before: the state may change at once
        degraded_seen = asyncio.create_task(states.until("degraded"))
        stranded = await call(
            client,
            worker,
            "stdout_flood",
            {"mbytes": 1, "shape": "notification", "answer": False},
            timeout_s=30,
        )
        # The call it cut short learns at once that the server went away, not at its deadline.
        assert stranded["error"]["code"] == "unavailable", stranded["error"]
        assert stranded["error"]["details"]["server"] == "chatty"
        degraded = await degraded_seen
        assert "stdout line of" in degraded["last_error"], degraded
        assert "exited" not in degraded["last_error"]
        await states.until("ready")
        await still_serves(client, worker, "chatty", connects=2)


# -- stderr, and the truth about how a session ended ---------------------------------


async def test_a_long_stderr_line_is_logged_cut_and_never_ends_the_session(
    broker: Broker, client: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"grumpy": misbehaving(tmp_path)})
    with watching("toolbus.mcp.grumpy", "[cut: a line of") as logged:
        async with running_worker(settings) as worker:
            reply = await call(client, worker, "stderr_flood", {"kbytes": 1024})
            assert reply["ok"] and reply["result"]["text"] == "after a long stderr line", reply
            assert logged.seen.is_set()
            assert worker.mcp.servers["grumpy"].state == "ready"
            assert worker.mcp.servers["grumpy"].stderr_tail[-1] == "e" * STDERR_LINE_CHARS
            await still_serves(client, worker, "grumpy", connects=1)
    [record] = [r for r in logged.records if "[cut:" in r.getMessage()]
    assert f"a line of {1024 * 1024} bytes" in record.getMessage()
    assert len(record.getMessage()) < 2 * END_BYTES


async def test_a_real_exit_is_reported_with_its_exit_code(
    broker: Broker, client: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"quitter": misbehaving(tmp_path)})
    async with running_worker(settings) as worker:
        states = ServerStates(client, worker, "quitter")
        await client.subscribe(states.topic)
        degraded_seen = asyncio.create_task(states.until("degraded"))
        reply = await call(client, worker, "exit_now")
        assert reply["error"]["code"] == "unavailable"
        degraded = await degraded_seen
        assert degraded["last_error"] == "the server process exited with code 4", degraded
        await states.until("ready")
        await still_serves(client, worker, "quitter", connects=2)


async def test_a_start_up_failure_names_the_exit_code(broker: Broker, tmp_path: Path) -> None:
    settings = make_settings(
        broker, mcpServers={"broken": misbehaving(tmp_path, TB_FAIL_STARTS="9")}
    )
    with watching("toolbus.mcp", "MCP connection failed after", logging.ERROR) as failed:
        async with running_worker(settings) as worker:
            assert worker.mcp.states() == {"broken": "down"}
            assert failed.seen.is_set()
            assert worker.mcp.servers["broken"].last_error == (
                "ConnectionError: the server process exited with code 2"
            )


# -- the environment a stdio server gets -------------------------------------------


async def test_a_server_gets_its_env_and_the_basics_never_the_exporter_headers(
    broker: Broker, client: Caller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "authorization=Bearer s3cret",
        "TB_WORKER_SECRET": "hunter2",
    }
    for name, value in worker_env.items():
        monkeypatch.setenv(name, value)
    configured = misbehaving(tmp_path, TB_CONFIGURED="yes")
    naming = misbehaving(tmp_path, OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer mine")
    settings = make_settings(broker, mcpServers={"plain": configured, "named": naming})
    async with running_worker(settings, child_env=child_environment()) as worker:
        listed = await call(client, worker, "plain.environment")
        assert listed["ok"], listed
        names = set(json.loads(listed["result"]["text"]))
        assert {"TB_CONFIGURED", "TB_STATE_DIR", "OTEL_EXPORTER_OTLP_ENDPOINT", "PATH"} <= names
        assert not names & {
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "TB_WORKER_SECRET",
        }
        assert names <= {*basics(os.environ), "TB_CONFIGURED", "TB_STATE_DIR", *worker_env}
        own = await call(client, worker, "named.env_value", {"name": "OTEL_EXPORTER_OTLP_HEADERS"})
        assert own["result"]["text"] == "authorization=Bearer mine"


def test_child_environment_keeps_otel_settings_but_no_headers() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318",
        "OTEL_EXPORTER_OTLP_HEADERS": "a=b",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "a=b",
        "OTEL_RESOURCE_ATTRIBUTES": "site=home",
        "OTEL_SERVICE_NAME": "toolbus",
        "AWS_SECRET_ACCESS_KEY": "x",
    }
    assert child_environment(env) == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318",
        "OTEL_RESOURCE_ATTRIBUTES": "site=home",
    }


def test_the_server_environment_is_basics_then_passed_then_configured() -> None:
    worker = {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C", "TZ": "UTC", "SECRET": "x"}
    worker["BASH_FUNC_x%%"] = "() { :; }"
    worker["TERM"] = "() { evil; }"  # a shell function is never passed, even as a basic
    env = server_environment(worker, {"OTEL_X": "1", "HOME": "/p"}, {"HOME": "/c", "K": "v"})
    assert env == {
        "PATH": "/bin",
        "HOME": "/c",
        "LC_ALL": "C",
        "TZ": "UTC",
        "OTEL_X": "1",
        "K": "v",
    }


# -- URLs on spans -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("http://user:pw@host:8080/mcp?token=t#frag", "http://host:8080/mcp"),
        ("https://host/mcp", "https://host/mcp"),
        ("https://tok@[::1]:9/p?x=1", "https://[::1]:9/p"),
        ("http://host:notaport/mcp", ""),
    ],
)
def test_urls_on_spans_lose_userinfo_query_and_fragment(url: str, kept: str) -> None:
    assert url_without_secrets(url) == kept


async def test_the_tools_call_span_carries_no_secret_of_the_url(
    broker: Broker, client: Caller, spans: Any
) -> None:
    port = free_port()
    server = await start_http_demo(port)
    try:
        url = f"http://agent:pa55word@127.0.0.1:{port}/mcp?api_key=k3y"
        settings = make_settings(broker, mcpServers={"web": {"url": url}})
        async with running_worker(settings) as worker:
            reply = await call(client, worker, "list_devices")
            assert reply["ok"], reply
            trace_id = reply["trace_id"]
        [span] = [
            s
            for s in spans.get_finished_spans()
            if s.name == "tools/call list_devices"
            and format(s.context.trace_id, "032x") == trace_id
        ]
        attributes = dict(span.attributes)
        assert attributes["server.address"] == "127.0.0.1"
        assert attributes["server.port"] == port
        assert attributes["url.full"] == f"http://127.0.0.1:{port}/mcp"
        shown = json.dumps(attributes)
        assert "pa55word" not in shown and "k3y" not in shown and "agent" not in shown
        assert server_attributes(url) == {
            k: v for k, v in attributes.items() if k.startswith(("server.", "url."))
        }
    finally:
        await stop_process(server)


# -- the pure parts ----------------------------------------------------------------


def test_lines_split_across_chunks_and_the_open_line_is_the_rest() -> None:
    splitter = LineSplitter(limit_bytes=10)
    assert splitter.feed(b"ab") == []
    assert splitter.feed(b"c\nde\n\nf") == [b"abc", b"de", b""]
    assert splitter.feed(b"gh") == []
    assert splitter.rest() == b"fgh"
    assert splitter.rest() is None


def test_the_open_line_says_how_much_of_the_next_line_came_before() -> None:
    splitter = LineSplitter(limit_bytes=10)
    assert splitter.feed(b"ab") == [] and splitter.open
    assert splitter.feed(b"c") == [] and splitter.carried == 0  # no line ended yet
    assert splitter.feed(b"{}\nx\n") == [b"abc{}", b"x"] and splitter.carried == 3
    assert not splitter.open
    assert splitter.feed(b"y\n") == [b"y"] and splitter.carried == 0
    assert splitter.feed(b"12345678") == [] and splitter.feed(b"9abc\n") == [
        Oversized(12, b"123456789abc", b"123456789abc")
    ]
    assert splitter.carried == 0  # an oversized line is never taken apart


def test_a_line_over_the_limit_keeps_its_size_and_ends_only() -> None:
    splitter = LineSplitter(limit_bytes=4 * END_BYTES)
    body = bytes(range(256)).replace(b"\n", b" ") * (40 * END_BYTES // 256)
    chunks = [body[i : i + 1000] for i in range(0, len(body), 1000)]
    out: list[bytes | Oversized] = []
    for chunk in [*chunks, b"\nnext\n"]:
        out.extend(splitter.feed(chunk))
    assert out == [Oversized(len(body), body[:END_BYTES], body[-END_BYTES:]), b"next"]


def test_a_line_exactly_at_the_limit_is_whole() -> None:
    splitter = LineSplitter(limit_bytes=5)
    assert splitter.feed(b"12345\n123456\n") == [b"12345", Oversized(6, b"123456", b"123456")]


@pytest.mark.parametrize(
    ("line", "ident"),
    [
        (b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"text":"xxx', 7),
        (b'{ "id" : "a-1", "jsonrpc": "2.0", "error": {"code": 1', "a-1"),
        (b'{"result":{"content":[{"type":"text","text":"yy"}]},"jsonrpc":"2.0","id":12}', 12),
        (b'{"result":{"a":1},"id":3,"jsonrpc":"2.0"}\r', 3),
        (b'{"result":{"a":{"id":5}}}', None),  # an id nested in the result answers nothing
        (b'{"result":{"t":"x\\",\\"id\\":5}"}}', None),  # nor one inside a string
        (b'{"jsonrpc":"2.0","method":"notifications/message","params":{"id":5}}', None),
        (b'{"jsonrpc":"2.0","id":9,"method":"sampling/createMessage","params":{}}', None),
        (b"zzzzzz", None),
    ],
)
def test_answered_id_reads_only_the_envelope(line: bytes, ident: int | str | None) -> None:
    assert answered_id(Oversized(10**8, line[:END_BYTES], line[-END_BYTES:])) == ident
