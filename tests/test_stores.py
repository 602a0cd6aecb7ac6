"""The memory and SQLite stores, open_store's URLs, and their failure behaviour.

Conformance itself is one call to :func:`rdzv.testing.check_store` per backend; the
tests below pin what the suite does not: URL parsing, errors naming the path and the
fix, the registry, and that stored bytes are never unpickled.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import multiprocessing
import pickle
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import store_cases as cases

import rdzv.clock
import rdzv.testing
from rdzv.errors import RendezvousConnectionError, StoreTimeoutError
from rdzv.store import PrefixStore, SetStore, Store, require_set_store
from rdzv.stores import (
    MemoryStore,
    SQLiteStore,
    drop_memory_store,
    memory_store_names,
    open_store,
    register_scheme,
    supported_schemes,
    unregister_scheme,
)
from rdzv.stores.url import redact
from rdzv.testing import check_store

ROOT = Path(__file__).resolve().parent.parent
SHORT = timedelta(milliseconds=50)


def close_store(store: object) -> None:
    """Close ``store`` (the Store protocol has no ``close``; every rdzv store has one, and
    closing one twice is harmless)."""
    getattr(store, "close", lambda: None)()


@contextlib.contextmanager
def opened_store(url: str) -> Iterator[Store]:
    """``open_store(url)``, closed when the block ends, also when it fails."""
    store = open_store(url)
    try:
        yield store
    finally:
        close_store(store)


class SQLiteFiles:
    """Fresh database files in one temporary directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._numbers = itertools.count()

    def path(self) -> Path:
        return self.directory / f"store-{next(self._numbers)}.db"

    def store(self) -> SQLiteStore:
        return SQLiteStore(self.path())


@pytest.fixture
def files(tmp_path: Path) -> SQLiteFiles:
    return SQLiteFiles(tmp_path)


@pytest.fixture
def memory_names() -> Iterator[list[str]]:
    """Names of memory stores a test opens; dropped afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        drop_memory_store(name)


# -- conformance ------------------------------------------------------------------------


def test_memory_store_conforms() -> None:
    check_store(MemoryStore, sets=True)


def test_named_memory_stores_conform(memory_names: list[str]) -> None:
    numbers = itertools.count()

    def factory() -> Store:
        memory_names.append(f"conformance-{next(numbers)}")
        return open_store(f"memory://{memory_names[-1]}")

    check_store(factory, sets=True)


@pytest.mark.slow
def test_sqlite_store_conforms_across_threads_and_processes(files: SQLiteFiles) -> None:
    check_store(files.store, url=f"sqlite://{files.path()}", sets=True)


class SplitHandles:
    """Writes through one SQLiteStore, reads and waits through another on the same file.

    Two handles share no condition variable, so every wake-up here goes through the
    cross-connection path (``PRAGMA data_version``) that other processes rely on.
    """

    def __init__(self, path: Path) -> None:
        self.writer = SQLiteStore(path)
        self.reader = SQLiteStore(path)

    def __repr__(self) -> str:
        return f"SplitHandles({self.reader.path!r})"

    def close(self) -> None:
        self.writer.close()
        self.reader.close()

    @property
    def timeout(self) -> timedelta:
        return self.reader.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self.reader.set_timeout(timeout)
        self.writer.set_timeout(timeout)

    def set(self, key: str, value: bytes | str) -> None:
        self.writer.set(key, value)

    def get(self, key: str) -> bytes:
        return self.reader.get(key)

    def add(self, key: str, amount: int) -> int:
        return self.writer.add(key, amount)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return self.writer.compare_set(key, expected, desired)

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        self.reader.wait(keys, timeout)

    def check(self, keys: Sequence[str]) -> bool:
        return self.reader.check(keys)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return self.reader.multi_get(keys)

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        self.writer.multi_set(keys, values)

    def delete_key(self, key: str) -> bool:
        return self.writer.delete_key(key)

    def num_keys(self) -> int:
        return self.reader.num_keys()

    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool:
        return self.reader.wait_for_change(key, current, timeout)

    def add_member(self, key: str, member: bytes | str) -> int:
        return self.writer.add_member(key, member)

    def remove_member(self, key: str, member: bytes | str) -> int:
        return self.writer.remove_member(key, member)

    def members(self, key: str) -> list[bytes]:
        return self.reader.members(key)

    def try_get(self, key: str) -> bytes | None:
        return self.reader.try_get(key)


def test_sqlite_wakeups_across_connections_conform(files: SQLiteFiles) -> None:
    check_store(lambda: SplitHandles(files.path()), sets=True)


def test_the_testing_module_re_exports_the_fake_clock() -> None:
    assert rdzv.testing.FakeClock is rdzv.clock.FakeClock


# -- open_store and URLs ----------------------------------------------------------------


def test_memory_urls_with_one_name_share_data(memory_names: list[str]) -> None:
    memory_names.append("shared-job")
    first = open_store("memory://shared-job")
    second = open_store("memory://shared-job", timeout=SHORT)
    first.set("k", b"v")
    assert second.get("k") == b"v"
    assert second.timeout == SHORT and first.timeout == timedelta(seconds=300)
    assert "shared-job" in memory_store_names()

    other = open_store("memory://other-job", timeout=SHORT)
    memory_names.append("other-job")
    assert not other.check(["k"])

    assert drop_memory_store("shared-job") is True
    assert drop_memory_store("shared-job") is False
    assert not open_store("memory://shared-job").check(["k"])
    assert first.get("k") == b"v"  # handles opened before the drop keep their data


def test_a_private_memory_store_shares_nothing() -> None:
    a, b = MemoryStore(timeout=SHORT), MemoryStore(timeout=SHORT)
    a.set("k", b"v")
    assert not b.check(["k"])


def test_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = open_store(f"sqlite://{tmp_path}/abs.db", timeout=SHORT)
    assert isinstance(absolute, SQLiteStore)
    assert absolute.path == str(tmp_path / "abs.db") and absolute.timeout == SHORT

    monkeypatch.chdir(tmp_path)
    relative = open_store("sqlite://sub%20dir.db?busy_timeout_ms=250")
    assert isinstance(relative, SQLiteStore)
    assert relative.path == str(tmp_path / "sub dir.db")
    relative.set("k", b"v")
    again = open_store(f"SQLITE://{tmp_path}/sub%20dir.db")
    assert again.get("k") == b"v"
    for store in (absolute, relative, again):
        assert isinstance(store, SQLiteStore)
        store.close()


UNKNOWN_OR_MALFORMED = [
    "",
    "memory",
    "no-scheme-here",
    "://x",
    "1abc://x",
    " memory://x",
    "memory://x\n",
    "foo://x",
    "file:///tmp/x.db",
]


@pytest.mark.parametrize("url", UNKNOWN_OR_MALFORMED)
def test_unknown_or_malformed_urls_list_the_supported_schemes(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        open_store(url)
    message = str(caught.value)
    assert "supported schemes" in message
    for scheme in ("memory", "sqlite"):
        assert f"{scheme} (e.g. {scheme}://" in message


def test_a_non_string_url_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="must be a str, got int"):
        open_store(123)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("memory://", "needs a non-empty name"),
        ("memory://a?b=1", "take no query parameters"),
        ("memory://a b", "whitespace"),
        ("memory://a#b", "no fragment"),
        ("sqlite://", "names no file"),
        ("sqlite:///", "names no file"),
        ("sqlite://:memory:", "in-memory SQLite cannot be shared"),
        ("sqlite:///tmp/x.db?bogus=1", "unknown query parameter(s) ['bogus']"),
        ("sqlite:///tmp/x.db?busy_timeout_ms=soon", "whole number of milliseconds"),
        ("sqlite:///tmp/x.db?busy_timeout_ms=-5", "whole number of milliseconds"),
        ("sqlite:///tmp/x.db?busy_timeout_ms=1&busy_timeout_ms=2", "given twice"),
    ],
)
def test_backend_url_errors_say_what_is_wrong_with_an_example(url: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        open_store(url)
    message = str(caught.value)
    assert says in message
    assert "e.g. memory://job1" in message or "e.g. sqlite:///" in message


def test_passwords_are_redacted_in_url_errors() -> None:
    with pytest.raises(ValueError) as caught:
        open_store("foo://user:s3cret@host:1234/0")
    assert "s3cret" not in str(caught.value)
    assert "foo://user:***@host:1234/0" in str(caught.value)
    assert redact("redis://:pw@h/0") == "redis://:***@h/0"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"


def test_open_store_rejects_a_bad_timeout() -> None:
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        open_store("memory://x", timeout=timedelta(seconds=-1))
    with pytest.raises(TypeError, match=r"must be a datetime\.timedelta"):
        open_store("memory://x", timeout=5)  # type: ignore[arg-type]


def _open_private_memory(url: str, timeout: timedelta) -> Store:
    return MemoryStore(timeout=timeout)


def test_register_scheme() -> None:
    assert "custom" not in supported_schemes()
    try:
        register_scheme("Custom", _open_private_memory, example="custom://anything")
        assert "custom" in supported_schemes()
        store = open_store("custom://x", timeout=SHORT)
        assert isinstance(store, MemoryStore) and store.timeout == SHORT
        register_scheme("custom", _open_private_memory)  # the same opener again: no-op
        with pytest.raises(ValueError, match="already registered"):
            register_scheme("custom", MemoryStore.named)  # type: ignore[arg-type]
        with pytest.raises(ValueError) as caught:
            open_store("nope://x")
        assert "custom (e.g. custom://anything)" in str(caught.value)
    finally:
        assert unregister_scheme("custom") is True
    assert "custom" not in supported_schemes()
    assert unregister_scheme("custom") is False


def test_register_scheme_by_reference_imports_lazily() -> None:
    try:
        register_scheme("lazy", "rdzv.stores:_open_memory")
        register_scheme("missing", "rdzv.no_such_module:open", example="missing://x")
        store = open_store("lazy://lazy-test", timeout=SHORT)
        assert isinstance(store, MemoryStore)
        with pytest.raises(ImportError, match=r"needs module rdzv\.no_such_module"):
            open_store("missing://x")
    finally:
        unregister_scheme("lazy")
        unregister_scheme("missing")
        drop_memory_store("lazy-test")


def test_remote_schemes_are_registered_but_not_imported() -> None:
    assert {"redis", "rediss", "etcd", "etcds"} <= set(supported_schemes())
    script = (
        "import sys, rdzv.stores, rdzv.testing; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('redis', 'httpx') or m in ('rdzv.stores.redis', 'rdzv.stores.etcd')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("scheme", "opener", "error"),
    [
        ("", _open_private_memory, "invalid URL scheme"),
        ("9p", _open_private_memory, "invalid URL scheme"),
        ("a b", _open_private_memory, "invalid URL scheme"),
        ("ok", "no_colon", "must look like 'package.module:function'"),
        ("ok", 42, "must be callable"),
    ],
)
def test_register_scheme_rejects_bad_arguments(scheme: str, opener: object, error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        register_scheme(scheme, opener)  # type: ignore[arg-type]
    assert "ok" not in supported_schemes()


# -- behaviour beyond the contract, shared by both backends -------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, files: SQLiteFiles) -> Iterator[Store]:
    made: Store = MemoryStore(timeout=SHORT) if request.param == "memory" else files.store()
    made.set_timeout(SHORT)
    yield made
    if isinstance(made, SQLiteStore):
        made.close()


def test_add_on_a_non_counter_is_a_clear_error(store: Store) -> None:
    for value in (b"abc", b" 5", b"1_0", b"", "\u0665".encode()):
        store.set("k", value)
        with pytest.raises(ValueError, match="not a decimal integer"):
            store.add("k", 1)
        assert store.get("k") == value


def test_bad_arguments_are_rejected(store: Store) -> None:
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        store.multi_set(["a", "b"], [b"1"])
    assert not store.check(["a"])
    with pytest.raises(TypeError, match="keys must be str, got int"):
        store.set(1, b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be bytes or str, got int"):
        store.set("k", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence of keys, got a single str"):
        store.check("abc")
    with pytest.raises(TypeError, match="int amount"):
        store.add("n", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        store.set_timeout(timedelta(seconds=-1))
    assert store.timeout == SHORT


def test_timeout_errors_name_the_keys_and_the_store(store: Store) -> None:
    with pytest.raises(StoreTimeoutError) as caught:
        store.multi_get(["there", "missing-one"])
    message = str(caught.value)
    assert "'missing-one'" in message and "raise the store timeout" in message
    assert ("memory://" in message) or ("sqlite://" in message)
    assert isinstance(caught.value, TimeoutError)


# -- member sets: what the kit does not cover --------------------------------------------


@pytest.mark.parametrize("module", ["rdzv.stores.memory", "rdzv.stores.sqlite"])
def test_a_full_member_set_refuses_new_members(
    module: str, files: SQLiteFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 stands in for the real bound of 1,000,000 members.
    monkeypatch.setattr(f"{module}.MAX_SET_MEMBERS", 3)
    store = MemoryStore() if module.endswith("memory") else files.store()
    assert isinstance(store, SetStore)
    assert [store.add_member("s", m) for m in (b"a", b"b", b"c")] == [1, 2, 3]
    with pytest.raises(ValueError, match=r"set 's' in (memory|sqlite)://.* already holds 3 memb"):
        store.add_member("s", b"d")
    assert store.add_member("s", b"b") == 3  # a member already present is not refused
    assert store.members("s") == [b"a", b"b", b"c"]
    assert store.add_member("other", b"d") == 1  # the bound is per set
    if isinstance(store, SQLiteStore):
        store.close()


class MemoryWithout:
    """A correct memory store that lacks the methods named in ``LACKS`` (like torch's own
    stores, or a store written before a method existed)."""

    LACKS: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        if name in self.LACKS:
            raise AttributeError(name)
        return getattr(self._inner, name)


class TorchLikeStore(MemoryWithout):
    """A correct store without member sets (like torch's own stores)."""

    LACKS = ("add_member", "remove_member", "members", "try_get")


class NoRemoveStore(MemoryWithout):
    """A store with every member-set method but ``remove_member`` (written before it)."""

    LACKS = ("remove_member",)


def test_require_set_store_names_the_store_and_the_fix() -> None:
    plain = TorchLikeStore()
    assert isinstance(plain, Store) and not isinstance(plain, SetStore)
    with pytest.raises(TypeError) as caught:
        require_set_store(plain, "the scale protocol")
    message = str(caught.value)
    assert message.startswith("the scale protocol needs a store with member sets")
    assert "(add_member, remove_member, members, try_get)" in message
    assert "TorchLikeStore lacks add_member, remove_member, members, try_get;" in message
    assert "memory://, sqlite://, redis:// or etcd://" in message
    # A PrefixStore has the methods but passes only when the store under it does.
    over_plain = PrefixStore("p", plain)
    with pytest.raises(TypeError, match="TorchLikeStore lacks"):
        require_set_store(over_plain, "the scale protocol")
    with pytest.raises(TypeError, match=r"PrefixStore.add_member needs a store with member sets"):
        over_plain.add_member("s", b"m")
    with pytest.raises(TypeError, match=r"PrefixStore.remove_member needs a store with member"):
        over_plain.remove_member("s", b"m")
    # A store lacking only remove_member is not a SetStore, and the error says what it lacks.
    older = NoRemoveStore()
    assert not isinstance(older, SetStore)
    with pytest.raises(TypeError, match=r"NoRemoveStore lacks remove_member;"):
        require_set_store(older, "the scale protocol")
    memory = MemoryStore()
    assert require_set_store(memory, "x") is memory
    over_memory = PrefixStore("p", memory)
    assert require_set_store(over_memory, "x") is over_memory


def test_sqlite_keeps_sets_in_their_own_table(files: SQLiteFiles) -> None:
    path = files.path()
    # A file written before member sets existed gains the table when opened.
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE rdzv_kv (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL) WITHOUT ROWID"
    )
    old.execute("INSERT INTO rdzv_kv VALUES ('k', x'76')")
    old.commit()
    old.close()
    store = SQLiteStore(path)
    assert store.add_member("k", b"\x00m") == 1
    assert store.try_get("k") == b"v" and store.num_keys() == 1
    store.close()
    raw = sqlite3.connect(path)
    try:
        rows = raw.execute("SELECT key, typeof(member), member FROM rdzv_sets").fetchall()
        assert rows == [("k", "blob", b"\x00m")]
    finally:
        raw.close()


def test_removing_the_last_member_leaves_nothing_behind(files: SQLiteFiles) -> None:
    # An emptied set is an absent one: no row in SQLite, no entry in memory.
    path = files.path()
    sqlite_store = SQLiteStore(path)
    memory = MemoryStore()
    for store in (sqlite_store, memory):
        assert store.add_member("s", b"a") == 1
        assert store.add_member("t", b"a") == 1
        assert store.remove_member("s", b"a") == 0
    sqlite_store.close()
    assert sorted(memory._shared.sets) == ["t"]
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("SELECT key, member FROM rdzv_sets").fetchall() == [("t", b"a")]
    finally:
        raw.close()


def _remove_in_child(path: str, member: str, out: str) -> None:
    """A spawned child: remove ``member`` from set 's' of the SQLite file at ``path``."""
    store = SQLiteStore(path)
    try:
        Path(out).write_text(str(store.remove_member("s", member)))
    finally:
        store.close()


def test_sqlite_remove_member_in_another_process_is_seen(files: SQLiteFiles) -> None:
    # What one process removes, another connection sees at once (committed, not cached),
    # and the size the remover got counts what the other process added.
    path = files.path()
    store = SQLiteStore(path)
    for member in (b"a", b"b", b"c"):
        store.add_member("s", member)
    out = path.with_suffix(".out")
    child = multiprocessing.get_context("spawn").Process(
        target=_remove_in_child, args=(str(path), "b", str(out))
    )
    child.start()
    try:
        child.join(60)  # bound: interpreter start-up on a loaded machine
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join(60)
    assert out.read_text() == "2"
    assert store.members("s") == [b"a", b"c"]
    assert store.remove_member("s", b"b") == 2  # already gone: a no-op
    store.close()


# -- SQLite failures: each raises RendezvousConnectionError naming the path ------------


def test_sqlite_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "x.db"
    with pytest.raises(RendezvousConnectionError) as caught:
        open_store(f"sqlite://{path}")
    assert str(path) in str(caught.value) and "does not exist" in str(caught.value)
    assert not path.parent.exists()


def test_sqlite_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("not a directory")
    path = tmp_path / "plain-file" / "x.db"
    with pytest.raises(RendezvousConnectionError, match="does not exist"):
        SQLiteStore(path)


def test_sqlite_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(RendezvousConnectionError, match="it is a directory"):
        SQLiteStore(tmp_path)


def test_sqlite_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    text = b"these are my notes, not a database\n" * 200
    path.write_bytes(text)
    with pytest.raises(RendezvousConnectionError) as caught:
        open_store(f"sqlite://{path}")
    assert str(path) in str(caught.value)
    assert "not a usable SQLite database" in str(caught.value)
    assert path.read_bytes() == text  # left untouched


def _open_together(path: str, barrier: Any, out: str) -> None:
    """Child process: once every child is started (``barrier``), open and close the store
    at ``path``; write ``ok`` or the error to ``out``."""
    import threading

    try:
        barrier.wait()  # bounded by the barrier's timeout
        SQLiteStore(path, busy_timeout_ms=30_000).close()
        Path(out).write_text("ok")
    except (RendezvousConnectionError, threading.BrokenBarrierError) as exc:
        Path(out).write_text(f"error: {type(exc).__name__}: {exc}")


def test_sqlite_processes_opening_a_new_file_together_all_succeed(tmp_path: Path) -> None:
    # Several processes creating one file at once used to get "database is locked" at
    # once (SQLite refuses a lock upgrade that could deadlock, without waiting); about
    # half of such rounds failed before opens were retried. The children meet at a
    # barrier, so they open together however late each one started.
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    for round_ in range(4):
        folder = tmp_path / f"r{round_}"
        folder.mkdir()
        path = str(folder / "rdzv.db")
        outs = [str(folder / f"out{i}") for i in range(5)]
        # Bound: interpreter start-up of every child on a loaded machine.
        barrier = ctx.Barrier(len(outs), timeout=60)
        procs: list[multiprocessing.process.BaseProcess] = []
        try:
            for out in outs:
                proc = ctx.Process(target=_open_together, args=(path, barrier, out), daemon=True)
                proc.start()
                procs.append(proc)  # before the next one starts: the finally stops each
            for p in procs:
                p.join(120)  # bound: the barrier's 60 s, then one open
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(60)
        results = [Path(out).read_text() if Path(out).exists() else "no result" for out in outs]
        assert results == ["ok"] * len(outs), results


def test_sqlite_locked_database_fails_fast_and_recovers(files: SQLiteFiles) -> None:
    path = files.path()
    store = open_store(f"sqlite://{path}?busy_timeout_ms=10", timeout=SHORT)
    assert isinstance(store, SQLiteStore)
    store.set("k", b"before")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("INSERT OR REPLACE INTO rdzv_kv VALUES ('other', x'00')")
        writes: list[Callable[[], object]] = [
            lambda: store.set("k", b"x"),
            lambda: store.compare_set("k", b"before", b"x"),
            lambda: store.add("n", 1),
            lambda: store.multi_set(["a"], [b"1"]),
            lambda: store.delete_key("k"),
            lambda: store.add_member("s", b"m"),
            lambda: store.remove_member("s", b"m"),
        ]
        for write in writes:
            with pytest.raises(RendezvousConnectionError) as caught:
                write()
            message = str(caught.value)
            assert "is locked" in message and str(path) in message
            assert "busy_timeout_ms" in message
        assert store.get("k") == b"before"  # WAL: readers are not blocked by the writer
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.compare_set("k", b"before", b"after") == b"after"
    assert store.add("n", 1) == 1
    assert store.add_member("s", b"m") == 1
    assert store.remove_member("s", b"m") == 0
    store.close()


def test_sqlite_exclusive_lock_fails_open_and_reads_with_a_clear_error(
    files: SQLiteFiles,
) -> None:
    path = files.path()
    first = SQLiteStore(path, timeout=SHORT, busy_timeout_ms=10)
    first.set("k", b"v")
    first.close()
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        # Exclusive locking mode keeps the lock after the commit, even from readers.
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("INSERT OR REPLACE INTO rdzv_kv VALUES ('other', x'00')")
        with pytest.raises(RendezvousConnectionError) as caught:
            SQLiteStore(path, timeout=SHORT, busy_timeout_ms=10)
        assert "is locked" in str(caught.value) and str(path) in str(caught.value)
    finally:
        holder.close()
    again = SQLiteStore(path, timeout=SHORT, busy_timeout_ms=10)
    assert again.multi_get(["k", "other"]) == [b"v", b"\x00"]
    again.close()


@pytest.mark.parametrize(
    ("sqlite_message", "says"),
    [
        ("attempt to write a readonly database", "this user can write the file and the directory"),
        ("unable to open database file", "check that directory"),
        ("disk I/O error", "local filesystem"),
        ("database disk image is malformed", "not a usable SQLite database"),
        ("database is locked", "is locked"),
        ("something else entirely", "check the file and its directory"),
    ],
)
def test_sqlite_errors_become_connection_errors_with_advice(
    files: SQLiteFiles, sqlite_message: str, says: str
) -> None:
    # Root ignores file permissions, so an unwritable file cannot be staged here; the
    # translation of SQLite's own messages is checked directly instead.
    store = files.store()
    error = store._error(sqlite3.OperationalError(sqlite_message), "testing")
    assert isinstance(error, RendezvousConnectionError)
    assert says in str(error) and store.path in str(error) and sqlite_message in str(error)
    store.close()


def test_sqlite_closed_store(files: SQLiteFiles) -> None:
    cases.check_a_closed_store_refuses_calls(files.store())


def test_sqlite_stores_blobs_and_ascii_counters(files: SQLiteFiles) -> None:
    store = files.store()
    store.set("b", bytes(range(256)))
    store.set("s", "text")
    store.add("n", 12)
    store.close()
    raw = sqlite3.connect(store.path)
    try:
        rows = raw.execute("SELECT key, typeof(value), value FROM rdzv_kv ORDER BY key").fetchall()
        assert rows == [
            ("b", "blob", bytes(range(256))),
            ("n", "blob", b"12"),
            ("s", "blob", b"text"),
        ]
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        raw.close()


# -- nothing ever unpickles ---------------------------------------------------------------

EXECUTED: list[str] = []


def _record(tag: str) -> None:
    EXECUTED.append(tag)


class _Payload:
    """Unpickling this runs ``_record``: the stores must hand back the bytes untouched."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_record, ("unpickled!",))


def test_pickled_bytes_are_returned_verbatim_and_never_run(store: Store) -> None:
    payload = pickle.dumps(_Payload())
    EXECUTED.clear()
    store.set("evil", payload)
    store.multi_set(["evil2"], [payload])
    assert store.compare_set("evil3", b"", payload) == payload
    assert store.get("evil") == payload
    assert store.multi_get(["evil2", "evil3"]) == [payload, payload]
    assert store.wait_for_change("evil", payload, SHORT) is False
    assert EXECUTED == []


def test_conformance_runs_with_unpickling_disabled(
    files: SQLiteFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("a store unpickled data")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    check_store(MemoryStore, threads=2, increments=5, sets=True)
    check_store(files.store, threads=2, increments=5, sets=True)


@pytest.mark.parametrize(
    "path",
    [*sorted((ROOT / "rdzv" / "stores").glob("*.py")), ROOT / "rdzv" / "testing.py"],
    ids=lambda p: p.name,
)
def test_store_modules_import_no_deserializer(path: Path) -> None:
    forbidden = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "_pickle"}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    assert not (found & forbidden), f"{path.name} imports {sorted(found & forbidden)}"


# -- reads after a wake-up (used by test_store_redis and test_store_etcd) ----------------------
IO_METHODS = ("get", "multi_get", "check", "try_get", "unchanged")
"""Store calls that go to the server to learn a key's value."""


class CountingStore:
    """Forwards to ``store`` and records the names of its value-reading calls."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if name not in IO_METHODS:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return counted


def check_one_read_per_change(open_store_: Callable[[], Any], run_id: str) -> None:
    """A node that waited for a state change reads the new state with one small
    confirmation (the wait brought the value along), never with a second transfer of the
    value; an unchanged state costs one confirmation; a state that moved on again after
    the wake-up is read in full. Also: ``wait_get`` of the bootstrap keys."""
    from rdzv.backend import StoreRendezvousBackend

    counting = CountingStore(open_store_())
    writer_store = open_store_()
    try:
        reader = StoreRendezvousBackend(counting, run_id)
        writer = StoreRendezvousBackend(writer_store, run_id)
        assert reader.get_state() is None
        assert writer.set_state(b"v1", None) == (b"v1", b"v1", True)
        assert reader.wait_for_change(None, 5.0)
        counting.calls.clear()
        assert reader.get_state() == (b"v1", b"v1")
        assert counting.calls == ["unchanged"]
        for old, new in ((b"v1", b"v2" * 500), (b"v2" * 500, b"v3")):
            assert writer.set_state(new, old) == (new, new, True)
            assert reader.wait_for_change(old, 5.0)
            counting.calls.clear()
            assert reader.get_state() == (new, new)
            assert counting.calls == ["unchanged"], f"after the change to {new[:8]!r}"
        # Unchanged: one confirmation of the bytes already held.
        counting.calls.clear()
        assert reader.get_state() == (b"v3", b"v3")
        assert counting.calls == ["unchanged"]
        # The state moved on after the wake-up: the value the wait saw is stale, so the
        # confirmation fails and the state is read.
        assert writer.set_state(b"v4", b"v3") == (b"v4", b"v4", True)
        assert reader.wait_for_change(b"v3", 5.0)
        assert writer.set_state(b"v5", b"v4") == (b"v5", b"v5", True)
        counting.calls.clear()
        assert reader.get_state() == (b"v5", b"v5")
        assert counting.calls == ["unchanged", "try_get"]
        # wait_get: the wait's own read returns the values; a missing key times out.
        prefixed = PrefixStore(f"{run_id}/round", writer_store)
        prefixed.multi_set(["a", "b"], [b"1", b"2"])
        assert PrefixStore(f"{run_id}/round", counting.store).wait_get(["a", "b"], SHORT) == [
            b"1",
            b"2",
        ]
        with pytest.raises(StoreTimeoutError, match="'absent'"):
            counting.store.wait_get(["absent"], timedelta(0))
    finally:
        for store in (counting.store, writer_store):
            store.close()


def test_prefix_store_wait_get_falls_back_to_wait_and_multi_get() -> None:
    store = MemoryStore()
    assert not hasattr(store, "wait_get")
    prefixed = PrefixStore("p", store)
    store.multi_set(["p/a", "p/b"], [b"1", b"2"])
    assert prefixed.wait_get(["a", "b"], SHORT) == [b"1", b"2"]
    with pytest.raises(StoreTimeoutError):
        prefixed.wait_get(["a", "missing"], SHORT)


# -- bounded retries of the network stores (rdzv.stores.remote) ------------------------------
def test_backoff_doubles_from_the_minimum_up_to_the_cap() -> None:
    from rdzv.stores.remote import RETRY_DELAY_MAX_S, RETRY_DELAY_MIN_S, backoff_delays

    delays = backoff_delays(8)
    assert len(delays) == 8 and backoff_delays(0) == []
    assert delays[0] == RETRY_DELAY_MIN_S
    for before, after in itertools.pairwise(delays):
        assert after == min(before * 2, RETRY_DELAY_MAX_S)
    assert delays[-1] == RETRY_DELAY_MAX_S


def test_the_docs_give_the_default_backoff_total() -> None:
    # The docs quote the total backoff of the default retries; keep them true.
    from rdzv.stores import remote

    total = f"{sum(remote.backoff_delays(remote.DEFAULT_RETRIES)):.2f} s"
    docs = Path(__file__).resolve().parent.parent / "docs"
    for page, times in (("stores.md", 2), ("handler.md", 1)):
        assert (docs / page).read_text().count(total) >= times, f"{page} should say {total}"
    assert total in Path(remote.__file__).read_text(), "DEFAULT_RETRIES's docstring"


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_with_retries_tries_retries_plus_one_times_then_fails(
    retries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rdzv.stores.remote as remote

    slept: list[float] = []
    monkeypatch.setattr("rdzv.stores.remote.time.sleep", slept.append)
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        raise ConnectionError("refused")

    def fail(exc: BaseException, attempts: int) -> RendezvousConnectionError:
        return RendezvousConnectionError(f"gave up after {attempts} attempt(s): {exc}")

    with pytest.raises(RendezvousConnectionError, match=rf"after {retries + 1} attempt\(s\)"):
        remote.with_retries(
            flaky, retries=retries, transient=lambda e: isinstance(e, ConnectionError), fail=fail
        )
    assert len(calls) == retries + 1
    assert slept == remote.backoff_delays(retries)


def _missing_key() -> str:
    raise KeyError("x")


def test_with_retries_recovers_and_passes_other_errors_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rdzv.stores.remote as remote

    monkeypatch.setattr("rdzv.stores.remote.time.sleep", lambda _: None)
    outcomes: list[BaseException | str] = [ConnectionError("blip"), ConnectionError("blip"), "ok"]

    def call() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def never(exc: BaseException, attempts: int) -> RendezvousConnectionError:
        raise AssertionError("a recovered call must not fail")

    transient = lambda e: isinstance(e, ConnectionError)  # noqa: E731
    assert remote.with_retries(call, retries=2, transient=transient, fail=never) == "ok"
    with pytest.raises(KeyError):  # not transient: raised at once, unchanged
        remote.with_retries(_missing_key, retries=5, transient=transient, fail=never)
