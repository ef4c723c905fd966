"""Health check: `toolbus health`, one GET of a worker's /readyz, for container HEALTHCHECKs.

Exits 0 when the answer is 200, 1 otherwise (an error answer, no answer within the
timeout, nothing listening, a configuration it cannot read), with one line on stderr
saying why; Docker reserves every other exit code. Light on purpose: a probe runs every
few seconds, so it takes the standard library's HTTP client (which, unlike urllib, never
goes through an `HTTP_PROXY`) and reads the settings only when no `--url` is given.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from toolbus.wire.untrusted import printable

EXIT_HEALTHY, EXIT_UNHEALTHY = 0, 1
DEFAULT_TIMEOUT_S = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="what to GET: a URL without a path asks its /readyz (default: "
        "http://{http_host}:{http_port}/readyz from the settings, 127.0.0.1 for a worker "
        "bound to 0.0.0.0)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds to wait for the answer; none in time is unhealthy (default "
        f"{DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--config", type=Path, help="config file (TOML or JSON) naming http_port and http_host"
    )


def run(args: argparse.Namespace) -> int:
    """0 when the URL answers 200, else 1 with the reason on stderr."""
    url = readyz_unless_a_path(args.url) if args.url else _url_from_settings(args.config)
    if url is None:
        return EXIT_UNHEALTHY
    try:
        status, body = get(url, args.timeout)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
        print(f"toolbus health: {printable(f'{url}: {reason}')}", file=sys.stderr)
        return EXIT_UNHEALTHY
    # Printable: the body holds what MCP servers said (their last errors) and the URL
    # may come from a file.
    summary = _summary(body)
    if status == 200:
        print(printable(f"{url}: {status}{summary}"))
        return EXIT_HEALTHY
    print(f"toolbus health: {printable(f'{url} answered {status}{summary}')}", file=sys.stderr)
    return EXIT_UNHEALTHY


def readyz_unless_a_path(url: str) -> str:
    """`http://host:port` (or `.../`) asks the worker's /readyz; a URL with a path, that path."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        return parts._replace(path="/readyz").geturl()
    return url


def default_url(host: str, port: int) -> str:
    """/readyz of a worker listening on `host`: a wildcard address is asked on loopback."""
    wildcards = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104 -- mapped away, not bound
    host = wildcards.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/readyz"


def get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """The status and body of a GET of `url`, all within `timeout_s` (bodies here are small:
    the bound is reset to what is left before each step)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the URL must be http://host:port/path or https://...")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    conn = kind(parts.hostname, parts.port, timeout=left())
    try:
        conn.connect()
        if conn.sock is not None:
            conn.sock.settimeout(left())
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        response = conn.getresponse()
        if conn.sock is not None:
            conn.sock.settimeout(left())
        return response.status, response.read()
    finally:
        conn.close()


def _summary(body: bytes) -> str:
    """`: broker subscribed, devices ready` from a /readyz body; what else there is, briefly."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        text = body.decode(errors="replace").strip().splitlines()
        return f": {text[0][:200]}" if text else ""
    if not isinstance(data, dict):
        return ""
    parts = []
    if isinstance(broker := data.get("broker"), dict):
        parts.append(f"broker {broker.get('state')}")
    for name, server in (data.get("servers") or {}).items():
        error = server.get("last_error")
        parts.append(f"{name} {server.get('state')}" + (f" ({error})" if error else ""))
    if "status" in data and not parts:
        parts.append(str(data["status"]))
    return f": {', '.join(parts)}" if parts else ""


def _url_from_settings(config: Path | None) -> str | None:
    """The URL the settings give (printing why not when they give none)."""
    from toolbus.config import ConfigError, load_settings  # noqa: PLC0415 -- only without --url

    try:
        settings = load_settings(config)
    except ConfigError as exc:  # the same lines `toolbus serve` prints for it
        for problem in exc.problems:
            print(f"toolbus health: bad configuration: {problem}", file=sys.stderr)
        return None
    except (ValueError, OSError) as exc:
        print(f"toolbus health: cannot read the settings: {printable(str(exc))}", file=sys.stderr)
        return None
    if settings.http_port is None:
        print(
            "toolbus health: no http_port is set (TOOLBUS_HTTP_PORT or the config); "
            "give --url to probe another worker",
            file=sys.stderr,
        )
        return None
    return default_url(settings.http_host, settings.http_port)
