"""A store in one SQLite file (``sqlite:///abs/path.db``), shared by processes on one host.

Theory of operation:

- One table ``rdzv_kv(key TEXT PRIMARY KEY, value BLOB)``; values are raw bytes, never
  decoded or unpickled. ``add`` keeps decimal ASCII digits, as torch does.
- Member sets (:class:`~rdzv.store.SetStore`) live in a second table
  ``rdzv_sets(key TEXT, member BLOB, PRIMARY KEY (key, member))``, so ``num_keys`` (a
  count of ``rdzv_kv``) never sees them. Both tables are created with ``IF NOT EXISTS``
  at every connect, so a file written by an older rdzv gains the second table on first
  open. ``add_member`` is ``INSERT OR IGNORE`` plus a count of the set in one
  ``BEGIN IMMEDIATE`` transaction, ``remove_member`` a ``DELETE`` of the member's row
  plus the same count (a set is its rows: removing the last one leaves none).
- WAL journal mode, so readers never block the writer and vice versa; a writer waits up
  to ``busy_timeout_ms`` for another writer, then the call raises
  :class:`~rdzv.errors.RendezvousConnectionError` (a lock is reported, never waited on
  forever).
- Read-modify-write operations (``compare_set``, ``add``, ``multi_set``) run in
  ``BEGIN IMMEDIATE`` transactions: the write lock is taken before the read, so two
  processes can never both see the old value.
- One connection per thread (sqlite3 connections must not be used by two threads at
  once), opened lazily and closed by :meth:`SQLiteStore.close`; a process that forked
  opens its own.
- Blocking calls poll ``PRAGMA data_version`` (a counter that moves when another
  connection commits; reading it costs no table access) with a backoff from
  ``POLL_MIN_S`` to ``POLL_MAX_S``, and re-read the keys only when it moved. Writes made
  through this same store object also wake local waiters at once through a condition.

The file must be on a local filesystem (WAL needs shared memory between processes).

Foreign data:

- A file that holds tables other than rdzv's belongs to another application: opening it
  raises :class:`~rdzv.errors.RendezvousStateError` before anything is written (no rdzv
  tables are added and the journal mode is not switched to WAL). So does a file whose
  ``rdzv_kv`` or ``rdzv_sets`` table has another shape than rdzv creates.
- Values are read as ``CAST(value AS BLOB)``: a value someone stored by hand as TEXT
  (``UPDATE rdzv_kv SET value = '...'`` in the sqlite3 shell) reads as its bytes (UTF-8,
  the encoding of every database rdzv creates), an INTEGER or REAL as its decimal text,
  so such a hand fix works and ``compare_set`` compares against those bytes. Member
  sets are read the same way.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TypeVar
from urllib.parse import unquote

from rdzv.errors import RendezvousConnectionError, RendezvousStateError
from rdzv.store import DEFAULT_STORE_TIMEOUT, MAX_SET_MEMBERS, as_bytes
from rdzv.stores.common import (
    BaseStore,
    cas_refusal,
    check_amount,
    check_key,
    check_keys,
    check_member,
    check_pairs,
    encode_counter,
    parse_counter,
    set_full_error,
    timeout_error,
    wait_seconds,
)
from rdzv.stores.url import StoreUrlError, redact, split_query, split_url

SCHEME = "sqlite"
DEFAULT_BUSY_TIMEOUT_MS = 5_000
MAX_BUSY_TIMEOUT_MS = 2**31 - 1
"""Largest ``busy_timeout_ms``: SQLite keeps it in a C int, and silently reads a larger
one as 0 (no waiting at all)."""
# Poll backoff of blocking calls: starts at 1 ms after a change, doubles to at most 50 ms.
POLL_MIN_S = 0.001
POLL_MAX_S = 0.050
# Pauses between attempts to open a file that another process is setting up.
OPEN_RETRY_MIN_S = 0.002
OPEN_RETRY_MAX_S = 0.100
# Keys per SELECT ... IN (...) statement (SQLite limits bound parameters per statement).
_CHUNK = 500

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS rdzv_kv "
    "(key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS rdzv_sets "
    "(key TEXT NOT NULL, member BLOB NOT NULL, PRIMARY KEY (key, member)) WITHOUT ROWID",
)
_URL_PARAMS = ("busy_timeout_ms",)
# The tables as rdzv creates them: (name, declared type, not null, primary key position)
# per column, as PRAGMA table_info reports them.
_COLUMNS = {
    "rdzv_kv": [("key", "TEXT", 1, 1), ("value", "BLOB", 1, 0)],
    "rdzv_sets": [("key", "TEXT", 1, 1), ("member", "BLOB", 1, 2)],
}

T = TypeVar("T")


class _Local(threading.local):
    conn: sqlite3.Connection | None = None
    pid: int = -1


class SQLiteStore(BaseStore):
    """A store kept in the SQLite file at ``path`` (created with its table if missing)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: timedelta = DEFAULT_STORE_TIMEOUT,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    ) -> None:
        if (
            not isinstance(busy_timeout_ms, int)
            or isinstance(busy_timeout_ms, bool)
            or not 0 <= busy_timeout_ms <= MAX_BUSY_TIMEOUT_MS
        ):
            raise ValueError(
                f"busy_timeout_ms must be an int from 0 to {MAX_BUSY_TIMEOUT_MS} (SQLite's "
                f"limit, about 24.8 days), got {busy_timeout_ms!r}"
            )
        self._path = os.path.abspath(os.fspath(path))
        super().__init__(timeout)
        self._busy_timeout_ms = busy_timeout_ms
        self._local = _Local()
        self._conns_lock = threading.Lock()
        # (thread that owns it, pid that opened it, connection); pruned when threads end.
        self._conns: list[tuple[weakref.ref[threading.Thread], int, sqlite3.Connection]] = []
        self._closed = False
        # Local writes wake local waiters at once; other processes are seen by polling.
        self._cond = threading.Condition(threading.Lock())
        self._local_writes = 0
        self._conn()  # open now, so a bad path fails at open_store, not on first use

    @property
    def path(self) -> str:
        return self._path

    @property
    def endpoint(self) -> str:
        return f"{SCHEME}://{self._path}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._path!r})"

    # -- connections -----------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise RendezvousConnectionError(
                f"the SQLite store {self._path} was closed; open a new one with open_store()"
            )
        local = self._local
        pid = os.getpid()
        if local.conn is not None and local.pid == pid:
            return local.conn
        conn = self._connect()
        local.conn, local.pid = conn, pid
        with self._conns_lock:
            keep = []
            for owner, owner_pid, other in self._conns:
                thread = owner()
                if owner_pid != pid:
                    continue  # inherited through fork: not ours to close
                if thread is None or not thread.is_alive():
                    other.close()
                else:
                    keep.append((owner, owner_pid, other))
            keep.append((weakref.ref(threading.current_thread()), pid, conn))
            self._conns = keep
        return conn

    def _connect(self) -> sqlite3.Connection:
        directory = os.path.dirname(self._path)
        if not os.path.isdir(directory):
            raise RendezvousConnectionError(
                f"cannot open the SQLite store {self._path}: directory {directory} does not "
                "exist (or is not a directory); create it, or fix the path in the sqlite:// URL"
            )
        if os.path.isdir(self._path):
            raise RendezvousConnectionError(
                f"cannot open the SQLite store {self._path}: it is a directory; "
                "point the sqlite:// URL at a file"
            )
        # Processes opening a new file together can get "database is locked" at once,
        # without the busy handler waiting: SQLite refuses a lock upgrade that could
        # deadlock (switching to WAL, creating the tables). Such an open is retried with
        # a growing pause, for at most busy_timeout_ms.
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        pause = OPEN_RETRY_MIN_S
        while True:  # bounded by the deadline
            try:
                return self._connect_once()
            except sqlite3.OperationalError as exc:
                low = str(exc).lower()
                locked = "locked" in low or "busy" in low
                if not locked or time.monotonic() + pause > deadline:
                    raise self._error(exc, "opening the store") from exc
            except sqlite3.Error as exc:
                raise self._error(exc, "opening the store") from exc
            time.sleep(pause)
            pause = min(pause * 2, OPEN_RETRY_MAX_S)

    def _connect_once(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout_ms / 1000,
            isolation_level=None,  # autocommit; transactions are explicit
            check_same_thread=False,  # only close() touches another thread's connection
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms:d}")
            # Before anything changes the file: refuse another application's database.
            self._check_foreign_tables(conn)
            self._check_columns(conn)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise RendezvousConnectionError(
                    f"the SQLite store {self._path} could not use WAL mode (got {mode!r}); "
                    "put the file on a local filesystem"
                )
            conn.execute("PRAGMA synchronous = NORMAL")
            for statement in _SCHEMA:
                conn.execute(statement)
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_foreign_tables(self, conn: sqlite3.Connection) -> None:
        """Raise :class:`RendezvousStateError` when the file holds tables rdzv does not
        make (SQLite's own ``sqlite_*`` tables aside)."""
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
        ).fetchall()
        foreign = [str(row[0]) for row in rows if row[0] not in _COLUMNS]
        if foreign:
            shown = ", ".join(repr(name) for name in foreign[:5])
            more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
            raise RendezvousStateError(
                f"the SQLite file {self._path} holds tables rdzv does not make ({shown}"
                f"{more}): it belongs to another application. rdzv left it untouched (it "
                "would add its tables and switch the file to WAL journal mode for good); "
                "point the sqlite:// URL at a file of its own, e.g. "
                f"{os.path.join(os.path.dirname(self._path), 'rdzv-job.db')}"
            )

    def _check_columns(self, conn: sqlite3.Connection) -> None:
        """Raise :class:`RendezvousStateError` when ``rdzv_kv`` or ``rdzv_sets`` exists
        with another shape than rdzv gives it (another program made a table of that
        name); a table not made yet passes."""
        for table, expected in _COLUMNS.items():
            found = [
                (str(row[1]), str(row[2]).upper(), int(row[3]), int(row[5]))
                for row in conn.execute(f"PRAGMA table_info({table})").fetchall()
            ]
            if found and found != expected:
                columns = ", ".join(f"{name} {kind}" for name, kind, _, _ in found)
                raise RendezvousStateError(
                    f"the table {table} in the SQLite file {self._path} has columns "
                    f"({columns}), not the ones rdzv creates (key TEXT PRIMARY KEY, "
                    f"{expected[1][0]} BLOB, both NOT NULL): another program made it. rdzv "
                    "did not touch its rows; point the sqlite:// URL at a file of its own"
                )

    def close(self) -> None:
        """Close every connection this store opened in this process; later calls fail."""
        self._closed = True
        pid = os.getpid()
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for _, owner_pid, conn in conns:
            if owner_pid == pid:
                conn.close()

    def _error(self, exc: sqlite3.Error, doing: str) -> RendezvousConnectionError:
        text = str(exc)
        low = text.lower()
        directory = os.path.dirname(self._path)
        if "locked" in low or "busy" in low:
            return RendezvousConnectionError(
                f"the SQLite store {self._path} is locked: {doing} waited "
                f"{self._busy_timeout_ms} ms for another connection's lock ({text}); check for "
                "a process holding a long transaction on this file, or raise busy_timeout_ms "
                "(sqlite:///path?busy_timeout_ms=...)"
            )
        if "not a database" in low or "malformed" in low or "encrypted" in low:
            return RendezvousConnectionError(
                f"{self._path} is not a usable SQLite database ({text}) while {doing}; point "
                "the sqlite:// URL at a new file or at one created by rdzv"
            )
        if any(w in low for w in ("unable to open", "readonly", "read-only", "disk i/o", "access")):
            return RendezvousConnectionError(
                f"cannot use the SQLite store {self._path} while {doing} ({text}); check that "
                f"directory {directory} exists, that this user can write the file and the "
                "directory (SQLite creates -wal and -shm files beside it), and that it is on "
                "a local filesystem"
            )
        return RendezvousConnectionError(
            f"the SQLite store {self._path} failed while {doing} ({type(exc).__name__}: "
            f"{text}); check the file and its directory"
        )

    # -- primitives ------------------------------------------------------------------

    def _run(self, doing: str, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``body`` in autocommit mode (each statement is its own transaction)."""
        conn = self._conn()
        try:
            return body(conn)
        except sqlite3.Error as exc:
            raise self._error(exc, doing) from exc

    def _write(self, doing: str, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``body`` in a ``BEGIN IMMEDIATE`` transaction; commit, or roll back."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = body(conn)
                conn.execute("COMMIT")
            finally:
                if conn.in_transaction:  # body or COMMIT failed
                    # The original error is the one to report.
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise self._error(exc, doing) from exc
        self._wrote()
        return result

    def _wrote(self) -> None:
        with self._cond:
            self._local_writes += 1
            self._cond.notify_all()

    @staticmethod
    def _fetch(conn: sqlite3.Connection, names: Sequence[str]) -> dict[str, bytes]:
        unique = sorted(set(names))
        if not unique:
            return {}
        found: dict[str, bytes] = {}
        multi = len(unique) > _CHUNK
        if multi:  # one snapshot across chunks
            conn.execute("BEGIN")
        try:
            for start in range(0, len(unique), _CHUNK):
                part = unique[start : start + _CHUNK]
                marks = ",".join("?" * len(part))
                rows = conn.execute(
                    f"SELECT key, CAST(value AS BLOB) FROM rdzv_kv WHERE key IN ({marks})",
                    part,
                ).fetchall()
                found.update((str(k), bytes(v)) for k, v in rows)
        finally:
            if multi and conn.in_transaction:
                conn.execute("COMMIT")
        return found

    @staticmethod
    def _get_one(conn: sqlite3.Connection, key: str) -> bytes | None:
        row = conn.execute(
            "SELECT CAST(value AS BLOB) FROM rdzv_kv WHERE key = ?", (key,)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def _poll(
        self, doing: str, probe: Callable[[sqlite3.Connection], T | None], seconds: float
    ) -> T | None:
        """Return the first non-None ``probe`` result, or None once ``seconds`` passed.

        Probes once, then again only after a commit by another connection
        (``PRAGMA data_version`` moved) or a write through this store object. Bounded by
        ``seconds``; each idle step sleeps ``POLL_MIN_S`` doubling to ``POLL_MAX_S``.
        """
        conn = self._conn()
        deadline = time.monotonic() + seconds
        delay = POLL_MIN_S
        try:
            while True:
                with self._cond:
                    local_seen = self._local_writes
                version_seen = conn.execute("PRAGMA data_version").fetchone()[0]
                result = probe(conn)
                if result is not None:
                    return result
                while True:  # idle until something changed; bounded by the deadline
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    with self._cond:
                        if self._local_writes == local_seen:
                            self._cond.wait(min(delay, remaining))
                        local_changed = self._local_writes != local_seen
                    version = conn.execute("PRAGMA data_version").fetchone()[0]
                    if local_changed or version != version_seen:
                        delay = POLL_MIN_S
                        break
                    delay = min(delay * 2, POLL_MAX_S)
        except sqlite3.Error as exc:
            raise self._error(exc, doing) from exc

    # -- writes ----------------------------------------------------------------------

    def set(self, key: str, value: bytes | str) -> None:
        key, data = check_key(key), as_bytes(value)

        def body(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT OR REPLACE INTO rdzv_kv (key, value) VALUES (?, ?)", (key, data))

        self._run("set", body)  # one statement: atomic on its own
        self._wrote()

    def add(self, key: str, amount: int) -> int:
        key, amount = check_key(key), check_amount(amount)

        def body(conn: sqlite3.Connection) -> int:
            old = self._get_one(conn, key)
            new = (0 if old is None else parse_counter(key, old)) + amount
            conn.execute(
                "INSERT OR REPLACE INTO rdzv_kv (key, value) VALUES (?, ?)",
                (key, encode_counter(new)),
            )
            return new

        return self._write("add", body)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        key, want, new = check_key(key), as_bytes(expected), as_bytes(desired)

        def body(conn: sqlite3.Connection) -> bytes:
            refused = cas_refusal(self._get_one(conn, key), want)
            if refused is not None:
                return refused
            conn.execute("INSERT OR REPLACE INTO rdzv_kv (key, value) VALUES (?, ?)", (key, new))
            return new

        return self._write("compare_set", body)

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        names = check_keys(keys)
        check_pairs(names, values)
        rows = [(k, as_bytes(v)) for k, v in zip(names, values, strict=True)]

        def body(conn: sqlite3.Connection) -> None:
            conn.executemany("INSERT OR REPLACE INTO rdzv_kv (key, value) VALUES (?, ?)", rows)

        self._write("multi_set", body)

    def delete_key(self, key: str) -> bool:
        key = check_key(key)

        def body(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM rdzv_kv WHERE key = ?", (key,)).rowcount > 0

        found = self._run("delete_key", body)
        if found:
            self._wrote()
        return found

    def add_member(self, key: str, member: bytes | str) -> int:
        key, data = check_key(key), check_member(member)

        def body(conn: sqlite3.Connection) -> int:
            added = conn.execute(
                "INSERT OR IGNORE INTO rdzv_sets (key, member) VALUES (?, ?)", (key, data)
            ).rowcount
            size = int(
                conn.execute("SELECT COUNT(*) FROM rdzv_sets WHERE key = ?", (key,)).fetchone()[0]
            )
            if added and size > MAX_SET_MEMBERS:  # raising makes _write roll the insert back
                raise set_full_error(key, self.endpoint, MAX_SET_MEMBERS)
            return size

        return self._write("add_member", body)

    def remove_member(self, key: str, member: bytes | str) -> int:
        key, data = check_key(key), check_member(member)

        def body(conn: sqlite3.Connection) -> int:
            conn.execute("DELETE FROM rdzv_sets WHERE key = ? AND member = ?", (key, data))
            return int(
                conn.execute("SELECT COUNT(*) FROM rdzv_sets WHERE key = ?", (key,)).fetchone()[0]
            )

        return self._write("remove_member", body)

    # -- reads -----------------------------------------------------------------------

    def members(self, key: str) -> list[bytes]:
        key = check_key(key)

        def body(conn: sqlite3.Connection) -> list[bytes]:
            rows = conn.execute(
                "SELECT CAST(member AS BLOB) AS m FROM rdzv_sets WHERE key = ? ORDER BY m",
                (key,),
            ).fetchall()
            return [bytes(row[0]) for row in rows]

        return self._run("members", body)

    def try_get(self, key: str) -> bytes | None:
        key = check_key(key)
        return self._run("try_get", lambda conn: self._get_one(conn, key))

    def check(self, keys: Sequence[str]) -> bool:
        names = check_keys(keys)
        found = self._run("check", lambda conn: self._fetch(conn, names))
        return all(k in found for k in names)

    def num_keys(self) -> int:
        return self._run(
            "num_keys", lambda conn: int(conn.execute("SELECT COUNT(*) FROM rdzv_kv").fetchone()[0])
        )

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        names = check_keys(keys)
        seconds = wait_seconds(self._timeout)

        def probe(conn: sqlite3.Connection) -> list[bytes] | None:
            found = self._fetch(conn, names)
            return [found[k] for k in names] if all(k in found for k in names) else None

        values = self._poll("get", probe, seconds)
        if values is None:
            missing = self._run("get", lambda conn: self._fetch(conn, names))
            raise timeout_error(self.endpoint, [k for k in names if k not in missing], seconds)
        return values

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        names = check_keys(keys)
        seconds = wait_seconds(self._timeout if timeout is None else timeout)

        def probe(conn: sqlite3.Connection) -> bool | None:
            found = self._fetch(conn, names)
            return True if all(k in found for k in names) else None

        if self._poll("wait", probe, seconds) is None:
            found = self._run("wait", lambda conn: self._fetch(conn, names))
            raise timeout_error(self.endpoint, [k for k in names if k not in found], seconds)

    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool:
        key = check_key(key)
        if current is not None:
            current = as_bytes(current)

        def probe(conn: sqlite3.Connection) -> bool | None:
            return True if self._get_one(conn, key) != current else None

        return self._poll("wait_for_change", probe, wait_seconds(timeout)) is True


def open_sqlite(url: str, timeout: timedelta) -> SQLiteStore:
    """Open ``sqlite:///abs/path.db`` (or ``sqlite://relative/path.db``, resolved now
    against the current directory). Query parameter: ``busy_timeout_ms`` (default 5000,
    at most ``MAX_BUSY_TIMEOUT_MS``).
    """
    scheme, _ = split_url(url)
    shown = redact(url)
    if scheme != SCHEME:
        raise StoreUrlError(f"not an sqlite:// URL: {shown!r}")
    raw_path, params = split_query(
        url,
        _URL_PARAMS,
        no_userinfo="SQLite files do not take; use sqlite:///abs/path/to/store.db (a "
        "relative path whose first part holds ':' and '@' must start with ./)",
    )
    path = unquote(raw_path)
    if not path or path == "/":
        raise StoreUrlError(
            f"sqlite URL {shown!r} names no file; use sqlite:///abs/path/to/store.db"
        )
    if path in (":memory:", "/:memory:") or path.startswith("file:"):
        raise StoreUrlError(
            f"sqlite URL {shown!r} must name a file on disk (in-memory SQLite cannot be "
            "shared); use memory://name for an in-process store"
        )
    busy = DEFAULT_BUSY_TIMEOUT_MS
    if "busy_timeout_ms" in params:
        text = params["busy_timeout_ms"]
        if not text.isdigit() or not text.isascii() or int(text) > MAX_BUSY_TIMEOUT_MS:
            raise StoreUrlError(
                f"busy_timeout_ms must be a whole number of milliseconds from 0 to "
                f"{MAX_BUSY_TIMEOUT_MS} (SQLite's limit, about 24.8 days), got {text!r}"
            )
        busy = int(text)
    return SQLiteStore(path, timeout=timeout, busy_timeout_ms=busy)
