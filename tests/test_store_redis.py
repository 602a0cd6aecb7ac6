"""The Redis store against real ``redis-server`` processes (see ``tests/servers.py``).

Conformance is :func:`rdzv.testing.check_store`; the tests below pin URLs, credentials,
TLS, unknown write outcomes, restarts with and without persistence, a blackholed
network, that values are never unpickled, and that no subscription outlives its wait
(nor a thread's subscriber connection its thread).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import store_cases as cases
from servers import Certs, RedisServer, ServerMissing, TcpProxy, find_binary, free_port

from rdzv import RendezvousParameters, StoreRendezvousBackend, create_handler
from rdzv.errors import RendezvousConnectionError
from rdzv.stores.redis import RedisStore
from rdzv.stores.url import StoreUrlError
from rdzv.testing import check_store

pytestmark = pytest.mark.slow


_opened = cases.OpenedStores()


@pytest.fixture(autouse=True)
def _close_opened() -> Iterator[None]:
    yield
    _opened.close_all()


def _fresh(url: str, **params: str) -> RedisStore:
    return _opened(RedisStore(cases.fresh_url(url, **params), timeout=timedelta(seconds=5)))


def _evalsha_calls(server: RedisServer) -> int:
    stats = server.command("INFO", "commandstats")
    entry = stats.get("cmdstat_evalsha", {"calls": 0})
    return int(entry["calls"])


def test_conformance_threads_and_processes(redis_server: RedisServer) -> None:
    check_store(
        lambda: _fresh(redis_server.url),
        url=redis_server.url,
        opener="rdzv.stores.redis:open_redis",
        increments=10,
        sets=True,
    )


def test_a_closed_store_refuses_calls(redis_server: RedisServer) -> None:
    cases.check_a_closed_store_refuses_calls(_fresh(redis_server.url))


def test_many_keys_in_one_call(redis_server: RedisServer) -> None:
    # The same calls as etcd's (which splits them into transactions): one script each.
    store = _fresh(redis_server.url)
    cases.check_many_keys_in_one_call(store)
    store.close()


def test_open_store_resolves_the_scheme(redis_server: RedisServer) -> None:
    cases.check_open_store_resolves_the_scheme(redis_server.url, RedisStore)
    assert redis_server.command("GET", "open:k") == b"v"


def test_a_missing_server_binary_is_an_error_naming_the_package() -> None:
    # The fixtures raise this (never skip) when redis-server or etcd is not installed.
    with pytest.raises(ServerMissing, match=r"apt-get install -y redis-server-xyz"):
        find_binary("no-such-server-binary-xyz", "redis-server-xyz")


def test_importing_rdzv_does_not_import_clients() -> None:
    code = (
        "import sys, rdzv, rdzv.stores, rdzv.stores.redis, rdzv.stores.etcd\n"
        "bad = sorted(m for m in ('redis', 'httpx') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://127.0.0.1:99999/0", "(?i)port out of range"),
        ("redis://127.0.0.1:6379/zero", "database number"),
        ("redis://127.0.0.1:6379/0?color=red", "unknown query parameter"),
        ("redis://127.0.0.1:6379/0?ca=/etc/hostname", "need the TLS scheme"),
        ("rediss://127.0.0.1:6379/0?ca=/no/such/ca.pem", "does not exist"),
        ("redis://127.0.0.1:6379/0?prefix=a:b", "prefix"),
        ("redis://127.0.0.1:6379/0?retries=-1", "retries"),
        ("redis://127.0.0.1:6379/0?socket_timeout=0", "socket_timeout"),
        ("redis:///0", "no host"),
    ],
)
def test_bad_urls_say_what_is_wrong(url: str, problem: str) -> None:
    with pytest.raises(StoreUrlError, match=problem):
        RedisStore(url)


def test_unreachable_server_names_endpoint_without_password() -> None:
    cases.check_unreachable_server_is_named(
        RedisStore,
        f"redis://admin:hunter2@127.0.0.1:{free_port()}/0?retries=1&connect_timeout=1",
        password="hunter2",
        shown="redis://admin:***@127.0.0.1",
        hint="check that redis-server runs",
    )


def test_requirepass(start_redis: Callable[..., RedisServer]) -> None:
    server = start_redis(password="s3cret-pw")
    store = _fresh(server.url)
    store.set("k", b"v")
    assert store.get("k") == b"v"
    store.close()
    base = f"127.0.0.1:{server.port}/0"
    for url in (f"redis://:wrong-pw@{base}", f"redis://{base}"):
        with pytest.raises(RendezvousConnectionError) as info:
            _fresh(url, retries="0")
        text = str(info.value)
        assert "wrong-pw" not in text and "s3cret-pw" not in text
        assert f"127.0.0.1:{server.port}/0" in text  # names the endpoint, password redacted
        assert "credentials" in text or "NOAUTH" in text or "Authentication" in text


def test_tls_with_client_certificate(start_redis: Callable[..., RedisServer], certs: Certs) -> None:
    server = start_redis(certs=certs)
    store = _fresh(server.url)
    store.set("k", b"over tls")
    assert store.get("k") == b"over tls"
    store.close()
    # The server demands a client certificate: without one the handshake fails.
    with pytest.raises(RendezvousConnectionError, match=re.escape("rediss://127.0.0.1")):
        _fresh(f"rediss://127.0.0.1:{server.port}/0?ca={certs.ca}", retries="0")
    # Plain text to a TLS port is refused, not hung.
    with pytest.raises(RendezvousConnectionError):
        _fresh(f"redis://127.0.0.1:{server.port}/0", retries="0", socket_timeout="2")


def test_lost_reply_of_compare_set_is_resolved_by_reading(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(redis_server.port)
    store = _fresh(f"redis://127.0.0.1:{proxy.port}/0")
    # The first compare_set loads the script; the second runs it once: its lost reply
    # is resolved by a GET, not by sending it again.
    cases.check_lost_reply_of_compare_set_is_read(
        store, proxy, b"EVALSHA", lambda: _evalsha_calls(redis_server)
    )
    # A lost reply of a CAS that did not apply (value differs) returns the current value.
    proxy.lose_reply_to(b"EVALSHA")
    assert store.compare_set("k", b"v1", b"v3") == b"v2"
    store.close()


def test_lost_reply_of_add_counts_once(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(redis_server.port)
    store = _fresh(f"redis://127.0.0.1:{proxy.port}/0")
    cases.check_lost_reply_of_add_counts_once(store, proxy, b"EVALSHA")
    store.close()


def test_restart_with_persistence_keeps_data(start_redis: Callable[..., RedisServer]) -> None:
    server = start_redis(persistent=True)
    store = _fresh(server.url)
    store.set("k", b"kept")
    assert store.compare_set("state", b"", b"s1") == b"s1"
    server.restart()  # SIGKILL, then start on the same port from the append-only file
    assert store.get("k") == b"kept"
    assert store.compare_set("state", b"s1", b"s2") == b"s2"
    store.close()


def test_restart_without_persistence_is_a_clear_error(
    start_redis: Callable[..., RedisServer],
) -> None:
    server = start_redis(persistent=False)
    store = _fresh(server.url)
    cases.check_lost_data_is_reported(
        store, server.restart, "lost this store's data", lambda: store.compare_set("k", b"", b"new")
    )
    store.close()


def test_blackholed_network_fails_in_bounded_time_then_recovers(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(redis_server.port)
    store = _fresh(f"redis://127.0.0.1:{proxy.port}/0", socket_timeout="0.3", retries="1")
    cases.check_blackhole_fails_then_recovers(store, proxy)
    store.close()


def test_values_are_bytes_never_unpickled(redis_server: RedisServer, tmp_path: Path) -> None:
    store = _fresh(redis_server.url)
    cases.check_values_are_never_unpickled(store, tmp_path)
    store.close()


def test_ttl_expires_abandoned_keys(redis_server: RedisServer) -> None:
    store = _fresh(redis_server.url, ttl="60")
    store.set("k", b"v")
    store.compare_set("c", b"", b"1")
    store.add("n", 1)
    for key in ("k", "c", "n"):
        ttl_ms = int(redis_server.command("PTTL", f"{store.prefix}:{key}"))
        assert 0 < ttl_ms <= 60_000, (key, ttl_ms)
    assert int(redis_server.command("PTTL", f"{store.prefix}#index")) > 0
    store.close()


@pytest.mark.parametrize(
    ("ttl", "config", "says"),
    [
        ("60", {"protocol": "scale"}, r"protocol 'scale' writes the rendezvous state only when"),
        ("10", {}, r"expire 10 s after .* keep_alive_max_attempt = 15 s.*at least 15 s"),
        ("2", {"keep_alive_interval": "1"}, r"expire 2 s after .*= 3 s"),
    ],
)
def test_a_ttl_the_state_could_expire_under_is_refused(
    redis_server: RedisServer, ttl: str, config: dict[str, str], says: str
) -> None:
    url = cases.fresh_url(redis_server.url, ttl=ttl)
    with pytest.raises(ValueError, match=says):
        create_handler(RendezvousParameters("rdzv", url, "job", 1, 1, **config))


def test_a_ttl_hardened_renews_is_taken(redis_server: RedisServer) -> None:
    # hardened rewrites the state at every heartbeat: ttl >= 3 x 1 s keeps it alive.
    url = cases.fresh_url(redis_server.url, ttl="3")
    assert StoreRendezvousBackend(_opened(RedisStore(url)), "job").state_expiry == 3.0
    plain = _opened(RedisStore(cases.fresh_url(redis_server.url)))
    assert StoreRendezvousBackend(plain, "job").state_expiry is None
    handler = create_handler(
        RendezvousParameters("rdzv", url, "job", 1, 1, keep_alive_interval="1")
    )
    try:
        # Given no protocol over keys that expire, the handler runs hardened, not the
        # default scale (which writes the state only when the membership changes).
        assert handler.variant.name == "hardened"
        assert handler.next_rendezvous().world_size == 1
    finally:
        assert handler.shutdown() is True


def test_missing_key_times_out_with_the_store_timeout(redis_server: RedisServer) -> None:
    store = _fresh(redis_server.url)
    cases.check_missing_key_times_out(store)
    store.close()


def test_databases_do_not_share_keys_or_wakeups(redis_server: RedisServer) -> None:
    prefix = f"t{uuid.uuid4().hex}"
    base = f"redis://127.0.0.1:{redis_server.port}"
    a = _opened(RedisStore(f"{base}/1?prefix={prefix}"))
    b = _opened(RedisStore(f"{base}/2?prefix={prefix}"))
    cases.check_stores_are_isolated(a, b)
    a.close()
    b.close()


# -- member sets (rdzv.store.SetStore) ------------------------------------------------------


def test_member_sets_live_outside_the_key_namespace(redis_server: RedisServer) -> None:
    store = _fresh(redis_server.url, ttl="60")
    assert store.add_member("round/1", b"node-b") == 1
    assert store.add_member("round/1", b"node-a") == 2
    # One Redis set per member set, beside (not inside) the plain keys and their index.
    raw = redis_server.command("SMEMBERS", f"{store.prefix}#set:round/1")
    assert sorted(raw) == [b"node-a", b"node-b"]
    assert int(redis_server.command("EXISTS", f"{store.prefix}:round/1")) == 0
    assert int(redis_server.command("SCARD", f"{store.prefix}#index")) == 0
    assert store.num_keys() == 0
    # The set expires like every key the store writes when ttl is given.
    assert 0 < int(redis_server.command("PTTL", f"{store.prefix}#set:round/1")) <= 60_000
    store.close()


def test_a_full_member_set_refuses_new_members(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bound is checked inside the Lua script; 3 stands in for the real 1,000,000.
    monkeypatch.setattr("rdzv.stores.redis.MAX_SET_MEMBERS", 3)
    store = _fresh(redis_server.url)
    assert [store.add_member("s", m) for m in (b"a", b"b", b"c")] == [1, 2, 3]
    with pytest.raises(ValueError, match=r"'s' in redis://.* already holds 3 members"):
        store.add_member("s", b"d")
    assert store.add_member("s", b"b") == 3  # a member already present is not refused
    assert store.members("s") == [b"a", b"b", b"c"]
    store.close()


def test_lost_reply_of_add_member_adds_once(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(redis_server.port)
    store = _fresh(f"redis://127.0.0.1:{proxy.port}/0")
    assert store.add_member("s", b"first") == 1  # loads the script
    proxy.lose_reply_to(b"lost-reply-member")
    # SADD is idempotent: the script is simply sent again after the lost reply.
    assert store.add_member("s", b"lost-reply-member") == 2
    assert proxy.replies_lost == 1
    assert store.members("s") == [b"first", b"lost-reply-member"]
    assert store.add_member("s", b"third") == 3
    store.close()


def test_remove_member_renews_the_ttl_and_an_emptied_set_is_gone(
    redis_server: RedisServer,
) -> None:
    store = _fresh(redis_server.url, ttl="60")
    raw = f"{store.prefix}#set:round/1"
    for member in (b"a", b"b", b"c"):
        store.add_member("round/1", member)
    # Shorten the expiry by hand: a remove_member that leaves members renews it to ttl.
    redis_server.command("PEXPIRE", raw, "5000")
    assert store.remove_member("round/1", b"a") == 2
    assert 5_000 < int(redis_server.command("PTTL", raw)) <= 60_000
    redis_server.command("PEXPIRE", raw, "5000")
    assert store.remove_member("round/1", b"zz") == 2  # a no-op still renews, like add_member
    assert 5_000 < int(redis_server.command("PTTL", raw)) <= 60_000
    # SREM of the last member deletes the Redis set: an emptied set is an absent one.
    assert store.remove_member("round/1", b"b") == 1
    assert store.remove_member("round/1", b"c") == 0
    assert int(redis_server.command("EXISTS", raw)) == 0
    assert store.members("round/1") == []
    assert store.add_member("round/1", b"a") == 1  # starts again, with the ttl
    assert 0 < int(redis_server.command("PTTL", raw)) <= 60_000
    assert store.num_keys() == 0
    store.close()


def test_remove_member_without_ttl_sets_no_expiry(redis_server: RedisServer) -> None:
    store = _fresh(redis_server.url)
    raw = f"{store.prefix}#set:s"
    store.add_member("s", b"a")
    store.add_member("s", b"b")
    assert store.remove_member("s", b"a") == 1
    assert int(redis_server.command("PTTL", raw)) == -1  # exists, no expiry
    store.close()


def test_lost_reply_of_remove_member_is_resent(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(redis_server.port)
    store = _fresh(f"redis://127.0.0.1:{proxy.port}/0")
    cases.check_lost_reply_of_remove_member_is_resent(store, proxy, b"lost-reply-member")
    store.close()


def test_remove_member_on_a_blackholed_network_fails_then_recovers(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(redis_server.port)
    store = _fresh(f"redis://127.0.0.1:{proxy.port}/0", socket_timeout="0.3", retries="1")
    cases.check_remove_member_on_a_blackholed_network(store, proxy)
    store.close()


def test_a_woken_reader_reads_each_change_once(redis_server: RedisServer) -> None:
    from test_stores import check_one_read_per_change

    url = cases.fresh_url(redis_server.url)  # one namespace for the reader and the writer
    check_one_read_per_change(
        lambda: RedisStore(url, timeout=timedelta(seconds=5)), f"once-{uuid.uuid4().hex}"
    )


# -- subscriptions end with their wait --------------------------------------------------------

CONDITION_WITHIN_S = 10.0
"""How long a test waits for the server to show what a store did (a loaded CI machine)."""
JOIN_WITHIN_S = 30.0
"""How long a test waits for a thread it started to finish."""


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CONDITION_WITHIN_S
    while not condition():  # bounded by CONDITION_WITHIN_S
        assert time.monotonic() < deadline, f"{what} did not happen within {CONDITION_WITHIN_S} s"
        time.sleep(0.01)


def _subscribers(server: RedisServer, store: RedisStore, key: str) -> int:
    """How many connections the server has subscribed to ``key``'s change channel."""
    reply = server.command("PUBSUB", "NUMSUB", f"__rdzv__:0:{store.prefix}:{key}")
    return int(reply[1])


def _unsubscribed_connections(server: RedisServer) -> int:
    """Connections whose last command was UNSUBSCRIBE: subscriber connections kept
    between waits."""
    clients = server.command("CLIENT", "LIST").decode().splitlines()
    return sum(" cmd=unsubscribe " in f" {line} " for line in clients)


def _join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(JOIN_WITHIN_S)
        assert not thread.is_alive(), f"{thread.name} did not finish"


def test_a_wait_leaves_no_subscription_behind(redis_server: RedisServer) -> None:
    # Redis queues every publication for a subscribed connection; one that stayed
    # subscribed after its wait (nobody reads it until the next wait) would hold every
    # later write's publication in server memory. So every wait ends its subscription
    # before it returns: woken by a change, by a creation, or at its deadline.
    store = _fresh(redis_server.url)
    store.set("state", b"v0")
    results: list[object] = []
    waiters = [
        threading.Thread(
            target=lambda: results.append(
                store.wait_for_change("state", b"v0", timedelta(seconds=30))
            ),
            name="wait_for_change",
        ),
        threading.Thread(target=lambda: results.append(store.get("late")), name="get"),
    ]
    for waiter in waiters:
        waiter.start()
    try:
        _until(
            lambda: (
                _subscribers(redis_server, store, "state") == 1
                and _subscribers(redis_server, store, "late") == 1
            ),
            "both waiters subscribing",
        )
    finally:
        store.set("state", b"v1")
        store.set("late", b"here")
        _join(waiters)
    assert sorted(map(repr, results)) == sorted([repr(True), repr(b"here")])
    # The wait read the server's confirmation before returning: nothing is subscribed.
    assert _subscribers(redis_server, store, "state") == 0
    assert _subscribers(redis_server, store, "late") == 0
    # A wait that runs out of time (a 50 ms store wait) ends its subscription too.
    assert store.wait_for_change("state", b"v1", timedelta(milliseconds=50)) is False
    assert _subscribers(redis_server, store, "state") == 0
    store.close()


def test_the_subscriber_connection_of_an_ended_thread_is_closed(
    start_redis: Callable[..., RedisServer],
) -> None:
    server = start_redis()  # private: the test counts the server's connections
    store = _fresh(server.url)
    store.set("k", b"v0")
    waiters = [
        threading.Thread(
            target=store.wait_for_change, args=("k", b"v0", timedelta(seconds=30)), name=f"w{i}"
        )
        for i in range(5)
    ]
    for waiter in waiters:
        waiter.start()
    try:
        _until(lambda: _subscribers(server, store, "k") == 5, "five waiters subscribing")
    finally:
        store.set("k", b"v1")
        _join(waiters)
    assert _subscribers(server, store, "k") == 0
    # Each ended thread's connection is still open, unsubscribed...
    assert _unsubscribed_connections(server) == 5
    # ... until the next wait (here, this thread's first), which closes them and keeps
    # only its own, for this thread's next wait.
    assert store.wait_for_change("k", b"v1", timedelta(milliseconds=50)) is False
    _until(lambda: _unsubscribed_connections(server) == 1, "closing the ended threads' conns")
    assert store.wait_for_change("k", b"v1", timedelta(milliseconds=50)) is False
    assert _unsubscribed_connections(server) == 1  # reused, not a new connection
    assert _subscribers(server, store, "k") == 0
    store.close()
    _until(lambda: _unsubscribed_connections(server) == 0, "close() closing the subscriber")
