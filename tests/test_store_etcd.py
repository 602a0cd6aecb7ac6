"""The etcd store against real ``etcd`` processes (see ``tests/servers.py``).

Conformance is :func:`rdzv.testing.check_store`; the tests below pin URLs,
authentication, client-certificate TLS, unknown transaction outcomes, restarts (etcd
always persists; a wiped data directory is reported), a blackholed network, and that
values are never unpickled.
"""

from __future__ import annotations

import pickle
import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from servers import Certs, EtcdServer, TcpProxy, free_port

from rdzv.errors import RendezvousConnectionError, StoreTimeoutError
from rdzv.stores import open_store
from rdzv.stores.etcd import EtcdStore
from rdzv.stores.url import StoreUrlError
from rdzv.testing import check_store

pytestmark = pytest.mark.slow


def _fresh(url: str, **params: str) -> EtcdStore:
    query = "&".join(f"{k}={v}" for k, v in {"prefix": f"t{uuid.uuid4().hex}", **params}.items())
    sep = "&" if "?" in url else "?"
    return EtcdStore(f"{url}{sep}{query}", timeout=timedelta(seconds=5))


def test_conformance_threads_and_processes(etcd_server: EtcdServer) -> None:
    check_store(
        lambda: _fresh(etcd_server.url),
        url=etcd_server.url,
        opener="rdzv.stores.etcd:open_etcd",
        increments=10,
    )


def test_open_store_resolves_the_scheme(etcd_server: EtcdServer) -> None:
    store = open_store(etcd_server.url + "?prefix=open", timeout=timedelta(seconds=3))
    assert isinstance(store, EtcdStore)
    store.set("k", b"v")
    assert store.get("k") == b"v"
    store.close()


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
    url = f"etcd://root:hunter2@127.0.0.1:{free_port()}?retries=1&connect_timeout=1"
    with pytest.raises(RendezvousConnectionError) as info:
        EtcdStore(url)
    text = str(info.value)
    assert "hunter2" not in text
    assert "etcd://root:***@127.0.0.1" in text
    assert "2 attempt(s)" in text and "check that etcd runs" in text


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
    assert store.compare_set("k", b"", b"v1") == b"v1"
    before = etcd_server.revision()
    proxy.lose_reply_to(b'"compare"')
    assert store.compare_set("k", b"v1", b"v2") == b"v2"
    assert proxy.replies_lost == 1
    # Exactly one write happened: the outcome was read, not written again.
    assert etcd_server.revision() - before == 1
    assert store.get("k") == b"v2"
    store.close()


def test_lost_reply_of_add_counts_once(
    etcd_server: EtcdServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(etcd_server.port)
    store = _fresh(f"etcd://127.0.0.1:{proxy.port}")
    assert store.add("n", 1) == 1
    proxy.lose_reply_to(b'"compare"')
    assert store.add("n", 10) == 11
    assert proxy.replies_lost == 1
    assert store.get("n") == b"11"
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
    store.set("k", b"v")
    server.restart_empty()
    with pytest.raises(RendezvousConnectionError, match="data directory was wiped"):
        store.get("k")
    with pytest.raises(RendezvousConnectionError, match="restart the job"):
        store.set("k", b"v")
    store.close()


def test_blackholed_network_fails_in_bounded_time_then_recovers(
    etcd_server: EtcdServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(etcd_server.port)
    store = _fresh(f"etcd://127.0.0.1:{proxy.port}", request_timeout="0.3", retries="1")
    store.set("k", b"v")
    proxy.blackhole()
    with pytest.raises(RendezvousConnectionError, match="Timeout"):
        store.get("k")
    proxy.resume()
    assert store.get("k") == b"v"
    store.close()


def test_values_are_bytes_never_unpickled(etcd_server: EtcdServer, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (marker.touch, ())  # type: ignore[return-value]

    payload = pickle.dumps(Boom())
    store = _fresh(etcd_server.url)
    store.set("k", payload)
    assert store.get("k") == payload
    assert store.compare_set("k", payload, b"x") == b"x"
    assert not marker.exists()
    store.close()


def test_missing_key_times_out_with_the_store_timeout(etcd_server: EtcdServer) -> None:
    store = _fresh(etcd_server.url)
    store.set_timeout(timedelta(milliseconds=50))
    with pytest.raises(StoreTimeoutError, match="'missing'"):
        store.get("missing")
    store.close()


def test_prefixes_do_not_share_keys_or_wakeups(etcd_server: EtcdServer) -> None:
    a, b = _fresh(etcd_server.url), _fresh(etcd_server.url)
    a.set("k", b"in a")
    assert b.check(["k"]) is False
    assert b.num_keys() == 0
    assert b.wait_for_change("k", None, timedelta(milliseconds=100)) is False
    a.close()
    b.close()
