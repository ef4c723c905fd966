"""mosquitto_ctrl's "without encryption" warning, said once at most by the shipped
dynsec scripts (issue 30.7).

mosquitto_ctrl prints it on every run: `dynsec-setup` runs it 19 times and said it 19
times, burying what else it printed. Run here against a real mosquitto with the
dynamic-security plugin: where `-h` names this machine's loopback, the scripts say once
why it does not apply instead; where they cannot tell (the same address written as one
number), mosquitto_ctrl's warning comes once. The logins are made either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.project.test_broker_logins import (
    ADMIN,
    SHIPPED,
    ctrl_binary,
    run,
    shipped_conf,
)
from tests.support.harness import Broker

WARNING = "Warning: You are running mosquitto_ctrl without encryption."
PASSWORDS = {"WORKER_PASSWORD": "pw-w", "OPERATOR_PASSWORD": "pw-o", "HEALTH_PASSWORD": "pw-h"}
# 127.0.0.1 as one number: the C library reaches loopback, the scripts cannot tell it is.
UNRECOGNISED_LOOPBACK = "2130706433"


@pytest.fixture
def dynsec_broker(tmp_path: Path) -> Iterator[Broker]:
    made = run(ctrl_binary(), "dynsec", "init", str(tmp_path / "dynamic-security.json"), *ADMIN)
    assert made.returncode == 0, made.stderr
    broker = Broker(tmp_path)
    broker.config.write_text(shipped_conf(broker.port, tmp_path))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def options(broker: Broker, host: str) -> list[str]:
    return ["-h", host, "-p", str(broker.port), "-u", ADMIN[0], "-P", ADMIN[1]]


def has_login(broker: Broker, name: str) -> bool:
    found = run(ctrl_binary(), *options(broker, "127.0.0.1"), "dynsec", "getClient", name)
    return found.returncode == 0 and f"Username: {name}" in found.stdout


@pytest.mark.parametrize(("host", "warnings"), [("127.0.0.1", 0), (UNRECOGNISED_LOOPBACK, 1)])
def test_dynsec_setup_warns_once_at_most(dynsec_broker: Broker, host: str, warnings: int) -> None:
    setup = run(str(SHIPPED / "dynsec-setup"), *options(dynsec_broker, host), env=PASSWORDS)
    said = setup.stdout + setup.stderr
    assert setup.returncode == 0, said
    assert said.count(WARNING) == warnings, said
    assert said.count("no TLS to the broker, which is on this machine") == 1 - warnings, said
    assert "Error" not in said, said
    assert all(has_login(dynsec_broker, name) for name in ("toolbus", "operator", "health"))

    added = run(
        str(SHIPPED / "add-caller"),
        "dynsec",
        "kitchen",
        *options(dynsec_broker, host),
        env={"CALLER_PASSWORD": "pw-k"},
    )
    said = added.stdout + added.stderr
    assert added.returncode == 0, said
    assert said.count(WARNING) == warnings, said
    assert has_login(dynsec_broker, "kitchen")


def test_an_error_still_comes_through(dynsec_broker: Broker) -> None:
    """The filter drops the warning, not what follows it: a refused admin login is said."""
    wrong = ["-h", "127.0.0.1", "-p", str(dynsec_broker.port), "-u", "admin", "-P", "wrong"]
    added = run(
        str(SHIPPED / "add-caller"), "dynsec", "kitchen", *wrong, env={"CALLER_PASSWORD": "x"}
    )
    assert added.returncode == 1, added.stdout + added.stderr
    assert WARNING not in added.stderr
    assert "not authorised" in added.stderr.lower() or "not authorized" in added.stderr.lower()
