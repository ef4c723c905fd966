"""The benchmarks still run: `toolbus bench` and bench/normalize.py, with tiny numbers.

Their figures are not checked here (speed is measured, never asserted); what is checked
is that each one runs to its table, so a refactor cannot leave them broken unnoticed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import mosquitto_binary

ROOT = Path(__file__).parent.parent
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{Path(mosquitto_binary()).parent}"
        f"{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "200",
    }
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT, env=env
    )


@pytest.mark.parametrize(
    ("flags", "ratio_row"),
    [((), "baseline/shipped"), (("--tracing",), "on / off")],
    ids=["nagle", "tracing"],
)
def test_toolbus_bench_runs(flags: tuple[str, ...], ratio_row: str) -> None:
    result = run(str(BIN / "toolbus"), "bench", "--requests", "10", "--concurrency", "4", *flags)
    assert result.returncode == 0, result.stderr[-2000:]
    assert ratio_row in result.stdout, result.stdout


def test_normalize_bench_runs() -> None:
    result = run(sys.executable, "bench/normalize.py", "--rounds", "1", "--calls", "5")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "seed control call" in result.stdout and "analysis context" in result.stdout


def test_flood_bench_runs() -> None:
    result = run(sys.executable, "bench/flood.py", "--requests", "200", "--timeout", "60")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "answered 200" in result.stdout, result.stdout


def test_mcp_output_bench_runs() -> None:
    result = run(sys.executable, "bench/mcp_output.py", "--scale", "0.01")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["case"] for row in rows] == [
        "stdout-line-100mb",
        "result-50mb",
        "result-50mb-id-last",
        "stderr-line-100kb",
    ]
    assert all(row["next_call"].startswith("ok") for row in rows), rows


def test_client_latency_bench_runs() -> None:
    result = run(sys.executable, "bench/client_latency.py", "--calls", "5")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "one Client, kept" in result.stdout and "per call / kept" in result.stdout
