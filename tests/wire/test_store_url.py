"""The shared store's URL (`dedup_store`) taken apart and checked where the settings are
read: one server, a Sentinel-watched primary, a Redis Cluster. A URL that does not parse
is refused with a fixed text that never quotes it (it may hold a password)."""

from __future__ import annotations

import pytest

from toolbus.config import ConfigError, load_settings
from toolbus.wire.store_url import StoreUrlError, check, key_prefix, where


@pytest.mark.parametrize(
    ("url", "hosts", "path", "shown"),
    [
        ("redis://:pw@h:7000/2", (("h", 7000),), ("2",), "redis://h:7000/2"),
        ("redis://h", (("h", 6379),), (), "redis://h:6379"),
        (
            "redis+sentinel://u:p%40ss@s1:26380,s2/mymaster/1",
            (("s1", 26380), ("s2", 26379)),
            ("mymaster", "1"),
            "redis+sentinel://s1:26380,s2:26379/mymaster/1",
        ),
        (
            "redis+cluster://[::1]:7000,[::1]:7001",
            (("::1", 7000), ("::1", 7001)),
            (),
            "redis+cluster://[::1]:7000,[::1]:7001",
        ),
    ],
)
def test_a_store_url_is_taken_apart_and_shown_without_its_credentials(
    url: str, hosts: tuple[tuple[str, int], ...], path: tuple[str, ...], shown: str
) -> None:
    taken = where(check(url))
    assert (taken.hosts, taken.path, taken.shown) == (hosts, path, shown)
    assert "pw" not in taken.shown and "p@ss" not in taken.shown


def test_the_credentials_are_percent_decoded() -> None:
    taken = where("redis+sentinel://us%3Aer:p%40s%2Fs@s1:26379/m")
    assert (taken.username, taken.password) == ("us:er", "p@s/s")


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://:hunter2?x@h1:7000",  # a ? in the password, not encoded
        "redis+cluster://:hunter2#x@h1:7000",
        "redis+sentinel://:hunter2@s1:99999/m",  # a port past 65535
        "redis+sentinel://:hunter2@s1:26379",  # no service
        "redis+sentinel://:hunter2@s1:26379/m/notadb",
        "redis+cluster://:hunter2@h1:7000/0",  # a cluster has no database to name
        "redis+cluster://:hunter2@h1:7000?ssl=true",  # options a cluster would drop
        "redis://:hunter2@h1:1,h2:2/0",  # one server, two hosts
        "redis://:hunter2@h:port/0",
        "memcached://:hunter2@h:1",
    ],
)
def test_a_bad_store_url_is_refused_without_quoting_it(url: str) -> None:
    with pytest.raises(StoreUrlError) as refused:
        check(url)
    assert "hunter2" not in str(refused.value)


def test_the_settings_refuse_a_bad_store_url_without_its_password() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(None, None, dedup_store="redis+cluster://:hunter2?x@h1:7000")
    assert "dedup_store" in str(refused.value) and "hunter2" not in str(refused.value)


def test_on_a_cluster_every_key_shares_the_prefix_s_hash_tag() -> None:
    assert key_prefix("redis+cluster://h:7000", "toolbus") == "{toolbus}"
    assert key_prefix("redis+sentinel://h:1/m", "toolbus") == "toolbus"
