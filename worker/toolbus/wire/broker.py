"""Broker address: where the broker is, who we are to it, and how its TLS is checked.

`BrokerUrl` is what every connection is made from (the worker's two, the client's,
the benchmark's). `Settings.broker` builds it from `broker_url` and the credential and
TLS settings; embedders build it with `BrokerUrl.from_url`. The password is a pydantic
`SecretStr` from the moment it is read: no message, log line or repr shows it, and the
errors here never echo any part of a URL (a mistyped URL may hold the password where
the port should be).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import SecretStr

PORTS = {"mqtt": 1883, "mqtts": 8883}


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    """`mqtt://[user[:pass]@]host[:port]`, or `mqtts://...` for TLS, with what TLS needs.

    Args:
        host, port: where the broker listens.
        tls: `mqtts://`: the broker's certificate is verified against `ca_file`
            (the system's CAs when None) and its host name.
        username, password: the MQTT credentials (a password needs a user name).
        ca_file: PEM file of the CA(s) that signed the broker's certificate.
        cert_file, key_file: PEM client certificate and its unencrypted key, for a
            broker that authenticates clients by certificate (the key may also sit in
            `cert_file`, then `key_file` is None).
    """

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: SecretStr | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if not self.tls and (self.ca_file or self.cert_file or self.key_file):
            raise ValueError(
                "tls_ca_file, tls_cert_file and tls_key_file need TLS: "
                "write the broker URL as mqtts://host:port"
            )
        if self.key_file and not self.cert_file:
            raise ValueError("tls_key_file needs tls_cert_file (the certificate it belongs to)")
        if self.password is not None and not self.username:
            raise ValueError(
                "a broker password needs a user name: set broker_username "
                "or write it in the URL (mqtt://USER@host)"
            )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        username: str | None = None,
        password: SecretStr | str | None = None,
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
    ) -> Self:
        """Parse `url`; credentials given here and in the URL at once are refused."""
        try:
            parts = urlsplit(url)
        except ValueError:  # an unbalanced IPv6 bracket
            raise ValueError("broker URL does not parse") from None
        try:
            port = parts.port
        except ValueError:  # a non-numeric or out-of-range port
            raise ValueError("broker URL has a bad port (a number 1-65535)") from None
        if parts.scheme not in PORTS:
            raise ValueError("broker URL must start with mqtt:// or mqtts://")
        if not parts.hostname:
            raise ValueError("broker URL has no host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(
                "broker URL has a path, query or fragment; "
                "a / ? or # in the password must be percent-encoded"
            )
        if parts.username and username is not None:
            raise ValueError("the broker user name is given twice: in the URL and broker_username")
        if parts.password and password is not None:
            raise ValueError("the broker password is given twice: in the URL and broker_password")
        if isinstance(password, str):
            password = SecretStr(password)
        if parts.password:
            password = SecretStr(unquote(parts.password))
        return cls(
            host=parts.hostname,
            port=port or PORTS[parts.scheme],
            tls=parts.scheme == "mqtts",
            username=unquote(parts.username) if parts.username else username,
            password=password,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )

    def __str__(self) -> str:
        # Never the password: this string goes to logs and error messages.
        user = ""
        if self.username:
            user = f"{self.username}:***@" if self.password else f"{self.username}@"
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}{self.host}:{self.port}"

    __repr__ = __str__


def broker_urls(value: str | list[str]) -> list[str]:
    """The brokers `broker_url` names: one URL, a list (TOML, JSON), or URLs separated by
    commas (the environment, the command line), in the order they are tried."""
    parts = value if isinstance(value, list) else value.split(",")
    urls = [str(part).strip() for part in parts if str(part).strip()]
    if not urls:
        raise ValueError("broker_url names no broker")
    return urls


def split_password(url: str) -> tuple[str, SecretStr | None]:
    """`url` without the password in its user info, and that password.

    A URL that does not parse comes back whole: `BrokerUrl.from_url` says what is wrong
    with it, without echoing it.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url, None
    if password is None:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{hostport}")), SecretStr(unquote(password))


def gather_password(settings: dict[str, Any]) -> dict[str, Any]:
    """Raw settings with the password, from the URL or `broker_password_file`, moved
    into `broker_password`: the settings hold it in one field, as a `SecretStr`.

    Given in two places it is refused: one would silently lose, and the broker's
    refusal would then be a puzzle.
    """
    settings = dict(settings)
    url = settings.get("broker_url")
    if isinstance(url, list) or (isinstance(url, str) and "," in url):
        urls = broker_urls(url)  # several nodes: one password for all, never in a URL
        if any(split_password(each)[1] is not None for each in urls):
            raise ValueError("with several brokers, give the password as broker_password")
        url = settings["broker_url"] = ",".join(urls)
    stripped, in_url = split_password(url) if isinstance(url, str) else (url, None)
    given = [
        name
        for name, present in (
            ("the broker URL", in_url is not None),
            ("broker_password", settings.get("broker_password") is not None),
            ("broker_password_file", settings.get("broker_password_file") is not None),
        )
        if present
    ]
    if len(given) > 1:
        raise ValueError(f"the broker password is given twice: {' and '.join(given)}")
    if in_url is not None:
        settings["broker_url"], settings["broker_password"] = stripped, in_url
    if (path := settings.pop("broker_password_file", None)) is not None:
        settings["broker_password"] = read_password_file(Path(path))
    return settings


def read_password_file(path: Path) -> SecretStr:
    """The password in `path` (a docker or Kubernetes secret), trailing newline stripped.

    Errors name the file and never show what it holds.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"broker_password_file {path}: cannot read it ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ValueError(f"broker_password_file {path}: not UTF-8 text") from None
    if not text:
        raise ValueError(f"broker_password_file {path}: empty")
    return SecretStr(text)
