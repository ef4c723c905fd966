"""The shipped broker setups that bind client ids to logins and refuse login names that
would act as another caller (issue 24.1 and 24.3).

compose/mosquitto/mosquitto-dynsec.conf runs here as written (its port, paths and the
plugin's Debian path swapped in), with the dynamic-security plugin mosquitto ships; its
logins are made by the shipped `dynsec-setup` and `add-caller` through `mosquitto_ctrl`.
A caller's login is bound to its own client id, so it cannot connect with a worker's
(public or secret) and kick it off; the compose broker's healthcheck logs in as `health`
on its bound id (issue 30.3). `add-caller` refuses names with `/`, wildcards, a
leading `-`, over 200 characters, `anonymous` and dynsec-setup's logins, for dynsec and
for the ACL file alike; with dynsec, a login or role the broker already has is refused
and left as it was (the worker's login once got a caller's role that way).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiomqtt
import pytest
import pytest_asyncio
from paho.mqtt.reasoncodes import ReasonCode

from tests.support.compose_stack import load_compose, mosquitto_port
from tests.support.harness import Broker, make_settings, running_worker
from tests.support.mqtt import Caller
from toolbus.config import BrokerUrl
from toolbus.worker.service import Worker

ROOT = Path(__file__).parents[2]
SHIPPED = ROOT / "compose" / "mosquitto"
ADMIN = ("admin", "pw-admin")
PASSWORDS = {"toolbus": "pw-worker", "operator": "pw-op", "health": "pw-h"}
CALLERS = {"kitchen": "pw-k", "garage": "pw-g"}
# Names that are not one plain caller level, or are the anonymous caller, or that
# mosquitto_ctrl would read as an option, or too long for a worker's caller level.
REFUSED_NAMES = ["kitchen/book", "anonymous", "a+b", "#", "$SYS", "", "-h", "-k", "x" * 201]
RESERVED_NAMES = list(PASSWORDS)  # dynsec-setup's logins: the worker's, operator, health
RUN_BOUND_S = 60


def dynsec_plugin() -> Path:
    found = sorted(Path("/usr/lib").glob("**/mosquitto_dynamic_security.so"))
    if not found:
        pytest.fail("mosquitto's dynamic-security plugin is missing: apt-get install mosquitto")
    return found[0]


def ctrl_binary() -> str:
    found = shutil.which("mosquitto_ctrl") or "/usr/bin/mosquitto_ctrl"
    if not Path(found).exists():
        pytest.fail("mosquitto_ctrl is missing: apt-get install mosquitto-clients")
    return found


def shipped_conf(port: int, directory: Path) -> str:
    """The shipped dynsec config, each container-specific line swapped exactly once."""
    text = (SHIPPED / "mosquitto-dynsec.conf").read_text()
    for old, new in (
        ("listener 1883\n", f"listener {port} 127.0.0.1\n"),
        ("plugin /usr/lib/mosquitto_dynamic_security.so\n", f"plugin {dynsec_plugin()}\n"),
        ("log_dest stdout\n", "log_dest stderr\n"),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    lines = text.splitlines()
    data = [i for i, line in enumerate(lines) if "/mosquitto/data/" in line and line[0] != "#"]
    assert len(data) == 2  # the plugin's file and persistence_location
    for i in data:
        lines[i] = lines[i].replace("/mosquitto/data/", f"{directory}/")
    # Started as root, mosquitto would read the plugin's file as `mosquitto`, who cannot
    # enter a pytest temporary directory: it stays who started it (as harness.Broker does).
    return "\n".join([*lines, f"user {getpass.getuser()}", ""])


def ctrl_options(broker: Broker) -> list[str]:
    return ["-h", "127.0.0.1", "-p", str(broker.port), "-u", ADMIN[0], "-P", ADMIN[1]]


def run(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        timeout=RUN_BOUND_S,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def dynsec_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    directory = tmp_path_factory.mktemp("mosquitto-dynsec")
    made = run(ctrl_binary(), "dynsec", "init", str(directory / "dynamic-security.json"), *ADMIN)
    assert made.returncode == 0, made.stderr
    broker = Broker(directory)
    broker.config.write_text(shipped_conf(broker.port, directory))
    broker.start()
    try:
        passwords = {f"{name.upper()}_PASSWORD": pw for name, pw in PASSWORDS.items()}
        passwords["WORKER_PASSWORD"] = passwords.pop("TOOLBUS_PASSWORD")
        setup = run(str(SHIPPED / "dynsec-setup"), *ctrl_options(broker), env=passwords)
        assert setup.returncode == 0, setup.stdout + setup.stderr
        for name, password in CALLERS.items():
            added = run(
                str(SHIPPED / "add-caller"),
                "dynsec",
                name,
                *ctrl_options(broker),
                env={"CALLER_PASSWORD": password},
            )
            assert added.returncode == 0, added.stdout + added.stderr
        yield broker
    finally:
        broker.stop()


@pytest_asyncio.fixture(scope="module")
async def dynsec_worker(dynsec_broker: Broker) -> AsyncIterator[Worker]:
    host = dynsec_broker.url.removeprefix("mqtt://")
    settings = make_settings(
        dynsec_broker,
        broker_url=f"mqtt://toolbus@{host}",
        broker_password=PASSWORDS["toolbus"],
        topic_prefix="toolbus",
        caller_identity="topic",
        worker_id="dynsec-w",
    )
    async with running_worker(settings) as worker:
        yield worker


def caller(broker: Broker, name: str, client_id: str | None = None) -> Caller:
    return Caller(broker.url, username=name, password=CALLERS[name], client_id=client_id or name)


async def echo(as_caller: Caller, name: str, reply: str) -> dict[str, object]:
    body = {"arguments": {"text": name}}
    answer, _ = await as_caller.call(f"toolbus/call/{name}/echo", body, reply_topic=reply)
    return answer


async def refused_code(broker: Broker, username: str, password: str, client_id: str) -> int:
    """The CONNACK reason code of a connect the broker must refuse."""
    url = BrokerUrl.from_url(broker.url)
    client = aiomqtt.Client(
        url.host,
        url.port,
        username=username,
        password=password,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
    )
    with pytest.raises(aiomqtt.MqttCodeError) as refused:
        async with client:
            pass
    rc = refused.value.rc
    assert rc is not None
    return rc.value if isinstance(rc, ReasonCode) else int(rc)


async def test_callers_call_on_their_own_client_id(
    dynsec_worker: Worker, dynsec_broker: Broker
) -> None:
    async with caller(dynsec_broker, "kitchen") as kitchen:
        assert (await echo(kitchen, "kitchen", "toolbus/reply/kitchen/r1"))["ok"] is True


async def test_a_caller_login_cannot_take_the_workers_client_id(
    dynsec_worker: Worker, dynsec_broker: Broker
) -> None:
    """Whatever id a caller tries (the public worker id, the secret ones it might have
    learnt, another caller's), the broker refuses the connect before any takeover: the
    worker keeps its connection and goes on answering."""
    before = dynsec_worker._conn
    assert before is not None
    ids = dynsec_worker.client_ids
    for client_id in (dynsec_worker.worker_id, ids.requests, ids.replies, "garage"):
        code = await refused_code(dynsec_broker, "kitchen", CALLERS["kitchen"], client_id)
        assert code == 0x87, client_id  # not authorized
    async with caller(dynsec_broker, "kitchen") as kitchen:
        assert (await echo(kitchen, "kitchen", "toolbus/reply/kitchen/r2"))["ok"] is True
    assert dynsec_worker._conn is before
    assert before.connected


async def test_a_callers_tasks_under_its_own_levels(
    dynsec_worker: Worker, dynsec_broker: Broker
) -> None:
    """The shipped roles let a caller start a task and read it on `tasks/get/{itself}`;
    another caller, on its own level, is told `unknown_task`."""
    async with (
        caller(dynsec_broker, "kitchen") as kitchen,
        caller(dynsec_broker, "garage") as garage,
    ):
        reply = "toolbus/reply/kitchen/t1"
        await kitchen.subscribe(reply)
        body = {"id": "task-1", "task": True, "arguments": {"text": "kitchen"}}
        first, _ = await kitchen.call("toolbus/call/kitchen/echo", body, reply_topic=reply)
        assert first["status"] == "working"
        final = json.loads((await kitchen.next_message()).payload)
        assert final["ok"] is True and final["task_id"] == first["task_id"]
        asked = {"task_id": first["task_id"]}
        mine, _ = await kitchen.call("toolbus/tasks/get/kitchen", asked, reply_topic=reply)
        assert mine["status"] == "completed" and mine["ok"] is True
        theirs, _ = await garage.call(
            "toolbus/tasks/get/garage", asked, reply_topic="toolbus/reply/garage/t1"
        )
        assert theirs["error"]["code"] == "unknown_task"


def compose_healthcheck(port: int) -> list[str]:
    """The broker's healthcheck as compose/docker-compose.yml writes it, run as compose
    runs `CMD-SHELL` (`/bin/sh -c`), its port the test broker's."""
    test = load_compose()["services"]["mosquitto"]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and len(test) == 2, test
    listen = f"-p {mosquitto_port()}"
    assert test[1].count(listen) == 1, test[1]
    return ["/bin/sh", "-c", test[1].replace(listen, f"-p {port}")]


def test_the_compose_healthcheck_passes_under_dynamic_security(dynsec_broker: Broker) -> None:
    """dynsec-setup binds `health` to the client id `health`: the healthcheck must use it
    (before, mosquitto_sub's random id was refused, and the broker never turned healthy)."""
    password = {"MOSQUITTO_HEALTH_PASSWORD": PASSWORDS["health"]}
    checked = run(*compose_healthcheck(dynsec_broker.port), env=password)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.endswith(" seconds\n"), checked.stdout  # the uptime
    # The broker does check: a wrong password fails the same command.
    wrong = run(*compose_healthcheck(dynsec_broker.port), env={"MOSQUITTO_HEALTH_PASSWORD": "x"})
    assert wrong.returncode != 0, wrong.stdout + wrong.stderr


@pytest.mark.parametrize("name", REFUSED_NAMES)
def test_add_caller_refuses_a_name_that_acts_as_another_in_dynsec(
    dynsec_broker: Broker, name: str
) -> None:
    added = run(
        str(SHIPPED / "add-caller"),
        "dynsec",
        name,
        *ctrl_options(dynsec_broker),
        env={"CALLER_PASSWORD": "pw"},
    )
    assert added.returncode == 2, added.stdout + added.stderr
    assert "refused" in added.stderr
    # Nothing was made: the broker knows no such login.
    known = run(ctrl_binary(), *ctrl_options(dynsec_broker), "dynsec", "listClients")
    assert known.returncode == 0, known.stderr
    assert name == "" or name not in known.stdout.split()


def dynsec_state(broker: Broker, name: str) -> tuple[str, str]:
    """What the broker has for the login `name` (its client id, roles) and every role."""
    found = [
        run(ctrl_binary(), *ctrl_options(broker), "dynsec", *command)
        for command in (("getClient", name), ("listRoles",))
    ]
    assert all(f.returncode == 0 and "rror" not in f.stderr for f in found), found
    return found[0].stdout, found[1].stdout


@pytest.mark.parametrize("name", [*RESERVED_NAMES, *CALLERS])
def test_add_caller_leaves_an_existing_login_as_it_was(dynsec_broker: Broker, name: str) -> None:
    """The worker's login, operator, health and a caller already added: refused, and the
    broker keeps each as it was (no caller role for the worker's login)."""
    before = dynsec_state(dynsec_broker, name)
    assert f"Username: {name}" in before[0]
    added = run(
        str(SHIPPED / "add-caller"),
        "dynsec",
        name,
        *ctrl_options(dynsec_broker),
        env={"CALLER_PASSWORD": "pw-taken-over"},
    )
    assert added.returncode == 2, added.stdout + added.stderr
    assert dynsec_state(dynsec_broker, name) == before


def test_add_caller_stops_when_mosquitto_ctrl_reports_an_error(dynsec_broker: Broker) -> None:
    """mosquitto_ctrl 2.0 exits 0 on a refused admin login: add-caller must not take
    "cannot connect" for "no such login", nor go on as if the steps had worked."""
    options = ctrl_options(dynsec_broker)
    options[-1] = "not-the-admin-password"
    added = run(
        str(SHIPPED / "add-caller"), "dynsec", "pantry", *options, env={"CALLER_PASSWORD": "p"}
    )
    assert added.returncode == 1, added.stdout + added.stderr
    assert (
        "Username: pantry"
        not in run(
            ctrl_binary(), *ctrl_options(dynsec_broker), "dynsec", "getClient", "pantry"
        ).stdout
    )


def test_add_caller_takes_a_name_of_200_characters(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    shutil.copy(SHIPPED / "acl", acl)
    added = run(str(SHIPPED / "add-caller"), "acl", str(acl), "x" * 200)
    assert added.returncode == 0, added.stderr


@pytest.mark.parametrize("name", [*REFUSED_NAMES, *RESERVED_NAMES])
def test_add_caller_refuses_a_name_that_acts_as_another_in_the_acl(
    tmp_path: Path, name: str
) -> None:
    acl = tmp_path / "acl"
    shutil.copy(SHIPPED / "acl", acl)
    added = run(str(SHIPPED / "add-caller"), "acl", str(acl), name)
    assert added.returncode == 2, added.stdout + added.stderr
    assert acl.read_text() == (SHIPPED / "acl").read_text()


def test_add_caller_writes_a_callers_block_as_the_shipped_ones(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text((SHIPPED / "acl").read_text().replace("user kitchen\n", "user pantry\n", 1))
    shipped = (SHIPPED / "acl").read_text()
    kitchen = shipped[shipped.index("user kitchen\n") :].split("\n\n", 1)[0]
    added = run(str(SHIPPED / "add-caller"), "acl", str(acl), "kitchen")
    assert added.returncode == 0, added.stderr
    assert acl.read_text().endswith(f"\n{kitchen}\n")
    again = run(str(SHIPPED / "add-caller"), "acl", str(acl), "kitchen")
    assert again.returncode == 2  # one block per login


async def test_a_caller_cancels_on_its_own_cancel_topic(
    dynsec_worker: Worker, dynsec_broker: Broker
) -> None:
    """dynsec-setup lets the worker hear `cancel/#`, add-caller lets each caller publish
    on `cancel/{itself}` only: kitchen's cancel, heard before its call is sent, answers
    that call `cancelled` unrun; garage's on kitchen's topic never reaches the worker."""
    async with (
        caller(dynsec_broker, "kitchen") as kitchen,
        caller(dynsec_broker, "garage") as garage,
    ):
        handled = dynsec_worker.cancels.handled
        await garage.publish("toolbus/cancel/kitchen", b'{"id": "k-theirs"}')  # dropped
        await kitchen.publish("toolbus/cancel/kitchen", b'{"id": "k-mine"}')
        async with asyncio.timeout(10):
            await dynsec_worker.cancels.until_handled(handled + 1)
        body = {"id": "k-mine", "arguments": {"text": "x"}}
        mine, _ = await kitchen.call(
            "toolbus/call/kitchen/echo", body, reply_topic="toolbus/reply/kitchen/c1"
        )
        body = {"id": "k-theirs", "arguments": {"text": "x"}}
        theirs, _ = await kitchen.call(
            "toolbus/call/kitchen/echo", body, reply_topic="toolbus/reply/kitchen/c2"
        )
    assert mine["error"]["code"] == "cancelled"
    assert mine["error"]["details"]["started"] is False
    assert theirs["ok"] is True
