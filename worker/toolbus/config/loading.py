"""Loading the settings: flags > environment > files > defaults, every problem found.

What is refused, and where each key came from, is told as `ConfigProblem`s (see
`problems`): a file that does not parse (its line and column), a value that does not
fit, a key that is not ours (the config file and every table in it forbid unknown
keys). Two sources are shared with others, so a foreign key there is not ours to
refuse: `TOOLBUS_*` environment variables (one process's environment serves every
tool and child it starts) and `mcpServers` entries (the file other MCP clients read,
with their own keys). There a key that resembles one of ours is a misspelling and is
refused; an environment variable that resembles nothing is only warned about, and an
`mcpServers` key that resembles nothing is ignored.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsError,
)

from toolbus.config.problems import (
    TYPO,
    ConfigError,
    ConfigProblem,
    closest,
    problem_from_error,
)
from toolbus.config.servers import McpServerConfig
from toolbus.config.settings import Settings

ENV_PREFIX = "TOOLBUS_"
ENV_NESTED = "__"
# TOOLBUS_ variables that are no setting but are ours: the supervisor's, to its children.
INTERNAL_VARIABLES = frozenset({"TOOLBUS_SUPERVISOR_PID"})
FLAGS = {"broker_url": "--broker", "processes": "--processes"}
_TOML_AT = re.compile(r"^(?P<why>.*?)\s*\(at line (?P<line>\d+), column (?P<column>\d+)\)$")
_ENV_FIELD = re.compile(r'for field "(?P<field>[^"]+)"')
# A value nested past what Python's parsers follow (about a thousand levels for JSON,
# fewer for TOML; no setting is more than a few deep): said in one line, exit 2.
TOO_DEEP = "nested too deeply"


def read_config_file(path: Path) -> dict[str, Any]:
    """A TOML or JSON (by its suffix) config file as a dict; `ConfigError` when it
    cannot be read or parsed, with the line and column of a syntax error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _unreadable(path, f"cannot read it ({why})") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _unreadable(path, f"not valid JSON ({exc.msg})", exc.lineno, exc.colno) from None
        except RecursionError:  # both parsers recurse per level: a line, not a traceback
            raise _unreadable(path, f"not valid JSON ({TOO_DEEP})") from None
    else:
        try:
            data = tomllib.loads(text)
        except RecursionError:
            raise _unreadable(path, f"not valid TOML ({TOO_DEEP})") from None
        except tomllib.TOMLDecodeError as exc:
            at = _TOML_AT.match(str(exc))  # Python 3.11 gives the place only in the text
            if at is None:
                raise _unreadable(path, f"not valid TOML ({exc})") from None
            line, column = int(at["line"]), int(at["column"])
            raise _unreadable(path, f"not valid TOML ({at['why']})", line, column) from None
    if not isinstance(data, dict):
        raise _unreadable(path, "expected a table (an object) at the top level")
    return data


def _unreadable(
    path: Path, why: str, line: int | None = None, column: int | None = None
) -> ConfigError:
    return ConfigError(
        [ConfigProblem("unreadable", str(path), expected=why, line=line, column=column)]
    )


def environment_problems(environ: Mapping[str, str]) -> list[ConfigProblem]:
    """`TOOLBUS_*` variables that name no setting: `fatal` when one resembles a setting."""
    names = list(Settings.model_fields)
    found = []
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(ENV_PREFIX) or upper in INTERNAL_VARIABLES:
            continue
        top = upper.removeprefix(ENV_PREFIX).split(ENV_NESTED)[0].lower()
        if top in names:
            continue  # a setting; what it holds, and its nested keys, are validated
        # Compared without the prefix, which every name shares and would make alike.
        typo = closest(top, names, TYPO)
        near = typo or closest(top, names)
        found.append(
            ConfigProblem(
                "unknown_variable",
                "environment",
                variable,
                suggestion=f"{ENV_PREFIX}{near.upper()}" if near else None,
                fatal=typo is not None,
            )
        )
    return found


def server_key_typos(servers: Any, source: str) -> list[ConfigProblem]:
    """`mcpServers` entries' keys that are misspellings of ours (others are ignored)."""
    if not isinstance(servers, dict):
        return []
    ours = [f.alias or name for name, f in McpServerConfig.model_fields.items()]
    found = []
    for server, entry in servers.items():
        for key in entry if isinstance(entry, dict) else ():
            meant = closest(key, ours, TYPO) if key not in ours else None
            if meant is not None:
                path = f"mcpServers.{server}"
                found.append(
                    ConfigProblem(
                        "unknown_key", source, f"{path}.{key}", suggestion=f"{path}.{meant}"
                    )
                )
    return found


@dataclass(frozen=True, slots=True)
class _Sources:
    """Where each top-level key came from, to name it in a problem."""

    flags: frozenset[str]
    variables: Mapping[tuple[str, ...], str]  # the lower-cased key path -> variable
    config_file: Path | None
    mcp_config_file: Path | None
    mcp_servers: frozenset[str] = field(default_factory=frozenset)  # from mcp_config_file

    def of(self, loc: tuple[int | str, ...]) -> str:
        if not loc:
            return ""
        top = str(loc[0])
        if top in self.flags:
            return FLAGS.get(top, f"--{top.replace('_', '-')}")
        path = tuple(str(part).lower() for part in loc)
        for length in range(len(path), 0, -1):  # the most specific variable first
            variable = self.variables.get(path[:length])
            if variable is not None:
                return f"environment variable {variable}"
        if top == "mcpServers" and len(loc) > 1 and str(loc[1]) in self.mcp_servers:
            return str(self.mcp_config_file)
        return str(self.config_file) if self.config_file is not None else "the defaults"


def _variables(environ: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    return {
        tuple(variable.lower().removeprefix(ENV_PREFIX.lower()).split(ENV_NESTED)): variable
        for variable in environ
        if variable.upper().startswith(ENV_PREFIX)
    }


def load_settings(
    config_file: Path | None = None,
    mcp_config_file: Path | None = None,
    **overrides: Any,
) -> Settings:
    """Build the settings: flags (`overrides`) > environment > files > defaults.

    Raises `ConfigError` with every problem found (see the module docstring).
    """
    environ = os.environ
    problems = [p for p in environment_problems(environ) if p.fatal]
    file_data: dict[str, Any] = {}
    mcp_servers: dict[str, Any] = {}
    for path, is_mcp in ((config_file, False), (mcp_config_file, True)):
        if path is None:
            continue
        try:
            data = read_config_file(path)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        if is_mcp:
            mcp_servers = data.get("mcpServers", {})
        else:
            file_data = data
        problems.extend(server_key_typos(data.get("mcpServers"), str(path)))
    if isinstance(mcp_servers, dict) and mcp_servers:
        merged = dict(file_data.get("mcpServers", {}))
        merged.update(mcp_servers)
        file_data["mcpServers"] = merged
    given = {k: v for k, v in overrides.items() if v is not None}
    sources = _Sources(
        frozenset(given),
        _variables(environ),
        config_file,
        mcp_config_file,
        frozenset(mcp_servers) if isinstance(mcp_servers, dict) else frozenset(),
    )
    if any(p.kind == "unreadable" for p in problems):
        raise ConfigError(problems)  # what a broken file meant to say is unknown
    try:
        settings = _validated(file_data, given)
    except RecursionError:  # a variable's JSON (the files' were parsed above)
        raise ConfigError([_too_deep(environ)]) from None
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        problems.extend(problem_from_error(e, sources.of(e["loc"]), Settings) for e in errors)
    except SettingsError as exc:  # a variable holding a table that is no JSON
        name = _ENV_FIELD.search(str(exc))
        variable = f"{ENV_PREFIX}{name['field'].upper()}" if name else "a TOOLBUS_ variable"
        raise ConfigError(
            [
                ConfigProblem(
                    "invalid_value",
                    f"environment variable {variable}",
                    name["field"] if name else "",
                    expected="expected JSON (a table or a list)",
                )
            ]
        ) from None
    if problems:
        raise ConfigError(problems)
    return settings


def _too_deep(environ: Mapping[str, str]) -> ConfigProblem:
    """The problem of a configuration too deep to parse or validate: the variable whose
    JSON is, when one is (pydantic-settings parses them without a bound)."""
    for variable in sorted(environ):
        if variable.upper().startswith(ENV_PREFIX):
            try:
                json.loads(environ[variable])
            except RecursionError:
                source = f"environment variable {variable}"
                return ConfigProblem("invalid_value", source, expected=f"JSON {TOO_DEEP}")
            except ValueError:
                continue
    return ConfigProblem("invalid_value", "", expected=f"the configuration is {TOO_DEEP}")


def _validated(file_data: dict[str, Any], given: dict[str, Any]) -> Settings:
    class _FromFiles(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, InitSettingsSource(settings_cls, file_data))

    loaded = _FromFiles(**given)
    return Settings.model_validate(loaded.model_dump(by_alias=True))
