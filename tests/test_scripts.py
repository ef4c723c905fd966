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


def run_script(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(repo / "scripts" / "local-broker"), *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


async def test_local_broker_script_starts_and_stops(repo_copy: Path) -> None:
    from tests.mqtt import Caller

    port = str(free_port())
    started = run_script(repo_copy, "start", port)
    assert started.returncode == 0, started.stderr
    try:
        again = run_script(repo_copy, "start", port)
        assert again.returncode == 0 and "already listens" in again.stdout
        async with Caller(f"mqtt://127.0.0.1:{port}") as caller:
            await caller.subscribe("probe/x")
            await caller.publish("probe/x", b"hello")
            assert (await caller.next_message()).payload == b"hello"
    finally:
        stopped = run_script(repo_copy, "stop", port)
    assert "stopped" in stopped.stdout
