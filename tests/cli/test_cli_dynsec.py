"""The command line under the documented dynamic security (issue 30.2): mosquitto with its
dynamic-security plugin, set up by the shipped `dynsec-setup` and `add-caller`, binds
each caller's login to its own client id. `toolbus call`, `tools` and `status` connect
with the login as client id where the caller is the topic's (`--client-id` and
`TOOLBUS_CLIENT_ID` choose another), and a refusal names the client id as a cause, not
only the password. The worker is a real `toolbus serve` logged in as `toolbus`; the
command line runs as a subprocess.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from tests.cli.test_cli import cli_env, run_cli
from tests.project.test_broker_logins import (
    ADMIN,
    CALLERS,
    PASSWORDS,
    SHIPPED,
    ctrl_binary,
    ctrl_options,
    run,
    shipped_conf,
)
from tests.support.harness import Broker
from tests.support.mqtt import Caller
from tests.support.processes import RUN_BOUND_S, Serve
from toolbus.worker.exit_codes import EXIT_BROKER, EXIT_OK

PREFIX = "toolbus"  # the prefix dynsec-setup and add-caller grant


@pytest.fixture(scope="module")
def dynsec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """mosquitto-dynsec.conf as shipped, its logins made by the shipped scripts."""
    directory = tmp_path_factory.mktemp("cli-dynsec")
    made = run(ctrl_binary(), "dynsec", "init", str(directory / "dynamic-security.json"), *ADMIN)
    assert made.returncode == 0, made.stderr
    broker = Broker(directory)
    broker.config.write_text(shipped_conf(broker.port, directory))
    broker.start()
    try:
        env = {
            "WORKER_PASSWORD": PASSWORDS["toolbus"],
            "OPERATOR_PASSWORD": PASSWORDS["operator"],
            "HEALTH_PASSWORD": PASSWORDS["health"],
        }
        setup = run(str(SHIPPED / "dynsec-setup"), *ctrl_options(broker), env=env)
        assert setup.returncode == 0, setup.stdout + setup.stderr
        added = run(
            str(SHIPPED / "add-caller"),
            "dynsec",
            "kitchen",
            *ctrl_options(broker),
            env={"CALLER_PASSWORD": CALLERS["kitchen"]},
        )
        assert added.returncode == 0, added.stdout + added.stderr
        yield broker
    finally:
        broker.stop()


def login(broker: Broker, name: str) -> str:
    return broker.url.replace("mqtt://", f"mqtt://{name}@")


def env_of(password: str, **more: str) -> dict[str, str]:
    """The environment the hardening guide gives a caller: its password, topic mode."""
    env = cli_env(PREFIX)
    for key in [k for k in env if k.startswith("TOOLBUS_") and k != "TOOLBUS_TOPIC_PREFIX"]:
        del env[key]
    env.update({"TOOLBUS_BROKER_PASSWORD": password, "TOOLBUS_CALLER_IDENTITY": "topic"})
    env.update(more)
    return env


@pytest_asyncio.fixture(scope="module")
async def worker(dynsec: Broker) -> AsyncIterator[Serve]:
    """`toolbus serve` logged in as the worker's login (not bound to a client id)."""
    env = env_of(PASSWORDS["toolbus"])
    async with Serve(env, "--broker", login(dynsec, "toolbus")) as serve:
        watcher = Caller(
            dynsec.url, username="operator", password=PASSWORDS["operator"], client_id="operator"
        )
        async with watcher:
            await watcher.subscribe(f"{PREFIX}/status/workers/+")
            async with asyncio.timeout(RUN_BOUND_S):
                while json.loads((await watcher.next_message()).payload)["state"] != "online":
                    pass
        yield serve


async def call_as_kitchen(dynsec: Broker, *flags: str, **env: str) -> tuple[int, str, str]:
    return await run_cli(
        "call",
        "echo",
        "text=hi",
        "--caller",
        "kitchen",
        "--broker",
        login(dynsec, "kitchen"),
        *flags,
        env=env_of(CALLERS["kitchen"], **env),
    )


async def test_call_logs_in_with_the_login_as_client_id_by_default(
    dynsec: Broker, worker: Serve
) -> None:
    """Refused on 0cb9228: a random client id, which the broker binds to no login."""
    code, out, err = await call_as_kitchen(dynsec)
    assert code == EXIT_OK, err
    assert json.loads(out)["result"]["structured"]["text"] == "hi"


async def test_client_id_from_the_environment_and_the_flag(dynsec: Broker, worker: Serve) -> None:
    """TOOLBUS_CLIENT_ID is used (a wrong one is refused), and the flag wins over it."""
    code, _, err = await call_as_kitchen(dynsec, TOOLBUS_CLIENT_ID="not-kitchen")
    assert code == EXIT_BROKER, err
    code, out, err = await call_as_kitchen(
        dynsec, "--client-id", "kitchen", TOOLBUS_CLIENT_ID="not-kitchen"
    )
    assert code == EXIT_OK, err
    assert json.loads(out)["ok"] is True
    code, out, err = await run_cli(
        "tools",
        "--json",
        "--caller",
        "kitchen",
        "--broker",
        login(dynsec, "kitchen"),
        env=env_of(CALLERS["kitchen"]),
    )
    assert code == EXIT_OK, err
    assert "echo" in {tool["name"] for tool in json.loads(out)}


async def test_status_under_dynamic_security(dynsec: Broker, worker: Serve) -> None:
    """The operator's login is bound to the client id `operator`; `status` reads no
    caller_identity default (the operator is no caller): the flag or the variable."""
    operator = login(dynsec, "operator")
    env = env_of(PASSWORDS["operator"], TOOLBUS_CALLER_IDENTITY="claim")
    code, out, err = await run_cli("status", "--json", "--broker", operator, env=env)
    assert code == EXIT_BROKER, err  # a random id: refused, and told why
    assert "bound to another client id" in err
    # In the form `call` and `tools` use (docs/security.md): the login, the id it came with.
    assert "(login operator, client id toolbus-status-" in err
    for flags, more in (
        (("--client-id", "operator"), {}),
        ((), {"TOOLBUS_CLIENT_ID": "operator"}),
    ):
        shown = await run_cli("status", "--json", *flags, "--broker", operator, env=env | more)
        code, out, err = shown
        assert code == EXIT_OK, err
        assert [w["state"] for w in json.loads(out)["workers"]] == ["online"]


async def test_a_refusal_names_the_client_id_as_a_cause(dynsec: Broker, worker: Serve) -> None:
    """The broker says only "not authorized" (0x87), for a wrong password and for a login
    bound to another client id alike: the message names both, and the id used."""
    code, _, err = await call_as_kitchen(dynsec, "--client-id", "not-kitchen")
    assert code == EXIT_BROKER, err
    [line] = err.splitlines()
    assert "bound to another client id" in line
    assert "not-kitchen" in line  # the id it came with
    assert CALLERS["kitchen"] not in err  # never the password
