"""The HTTP listener and `toolbus health`, against running workers and a real mosquitto.

In-process: a worker and its listener on a free port in the test's loop (/healthz,
/readyz before, while and after the broker is there, the bind address, the buckets).
As a process: `toolbus serve` with `TOOLBUS_HTTP_PORT`, scraped as Prometheus would,
probed by `toolbus health`, frozen (SIGSTOP) to show a probe fails within its timeout,
and stopped with SIGTERM to show the listener leaves the worker's signals alone.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry

from tests.cli.test_cli import cli_env, run_cli
from tests.support.fleet import recording_env
from tests.support.harness import (
    DEMO_SERVER,
    Broker,
    free_port,
    make_settings,
    measured,
    running_worker,
)
from tests.support.logwait import watching
from tests.support.processes import Serve
from toolbus.cli.health import EXIT_HEALTHY, EXIT_UNHEALTHY, default_url
from toolbus.config import Settings
from toolbus.observability.metrics import Metrics
from toolbus.observability.sdk import CALL_DURATION_BUCKETS_S, metric_views
from toolbus.worker.exit_codes import EXIT_OK
from toolbus.worker.http import HttpListener
from toolbus.worker.service import Worker
from toolbus.worker.wiring import build_worker, serve_http

BOUND_S = 30.0
HOLD_S = 6.0  # a call held through a drain


def client() -> httpx.AsyncClient:
    # trust_env=False: an HTTP_PROXY in the environment must not carry loopback requests.
    return httpx.AsyncClient(timeout=10.0, trust_env=False)


@asynccontextmanager
async def listening(worker: Worker, **kwargs: Any) -> AsyncIterator[str]:
    """The worker's listener on a free loopback port; its base URL."""
    async with HttpListener(worker, host="127.0.0.1", port=0, **kwargs) as listener:
        yield f"http://127.0.0.1:{listener.port}"


async def test_healthz_and_readyz_of_a_ready_worker(broker: Broker) -> None:
    settings = make_settings(broker, mcpServers={"devices": DEMO_SERVER}, worker_id="ready-1")
    async with running_worker(settings) as worker, listening(worker) as base, client() as http:
        health = await http.get(f"{base}/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "ok"
        assert health.json()["loop_lag_ms"] >= 0
        ready = await http.get(f"{base}/readyz")
        assert ready.status_code == 200
        assert ready.json() == {
            "ready": True,
            "worker_id": "ready-1",
            "broker": {"address": f"127.0.0.1:{broker.port}", "state": "subscribed"},
            "servers": {"devices": {"state": "ready", "last_error": None}},
        }
        code, out, _ = await run_cli("health", "--url", f"{base}/readyz", env=cli_env("x"))
        assert code == EXIT_HEALTHY, out
        assert "devices ready" in out


async def test_health_of_a_url_without_a_path_asks_its_readyz(broker: Broker) -> None:
    """`--url http://host:port` probes /readyz; a URL with a path, that path."""
    async with running_worker(make_settings(broker)) as worker, listening(worker) as base:
        for given in (base, f"{base}/"):
            code, out, err = await run_cli("health", "--url", given, env=cli_env("x"))
            assert code == EXIT_HEALTHY, err
            assert out.startswith(f"{base}/readyz: 200")
        code, _, err = await run_cli("health", "--url", f"{base}/no-such-path", env=cli_env("x"))
        assert code == EXIT_UNHEALTHY
        assert f"{base}/no-such-path answered 404" in err


async def test_readyz_follows_the_broker(tmp_path: Path) -> None:
    """503 while the broker is not there yet, 200 once subscribed, 503 when it goes."""
    own = Broker(tmp_path)  # not started yet: nothing listens on its port
    settings = make_settings(own, mcpServers={"missing": {"command": str(tmp_path / "nope")}})
    worker = build_worker(settings, [])
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop), name="worker-under-test")
    try:
        async with listening(worker) as base, client() as http:
            before = await http.get(f"{base}/readyz")
            assert before.status_code == 503
            assert before.json()["broker"]["state"] == "disconnected"
            assert (await http.get(f"{base}/healthz")).status_code == 200
            code, _, err = await run_cli("health", "--url", f"{base}/readyz", env=cli_env("x"))
            assert code == EXIT_UNHEALTHY
            assert "503" in err
            own.start()
            async with asyncio.timeout(BOUND_S):
                await worker.subscribed.wait()
            during = await http.get(f"{base}/readyz")
            assert during.status_code == 200
            server = during.json()["servers"]["missing"]
            assert server["state"] != "ready"
            assert server["last_error"]  # why it is not: the command does not exist
            with watching("toolbus.service", "broker connection lost") as lost:
                own.stop()
                async with asyncio.timeout(BOUND_S):
                    await lost.seen.wait()
            after = await http.get(f"{base}/readyz")
            assert after.status_code == 503
            assert after.json()["broker"]["state"] == "disconnected"
    finally:
        stop.set()
        async with asyncio.timeout(worker.stop_bound_s + 5):
            await task
        own.stop()


async def test_the_listener_binds_loopback_unless_told(broker: Broker) -> None:
    settings = make_settings(broker, http_port=free_port())
    assert settings.http_host == "127.0.0.1"
    async with running_worker(settings) as worker, serve_http(settings, worker) as listener:
        assert isinstance(listener, HttpListener)
        assert listener.address == ("127.0.0.1", settings.http_port)
        async with client() as http:
            response = await http.get(f"http://127.0.0.1:{settings.http_port}/healthz")
            assert response.status_code == 200


async def test_a_port_already_taken_fails_the_start(broker: Broker) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        async with running_worker(make_settings(broker)) as worker:
            with pytest.raises(OSError) as refused:  # noqa: PT011 -- its errno is checked below
                async with HttpListener(worker, host="127.0.0.1", port=port):
                    pass
    assert refused.value.errno == errno.EADDRINUSE


async def test_no_listener_without_http_port(broker: Broker) -> None:
    settings = make_settings(broker)
    async with running_worker(settings) as worker, serve_http(settings, worker) as listener:
        assert listener is None


def test_metrics_port_is_a_deprecated_alias_of_http_port() -> None:
    assert Settings(metrics_port=9100).http_port == 9100
    assert Settings(metrics_port=9100, http_port=9200).http_port == 9200


def test_the_health_url_asks_loopback_for_a_wildcard_bind() -> None:
    assert default_url("0.0.0.0", 9100) == "http://127.0.0.1:9100/readyz"
    assert default_url("::", 9100) == "http://[::1]:9100/readyz"
    assert default_url("10.1.2.3", 9100) == "http://10.1.2.3:9100/readyz"


async def test_a_20_ms_call_lands_in_its_bucket(broker: Broker) -> None:
    """Bounds in seconds: 20 ms counts in `le="0.025"` and not in `le="0.01"` (with the
    SDK's default bounds, 0 ... 10000, every call would land in the first bucket)."""
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    provider = MeterProvider(metric_readers=[reader], views=metric_views())
    Metrics(provider.get_meter("toolbus")).call_done("sensor", "ok", 0.020, [])
    async with (
        running_worker(make_settings(broker)) as worker,
        listening(worker, registry=registry) as base,
        client() as http,
    ):
        text = (await http.get(f"{base}/metrics")).text
    provider.shutdown()
    buckets = bucket_counts(text, "sensor")
    assert buckets["0.01"] == 0
    assert buckets["0.025"] == 1
    assert list(buckets) == [*(repr(float(b)) for b in CALL_DURATION_BUCKETS_S), "+Inf"]


async def test_metrics_without_the_prometheus_extra(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # `import` now fails
    async with (
        running_worker(make_settings(broker)) as worker,
        listening(worker) as base,
        client() as http,
    ):
        response = await http.get(f"{base}/metrics")
        assert response.status_code == 501
        # What to install, and never `pip install 'toolbus[...]'` from PyPI, where that
        # name is not ours.
        assert "opentelemetry-exporter-prometheus" in response.text
        assert "pip install 'toolbus" not in response.text
        assert (await http.get(f"{base}/readyz")).status_code == 200


def bucket_counts(text: str, tool: str) -> dict[str, float]:
    """`le` -> count of `toolbus_call_duration_seconds_bucket` for `tool`, in text order."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("toolbus_call_duration_seconds_bucket{") and f'tool="{tool}"' in line:
            le = re.search(r'le="([^"]+)"', line)
            assert le is not None
            found[le.group(1)] = float(line.rsplit(" ", 1)[1])
    return found


@pytest.mark.slow
async def test_toolbus_serve_with_http_port(broker: Broker, tmp_path: Path) -> None:
    port = free_port()
    env = recording_env(tmp_path, f"http{port}", http_port=str(port), shutdown_grace_s="60")
    env.pop("TOOLBUS_HTTP_HOST", None)
    async with Serve(env, "--broker", broker.url) as serve, client() as http:
        await serve.wait_for("subscribed to")
        assert any(f"on http://127.0.0.1:{port}" in line for line in serve.stderr)
        code, out, err = await run_cli("health", env=env)  # the URL from the settings
        assert code == EXIT_HEALTHY, err
        assert out.startswith(f"http://127.0.0.1:{port}/readyz: 200")

        code, _, err = await run_cli("call", "echo", "text=hi", "--broker", broker.url, env=env)
        assert code == EXIT_OK, err
        metrics = await http.get(f"http://127.0.0.1:{port}/metrics")
        assert metrics.status_code == 200
        assert "toolbus_calls_total{" in metrics.text
        assert re.search(r'toolbus_calls_total\{[^}]*outcome="ok"[^}]*tool="echo"', metrics.text)
        buckets = bucket_counts(metrics.text, "echo")
        assert list(buckets) == [*(repr(float(b)) for b in CALL_DURATION_BUCKETS_S), "+Inf"]
        assert buckets["+Inf"] == 1

        # A frozen worker (its loop blocked as badly as can be): connected, never answered.
        started = time.monotonic()
        code, _, _ = await run_cli("health", "--url", f"http://127.0.0.1:{free_port()}/", env=env)
        assert code == EXIT_UNHEALTHY
        refused_s = time.monotonic() - started  # a probe's own cost, answered at once
        os.kill(serve.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            code, _, err = await run_cli("health", "--timeout", "1", env=env)
            frozen_s = time.monotonic() - started
        finally:
            os.kill(serve.pid, signal.SIGCONT)
        assert code == EXIT_UNHEALTHY
        assert "no answer in time" in err
        assert 1.0 <= frozen_s < refused_s + 1.0 + 5.0  # its timeout, and a margin for load
        measured(
            f"toolbus health: {refused_s:.2f} s refused, {frozen_s:.2f} s frozen (--timeout 1)"
        )

        # SIGTERM drains the worker, and /readyz says `stopping` throughout: the listener
        # took none of the worker's signals (uvicorn's own handling would close it at once
        # while the worker drains on).
        held = asyncio.create_task(
            run_cli("call", "record", "key=a", f"hold_s:={HOLD_S}", "--broker", broker.url, env=env)
        )
        await serve.wait_for("record started a")
        os.kill(serve.pid, signal.SIGTERM)
        await serve.wait_for('"in_flight":1')
        end = time.monotonic() + HOLD_S / 3  # well inside the drain, which lasts HOLD_S
        while time.monotonic() < end:
            draining = await http.get(f"http://127.0.0.1:{port}/readyz")
            assert draining.status_code == 503
            assert draining.json()["broker"]["state"] == "stopping"
            await asyncio.sleep(0.2)  # probe pacing, as a prober's interval; not a wait
        assert await serve.exit_code() == EXIT_OK
        async with asyncio.timeout(BOUND_S):
            assert (await held)[0] == EXIT_OK  # answered before the worker left
    code, _, err = await run_cli("health", "--timeout", "1", env=env)
    assert code == EXIT_UNHEALTHY  # nothing listens there any more
    assert "refused" in err.lower()


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}/readyz", "ftp://x/"])
async def test_health_against_nothing_is_unhealthy(url: str) -> None:
    code, _, err = await run_cli(
        "health", "--url", url.format(port=free_port()), "--timeout", "2", env=cli_env("x")
    )
    assert code == EXIT_UNHEALTHY
    assert err.count("\n") == 1  # one readable line


async def test_health_without_a_port_is_unhealthy() -> None:
    env = {k: v for k, v in cli_env("x").items() if not k.startswith("TOOLBUS_HTTP")}
    code, _, err = await run_cli("health", env=env)
    assert code == EXIT_UNHEALTHY
    assert "http_port" in err


async def test_health_tells_a_bad_configuration_as_serve_does(tmp_path: Path) -> None:
    """Without --url the probe reads the settings: a typo is told one problem a line, at
    its key, and the probe is unhealthy (Docker reserves exit 2)."""
    config = tmp_path / "t.toml"
    config.write_text('http_port = 9999\nconcurency = 3\nlog_level = "x"\n')
    code, _, err = await run_cli("health", "--config", str(config), env=cli_env("x"))
    assert code == EXIT_UNHEALTHY
    lines = err.splitlines()
    assert len(lines) == 2  # one problem a line, as `toolbus serve` tells them
    assert sorted(("`log_level`" in line, "`concurency`" in line) for line in lines) == [
        (False, True),
        (True, False),
    ]
