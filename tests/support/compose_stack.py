"""The compose stack (compose/), read from its own files and started natively.

No Docker engine runs here, so the tests start the same configuration as processes:
mosquitto with compose/mosquitto/mosquitto.conf, the demo MCP server with its service's
command, each toolbus service with the image's environment and command, its own
environment and the toolbus.toml it mounts, and a test OTLP receiver where the collector
would be. Only addresses and paths change: each `service:port` of the compose network
becomes a free port on 127.0.0.1 (nothing listens beyond loopback), and each container
path the file of the test's own.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import re
import shlex
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.harness import Broker, RedisServer, free_port
from tests.support.mqtt import Caller
from tests.support.otlp import OtlpReceiver
from tests.support.processes import ROOT, RUN_BOUND_S, serve_env, wait_for_line
from toolbus.config import Settings, read_config_file
from toolbus.wire.contracts import WorkerStatus
from toolbus.wire.topics import Topics
from toolbus.worker.wiring import topics_for

COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
DOCKERFILE = COMPOSE_DIR / "Dockerfile"
MOSQUITTO_CONF = COMPOSE_DIR / "mosquitto" / "mosquitto.conf"
COLLECTOR_CONFIG = COMPOSE_DIR / "otel-collector" / "config.yaml"
PROMETHEUS_CONFIG = COMPOSE_DIR / "prometheus" / "prometheus.yml"
REDIS_PORT = 6379  # redis-server's own default: the compose service sets no other

_VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation, the forms the file uses: `${VAR}`, `${VAR:-default}`, `$$`."""

    def value(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1]) or (match[2] or "")  # `:-`: unset or empty takes the default

    return _VARIABLE.sub(value, text)


def load_compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose file as `docker compose config` reads it (anchors merged, interpolated)."""
    loaded: dict[str, Any] = yaml.safe_load(interpolate(COMPOSE_FILE.read_text(), env or {}))
    return loaded


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, (NAME, arguments), continuation lines joined."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = (line.strip() for line in joined.splitlines())
    return [
        (name.upper(), rest.strip())
        for line in lines
        if line and not line.startswith("#")
        for name, _, rest in [line.partition(" ")]
    ]


def image_env() -> dict[str, str]:
    """What the image's `ENV` lines set."""
    pairs = (p for name, rest in dockerfile() if name == "ENV" for p in shlex.split(rest))
    return dict(pair.split("=", 1) for pair in pairs)


def image_json(instruction: str) -> list[str]:
    """A JSON-form instruction's list (`CMD`, `ENTRYPOINT`); the last one counts."""
    found = [rest for name, rest in dockerfile() if name == instruction]
    value: list[str] = json.loads(found[-1])
    return value


OUR_IMAGE = "toolbus:latest"


def built_here(service: dict[str, Any]) -> bool:
    """Our image: the service that builds it, and those that run it (never pulled)."""
    return bool(service.get("image") == OUR_IMAGE)


def worker_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The toolbus workers: services of our image that run its command (`serve`)."""
    return {
        name: service
        for name, service in compose["services"].items()
        if built_here(service) and "command" not in service
    }


def port_of(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


def mounted(service: dict[str, Any], target: str) -> Path:
    """The file a service mounts at `target` (compose paths are relative to compose/)."""
    volumes: list[str] = service.get("volumes", [])
    for volume in volumes:
        source, _, rest = volume.partition(":")
        if rest.split(":")[0] == target:
            return (COMPOSE_DIR / source).resolve()
    raise AssertionError(f"nothing is mounted at {target}")


@dataclass(frozen=True)
class Logins:
    """A broker that checks logins, as docs/deployment.md hardens the stack."""

    conf: Callable[[str], str]  # the native mosquitto.conf -> hardened
    worker_env: dict[str, str]  # added to every worker's environment, compose addresses
    files: dict[str, Path]  # container paths -> the test's files
    watcher: tuple[str, str]  # a login, password that may read the status topics


@dataclass
class NativeWorker:
    service: str
    worker_id: str
    http_port: int
    env: dict[str, str]
    args: list[str]
    config: Path
    log: Path
    process: asyncio.subprocess.Process | None = None


class NativeStack:
    """The compose services as local processes; `async with` starts and stops them."""

    def __init__(
        self,
        directory: Path,
        collector: OtlpReceiver,
        env: Mapping[str, str] | None = None,
        *,
        logins: Logins | None = None,
    ) -> None:
        self.compose = load_compose(env)
        self.directory = directory
        self.logins = logins
        self.broker = Broker(directory)
        self.redis = RedisServer()
        self.demo_port = free_port()
        services = self.compose["services"]
        demo_listen = services["demo-mcp"]["command"][-1]
        collector_http = yaml.safe_load(COLLECTOR_CONFIG.read_text())["receivers"]["otlp"]
        # Each address of the compose network, as its service listens on it -> here.
        self.addresses = {
            f"mosquitto:{mosquitto_port()}": f"127.0.0.1:{self.broker.port}",
            f"redis:{REDIS_PORT}": f"127.0.0.1:{self.redis.port}",
            f"demo-mcp:{port_of(demo_listen)}": f"127.0.0.1:{self.demo_port}",
            f"otel-collector:{port_of(collector_http['protocols']['http']['endpoint'])}": (
                f"127.0.0.1:{collector.port}"
            ),
        }
        self.workers = {
            name: self._worker(name, service)
            for name, service in worker_services(self.compose).items()
        }
        first = next(iter(self.workers.values()))
        self.settings = Settings.model_validate(read_config_file(first.config))
        self.topics: Topics = topics_for(self.settings)
        self._demo: asyncio.subprocess.Process | None = None
        self._drains: list[asyncio.Task[bytes]] = []

    def rewrite(self, text: str) -> str:
        for compose_address, here in self.addresses.items():
            text = text.replace(compose_address, here)
        for container_path, file in (self.logins.files if self.logins else {}).items():
            text = text.replace(container_path, str(file))
        left = [name for name in self.compose["services"] if f"//{name}" in text]
        assert not left, f"an address of the compose network no process here serves: {left}"
        return text

    def _worker(self, name: str, service: dict[str, Any]) -> NativeWorker:
        command = image_json("CMD")
        config_path = command[command.index("--config") + 1]
        config = self.directory / f"{name}.toml"
        config.write_text(self.rewrite(mounted(service, config_path).read_text()))
        env = serve_env()
        env.update(image_env())
        environment = {**service["environment"], **(self.logins.worker_env if self.logins else {})}
        # `KEY: ${VAR:-}` is YAML's null once interpolated: compose passes it as "" (it was
        # "None" here, a 4-byte client-id secret the worker now refuses as guessable).
        env.update(
            {
                key: "" if value is None else self.rewrite(str(value))
                for key, value in environment.items()
            }
        )
        http_port = free_port()
        # Loopback and a port of its own here: in a container, 0.0.0.0 is the container's.
        env.update(TOOLBUS_HTTP_PORT=str(http_port), TOOLBUS_HTTP_HOST="127.0.0.1")
        # A call's spans leave within 0.1 s instead of the SDK's 5 s batching delay.
        env["OTEL_BSP_SCHEDULE_DELAY"] = "100"
        return NativeWorker(
            service=name,
            worker_id=env["TOOLBUS_WORKER_ID"],
            http_port=http_port,
            env=env,
            args=[str(config) if arg == config_path else arg for arg in command],
            config=config,
            log=self.directory / f"{name}.log",
        )

    async def __aenter__(self) -> NativeStack:
        conf = mosquitto_conf(self.broker.port, self.directory)
        self.broker.config.write_text(self.logins.conf(conf) if self.logins else conf)
        self.broker.start()
        self.redis.start()
        await self._start_demo()
        for worker in self.workers.values():
            with worker.log.open("wb") as log:
                worker.process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "toolbus", *worker.args, env=worker.env, stderr=log
                )
        await self._wait_online()
        return self

    async def _start_demo(self) -> None:
        command = self.compose["services"]["demo-mcp"]["command"]
        listen = command[-1]
        args = [*command[:-1], f"127.0.0.1:{self.demo_port}"]
        assert listen.startswith("0.0.0.0:")  # in its container, every interface: here, loopback
        env = serve_env()
        environment = self.compose["services"]["demo-mcp"].get("environment", {})
        env.update({key: self.rewrite(str(value)) for key, value in environment.items()})
        env["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # as the workers': spans leave at once
        self._demo = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolbus",
            *args,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,  # uvicorn's request log
            stderr=asyncio.subprocess.PIPE,
        )
        assert self._demo.stderr is not None
        await wait_for_line(self._demo.stderr, b"Uvicorn running", "the demo MCP server")
        # Its request log is read on, so a full pipe never blocks it.
        self._drains.append(asyncio.create_task(self._demo.stderr.read()))

    async def _wait_online(self) -> None:
        """Until every worker's retained status says `online` (bounded)."""
        waiting = {w.worker_id for w in self.workers.values()}
        login, password = self.logins.watcher if self.logins else (None, None)
        async with Caller(self.broker.url, username=login, password=password) as watcher:
            for worker_id in waiting:
                await watcher.subscribe(self.topics.status(worker_id))
            async with asyncio.timeout(RUN_BOUND_S):
                while waiting:
                    message = await watcher.next_message(RUN_BOUND_S)
                    if message.payload:
                        status = WorkerStatus.model_validate_json(message.payload)
                        if status.state == "online":
                            waiting.discard(status.worker_id)

    async def __aexit__(self, *_: object) -> None:
        try:
            for worker in self.workers.values():
                if worker.process is not None and worker.process.returncode is None:
                    worker.process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(RUN_BOUND_S):
                for worker in self.workers.values():
                    if worker.process is not None:
                        await worker.process.wait()
        finally:
            for worker in self.workers.values():
                if worker.process is not None and worker.process.returncode is None:
                    worker.process.kill()
            if self._demo is not None and self._demo.returncode is None:
                self._demo.kill()
                await self._demo.wait()
            for drain in self._drains:
                drain.cancel()
            self.redis.stop()
            self.broker.stop()

    def logs(self) -> str:
        """Every worker's log, for a failing assertion's message."""
        return "\n".join(f"--- {w.service}\n{w.log.read_text()}" for w in self.workers.values())


def mosquitto_port() -> int:
    listeners = [line.split() for line in MOSQUITTO_CONF.read_text().splitlines()]
    return next(int(words[1]) for words in listeners if words[:1] == ["listener"])


def mosquitto_conf(port: int, directory: Path) -> str:
    """compose/mosquitto/mosquitto.conf with this test's listener, data and log places."""
    compose = load_compose()
    data_mount = next(
        v.split(":")[1] for v in compose["services"]["mosquitto"]["volumes"] if "data" in v
    )
    lines = []
    for line in MOSQUITTO_CONF.read_text().splitlines():
        words = line.split()
        rewritten = line
        if words[:1] == ["listener"]:
            rewritten = f"listener {port} 127.0.0.1"
        elif words[:1] == ["persistence_location"]:
            # The compose volume is mounted where the config saves.
            assert words[1].rstrip("/") == data_mount.rstrip("/"), (words[1], data_mount)
            rewritten = f"persistence_location {directory}/"
        elif words[:1] == ["log_dest"]:
            rewritten = "log_dest stderr"  # where Broker reads that it runs
        lines.append(rewritten)
    # Started as root, mosquitto would drop to a user that cannot enter the test's directory.
    lines.append(f"user {getpass.getuser()}")
    return "\n".join(lines) + "\n"
