"""`toolbus approve` against a real broker and worker: the person's answer comes on stdin
(not a terminal), so nothing here waits on a prompt; every run is bounded.

The worker gates caller `ops`'s calls of `busy` (a local tool that counts its runs), so a
test reads from the tool itself whether the approved call ran, once, or not at all.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest_asyncio

from tests.cli.test_cli import CLI_TIMEOUT_S, cli_env
from tests.support.harness import Broker, make_settings, running_worker
from tests.support.mqtt import Caller
from tests.support.tools import Probe, probe_tools
from toolbus.worker.service import Worker


@dataclass
class Gated:
    worker: Worker
    probe: Probe
    broker: Broker

    async def approve(self, *args: str, answer: str = "") -> tuple[int, str, str]:
        """`toolbus approve *args` as caller `ops`, `answer` on its stdin."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolbus",
            "approve",
            *args,
            "--caller",
            "ops",
            "--broker",
            self.broker.url,
            env=cli_env(self.worker.topics.prefix),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(CLI_TIMEOUT_S):
                out, err = await proc.communicate(answer.encode())
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()


@pytest_asyncio.fixture
async def gated(broker: Broker) -> AsyncIterator[Gated]:
    probe = Probe()
    settings = make_settings(broker, callers={"ops": {"approve": ["busy"]}})
    async with running_worker(settings, probe_tools(probe)) as worker:
        yield Gated(worker, probe, broker)


async def test_yes_on_stdin_sends_the_approved_call_once(gated: Gated) -> None:
    code, out, err = await gated.approve("busy", "n=3", answer="y\n")
    assert code == 0, err
    reply = json.loads(out)
    assert (reply["ok"], reply["result"]["structured"]) == (True, {"n": 3})
    # The person saw the call as it would run: "3" is the integer 3.
    assert "tool:      busy" in err and '"n": 3' in err
    assert gated.probe.calls == 1


async def test_no_sends_nothing(gated: Gated) -> None:
    code, out, err = await gated.approve("busy", "n=4", answer="no\n")
    assert (code, out) == (1, "")
    assert "not approved" in err
    assert gated.probe.calls == 0


async def test_an_ungated_call_is_answered_without_asking(gated: Gated) -> None:
    code, out, err = await gated.approve("echo", "text=hi")
    assert (code, json.loads(out)["ok"]) == (0, True)
    assert "approval" not in err


async def test_a_reply_someone_else_got_is_approved_with_yes(gated: Gated, tmp_path: Path) -> None:
    prefix = gated.worker.topics.prefix
    async with Caller(gated.broker.url) as agent:
        held, _ = await agent.call(
            f"{prefix}/call/busy",
            {"caller": "ops", "arguments": {"n": "5"}},
            reply_topic=f"{prefix}/reply/agent",
        )
    assert held["error"]["code"] == "approval_required"
    saved = tmp_path / "held.json"
    saved.write_text(json.dumps(held))
    code, out, err = await gated.approve("--reply", str(saved), "--yes")
    assert code == 0, err
    assert json.loads(out)["result"]["structured"] == {"n": 5}
    assert gated.probe.calls == 1
