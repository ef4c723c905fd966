"""The set-up scripts behind `make run`: the local broker starts, serves, and stops."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).parent.parent


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    # The script writes .run/ under the working directory: keep it out of the checkout.
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    shutil.copytree(ROOT / "config", tmp_path / "config")
    return tmp_path


async def test_local_broker_script_starts_and_stops(repo_copy: Path) -> None:
    from tests.mqtt import Caller

    port = free_port()
    script = str(repo_copy / "scripts" / "local-broker")
    started = subprocess.run(
        [script, "start", str(port)],
        cwd=repo_copy,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    try:
        again = subprocess.run(
            [script, "start", str(port)],
            cwd=repo_copy,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert again.returncode == 0 and "already listens" in again.stdout
        async with Caller(f"mqtt://127.0.0.1:{port}") as caller:
            await caller.subscribe("probe/x")
            await caller.publish("probe/x", b"hello")
            assert (await caller.next_message()).payload == b"hello"
    finally:
        stopped = subprocess.run(
            [script, "stop", str(port)],
            cwd=repo_copy,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert "stopped" in stopped.stdout
