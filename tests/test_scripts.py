"""The set-up scripts: the local broker behind `make run`, and the tree check CI runs first."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness import free_port

ROOT = Path(__file__).parent.parent


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    # The script writes .run/ under the working directory: keep it out of the checkout.
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    shutil.copytree(ROOT / "config", tmp_path / "config")
    return tmp_path


def run_script(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(repo / "scripts" / "local-broker"), *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


async def test_local_broker_script_starts_and_stops(repo_copy: Path) -> None:
    from tests.mqtt import Caller

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
