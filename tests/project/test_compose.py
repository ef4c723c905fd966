"""The compose stack: its files agree with each other, and its configuration runs.

No Docker engine runs here (`scripts/check-compose` validates the file with
`docker-compose config`). The first tests read the files and check what the engine
would not: the profile keeps the default stack minimal, ids are stable, images pinned,
the ports each service is told to use are the ones the other listens on. The rest start
the same configuration natively (tests/support/compose_stack.py) and use it as a caller would.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
import yaml

from tests.support.compose_stack import (
    COLLECTOR_CONFIG,
    MOSQUITTO_CONF,
    PROMETHEUS_CONFIG,
    NativeStack,
    built_here,
    dockerfile,
    image_env,
    image_json,
    load_compose,
    port_of,
    worker_services,
)
from tests.support.harness import measured
from tests.support.mqtt import Caller, reply_topic_for
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.processes import ROOT, run_bounded
from toolbus.cli.health import get
from toolbus.config import Settings, load_settings
from toolbus.observability.sdk import exporter_choice
from toolbus.wire.contracts import WorkerStatus

PROFILE = "observability"
TRACING_ON = {"OTEL_TRACES_EXPORTER": "otlp"}
OTLP_SERVER = 2  # OTLP's SpanKind for a server span, as the receiver keeps it  # as docs/deployment.md starts the profile


def services(env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = load_compose(env)["services"]
    return found


def workers(env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    return worker_services(load_compose(env))


# -- the files, read -------------------------------------------------------------------


def test_the_profile_keeps_the_default_stack_minimal() -> None:
    every = services(TRACING_ON)
    profiled = {name for name, s in every.items() if s.get("profiles")}
    assert profiled == {"otel-collector", "jaeger", "prometheus", "grafana"}
    assert all(every[name]["profiles"] == [PROFILE] for name in profiled)
    default = set(every) - profiled
    assert default == {"mosquitto", "redis", "demo-mcp", *workers()}
    # Compose refuses to start a default service that needs one the profile leaves out.
    for name in default:
        assert not set(every[name].get("depends_on", {})) & profiled, name


def test_each_replica_has_its_own_stable_worker_id() -> None:
    found = workers()
    assert len(found) == 2
    ids = {name: s["environment"]["TOOLBUS_WORKER_ID"] for name, s in found.items()}
    assert len(set(ids.values())) == len(ids)
    for name, service in found.items():
        # Replicas of one service would share this environment, so the id.
        assert "replicas" not in service.get("deploy", {}), name
        settings = Settings(worker_id=ids[name])  # one plain topic level
        attributes = dict(
            pair.split("=", 1)
            for pair in service["environment"]["OTEL_RESOURCE_ATTRIBUTES"].split(",")
        )
        assert attributes["service.instance.id"] == settings.worker_id


def test_workers_check_their_health_and_stop_within_their_grace() -> None:
    config = load_settings(ROOT / "compose" / "toolbus.toml")
    for name, service in workers().items():
        assert service["healthcheck"]["test"] == ["CMD", "toolbus", "health"], name
        grace_s = int(service["stop_grace_period"].removesuffix("s"))
        flush_s = float(service["environment"]["OTEL_EXPORTER_OTLP_TIMEOUT"])
        assert grace_s > config.shutdown_grace_s + flush_s, name
    healthchecks = [rest for name, rest in dockerfile() if name == "HEALTHCHECK"]
    assert len(healthchecks) == 1 and healthchecks[0].endswith('CMD ["toolbus", "health"]')


def test_nothing_is_published_beyond_loopback() -> None:
    for name, service in services(TRACING_ON).items():
        for published in service.get("ports", []):
            assert str(published).startswith("127.0.0.1:"), (name, published)
    for name in workers():
        assert "ports" not in services()[name], name  # Prometheus scrapes inside the network


def test_our_image_is_built_by_one_service() -> None:
    ours = [name for name, service in services(TRACING_ON).items() if built_here(service)]
    builders = [name for name in ours if "build" in services(TRACING_ON)[name]]
    assert len(ours) >= 3 and builders == ["demo-mcp"], (ours, builders)
    assert all(
        services(TRACING_ON)[name]["build"]["dockerfile"] == "compose/Dockerfile"
        for name in builders
    )


def test_every_image_is_pinned() -> None:
    for name, service in services(TRACING_ON).items():
        image = service["image"]
        if image == "toolbus:latest":  # our own, built from this tree by one service
            assert ("build" in service) != (service.get("pull_policy") == "never"), name
        else:
            tag = image.rpartition(":")[2]
            assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), (name, image)
    base = next(rest for name, rest in dockerfile() if name == "FROM")
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base), base


def test_the_image_has_its_extras_and_runs_as_nobody_special() -> None:
    steps = dockerfile()
    installs = [rest for name, rest in steps if name == "RUN" and "pip install" in rest]
    # The extras' packages come from the lock the image installs (tests/project/test_release.py).
    assert "-r requirements.lock" in installs[0]
    lock = (ROOT / "compose" / "requirements.lock").read_text()
    assert all(f"\n{pin}==" in lock for pin in ("redis", "opentelemetry-exporter-prometheus"))
    users = [rest for name, rest in steps if name == "USER"]
    assert users and users[-1] not in {"root", "0"}
    assert image_json("CMD")[0] == "serve"
    env = image_env()
    assert env["TOOLBUS_HTTP_PORT"] and env["TOOLBUS_HTTP_HOST"] == "0.0.0.0"


def test_the_build_context_holds_only_what_the_image_copies() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"  # everything out, then the exceptions back in
    admitted = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = {
        source.rstrip("/")
        for name, rest in dockerfile()
        if name == "COPY"
        for source in rest.split()[:-1]
    }
    assert copied == admitted
    assert not admitted & {".git", ".venv", "tests", "compose", "node_modules", "build"}


def test_prometheus_scrapes_every_worker_where_it_listens() -> None:
    jobs = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"]
    job = next(j for j in jobs if j["job_name"] == "toolbus")
    assert job.get("metrics_path", "/metrics") == "/metrics"
    scraped = {
        target: group.get("labels", {}).get("worker_id")
        for group in job["static_configs"]
        for target in group["targets"]
    }
    expected = {
        f"{name}:{s['environment']['TOOLBUS_HTTP_PORT']}": s["environment"]["TOOLBUS_WORKER_ID"]
        for name, s in workers().items()
    }
    assert scraped == expected
    for service in workers().values():  # listening where Prometheus can reach it
        assert service["environment"]["TOOLBUS_HTTP_HOST"] == "0.0.0.0"


def test_the_collector_receives_where_the_workers_export_and_sends_to_jaeger() -> None:
    every = services(TRACING_ON)
    collector = yaml.safe_load(COLLECTOR_CONFIG.read_text())
    http_receiver = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    for name, service in [*workers(TRACING_ON).items(), ("demo-mcp", every["demo-mcp"])]:
        env = service["environment"]
        endpoint = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert endpoint.hostname == "otel-collector" and "otel-collector" in every, name
        assert endpoint.port == port_of(http_receiver), name
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf", name
    pipeline = collector["service"]["pipelines"]["traces"]
    assert pipeline["receivers"] == ["otlp"]
    assert set(pipeline["processors"]) <= set(collector["processors"])
    [exporter] = pipeline["exporters"]
    target = collector["exporters"][exporter]["endpoint"]
    assert target == "jaeger:4317" and "jaeger" in every  # Jaeger's OTLP/gRPC port
    assert every["jaeger"]["ports"] == ["127.0.0.1:16686:16686"]  # its UI
    assert "collector" in " ".join(every["otel-collector"]["volumes"])


def test_tracing_is_off_unless_the_profile_is_asked_for_it() -> None:
    for env, traces in (({}, "none"), (TRACING_ON, "otlp")):
        # The demo server too: its span of each call joins the worker's trace.
        for service in [*workers(env).values(), services(env)["demo-mcp"]]:
            environment = {k: str(v) for k, v in service["environment"].items()}
            assert exporter_choice(environment, "TRACES") == traces
            assert exporter_choice(environment, "METRICS") == "none"  # Prometheus scrapes


def test_the_broker_saves_its_sessions_and_sends_without_delay() -> None:
    lines = {line.strip() for line in MOSQUITTO_CONF.read_text().splitlines()}
    assert {"persistence true", "set_tcp_nodelay true"} <= lines
    # A login, a subscription and a delivery (tests/project/test_compose_hardening.py runs it).
    kind, command = services()["mosquitto"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL" and command.startswith("mosquitto_sub ")
    assert "'$SYS/broker/uptime'" in command


# -- the same configuration, running --------------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def stack(
    tmp_path_factory: pytest.TempPathFactory, collector: OtlpReceiver
) -> AsyncIterator[NativeStack]:
    async with NativeStack(tmp_path_factory.mktemp("compose"), collector, TRACING_ON) as running:
        yield running


async def test_both_replicas_are_online_under_their_stable_ids(stack: NativeStack) -> None:
    expected = {w.worker_id for w in stack.workers.values()}
    assert expected == {"toolbus-1", "toolbus-2"}
    seen: dict[str, WorkerStatus] = {}
    async with Caller(stack.broker.url) as watcher:
        # Retained: a dashboard subscribing now learns the pool at once.
        await watcher.subscribe(stack.topics.status("+"))
        async with asyncio.timeout(10):
            while set(seen) != expected:
                status = WorkerStatus.model_validate_json((await watcher.next_message()).payload)
                seen[status.worker_id] = status
    assert {status.state for status in seen.values()} == {"online"}


async def test_calls_through_the_shared_subscription_are_answered(stack: NativeStack) -> None:
    topics = stack.topics
    async with Caller(stack.broker.url) as caller:
        replies = await asyncio.gather(
            *(caller.call_tool(topics, "echo", {"text": f"t{i}"}) for i in range(16))
        )
        assert [r["result"]["structured"]["text"] for r in replies] == [f"t{i}" for i in range(16)]
        # The demo MCP server, its own service, over streamable HTTP; the compose
        # toolbus.toml's argument map renames the keys.
        device = await caller.call_tool(
            topics, "control_zwave_device", {"device_name": "Switch Two", "command": "on"}
        )
        assert device["ok"], device
        assert device["result"]["structured"]["received"] == {
            "deviceName": "Switch Two",
            "action": "on",
        }
        # Redis, shared by the replicas: a request id seen once is answered from the store
        # (the same client, so the same reply topic: an anonymous client's ids are its).
        request_id, mine = uuid.uuid4().hex, reply_topic_for(topics)
        first = await caller.call_tool(
            topics, "echo", {"text": "once"}, id=request_id, reply_topic=mine
        )
        again = await caller.call_tool(
            topics, "echo", {"text": "once"}, id=request_id, reply_topic=mine
        )
    assert first["ok"] and not first["replayed"]
    assert again["replayed"] and again["result"] == first["result"]


async def test_spans_of_both_replicas_reach_the_collector(
    stack: NativeStack, collector: OtlpReceiver
) -> None:
    ids = {w.worker_id for w in stack.workers.values()}
    async with Caller(stack.broker.url) as caller:
        # One after another: the broker hands them round the group.
        arguments = {"device_name": "Switch Two", "command": "off"}
        replies = [
            await caller.call_tool(stack.topics, "control_zwave_device", arguments)
            for _ in range(6)
        ]
    traces = {reply["trace_id"] for reply in replies}

    def mine(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [s for s in spans if s.trace_id in traces]

    def every_trace_ended(spans: list[ReceivedSpan]) -> bool:
        # A message's `process` span ends last, just after its reply has left; the demo
        # server's spans come from another process, in their own time.
        ended = {s.trace_id for s in mine(spans) if s.name.startswith("process ")}
        served = {s.trace_id for s in mine(spans) if s.resource["service.name"] != "toolbus"}
        return ended == served == traces

    spans = mine(await collector.wait_for(every_trace_ended))
    assert {s.resource["service.name"] for s in spans} == {"toolbus", "toolbus-demo-devices"}
    calls = [s for s in spans if s.name == "execute_tool control_zwave_device"]
    assert {s.resource["service.instance.id"] for s in calls} == ids
    # Each call's MCP leg over streamable HTTP: ours, the SDK's beneath it, the server's.
    by_id = {s.span_id: s for s in spans}
    ours = [s for s in spans if s.attributes.get("toolbus.mcp.server") == "devices"]
    assert {s.trace_id for s in ours} == traces
    for client in ours:
        assert by_id[client.parent_span_id].name == "execute_tool control_zwave_device"
        [sdk] = [s for s in spans if s.parent_span_id == client.span_id]
        [server] = [s for s in spans if s.parent_span_id == sdk.span_id]
        assert (server.name, server.kind) == ("tools/call control_zwave_device", OTLP_SERVER)
        assert server.resource["service.name"] == "toolbus-demo-devices"


async def test_each_worker_serves_its_metrics_and_passes_its_healthcheck(
    stack: NativeStack,
) -> None:
    async with Caller(stack.broker.url) as caller:
        for i in range(6):  # one after another: the broker hands them round the group
            assert (await caller.call_tool(stack.topics, "echo", {"text": f"m{i}"}))["ok"]
    for worker in stack.workers.values():
        # Where Prometheus scrapes it (prometheus.yml's target is this port in compose).
        status, body = await asyncio.to_thread(
            get, f"http://127.0.0.1:{worker.http_port}/metrics", 5.0
        )
        assert status == 200, worker.service
        calls = re.search(rb'^toolbus_calls_total\{[^}]*tool="echo"[^}]*\} (\S+)$', body, re.M)
        assert calls is not None and float(calls[1]) >= 1, (worker.service, body[:2000])
        # The compose healthcheck as the container runs it: its command, its environment
        # (TOOLBUS_HTTP_HOST=0.0.0.0 asks loopback), the port this worker listens on.
        command = services()[worker.service]["healthcheck"]["test"]
        assert command[:2] == ["CMD", "toolbus"]
        env = {
            **worker.env,
            "TOOLBUS_HTTP_HOST": workers()[worker.service]["environment"]["TOOLBUS_HTTP_HOST"],
        }
        started = time.monotonic()
        code, out, err = await run_bounded(
            sys.executable, "-m", "toolbus", *command[2:], env=env, bound_s=30
        )
        assert code == 0, (worker.service, out, err)
        measured(
            f"compose healthcheck `toolbus health` ({worker.service}): {time.monotonic() - started:.2f} s wall"
        )
