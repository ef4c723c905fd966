"""docs/integrations.md, as written: each `sh run:NAME` block runs unchanged against
`toolbus serve` with the bundled config (tests/support/bundled.py), mosquitto's clients pointed at
the test's broker by their own options files (`$XDG_CONFIG_HOME/mosquitto_rr`), not by
editing the commands; the Home Assistant package's templates are rendered with Jinja2,
what its automation publishes goes through toolbus' own decoder and then to the worker,
and its sensor and notification templates read the replies that come back.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jinja2
import pytest
import pytest_asyncio
import yaml
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import TypeAdapter

from tests.support.bundled import PREFIX, bundled_worker
from tests.support.harness import Broker
from tests.support.mqtt import Caller
from tests.support.processes import run_bounded
from toolbus.calls.call import Call
from toolbus.config import Settings
from toolbus.doors.envelope.decode import decode
from toolbus.wire.messages import Inbound
from toolbus.worker.wiring import topics_for

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "integrations.md"
HOME_ASSISTANT = ROOT / "docs" / "integrations" / "home-assistant.yaml"
BLOCK = re.compile(r"^```sh run:(?P<name>\S+)\n(?P<code>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
YAML_BLOCK = re.compile(r"^```yaml\n(?P<text>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
RUN_BOUND_S = 30.0
TIMED_OUT = 27  # mosquitto_rr's exit code when no response came within -W


def blocks() -> dict[str, str]:
    return {m["name"]: m["code"] for m in BLOCK.finditer(PAGE.read_text(encoding="utf-8"))}


@pytest_asyncio.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Broker]:
    async with bundled_worker(tmp_path_factory.mktemp("integrations-broker")) as broker:
        yield broker


@pytest.fixture(scope="module")
def clients_env(served: Broker, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """mosquitto_rr and mosquitto_sub default to the test's broker; mosquitto_sub also
    prints its debug lines, so a test can see when it has subscribed."""
    for client in ("mosquitto_rr", "mosquitto_sub"):
        if shutil.which(client) is None:
            pytest.fail(f"{client} is not installed: `make test` installs mosquitto-clients")
    config = tmp_path_factory.mktemp("xdg")
    options = f"-h 127.0.0.1\n-p {served.port}\n"
    (config / "mosquitto_rr").write_text(options)
    (config / "mosquitto_sub").write_text(options + "-d\n")
    return {"PATH": os.environ.get("PATH", ""), "XDG_CONFIG_HOME": str(config)}


async def run_block(name: str, env: dict[str, str]) -> tuple[int, str]:
    """The block's exit code and output."""
    code, out, err = await run_bounded("bash", "-c", blocks()[name], env=env, bound_s=RUN_BOUND_S)
    return code, out + err


def test_the_runnable_blocks_are_the_ones_judged() -> None:
    assert set(blocks()) == {"rr-echo", "rr-device", "rr-tools", "dead-letters", "rr-forbidden"}


async def test_rr_echo(clients_env: dict[str, str]) -> None:
    code, out = await run_block("rr-echo", clients_env)
    assert code == 0, out
    reply = json.loads(out)
    assert reply["ok"] and reply["tool"] == "echo"
    assert reply["result"]["structured"]["text"] == "hello"


async def test_rr_device_echoes_the_correlation_data(clients_env: dict[str, str]) -> None:
    code, out = await run_block("rr-device", clients_env)
    assert code == 0, out
    correlation, body = out.split(" ", 1)  # -F '%D %p'
    assert correlation == "lamp-1"
    reply = json.loads(body)
    assert reply["ok"], reply
    assert reply["result"]["structured"]["received"] == {"deviceName": "Switch One", "action": "on"}
    assert {n["rule"] for n in reply["normalized"]} == {"static_map"}


async def test_rr_tools_lists_openai_definitions(clients_env: dict[str, str]) -> None:
    code, out = await run_block("rr-tools", clients_env)
    assert code == 0, out
    reply = json.loads(out)
    assert reply["ok"], reply
    tools = reply["result"]["structured"]["tools"]
    TypeAdapter(list[ChatCompletionFunctionToolParam]).validate_python(tools)
    assert {"echo", "control_zwave_device"} <= {t["function"]["name"] for t in tools}


@asynccontextmanager
async def on_a_terminal(
    name: str, env: dict[str, str]
) -> AsyncIterator[Callable[[bytes], Awaitable[bytes]]]:
    """The block started with a terminal for its output, as in the page (a pipe would
    hold mosquitto_sub's lines back until it ends); yields `line_with(marker)`, which
    reads up to the first line holding `marker` (bounded) and returns it."""
    main, other = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", blocks()[name], env=env, stdout=other, stderr=other
    )
    os.close(other)
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[bytes] = asyncio.Queue()

    def read() -> None:  # in a thread: a terminal whose program ended reads as EIO
        with os.fdopen(main, "rb", buffering=0) as terminal:
            try:
                for line in terminal:
                    loop.call_soon_threadsafe(lines.put_nowait, line)
            except OSError:
                pass
        loop.call_soon_threadsafe(lines.put_nowait, b"")

    reader = loop.run_in_executor(None, read)

    async def line_with(marker: bytes) -> bytes:
        seen: list[bytes] = []
        async with asyncio.timeout(RUN_BOUND_S):
            while marker not in (line := await lines.get()):
                assert line, f"{name} ended first: {b''.join(seen)!r}"
                seen.append(line)
        return line

    try:
        yield line_with
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        async with asyncio.timeout(RUN_BOUND_S):
            await reader


async def test_a_reply_topic_outside_the_prefixes_gets_no_reply_and_a_dead_letter(
    clients_env: dict[str, str],
) -> None:
    async with on_a_terminal("dead-letters", clients_env) as line_with:
        await line_with(b"Subscribed")  # its debug line (-d, from its options file)
        code, out = await run_block("rr-forbidden", clients_env)
        assert code == TIMED_OUT, out
        line = await line_with(b'{"topic"')
    dead = json.loads(line)
    assert dead["error"]["code"] == "forbidden"
    assert dead["error"]["details"]["reason"] == "outside_prefixes"
    assert dead["error"]["details"]["reply_topic"] == "replies/me"


# Home Assistant ---------------------------------------------------------------------------

# Automation runs' context ids (ULIDs): a new one per run, so each call has an id of its own.
CONTEXT_ID = "01JD6Q3F5W7K8M9N0P1Q2R3S4T"
NEXT_CONTEXT_ID = "01JD6Q4A0B1C2D3E4F5G6H7J8K"


def package() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(HOME_ASSISTANT.read_text(encoding="utf-8"))
    return loaded


def render(template: str, **variables: Any) -> str:
    """As Home Assistant renders it (Jinja2); a name the template gets wrong fails."""
    return (
        jinja2.Environment(undefined=jinja2.StrictUndefined)
        .from_string(template)
        .render(**variables)
    )


def automation(automation_id: str) -> dict[str, Any]:
    found: dict[str, Any] = next(a for a in package()["automation"] if a["id"] == automation_id)
    return found


def published(context_id: str = CONTEXT_ID) -> tuple[str, int, bytes]:
    """Topic, QoS and payload of the call the button's automation publishes."""
    (action,) = automation("toolbus_switch_one_on")["actions"]
    assert action["action"] == "mqtt.publish"
    data = action["data"]
    return data["topic"], data["qos"], render(data["payload"], context={"id": context_id}).encode()


def sensor() -> dict[str, Any]:
    (found,) = package()["mqtt"]["sensor"]
    assert isinstance(found, dict)
    return found


def test_the_page_shows_the_package_as_it_is() -> None:
    shown = [m["text"] for m in YAML_BLOCK.finditer(PAGE.read_text(encoding="utf-8"))]
    assert shown == [HOME_ASSISTANT.read_text(encoding="utf-8")]


def test_the_automation_publishes_a_call_toolbus_accepts_under_default_settings() -> None:
    topic, qos, payload = published()
    topics = topics_for(Settings())
    decoded = decode(Inbound(topic=topic, payload=payload, qos=qos), topics, 256 * 1024)
    assert isinstance(decoded, Call), decoded
    assert (decoded.tool, decoded.id, decoded.id_generated) == (
        "control_zwave_device",
        f"ha-{CONTEXT_ID}",
        False,
    )
    assert decoded.arguments == {"device_name": "Switch One", "command": "on"}
    assert qos == 1
    # The reply goes where the sensor and the failure trigger listen, and may go there.
    assert decoded.reply is not None and decoded.reply.correlation_data is None
    failed = automation("toolbus_call_failed")["triggers"][0]
    assert decoded.reply.topic == sensor()["state_topic"] == failed["topic"]
    assert topics.reply_problem(decoded.reply.topic, None) is None


async def test_the_package_round_trip(served: Broker) -> None:
    topic, qos, payload = published()
    reply_topic = sensor()["state_topic"]
    async with Caller(served.url, v5=False) as home_assistant:  # HA's mqtt.publish: no v5
        await home_assistant.subscribe(reply_topic)
        await home_assistant.client.publish(topic, payload, qos=qos)
        ok = json.loads((await home_assistant.next_message()).payload)
        # A call the same way to a tool that does not exist: what the notification is for.
        _, _, again = published(NEXT_CONTEXT_ID)
        await home_assistant.client.publish(f"{PREFIX}/call/ecko", again, qos=qos)
        failed = json.loads((await home_assistant.next_message()).payload)

    assert ok["ok"] and ok["id"] == f"ha-{CONTEXT_ID}", ok
    assert render(sensor()["value_template"], value_json=ok) == "ok"
    attributes = json.loads(render(sensor()["json_attributes_template"], value_json=ok))
    assert attributes["result"]["structured"]["received"]["deviceName"] == "Switch One"

    assert not failed["ok"] and failed["error"]["code"] == "unknown_tool", failed
    assert render(sensor()["value_template"], value_json=failed) == "unknown_tool"
    notify = automation("toolbus_call_failed")
    trigger = {"payload_json": failed}
    (condition,) = notify["conditions"]
    assert render(condition["value_template"], trigger=trigger) == "True"
    assert render(condition["value_template"], trigger={"payload_json": ok}) == "False"
    (action,) = notify["actions"]
    assert render(action["data"]["title"], trigger=trigger) == "toolbus: unknown_tool"
    assert f"ha-{NEXT_CONTEXT_ID}" in render(action["data"]["message"], trigger=trigger)
