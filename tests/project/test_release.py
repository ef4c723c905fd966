"""A release you can install (issue 30.10): the image's lock, the sdist and wheel, the version.

compose/requirements.lock pins every package the image installs, each with its files'
hashes, and compose/Dockerfile installs it with `--require-hashes`, then toolbus itself
with `--no-deps`. The sdist and wheel are built from this tree with `python -m build`, as
a release would be; the wheel goes into a fresh virtualenv as `pipx install` would put it
(its dependencies resolved from the index), and that venv's `toolbus` answers
`--version`, serves a real broker, and answers a real `toolbus call`, its retained status
carrying the version. Every package that install pulled in is one the lock pins.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.compose_stack import dockerfile
from tests.support.harness import Broker, unique_prefix
from tests.support.mqtt import Caller
from tests.support.processes import BUNDLED_CONFIG, ROOT, run_bounded, stop_process

LOCK = ROOT / "compose" / "requirements.lock"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
IMAGE_EXTRAS = ("prometheus", "redis")  # what compose/Dockerfile's image takes
# name==version, then its `--hash=sha256:...` lines (pip-compile's layout)
PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)((?:\s*\\\n\s+--hash=sha256:[0-9a-f]{64})+)", re.M)
BUILD_BOUND_S = 120
INSTALL_BOUND_S = 180
CLI_BOUND_S = 30


def locked() -> dict[str, tuple[Version, list[str]]]:
    """The lock's pins: name -> (version, its sha256 hashes)."""
    return {
        canonicalize_name(m[1]): (Version(m[2]), re.findall(r"sha256:([0-9a-f]{64})", m[3]))
        for m in PIN.finditer(LOCK.read_text())
    }


def image_requirements() -> list[Requirement]:
    """What the image needs: the runtime dependencies, the extras it takes, the build backend."""
    project = PYPROJECT["project"]
    wanted = [
        *project["dependencies"],
        *(r for extra in IMAGE_EXTRAS for r in project["optional-dependencies"][extra]),
        *PYPROJECT["build-system"]["requires"],
    ]
    return [Requirement(r) for r in wanted]


def test_the_lock_pins_every_image_dependency_with_hashes() -> None:
    pins = locked()
    entries = [line for line in LOCK.read_text().splitlines() if re.match(r"[A-Za-z0-9]", line)]
    assert len(pins) == len(entries) > 20, entries  # each entry read, none without a hash
    missing, outside = [], []
    for requirement in image_requirements():
        name = canonicalize_name(requirement.name)
        if name not in pins:
            missing.append(name)
        elif not requirement.specifier.contains(pins[name][0], prereleases=True):
            outside.append(f"{name}=={pins[name][0]} not {requirement.specifier}")
    assert missing == [], f"not in {LOCK.name}: {missing} (make lock)"
    assert outside == [], outside
    assert "toolbus" not in pins  # installed from the tree, after the lock
    assert all(len(set(hashes)) == len(hashes) >= 1 for _, hashes in pins.values())


def test_the_image_installs_the_lock_and_nothing_unlocked() -> None:
    steps = dockerfile()
    copied = [rest for name, rest in steps if name == "COPY"]
    assert "compose/requirements.lock ./" in copied
    installs = [rest for name, rest in steps if name == "RUN" and "pip install" in rest]
    assert installs[0] == "pip install --require-hashes -r requirements.lock", installs
    # toolbus itself: no dependency resolved past the lock, built by the locked setuptools.
    assert installs[1:] == ["pip install --no-deps --no-build-isolation . && pip check"]
    assert steps.index(("COPY", "compose/requirements.lock ./")) < steps.index(
        ("COPY", "worker ./worker")
    )  # a change to the code alone keeps the installed layer


def test_the_version_is_the_changelogs_latest_release() -> None:
    """`toolbus --version` reports pyproject's version: the newest `## [X.Y.Z]` heading,
    below the Unreleased section (CHANGELOG.md says how a release moves it)."""
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert headings[0] == "Unreleased", headings
    assert headings[1] == PYPROJECT["project"]["version"], headings


# -- built and installed ----------------------------------------------------------------


def source_files() -> list[str]:
    """The tree as it would be committed: tracked and new files, never ignored ones."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=30,
    )
    return [p for p in listed.stdout.decode().split("\0") if p and (ROOT / p).is_file()]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and wheel, built as a release is (`python -m build`: the sdist, then the
    wheel from it) from a copy of the tree."""
    base = tmp_path_factory.mktemp("release")
    source = base / "source"
    for name in source_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((ROOT / name).read_bytes())
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(base / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=BUILD_BOUND_S,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return base / "dist"


def the(dist: Path, pattern: str) -> Path:
    [found] = dist.glob(pattern)
    return found


VERSION = PYPROJECT["project"]["version"]


@pytest.mark.slow
def test_the_sdist_holds_the_package_schemas_docs_and_lock(dist: Path) -> None:
    with tarfile.open(the(dist, f"toolbus-{VERSION}.tar.gz")) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    expected = {
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
        "LICENSE",
        "MANIFEST.in",
        "worker/toolbus/py.typed",
        "worker/toolbus/cli/main.py",
        "docs/asyncapi.yaml",
        "config/toolbus.toml",
        "compose/requirements.lock",
    }
    expected |= {f"schemas/{p.name}" for p in (ROOT / "schemas").glob("*.json")}
    expected |= {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert expected <= names, sorted(expected - names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in names if n.startswith(("tests/", ".venv", "compose/secrets"))]


@pytest.mark.slow
def test_the_wheel_holds_the_package_and_its_command(dist: Path) -> None:
    with zipfile.ZipFile(the(dist, f"toolbus-{VERSION}-py3-none-any.whl")) as wheel:
        names = set(wheel.namelist())
        info = f"toolbus-{VERSION}.dist-info"
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
        metadata = wheel.read(f"{info}/METADATA").decode()
    assert {"toolbus/py.typed", "toolbus/__init__.py", "toolbus/cli/entry.py"} <= names
    assert "toolbus = toolbus.cli.entry:main" in entry_points
    assert f"Version: {VERSION}" in metadata
    # The licence the metadata declares travels with the code, its text included.
    assert "License-Expression: Apache-2.0" in metadata
    assert f"{info}/licenses/LICENSE" in names
    assert not [n for n in names if n.startswith(("tests/", "worker/")) or ".pyc" in n]


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding the wheel and what it depends on (as `pipx install
    toolbus-X.whl` makes one): its bin directory."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    wheel = the(dist, f"toolbus-{VERSION}-py3-none-any.whl")
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=INSTALL_BOUND_S,
        check=False,
        env=fresh_env(venv / "bin"),
    )
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    return venv / "bin"


def fresh_env(bin_dir: Path, **settings: str) -> dict[str, str]:
    """No PYTHONPATH (which would run this tree's code), no TOOLBUS_* of ours; the venv's
    bin first on PATH (the bundled config starts `toolbus demo-server` from it)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "VIRTUAL_ENV"} and not k.startswith(("TOOLBUS_", "OTEL_"))
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.update({f"TOOLBUS_{k.upper()}": v for k, v in settings.items()})
    return env


@pytest.mark.slow
def test_the_installed_wheel_runs_its_own_code_and_reports_its_version(installed: Path) -> None:
    env = fresh_env(installed)
    where = subprocess.run(
        [str(installed / "python"), "-c", "import toolbus; print(toolbus.__file__)"],
        capture_output=True,
        text=True,
        timeout=CLI_BOUND_S,
        check=True,
        env=env,
    )
    assert Path(where.stdout.strip()).is_relative_to(installed.parent), where.stdout
    shown = subprocess.run(
        [str(installed / "toolbus"), "--version"],
        capture_output=True,
        text=True,
        timeout=CLI_BOUND_S,
        check=False,
        env=env,
    )
    assert (shown.returncode, shown.stdout.strip()) == (0, f"toolbus {VERSION}"), shown


@pytest.mark.slow
def test_the_lock_pins_every_package_the_wheel_pulls_in(installed: Path) -> None:
    frozen = subprocess.run(
        [str(installed / "pip"), "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=CLI_BOUND_S,
        check=True,
        env=fresh_env(installed),
    )
    pulled = {canonicalize_name(p["name"]) for p in json.loads(frozen.stdout)}
    # pip itself (and setuptools where a venv seeds it) came with the venv, not the wheel.
    unlocked = pulled - set(locked()) - {"toolbus", "pip", "setuptools"}
    assert unlocked == set(), f"pulled in by the wheel, not in {LOCK.name}: {unlocked}"


@pytest.mark.slow
async def test_the_installed_wheel_serves_a_real_call(
    installed: Path, broker: Broker, tmp_path: Path
) -> None:
    prefix, worker_id = unique_prefix(), "released-w"
    env = fresh_env(installed, topic_prefix=prefix, worker_id=worker_id, broker_url=broker.url)
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        serve = await asyncio.create_subprocess_exec(
            str(installed / "toolbus"),
            "serve",
            "--config",
            str(BUNDLED_CONFIG),
            env=env,
            stdout=sink,
            stderr=sink,
        )
    try:
        async with Caller(broker.url) as watcher:
            await watcher.subscribe(f"{prefix}/status/workers/{worker_id}")
            status: dict[str, object] = {}
            try:
                async with asyncio.timeout(CLI_BOUND_S):
                    while status.get("state") != "online":
                        status = json.loads((await watcher.next_message()).payload or b"{}")
            except TimeoutError:
                pytest.fail(f"no `online` status; the worker said: {log.read_text()[-3000:]}")
        assert status["version"] == VERSION, status
        code, out, err = await run_bounded(
            str(installed / "toolbus"),
            "call",
            "echo",
            "text=released",
            "--broker",
            broker.url,
            env=env,
            bound_s=CLI_BOUND_S,
        )
        assert code == 0, (out, err, log.read_text()[-3000:])
        reply = json.loads(out)
        assert reply["ok"] is True and reply["result"]["structured"]["text"] == "released"
    finally:
        await stop_process(serve)
