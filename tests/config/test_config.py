"""Configuration: broker URLs, files in both formats, MCP client configs, precedence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolbus.config import BrokerUrl, ConfigError, load_settings


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mqtt://localhost", ("localhost", 1883, False, None, None)),
        ("mqtts://broker.example:9999", ("broker.example", 9999, True, None, None)),
        ("mqtts://b", ("b", 8883, True, None, None)),
        ("mqtt://user:p%40ss@h:1", ("h", 1, False, "user", "p@ss")),
    ],
)
def test_broker_url(url: str, expected: tuple[object, ...]) -> None:
    b = BrokerUrl.from_url(url)
    password = b.password.get_secret_value() if b.password else None
    assert (b.host, b.port, b.tls, b.username, password) == expected


@pytest.mark.parametrize("url", ["http://h", "mqtt://", "mqtt://h:port", "localhost:1883"])
def test_bad_broker_url(url: str) -> None:
    with pytest.raises(ValueError, match="broker URL"):
        BrokerUrl.from_url(url)


def test_password_never_printed() -> None:
    b = BrokerUrl.from_url("mqtt://u:hunter2@h:1")
    assert "hunter2" not in str(b) and "hunter2" not in repr(b)


def test_precedence_flags_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "t.toml"
    cfg.write_text('broker_url = "mqtt://file:1"\ntopic_prefix = "fromfile"\nconcurrency = 3\n')
    assert load_settings(cfg).broker_url == "mqtt://file:1"
    monkeypatch.setenv("TOOLBUS_BROKER_URL", "mqtt://env:2")
    monkeypatch.setenv("TOOLBUS_CONCURRENCY", "5")
    s = load_settings(cfg)
    assert (s.broker_url, s.topic_prefix, s.concurrency) == ("mqtt://env:2", "fromfile", 5)
    assert load_settings(cfg, broker_url="mqtt://flag:3").broker_url == "mqtt://flag:3"


def test_claude_desktop_config_loads_as_is(tmp_path: Path) -> None:
    desktop = tmp_path / "claude_desktop_config.json"
    desktop.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "fs": {
                        "command": "npx",
                        "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/shared"],
                        "env": {"A": "1"},
                    },
                    "remote": {"url": "http://127.0.0.1:9/mcp", "type": "http"},
                },
                "globalShortcut": "Ctrl+Space",
            }
        )
    )
    s = load_settings(None, desktop)
    assert s.mcp_servers["fs"].transport == "stdio"
    assert s.mcp_servers["fs"].env == {"A": "1"}
    assert s.mcp_servers["remote"].transport == "http"


def test_json_config_and_per_tool_settings(tmp_path: Path) -> None:
    cfg = tmp_path / "t.json"
    cfg.write_text(
        json.dumps({"tools": {"echo": {"timeout_s": 2}}, "mcpServers": {"a": {"command": "x"}}})
    )
    s = load_settings(cfg)
    assert s.tools["echo"].timeout_s == 2
    assert s.allowed_reply_prefixes == ("toolbus/reply/",)


@pytest.mark.parametrize(
    "bad",
    [
        {"mcpServers": {"a": {}}},
        {"mcpServers": {"a": {"command": "x", "url": "http://y"}}},
        {"topic_prefix": "a/#"},
        {"concurrency": 0},
        {"no_such_setting": 1},
    ],
)
def test_invalid_config_is_refused(tmp_path: Path, bad: dict[str, object]) -> None:
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(bad))
    with pytest.raises(ConfigError):
        load_settings(cfg)


def test_bundled_config_loads() -> None:
    s = load_settings(Path(__file__).parents[2] / "config" / "toolbus.toml")
    assert s.mcp_servers["devices"].args == ["demo-server"]
    assert s.argument_maps["control_zwave_device"]["device_name"] == "deviceName"


def test_every_shipped_broker_config_disables_nagle() -> None:
    root = Path(__file__).parents[2]
    configs = [
        root / "config" / "mosquitto.conf",
        root / "compose" / "mosquitto" / "mosquitto.conf",
    ]
    for conf in configs:
        lines = [line.strip() for line in conf.read_text().splitlines()]
        assert "set_tcp_nodelay true" in lines, conf


def test_compose_worker_config_loads() -> None:
    s = load_settings(Path(__file__).parents[2] / "compose" / "toolbus.toml")
    assert s.broker.host == "mosquitto"
    assert s.shared_group  # replicas must share the load


def test_every_setting_is_documented() -> None:
    from toolbus.config import Settings

    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    for name, field in Settings.model_fields.items():
        assert f"`{field.alias or name}`" in doc, name


def test_reply_prefixes_must_not_nest_when_callers_are_in_the_topic() -> None:
    from pydantic import ValidationError

    from toolbus.config import Settings

    nested = {"reply_prefixes": ["a/", "a/b/"]}
    assert Settings.model_validate(nested).allowed_reply_prefixes == ("a/", "a/b/")
    with pytest.raises(ValidationError):
        Settings.model_validate({**nested, "caller_identity": "topic"})
    with pytest.raises(ValidationError):
        Settings.model_validate({"reply_prefixes": [""]})
