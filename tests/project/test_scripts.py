"""The set-up scripts: the local broker behind `make run` (and `make run` itself, Ctrl-C
and all), the Python it picks, and the tree check CI runs first."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import shutil
import signal
import subprocess
from pathlib import Path

import aiomqtt
import pytest

from tests.support.harness import free_port
from tests.support.processes import serve_env

ROOT = Path(__file__).parents[2]


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    # The script writes .run/ under the working directory: keep it out of the checkout.
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    shutil.copytree(ROOT / "config", tmp_path / "config")
    return tmp_path


def run_script(
    repo: Path, *args: str, process_group: int | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(repo / "scripts" / "local-broker"), *args],
        cwd=repo,
        process_group=process_group,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


async def test_local_broker_script_starts_and_stops(repo_copy: Path) -> None:
    from tests.support.mqtt import Caller

    port = str(free_port())
    started = run_script(repo_copy, "start", port)
    assert started.returncode == 0, started.stderr
    try:
        again = run_script(repo_copy, "start", port)
        assert again.returncode == 0 and "already listens" in again.stdout
        async with Caller(f"mqtt://127.0.0.1:{port}") as caller:
            await caller.subscribe("probe/x")
            await caller.publish("probe/x", b"hello")
            assert (await caller.next_message()).payload == b"hello"
    finally:
        stopped = run_script(repo_copy, "stop", port)
    assert "stopped" in stopped.stdout


async def answers(port: int | str) -> None:
    """A round trip through the broker on `port` (fails if none answers)."""
    from tests.support.mqtt import Caller

    async with Caller(f"mqtt://127.0.0.1:{port}") as caller:
        await caller.subscribe("probe/x")
        await caller.publish("probe/x", b"hello")
        assert (await caller.next_message()).payload == b"hello"


async def test_the_broker_outlives_a_ctrl_c_to_the_group_that_started_it(repo_copy: Path) -> None:
    """As under `make run`: the script runs in the process group of make (here a `sleep`
    leads it, as make would, and waits on), and Ctrl-C sends SIGINT to that whole group.
    The broker is in a session of its own, so it runs on until `stop`, which removes its
    pid file."""
    port = str(free_port())
    group = await asyncio.create_subprocess_exec("sleep", "60", process_group=0)
    pidfile = repo_copy / ".run" / f"mosquitto-{port}" / "mosquitto.pid"
    try:
        started = run_script(repo_copy, "start", port, process_group=group.pid)
        assert started.returncode == 0, started.stderr
        broker_pid = int(pidfile.read_text())
        assert os.getpgid(broker_pid) != group.pid  # not in the group a Ctrl-C reaches
        os.killpg(group.pid, signal.SIGINT)
        async with asyncio.timeout(10):
            await group.wait()
        await answers(port)
    finally:
        if group.returncode is None:
            group.kill()
            await group.wait()
        stopped = run_script(repo_copy, "stop", port)
    assert stopped.stdout.startswith("stopped mosquitto"), stopped.stdout
    assert not pidfile.exists()
    with pytest.raises(aiomqtt.MqttError):  # stopped means stopped
        await answers(port)


async def test_stop_with_a_stale_pid_file_removes_it_and_kills_nothing(repo_copy: Path) -> None:
    """A pid file left by a broker that died may name any process by now: `stop` kills
    only the mosquitto it started, and removes the stale file."""
    port = str(free_port())
    pidfile = repo_copy / ".run" / f"mosquitto-{port}" / "mosquitto.pid"
    pidfile.parent.mkdir(parents=True)
    bystander = await asyncio.create_subprocess_exec("sleep", "60")
    try:
        pidfile.write_text(f"{bystander.pid}\n")
        stopped = run_script(repo_copy, "stop", port)
        assert stopped.returncode == 0 and "no broker of ours" in stopped.stdout
        assert not pidfile.exists()
        assert bystander.returncode is None and os.waitpid(bystander.pid, os.WNOHANG) == (0, 0)
    finally:
        bystander.kill()
        await bystander.wait()
    pidfile.write_text(f"{bystander.pid}\n")  # a dead process's
    stopped = run_script(repo_copy, "stop", port)
    assert "no broker of ours" in stopped.stdout and not pidfile.exists()


def fake_python(directory: Path, name: str, version: str | None) -> Path:
    """An interpreter on PATH answering find-python's question as a Python `version`
    would ("3 12 <its path>"); None: a pyenv shim for a version not installed."""
    path = directory / name
    if version is None:
        path.write_text(f"#!/bin/sh\necho 'pyenv: {name}: command not found' >&2\nexit 127\n")
    else:
        major, minor = version.split(".")
        path.write_text(f'#!/bin/sh\necho "{major} {minor} $0"\n')
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("interpreters", "chosen"),
    [
        ({"python3": "3.12", "python3.13": "3.13"}, "python3"),  # python3 first when it will do
        ({"python3": "3.10", "python3.12": "3.12", "python3.11": "3.11"}, "python3.12"),
        ({"python3.13": None, "python3.12": "3.12"}, "python3.12"),  # a shim that fails
        ({"python3": "3.9", "python3.11": "3.11"}, "python3.11"),  # Debian 11 plus a 3.11
        ({"python3": "3.11"}, "python3"),
    ],
)
def test_find_python_takes_the_first_at_least_3_11(
    tmp_path: Path, interpreters: dict[str, str | None], chosen: str
) -> None:
    for name, version in interpreters.items():
        fake_python(tmp_path, name, version)
    found = find_python(tmp_path)
    assert found.returncode == 0, found.stderr
    assert found.stdout == f"{tmp_path / chosen}\n"


def test_find_python_without_one_says_what_to_install(tmp_path: Path) -> None:
    fake_python(tmp_path, "python3", "3.10")
    fake_python(tmp_path, "python3.13", None)
    found = find_python(tmp_path)
    assert found.returncode == 1 and found.stdout == ""
    assert "apt-get install python3 python3-venv" in found.stderr


def find_python(path: Path) -> subprocess.CompletedProcess[str]:
    """scripts/find-python with `path` as all of PATH (bash itself named by its path)."""
    return subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(ROOT / "scripts" / "find-python")],
        env={"PATH": str(path)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def check_tree(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "scripts" / "check-tree"), str(repo)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, timeout=30)


@pytest.fixture
def scratch_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "sub").mkdir()
    (repo / "sub" / "file.txt").write_text("x\n")
    (repo / "inside").symlink_to("sub/file.txt")
    git(repo, "add", "sub/file.txt", "inside")
    return repo


def test_check_tree_passes_this_checkout() -> None:
    result = check_tree(ROOT)
    assert result.returncode == 0, result.stderr


def test_check_tree_passes_links_that_stay_inside(scratch_repo: Path) -> None:
    result = check_tree(scratch_repo)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("links", "named"),
    [
        ({"venv": "/tmp/phx"}, "venv"),  # the link that broke `make test` off this machine
        ({"sub/up": "../../elsewhere"}, "sub/up"),
        # Each link alone stays inside; together they leave: x/l1 is the root, so l2 is its parent.
        ({"x/l1": "..", "l2": "x/l1/.."}, "l2"),
    ],
)
def test_check_tree_fails_on_a_link_out_of_the_tree(
    scratch_repo: Path, links: dict[str, str], named: str
) -> None:
    for name, target in links.items():
        (scratch_repo / name).parent.mkdir(exist_ok=True)
        (scratch_repo / name).symlink_to(target)
        git(scratch_repo, "add", name)
    result = check_tree(scratch_repo)
    assert result.returncode == 1
    assert f"'{named}'" in result.stderr


def test_check_tree_fails_on_a_tracked_file_under_an_ignored_path(scratch_repo: Path) -> None:
    (scratch_repo / ".gitignore").write_text(".venv-phoenix\n")
    (scratch_repo / ".venv-phoenix").symlink_to("sub")
    git(scratch_repo, "add", "-f", ".gitignore", ".venv-phoenix")
    result = check_tree(scratch_repo)
    assert result.returncode == 1
    assert "'.venv-phoenix'" in result.stderr


class Terminal:
    """A pseudo-terminal a command runs on as its controlling terminal (`setsid --ctty`),
    in the foreground: what it writes is kept, and `ctrl_c` is the key, not a signal we
    pick a target for (the terminal sends SIGINT to its foreground process group)."""

    def __init__(self) -> None:
        self.master, self._slave = pty.openpty()
        self.output = b""
        self.closed = False  # every process holding the terminal is gone
        self._changed = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, *argv: str, cwd: Path, env: dict[str, str]) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            "setsid",
            "--ctty",
            *argv,
            cwd=cwd,
            env=env,
            stdin=self._slave,
            stdout=self._slave,
            stderr=self._slave,
        )
        os.close(self._slave)
        asyncio.get_running_loop().add_reader(self.master, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every process holding the terminal is gone
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
            self.closed = True
        self.output += data
        self._changed.set()

    async def wait_for(self, marker: bytes, timeout_s: float = 60) -> None:
        async with asyncio.timeout(timeout_s):
            while marker not in self.output:
                assert not self.closed, self.output.decode(errors="replace")
                self._changed.clear()
                await self._changed.wait()

    async def wait_closed(self, timeout_s: float = 60) -> None:
        async with asyncio.timeout(timeout_s):
            while not self.closed:
                self._changed.clear()
                await self._changed.wait()

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.master)
        if self.proc is not None and self.proc.returncode is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # make and the worker: its group
        os.close(self.master)


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux's setsid")
async def test_ctrl_c_on_make_run_stops_the_worker_and_leaves_the_broker() -> None:
    """`make run` on a terminal, on a port of its own, then Ctrl-C: the worker stops at
    once and cleanly, make ends, and the broker answers until `make stop-broker`."""
    port = free_port()
    run_dir = ROOT / ".run" / f"mosquitto-{port}"  # git-ignored, removed at the end
    env = serve_env(LOG_FORMAT="json")  # no TOOLBUS_* of ours: the bundled config's
    env = {k: v for k, v in env.items() if not k.startswith("MAKE")}
    terminal = Terminal()
    try:
        await terminal.start("make", "run", f"BROKER_PORT={port}", cwd=ROOT, env=env)
        await terminal.wait_for(b'"state":"ready"')  # subscribed, the demo server ready
        terminal.ctrl_c()
        assert terminal.proc is not None
        await terminal.wait_closed()  # make and the worker gone, their output read
        async with asyncio.timeout(10):
            await terminal.proc.wait()
        lines = terminal.output.decode(errors="replace").splitlines()
        assert lines[0].startswith("toolbus: Python 3."), lines[:3]
        assert any(f"broker mqtt://localhost:{port}" in line for line in lines)
        assert any('stopped","ts"' in line and "worker " in line for line in lines)
        assert [line for line in lines if '"level":"error"' in line] == []
        assert not any("never retrieved" in line for line in lines)
        await answers(port)
        stop = subprocess.run(
            ["make", "stop-broker", f"BROKER_PORT={port}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert "stopped mosquitto" in stop.stdout, stop.stdout + stop.stderr
        assert not (run_dir / "mosquitto.pid").exists()
    finally:
        terminal.close()
        run_script(ROOT, "stop", str(port))
        shutil.rmtree(run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # .run itself, unless something else is in it
            run_dir.parent.rmdir()
