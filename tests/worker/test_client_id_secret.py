"""The client-id secret's file and value, as a real `toolbus serve` takes them (issue 29.6).

Whoever knows the secret can compute the worker's client ids and take its place at the
broker, so what keys them is checked where the entry point reads it:

- refused, exit 2, one line that never shows the secret: a `client_id_secret` or a file's
  secret under 16 bytes (it can be guessed), a file others may write (they would choose
  the ids), and one that is no regular file (a FIFO would hang the start);
- started, with one warning line: a file others may read, owned by another user than the
  worker's or root, or reached through a symlink. A Kubernetes secret volume is all
  three at once (a symlink to a 0644 file), a compose secret the host's file: refusing
  them would refuse the usual ways to hand a secret over.
- the file the worker makes itself (the container image's default) warns about nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.support.harness import Broker
from tests.support.mqtt import Caller
from tests.support.processes import RUN_BOUND_S, run_bounded, serve_env
from toolbus.worker.exit_codes import EXIT_USAGE

SECRET = "0123456789abcdef-the-kept-secret"  # long enough; never to be printed
SHORT = "short-secret"  # 12 bytes
REFUSED_BOUND_S = 20.0  # a refusal comes before any connect; a start would run on
OTHER_UID = 65534  # `nobody`: a file the worker's user does not own


def env_for(broker: Broker, prefix: str, **settings: str) -> dict[str, str]:
    return serve_env(
        broker_url=broker.url, topic_prefix=prefix, worker_id=f"w-{prefix}", **settings
    )


async def refused(env: dict[str, str]) -> list[str]:
    """The lines of a `toolbus serve` that must stop at once with exit 2."""
    code, out, err = await run_bounded(
        sys.executable, "-m", "toolbus", "serve", env=env, bound_s=REFUSED_BOUND_S
    )
    assert code == EXIT_USAGE, err
    assert "Traceback" not in err and SECRET not in out + err and SHORT not in out + err
    return err.splitlines()


@pytest.mark.parametrize("problem", ["short", "others_write", "fifo"])
async def test_a_secret_file_that_others_may_know_or_guess_is_refused(
    broker: Broker, tmp_path: Path, problem: str
) -> None:
    path = tmp_path / "client-id-secret"
    if problem == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.write_text(f"{SHORT if problem == 'short' else SECRET}\n")
        path.chmod(0o666 if problem == "others_write" else 0o600)
    prefix = f"ids{uuid.uuid4().hex[:8]}"
    lines = await refused(env_for(broker, prefix, client_id_secret_file=str(path)))
    assert len(lines) == 1 and "client_id_secret_file" in lines[0], lines
    if problem != "fifo":  # left as it was, not replaced by one the worker made
        assert path.read_text().strip() in (SHORT, SECRET)


async def test_a_short_client_id_secret_is_refused_at_its_variable(
    broker: Broker,
) -> None:
    prefix = f"ids{uuid.uuid4().hex[:8]}"
    [line] = await refused(env_for(broker, prefix, client_id_secret=SHORT))
    assert line.startswith("toolbus: bad configuration: ") and "TOOLBUS_CLIENT_ID_SECRET" in line


@asynccontextmanager
async def serving(env: dict[str, str], broker: Broker, prefix: str) -> AsyncIterator[list[str]]:
    """A `toolbus serve` until its retained status says online; its stderr lines."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "toolbus",
        "serve",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    lines: list[str] = []

    async def read() -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            lines.append(line.decode(errors="replace"))

    reader = asyncio.create_task(read(), name="serve-stderr")
    try:
        async with Caller(broker.url) as watcher, asyncio.timeout(RUN_BOUND_S):
            await watcher.subscribe(f"{prefix}/status/workers/+")
            while json.loads((await watcher.next_message()).payload)["state"] != "online":
                pass
        yield lines
    finally:
        if proc.returncode is None:
            proc.kill()
        async with asyncio.timeout(RUN_BOUND_S):
            await proc.wait()
            await reader


def warnings(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("toolbus: warning: ")]


async def test_a_secret_mounted_as_kubernetes_does_starts_with_one_warning(
    broker: Broker, tmp_path: Path
) -> None:
    """As a Kubernetes secret volume lays it out: `NAME -> ..data/NAME`, `..data ->` a
    timestamped folder, the file 0644; here also owned by another user than the
    worker's (and than root)."""
    mounted = tmp_path / "secret-volume"
    data = mounted / "..2026_01_01_00_00_00.000000001"
    data.mkdir(parents=True)
    (data / "client-id-secret").write_text(f"{SECRET}\n")
    (data / "client-id-secret").chmod(0o644)
    (mounted / "..data").symlink_to(data.name)
    (mounted / "client-id-secret").symlink_to("..data/client-id-secret")
    other_owner = os.geteuid() == 0  # only root can give a file away
    if other_owner:
        os.chown(data / "client-id-secret", OTHER_UID, OTHER_UID)
    prefix = f"ids{uuid.uuid4().hex[:8]}"
    env = env_for(broker, prefix, client_id_secret_file=str(mounted / "client-id-secret"))
    async with serving(env, broker, prefix) as lines:
        [warning] = warnings(lines)
    assert "client_id_secret_file" in warning and "symlink" in warning, warning
    assert "0644" in warning and (not other_owner or f"uid {OTHER_UID}" in warning), warning
    assert SECRET not in "".join(lines)


async def test_the_file_the_worker_makes_warns_about_nothing(
    broker: Broker, tmp_path: Path
) -> None:
    """The container image's default: no file yet, the worker makes it (0600, its own)."""
    path = tmp_path / "state" / "client-id-secret"
    prefix = f"ids{uuid.uuid4().hex[:8]}"
    env = env_for(broker, prefix, client_id_secret_file=str(path))
    async with serving(env, broker, prefix) as lines:
        assert warnings(lines) == []
    assert len(path.read_text().strip()) == 64
