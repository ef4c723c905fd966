"""docs/deployment.md's "Before exposing it", as written, against a real mosquitto.

The steps run on a copy of compose/ in the test's directory: the page's `sh run:harden-*`
blocks unchanged (the shipped password example, the real `mosquitto_passwd -U`), its
`harden:*` blocks applied where the page says (mosquitto.conf, the broker's volumes, the
workers' environment), with the example's placeholder passwords. The stack then starts
natively (tests/support/compose_stack.py) on the hardened broker, and the broker's healthcheck
runs as compose/docker-compose.yml writes it (`/bin/sh -c`, only the port changed), with
authentication on and, on the shipped configuration, off.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import pytest_asyncio
import yaml

from tests.support.compose_stack import (
    COMPOSE_DIR,
    COMPOSE_FILE,
    Logins,
    NativeStack,
    load_compose,
    mosquitto_conf,
    mosquitto_port,
)
from tests.support.harness import Broker, measured
from tests.support.mqtt import Caller
from tests.support.otlp import OtlpReceiver
from tests.support.processes import ROOT, run_bounded

PAGE = ROOT / "docs" / "deployment.md"
EXAMPLE = COMPOSE_DIR / "mosquitto" / "passwords.example"
ACL = COMPOSE_DIR / "mosquitto" / "acl"
# A block, possibly indented under a list item: ```LANG KIND:NAME ... ```
BLOCK = re.compile(
    r"^(?P<indent> *)```\w+ (?P<name>(?:run|harden):\S+)\n(?P<code>.*?)^(?P=indent)```\s*$",
    re.MULTILINE | re.DOTALL,
)
HEALTH_PASSWORD = "MOSQUITTO_HEALTH_PASSWORD"  # step 3: where the healthcheck's password goes
WORKER_SECRET = "compose/secrets/broker_password"  # step 4: the workers' password, as is
BOUND_S = 30.0
NOT_AUTHORIZED = 0x87  # MQTT 5 CONNACK reason code


def blocks() -> dict[str, str]:
    page = PAGE.read_text(encoding="utf-8")
    return {m["name"]: textwrap.dedent(m["code"]) for m in BLOCK.finditer(page)}


def example() -> dict[str, str]:
    return dict(line.split(":", 1) for line in EXAMPLE.read_text().splitlines())


def acl_users() -> set[str]:
    return {line.split()[1] for line in ACL.read_text().splitlines() if line.startswith("user ")}


def plain_env(**variables: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"), **variables}


def healthcheck(port: int) -> list[str]:
    """The broker's healthcheck as compose runs it (`CMD-SHELL`: `/bin/sh -c`), its port
    the test broker's."""
    test = load_compose()["services"]["mosquitto"]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and len(test) == 2, test
    listen = f"-p {mosquitto_port()}"
    assert test[1].count(listen) == 1, test[1]
    return ["/bin/sh", "-c", test[1].replace(listen, f"-p {port}")]


def broker_environment(operator_env: dict[str, str]) -> dict[str, str]:
    """The broker container's environment, compose interpolating the operator's."""
    service: dict[str, Any] = load_compose(operator_env)["services"]["mosquitto"]
    return plain_env(**{k: str(v) for k, v in service.get("environment", {}).items()})


async def run_healthcheck(port: int, operator_env: dict[str, str]) -> tuple[int, str]:
    code, out, err = await run_bounded(
        *healthcheck(port), env=broker_environment(operator_env), bound_s=BOUND_S
    )
    return code, out + err


def test_the_runnable_blocks_are_the_ones_judged() -> None:
    assert set(blocks()) == {
        "run:harden-copy",
        "run:harden-hash",
        "harden:mosquitto.conf",
        "harden:mosquitto-volumes",
        "harden:workers",
        "run:harden-call",
        "run:harden-toolbus-call",
    }


def test_the_password_example_is_placeholders_mosquitto_passwd_takes() -> None:
    lines = EXAMPLE.read_text().splitlines()
    # mosquitto_passwd -U reads every line as `login:password`: no comments, no blanks.
    assert all(re.fullmatch(r"[a-z]+:change-me-[a-z]+", line) for line in lines), lines
    logins = set(example())
    assert len(logins) == len(lines)
    # Every login has a block of its own (no `%u` patterns: issue 24.3), callers too.
    assert acl_users() == logins
    assert not [line for line in ACL.read_text().splitlines() if line.startswith("pattern")]


def test_the_workers_lines_are_the_ones_the_compose_file_has_commented() -> None:
    text = COMPOSE_FILE.read_text()
    for line in blocks()["harden:workers"].splitlines():
        assert f"  # {line}\n" in text, line
    # They replace the one the page names: a key twice in a mapping, compose v2 refuses.
    shipped = load_compose()["x-toolbus-environment"]
    assert set(yaml.safe_load(blocks()["harden:workers"])) & set(shipped) == {"TOOLBUS_BROKER_URL"}
    assert shipped["TOOLBUS_BROKER_URL"] == "mqtt://mosquitto:1883"


# -- the steps, run ---------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def hardened(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repository's compose/ after steps 1 and 4's files: its root."""
    root = tmp_path_factory.mktemp("hardened")
    # What an operator's own hardening left in this tree is not the example's.
    made = shutil.ignore_patterns("passwords", "secrets", ".env")
    shutil.copytree(COMPOSE_DIR, root / "compose", ignore=made)
    for step in ("run:harden-copy", "run:harden-hash"):
        code, out, err = await run_bounded(
            "bash", "-c", blocks()[step], env=plain_env(), bound_s=BOUND_S, cwd=root
        )
        assert code == 0, (step, out, err)
    secret = root / WORKER_SECRET
    secret.parent.mkdir(exist_ok=True)
    secret.write_text(example()["toolbus"])
    return root


def test_the_documented_steps_hash_every_login(hardened: Path) -> None:
    hashed = dict(
        line.split(":", 1)
        for line in (hardened / "compose/mosquitto/passwords").read_text().splitlines()
    )
    assert set(hashed) == set(example())
    assert all(value.startswith("$7$") for value in hashed.values()), hashed


def hardened_conf(conf: str, files: dict[str, Path]) -> str:
    """Step 2: `allow_anonymous true` replaced by the page's lines, their container
    paths the test's copies."""
    lines = conf.splitlines()
    assert lines.count("allow_anonymous true") == 1, conf
    added = blocks()["harden:mosquitto.conf"].splitlines()
    for words in (line.split() for line in added):
        if words[0].endswith("_file"):
            assert words[1] in files, words  # each file it names is mounted
    hardened = [
        new for line in lines for new in (added if line == "allow_anonymous true" else [line])
    ]
    text = "\n".join(hardened) + "\n"
    for container_path, here in files.items():
        text = text.replace(container_path, str(here))
    return text


def mounts(root: Path) -> dict[str, Path]:
    """Step 2's volumes (relative to compose/) and step 4's secret: container -> here."""
    secret = yaml.safe_load(blocks()["harden:workers"])["TOOLBUS_BROKER_PASSWORD_FILE"]
    found = {secret: root / WORKER_SECRET}
    for volume in yaml.safe_load(blocks()["harden:mosquitto-volumes"]):
        source, target = volume.split(":")[:2]
        found[target] = (root / "compose" / source).resolve()
    return found


@pytest_asyncio.fixture(scope="module")
async def stack(
    hardened: Path, collector: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[NativeStack]:
    files = mounts(hardened)
    logins = Logins(
        conf=lambda conf: hardened_conf(conf, files),
        worker_env={k: str(v) for k, v in yaml.safe_load(blocks()["harden:workers"]).items()},
        files=files,
        watcher=("operator", example()["operator"]),
    )
    directory = tmp_path_factory.mktemp("hardened-stack")
    async with NativeStack(directory, collector, logins=logins) as running:
        yield running


def login(stack: NativeStack, name: str) -> Caller:
    return Caller(stack.broker.url, username=name, password=example()[name])


async def test_the_healthcheck_passes_on_the_shipped_broker_without_logins(
    tmp_path: Path,
) -> None:
    broker = Broker(tmp_path)
    broker.config.write_text(mosquitto_conf(broker.port, tmp_path))
    broker.start()
    try:
        code, output = await run_healthcheck(broker.port, {})  # the password unset
    finally:
        broker.stop()
    assert code == 0, output


async def test_the_healthcheck_passes_on_the_hardened_broker_with_its_password(
    stack: NativeStack,
) -> None:
    started = time.monotonic()
    code, output = await run_healthcheck(stack.broker.port, {HEALTH_PASSWORD: example()["health"]})
    assert code == 0, output
    measured(f"compose broker healthcheck, logins on: {time.monotonic() - started:.2f} s wall")
    # The broker does check: without the password the same command fails.
    code, output = await run_healthcheck(stack.broker.port, {})
    assert code != 0, output


async def test_an_anonymous_client_is_refused(stack: NativeStack) -> None:
    with pytest.raises(aiomqtt.MqttCodeError) as refused:
        async with Caller(stack.broker.url):
            pass
    assert refused.value.rc == NOT_AUTHORIZED


async def test_both_workers_serve_a_caller_under_the_acl(stack: NativeStack) -> None:
    """The stack only entered once both workers, logged in as `toolbus`, said `online`."""
    async with login(stack, "kitchen") as kitchen, login(stack, "operator") as operator:
        for i in range(4):  # one after another: the broker hands them round the group
            body = {"arguments": {"text": f"k{i}"}}
            reply, _ = await kitchen.call(
                "toolbus/call/kitchen/echo", body, reply_topic=f"toolbus/reply/kitchen/k{i}"
            )
            assert reply["ok"] is True, (reply, stack.logs())
        # `topic` identity reached the workers: a reply topic outside the caller's own
        # is refused (under `claim` it would be answered there).
        assert await operator.subscribe("toolbus/dead") < 0x80
        await kitchen.publish(
            "toolbus/call/kitchen/echo",
            b'{"id": "elsewhere", "arguments": {"text": "x"}}',
            response_topic="toolbus/reply/garage/inbox",
            correlation=b"c",
        )
        letter = json.loads((await operator.next_message()).payload)
    assert letter["error"]["code"] == "forbidden"
    assert letter["error"]["details"]["reason"] == "outside_prefixes"


async def test_the_health_login_may_publish_no_request(stack: NativeStack) -> None:
    """`health` has a block of its own, the uptime and nothing else: its request never
    reaches a subscriber (before, the `%u` patterns let it call as the caller `health`)."""
    async with (
        login(stack, "health") as health,
        login(stack, "operator") as operator,
        login(stack, "kitchen") as kitchen,
    ):
        assert await operator.subscribe("toolbus/call/#") < 0x80
        await health.publish(
            "toolbus/call/health/echo",
            b'{"arguments": {"text": "x"}}',
            response_topic="toolbus/reply/health/h1",
            correlation=b"h1",
        )
        reply, _ = await kitchen.call(
            "toolbus/call/kitchen/echo",
            {"arguments": {"text": "x"}},
            reply_topic="toolbus/reply/kitchen/h2",
        )
        assert reply["ok"] is True, reply
        assert [m.topic.value for m in operator.unclaimed()] == ["toolbus/call/kitchen/echo"]


async def test_the_documented_call_works_with_the_example_login(
    stack: NativeStack, tmp_path: Path
) -> None:
    # mosquitto_rr's own options file points it at the test's broker, not an edit.
    (tmp_path / "mosquitto_rr").write_text(f"-h 127.0.0.1\n-p {stack.broker.port}\n")
    env = plain_env(XDG_CONFIG_HOME=str(tmp_path), KITCHEN_PASSWORD=example()["kitchen"])
    code, out, err = await run_bounded(
        "bash", "-c", blocks()["run:harden-call"], env=env, bound_s=BOUND_S
    )
    assert code == 0, (out, err)
    reply = json.loads(out)
    assert reply["ok"] is True and reply["result"]["structured"]["text"] == "hello"


async def test_toolbus_call_works_as_the_example_login(stack: NativeStack) -> None:
    """The same call through `toolbus call --caller kitchen` (before, `toolbus call` could
    name no caller: under the ACL its request went nowhere and it said no worker ran)."""
    listen = "localhost:1883"
    block = blocks()["run:harden-toolbus-call"]
    assert block.count(listen) == 1, block
    env = plain_env(KITCHEN_PASSWORD=example()["kitchen"])
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # this venv's `toolbus`
    code, out, err = await run_bounded(
        "bash",
        "-c",
        block.replace(listen, f"127.0.0.1:{stack.broker.port}"),
        env=env,
        bound_s=BOUND_S,
    )
    assert code == 0, (out, err)
    reply = json.loads(out)
    assert reply["ok"] is True and reply["result"]["structured"]["text"] == "hello"
