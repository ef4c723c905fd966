"""The broker password: from the URL, the environment or a file, and never in any output.

Settings-level cases run in-process; the output cases run a real `toolbus serve` (a bad
URL, a start against a broker that checks passwords, a wrong password) and look for a
distinctive password in everything it printed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from tests.support.harness import Broker, unique_prefix
from tests.support.processes import Serve, serve_env
from toolbus.client.client import Client
from toolbus.config import Settings, load_settings
from toolbus.wire.broker import BrokerUrl
from toolbus.worker.exit_codes import EXIT_BROKER, EXIT_USAGE

PASSWORD = "Pw-7xQz!kR2"  # distinctive: found in output only if it leaked
USER = "worker"


@pytest.fixture
def no_broker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own TOOLBUS_* settings must not leak into these cases."""
    for name in list(os.environ):
        if name.startswith("TOOLBUS_"):
            monkeypatch.delenv(name)


def secret(settings: Settings) -> str | None:
    password = settings.broker.password
    return password.get_secret_value() if password else None


def assert_hidden(settings: Settings) -> None:
    for shown in (repr(settings), str(settings), settings.model_dump_json(), settings.broker_url):
        assert PASSWORD not in shown
    assert PASSWORD not in repr(settings.broker) and PASSWORD not in str(settings.broker)


# -- where the password comes from ---------------------------------------------------


@pytest.mark.usefixtures("no_broker_env")
@pytest.mark.parametrize("source", ["url", "env", "env_file", "config_file"])
def test_every_source_fills_the_one_secret_field(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_file = tmp_path / "broker_password"
    secret_file.write_text(f"{PASSWORD}\n")
    config = tmp_path / "toolbus.toml"
    config.write_text("")
    url = f"mqtt://{USER}@h:1"
    if source == "url":
        url = f"mqtt://{USER}:{PASSWORD}@h:1"
    elif source == "env":
        monkeypatch.setenv("TOOLBUS_BROKER_PASSWORD", PASSWORD)
    elif source == "env_file":
        monkeypatch.setenv("TOOLBUS_BROKER_PASSWORD_FILE", str(secret_file))
    else:
        config.write_text(f'broker_password_file = "{secret_file}"\n')
    settings = load_settings(config, broker_url=url)
    assert secret(settings) == PASSWORD
    assert settings.broker.username == USER
    assert settings.broker_url == f"mqtt://{USER}@h:1"
    assert settings.broker_password_file is None  # read once, into broker_password
    assert_hidden(settings)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (f"{PASSWORD}\n", PASSWORD),
        (f"{PASSWORD}\r\n", PASSWORD),
        (f" {PASSWORD} ", f" {PASSWORD} "),
    ],
)
def test_password_file_loses_only_its_trailing_newline(
    content: str, expected: str, tmp_path: Path
) -> None:
    path = tmp_path / "pw"
    path.write_bytes(content.encode())
    settings = Settings.model_validate(
        {"broker_url": "mqtt://u@h", "broker_password_file": str(path)}
    )
    assert secret(settings) == expected


def test_user_name_may_come_from_its_own_setting() -> None:
    settings = Settings.model_validate(
        {"broker_url": "mqtts://h", "broker_username": USER, "broker_password": PASSWORD}
    )
    assert (settings.broker.username, secret(settings)) == (USER, PASSWORD)


def test_a_password_in_a_flag_url_is_moved_out_of_it() -> None:
    settings = load_settings(broker_url=f"mqtt://{USER}:{PASSWORD}@h:1")
    assert isinstance(settings.broker_password, SecretStr)
    assert_hidden(settings)


# -- what is refused, and what the refusal shows --------------------------------------


def refused(values: dict[str, object]) -> str:
    with pytest.raises(ValidationError) as info:
        Settings.model_validate(values)
    message = str(info.value)
    assert PASSWORD not in message
    return message


@pytest.mark.parametrize(
    "values",
    [
        {"broker_url": f"mqtt://u:{PASSWORD}@h", "broker_password": PASSWORD},
        {"broker_url": f"mqtt://u:{PASSWORD}@h", "broker_password_file": "/nonexistent"},
        {"broker_url": "mqtt://u@h", "broker_password": PASSWORD, "broker_password_file": "/x"},
        {"broker_url": "mqtt://h", "broker_password": PASSWORD},  # no user name
        {"broker_url": "mqtt://u@h", "broker_username": "v", "broker_password": PASSWORD},
        {"broker_url": f"mqtt://u:{PASSWORD}@h:bad"},
        {"broker_url": f"mqtt://u:{PASSWORD[:4]}/{PASSWORD[4:]}@h:1"},  # '/' not encoded
        {"broker_url": f"mqtt://[u:{PASSWORD}@h"},
        {"broker_url": f"http://u:{PASSWORD}@h"},
        {"broker_url": "mqtt://u@h", "broker_password": 12345, "concurrency": PASSWORD},
    ],
)
def test_refusals_never_show_the_password(values: dict[str, object]) -> None:
    refused(values)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "cannot read"),
        (b"", "empty"),
        (b"\n", "empty"),
        (PASSWORD.encode() + b"\xff", "UTF-8"),
    ],
)
def test_an_unusable_password_file_is_named_never_shown(
    content: bytes | None, reason: str, tmp_path: Path
) -> None:
    path = tmp_path / "broker_password"
    if content is not None:
        path.write_bytes(content)
    message = refused({"broker_url": "mqtt://u@h", "broker_password_file": str(path)})
    assert str(path) in message and reason in message


@pytest.mark.parametrize(
    "values",
    [
        {"broker_url": "mqtt://h", "tls_ca_file": "/ca.pem"},  # TLS files need mqtts://
        {"broker_url": "mqtts://h", "tls_key_file": "/key.pem"},  # a key needs its cert
    ],
)
def test_tls_files_that_cannot_apply_are_refused(values: dict[str, object]) -> None:
    refused(values)


def test_broker_url_hides_the_password() -> None:
    broker = BrokerUrl.from_url("mqtts://h", username=USER, password=PASSWORD)
    assert str(broker) == f"mqtts://{USER}:***@h:8883" and PASSWORD not in repr(broker)


# -- a real `toolbus serve` -----------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"mqtt://u:{PASSWORD}@h:bad",
        f"mqtt://u:{PASSWORD[:4]}/{PASSWORD[4:]}@h:1",
        f"mqtt://u:{PASSWORD}@[h",
        f"mqtts:/u:{PASSWORD}@h",
    ],
)
@pytest.mark.parametrize("given", ["flag", "env"])
async def test_serve_with_a_bad_url_says_why_without_the_password(url: str, given: str) -> None:
    flags = ("--broker", url) if given == "flag" else ()
    env = serve_env() if given == "flag" else serve_env(broker_url=url)
    async with Serve(env, *flags) as serve:
        assert await serve.exit_code() == EXIT_USAGE
    assert PASSWORD not in serve.output
    assert len(serve.stderr) == 1 and serve.stderr[0].startswith("toolbus: bad configuration: ")


@pytest.fixture(scope="module")
def password_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker that admits only USER with PASSWORD (and a caller)."""
    broker = Broker(
        tmp_path_factory.mktemp("mosquitto-passwords"),
        passwords={USER: PASSWORD, "caller": "caller-pw"},
    )
    broker.start()
    yield broker
    broker.stop()


async def test_serve_takes_the_password_from_a_file_and_never_logs_it(
    password_broker: Broker, tmp_path: Path
) -> None:
    """Debug logs of a whole run (start, a call, stop) hold no trace of the password."""
    secret_file = tmp_path / "broker_password"
    secret_file.write_text(f"{PASSWORD}\n")
    prefix = unique_prefix()
    env = serve_env(
        broker_url=f"mqtt://{USER}@127.0.0.1:{password_broker.port}",
        broker_password_file=str(secret_file),
        topic_prefix=prefix,
        log_level="DEBUG",
        log_format="text",
    )
    async with Serve(env) as serve:
        await serve.wait_for("subscribed to")
        caller = BrokerUrl.from_url(f"mqtt://caller:caller-pw@127.0.0.1:{password_broker.port}")
        async with Client(caller, prefix=prefix) as client:
            reply = await client.call("echo", {"text": "hi"}, timeout_s=10)
        assert reply.ok
        assert await serve.exit_code(stop=True) == 0
    assert PASSWORD not in serve.output


async def test_serve_refused_by_the_broker_stops_with_one_line(password_broker: Broker) -> None:
    """A wrong password is a configuration error: no retry loop, exit 4, neither shown."""
    wrong = "Wr0ng-pw-9Kx"
    env = serve_env(
        broker_url=f"mqtt://{USER}@127.0.0.1:{password_broker.port}", broker_password=wrong
    )
    async with Serve(env) as serve:
        assert await serve.exit_code() == EXIT_BROKER
    assert wrong not in serve.output and PASSWORD not in serve.output
    assert "Traceback" not in serve.output
    assert serve.stderr[-1].startswith("toolbus: cannot connect to the broker at ")
