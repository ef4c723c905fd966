"""The settings model: everything the worker can be told (loading it: `loading`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import (
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import SettingsConfigDict

from toolbus.config.callers import CallerProfile
from toolbus.config.records import RecordSettings
from toolbus.config.servers import McpPolicy, McpServerConfig
from toolbus.config.tools import DEFAULT_GUARDS, GuardSettings, ToolSettings, complete_guards
from toolbus.wire.broker import BrokerUrl as BrokerUrl  # noqa: PLC0414 -- re-exported: its former home
from toolbus.wire.broker import broker_urls, gather_password
from toolbus.wire.untrusted import topic_problem

DEFAULT_BROKER_URL = "mqtt://localhost:1883"
# A client-id secret shorter than this can be guessed (the token is 80 bits of an HMAC:
# no stronger than its key). `openssl rand -hex 32` makes one; the file's is 64 hex digits.
MIN_CLIENT_ID_SECRET_BYTES = 16


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Settings(RecordSettings):
    """Everything the worker can be told. Units are in the names."""

    model_config = SettingsConfigDict(
        env_prefix="TOOLBUS_",
        env_nested_delimiter="__",
        populate_by_name=True,
        extra="forbid",
        # Errors never echo a value: values may be secrets (a password, a token in an
        # MCP server's env or headers); the location and the reason are enough.
        hide_input_in_errors=True,
    )

    broker_url: str = Field(
        default=DEFAULT_BROKER_URL,
        description="The broker, or the nodes of a cluster in the order they are tried: a "
        "list (TOML, JSON) or URLs separated by commas (`mqtt://a:1883,mqtt://b:1883`).",
    )
    # -- broker credentials and TLS: how the worker proves who it is, and checks the broker.
    broker_username: str | None = Field(
        default=None, description="MQTT user name, instead of `mqtt://USER@host` in the URL."
    )
    broker_password: SecretStr | None = Field(
        default=None, description="MQTT password; one in the URL is moved here on loading."
    )
    broker_password_file: Path | None = Field(
        default=None, description="Read once into `broker_password` (a docker secret)."
    )
    tls_ca_file: Path | None = Field(
        default=None, description="PEM CA(s) that signed the broker's certificate (mqtts://)."
    )
    tls_cert_file: Path | None = Field(
        default=None, description="PEM client certificate, for brokers that require one."
    )
    tls_key_file: Path | None = Field(
        default=None, description="Its unencrypted PEM key (unset: it is in tls_cert_file)."
    )
    topic_prefix: str = "toolbus"
    shared_group: str = Field(
        default="toolbus",
        description="Shared-subscription group; empty subscribes without `$share`.",
    )
    dispatch: Literal["shared", "store"] = Field(
        default="shared",
        description="How the workers of a pool share the calls: `shared` through the "
        "broker's `$share`; `store` (brokers without it: ejabberd, RabbitMQ 3.x) each "
        "worker receives every call and answers those it takes first in the Redis "
        "`dedup_store`.",
    )
    worker_id: str | None = Field(
        default=None,
        description="The status topic's name (not the MQTT client id); generated when "
        "absent. Set it (unique per replica) for a persistent session: requests held at a "
        "crash are redelivered on return.",
    )
    client_id_secret: SecretStr | None = Field(
        default=None,
        description="Keys the worker's MQTT client ids (`{worker_id}-{token}`), so no "
        "caller can take them over; unset: the broker password, else random per start "
        "(then no session outlives the process). Same value on every start; at least "
        "16 bytes.",
    )
    client_id_secret_file: Path | None = Field(
        default=None,
        description="A file holding that secret, made with a random one at the first "
        "start if it does not exist (the container image keeps it in a volume); used "
        "when client_id_secret is unset, before the broker password. Refused when others "
        "may write it or it holds under 16 bytes; a warning when others may read it.",
    )
    client_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=65535,
        description="The MQTT client id of `toolbus call`, `tools` and `status` (not the "
        "worker's): unset, the login when caller_identity is `topic`, else random.",
    )
    session_expiry_s: int = Field(
        default=3600,
        ge=0,
        description="With a worker_id: how long the broker keeps the session (and the "
        "requests it holds) after a disconnect; also how long an `offline` status lasts.",
    )
    status_interval_s: float = Field(
        default=15.0,
        ge=0.1,
        le=3600,
        description="The status heartbeat: every retained status is published again this "
        "often, expiring after three intervals without one.",
    )
    reply_prefixes: list[str] | None = Field(
        default=None,
        description='Topics replies may go to; default `["{topic_prefix}/reply/"]`.',
    )
    caller_identity: Literal["claim", "topic"] = Field(
        default="claim",
        description="`claim`: the caller is what the request says (any client can forge it). "
        "`topic`: the level after `call/` or `tools/`, which broker ACLs tie to the login; "
        "replies then go only under `{reply_prefix}{caller}/`.",
    )
    require_caller: bool = Field(
        default=False,
        description="Refuse requests that name no caller (`forbidden`) instead of serving "
        "them under the `anonymous` (else `*`) profile.",
    )
    processes: int = Field(
        default=1,
        ge=1,
        description="Worker processes on the shared subscription, each with its own MCP "
        "sessions, kept running by a supervisor; 1 runs the worker in this process.",
    )
    concurrency: int = Field(default=64, ge=1, le=10_000)
    max_payload_bytes: int = Field(default=256 * 1024, ge=1024)
    max_calls_per_message: int = Field(default=64, ge=1, le=1024)
    default_timeout_s: float = Field(default=30.0, gt=0)
    max_timeout_s: float = Field(default=300.0, gt=0)
    slow_call_ms: float = Field(default=1000.0, ge=0)
    progress_rate_per_s: float = Field(
        default=10.0,
        ge=0,
        description="The most progress updates per second sent for one call (0: no limit); "
        "those coming faster are dropped, except the last before the reply.",
    )
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    publish_timeout_s: float = Field(default=10.0, gt=0)
    reconnect_max_delay_s: float = Field(default=30.0, gt=0)
    keepalive_s: int = Field(
        default=60,
        ge=1,
        le=65535,
        description="MQTT keepalive: a broker silent this long is pinged, and its "
        "connection dropped (and made again) after as long again without an answer.",
    )
    publish_traces: bool = Field(
        default=False,
        description="Publish every call's spans back on `{reply_topic}/trace` (records spans).",
    )
    http_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Serve the status page (/), /metrics, /healthz and /readyz over HTTP on "
        "this port (off when unset).",
    )
    http_host: str = Field(
        default="127.0.0.1",
        description="The address the HTTP listener binds: loopback unless set (`0.0.0.0` "
        "in a container whose port is published or scraped).",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Deprecated: the former Prometheus port; means `http_port` when that "
        "is unset (a warning says so).",
    )
    trace_arguments: bool = Field(
        default=False, description="Record argument values on spans (they may be personal data)."
    )
    trace_steps: bool = Field(
        default=False,
        description="Record `normalize` and `validate` spans under each `execute_tool` span.",
    )
    # Personal data kept out of logs and dead letters unless asked for.
    log_arguments: bool = Field(
        default=False,
        description="Log argument values on each call's line; otherwise only names and sizes.",
    )
    dead_letter_max_bytes: int = Field(
        default=4096,
        ge=0,
        description="Bytes of a request's payload kept in its dead letter; 0 keeps none.",
    )
    log_level: str = "INFO"
    log_format: Literal["auto", "json", "text"] = "auto"
    tools: dict[str, ToolSettings] = Field(default_factory=dict)
    argument_maps: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="Per-tool static renames of argument keys, applied before any heuristic.",
    )
    aliases: dict[str, str] = Field(
        default_factory=dict, description="Alternative tool names (case-insensitive) -> tool."
    )
    guards: GuardSettings = Field(default_factory=lambda: DEFAULT_GUARDS)
    callers: dict[str, CallerProfile] = Field(
        default_factory=dict,
        description="Per-caller tool sets; `*` applies to callers without a profile of their own.",
    )
    mcp: McpPolicy = Field(default_factory=McpPolicy)
    mcp_servers: dict[str, McpServerConfig] = Field(default_factory=dict, alias="mcpServers")

    @model_validator(mode="before")
    @classmethod
    def _broker_password(cls, data: Any) -> Any:
        return gather_password(data) if isinstance(data, dict) else data

    @field_validator("broker_url")
    @classmethod
    def _parse_broker(cls, value: str) -> str:
        for url in broker_urls(value):
            BrokerUrl.from_url(url)
        return value

    @model_validator(mode="after")
    def _store_dispatch_has_a_store(self) -> Self:
        if self.dispatch == "store" and self.dedup_store == "memory":
            raise ValueError(
                'dispatch = "store" needs a shared store: set dedup_store to a redis:// URL'
            )
        return self

    @model_validator(mode="after")
    def _broker_complete(self) -> Self:
        _ = self.broker  # the credentials and TLS files fit together and with the URL
        return self

    @field_validator("topic_prefix")
    @classmethod
    def _plain_prefix(cls, value: str) -> str:
        if not value or any(c in value for c in "+#") or value.startswith(("$", "/")):
            raise ValueError(
                "topic_prefix must be a plain topic without wildcards or leading / or $"
            )
        return value.rstrip("/")

    @field_validator("reply_prefixes")
    @classmethod
    def _reply_prefixes(cls, value: list[str] | None) -> list[str] | None:
        for prefix in value or ():
            # An empty prefix (or one without its `/`) would allow far more than it says.
            if not prefix.endswith("/") or len(prefix) < 2:
                raise ValueError(f"a reply prefix must be a topic prefix ending in `/`: {prefix!r}")
            if topic_problem(prefix) is not None or prefix.startswith("/"):
                raise ValueError(f"a reply prefix must be a plain topic prefix: {prefix!r}")
        return value

    @model_validator(mode="after")
    def _caller_spaces_apart(self) -> Self:
        # With callers in the topic, nested prefixes would put one caller's reply space
        # inside another's (`a/b/x/` is caller `x` under `a/b/` and caller `b` under `a/`).
        if self.caller_identity == "topic":
            prefixes = self.allowed_reply_prefixes
            for prefix in prefixes:
                inner = [
                    other for other in prefixes if other != prefix and other.startswith(prefix)
                ]
                if inner:
                    raise ValueError(f"reply prefixes must not nest: {prefix!r} holds {inner[0]!r}")
        return self

    @field_validator("client_id_secret")
    @classmethod
    def _secret_or_unset(cls, value: SecretStr | None) -> SecretStr | None:
        # An empty value (`TOOLBUS_CLIENT_ID_SECRET=` in a compose file) is no secret.
        if value is None or not value.get_secret_value():
            return None
        if len(value.get_secret_value().encode()) < MIN_CLIENT_ID_SECRET_BYTES:
            raise ValueError(
                f"at least {MIN_CLIENT_ID_SECRET_BYTES} bytes, or it can be guessed "
                "(`openssl rand -hex 32` makes one)"
            )
        return value

    @field_validator("worker_id")
    @classmethod
    def _topic_level(cls, value: str | None) -> str | None:
        # It names the status topic and the MQTT client: one plain topic level.
        if value is not None and (topic_problem(value) is not None or "/" in value):
            raise ValueError("worker_id must be one plain topic level (no `/`, `+`, `#`, `$`)")
        return value

    # Field validators, not one for the model: a problem is then told at its key.
    @field_validator("processes")
    @classmethod
    def _processes_shared(cls, value: int, info: ValidationInfo) -> int:
        if value > 1 and not info.data.get("shared_group", "toolbus"):
            raise ValueError(
                "processes > 1 needs a shared_group: without one every process would "
                "receive, and run, every request"
            )
        return value

    @field_validator("http_port", "metrics_port")
    @classmethod
    def _every_port(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value + info.data.get("processes", 1) - 1 > 65535:
            raise ValueError(f"{info.field_name} + processes - 1 (the last process's port) > 65535")
        return value

    @model_validator(mode="after")
    def _metrics_port_is_http_port(self) -> Self:
        # Deprecated alias: the one HTTP listener serves /metrics now. `http_port` wins
        # when both are set (a supervised child gets its own in the environment).
        if self.http_port is None and self.metrics_port is not None:
            self.http_port = self.metrics_port
        return self

    @field_validator("http_host")
    @classmethod
    def _a_host(cls, value: str) -> str:
        # An empty host binds every interface (`socket.create_server`): an unset
        # `${VAR}` in compose must not expose the listener.
        if not value.strip():
            raise ValueError("expected an address to bind (127.0.0.1 unless set)")
        return value

    @field_validator("mcp_servers")
    @classmethod
    def _server_names(cls, value: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        # A name is a level of its status topic (`status/servers/{name}/{worker_id}`).
        for name in value:
            if not name or topic_problem(name) is not None:
                raise ValueError(
                    f"server name {name!r} must be a valid topic level (no `+`, `#`, controls)"
                )
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        # Told here, at its key, rather than by `logging` at start with no file or key.
        level = value.upper()
        if level not in LOG_LEVELS:
            raise ValueError(f"expected one of {', '.join(LOG_LEVELS)} (any case)")
        return level

    @field_validator("guards")
    @classmethod
    def _complete_guards(cls, value: GuardSettings) -> GuardSettings:
        # A partial [guards] table keeps the defaults for what it does not set.
        return complete_guards(value)

    @property
    def broker(self) -> BrokerUrl:
        """The first broker (`brokers`: every node, in the order they are tried)."""
        return self.brokers[0]

    @property
    def brokers(self) -> tuple[BrokerUrl, ...]:
        return tuple(
            BrokerUrl.from_url(
                url,
                username=self.broker_username,
                password=self.broker_password,
                ca_file=self.tls_ca_file,
                cert_file=self.tls_cert_file,
                key_file=self.tls_key_file,
            )
            for url in broker_urls(self.broker_url)
        )

    @property
    def allowed_reply_prefixes(self) -> tuple[str, ...]:
        if self.reply_prefixes is None:
            return (f"{self.topic_prefix}/reply/",)
        return tuple(self.reply_prefixes)
