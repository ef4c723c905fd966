"""Configuration errors as data: the source, the dotted key, what was expected and
given, the key that was meant; one line each at the command line, exit code 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli.test_cli import cli_env, run_cli
from toolbus.config import ConfigError, ConfigProblem, load_settings, read_config_file
from toolbus.config.loading import INTERNAL_VARIABLES, environment_problems
from toolbus.worker.exit_codes import EXIT_USAGE
from toolbus.worker.supervisor import SUPERVISOR_PID_ENV

SECRET = "hunter2-s3cr3t"
PYDANTIC_INTERNALS = (
    "errors.pydantic.dev",
    "Value error,",
    "input_type=",
    "Input should",
    "[type=",
)


@pytest.fixture(autouse=True)
def no_toolbus_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the variables a test sets: the runner's own environment may hold others."""
    for name in list(os.environ):
        if name.upper().startswith("TOOLBUS_"):
            monkeypatch.delenv(name)


def refused(
    config: Path | None = None, mcp_config: Path | None = None, **overrides: object
) -> list[ConfigProblem]:
    with pytest.raises(ConfigError) as caught:
        load_settings(config, mcp_config, **overrides)
    for problem in caught.value.problems:
        line = str(problem)
        assert "\n" not in line and not any(bit in line for bit in PYDANTIC_INTERNALS), line
    return list(caught.value.problems)


def write(path: Path, data: dict[str, object]) -> Path:
    """A config file; JSON whatever the suffix says (the TOML path has its own tests)."""
    path.write_text(json.dumps(data))
    return path


UNKNOWN_TOML = """
concurency = 8

[tools.echo]
timeout = 3

[mcp]
max_in_fligt = 2
"""


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_an_unknown_key_names_the_file_and_the_key_meant(tmp_path: Path, suffix: str) -> None:
    cfg = tmp_path / f"toolbus{suffix}"
    if suffix == ".toml":
        cfg.write_text(UNKNOWN_TOML)
    else:
        write(cfg, {"concurency": 8, "tools": {"echo": {"timeout": 3}}, "mcp": {"max_in_fligt": 2}})
    found = {(p.kind, p.source, p.key, p.suggestion) for p in refused(cfg)}
    assert found == {
        ("unknown_key", str(cfg), "concurency", "concurrency"),
        ("unknown_key", str(cfg), "tools.echo.timeout", "tools.echo.timeout_s"),
        ("unknown_key", str(cfg), "mcp.max_in_fligt", "mcp.max_in_flight"),
    }


def test_a_key_like_nothing_is_refused_without_a_suggestion(tmp_path: Path) -> None:
    [problem] = refused(write(tmp_path / "t.json", {"zzzz": 1}))
    assert (problem.kind, problem.key, problem.suggestion) == ("unknown_key", "zzzz", None)


def test_a_bad_value_says_what_was_expected_and_given(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "t.json",
        {"tools": {"echo": {"timeout_s": -1}, "w": {"timeout_s": "soon"}}, "log_format": "fancy"},
    )
    found = {p.key: p for p in refused(cfg)}
    assert set(found) == {"tools.echo.timeout_s", "tools.w.timeout_s", "log_format"}
    assert {p.kind for p in found.values()} == {"invalid_value"}
    assert {p.source for p in found.values()} == {str(cfg)}
    assert found["tools.echo.timeout_s"].given == "-1"
    assert found["tools.w.timeout_s"].given == '"soon"'
    assert found["log_format"].given == '"fancy"'
    assert all(p.expected.startswith("expected ") for p in found.values())


def test_every_problem_of_a_file_at_once_a_log_level_among_them(tmp_path: Path) -> None:
    cfg = tmp_path / "t.toml"
    cfg.write_text('concurency = 3\nlog_level = "verbose"\n')
    found = {p.key: p for p in refused(cfg)}
    assert set(found) == {"concurency", "log_level"}  # not one now and one at start
    assert found["concurency"].suggestion == "concurrency"
    assert found["log_level"].kind == "invalid_value"
    assert load_settings(None, None, log_level="debug").log_level == "DEBUG"


def test_a_url_with_credentials_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLBUS_DEDUP_STORE", "Redis://:hunter2hunter2@redis:6379/0")
    [problem] = refused()
    assert problem.key == "dedup_store" and problem.given is None
    assert "hunter2" not in str(problem)


def test_an_empty_http_host_and_a_wildcard_server_name_are_refused(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "t.json",
        {"http_host": " ", "mcpServers": {"home+1": {"command": "x"}}},
    )
    assert {p.key.split(".")[0] for p in refused(cfg)} == {"http_host", "mcpServers"}


def test_a_long_value_is_shortened(tmp_path: Path) -> None:
    [problem] = refused(write(tmp_path / "t.json", {"log_format": "x" * 500}))
    assert problem.given is not None and len(problem.given) <= 40


def test_secrets_are_named_never_shown(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "t.json",
        {
            "broker_url": f"mqtt://u:{SECRET}@h:notaport",
            "mcpServers": {
                "a": {"command": "x", "env": {"TOKEN": [SECRET]}, "headers": {"X": [SECRET]}}
            },
        },
    )
    found = {p.key: p for p in refused(cfg)}
    assert set(found) == {"broker_url", "mcpServers.a.env.TOKEN", "mcpServers.a.headers.X"}
    assert all(p.given is None and SECRET not in str(p) for p in found.values())


def test_mcp_config_typos_refused_other_clients_keys_ignored(tmp_path: Path) -> None:
    servers = {
        "weather": {"command": "x", "connect_timout_s": 5, "alwaysAllow": ["a"]},
        "remote": {"url": "http://127.0.0.1:9/mcp", "connect_timeout_s": 0},
    }
    mcp = write(tmp_path / "claude_desktop_config.json", {"mcpServers": servers})
    found = {(p.kind, p.source, p.key, p.suggestion) for p in refused(None, mcp)}
    assert found == {
        (
            "unknown_key",
            str(mcp),
            "mcpServers.weather.connect_timout_s",
            "mcpServers.weather.connect_timeout_s",
        ),
        ("invalid_value", str(mcp), "mcpServers.remote.connect_timeout_s", None),
    }
    del servers["weather"]["connect_timout_s"], servers["remote"]
    assert load_settings(None, write(mcp, {"mcpServers": servers})).mcp_servers["weather"]


def test_a_server_in_the_main_file_is_told_at_the_main_file(tmp_path: Path) -> None:
    cfg = write(tmp_path / "t.json", {"mcpServers": {"a": {"command": "x", "url": "http://y"}}})
    mcp = write(tmp_path / "m.json", {"mcpServers": {"b": {"command": "x", "disabled": "maybe"}}})
    found = {p.key: p.source for p in refused(cfg, mcp)}
    assert found == {"mcpServers.a": str(cfg), "mcpServers.b.disabled": str(mcp)}


@pytest.mark.parametrize(
    ("name", "text", "line", "column"),
    [
        ("t.toml", 'concurrency = 3\ntopic_prefix = "a\n', 2, 18),  # unterminated: its line end
        ("t.json", '{\n  "concurrency": 3,\n}', 3, 1),
    ],
)
def test_a_file_that_does_not_parse_tells_line_and_column(
    tmp_path: Path, name: str, text: str, line: int, column: int
) -> None:
    cfg = tmp_path / name
    cfg.write_text(text)
    [problem] = refused(cfg)
    assert (problem.kind, problem.source, problem.line, problem.column) == (
        "unreadable",
        str(cfg),
        line,
        column,
    )
    with pytest.raises(ConfigError):
        read_config_file(cfg)


def test_a_missing_file_and_a_non_table_are_refused(tmp_path: Path) -> None:
    [missing] = refused(tmp_path / "nope.toml")
    assert (missing.kind, missing.source) == ("unreadable", str(tmp_path / "nope.toml"))
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    assert [p.kind for p in refused(listed)] == ["unreadable"]


def test_environment_values_are_told_at_their_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLBUS_CONCURRENCY", "abc")
    monkeypatch.setenv("TOOLBUS_TOOLS__ECHO__TIMEOUT", "3")
    monkeypatch.setenv("TOOLBUS_BROKER_PASSWORD", SECRET)
    monkeypatch.setenv("TOOLBUS_BROKER_USERNAME", "u")
    monkeypatch.setenv("TOOLBUS_TOOLS", '{"a":')
    [problem] = refused()  # a table that is no JSON stops the environment's reading
    assert (problem.source, problem.key) == ("environment variable TOOLBUS_TOOLS", "tools")
    monkeypatch.delenv("TOOLBUS_TOOLS")
    found = {(p.kind, p.source, p.key, p.given, p.suggestion) for p in refused()}
    assert found == {
        ("invalid_value", "environment variable TOOLBUS_CONCURRENCY", "concurrency", '"abc"', None),
        (
            "unknown_key",
            "environment variable TOOLBUS_TOOLS__ECHO__TIMEOUT",
            "tools.echo.timeout",
            None,
            "tools.echo.timeout_s",
        ),
    }


def test_unknown_variables_refused_when_misspelt_else_warned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLBUS_CONCURENCY", "3")
    monkeypatch.setenv("TOOLBUS_HOME", "/opt/toolbus")
    monkeypatch.setenv(SUPERVISOR_PID_ENV, "1")
    assert SUPERVISOR_PID_ENV in INTERNAL_VARIABLES
    found = {(p.key, p.suggestion, p.fatal) for p in environment_problems(os.environ)}
    assert found == {
        ("TOOLBUS_CONCURENCY", "TOOLBUS_CONCURRENCY", True),
        ("TOOLBUS_HOME", None, False),
    }
    [problem] = refused()
    assert (problem.kind, problem.key) == ("unknown_variable", "TOOLBUS_CONCURENCY")
    monkeypatch.delenv("TOOLBUS_CONCURENCY")
    assert load_settings().concurrency == 64  # the foreign variable is no refusal


def test_flags_and_combinations_are_told_at_their_key(monkeypatch: pytest.MonkeyPatch) -> None:
    [problem] = refused(processes=0)
    assert (problem.source, problem.key, problem.given) == ("--processes", "processes", "0")
    monkeypatch.setenv("TOOLBUS_SHARED_GROUP", "")
    [problem] = refused(processes=2)  # the combination, at the key that makes it wrong
    assert (problem.source, problem.key) == ("--processes", "processes")


async def test_the_command_line_prints_one_line_per_problem(tmp_path: Path) -> None:
    cfg = write(tmp_path / "toolbus.json", {"concurency": 8, "tools": {"echo": {"timeout_s": 0}}})
    env = {k: v for k, v in cli_env("unused").items() if k != "TOOLBUS_TOPIC_PREFIX"}
    env["TOOLBUS_HOME"] = "/opt/toolbus"
    code, out, err = await run_cli("serve", "--config", str(cfg), env=env)
    assert code == EXIT_USAGE and out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and all(
        line.startswith("toolbus: bad configuration: ") for line in lines
    )
    assert any(f"in {cfg}" in line and "`concurrency`" in line for line in lines)
    assert any("`tools.echo.timeout_s`" in line for line in lines)
    # A foreign variable is a warning, after settings that load.
    code, _, err = await run_cli("call", "echo", "--broker", "mqtt://127.0.0.1:9", env=env)
    assert err.splitlines()[0].startswith("toolbus: warning: ") and "TOOLBUS_HOME" in err


DEEP = 100_000  # levels: far past what Python's JSON and TOML parsers follow
NESTED = {
    "arrays.toml": "a = " + "[" * DEEP + "]" * DEEP + "\n",
    "tables.toml": "a = " + "{b = " * DEEP + "1" + "}" * DEEP + "\n",
    "arrays.json": '{"a": ' + "[" * DEEP + "]" * DEEP + "}",
    "objects.json": '{"a": ' + '{"b": ' * DEEP + "1" + "}" * DEEP + "}",
}


@pytest.mark.parametrize("name", list(NESTED))
async def test_a_file_nested_too_deeply_is_one_line_not_a_traceback(
    tmp_path: Path, name: str
) -> None:
    cfg = tmp_path / name
    cfg.write_text(NESTED[name])
    env = {k: v for k, v in cli_env("unused").items() if not k.startswith("TOOLBUS_")}
    code, out, err = await run_cli("serve", "--config", str(cfg), env=env)
    assert (code, out) == (EXIT_USAGE, ""), err
    [line] = err.splitlines()
    assert line.startswith("toolbus: bad configuration: ") and str(cfg) in line
    [problem] = refused(cfg)
    assert (problem.kind, problem.source) == ("unreadable", str(cfg))
    [problem] = refused(mcp_config=cfg)  # an MCP client's file, read the same way
    assert (problem.kind, problem.source) == ("unreadable", str(cfg))


async def test_a_variable_nested_too_deeply_is_one_line_at_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deep = "[" * 60_000 + "]" * 60_000  # within the kernel's bound on one variable
    env = {k: v for k, v in cli_env("unused").items() if not k.startswith("TOOLBUS_")}
    code, out, err = await run_cli("serve", env={**env, "TOOLBUS_TOOLS": deep})
    assert (code, out) == (EXIT_USAGE, ""), err
    [line] = err.splitlines()
    assert line.startswith("toolbus: bad configuration: ") and "TOOLBUS_TOOLS" in line
    monkeypatch.setenv("TOOLBUS_TOOLS", deep)
    [problem] = refused()
    assert (problem.kind, problem.source) == ("invalid_value", "environment variable TOOLBUS_TOOLS")
