"""Test bodies shared by the network store tests (``tests/test_store_redis.py`` and
``tests/test_store_etcd.py``): where both backends promise the same behaviour, it is
checked by the same code against each real server.

Each function acts on a store the caller opened and leaves closing it to the caller
(unless it says otherwise), so a test can add its backend's own checks after it.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Protocol, TypeVar

import pytest
from servers import TcpProxy

from rdzv.errors import RendezvousConnectionError, StoreTimeoutError
from rdzv.store import SetStore, Store
from rdzv.stores import open_store


class ClosableStore(Store, Protocol):
    """A store that holds connections (every network backend)."""

    def close(self) -> None: ...


_S = TypeVar("_S", bound=ClosableStore)


class OpenedStores:
    """The stores the running test opened: a module's autouse fixture calls
    :meth:`close_all` after each test, so they are closed also when the test failed
    (closing a store twice is harmless)."""

    def __init__(self) -> None:
        self._stores: list[ClosableStore] = []

    def __call__(self, store: _S) -> _S:
        self._stores.append(store)
        return store

    def close_all(self) -> None:
        with contextlib.ExitStack() as closes:  # every close runs, even if one raises
            while self._stores:
                closes.callback(self._stores.pop().close)


def fresh_url(url: str, **params: str) -> str:
    """``url`` with a new, unique ``prefix`` (so tests sharing a server do not meet)
    and the given query parameters."""
    query = "&".join(f"{k}={v}" for k, v in {"prefix": f"t{uuid.uuid4().hex}", **params}.items())
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}{query}"


def check_open_store_resolves_the_scheme(url: str, kind: type[ClosableStore]) -> None:
    """``open_store`` picks the backend from the scheme; the store works (and is closed)."""
    store = open_store(url + "?prefix=open", timeout=timedelta(seconds=3))
    assert isinstance(store, kind)
    store.set("k", b"v")
    assert store.get("k") == b"v"
    store.close()


def check_unreachable_server_is_named(
    open_: Callable[[str], object], url: str, password: str, shown: str, hint: str
) -> None:
    """Opening ``url`` (a closed port, ``retries=1``) fails after 2 attempts with an error
    naming the endpoint as ``shown`` (password redacted) and what to check (``hint``)."""
    assert password in url
    with pytest.raises(RendezvousConnectionError) as info:
        open_(url)
    text = str(info.value)
    assert password not in text
    assert shown in text
    assert "2 attempt(s)" in text and hint in text


def check_lost_reply_of_compare_set_is_read(
    store: Store, proxy: TcpProxy, marker: bytes, applied: Callable[[], int]
) -> None:
    """The reply of a compare_set is lost (the proxy drops the answer to the request
    containing ``marker``): the store answers right, and ``applied()`` (a server-side
    count of applied requests) moved by exactly one: the outcome was read, not sent again."""
    assert store.compare_set("k", b"", b"v1") == b"v1"
    before = applied()
    proxy.lose_reply_to(marker)
    assert store.compare_set("k", b"v1", b"v2") == b"v2"
    assert proxy.replies_lost == 1
    assert applied() - before == 1
    assert store.get("k") == b"v2"


def check_lost_reply_of_add_counts_once(store: Store, proxy: TcpProxy, marker: bytes) -> None:
    """The reply of an add is lost: the add is counted once, and its result returned."""
    assert store.add("n", 1) == 1
    proxy.lose_reply_to(marker)
    assert store.add("n", 10) == 11
    assert proxy.replies_lost == 1
    assert store.get("n") == b"11"


def check_lost_reply_of_remove_member_is_resent(
    store: SetStore, proxy: TcpProxy, marker: bytes
) -> None:
    """The reply of a remove_member is lost (the proxy drops the answer to the request
    containing ``marker``; the member removed is ``b"lost-reply-member"``): removing is
    idempotent, so the request is simply sent again, and the caller gets the size as if
    nothing had been lost."""
    for member in (b"a", b"b", b"lost-reply-member"):
        store.add_member("s", member)
    assert store.remove_member("s", b"a") == 2  # a first removal (Redis: loads the script)
    proxy.lose_reply_to(marker)
    assert store.remove_member("s", b"lost-reply-member") == 1
    assert proxy.replies_lost == 1
    assert store.members("s") == [b"b"]
    assert store.remove_member("s", b"lost-reply-member") == 1  # gone: a no-op
    assert store.remove_member("s", b"b") == 0


def check_remove_member_on_a_blackholed_network(store: SetStore, proxy: TcpProxy) -> None:
    """With a short request timeout and ``retries=1``, remove_member on a network that
    drops everything fails with a connection error naming the call; once traffic moves
    again, the removal (idempotent) can simply be repeated."""
    store.add_member("s", b"m")
    store.add_member("s", b"kept")
    proxy.blackhole()
    with pytest.raises(RendezvousConnectionError, match="failed while remove_member after 2 att"):
        store.remove_member("s", b"m")
    proxy.resume()
    assert store.remove_member("s", b"m") == 1
    assert store.members("s") == [b"kept"]


def check_lost_data_is_reported(
    store: Store, wipe: Callable[[], None], says: str, then: Callable[[], object]
) -> None:
    """After ``wipe()`` (the server comes back without this store's data), reading fails
    with an error matching ``says``, and a later call ``then()`` fails too: the store never
    goes on working on an empty server."""
    store.set("k", b"v")
    wipe()
    with pytest.raises(RendezvousConnectionError, match=says):
        store.get("k")
    with pytest.raises(RendezvousConnectionError, match="restart the job"):
        then()


def check_blackhole_fails_then_recovers(store: Store, proxy: TcpProxy) -> None:
    """With a short request timeout and ``retries=1``, a network that drops everything
    makes a call fail with a timeout; once it passes traffic, the next call reconnects."""
    store.set("k", b"v")
    proxy.blackhole()
    with pytest.raises(RendezvousConnectionError, match="Timeout"):
        store.get("k")
    proxy.resume()
    assert store.get("k") == b"v"


def check_values_are_never_unpickled(store: Store, tmp_path: Path) -> None:
    """A pickle whose loading would create a marker file is stored and compared as bytes."""
    marker = tmp_path / "pwned"

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (marker.touch, ())  # type: ignore[return-value]

    payload = pickle.dumps(Boom())
    store.set("k", payload)
    assert store.get("k") == payload
    assert store.compare_set("k", payload, b"x") == b"x"
    assert not marker.exists()


def check_missing_key_times_out(store: Store) -> None:
    """``get`` of a missing key raises StoreTimeoutError naming the key after the store
    timeout (set short here)."""
    store.set_timeout(timedelta(milliseconds=50))
    with pytest.raises(StoreTimeoutError, match="'missing'"):
        store.get("missing")


def check_stores_are_isolated(a: Store, b: Store) -> None:
    """What ``a`` writes, ``b`` neither sees nor wakes up for."""
    a.set("k", b"written by a")
    assert b.check(["k"]) is False
    assert b.wait_for_change("k", None, timedelta(milliseconds=100)) is False


MANY_KEYS = 300
"""Keys in one call of :func:`check_many_keys_in_one_call`: more than one etcd
transaction may hold (``--max-txn-ops``, 128 by default), so etcd needs three."""


def _many_values(count: int) -> list[bytes]:
    """``count`` distinct values, among them ``b""`` and values with NUL bytes."""
    return [b""] + [f"v{i}".encode() + b"\0" * (i % 3) for i in range(1, count)]


def check_many_keys_in_one_call(store: Store, count: int = MANY_KEYS) -> None:
    """``multi_set``, ``multi_get``, ``check`` and ``wait`` of ``count`` keys in one
    call (on a fresh store): every value round-trips, in the order asked; a key given
    twice to ``multi_set`` keeps its last value; a missing key anywhere in the list makes
    ``check`` False and ``multi_get`` time out; a ``multi_get`` waiting for the last key
    of the list wakes when another thread writes it."""
    keys = [f"many/{i:04d}" for i in range(count)]
    values = _many_values(count)
    store.multi_set(keys, values)
    assert store.num_keys() == count
    assert store.multi_get(keys) == values
    assert store.multi_get(keys[::-1]) == values[::-1]
    assert store.multi_get(keys + keys) == values + values
    assert store.check(keys) is True
    store.wait(keys, timedelta(seconds=5))
    for at in (0, count // 2, count):  # first, middle, after the last
        asked = [*keys[:at], "many/missing", *keys[at:]]
        assert store.check(asked) is False, f"check() with the missing key at {at}"
    store.set_timeout(timedelta(milliseconds=50))
    with pytest.raises(StoreTimeoutError):
        store.multi_get([*keys, "many/missing"])
    # A key given twice keeps the last value given, as if set one after another.
    renamed = [f"again {i}".encode() for i in range(10)]
    store.multi_set([*keys, *keys[:10]], [*values, *renamed])
    assert store.multi_get(keys) == renamed + values[10:]
    assert store.num_keys() == count
    # A wait for the last of many keys wakes on its write.
    store.set_timeout(timedelta(seconds=30))
    late = f"many/{count:04d}"
    writer = threading.Timer(0.2, lambda: store.set(late, b"late"))
    writer.start()
    try:
        got = store.multi_get([*keys, late])
    finally:
        writer.join(30)
    assert not writer.is_alive(), "the writer thread did not finish"
    assert got[-1] == b"late" and got[:-1] == renamed + values[10:]


def check_a_closed_store_refuses_calls(store: Store) -> None:
    """After ``close()`` every call raises :class:`RendezvousConnectionError` saying the
    store was closed (never reconnects, never a client library's own error), and closing
    again does nothing."""
    store.set("k", b"v")
    close = getattr(store, "close")  # noqa: B009 - Store has no close(); every rdzv store does
    close()
    calls: list[Callable[[], object]] = [
        lambda: store.get("k"),
        lambda: store.set("k", b"w"),
        lambda: store.check(["k"]),
        lambda: store.multi_get(["k"]),
        lambda: store.compare_set("k", b"v", b"w"),
        lambda: store.add("n", 1),
        lambda: store.wait(["k"], timedelta(seconds=1)),
        lambda: store.wait_for_change("k", b"v", timedelta(seconds=1)),
        store.num_keys,
    ]
    for call in calls:
        with pytest.raises(RendezvousConnectionError, match="was closed; open a new one"):
            call()
    close()
