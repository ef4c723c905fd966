"""Tracing's cost (issue 34): what was cut keeps its meaning, and what measures it runs.

The resource the tracer provider stamps on every span is hashed once (the OTLP encoder
hashes it per span); it must still hash and compare as the SDK's own resource does. The
bench's tracing worker takes a sampler (`--tracing-env`), and bench/tracing_cost.py,
which splits tracing's CPU per call between the loop and the exporter's thread, runs.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk import resources
from opentelemetry.sdk.resources import Resource

from toolbus.cli.bench.command import otel_variable
from toolbus.cli.bench.served import ServeOptions, environment
from toolbus.observability.sdk import TRACED_SWITCH_INTERVAL_S, HashedOnce, settle_for_tracing

ROOT = Path(__file__).resolve().parents[2]


def test_the_resource_hashed_once_is_the_sdks_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = Resource.create({"service.name": "toolbus", "deployment.environment": "test"})
    hashed = HashedOnce(plain)
    assert hashed == plain and plain == hashed
    expected = hash(plain)
    assert hash(hashed) == expected
    assert hashed.attributes == plain.attributes and hashed.schema_url == plain.schema_url
    assert {plain: "grouped"}[hashed] == "grouped"  # the encoder's grouping finds it
    # Hashed again without writing the attributes out (what the encoder paid per span).
    monkeypatch.setattr(resources, "dumps", lambda *a, **k: pytest.fail("hashed again"))
    assert hash(hashed) == expected


def test_a_worker_that_traces_freezes_its_heap_and_switches_the_gil_sooner() -> None:
    interval = sys.getswitchinterval()
    try:
        settle_for_tracing()
        assert gc.get_freeze_count() > 0
        assert sys.getswitchinterval() == pytest.approx(TRACED_SWITCH_INTERVAL_S)
        assert interval > TRACED_SWITCH_INTERVAL_S  # the interpreter's 5 ms
    finally:
        gc.unfreeze()
        sys.setswitchinterval(interval)


def test_the_tracing_worker_gets_the_benchs_otel_variables(tmp_path: Path) -> None:
    sampler = (
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
    )
    traced = environment(
        tmp_path, ServeOptions(otlp_endpoint="http://127.0.0.1:1", tracing_env=sampler)
    )
    assert traced["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert traced["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    assert traced["OTEL_TRACES_EXPORTER"] == "otlp"
    untraced = environment(tmp_path, ServeOptions())
    assert not any(name.startswith("OTEL_") for name in untraced)


def test_a_tracing_variable_is_otel_name_equals_value() -> None:
    assert otel_variable("OTEL_TRACES_SAMPLER_ARG=0.1") == ("OTEL_TRACES_SAMPLER_ARG", "0.1")
    assert otel_variable("OTEL_RESOURCE_ATTRIBUTES=a=b") == ("OTEL_RESOURCE_ATTRIBUTES", "a=b")
    for bad in ("OTEL_TRACES_SAMPLER", "PYTHONPATH=/elsewhere", "=x"):
        with pytest.raises(ValueError, match="--tracing-env"):
            otel_variable(bad)


def test_tracing_cost_bench_runs() -> None:
    result = subprocess.run(
        [sys.executable, "bench/tracing_cost.py", "--rounds", "1", "--calls", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "on process" in result.stdout and "on / off" in result.stdout
