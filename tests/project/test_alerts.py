"""The compose stack's Prometheus alert rules and Grafana dashboard, against the tools that
run them and a real worker.

promtool (Debian's `prometheus` package; scripts/ensure-promtool) checks the rules, the
configuration that loads them, and compose/prometheus/alerts.test.yml: series that fire
each alert, and series that must not. Then a real `toolbus serve` with an HTTP listener,
given a call and a dead letter over a real mosquitto, is scraped as Prometheus would: every
metric the rules and the dashboard ask for, with the labels and the outcome and code values
they match, is one the worker serves. Last, Prometheus itself (Debian's, 2.42; compose runs
3.5) with the compose job, labels and rules scrapes a real worker every second: every rule
evaluates, every panel's query is answered, the first dead letter fires its alert, and a
killed worker's ToolbusWorkerDown turns pending. (The dashboard's schema: test_dashboard.py.)
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.cli.test_cli import cli_env
from tests.support.compose_stack import COMPOSE_DIR, PROMETHEUS_CONFIG, load_compose, mounted
from tests.support.harness import Broker, free_port
from tests.support.mqtt import Caller, call_topic
from tests.support.processes import ROOT, Serve
from toolbus.wire.contracts import ErrorCode
from toolbus.wire.topics import Topics

ALERTS = COMPOSE_DIR / "prometheus" / "alerts.yml"
ALERT_TESTS = COMPOSE_DIR / "prometheus" / "alerts.test.yml"
DASHBOARD = COMPOSE_DIR / "grafana" / "dashboards" / "toolbus.json"
JOB = "toolbus"
# A selector: a metric name, then its label matchers, if any.
SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
# PromQL's own words, and Grafana's variables: never metric names.
PROMQL_WORDS = {
    "sum", "by", "without", "rate", "increase", "histogram_quantile", "absent", "offset",
    "unless", "or", "and", "bool", "on", "ignoring", "group_left", "group_right",
}  # fmt: skip


def ensure_prometheus() -> None:
    """promtool and prometheus (Debian's package has both); `make test` installed them."""
    installed = subprocess.run(
        [str(ROOT / "scripts" / "ensure-promtool")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """promtool, in the repository root (paths in its output are relative to it)."""
    ensure_prometheus()
    binary = shutil.which("promtool") or "/usr/bin/promtool"
    return subprocess.run(
        [binary, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard_targets() -> list[tuple[str, str]]:
    """Every panel's queries, each with the panel's title."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def dashboard_queries() -> list[str]:
    return [expr for _, expr in dashboard_targets()]


def test_promtool_finds_the_rules_valid() -> None:
    checked = promtool("check", "rules", str(ALERTS.relative_to(ROOT)))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout


def test_prometheus_loads_the_rules_where_compose_mounts_them() -> None:
    """prometheus.yml's rule_files, relative to it, reach alerts.yml here and in the container."""
    checked = promtool("check", "config", str(PROMETHEUS_CONFIG.relative_to(ROOT)))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    prometheus = load_compose({"OTEL_TRACES_EXPORTER": "otlp"})["services"]["prometheus"]
    config_dir = "/etc/prometheus"
    assert mounted(prometheus, f"{config_dir}/prometheus.yml") == PROMETHEUS_CONFIG
    for name in config["rule_files"]:
        assert mounted(prometheus, f"{config_dir}/{name}") == (PROMETHEUS_CONFIG.parent / name)
    assert (PROMETHEUS_CONFIG.parent / config["rule_files"][0]) == ALERTS


def test_each_alert_fires_on_its_series_and_only_then() -> None:
    tested = promtool("test", "rules", str(ALERT_TESTS.relative_to(ROOT)))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Each alert has a case where it fires, and one where it must not.
    cases = [
        case for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]  # fmt: skip
    for rule in rules():
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), rule["alert"]
        assert any(not case["exp_alerts"] for case in mine), rule["alert"]


def test_each_alert_says_what_and_how_bad() -> None:
    for rule in rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    documented = (ROOT / "docs" / "operations.md").read_text()
    for rule in rules():
        assert f"`{rule['alert']}`" in documented, f"{rule['alert']} is not in docs/operations.md"


async def scrape_a_worker(broker: Broker) -> str:
    """/metrics of a real worker (the bundled config, with its demo MCP server) after one
    call and one dead letter, as Prometheus would scrape it."""
    prefix, port = "alerts", free_port()
    env = cli_env(prefix)
    env["TOOLBUS_HTTP_PORT"] = str(port)
    topics = Topics(prefix, "toolbus", (f"{prefix}/reply/",))
    async with Serve(env, "--broker", broker.url) as serve, Caller(broker.url) as caller:
        await serve.wait_for("subscribed to")
        assert (await caller.call_tool(topics, "echo", {"text": "hi"}))["ok"]
        await caller.subscribe(topics.dead)
        # Not JSON, and no reply address: the worker can only dead-letter it.
        await caller.publish(call_topic(topics, "echo"), b"not json")
        dead = await caller.next_message()
        assert dead.topic.value == topics.dead
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
            response = await http.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200
    return response.text


def served(text: str) -> dict[str, set[str]]:
    """Each sample name the worker serves, with its label names."""
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def scrape_labels() -> set[str]:
    """What Prometheus adds to each scraped series: job, instance, the targets' labels."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == JOB]
    return {"job", "instance"} | {
        label for group in job["static_configs"] for label in group.get("labels", {})
    }


async def test_every_metric_the_rules_and_dashboard_use_is_served(broker: Broker) -> None:
    metrics = served(await scrape_a_worker(broker))
    # `up` is Prometheus' own, per target: labelled as the scrape labels every series.
    metrics["up"] = set()
    added = scrape_labels()
    values = {"outcome": {"ok", *ErrorCode}, "code": set(ErrorCode), "job": {JOB}}
    queries = [rule["expr"] for rule in rules()] + dashboard_queries()
    used: set[str] = set()
    for query in queries:
        bare = re.sub(r"\[[^\]]*\]", "", query)  # ranges: [5m], [$__rate_interval]
        grouped = {label.strip() for group in GROUPING.findall(bare) for label in group.split(",")}
        bare = GROUPING.sub("", bare)
        bare = re.sub(r'"[^"]*"', '""', re.sub(r"\boffset\s+\w+", "", bare))
        for name, matchers in SELECTOR.findall(re.sub(r"\b\d[\w.]*", "", bare)):
            if name in PROMQL_WORDS or (not matchers and name in grouped):
                continue
            used.add(name)
            assert name in metrics, (name, query, sorted(metrics))
        for name, matchers in SELECTOR.findall(query):
            if name not in metrics:
                continue
            for label, op, value in MATCHER.findall(matchers):
                assert label in metrics[name] | added, (name, label, query)
                if label in values:
                    wanted = value.split("|") if op in ("=~", "!~") else [value]
                    assert set(wanted) <= values[label], (label, value, query)
        every_label = set().union(*metrics.values()) | added
        assert grouped <= every_label, (grouped - every_label, query)
    # What the issue asks to watch: calls by outcome, latency, dead letters, MCP servers, up.
    assert {
        "toolbus_calls_total",
        "toolbus_call_duration_seconds_bucket",
        "toolbus_dead_letters_total",
        "toolbus_mcp_server_up",
        "up",
    } <= used


def test_the_queries_ask_for_the_toolbus_job() -> None:
    """Every selector names the job prometheus.yml scrapes the workers as, so a Prometheus
    that also scrapes other things never mixes them in."""
    for query in [rule["expr"] for rule in rules()] + dashboard_queries():
        for name, matchers in SELECTOR.findall(query):
            if name.startswith("toolbus_") or name == "up":
                assert f'job="{JOB}"' in matchers, (name, query)


def test_dashboard_rates_span_its_scrape_interval() -> None:
    """Grafana's $__rate_interval, never a fixed range that a zoom could make shorter
    than two scrapes (rate() of a single sample is nothing)."""
    for query in dashboard_queries():
        for window in re.findall(r"\[([^\]]*)\]", query):
            assert window == "$__rate_interval", query


# -- a real Prometheus over a real worker -------------------------------------------------

PROMETHEUS_BOUND_S = 30.0


async def until(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    """`check()`'s first truthy answer, asked at a scrape's pace, within a bound."""
    try:
        async with asyncio.timeout(PROMETHEUS_BOUND_S):
            while not (found := await check()):
                await asyncio.sleep(0.25)  # Prometheus' pace (1 s scrapes): no event to wait on
    except TimeoutError:
        pytest.fail(f"not within {PROMETHEUS_BOUND_S} s: {what}")
    return found


@asynccontextmanager
async def prometheus(config: dict[str, Any], directory: Path) -> AsyncIterator[str]:
    """Debian's Prometheus with `config`, on a free loopback port: its base URL."""
    ensure_prometheus()
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    process = await asyncio.create_subprocess_exec(
        binary,
        f"--config.file={path}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address={address}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as http:

            async def ready() -> bool:
                try:
                    return (await http.get(f"http://{address}/-/ready")).status_code == 200
                except httpx.TransportError:
                    return False

            await until(ready, "Prometheus ready")
        yield f"http://{address}"
    finally:
        process.kill()
        async with asyncio.timeout(PROMETHEUS_BOUND_S):
            await process.wait()


async def test_a_real_prometheus_runs_the_rules_and_the_dashboard_on_a_real_worker(
    broker: Broker, tmp_path: Path
) -> None:
    """The compose prometheus.yml's job, labels and rules, scraping a real worker every
    second: every rule evaluates without error, every panel's query is answered (with
    series where the worker has them), the first dead letter fires its alert at once,
    and a killed worker puts ToolbusWorkerDown in `pending` (its 2 minutes left out)."""
    prefix, port = "e2e", free_port()
    env = cli_env(prefix)
    env["TOOLBUS_HTTP_PORT"] = str(port)
    topics = Topics(prefix, "toolbus", (f"{prefix}/reply/",))
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(PROMETHEUS_CONFIG.parent / name) for name in config["rule_files"]]
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == JOB]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"], "labels": {"worker_id": "w-1"}}]
    async with (
        Serve(env, "--broker", broker.url) as serve,
        Caller(broker.url) as caller,
        prometheus(config, tmp_path) as base,
        httpx.AsyncClient(timeout=10.0, trust_env=False) as http,
    ):
        await serve.wait_for("subscribed to")

        async def query(expr: str) -> list[dict[str, Any]]:
            answer = (await http.get(f"{base}/api/v1/query", params={"query": expr})).json()
            assert answer["status"] == "success" and not answer.get("warnings"), (expr, answer)
            result: list[dict[str, Any]] = answer["data"]["result"]
            return result

        async def alerts() -> dict[str, list[dict[str, Any]]]:
            found = (await http.get(f"{base}/api/v1/alerts")).json()["data"]["alerts"]
            named: dict[str, list[dict[str, Any]]] = {}
            for alert in found:
                named.setdefault(alert["labels"]["alertname"], []).append(alert)
            return named

        await until(lambda: query(f'up{{job="{JOB}"}} == 1'), "the worker scraped")
        await until(lambda: query("toolbus_mcp_server_up == 1"), "its MCP server ready")
        assert (await caller.call_tool(topics, "echo", {"text": "hi"}))["ok"]
        await caller.subscribe(topics.dead)
        await caller.publish(call_topic(topics, "echo"), b"not json")
        await caller.next_message()  # the dead letter
        await until(lambda: query("toolbus_dead_letters_total"), "the dead letter scraped")

        async def every_rule_evaluated() -> list[dict[str, Any]]:
            groups = (await http.get(f"{base}/api/v1/rules")).json()["data"]["groups"]
            evaluated = [r for g in groups for r in g["rules"] if r["evaluationTime"] > 0]
            return evaluated if len(evaluated) == len(rules()) else []

        for rule in await until(every_rule_evaluated, "every rule evaluated"):
            assert rule["health"] == "ok", rule

        async def dead_letters() -> list[dict[str, Any]]:
            return (await alerts()).get("ToolbusDeadLetters", [])

        [dead] = await until(dead_letters, "ToolbusDeadLetters")
        assert dead["state"] == "firing"  # at once: the rule has no `for`
        assert dead["labels"] == {
            "alertname": "ToolbusDeadLetters", "severity": "warning",
            "worker_id": "w-1", "code": ErrorCode.BAD_REQUEST.value,
        }  # fmt: skip
        assert set(await alerts()) == {"ToolbusDeadLetters"}, await alerts()  # nothing else

        for title, expr in dashboard_targets():
            promql = expr.replace("$__rate_interval", "1m")  # as Grafana fills it in
            await query(promql)  # accepted, even where the worker has nothing yet
            if title != "in_doubt answers":  # the one thing this worker has not done
                # With series once two scrapes are in the range.
                await until(functools.partial(query, promql), f"{title}: {expr}")

        os.kill(serve.pid, signal.SIGKILL)

        async def down() -> list[dict[str, Any]]:
            return (await alerts()).get("ToolbusWorkerDown", [])

        [worker_down] = await until(down, "ToolbusWorkerDown pending")
        assert worker_down["state"] == "pending"  # firing after its 2 minutes
        assert worker_down["labels"]["worker_id"] == "w-1"
