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
from dataclasses import dataclass
from pathlib import Path

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


def kept_secret(path: Path) -> bytes:
    """The secret in `path`, made there (random, readable by this user only) if the file
    does not exist yet. Made under a temporary name and linked into place, so workers
    starting together (`--processes`, replicas sharing a volume) all read the one that
    won. Raises ValueError when it cannot be read or made, or is empty."""
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
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise ValueError(
            f"client_id_secret_file {path}: cannot read or make it ({exc.strerror})"
        ) from None
    if not secret:
        raise ValueError(f"client_id_secret_file {path}: empty")
    return secret
