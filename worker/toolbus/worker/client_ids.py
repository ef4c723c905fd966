"""Client ids: the MQTT client ids a worker connects with, which no caller can derive.

A broker lets one connection per client id: whoever connects with a worker's id next
takes its place (MQTT v5 DISCONNECT 0x8E, "session taken over"), and with Clean Start
discards the worker's session and every request queued in it. The `worker_id` is public
(it names the retained status topic), so the ids are `{worker_id}-{token}` and
`{worker_id}-{token}-replies`, the token an HMAC of the worker id under a secret:

- `client_id_secret` when configured, else the one kept in `client_id_secret_file`
  (made at the first start: the container image keeps it in a volume), else the broker
  password the worker logs in with (who knows it can log in as the worker anyway): the
  same ids at every start, so a restarted worker resumes its persistent session and the
  requests held in it;
- neither (an anonymous broker): a random secret made at start. The ids then last only
  as long as the process, and so does its session: a session left behind by a restart
  would keep its share of the shared subscription's requests, unanswered, until it
  expired. `persistent` is False and the worker uses clean sessions.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from toolbus.config.settings import MIN_CLIENT_ID_SECRET_BYTES

TOKEN_CHARS = 20  # 80 bits of an HMAC-SHA256: no guessing at connect speed
REPLIES_ID_SUFFIX = "-replies"
_CONTEXT = b"toolbus client id\0"  # this HMAC's purpose, so the key serves no other


@dataclass(frozen=True, slots=True)
class ClientIds:
    """The request connection's id (its session), the reply connection's, and whether
    they are the same at every start (a secret was configured)."""

    requests: str
    replies: str
    persistent: bool

    def __repr__(self) -> str:  # never shown whole: the token is the secret part
        return f"ClientIds(requests=..., replies=..., persistent={self.persistent})"


def client_ids(worker_id: str, secret: bytes | None) -> ClientIds:
    """The ids of `worker_id` under `secret` (None: a random one, for this process)."""
    key = secret if secret else secrets.token_bytes(32)
    token = hmac.new(key, _CONTEXT + worker_id.encode(), hashlib.sha256).hexdigest()
    requests = f"{worker_id}-{token[:TOKEN_CHARS]}"
    return ClientIds(requests, f"{requests}{REPLIES_ID_SUFFIX}", persistent=bool(secret))


@dataclass(frozen=True, slots=True)
class KeptSecret:
    """What `client_id_secret_file` holds, and why others may know it too (`concerns`,
    each one warning: a file its owner is not alone to read still keys the ids)."""

    secret: bytes
    concerns: tuple[str, ...] = ()

    def __repr__(self) -> str:  # never shown: it keys the client ids
        return f"KeptSecret(secret=..., concerns={self.concerns!r})"


def kept_secret(path: Path) -> KeptSecret:
    """The secret in `path`, made there (random, readable by this user only) if the file
    does not exist yet. Made under a temporary name and linked into place, so workers
    starting together (`--processes`, replicas sharing a volume) all read the one that
    won, and never written through a symlink (the link fails on any name that exists).

    Refused (ValueError): a file that cannot be read or made, one that is not a regular
    file (a FIFO would hang the start), one others may write (they would choose the
    secret, and with it the ids), and a secret under `MIN_CLIENT_ID_SECRET_BYTES` (it
    can be guessed). Told as `concerns`: a symlink, a file readable by group or others,
    or owned by another user than this one or root. Those are how a Kubernetes secret
    volume (a symlink to a root-owned file, 0644 by default) and a compose secret (the
    host file, with its owner and mode) arrive, so they start the worker, with a warning.
    """
    try:
        if not path.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32) + "\n")
            try:
                os.link(draft, path)
            except FileExistsError:
                pass  # another worker's came first: read that one
            finally:
                with contextlib.suppress(OSError):
                    draft.unlink()
        linked = path.is_symlink()
        # Non-blocking: opening a FIFO for reading would wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as kept:
            st = os.fstat(kept.fileno())  # of the file read, not of a name for it
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"client_id_secret_file {path}: not a regular file")
            if st.st_mode & 0o022:
                raise ValueError(
                    f"client_id_secret_file {path}: writable by group or others (mode "
                    f"{stat.S_IMODE(st.st_mode):04o}), who would choose the client ids: "
                    "chmod go-w it"
                )
            secret = kept.read().strip()
    except OSError as exc:
        raise ValueError(
            f"client_id_secret_file {path}: cannot read or make it ({exc.strerror})"
        ) from None
    if len(secret) < MIN_CLIENT_ID_SECRET_BYTES:
        raise ValueError(
            f"client_id_secret_file {path}: {'empty' if not secret else 'too short'}: "
            f"at least {MIN_CLIENT_ID_SECRET_BYTES} bytes, or it can be guessed (delete it "
            "and the worker makes a random one)"
        )
    return KeptSecret(secret, _concerns(path, st, linked))


def _concerns(path: Path, st: os.stat_result, linked: bool) -> tuple[str, ...]:
    """Why someone besides this user may know the secret in `path` (`st`: the file read)."""
    found = []
    if linked:
        found.append(
            f"a symlink to {path.resolve()} (whoever may write its folder can re-point it)"
        )
    user = os.geteuid()
    if st.st_uid not in (user, 0):  # root reads every file anyway
        found.append(f"owned by uid {st.st_uid}, not this user (uid {user}) or root")
    if st.st_mode & 0o044:
        found.append(f"readable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
    if not found:
        return ()
    return (
        f"client_id_secret_file {path}: {'; '.join(found)}: whoever else can read it can "
        "connect with the worker's client ids and take its place (docs/security.md)",
    )
