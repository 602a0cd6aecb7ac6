"""The etcd store against real ``etcd`` processes (see ``tests/servers.py``).

Conformance is :func:`rdzv.testing.check_store`; the tests below pin URLs,
authentication, client-certificate TLS, unknown transaction outcomes, restarts (etcd
always persists; a wiped data directory is reported), a blackholed network, and that
values are never unpickled.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import store_cases as cases
from servers import Certs, EtcdServer, TcpProxy, free_port

from rdzv.errors import RendezvousConnectionError
from rdzv.stores.etcd import EtcdStore
from rdzv.stores.url import StoreUrlError
from rdzv.testing import check_store

pytestmark = pytest.mark.slow


def _fresh(url: str, **params: str) -> EtcdStore:
    return EtcdStore(cases.fresh_url(url, **params), timeout=timedelta(seconds=5))


def test_conformance_threads_and_processes(etcd_server: EtcdServer) -> None:
    check_store(
        lambda: _fresh(etcd_server.url),
        url=etcd_server.url,
        opener="rdzv.stores.etcd:open_etcd",
        increments=10,
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
