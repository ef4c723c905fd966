"""docs/tools.md, run: every example in the guide to writing a tool (issue 30.8).

Each `python` block is saved under the file name its first line gives and imported;
its tools go through the worker's pipeline (in process, a `ListPublisher` for the
broker) and are called as the guide says, with the replies and codes it says; the
schema it shows is the schema the tool has. Then its `pyproject.toml` is installed the
way pip leaves a package (the modules and a `.dist-info` with its entry points, in a
directory on the worker's PYTHONPATH) and a real `toolbus serve` on a real broker loads
the tools through the `toolbus.tools` entry points and answers them.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.calls.test_pipeline import REPLY, Rig, rig_for
from tests.support.harness import Broker, unique_prefix
from tests.support.processes import Serve, serve_env
from tests.support.tools import Probe
from toolbus.backends.local.functions import ENTRY_POINT_GROUP, LocalTool
from toolbus.client.client import Client
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.errors import InvalidArguments, ToolFailed

DOC = Path(__file__).parents[2] / "docs" / "tools.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE_NAME = re.compile(r"# ([\w.-]+)\n")
MODULES = ("greeting", "thermostat", "lamps", "firmware", "switch")


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(DOC.read_text()) if lang == language]


def files() -> dict[str, str]:
    """The guide's files, by the name each block's first line gives."""
    named: dict[str, str] = {}
    for body in [*blocks("python"), *blocks("toml")]:
        if match := FILE_NAME.match(body):
            named[match[1]] = body
    return named


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guide's package as pip installs it: its modules and a dist-info beside them."""
    where = tmp_path_factory.mktemp("site")
    written = files()
    for module in MODULES:
        (where / f"{module}.py").write_text(written[f"{module}.py"])
    project = tomllib.loads(written["pyproject.toml"])
    dist = where / "home_tools-1.0.dist-info"
    dist.mkdir()
    meta = project["project"]
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n"
    )
    points = meta["entry-points"][ENTRY_POINT_GROUP]
    lines = "".join(f"{name} = {target}\n" for name, target in points.items())
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")
    assert set(project["tool"]["setuptools"]["py-modules"]) == set(MODULES)
    return where


@pytest.fixture(scope="module")
def modules(package: Path) -> Iterator[dict[str, ModuleType]]:
    sys.path.insert(0, str(package))
    try:
        yield {name: importlib.import_module(name) for name in MODULES}
    finally:
        sys.path.remove(str(package))
        for name in MODULES:
            sys.modules.pop(name, None)


@pytest.fixture
def rig(modules: dict[str, ModuleType]) -> Rig:
    found = [
        value
        for module in modules.values()
        for value in vars(module).values()
        if isinstance(value, LocalTool)
    ]
    return rig_for(found, Probe())


def test_every_python_block_is_a_named_file() -> None:
    assert sorted(files()) == sorted([*(f"{m}.py" for m in MODULES), "pyproject.toml"])
    assert all(FILE_NAME.match(body) for body in blocks("python"))


async def test_a_first_tool(rig: Rig, modules: dict[str, ModuleType]) -> None:
    greet = modules["greeting"].greet
    assert (greet.name, greet.description) == ("greet", "Greet someone by name.")
    reply = await rig.call("greet", {"arguments": {"name": "Ada"}})
    assert reply["ok"] is True and reply["result"]["text"] == "Hello, Ada."
    assert await greet(name="Ada") == "Hello, Ada."


async def test_parameters_make_the_schema_shown(rig: Rig, modules: dict[str, ModuleType]) -> None:
    thermostat = modules["thermostat"].set_thermostat
    [shown] = blocks("json")
    assert thermostat.input_schema == json.loads(shown)
    assert (thermostat.name, thermostat.timeout_s) == ("thermostat_set", 5)

    too_warm = await rig.call("thermostat_set", {"arguments": {"room": "kitchen", "celsius": 40}})
    assert too_warm["error"]["code"] == "invalid_arguments"
    assert "celsius" in json.dumps(too_warm["error"]["details"]["errors"])

    planned = {"room": "hall", "celsius": 19.5, "schedule": {"start": "2026-01-31T06:30"}}
    reply = await rig.call("thermostat_set", {"arguments": planned})
    assert reply["result"]["structured"] == {
        "room": "hall",
        "celsius": 19.5,
        "mode": "heat",
        "from": "2026-01-31T06:30",
    }


async def test_errors_reach_the_caller_with_their_codes(
    rig: Rig, modules: dict[str, ModuleType]
) -> None:
    garage = await rig.call("switch_lamp", {"arguments": {"room": "garage", "on": True}})
    assert garage["error"]["code"] == "invalid_arguments"
    details = garage["error"]["details"]
    assert (details["parameter"], details["rooms"]) == ("room", ["hall", "kitchen"])
    assert [p["name"] for p in details["parameters"]] == ["room", "on"]  # the worker's

    modules["lamps"].BRIDGE["online"] = False
    try:
        down = await rig.call("switch_lamp", {"arguments": {"room": "hall", "on": True}})
    finally:
        modules["lamps"].BRIDGE["online"] = True
    assert down["error"]["code"] == "unavailable"

    hall = await rig.call("lamp_level", {"arguments": {"room": "hall"}})
    assert hall["error"]["code"] == "tool_error"
    assert hall["error"]["details"] == {"exception": "KeyError"}
    assert hall["error"]["message"] == "lamp_level failed: KeyError: 'hall'"

    kitchen = await rig.call("lamp_level", {"arguments": {"room": "kitchen"}})
    assert kitchen["result"]["structured"] == {"result": 80}


def test_the_idempotent_setting_shown_is_a_configuration_key() -> None:
    from toolbus.config import Settings

    [config] = [body for body in blocks("toml") if not FILE_NAME.match(body)]
    settings = Settings.model_validate(tomllib.loads(config))
    assert settings.tools["switch_lamp"].idempotent is True


async def test_toolbus_serve_loads_the_package_by_its_entry_points(
    broker: Broker, package: Path
) -> None:
    prefix = unique_prefix()
    env = serve_env(broker_url=broker.url, topic_prefix=prefix, log_format="json")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(package), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    async with Serve(env) as serve:
        await serve.wait_for("subscribed to")
        async with Client(BrokerUrl.from_url(broker.url), prefix=prefix) as client:
            listed = {t["name"] for t in await client.tools(timeout_s=10)}
            assert {"greet", "thermostat_set", "switch_lamp", "lamp_level"} <= listed
            greeted = await client.call("greet", {"name": "Ada", "excited": True}, timeout_s=10)
            assert greeted.result is not None and greeted.result.text == "Hello, Ada!"
            with pytest.raises(InvalidArguments) as refused:
                await client.call("switch_lamp", {"room": "garage", "on": True}, timeout_s=10)
            assert refused.value.details["parameter"] == "room"
            with pytest.raises(ToolFailed) as failed:
                await client.call("lamp_level", {"room": "hall"}, timeout_s=10)
            assert failed.value.details == {"exception": "KeyError"}
        assert await serve.exit_code(stop=True) == 0
    logged: list[dict[str, Any]] = [
        json.loads(line) for line in serve.stderr if line.startswith("{")
    ]
    assert not [line for line in logged if "entry point" in line["event"]]  # none broken


async def test_a_tool_reports_progress(rig: Rig, modules: dict[str, ModuleType]) -> None:
    """The guide's `firmware.py`: each block's update, then the reply; none unless asked,
    and a no-op when the function is called directly."""
    await rig.request(
        "flash_firmware", {"id": "f1", "arguments": {"device": "a", "blocks": 3}, "progress": True}
    )
    *updates, reply = [json.loads(out.payload) for out in rig.sent.on(REPLY)]
    assert reply["ok"] is True
    assert [(u["progress"], u["total"], u["message"]) for u in updates][-1] == (
        3,
        3,
        "block 3 of 3",
    )
    assert [u["progress"] for u in updates] == sorted(u["progress"] for u in updates)
    rig.sent.sent.clear()
    assert (await rig.call("flash_firmware", {"arguments": {"device": "b"}}))["ok"] is True
    assert await modules["firmware"].flash_firmware(device="c", blocks=2) == "c: 2 blocks written"


async def test_asking_the_caller(rig: Rig, modules: dict[str, ModuleType]) -> None:
    """The guide's `switch.py`: a caller that can answer is asked and its answer used; one
    that cannot gets the tool's answer to a decline, as does a direct call."""
    first = await rig.call("switch_on", {"id": "s1", "arguments": {"room": "hall"}, "input": True})
    assert first["error"]["code"] == "input_required"
    [key] = first["error"]["details"]["input_requests"]
    answer = {"action": "accept", "content": {"device": "lamp"}}
    token = first["error"]["details"]["continuation"]
    final = await rig.call(
        None, {"id": "s2", "continuation": token, "input_responses": {key: answer}}
    )
    assert final["result"]["text"] == "lamp is on"
    declined = await rig.call("switch_on", {"arguments": {"room": "hall"}})
    assert declined["result"]["text"] == "nothing switched"
    assert await modules["switch"].switch_on(room="den") == "nothing switched"
