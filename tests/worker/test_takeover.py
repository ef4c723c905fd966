"""Client-id takeover (issue 24.1): a client that connects with a worker's client id.

The worker's `worker_id` is public (its retained status topic names it); its MQTT client
ids are not (`client_ids`). A caller connecting with the public id takes nothing over;
a client that has the real one (here: the test, from the worker object) kicks the worker
off once, which is logged (ERROR `session taken over`), counted, and survived: the worker
reconnects after a backoff and answers the requests queued in its session meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import stat
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiomqtt
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from paho.mqtt.client import DisconnectFlags
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from tests.support.harness import (
    Broker,
    make_settings,
    measured,
    metric_points,
    mosquitto_binary,
    running_worker,
)
from tests.support.logwait import watching
from tests.support.mqtt import Caller
from tests.support.processes import run_bounded, serve_env
from toolbus.config import BrokerUrl
from toolbus.observability.metrics import Metrics
from toolbus.transport import SESSION_TAKEN_OVER
from toolbus.transport.reasons import disconnect_reason
from toolbus.worker.client_ids import KeptSecret, client_ids, kept_secret
from toolbus.worker.exit_codes import EXIT_USAGE
from toolbus.worker.links import Takeovers
from toolbus.worker.wiring import build_worker

TAKEN_OVER = "toolbus.session_taken_over"
GIVEN = "a-client-id-secret-given"  # client_id_secret: 16 bytes at least
ATTACKS, CALLS = 12, 300
WAIT_S = 30.0


@asynccontextmanager
async def connected_as(
    broker: Broker, client_id: str, *, keep_session: bool = False
) -> AsyncIterator[aiomqtt.Client]:
    """A client on `client_id`: Clean Start (the attack that discards a session), or
    resuming the session and keeping it after it leaves (`keep_session`)."""
    url = BrokerUrl.from_url(broker.url)
    props = Properties(PacketTypes.CONNECT)
    if keep_session:
        props.SessionExpiryInterval = 3600
    async with aiomqtt.Client(
        url.host,
        url.port,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=not keep_session,
        properties=props,
    ) as client:
        yield client


def taken_over_count(reader: InMemoryMetricReader) -> dict[str, float]:
    return {
        str(point.attributes["connection"]): point.value
        for point in metric_points(reader, TAKEN_OVER)
    }


def counting() -> tuple[InMemoryMetricReader, MeterProvider]:
    reader = InMemoryMetricReader()
    return reader, MeterProvider(metric_readers=[reader])


async def test_the_worker_id_its_status_shows_takes_nothing_over(broker: Broker) -> None:
    """The attack as the audit ran it, on the default setup (an anonymous broker, a
    configured worker_id): read the worker id from the retained status and connect with
    it, and with it + `-replies`, Clean Start. Before, that kicked the worker off and
    discarded its session; now the worker keeps its connection and answers at once."""
    reader, provider = counting()
    settings = make_settings(broker, worker_id=f"w-{uuid.uuid4().hex[:8]}")
    async with (
        running_worker(settings, meter=provider.get_meter("test")) as worker,
        Caller(broker.url) as caller,
    ):
        topics = worker.topics
        await caller.subscribe(topics.status(worker.worker_id))
        status = await caller.next_message()
        shown = json.loads(status.payload)["worker_id"]
        # No status carries the client ids (they are what a takeover needs).
        assert worker.client_ids.requests.encode() not in status.payload
        before = worker._conn
        assert before is not None
        with watching("toolbus.service", level=logging.WARNING) as trouble:
            answered = 0
            for attack in range(ATTACKS):  # as the audit: 12 connects among 300 calls
                client_id = shown if attack % 2 == 0 else f"{shown}-replies"
                calls = asyncio.gather(
                    *(
                        caller.call_tool(topics, "echo", {"text": f"{attack}.{i}"}, wait_s=10)
                        for i in range(CALLS // ATTACKS)
                    ),
                    return_exceptions=True,
                )
                async with connected_as(broker, client_id):
                    pass
                answered += sum(isinstance(r, dict) and r["ok"] is True for r in await calls)
        measured(
            f"takeover: {ATTACKS} connects as the status's worker id: {answered}/{CALLS} answered"
        )
        assert answered == CALLS
        assert worker._conn is before
        assert before.connected
        assert trouble.records == []
        assert taken_over_count(reader) == {}


def says_taken_over() -> bool:
    """Does this mosquitto tell the client it drops for another with its id (DISCONNECT
    0x8E)? From 2.0.15 on (src/handle_connect.c); 2.0.11, Debian 12's, only closes the
    socket, so the worker sees a connection lost like any other."""
    shown = subprocess.run(
        [mosquitto_binary(), "-h"], capture_output=True, text=True, check=False
    ).stdout
    found = re.search(r"mosquitto version (\d+)\.(\d+)\.(\d+)", shown)
    assert found is not None, shown
    return tuple(int(n) for n in found.groups()) >= (2, 0, 15)


async def test_a_takeover_with_the_real_id_is_survived_and_said(broker: Broker) -> None:
    """Whoever has the real id (a leaked secret, a replica started twice) still kicks
    the worker off. The worker says so (a broker that sends 0x8E: one ERROR line
    `session taken over` and a count; mosquitto 2.0.11: the WARNING of any lost
    connection), reconnects after its backoff without Clean Start, and answers the
    requests published while it was away, which waited in its session."""
    reader, provider = counting()
    settings = make_settings(
        broker, worker_id=f"w-{uuid.uuid4().hex[:8]}", client_id_secret="not-the-worker-id"
    )
    with (
        watching("toolbus.service", level=logging.WARNING) as lost,
        watching("toolbus", level=logging.INFO) as told,
        watching("mqtt", level=logging.INFO) as paho_told,
    ):
        async with (
            running_worker(settings, meter=provider.get_meter("test")) as worker,
            Caller(broker.url) as caller,
        ):
            assert worker.client_ids.persistent
            secret_ids = worker.client_ids
            async with connected_as(broker, worker.client_ids.requests, keep_session=True):
                async with asyncio.timeout(WAIT_S):
                    await lost.seen.wait()
            # The worker waits out its backoff: these wait in its session meanwhile.
            calls = [
                caller.call_tool(worker.topics, "echo", {"text": f"queued {i}"}, wait_s=WAIT_S)
                for i in range(5)
            ]
            replies = await asyncio.gather(*calls)
            assert [r["result"]["structured"]["text"] for r in replies] == [
                f"queued {i}" for i in range(5)
            ]
            assert worker.broker_state == "subscribed"
    [said] = [r for r in lost.records if r.levelno >= logging.WARNING]
    # No line at INFO or above names the ids, not even the takeover's (paho's DEBUG does).
    lines = [json.dumps(vars(r), default=str) for r in (*told.records, *paho_told.records)]
    assert lines and not [line for line in lines if secret_ids.requests in line]
    assert said.retry_in_s > 0  # type: ignore[attr-defined]
    if says_taken_over():
        assert (said.levelno, said.getMessage()) == (logging.ERROR, "session taken over")
        assert said.connection == "requests"  # type: ignore[attr-defined]
        assert taken_over_count(reader) == {"requests": 1}
    else:
        assert said.levelno == logging.WARNING
        assert taken_over_count(reader) == {}


def test_the_reason_paho_reports_for_a_takeover_is_read() -> None:
    """paho's own `on_disconnect` arguments (callback API 2) for a DISCONNECT packet
    with 0x8E, and for a socket that closed: only the first is a takeover."""
    packet = DisconnectFlags(is_disconnect_packet_from_server=True)
    socket_closed = DisconnectFlags(is_disconnect_packet_from_server=False)
    taken = ReasonCode(PacketTypes.DISCONNECT, identifier=SESSION_TAKEN_OVER)
    props = Properties(PacketTypes.DISCONNECT)
    assert disconnect_reason(None, packet, taken, props) == SESSION_TAKEN_OVER
    unspecified = ReasonCode(PacketTypes.DISCONNECT, identifier=0x80)
    assert disconnect_reason(None, socket_closed, unspecified, props) is None
    assert disconnect_reason(None, socket_closed, taken, props) is None


async def test_a_broker_without_a_secret_gives_clean_sessions_on_random_ids(
    broker: Broker,
) -> None:
    """Without client_id_secret or a broker password the ids are random per process: a
    session left by a restart would keep its share of the requests, so there is none."""
    settings = make_settings(broker, worker_id="w-fixed")
    one, two = build_worker(settings, []), build_worker(settings, [])
    assert not one.client_ids.persistent
    assert one.client_ids.requests != two.client_ids.requests
    assert one._links.session_expiry_s == 0


def test_client_ids_are_stable_under_one_secret_and_hidden() -> None:
    a, again = client_ids("w-1", b"secret"), client_ids("w-1", b"secret")
    assert a == again and a.persistent
    assert a.requests.startswith("w-1-") and a.requests != "w-1"
    assert a.replies == f"{a.requests}-replies"
    assert client_ids("w-1", b"other").requests != a.requests
    assert client_ids("w-2", b"secret").requests != a.requests.replace("w-1", "w-2")
    assert a.requests not in repr(a)


def test_takeovers_in_a_row_wait_longer_up_to_the_cap() -> None:
    takeovers = Takeovers(4.0, Metrics(), "w")
    waits = []
    for _ in range(5):
        takeovers.connected()
        waits.append(takeovers.taken_over())
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_a_secret_file_is_made_once_readable_by_its_owner_alone(tmp_path: Path) -> None:
    """No secret handed out, no broker password: the worker makes one at the first start
    and keeps it, so its ids, and with them its broker session, survive a restart."""
    path = tmp_path / "state" / "client-id-secret"
    first = kept_secret(path).secret
    assert len(first) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert kept_secret(path) == KeptSecret(first)  # and nothing to warn about
    assert client_ids("w-1", kept_secret(path).secret) == client_ids("w-1", first)
    assert sorted(p.name for p in path.parent.iterdir()) == ["client-id-secret"]


def test_workers_starting_together_keep_one_secret(tmp_path: Path) -> None:
    """`--processes N` children and replicas on one volume race to make the file: every
    one of them reads the secret that won, and no draft is left behind."""
    path = tmp_path / "client-id-secret"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        secrets = set(pool.map(lambda _: kept_secret(path).secret, range(32)))
    assert secrets == {path.read_bytes().strip()}
    assert [p.name for p in tmp_path.iterdir()] == ["client-id-secret"]


def test_the_secret_file_keys_the_ids_before_the_broker_password(
    broker: Broker, tmp_path: Path
) -> None:
    path = tmp_path / "secret"
    kept = kept_secret(path).secret  # read by the entry point, handed to the worker
    settings = make_settings(broker, worker_id="w-file", client_id_secret_file=path)
    one, two = (build_worker(settings, [], kept_secret=kept) for _ in range(2))
    assert one.client_ids.persistent and one.client_ids == two.client_ids
    assert one.client_ids == client_ids("w-file", path.read_bytes().strip())
    assert one._links.session_expiry_s > 0
    given = make_settings(
        broker, worker_id="w-file", client_id_secret=GIVEN, **{"client_id_secret_file": path}
    )
    built = build_worker(given, [], kept_secret=kept)
    assert built.client_ids == client_ids("w-file", GIVEN.encode())


@pytest.mark.parametrize("problem", ["empty", "not_a_folder"])
async def test_a_secret_file_that_cannot_be_used_stops_serve_in_one_line(
    broker: Broker, tmp_path: Path, problem: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    path = blocker / "secret" if problem == "not_a_folder" else tmp_path / "empty"
    if problem == "empty":
        path.write_text("\n")
    env = serve_env(broker_url=broker.url, worker_id="w-bad", client_id_secret_file=str(path))
    code, _, err = await run_bounded(sys.executable, "-m", "toolbus", "serve", env=env, bound_s=60)
    lines = [line for line in err.splitlines() if "client_id_secret_file" in line]
    assert code == EXIT_USAGE and len(lines) == 1, err
    assert "Traceback" not in err
