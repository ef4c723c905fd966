"""Test certificates: a CA of our own, a broker certificate and client certificates it signs.

Made with the `cryptography` package (no `openssl` binary), written as PEM files under a
pytest temporary directory, valid for a day. The broker's certificate names `localhost`
and 127.0.0.1, so `mqtts://127.0.0.1:PORT` verifies its host name for real.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK = ("localhost", "127.0.0.1")
VALID = datetime.timedelta(days=1)
SKEW = datetime.timedelta(minutes=5)  # valid a little before now: clocks differ


@dataclass(frozen=True)
class Pem:
    """A certificate and its key, as files."""

    cert: Path
    key: Path


class TestCa:
    """A certificate authority that signs the broker's and the clients' certificates."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, directory: Path, name: str = "toolbus test CA") -> None:
        self.directory = directory
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(name)
        now = _now()
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - SKEW)
            .not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = directory / f"{_slug(name)}.pem"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def server(self, name: str = "broker", hosts: Sequence[str] = LOOPBACK) -> Pem:
        """A broker certificate for `hosts` (names or IP addresses)."""
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        return self._issue(name, ExtendedKeyUsageOID.SERVER_AUTH, names)

    def client(self, name: str = "worker") -> Pem:
        """A client certificate whose common name is `name`."""
        return self._issue(name, ExtendedKeyUsageOID.CLIENT_AUTH, [])

    def _issue(self, name: str, usage: x509.ObjectIdentifier, names: list[x509.GeneralName]) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - SKEW)
            .not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pem = Pem(
            self.directory / f"{_slug(self.name)}-{name}.pem",
            self.directory / f"{_slug(self.name)}-{name}.key",
        )
        pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return pem


@dataclass(frozen=True)
class ListenerTls:
    """What a mosquitto TLS listener is given: our CA, its certificate, and whether
    clients must show a certificate signed by the CA."""

    ca: Path
    server: Pem
    require_certificate: bool = False

    def config(self) -> str:
        return (
            f"cafile {self.ca}\n"
            f"certfile {self.server.cert}\n"
            f"keyfile {self.server.key}\n"
            f"require_certificate {'true' if self.require_certificate else 'false'}\n"
        )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _slug(name: str) -> str:
    return name.replace(" ", "-")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
