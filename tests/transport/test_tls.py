"""TLS for real: mosquitto TLS listeners with a CA and certificates the tests make.

The worker (both of its connections), the client library and `toolbus call` reach a
TLS-only broker with `tls_ca_file`; a broker that requires client certificates admits
them with `tls_cert_file`/`tls_key_file` and not without; a broker whose certificate
another CA signed is refused at once, with a one-line error from `toolbus serve`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from tests.cli.test_cli import run_cli
from tests.support.certs import ListenerTls, Pem, TestCa
from tests.support.harness import Broker, make_settings, running_worker
from tests.support.processes import Serve, serve_env
from toolbus.client.client import Client
from toolbus.config import Settings
from toolbus.transport import BrokerRefused, MqttConnection, TransportError
from toolbus.transport.tls import tls_context
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.messages import Outbound
from toolbus.worker.exit_codes import EXIT_BROKER, EXIT_OK

CONNECT_BOUND_S = 3.0  # a connect refused at the handshake fails well within this
NO_CONNACK_S = 1.5  # how long a connect waits for a broker that closed it after TLS


@dataclasses.dataclass(frozen=True)
class Pki:
    ca: TestCa
    other_ca: TestCa  # signed nothing the brokers show
    worker: Pem  # a client certificate from `ca`
    stranger: Pem  # a client certificate from `other_ca`


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca, other = TestCa(directory), TestCa(directory, "other CA")
    return Pki(ca, other, ca.client("worker"), other.client("stranger"))


@contextmanager
def _broker(directory: Path, tls: ListenerTls) -> Iterator[Broker]:
    broker = Broker(directory, tls=tls)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def tls_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """TLS only; any client that trusts our CA may connect."""
    tls = ListenerTls(pki.ca.cert, pki.ca.server())
    with _broker(tmp_path_factory.mktemp("mosquitto-tls"), tls) as broker:
        yield broker


@pytest.fixture(scope="module")
def mtls_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """TLS only, and a client certificate signed by our CA is required."""
    tls = ListenerTls(pki.ca.cert, pki.ca.server(), require_certificate=True)
    with _broker(tmp_path_factory.mktemp("mosquitto-mtls"), tls) as broker:
        yield broker


async def echo_through(settings: Settings, broker: BrokerUrl) -> dict[str, Any]:
    """A worker with `settings` answers `echo` to a client connecting with `broker`."""
    async with (
        running_worker(settings) as worker,
        Client(broker, prefix=worker.topics.prefix) as client,
    ):
        reply = await client.call("echo", {"text": "over tls"}, timeout_s=10)
    assert reply.ok, reply
    assert reply.result is not None
    return reply.model_dump()


async def test_worker_and_client_answer_over_tls_with_the_ca(tls_broker: Broker, pki: Pki) -> None:
    settings = make_settings(tls_broker, tls_ca_file=pki.ca.cert)
    assert settings.broker.tls
    await echo_through(settings, settings.broker)


async def test_a_burst_over_tls_is_answered_in_full(tls_broker: Broker, pki: Pki) -> None:
    """More calls than slots: the request connection stops and resumes reading its TLS
    socket (bytes TLS already decoded must not wait for the next packet)."""
    calls, slots = 300, 4
    settings = make_settings(tls_broker, tls_ca_file=pki.ca.cert, concurrency=slots)
    async with (
        running_worker(settings) as worker,
        Client(settings.broker, prefix=worker.topics.prefix) as client,
    ):
        replies = await asyncio.gather(
            *(client.call("echo", {"text": str(n)}, timeout_s=30) for n in range(calls))
        )
    assert all(reply.ok for reply in replies)


async def test_a_held_tls_connection_pauses_and_loses_nothing(tls_broker: Broker, pki: Pki) -> None:
    """The bounded reader over TLS: it stops reading while `hold` messages wait, reads
    again as they are taken (TLS may hold decoded bytes the selector cannot see), and
    every message arrives once, in order."""
    count, hold, topic = 200, 8, f"t/{uuid.uuid4().hex}"
    broker = BrokerUrl.from_url(tls_broker.url, ca_file=pki.ca.cert)
    held = MqttConnection(broker, receive_maximum=1000, hold=hold, manual_ack=True)
    async with held, MqttConnection(broker) as sender:
        await held.subscribe([topic])
        await asyncio.gather(
            *(sender.publish(Outbound(topic=topic, payload=str(n).encode())) for n in range(count))
        )
        async with asyncio.timeout(30):
            await held.read_paused.wait()
            messages = held.messages()
            for n in range(count):
                message = await anext(messages)
                assert held.queued() <= hold
                assert int(message.payload) == n
                assert held.ack(message)
    assert held.read_pauses >= 1


async def test_client_certificate_admits_the_worker(mtls_broker: Broker, pki: Pki) -> None:
    settings = make_settings(
        mtls_broker,
        tls_ca_file=pki.ca.cert,
        tls_cert_file=pki.worker.cert,
        tls_key_file=pki.worker.key,
    )
    await echo_through(settings, settings.broker)


@pytest.mark.parametrize("certificate", ["none", "another CA's"])
async def test_without_a_client_certificate_of_the_ca_the_broker_refuses(
    mtls_broker: Broker, pki: Pki, certificate: str
) -> None:
    """TLS 1.3 lets the broker refuse after the handshake: the connect fails within its
    own bound rather than at the handshake (a `TransportError`, retried by a worker)."""
    cert = {"none": None, "another CA's": pki.stranger}[certificate]
    broker = BrokerUrl.from_url(
        mtls_broker.url,
        ca_file=pki.ca.cert,
        cert_file=cert.cert if cert else None,
        key_file=cert.key if cert else None,
    )
    connection = MqttConnection(broker, timeout_s=NO_CONNACK_S)
    async with asyncio.timeout(NO_CONNACK_S * 3):
        with pytest.raises(TransportError):
            await connection.__aenter__()


async def test_a_broker_signed_by_another_ca_is_refused_at_once(
    tls_broker: Broker, pki: Pki
) -> None:
    """No retry loop for a certificate that fails verification: the worker's start and
    the client both raise `BrokerRefused`, without waiting out a timeout."""
    settings = make_settings(tls_broker, tls_ca_file=pki.other_ca.cert)
    async with asyncio.timeout(CONNECT_BOUND_S):
        with pytest.raises(BrokerRefused):
            async with running_worker(settings):
                pass
        with pytest.raises(BrokerRefused):
            async with Client(settings.broker, reply_prefix="x/"):
                pass


async def test_a_certificate_for_another_host_is_refused(
    pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Verification is never relaxed: our CA's certificate for another host name does not
    vouch for 127.0.0.1."""
    tls = ListenerTls(pki.ca.cert, pki.ca.server("elsewhere", hosts=["elsewhere.invalid"]))
    with _broker(tmp_path_factory.mktemp("mosquitto-elsewhere"), tls) as broker:
        connection = MqttConnection(
            BrokerUrl.from_url(broker.url, ca_file=pki.ca.cert), timeout_s=CONNECT_BOUND_S
        )
        async with asyncio.timeout(CONNECT_BOUND_S):
            with pytest.raises(BrokerRefused):
                await connection.__aenter__()


async def test_serve_with_the_wrong_ca_exits_with_one_line(tls_broker: Broker, pki: Pki) -> None:
    env = serve_env(broker_url=tls_broker.url, tls_ca_file=str(pki.other_ca.cert))
    async with Serve(env) as serve:
        assert await serve.exit_code() == EXIT_BROKER
    assert "Traceback" not in serve.output
    last = serve.stderr[-1]
    assert last.startswith("toolbus: cannot connect to the broker at mqtts://")
    assert "certificate verification failed" in last  # the message is the contract here


async def test_toolbus_call_over_tls(tls_broker: Broker, pki: Pki) -> None:
    """The CLI's own connection takes the same TLS settings (here from the environment)."""
    settings = make_settings(tls_broker, tls_ca_file=pki.ca.cert)
    env = serve_env(
        broker_url=tls_broker.url, tls_ca_file=str(pki.ca.cert), topic_prefix=settings.topic_prefix
    )
    async with running_worker(settings):
        code, out, err = await run_cli("call", "echo", "text=hi", env=env)
    assert code == EXIT_OK, err
    assert '"ok": true' in out


# -- TLS files the transport cannot use -------------------------------------------------


def _encrypted_copy(key: Path, directory: Path) -> Path:
    loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
    encrypted = directory / "encrypted.key"
    encrypted.write_bytes(
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    return encrypted


@pytest.mark.parametrize("case", ["missing CA", "CA not PEM", "key mismatch", "key encrypted"])
def test_unusable_tls_files_are_refused_naming_the_setting(
    case: str, pki: Pki, tmp_path: Path
) -> None:
    """Refused before connecting, never prompting for a passphrase (a service would hang)."""
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    broker = BrokerUrl.from_url("mqtts://127.0.0.1:1")
    broker = {
        "missing CA": dataclasses.replace(broker, ca_file=tmp_path / "absent.pem"),
        "CA not PEM": dataclasses.replace(broker, ca_file=not_pem),
        "key mismatch": dataclasses.replace(
            broker, cert_file=pki.worker.cert, key_file=pki.stranger.key
        ),
        "key encrypted": dataclasses.replace(
            broker, cert_file=pki.worker.cert, key_file=_encrypted_copy(pki.worker.key, tmp_path)
        ),
    }[case]
    with pytest.raises(BrokerRefused) as info:
        tls_context(broker)
    setting = "tls_ca_file" if "CA" in case else "tls_key_file"
    assert setting in str(info.value)


def test_plain_mqtt_has_no_tls_context() -> None:
    assert tls_context(BrokerUrl.from_url("mqtt://127.0.0.1:1")) is None
