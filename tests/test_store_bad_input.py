"""Bad input to the stores: malformed URLs that carry passwords, option values outside
what the backend can honour, and foreign data where a store keeps its own.

The standard: a clear error saying what is wrong and what to do, no password in any
message, and nothing stored is changed by a call that fails.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import store_cases as cases
from servers import EtcdServer, RedisServer

from rdzv import RendezvousParameters, create_handler
from rdzv.backend import StoreRendezvousBackend
from rdzv.errors import RendezvousStateError
from rdzv.stores import SQLiteStore, open_store
from rdzv.stores import url as url_module
from rdzv.stores.etcd import EtcdStore
from rdzv.stores.redis import RedisStore
from rdzv.stores.remote import parse_remote_url
from rdzv.stores.sqlite import MAX_BUSY_TIMEOUT_MS
from rdzv.stores.url import StoreUrlError, check_userinfo, redact

# -- passwords never appear in messages ----------------------------------------------------

PASSWORD = "s3cretPw"
# A password with every character that ends a URL's authority written raw: each piece
# between them must stay hidden too (pieces are distinct, so any leak is caught).
SPECIAL = "Pa1x/Pb2y?Pc3z#Pd4w@Pe5v"
PIECES = ("Pa1x", "Pb2y", "Pc3z", "Pd4w", "Pe5v")

MALFORMED_WITH_PASSWORD = [
    # The review's case: a fragment after a URL with a password.
    f"redis://:{PASSWORD}@127.0.0.1:1/0#x",
    f"rediss://user:{PASSWORD}@127.0.0.1:1/0#frag",
    f"etcd://root:{PASSWORD}@127.0.0.1:1#x",
    f"etcds://root:{PASSWORD}@127.0.0.1:1?prefix=p#x",
    # Query problems.
    f"redis://:{PASSWORD}@127.0.0.1:1/0?retries=1&retries=2",
    f"redis://:{PASSWORD}@127.0.0.1:1/0?bogus=1",
    f"redis://:{PASSWORD}@127.0.0.1:1/0?novalue",
    f"etcd://root:{PASSWORD}@127.0.0.1:1?request_timeout=soon",
    f"redis://:{PASSWORD}@127.0.0.1:1/0?ttl=1e300",
    f"redis://:{PASSWORD}@127.0.0.1:1/0?prefix=a:b",
    f"redis://:{PASSWORD}@127.0.0.1:1/0?retries=-1",
    f"redis://:{PASSWORD}@127.0.0.1:1/0?ca=/etc/hostname",
    f"rediss://:{PASSWORD}@127.0.0.1:1/0?ca=/no/such/ca.pem",
    f"rediss://:{PASSWORD}@127.0.0.1:1/0?ca=/etc/hostname",  # exists, but not PEM
    f"etcds://root:{PASSWORD}@127.0.0.1:1?ca=/etc/hostname",
    # Authority and path problems.
    f"redis://:{PASSWORD}@127.0.0.1:99999/0",
    f"redis://:{PASSWORD}@127.0.0.1:port/0",
    f"redis://:{PASSWORD}@127.0.0.1:1/zero",
    f"redis://:{PASSWORD}@/0",
    f"redis://:{PASSWORD}@[::1/0",
    f"etcd://root:{PASSWORD}@127.0.0.1:1/v2",
    f"etcd://:{PASSWORD}@127.0.0.1:1",
    # Not URLs the scheme registry accepts.
    f"redis:/:{PASSWORD}@127.0.0.1:1/0",
    f"user:{PASSWORD}@host://x",
    f"nosuch://user:{PASSWORD}@host:1/0",
    f" redis://:{PASSWORD}@127.0.0.1:1/0",
    # Stores that take no credentials.
    f"sqlite://user:{PASSWORD}@/tmp/x.db",
    f"sqlite://user:{PASSWORD}@/tmp/x.db#x",
    f"memory://user:{PASSWORD}@job",
    f"memory://user:{PASSWORD}@job?x=1",
    f"memory://user:{PASSWORD}@job#x",
]

# Passwords with raw '/', '?', '#' or '@' (which should have been percent-encoded).
MALFORMED_WITH_SPECIAL_PASSWORD = [
    f"redis://:{SPECIAL}@127.0.0.1:1/0",
    f"redis://user:{SPECIAL}@127.0.0.1:1/0?retries=x",
    f"etcd://root:{SPECIAL}@127.0.0.1:1",
    f"sqlite://user:{SPECIAL}@/tmp/x.db",
    f"memory://user:{SPECIAL}@job",
]


def _hidden(text: str) -> None:
    assert PASSWORD not in text, text
    for piece in PIECES:
        assert piece not in text, (piece, text)


@pytest.mark.parametrize("url", MALFORMED_WITH_PASSWORD + MALFORMED_WITH_SPECIAL_PASSWORD)
def test_no_url_error_shows_the_password(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        open_store(url, timeout=timedelta(seconds=1))
    _hidden(str(caught.value))
    _hidden(repr(caught.value))


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{PASSWORD}@127.0.0.1:1/0#x",
        f"redis://:{SPECIAL}@127.0.0.1:1/0",
        f"sqlite://user:{PASSWORD}@/tmp/x.db",
    ],
)
def test_create_handler_shows_no_password_either(url: str) -> None:
    params = RendezvousParameters("rdzv", url, "job", 1, 1)
    with pytest.raises(ValueError) as caught:
        create_handler(params)
    _hidden(str(caught.value))


@pytest.mark.parametrize("scheme", ["rediss", "etcds"])
@pytest.mark.parametrize("param", ["ca", "cert"])
def test_a_tls_file_that_is_not_pem_is_the_urls_error_before_any_connection(
    tmp_path: Path, scheme: str, param: str
) -> None:
    # Not a flaky connection (retried, then "unreachable"): the URL names a bad file.
    bad = tmp_path / "not-a-certificate.pem"
    bad.write_text("this is not PEM\n")
    with pytest.raises(StoreUrlError) as caught:  # port 1: nobody listens, nothing is sent
        open_store(f"{scheme}://127.0.0.1:1?{param}={bad}", timeout=timedelta(seconds=1))
    message = str(caught.value)
    assert f"{param}={str(bad)!r}" in message and "cannot be loaded" in message
    assert "give PEM files" in message


def test_the_fragment_error_names_the_fix_and_masks_the_password() -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(f"redis://:{PASSWORD}@127.0.0.1:1/0#x")
    message = str(caught.value)
    assert "redis://:***@127.0.0.1:1/0#x" in message
    assert "no fragment" in message and "%23" in message


def test_a_password_with_raw_separators_is_refused_with_the_encoding_to_use() -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(f"redis://:{SPECIAL}@127.0.0.1:1/0")
    message = str(caught.value)
    assert "redis://:***@127.0.0.1:1/0" in message
    assert "percent-encode" in message and "%40" in message and "%2F" in message


def test_redact_hides_everything_that_may_be_a_password() -> None:
    assert redact("redis://:pw@h/0") == "redis://:***@h/0"
    assert redact("redis://user:pw@h:1/0?prefix=p") == "redis://user:***@h:1/0?prefix=p"
    # A raw '@' in the password: the last '@' ends it, so no part of it shows.
    assert redact("redis://:p@ss@h/0") == "redis://:***@h/0"
    assert redact(f"redis://:{SPECIAL}@h/0") == "redis://:***@h/0"
    # Without a ':' before an '@' in the authority there is no password to hide.
    assert redact("redis://h:6379/0") == "redis://h:6379/0"
    assert redact("redis://user@h/0") == "redis://user@h/0"
    assert redact("sqlite:///srv/a:b@c.db") == "sqlite:///srv/a:b@c.db"
    # No valid scheme: the whole text is searched.
    assert redact("user:pw@host://x") == "user:***@host://x"
    assert redact("redis:/:pw@h") == "redis:***@h"


def test_a_percent_encoded_password_still_works_and_stays_hidden() -> None:
    parsed = parse_remote_url("redis://:p%40ss%2Fw%3Fx%23@h:1/0", 6379, ())
    assert parsed.password == "p@ss/w?x#"
    assert parsed.shown == "redis://:***@h:1/0"
    assert "p%40ss" not in repr(parsed) and "p@ss" not in repr(parsed)
    check_userinfo("redis://:p%40ss@h:1/0")  # nothing ambiguous: no error


def test_a_remote_urls_password_part_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[str] = []
    real = url_module.check_userinfo

    def counted(url: str) -> None:
        checked.append(url)
        real(url)

    monkeypatch.setattr(url_module, "check_userinfo", counted)
    # Also where a module may have imported it by name.
    monkeypatch.setattr("rdzv.stores.remote.check_userinfo", counted, raising=False)
    parse_remote_url(f"redis://:{PASSWORD}@h:1/0?retries=1", 6379, ("retries",))
    assert checked == [f"redis://:{PASSWORD}@h:1/0?retries=1"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (
            "memory://user:pw@job",
            "memory URL 'memory://user:***@job' has a user:password@ part, which memory "
            "stores do not take; name the store without ':' before an '@'",
        ),
        (
            "sqlite://user:pw@/tmp/x.db?bogus=1",
            "sqlite URL 'sqlite://user:***@/tmp/x.db?bogus=1' has a user:password@ part, "
            "which SQLite files do not take; use sqlite:///abs/path/to/store.db",
        ),
        ("memory://job?b=1&a=2", "memory:// URLs take no query parameters, got ['a', 'b']"),
        (
            "sqlite:///tmp/x.db?bogus=1",
            "unknown query parameter(s) ['bogus'] in 'sqlite:///tmp/x.db?bogus=1'; "
            "supported: ['busy_timeout_ms']",
        ),
        (
            "etcd://h:1?bogus=1",
            "unknown query parameter(s) ['bogus'] in 'etcd://h:1?bogus=1'; supported: [",
        ),
    ],
)
def test_local_and_remote_urls_refuse_what_they_do_not_take_alike(url: str, says: str) -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(url)
    assert says in str(caught.value)


def test_an_at_sign_after_the_host_must_be_percent_encoded() -> None:
    # Indistinguishable from a password holding '/' and '?', so refused, with the fix.
    with pytest.raises(StoreUrlError, match="%40"):
        open_store("redis://h:6379/0?prefix=team@x")


# -- SQLite: busy_timeout_ms ---------------------------------------------------------------


@pytest.mark.parametrize("value", ["2147483648", "3000000000", "99999999999999999999"])
def test_sqlite_busy_timeout_beyond_sqlites_int_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(f"sqlite://{tmp_path}/a.db?busy_timeout_ms={value}")
    message = str(caught.value)
    assert f"from 0 to {MAX_BUSY_TIMEOUT_MS}" in message and repr(value) in message
    assert not (tmp_path / "a.db").exists()


@pytest.mark.parametrize("value", [2**31, 3_000_000_000, -1, True, 1.5])
def test_sqlite_store_refuses_a_busy_timeout_it_cannot_set(tmp_path: Path, value: object) -> None:
    with pytest.raises(ValueError, match=f"from 0 to {MAX_BUSY_TIMEOUT_MS}"):
        SQLiteStore(tmp_path / "a.db", busy_timeout_ms=value)  # type: ignore[arg-type]


def test_sqlite_largest_busy_timeout_is_the_one_sqlite_uses(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path}/a.db?busy_timeout_ms={MAX_BUSY_TIMEOUT_MS}")
    assert isinstance(store, SQLiteStore)
    try:
        # What the store set on its own connection is what SQLite reports back.
        own = store._conn()  # the store's connection for this thread
        assert own.execute("PRAGMA busy_timeout").fetchone()[0] == MAX_BUSY_TIMEOUT_MS
    finally:
        store.close()


# -- SQLite: values written by hand as TEXT (or INTEGER) -----------------------------------


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[tuple[SQLiteStore, sqlite3.Connection]]:
    """A store and a separate connection to its file (what the sqlite3 shell does)."""
    store = SQLiteStore(tmp_path / "s.db", timeout=timedelta(seconds=30))
    shell = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    try:
        yield store, shell
    finally:
        shell.close()
        store.close()


def _typeof(shell: sqlite3.Connection, key: str) -> tuple[str, object]:
    row = shell.execute("SELECT typeof(value), value FROM rdzv_kv WHERE key = ?", (key,))
    kind, value = row.fetchone()
    return str(kind), value


def test_sqlite_text_values_read_as_their_utf8_bytes(
    sqlite_store: tuple[SQLiteStore, sqlite3.Connection],
) -> None:
    store, shell = sqlite_store
    store.set("k", b"old")
    shell.execute("UPDATE rdzv_kv SET value = ? WHERE key = 'k'", ('{"é": 1}',))
    assert _typeof(shell, "k") == ("text", '{"é": 1}')
    data = '{"é": 1}'.encode()
    assert store.get("k") == data
    assert store.try_get("k") == data
    assert store.multi_get(["k", "k"]) == [data, data]
    assert store.wait_for_change("k", data, timedelta(0)) is False
    assert store.wait_for_change("k", b"other", timedelta(0)) is True
    # A mismatch returns the bytes and changes nothing (still TEXT, as found).
    assert store.compare_set("k", b"no", b"x") == data
    assert _typeof(shell, "k") == ("text", '{"é": 1}')
    # A match replaces it.
    assert store.compare_set("k", data, b"new") == b"new"
    assert store.get("k") == b"new"


def test_sqlite_hand_written_counters_work_with_add(
    sqlite_store: tuple[SQLiteStore, sqlite3.Connection],
) -> None:
    store, shell = sqlite_store
    shell.execute("INSERT INTO rdzv_kv (key, value) VALUES ('int', 41), ('text', '9')")
    assert store.get("int") == b"41"
    assert store.add("int", 1) == 42
    assert store.add("text", 1) == 10
    shell.execute("INSERT INTO rdzv_kv (key, value) VALUES ('real', 1.5)")
    with pytest.raises(ValueError, match="not a decimal integer"):
        store.add("real", 1)
    assert _typeof(shell, "real") == ("real", 1.5)


def test_sqlite_a_hand_fixed_state_is_used_by_the_rendezvous_backend(
    sqlite_store: tuple[SQLiteStore, sqlite3.Connection],
) -> None:
    store, shell = sqlite_store
    backend = StoreRendezvousBackend(store, "r")
    first = backend.set_state(b'{"v": 1}')
    assert first is not None and first[2]
    # An operator rewrites the state by hand as TEXT.
    shell.execute(f"UPDATE rdzv_kv SET value = '{{\"v\": 2}}' WHERE key = '{backend.key}'")
    got = backend.get_state()
    assert got is not None and got[0] == b'{"v": 2}'
    written = backend.set_state(b'{"v": 3}', got[1])
    assert written is not None and written[2], written
    assert store.get(backend.key) == b'{"v": 3}'


def test_sqlite_text_members_are_listed_as_bytes(
    sqlite_store: tuple[SQLiteStore, sqlite3.Connection],
) -> None:
    store, shell = sqlite_store
    store.add_member("s", b"b")
    shell.execute("INSERT INTO rdzv_sets (key, member) VALUES ('s', 'a'), ('s', 'c')")
    assert store.members("s") == [b"a", b"b", b"c"]


# -- SQLite: other applications' databases -------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _make_db(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def test_sqlite_refuses_another_applications_database_and_leaves_it_untouched(
    tmp_path: Path,
) -> None:
    path = tmp_path / "app.db"
    _make_db(path, "CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
    before = _digest(path)
    with pytest.raises(RendezvousStateError) as caught:
        open_store(f"sqlite://{path}")
    message = str(caught.value)
    assert str(path) in message and "'orders'" in message
    assert "another application" in message and "file of its own" in message
    assert _digest(path) == before
    assert not Path(f"{path}-wal").exists()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        assert tables == [("orders",)]
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("statement", "table"),
    [
        ("CREATE TABLE rdzv_kv (key TEXT PRIMARY KEY, val BLOB)", "rdzv_kv"),
        ("CREATE TABLE rdzv_kv (key TEXT, value BLOB)", "rdzv_kv"),
        ("CREATE TABLE rdzv_sets (key TEXT PRIMARY KEY, member TEXT)", "rdzv_sets"),
    ],
)
def test_sqlite_refuses_a_foreign_rdzv_table_at_open(
    tmp_path: Path, statement: str, table: str
) -> None:
    path = tmp_path / "foreign.db"
    _make_db(path, statement)
    before = _digest(path)
    with pytest.raises(RendezvousStateError) as caught:
        open_store(f"sqlite://{path}")
    message = str(caught.value)
    assert f"table {table}" in message and str(path) in message
    assert "file of its own" in message
    assert _digest(path) == before


def test_sqlite_reopens_its_own_files(tmp_path: Path) -> None:
    # The checks accept what rdzv itself made (with both tables and their index).
    first = open_store(f"sqlite://{tmp_path}/own.db")
    first.set("k", b"v")
    assert isinstance(first, SQLiteStore)
    first.add_member("s", b"m")
    second = open_store(f"sqlite://{tmp_path}/own.db")
    assert second.get("k") == b"v"
    for store in (first, second):
        assert isinstance(store, SQLiteStore)
        store.close()


# -- Redis: keys of a foreign type ---------------------------------------------------------


@pytest.fixture
def redis_store(redis_server: RedisServer) -> Iterator[tuple[RedisServer, str, RedisStore]]:
    store = RedisStore(cases.fresh_url(redis_server.url), timeout=timedelta(seconds=60))
    try:
        yield redis_server, store.prefix, store
    finally:
        store.close()


def _raises_foreign(call: Callable[[], object], full: str, kind: str) -> None:
    with pytest.raises(RendezvousStateError) as caught:
        call()
    message = str(caught.value)
    assert repr(full) in message and f"holds a Redis {kind}" in message, message
    assert "DEL" in message and "prefix" in message


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hash", "list"])
def test_redis_a_foreign_type_at_a_key_is_a_state_error_and_is_left_as_found(
    redis_store: tuple[RedisServer, str, RedisStore], kind: str
) -> None:
    server, prefix, store = redis_store
    key = "rdzv/r/state"
    full = f"{prefix}:{key}"
    if kind == "hash":
        server.command("HSET", full, "a", "b")
    else:
        server.command("RPUSH", full, "a")
    store.set("other", b"v")
    calls: list[Callable[[], object]] = [
        lambda: store.get(key),
        lambda: store.multi_get(["other", key]),
        lambda: store.wait_get([key]),
        lambda: store.try_get(key),
        lambda: store.check([key]),
        lambda: store.check(["other", key]),
        lambda: store.wait([key]),
        lambda: store.compare_set(key, b"", b"x"),
        lambda: store.compare_set(key, b"a", b"x"),
        lambda: store.add(key, 1),
        lambda: store.wait_for_change(key, None, timedelta(seconds=5)),
        lambda: store.wait_for_change(key, b"v", timedelta(seconds=5)),
        lambda: store.unchanged(key, b"v"),
    ]
    for call in calls:
        _raises_foreign(call, full, kind)
    assert server.command("TYPE", full) == kind.encode()
    if kind == "hash":
        assert server.command("HGETALL", full) == {b"a": b"b"}
    else:
        assert server.command("LRANGE", full, "0", "-1") == [b"a"]
    # The recovery the message names: delete it, and the key is usable again.
    assert store.delete_key(key)
    assert store.compare_set(key, b"", b"x") == b"x"
    assert store.get("other") == b"v"


@pytest.mark.slow
def test_redis_a_foreign_type_at_a_member_set_is_a_state_error(
    redis_store: tuple[RedisServer, str, RedisStore],
) -> None:
    server, prefix, store = redis_store
    full = f"{prefix}#set:joined"
    server.command("SET", full, "not a set")
    for call in (
        lambda: store.add_member("joined", b"m"),
        lambda: store.remove_member("joined", b"m"),
        lambda: store.members("joined"),
    ):
        _raises_foreign(call, full, "string")
    assert server.command("GET", full) == b"not a set"


# -- Redis and etcd: option ranges ---------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("ttl=1e300", "ttl='1e300'"),
        ("ttl=315360001", "ttl='315360001'"),
        ("ttl=0.0001", "ttl='0.0001'"),
        ("ttl=0.999", "ttl='0.999'"),
        ("ttl=0", "ttl='0'"),
        ("ttl=-5", "ttl='-5'"),
        ("ttl=nan", "ttl='nan'"),
        ("ttl=inf", "ttl='inf'"),
    ],
)
def test_redis_ttl_outside_one_second_to_ten_years_is_refused(option: str, says: str) -> None:
    with pytest.raises(StoreUrlError) as caught:
        RedisStore(f"redis://127.0.0.1:1/0?{option}")
    message = str(caught.value)
    assert says in message and "from 1 to 315360000" in message


TOO_LONG = "longer than a day is a hang"
TOO_SHORT = "less than 1 ms fails before any server can answer"


@pytest.mark.parametrize(
    ("url", "name", "why"),
    [
        ("redis://127.0.0.1:1/0?socket_timeout=1e300", "socket_timeout", TOO_LONG),
        ("redis://127.0.0.1:1/0?socket_timeout=0.0001", "socket_timeout", TOO_SHORT),
        ("redis://127.0.0.1:1/0?socket_timeout=0", "socket_timeout", TOO_SHORT),
        ("redis://127.0.0.1:1/0?connect_timeout=86401", "connect_timeout", TOO_LONG),
        ("etcd://127.0.0.1:1?request_timeout=1e300", "request_timeout", TOO_LONG),
        ("etcd://127.0.0.1:1?request_timeout=0", "request_timeout", TOO_SHORT),
        ("etcd://127.0.0.1:1?request_timeout=-inf", "request_timeout", TOO_SHORT),
        ("etcd://127.0.0.1:1?connect_timeout=1e10", "connect_timeout", TOO_LONG),
    ],
)
def test_request_timeouts_outside_a_millisecond_to_a_day_are_refused_saying_why(
    url: str, name: str, why: str
) -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(url)
    message = str(caught.value)
    assert f"{name}=" in message and "from 0.001 to 86400" in message
    assert why in message  # the reason given is the one for the bound crossed
    assert (TOO_SHORT if why == TOO_LONG else TOO_LONG) not in message


@pytest.mark.slow
@pytest.mark.parametrize("ttl", ["1", "315360000"])
def test_redis_ttl_at_either_bound_is_accepted_by_redis(
    redis_server: RedisServer, ttl: str
) -> None:
    store = RedisStore(cases.fresh_url(redis_server.url, ttl=ttl), timeout=timedelta(seconds=5))
    try:
        store.set("k", b"v")
        assert store.compare_set("k", b"v", b"w") == b"w"
        assert store.add("n", 1) == 1
        assert store.add_member("s", b"m") == 1
        for full in (f"{store.prefix}:k", f"{store.prefix}:n", f"{store.prefix}#set:s"):
            pttl = int(redis_server.command("PTTL", full))
            assert 0 < pttl <= int(ttl) * 1000, (full, pttl)
    finally:
        store.close()


@pytest.mark.slow
def test_etcd_timeouts_at_the_bounds_work(etcd_server: EtcdServer) -> None:
    url = cases.fresh_url(etcd_server.url, request_timeout="86400", connect_timeout="86400")
    store = EtcdStore(url, timeout=timedelta(seconds=5))
    try:
        store.set("k", uuid.uuid4().bytes)
        assert store.check(["k"])
    finally:
        store.close()


@pytest.mark.slow
def test_a_handler_meeting_a_foreign_redis_type_raises_a_state_error_naming_the_key(
    redis_server: RedisServer,
) -> None:
    """The store's explanation reaches the caller as a state error, not as "check that
    the store is running" (the server is running; the data at the key is foreign)."""
    url = cases.fresh_url(redis_server.url)
    store = RedisStore(url, timeout=timedelta(seconds=60))
    run_id = f"foreign-{uuid.uuid4().hex}"
    handler = create_handler(
        RendezvousParameters(backend="rdzv", endpoint=url, run_id=run_id, min_nodes=1, max_nodes=1)
    )
    try:
        full = f"{store.prefix}:rdzv/{run_id}/state"
        redis_server.command("HSET", full, "a", "b")
        with pytest.raises(RendezvousStateError) as caught:
            handler.num_nodes_waiting()
        message = str(caught.value)
        assert "found foreign data in the store" in message and repr(full) in message
        assert "holds a Redis hash" in message and "check that the store is running" not in message
        assert redis_server.command("HGETALL", full) == {b"a": b"b"}
    finally:
        handler.shutdown()
        store.close()


# -- a missing client library names the extra that installs it -----------------------------


@pytest.mark.parametrize(
    ("url", "module", "extra"),
    [
        ("redis://127.0.0.1:1/0", "redis", "redis"),
        ("rediss://127.0.0.1:1/0", "redis", "redis"),
        ("etcd://127.0.0.1:1", "httpx", "etcd"),
    ],
)
def test_a_missing_client_library_is_one_line_naming_the_extra(
    url: str, module: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes `import <module>` fail as if it were not installed.
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ModuleNotFoundError) as raised:
        open_store(url)
    message = str(raised.value)
    assert message.endswith(f"install it with: pip install 'rdzv[{extra}]'"), message
    assert f"needs the {module!r} package" in message and "\n" not in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    # Through the handler's parameters, as a torch user would meet it.
    params = RendezvousParameters(
        backend="rdzv", endpoint=url, run_id="r", min_nodes=1, max_nodes=1
    )
    with pytest.raises(ModuleNotFoundError, match=re.escape(f"pip install 'rdzv[{extra}]'")):
        create_handler(params)


def test_a_broken_client_library_keeps_its_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The library is there but one of its own imports fails: installing the extra would
    # not help, so the real error is not replaced.
    import importlib

    real = importlib.import_module

    def broken(name: str) -> object:
        if name == "redis":
            raise ModuleNotFoundError("No module named 'async_timeout'", name="async_timeout")
        return real(name)

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="async_timeout") as raised:
        open_store("redis://127.0.0.1:1/0")
    assert "rdzv[redis]" not in str(raised.value)
