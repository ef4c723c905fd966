"""The compose stack's Grafana dashboard: Grafana's schema accepts it, and Grafana is
provisioned to show it over the compose Prometheus.

The schema is Grafana's own as grafana-foundation-sdk publishes it (models generated from
Grafana's schemas, for the Grafana release the compose service runs), installed by
scripts/ensure-grafana-sdk into a venv of its own; tools/grafana/check_dashboard.py judges
a dashboard by it. A broken copy shows the check can fail. Which metrics the panels ask
for, against a real worker: test_alerts.py.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.support.compose_stack import COMPOSE_DIR, load_compose, mounted
from tests.support.processes import ROOT

DASHBOARDS = COMPOSE_DIR / "grafana" / "dashboards"
DASHBOARD = DASHBOARDS / "toolbus.json"
PROVISIONING = COMPOSE_DIR / "grafana" / "provisioning"
SDK_PYTHON = ROOT / ".tools" / "grafana-sdk" / "bin" / "python"
CHECKER = ROOT / "tools" / "grafana" / "check_dashboard.py"


def grafana() -> dict[str, Any]:
    service: dict[str, Any] = load_compose({"OTEL_TRACES_EXPORTER": "otlp"})["services"]["grafana"]
    return service


def dashboard() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return found


def schema_check(*paths: Path) -> list[str]:
    """What the schema check says of each file (`FILE: PROBLEM` lines)."""
    installed = subprocess.run(
        [str(ROOT / "scripts" / "ensure-grafana-sdk")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    result = subprocess.run(
        [str(SDK_PYTHON), str(CHECKER), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert not result.stderr, result.stderr
    assert result.returncode == (1 if result.stdout else 0), result.stdout
    return result.stdout.splitlines()


def test_grafanas_schema_accepts_the_dashboard_and_refuses_a_broken_one(tmp_path: Path) -> None:
    broken = copy.deepcopy(dashboard())
    timeseries = next(p for p in broken["panels"] if p["type"] == "timeseries")
    timeseries["options"]["legend"]["placment"] = "bottom"  # misspelt: not in the schema
    timeseries["options"]["tooltip"]["mode"] = "all"  # not one of single, multi, none
    timeseries["gridPos"]["w"] = "12"  # a string where the schema has an integer
    del timeseries["targets"][0]["refId"]  # required
    broken_path = tmp_path / "broken.json"
    broken_path.write_text(json.dumps(broken))

    said = schema_check(DASHBOARD, broken_path)
    assert [line for line in said if line.startswith(str(DASHBOARD))] == []
    problems = {line.removeprefix(f"{broken_path}: ").split(":")[0] for line in said}
    i = broken["panels"].index(timeseries)
    assert problems == {
        f"$.panels[{i}].options.legend.placment",
        f"$.panels[{i}].options.tooltip.mode",
        f"$.panels[{i}].gridPos.w",
        f"$.panels[{i}].targets[0]",
    }


def test_the_panels_show_what_operators_watch() -> None:
    panels = {panel["title"]: panel for panel in dashboard()["panels"]}
    assert {
        "Workers up",
        "MCP servers",
        "Calls by outcome",
        "Call duration p50 and p99",
        "in_doubt answers",
        "Dead letters",
    } <= set(panels)
    quantiles = {
        float(q) for t in panels["Call duration p50 and p99"]["targets"]
        for q in re.findall(r"histogram_quantile\(([\d.]+)", t["expr"])
    }  # fmt: skip
    assert quantiles == {0.5, 0.99}
    ids = [panel["id"] for panel in dashboard()["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in dashboard()["panels"]:  # inside Grafana's 24 columns, none overlapping
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
    cells = [
        (x, y)
        for panel in dashboard()["panels"]
        for x in range(panel["gridPos"]["x"], panel["gridPos"]["x"] + panel["gridPos"]["w"])
        for y in range(panel["gridPos"]["y"], panel["gridPos"]["y"] + panel["gridPos"]["h"])
    ]
    assert len(set(cells)) == len(cells)


def test_grafana_reads_the_dashboard_from_the_compose_prometheus() -> None:
    service = grafana()
    assert service["profiles"] == ["observability"]
    [provider] = yaml.safe_load((PROVISIONING / "dashboards" / "toolbus.yml").read_text())[
        "providers"
    ]
    assert mounted(service, provider["options"]["path"]) == DASHBOARDS.resolve()
    home = service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
    for kind in ("datasources", "dashboards"):
        target = f"/etc/grafana/provisioning/{kind}"
        assert mounted(service, target) == (PROVISIONING / kind).resolve()

    [source] = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    url = urlsplit(source["url"])
    prometheus = load_compose({"OTEL_TRACES_EXPORTER": "otlp"})["services"]["prometheus"]
    assert url.hostname == "prometheus" and "prometheus" in service["depends_on"]
    assert any(str(port).endswith(f":{url.port}") for port in prometheus["ports"])
    scrape = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    assert source["jsonData"]["timeInterval"] == scrape["global"]["scrape_interval"]
    # Every panel and query names the provisioned data source by its uid.
    for panel in dashboard()["panels"]:
        refs = [panel["datasource"], *(t["datasource"] for t in panel["targets"])]
        assert all(ref == {"type": "prometheus", "uid": source["uid"]} for ref in refs), panel


def test_grafana_runs_the_release_the_schema_is_for() -> None:
    tag = grafana()["image"].rpartition(":")[2]
    pins = (ROOT / "tools" / "grafana" / "requirements.txt").read_text()
    [schema_for] = re.findall(r"^grafana-foundation-sdk==\d+!(\d+\.\d+)\.\d+", pins, re.M)
    assert tag.rsplit(".", 1)[0] == schema_for, (tag, schema_for)
    assert "--hash=sha256:" in pins  # pip installs it only as it was when pinned
