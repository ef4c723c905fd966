"""The status page (`/` and `/status.json` on the HTTP listener), from the outside.

A real `toolbus serve` with `http_port` on a real mosquitto, with its demo MCP server, a
caller profile and another worker's retained status on the broker: a few calls (one of
them an error), then `/status.json` shows them, and the page, rendered by a real
headless chromium (Debian's, nothing downloaded), shows what its script fetched. The
page is also rendered against a listener that answers markup in every name (shown as
text, never run) and one that answers nothing (it says the worker is unreachable).

The browser tests run wherever the suite runs (`make test` installs chromium); only
TOOLBUS_SKIP_BROWSER=1 skips them, never a missing browser. With
TOOLBUS_STATUS_PAGE_SCREENSHOT=<file.png> the served page's screenshot is written there
(docs/images/status-page.png is made so).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

import toolbus
from tests.support.harness import Broker, free_port, unique_prefix
from tests.support.processes import Serve, run_bounded, serve_env
from toolbus import Client
from toolbus.observability.recent import BOUNDS_S, MAX_KEYS, RecentCalls
from toolbus.wire.errors import UnknownTool
from toolbus.wire.topics import Topics
from toolbus.worker.fleet import MAX_STATUS_BYTES, MAX_WORKERS, Fleet
from toolbus.worker.status_page import PAGE

BOUND_S = 30.0
BROWSER_BOUND_S = 20.0
SECRET_VALUE = "s3cret-argument-value"  # passed to a tool: never on the page
OTHER = "other-worker-7"
BROWSER = pytest.mark.skipif(
    os.environ.get("TOOLBUS_SKIP_BROWSER") == "1", reason="TOOLBUS_SKIP_BROWSER=1 asked so"
)


def chromium() -> str:
    """The browser: TOOLBUS_CHROMIUM, else Debian's chromium (`make test` installs it)."""
    found = os.environ.get("TOOLBUS_CHROMIUM") or shutil.which("chromium")
    found = found or shutil.which("chromium-browser") or shutil.which("google-chrome")
    assert found, "no chromium: run scripts/ensure-chromium (or TOOLBUS_SKIP_BROWSER=1)"
    return found


async def render(url: str, *, screenshot: Path | None = None) -> str:
    """The DOM of `url` after its script has run (5 s of the page's virtual time: two
    polls and more), as chromium serializes it."""
    with tempfile.TemporaryDirectory(prefix="toolbus-chromium-") as profile:
        flags = [
            "--headless",
            "--no-sandbox",  # tests may run as root (CI containers)
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",
            "--window-size=1280,900",
        ]
        if screenshot is not None:
            flags.append(f"--screenshot={screenshot}")
        else:
            flags.append("--dump-dom")
        env = {**os.environ, "HOME": profile}
        code, out, err = await run_bounded(
            chromium(), *flags, url, env=env, bound_s=BROWSER_BOUND_S
        )
    assert code == 0, err[-2000:]
    return out


def text_of(dom: str, element_id: str) -> str:
    """The text inside the element with `element_id` (tags dropped; up to the first
    closing tag of its own name, so not for an element nesting its own kind)."""
    found = re.search(rf'<(\w+)[^>]*\bid="{element_id}"[^>]*>(.*?)</\1>', dom, re.S)
    assert found, f"no #{element_id} in the page"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found.group(2)))


@dataclass
class Served:
    base: str
    prefix: str


async def mosquitto_pub(broker: Broker, topic: str, payload: str) -> None:
    argv = ["mosquitto_pub", "-p", str(broker.port), "-V", "mqttv5", "-q", "1", "-r"]
    code, _, err = await run_bounded(
        *argv, "-t", topic, "-m", payload, env=dict(os.environ), bound_s=10
    )
    assert code == 0, err


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """`toolbus serve` (the bundled config: the demo MCP server `devices`) with http_port,
    a `kitchen` profile allowed `echo` only, another worker's retained status, and three
    calls answered: two `ok`, one `unknown_tool`."""
    port, prefix = free_port(), unique_prefix()
    env = serve_env(
        http_port=str(port),
        topic_prefix=prefix,
        worker_id="page-1",
        callers=json.dumps({"kitchen": {"tools": ["echo"]}}),
    )
    # The bundled config runs `toolbus demo-server` from PATH: this venv's, however pytest
    # was started (`make test` puts it first; `.venv/bin/pytest` alone does not).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    other = f"{prefix}/status/workers/{OTHER}"
    status = {"state": "online", "worker_id": OTHER, "in_flight": 2, "handled": 7}
    status["version"] = "9.8.7"
    status["servers"] = {"devices": {"state": "ready"}}
    async with Serve(env, "--broker", broker.url) as serve:
        await serve.wait_for("subscribed to")
        base = f"http://127.0.0.1:{port}"
        await until(base, _ready)  # the demo server's tools are listed
        await mosquitto_pub(broker, other, json.dumps(status))
        async with Client(broker.url, prefix=prefix, caller="kitchen") as client:
            for _ in range(2):
                await client.call("echo", {"text": SECRET_VALUE})
            with pytest.raises(UnknownTool):
                await client.call("no_such_tool", {"text": SECRET_VALUE})
        await until(base, lambda s: OTHER in [w["worker_id"] for w in s["fleet"]])
        yield Served(base, prefix)
        await mosquitto_pub(broker, other, "")  # a retained status cleared


def _ready(status: dict[str, Any]) -> bool:
    return bool(status["servers"]) and status["servers"][0]["state"] == "ready"


async def until(base: str, done: Any) -> dict[str, Any]:
    """/status.json, asked again until `done(it)` (bounded)."""
    status: dict[str, Any] = {}
    try:
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
            async with asyncio.timeout(BOUND_S):
                while True:
                    response = await http.get(f"{base}/status.json")
                    assert response.status_code == 200, f"/status.json: {response.status_code}"
                    if done(status := response.json()):
                        break
                    await asyncio.sleep(0.1)  # an outside process's state, bounded above
    except TimeoutError:
        pytest.fail(f"/status.json never became what was waited for: {status}")
    return status


async def test_status_json_shows_the_fleet_servers_profiles_and_recent_calls(
    served: Served,
) -> None:
    async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
        response = await http.get(f"{served.base}/status.json")
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"
    status = response.json()
    assert status["worker_id"] == "page-1"
    assert status["broker"]["state"] == "subscribed"
    fleet = {w["worker_id"]: w for w in status["fleet"]}
    assert fleet["page-1"]["self"] is True
    assert fleet["page-1"]["state"] == "online"
    assert fleet["page-1"]["handled"] == 3
    assert fleet["page-1"]["servers"] == {"devices": "ready"}
    assert (fleet["page-1"]["version"], fleet[OTHER]["version"]) == (toolbus.__version__, "9.8.7")
    assert (fleet[OTHER]["state"], fleet[OTHER]["handled"], fleet[OTHER]["in_flight"]) == (
        "online",
        7,
        2,
    )
    assert status["servers"] == [
        {"name": "devices", "state": "ready", "last_error": None, "tools": 3}
    ]
    profiles = {p["caller"]: p for p in status["profiles"]}
    assert profiles["kitchen"]["tools"] == ["echo"]
    assert {"echo", "datetime", "list_devices"} <= set(profiles["*"]["tools"])
    assert status["in_flight"] == {
        "messages": 0,
        "concurrency": 64,  # the bundled config's
        "queued": 0,
        "handled": 3,
        "max_seen": 1,
    }
    recent = status["recent"]
    assert recent["outcomes"] == {"ok": 2, "unknown_tool": 1}
    assert recent["errors"] == {"unknown_tool": 1}
    assert recent["calls"] == 3
    assert 0 < recent["p50_ms"] <= recent["p99_ms"]
    assert sum(m["calls"] for m in recent["minutes"]) == 3
    assert SECRET_VALUE not in response.text  # names, states and counts; never a value


@BROWSER
async def test_the_page_renders_what_it_fetched_in_chromium(served: Served) -> None:
    started = time.monotonic()
    dom = await render(f"{served.base}/")
    assert text_of(dom, "conn").strip() == "live"
    assert text_of(dom, "worker-id").strip() == "page-1"
    fleet = text_of(dom, "fleet")
    assert "page-1 (this worker)" in fleet
    assert OTHER in fleet
    assert "devices: ready" in fleet
    assert "9.8.7" in fleet  # each worker's version, as its status reports it
    assert re.search(r"devices\s+ready\s+3", text_of(dom, "servers"))
    assert re.search(r"unknown_tool\s+1", text_of(dom, "errors"))
    assert re.search(r"kitchen\s+1\s+echo", text_of(dom, "profiles"))
    assert "list_devices" in text_of(dom, "profiles")
    assert text_of(dom, "k-calls").strip() == "3"
    assert text_of(dom, "k-errors").strip() == "1"
    assert text_of(dom, "k-p99").strip().endswith("ms")
    assert SECRET_VALUE not in dom
    if target := os.environ.get("TOOLBUS_STATUS_PAGE_SCREENSHOT"):
        await render(f"{served.base}/", screenshot=Path(target).resolve())
        assert Path(target).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert time.monotonic() - started < BROWSER_BOUND_S


@contextlib.contextmanager
def static_listener(status: int, body: dict[str, Any] | None) -> Iterator[str]:
    """A stand-in listener: the page at `/`, `status.json` answering `status` and `body`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = self.path == "/"
            data = PAGE if page else json.dumps(body).encode()
            self.send_response(200 if page else status)
            self.send_header("Content-Type", "text/html" if page else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


MARKUP = '<img src=x onerror="document.title=1">'


@BROWSER
async def test_names_with_markup_are_shown_as_text() -> None:
    body = {
        "worker_id": MARKUP,
        "broker": {"address": MARKUP, "state": "subscribed"},
        "in_flight": {"messages": 0, "concurrency": 1, "queued": 0, "handled": 0},
        "fleet": [
            {
                "worker_id": MARKUP,
                "state": "online",
                "in_flight": 0,
                "handled": 0,
                "servers": {MARKUP: MARKUP},
            }
        ],
        "servers": [{"name": MARKUP, "state": MARKUP, "last_error": MARKUP, "tools": 0}],
        "profiles": [{"caller": MARKUP, "tools": [MARKUP], "count": 1}],
        "recent": {
            "window_s": 300,
            "calls": 1,
            "outcomes": {MARKUP: 1},
            "errors": {MARKUP: 1},
            "dead_letters": {MARKUP: 1},
            "p50_ms": 1.0,
            "p99_ms": 1.0,
            "minutes": [],
        },
    }
    with static_listener(200, body) as url:
        dom = await render(url)
    assert "<img" not in dom  # no element made from the data
    assert dom.count("&lt;img src=x onerror=") >= 8  # every name, shown as text
    assert "<title>toolbus status</title>" in dom  # the handler never ran


@BROWSER
async def test_the_page_says_when_the_worker_is_unreachable() -> None:
    with static_listener(503, {"error": "gone"}) as url:
        dom = await render(url)
    assert re.search(r'<body class="down"', dom)
    assert text_of(dom, "conn").strip() == "unreachable"
    assert "HTTP 503" in text_of(dom, "banner-why")


# -- the bounded parts, in-process ----------------------------------------------------


def test_the_recent_window_keeps_its_minutes_and_no_more() -> None:
    now = [1_000_000.0]
    recent = RecentCalls(minutes=3, clock=lambda: now[0])
    for minute in range(10):
        now[0] = 1_000_000.0 + 60 * minute
        for i in range(1000):
            recent.call_done("ok" if i % 10 else f"code_{i}", 0.001 * (1 + i % 100))
    snapshot = recent.snapshot()
    assert len(snapshot["minutes"]) == 3
    assert snapshot["calls"] == 3000
    assert len(snapshot["outcomes"]) <= MAX_KEYS + 1  # the rest add up as `other`
    assert snapshot["outcomes"]["other"] > 0
    assert snapshot["p50_ms"] is not None
    assert 40 <= snapshot["p50_ms"] <= 65  # durations 1 ... 100 ms, evenly
    assert 95 <= snapshot["p99_ms"] <= 120
    now[0] += 3600  # an hour of silence: nothing left in the window
    assert RecentCalls.snapshot(recent)["calls"] == 0
    assert recent.snapshot()["p99_ms"] is None
    assert len(BOUNDS_S) < 64


def test_the_fleet_is_bounded_and_forgets_the_silent() -> None:
    now = [0.0]
    topics = Topics("t", "g", ("t/reply/",))
    fleet = Fleet(topics, stale_after_s=45, clock=lambda: now[0])
    for i in range(MAX_WORKERS + 10):
        status = {"state": "online", "worker_id": f"w{i}"}
        fleet.heard(topics.status(f"w{i}"), json.dumps(status).encode())
    assert len(fleet.snapshot()) == MAX_WORKERS
    fleet.heard(topics.status("w300"), b"")  # cleared
    fleet.heard(topics.status("w301"), b"not json")  # another version's: not shown
    assert "w300" not in [w["worker_id"] for w in fleet.snapshot()]
    now[0] = 46
    assert fleet.snapshot() == []
    # Bounded by bytes too: 256 statuses of a megabyte each would be 256 MiB kept.
    padded = {"state": "online", "worker_id": "big", "servers": {}}
    padded["servers"] = {f"s{i}": {"state": "ready"} for i in range(MAX_STATUS_BYTES // 20)}
    fleet.heard(topics.status("big"), json.dumps(padded).encode())
    assert fleet.snapshot() == []
