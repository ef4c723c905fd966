"""Kept (calls/kept.py): a caller's flood of kept ends and origins costs that caller only;
what expires gives its bytes back."""

from __future__ import annotations

import time

from toolbus.calls.kept import ENTRY_OVERHEAD, Kept

LIMIT = 64 << 10


def test_one_accounts_flood_gives_way_to_itself_never_to_another() -> None:
    kept = Kept(60.0, LIMIT)
    assert kept.put("alice-1", "a" * 1000, "alice")
    for n in range(1000):  # mallory's flood, each entry 8 KiB
        assert kept.put(f"m-{n}", "m" * 8192, "mallory")
    assert kept.get("alice-1") == "a" * 1000
    assert kept.held_bytes("mallory") <= LIMIT
    assert kept.get("m-999") is not None and kept.get("m-0") is None  # its own oldest went


def test_anonymous_clients_share_one_account() -> None:
    """Rounds charges every anonymous client to "" (a reply topic is free to make)."""
    kept = Kept(60.0, LIMIT)
    for n in range(1000):
        kept.put(f"origin-{n}", "t" * 1024, "")
    assert kept.held_bytes("") <= LIMIT and len(kept) < 1000


def test_an_entry_larger_than_the_account_is_refused_and_displaces_nothing() -> None:
    kept = Kept(60.0, LIMIT)
    assert kept.put("small", "s", "bob")
    assert not kept.put("huge", "h" * LIMIT, "bob")
    assert kept.get("small") == "s" and kept.get("huge") is None


def test_entries_expire_and_their_bytes_are_returned() -> None:
    kept = Kept(0.05, LIMIT)
    kept.put("k", "v", "carol")
    assert kept.held_bytes("carol") == len("k") + len("v") + ENTRY_OVERHEAD
    deadline = time.monotonic() + 5
    while kept.get("k") is not None:  # polled, bounded: what is tested is the clock
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert kept.held_bytes("carol") == 0 and len(kept) == 0
