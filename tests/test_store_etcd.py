"""The etcd store against real ``etcd`` processes (see ``tests/servers.py``).

Conformance is :func:`rdzv.testing.check_store`; the tests below pin URLs,
authentication, client-certificate TLS, unknown transaction outcomes, restarts (etcd
always persists; a wiped data directory is reported), a blackholed network, that
values are never unpickled, calls on more keys than one transaction may hold (one
snapshot per read), and the store's use of resources: paced re-watches, no record delete
after a failed ``add``, uncapped connections.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shlex
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import store_cases as cases
from servers import Certs, EtcdServer, TcpProxy, free_port

import rdzv.stores.etcd as etcd_module
from rdzv.errors import RendezvousConnectionError, StoreTimeoutError
from rdzv.stores.etcd import (
    MAX_KEEPALIVE_CONNECTIONS,
    TXN_KEYS,
    WATCH_PAUSE_MAX_S,
    WATCH_PAUSE_MIN_S,
    EtcdStore,
)
from rdzv.stores.url import StoreUrlError
from rdzv.testing import check_store

pytestmark = pytest.mark.slow


_opened = cases.OpenedStores()


@pytest.fixture(autouse=True)
def _close_opened() -> Iterator[None]:
    yield
    _opened.close_all()


def _fresh(url: str, **params: str) -> EtcdStore:
    return _opened(EtcdStore(cases.fresh_url(url, **params), timeout=timedelta(seconds=5)))


def test_conformance_threads_and_processes(etcd_server: EtcdServer) -> None:
    check_store(
        lambda: _fresh(etcd_server.url),
        url=etcd_server.url,
        opener="rdzv.stores.etcd:open_etcd",
        increments=10,
        sets=True,
    )


def test_open_store_resolves_the_scheme(etcd_server: EtcdServer) -> None:
    cases.check_open_store_resolves_the_scheme(etcd_server.url, EtcdStore)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("etcd://127.0.0.1:99999", "(?i)port out of range"),
        ("etcd://127.0.0.1:2379/v2", "has a path"),
        ("etcd://127.0.0.1:2379?color=red", "unknown query parameter"),
        ("etcd://127.0.0.1:2379?cert=/etc/hostname", "need the TLS scheme"),
        ("etcds://127.0.0.1:2379?ca=/no/such/ca.pem", "does not exist"),
        ("etcd://root@127.0.0.1:2379", "both user and password"),
        ("etcd://127.0.0.1:2379?request_timeout=soon", "request_timeout"),
        ("etcd://127.0.0.1:2379?prefix=a%23b", "prefix"),
    ],
)
def test_bad_urls_say_what_is_wrong(url: str, problem: str) -> None:
    with pytest.raises(StoreUrlError, match=problem):
        EtcdStore(url)


def test_unreachable_server_names_endpoint_without_password() -> None:
    cases.check_unreachable_server_is_named(
        EtcdStore,
        f"etcd://root:hunter2@127.0.0.1:{free_port()}?retries=1&connect_timeout=1",
        password="hunter2",
        shown="etcd://root:***@127.0.0.1",
        hint="check that etcd runs",
    )


def test_authentication(start_etcd: Callable[..., EtcdServer]) -> None:
    server = start_etcd()
    server.enable_auth(password="etcd-pw")
    store = _fresh(server.url)  # root:etcd-pw@
    store.set("k", b"v")
    assert store.get("k") == b"v"
    # A restart forgets every token; the store authenticates again by itself.
    server.restart()
    assert store.compare_set("k", b"v", b"w") == b"w"
    assert store.wait_for_change("k", b"v", timedelta(seconds=1)) is True
    store.close()
    base = f"127.0.0.1:{server.port}"
    with pytest.raises(RendezvousConnectionError, match="refused the credentials") as info:
        _fresh(f"etcd://root:wrong-pw@{base}", retries="0")
    assert "wrong-pw" not in str(info.value) and "etcd-pw" not in str(info.value)
    with pytest.raises(RendezvousConnectionError, match=r"credentials|user name"):
        _fresh(f"etcd://{base}", retries="0")


def test_tls_with_client_certificate(start_etcd: Callable[..., EtcdServer], certs: Certs) -> None:
    server = start_etcd(certs=certs)
    store = _fresh(server.url)
    store.set("k", b"over tls")
    assert store.get("k") == b"over tls"
    assert store.wait_for_change("k", None, timedelta(seconds=1)) is True
    store.close()
    # The server demands a client certificate.
    with pytest.raises(RendezvousConnectionError, match=re.escape("etcds://127.0.0.1")):
        _fresh(f"etcds://127.0.0.1:{server.port}?ca={certs.ca}", retries="0")
    # A server certificate from an unknown CA is refused.
    with pytest.raises(RendezvousConnectionError, match=r"(?i)certificate|ssl"):
        _fresh(f"etcds://127.0.0.1:{server.port}", retries="0")


def test_lost_reply_of_compare_set_is_resolved_by_reading(
    etcd_server: EtcdServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(etcd_server.port)
    store = _fresh(f"etcd://127.0.0.1:{proxy.port}")
    # Exactly one write happens: the outcome is read, not written again.
    cases.check_lost_reply_of_compare_set_is_read(store, proxy, b'"compare"', etcd_server.revision)
    store.close()


def test_lost_reply_of_add_counts_once(
    etcd_server: EtcdServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(etcd_server.port)
    store = _fresh(f"etcd://127.0.0.1:{proxy.port}")
    cases.check_lost_reply_of_add_counts_once(store, proxy, b'"compare"')
    assert store.num_keys() == 1  # the add's record lies outside the namespace
    store.close()


def test_restart_keeps_data(start_etcd: Callable[..., EtcdServer]) -> None:
    server = start_etcd()
    store = _fresh(server.url)
    store.set("k", b"kept")
    server.restart()  # SIGKILL; etcd's write-ahead log keeps every acknowledged write
    assert store.get("k") == b"kept"
    assert store.compare_set("k", b"kept", b"next") == b"next"
    store.close()


def test_wiped_server_is_a_clear_error(start_etcd: Callable[..., EtcdServer]) -> None:
    server = start_etcd()
    store = _fresh(server.url)
    cases.check_lost_data_is_reported(
        store, server.restart_empty, "data directory was wiped", lambda: store.set("k", b"v")
    )
    store.close()


def test_blackholed_network_fails_in_bounded_time_then_recovers(
    etcd_server: EtcdServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(etcd_server.port)
    store = _fresh(f"etcd://127.0.0.1:{proxy.port}", request_timeout="0.3", retries="1")
    cases.check_blackhole_fails_then_recovers(store, proxy)
    store.close()


def test_values_are_bytes_never_unpickled(etcd_server: EtcdServer, tmp_path: Path) -> None:
    store = _fresh(etcd_server.url)
    cases.check_values_are_never_unpickled(store, tmp_path)
    store.close()


def test_missing_key_times_out_with_the_store_timeout(etcd_server: EtcdServer) -> None:
    store = _fresh(etcd_server.url)
    cases.check_missing_key_times_out(store)
    store.close()


def test_prefixes_do_not_share_keys_or_wakeups(etcd_server: EtcdServer) -> None:
    a, b = _fresh(etcd_server.url), _fresh(etcd_server.url)
    cases.check_stores_are_isolated(a, b)
    assert b.num_keys() == 0
    a.close()
    b.close()


# -- calls on more keys than one transaction may hold -----------------------------------------


def test_a_closed_store_refuses_calls(etcd_server: EtcdServer) -> None:
    cases.check_a_closed_store_refuses_calls(_fresh(etcd_server.url))


def test_many_keys_in_one_call(etcd_server: EtcdServer) -> None:
    # etcd refuses a transaction of more than --max-txn-ops (128) operations: a call on
    # MANY_KEYS keys needs several transactions.
    assert cases.MANY_KEYS > 2 * TXN_KEYS
    store = _fresh(etcd_server.url)
    cases.check_many_keys_in_one_call(store)
    store.close()


def test_transactions_of_a_multi_set(etcd_server: EtcdServer) -> None:
    # Each transaction is one revision: up to TXN_KEYS keys are one transaction (all or
    # nothing), more take one per TXN_KEYS keys, as documented.
    store = _fresh(etcd_server.url)
    for count, transactions in ((TXN_KEYS, 1), (TXN_KEYS + 1, 2), (cases.MANY_KEYS, 3)):
        keys = [f"k{count}/{i}" for i in range(count)]
        before = etcd_server.revision()
        store.multi_set(keys, [b"v"] * count)
        assert etcd_server.revision() - before == transactions, f"multi_set of {count} keys"
    # A key given twice is put once (etcd refuses a transaction that puts a key twice).
    before = etcd_server.revision()
    store.multi_set(["a", "b", "a"], [b"1", b"2", b"3"])
    assert etcd_server.revision() - before == 1
    assert store.multi_get(["a", "b"]) == [b"3", b"2"]
    store.close()


def _after_first_read(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch, then: Callable[[], None]
) -> list[int]:
    """Run ``then()`` (writes by someone else, on the real server) right after the first
    read transaction of ``store`` returns; every request still goes to the server.
    Returns the list that records the number of ranges of each read transaction."""
    reads: list[int] = []
    post = store._post

    def spying_post(path: str, body: dict[str, Any], doing: str) -> dict[str, Any]:
        reading = path == "/v3/kv/txn" and doing == "reading"
        if reading:
            reads.append(len(body["success"]))  # before: a request that fails counts too
        reply = post(path, body, doing)
        if reading and len(reads) == 1:
            then()
        return reply

    monkeypatch.setattr(store, "_post", spying_post)
    return reads


def test_a_read_of_many_keys_is_one_snapshot(
    etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another client rewrites a key of the first transaction and one of the last right
    # after the first transaction: the read answers both as they were at its start.
    store = _fresh(etcd_server.url)
    keys = [f"k{i}" for i in range(cases.MANY_KEYS)]
    store.multi_set(keys, [b"old"] * len(keys))
    ns = f"{store.prefix}/"

    def rewrite() -> None:
        for key in (keys[0], keys[-1]):
            etcd_server.put(ns + key, b"new")

    reads = _after_first_read(store, monkeypatch, rewrite)
    assert store.multi_get(keys) == [b"old"] * len(keys)
    assert reads == [TXN_KEYS + 1, TXN_KEYS, len(keys) - 2 * TXN_KEYS]  # + the epoch key
    monkeypatch.undo()
    assert store.multi_get([keys[0], keys[-1]]) == [b"new", b"new"]
    store.close()


def test_a_read_whose_revision_is_compacted_midway_starts_over(
    etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Right after the first transaction, another client rewrites two keys and compacts
    # etcd's history up to now: the next transaction cannot read at the first one's
    # revision any more, so the whole read starts over and answers the new values.
    store = _fresh(etcd_server.url)
    keys = [f"k{i}" for i in range(cases.MANY_KEYS)]
    store.multi_set(keys, [b"old"] * len(keys))
    ns = f"{store.prefix}/"

    def rewrite_and_compact() -> None:
        for key in (keys[0], keys[-1]):
            etcd_server.put(ns + key, b"new")
        etcd_server.post("/v3/kv/compaction", {"revision": str(etcd_server.revision())})

    reads = _after_first_read(store, monkeypatch, rewrite_and_compact)
    assert store.check(keys) is True
    values = store.multi_get(keys)
    assert values == [b"new"] + [b"old"] * (len(keys) - 2) + [b"new"]
    first, again = [TXN_KEYS + 1, TXN_KEYS], [TXN_KEYS + 1, TXN_KEYS, len(keys) - 2 * TXN_KEYS]
    # check: the first transaction, the second refused (compacted), then all again;
    # then multi_get.
    assert reads == [*first, *again, *again]
    store.close()


class _EtcdAllowing(EtcdServer):
    """An etcd started with ``--max-txn-ops=max_txn_ops`` (through a wrapper script)."""

    def __init__(self, folder: Path, max_txn_ops: int) -> None:
        super().__init__(folder)
        wrapper = folder / "etcd-with-max-txn-ops"
        wrapper.write_text(
            f'#!/bin/sh\nexec {shlex.quote(self.binary)} "$@" --max-txn-ops={max_txn_ops}\n'
        )
        wrapper.chmod(0o755)
        self.binary = str(wrapper)


def test_a_server_allowing_fewer_operations_is_named(tmp_path: Path) -> None:
    server = _EtcdAllowing(tmp_path / "etcd", max_txn_ops=16)
    try:
        server.start()
        store = _fresh(server.url)
        store.multi_set([f"k{i}" for i in range(16)], [b"v"] * 16)  # fits
        keys = [f"k{i}" for i in range(17)]
        says = r"refused a transaction while set .*--max-txn-ops=128 or more"
        with pytest.raises(RendezvousConnectionError, match=says):
            store.multi_set(keys, [b"v"] * 17)
        with pytest.raises(RendezvousConnectionError, match="while reading"):
            store.check(keys[:16])  # 16 keys and the epoch key
        store.close()
    finally:
        server.stop()


# -- member sets (rdzv.store.SetStore) ------------------------------------------------------


def _raw_keys(server: EtcdServer, start: bytes) -> list[bytes]:
    end = start[:-1] + bytes([start[-1] + 1])
    body = {
        "key": base64.b64encode(start).decode(),
        "range_end": base64.b64encode(end).decode(),
        "keys_only": True,
    }
    reply = server.post("/v3/kv/range", body, server.token())
    return [base64.b64decode(kv["key"]) for kv in reply.get("kvs", [])]


def test_member_sets_live_outside_the_key_namespace(etcd_server: EtcdServer) -> None:
    store = _fresh(etcd_server.url)
    assert store.add_member("round/1", b"node-b") == 1
    assert store.add_member("round/1", b"node-a") == 2
    assert store.add_member("round", b"other") == 1
    prefix = store.prefix.encode()
    # One etcd key per member; the set name's length keeps "round" and "round/1" apart.
    assert _raw_keys(etcd_server, prefix + b"#set/") == [
        prefix + b"#set/5:round/other",
        prefix + b"#set/7:round/1/node-a",
        prefix + b"#set/7:round/1/node-b",
    ]
    assert _raw_keys(etcd_server, prefix + b"/") == []
    assert store.num_keys() == 0
    assert store.members("round") == [b"other"]
    store.close()


def test_add_member_is_one_transaction(etcd_server: EtcdServer) -> None:
    store = _fresh(etcd_server.url)
    store.add_member("s", b"a")
    before = etcd_server.revision()
    assert store.add_member("s", b"b") == 2
    assert etcd_server.revision() - before == 1  # one write: the member's put
    store.close()


def test_a_full_member_set_refuses_new_members(
    etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # etcd cannot compare a count in a transaction: the overflowing member is taken out
    # again. 3 stands in for the real 1,000,000.
    monkeypatch.setattr("rdzv.stores.etcd.MAX_SET_MEMBERS", 3)
    store = _fresh(etcd_server.url)
    assert [store.add_member("s", m) for m in (b"a", b"b", b"c")] == [1, 2, 3]
    with pytest.raises(ValueError, match=r"'s' in etcd://.* already holds 3 members"):
        store.add_member("s", b"d")
    assert store.members("s") == [b"a", b"b", b"c"]
    assert store.add_member("s", b"b") == 3  # a member already present is not refused
    store.close()


def test_lost_reply_of_add_member_adds_once(
    etcd_server: EtcdServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(etcd_server.port)
    store = _fresh(f"etcd://127.0.0.1:{proxy.port}")
    assert store.add_member("s", b"first") == 1
    proxy.lose_reply_to(b"prev_kv")
    # The put is idempotent: the transaction is simply sent again after the lost reply.
    assert store.add_member("s", b"second") == 2
    assert proxy.replies_lost == 1
    assert store.members("s") == [b"first", b"second"]
    store.close()


def test_wiped_server_is_reported_by_member_sets(start_etcd: Callable[..., EtcdServer]) -> None:
    server = start_etcd()
    store = _fresh(server.url)
    store.add_member("s", b"a")
    server.restart_empty()
    with pytest.raises(RendezvousConnectionError, match="data directory was wiped"):
        store.members("s")
    with pytest.raises(RendezvousConnectionError, match="restart the job"):
        store.add_member("s", b"b")
    with pytest.raises(RendezvousConnectionError, match="restart the job"):
        store.remove_member("s", b"a")
    store.close()
    other = _fresh(server.url)  # a fresh store on the wiped server: add_member's guard
    other.add_member("s", b"a")
    server.restart_empty()
    with pytest.raises(RendezvousConnectionError, match="data directory was wiped"):
        other.add_member("s", b"b")
    third = _fresh(server.url)  # remove_member's transaction is guarded by the epoch too
    third.add_member("s", b"a")
    server.restart_empty()
    with pytest.raises(RendezvousConnectionError, match="data directory was wiped"):
        third.remove_member("s", b"a")
    other.close()
    third.close()


def test_remove_member_deletes_the_member_key_in_one_transaction(
    etcd_server: EtcdServer,
) -> None:
    store = _fresh(etcd_server.url)
    for member in (b"a", b"b"):
        store.add_member("round/1", member)
    store.add_member("round", b"a")
    prefix = store.prefix.encode()
    before = etcd_server.revision()
    assert store.remove_member("round/1", b"a") == 1
    assert etcd_server.revision() - before == 1  # one write: the member key's delete
    assert _raw_keys(etcd_server, prefix + b"#set/") == [
        prefix + b"#set/5:round/a",
        prefix + b"#set/7:round/1/b",
    ]
    assert store.remove_member("round/1", b"b") == 0
    # An emptied set leaves no key behind; the set named like its prefix is untouched.
    assert _raw_keys(etcd_server, prefix + b"#set/") == [prefix + b"#set/5:round/a"]
    assert store.members("round/1") == [] and store.members("round") == [b"a"]
    store.close()


def test_lost_reply_of_remove_member_is_resent(
    etcd_server: EtcdServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(etcd_server.port)
    store = _fresh(f"etcd://127.0.0.1:{proxy.port}")
    cases.check_lost_reply_of_remove_member_is_resent(store, proxy, b"request_delete_range")
    store.close()


def test_remove_member_on_a_blackholed_network_fails_then_recovers(
    etcd_server: EtcdServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(etcd_server.port)
    store = _fresh(f"etcd://127.0.0.1:{proxy.port}", request_timeout="0.3", retries="1")
    cases.check_remove_member_on_a_blackholed_network(store, proxy)
    store.close()


def test_a_woken_reader_reads_each_change_once(etcd_server: EtcdServer) -> None:
    from test_stores import check_one_read_per_change

    url = cases.fresh_url(etcd_server.url)  # one namespace for the reader and the writer
    check_one_read_per_change(
        lambda: EtcdStore(url, timeout=timedelta(seconds=5)), f"once-{uuid.uuid4().hex}"
    )


# -- resources: paced re-watches, no needless requests, connections ----------------------------

CONDITION_WITHIN_S = 20.0
"""How long a test waits for the server to show what a store did (a loaded CI machine)."""
JOIN_WITHIN_S = 60.0
"""How long a test waits for a thread it started to finish."""
MAX_WATCH_OPENS = 200
"""A stubbed watch opened more often than this within one wait: the wait spins."""


class _FakeTime:
    """Stands in for the ``time`` module inside ``rdzv.stores.etcd``: ``monotonic`` moves
    only by ``sleep``, which records what it was asked and returns at once."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _stub_watches_that_end_at_once(store: EtcdStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every watch of ``store`` a stream that the server ends right after "created",
    with no events (a proxy that closes streaming responses); reads and writes still go
    to the real server. Returns the list that records each watch opened."""
    opened: list[str] = []

    class _Reply:
        status_code = 200

        def iter_lines(self) -> Iterator[str]:
            yield json.dumps({"result": {"created": True}})

    @contextlib.contextmanager
    def stream(method: str, url: str, **kwargs: Any) -> Iterator[_Reply]:
        opened.append(url)
        assert len(opened) <= MAX_WATCH_OPENS, "the wait re-watches without pausing"
        yield _Reply()

    monkeypatch.setattr(store._http, "stream", stream)
    return opened


def _expected_pauses(seconds: float) -> list[float]:
    """The pauses of a wait of ``seconds`` whose every watch ends without events."""
    pauses, pause, left = [], WATCH_PAUSE_MIN_S, seconds
    while left > 1e-9:
        pauses.append(min(pause, left))
        left -= pauses[-1]
        pause = min(pause * 2, WATCH_PAUSE_MAX_S)
    return pauses


@pytest.mark.parametrize("call", ["wait_for_change", "wait"])
def test_watches_that_end_at_once_are_paced_not_spun(
    etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    # A unit test of the read-and-watch loop, on the real server with only the watch
    # stream stubbed: etcd itself never ends a watch without a reason, and the test
    # proxy can cut a connection (a transport error, already retried with backoff) but
    # not end an HTTP response cleanly, as an HTTP proxy with a stream time limit does.
    # Time is fake: each pause moves it, so without pauses the wait would never end.
    store = _fresh(etcd_server.url)
    store.set("k", b"v")
    opened = _stub_watches_that_end_at_once(store, monkeypatch)
    clock = _FakeTime()
    monkeypatch.setattr(etcd_module, "time", clock)
    if call == "wait_for_change":
        assert store.wait_for_change("k", b"v", timedelta(seconds=1)) is False
    else:
        with pytest.raises(StoreTimeoutError):
            store.wait(["missing"], timedelta(seconds=1))
    expected = _expected_pauses(1.0)
    # 10, 20, 40, 80, 160 ms, then 200 ms until the deadline.
    assert expected[:6] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.2]
    assert clock.sleeps == pytest.approx(expected)
    assert len(opened) == len(expected)  # one pause after every watch that ended
    monkeypatch.undo()
    store.close()


def test_add_on_an_unreachable_server_fails_without_deleting_its_record(
    etcd_server: EtcdServer, tcp_proxy: Callable[[int], TcpProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = tcp_proxy(etcd_server.port)
    store = _fresh(f"etcd://127.0.0.1:{proxy.port}", request_timeout="0.3", retries="1")
    record_prefix = f"{store.prefix}#add/".encode()
    assert store.add("n", 1) == 1
    assert _raw_keys(etcd_server, record_prefix) == []  # a successful add deletes it
    paths: list[str] = []
    post = store._post

    def recording_post(path: str, body: dict[str, Any], doing: str) -> dict[str, Any]:
        paths.append(path)
        return post(path, body, doing)

    monkeypatch.setattr(store, "_post", recording_post)
    proxy.blackhole()
    with pytest.raises(RendezvousConnectionError, match="failed while add after 2 att"):
        store.add("n", 1)
    # The add's read timed out twice (retries=1); no record was written, and no delete
    # of it was sent to the server that had just not answered (another 2 timeouts).
    assert paths == ["/v3/kv/txn", "/v3/kv/txn"]
    proxy.resume()
    assert store.add("n", 1) == 2
    assert _raw_keys(etcd_server, record_prefix) == []
    store.close()


def _watchers(server: EtcdServer) -> int:
    """The server's count of open watches (its Prometheus gauge)."""
    with urllib.request.urlopen(f"{server.client_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith("etcd_debugging_mvcc_watcher_total "):
            return int(float(line.split()[1]))
    raise AssertionError("etcd's /metrics has no etcd_debugging_mvcc_watcher_total")


def test_more_waiters_than_kept_connections_all_wake_on_one_write(
    start_etcd: Callable[..., EtcdServer],
) -> None:
    # Each waiting thread holds a watch connection for as long as it waits; the pool is
    # not capped (MAX_CONNECTIONS), so a writer is never queued behind the waiters it
    # must wake. A cap at, or below, the number of waiters fails this test: the write
    # waits for a free connection until a wait times out.
    server = start_etcd()  # private: the test counts the server's watches
    store = _fresh(server.url)
    count = MAX_KEEPALIVE_CONNECTIONS + 8
    woke: list[bool] = []
    lock = threading.Lock()

    def waiter() -> None:
        changed = store.wait_for_change("go", None, timedelta(seconds=JOIN_WITHIN_S / 2))
        with lock:
            woke.append(changed)

    threads = [threading.Thread(target=waiter, name=f"waiter-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + CONDITION_WITHIN_S
        while _watchers(server) < count:  # bounded by CONDITION_WITHIN_S
            assert time.monotonic() < deadline, f"{count} waiters did not all watch"
            time.sleep(0.02)
        transport: Any = store._http._transport
        pool = transport._pool  # httpcore's, to check the documented bound
        assert len(pool.connections) <= count + 1  # one per thread using the store
    finally:
        try:
            store.set("go", b"1")
        finally:
            _join(threads)
    assert woke == [True] * count
    store.close()


def _join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(JOIN_WITHIN_S)
        assert not thread.is_alive(), f"{thread.name} did not finish"
