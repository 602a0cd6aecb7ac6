"""Test kit: the store conformance suite, and a fake clock.

:func:`check_store` is the one conformance suite every :class:`~rdzv.store.Store` must
pass; backends in this package run it, and so can yours::

    from rdzv.testing import check_store

    def test_my_store_conforms(tmp_path):
        check_store(lambda: MyStore(...))                   # threads of one process
        check_store(lambda: MyStore(...), url="my://...")   # ... and spawned processes
        check_store(MyStore, only=["compare_set contract"])  # one property (see PROPERTY_NAMES)

``factory()`` must return a fresh, empty store each time (the suite calls it once per
property, and closes the store afterwards if it has a ``close`` method). The first
broken property raises ``AssertionError`` naming the property, the store and what was
expected versus what happened; an unexpected exception from the store is reported the
same way.

Bounds: every thread and process the kit starts is joined (or terminated) before it
returns. ``wake_within`` bounds how long a blocking call may take to notice a write made
by another thread or process (default 5 s; a correct store needs milliseconds). Timeout
checks use a store timeout of ``SHORT_TIMEOUT`` (50 ms), so no check sleeps long.

:class:`FakeClock` (from :mod:`rdzv.clock`) is re-exported for tests that drive time, with
:class:`FakeClockStalled`, what a sleep on it raises when nobody advances it.
"""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import timedelta

from rdzv.clock import FakeClock, FakeClockStalled
from rdzv.errors import StoreTimeoutError
from rdzv.store import MAX_MEMBER_BYTES, SET_STORE_METHODS, PrefixStore, SetStore, Store
from rdzv.stores import open_store

__all__ = [
    "PROPERTY_NAMES",
    "SHORT_TIMEOUT",
    "FakeClock",
    "FakeClockStalled",
    "check_store",
    "check_store_across_processes",
]

SHORT_TIMEOUT = timedelta(milliseconds=50)
"""The store timeout used where the suite expects a wait to run out."""
WRITE_DELAY_S = 0.02
"""A writer thread waits this long before writing, so the waiter is usually blocked by
then (the checks hold either way: an early write is seen at once)."""
MAX_CAS_ATTEMPTS = 1_000
"""Bound on compare_set attempts for one increment under contention."""
THREADS_START_S = 30.0
"""Bound on the kit's threads all reaching their starting barrier (thread start-up on a
loaded machine, unrelated to how fast the store wakes waiters)."""
WRITER_S = 30.0
"""Bound on a writer thread finishing its one delayed write (a correct store needs
milliseconds). How fast the waiter saw the write is checked separately, against
``wake_within``; this bound only keeps a stalled writer from outliving the kit."""
CONCURRENT_WORK_S = 60.0
"""Bound on the concurrent add/CAS phase of threads (a correct store needs well under 1 s)."""
PROCESS_STOP_S = 5.0
"""After a failure, how long a child process gets to exit after terminate() before kill()."""
LIVENESS_CHECK_S = 0.5
"""While waiting for children to start, how often the kit checks that none has died."""

StoreFactory = Callable[[], Store]


@dataclass(frozen=True)
class _Config:
    threads: int
    increments: int
    wake_within: timedelta

    @property
    def wake_s(self) -> float:
        return self.wake_within.total_seconds()


class _Broken(AssertionError):
    """A property failed; the runner adds the property's name and the store."""


def _expect(ok: bool, message: str) -> None:
    # Explicit raise rather than ``assert``: the kit must work under ``python -O``.
    if not ok:
        raise _Broken(message)


def _expect_eq(actual: object, expected: object, what: str) -> None:
    _expect(actual == expected, f"{what}: expected {expected!r}, got {actual!r}")


def _expect_timeout(call: Callable[[], object], what: str) -> None:
    try:
        result = call()
    except StoreTimeoutError:
        return
    raise _Broken(f"{what} must raise StoreTimeoutError, but returned {result!r}")


def _close(store: object) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


# -- threads -------------------------------------------------------------------------


class _Worker:
    """A daemon thread whose exception is kept for the kit to re-raise."""

    def __init__(self, name: str, target: Callable[[], None], delay: float = 0.0) -> None:
        self.error: BaseException | None = None
        self._target = target
        self._delay = delay
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            if self._delay:
                time.sleep(self._delay)
            self._target()
        except BaseException as exc:
            self.error = exc

    def start(self) -> _Worker:
        self.thread.start()
        return self


def _join_all(workers: Sequence[_Worker], within: float, what: str) -> None:
    """Join every worker (bounded by ``within`` in total); re-raise the first error."""
    deadline = time.monotonic() + within
    for worker in workers:
        worker.thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [w.thread.name for w in workers if w.thread.is_alive()]
    _expect(not stuck, f"{what}: thread(s) {stuck} did not finish within {within:.3g} s")
    for worker in workers:
        if worker.error is not None:
            if isinstance(worker.error, AssertionError):
                raise _Broken(f"{what}: in thread {worker.thread.name}: {worker.error}")
            raise _Broken(
                f"{what}: thread {worker.thread.name} raised "
                f"{type(worker.error).__name__}: {worker.error}"
            ) from worker.error


def _after_delay(name: str, action: Callable[[], None]) -> _Worker:
    return _Worker(name, action, delay=WRITE_DELAY_S).start()


def _timed(call: Callable[[], object]) -> tuple[object, float]:
    start = time.monotonic()
    result = call()
    return result, time.monotonic() - start


# -- the properties (each gets a fresh, empty store) ------------------------------------


def _empty(store: Store, cfg: _Config) -> None:
    _expect_eq(store.num_keys(), 0, "num_keys() of a fresh store from the factory")
    _expect_eq(store.check(["k"]), False, "check(['k']) on an empty store")
    _expect_eq(store.check([]), True, "check([]) (no keys: vacuously present)")


def _timeout_property(store: Store, cfg: _Config) -> None:
    store.set_timeout(SHORT_TIMEOUT)
    _expect_eq(store.timeout, SHORT_TIMEOUT, "timeout after set_timeout(50 ms)")
    store.set_timeout(timedelta(seconds=7))
    _expect_eq(store.timeout, timedelta(seconds=7), "timeout after set_timeout(7 s)")


def _set_and_get(store: Store, cfg: _Config) -> None:
    store.set("k", b"v1")
    got = store.get("k")
    _expect(type(got) is bytes, f"get() must return bytes, got {type(got).__name__}")
    _expect_eq(got, b"v1", "get('k') after set('k', b'v1')")
    store.set("k", b"v2")
    _expect_eq(store.get("k"), b"v2", "get('k') after overwriting with b'v2'")
    every_byte = bytes(range(256))
    store.set("binary", every_byte)
    _expect_eq(store.get("binary"), every_byte, "a value holding every byte 0..255")
    store.set("empty", b"")
    _expect_eq(store.get("empty"), b"", "an empty value")
    _expect_eq(store.check(["empty"]), True, "check() of a key holding an empty value")
    store.set("text", "h\u00e9llo \u2713")
    _expect_eq(store.get("text"), "h\u00e9llo \u2713".encode(), "a str value (stored as UTF-8)")
    store.set("key with spaces/and/slashes \u00e9", b"x")
    _expect_eq(store.get("key with spaces/and/slashes \u00e9"), b"x", "an unusual key")
    _expect_eq(store.num_keys(), 5, "num_keys() after writing 5 distinct keys")


def _missing_keys_time_out(store: Store, cfg: _Config) -> None:
    store.set_timeout(SHORT_TIMEOUT)
    store.set("present", b"p")
    _expect_timeout(lambda: store.get("missing"), "get() of a missing key")
    _expect_timeout(
        lambda: store.multi_get(["present", "missing"]), "multi_get() with a missing key"
    )
    _expect_timeout(lambda: store.wait(["missing"]), "wait() on a missing key (store timeout)")
    _expect_timeout(
        lambda: store.wait(["present", "missing"], timedelta(milliseconds=10)),
        "wait() with an explicit 10 ms timeout and a missing key",
    )
    store.wait(["present"])
    store.wait([])
    store.wait(["present"], timedelta(0))
    _expect_eq(store.check(["missing"]), False, "check() after a failed get (no side effect)")


def _blocking_reads_wake(store: Store, cfg: _Config) -> None:
    # The store timeout is longer than wake_within, so returning only at the timeout fails.
    store.set_timeout(cfg.wake_within * 2)
    writer = _after_delay("writer", lambda: store.set("late", b"here"))
    try:
        got, took = _timed(lambda: store.get("late"))
    finally:
        _join_all([writer], WRITER_S, "get() waking on a write")
    _expect_eq(got, b"here", "get() of a key another thread writes while it waits")
    _expect(took <= cfg.wake_s, f"get() took {took:.3g} s to see a write (> {cfg.wake_s} s)")

    store.set("a", b"1")
    writer = _after_delay("writer", lambda: store.multi_set(["b", "c"], [b"2", b"3"]))
    try:
        _, took = _timed(lambda: store.wait(["a", "b", "c"]))
    finally:
        _join_all([writer], WRITER_S, "wait() waking on a write")
    _expect(took <= cfg.wake_s, f"wait() took {took:.3g} s to see a write (> {cfg.wake_s} s)")
    _expect_eq(store.multi_get(["a", "b", "c"]), [b"1", b"2", b"3"], "values after the wait")


def _compare_set(store: Store, cfg: _Config) -> None:
    got = store.compare_set("k", b"", b"first")
    _expect_eq(got, b"first", "compare_set(absent key, expected=b'', desired) return")
    _expect_eq(store.get("k"), b"first", "value after compare_set created the key")

    got = store.compare_set("k", b"first", b"second")
    _expect_eq(got, b"second", "compare_set with the matching expected value: return")
    _expect_eq(store.get("k"), b"second", "value after a matching compare_set")

    got = store.compare_set("k", b"first", b"third")
    _expect_eq(got, b"second", "compare_set with a stale expected value must return the current")
    _expect_eq(
        store.get("k"), b"second", "a compare_set with a stale expected value must not store"
    )

    got = store.compare_set("k", b"", b"fourth")
    _expect_eq(got, b"second", "compare_set(present key, expected=b'') must return the current")
    _expect_eq(store.get("k"), b"second", "compare_set(present key, expected=b'') must not store")

    got = store.compare_set("absent", b"guess", b"new")
    _expect_eq(got, b"guess", "compare_set(absent key, non-empty expected) returns expected")
    _expect_eq(store.check(["absent"]), False, "compare_set(absent, non-empty) must not create")

    store.set("e", b"")
    got = store.compare_set("e", b"", b"filled")
    _expect_eq(got, b"filled", "compare_set(key holding b'', expected=b'') must match")

    got = store.compare_set("k", "second", "\u00fcber")
    _expect(type(got) is bytes, f"compare_set() must return bytes, got {type(got).__name__}")
    _expect_eq(got, "\u00fcber".encode(), "compare_set with str expected/desired (UTF-8)")
    _expect_eq(store.get("k"), "\u00fcber".encode(), "value after a str compare_set")
    got = store.compare_set("k", "stale", b"x")
    _expect_eq(got, "\u00fcber".encode(), "compare_set with a stale str expected value")


def _add(store: Store, cfg: _Config) -> None:
    _expect_eq(store.add("n", 5), 5, "add() on a missing key starts from 0")
    _expect_eq(store.get("n"), b"5", "add() stores decimal ASCII digits")
    _expect_eq(store.add("n", 2), 7, "add(2) after 5")
    _expect_eq(store.add("n", -10), -3, "add() with a negative amount")
    _expect_eq(store.get("n"), b"-3", "a negative counter as ASCII")
    _expect_eq(store.add("zero", 0), 0, "add(missing, 0)")
    _expect_eq(store.check(["zero"]), True, "add(missing, 0) creates the key")
    store.set("digits", b"41")
    _expect_eq(store.add("digits", 1), 42, "add() on a key set to ASCII digits")
    big = 2**62
    _expect_eq(store.add("big", big), big, "add() of a large amount")
    _expect_eq(store.get("big"), str(big).encode(), "a large counter as ASCII")


def _multi(store: Store, cfg: _Config) -> None:
    store.multi_set(["a", "b", "c"], [b"1", "2", b""])
    _expect_eq(store.multi_get(["c", "a", "b"]), [b"", b"1", b"2"], "multi_get keeps key order")
    _expect_eq(store.multi_get(["a", "a"]), [b"1", b"1"], "multi_get with a repeated key")
    _expect_eq(store.multi_get([]), [], "multi_get([])")
    store.multi_set(["a"], [b"10"])
    _expect_eq(store.get("a"), b"10", "multi_set overwrites")
    store.multi_set([], [])
    _expect_eq(store.num_keys(), 3, "num_keys() after multi_set of 3 keys")
    _expect_eq(store.get("b"), b"2", "a str value written by multi_set")


def _delete_and_count(store: Store, cfg: _Config) -> None:
    store.set_timeout(SHORT_TIMEOUT)
    store.set("a", b"1")
    store.set("b", b"2")
    store.set("a", b"3")
    _expect_eq(store.num_keys(), 2, "num_keys() counts keys, not writes")
    _expect_eq(store.delete_key("a"), True, "delete_key() of a present key")
    _expect_eq(store.check(["a"]), False, "check() after delete_key()")
    _expect_eq(store.check(["b"]), True, "delete_key() must leave other keys")
    _expect_eq(store.num_keys(), 1, "num_keys() after delete_key()")
    _expect_eq(store.delete_key("a"), False, "delete_key() of a missing key")
    _expect_timeout(lambda: store.get("a"), "get() of a deleted key")
    got = store.compare_set("a", b"", b"again")
    _expect_eq(got, b"again", "compare_set(expected=b'') on a deleted key")
    _expect_eq(store.check(["a", "b"]), True, "check() of two present keys")
    _expect_eq(store.check(["a", "b", "c"]), False, "check() with one missing key")


def _wait_for_change_immediate(store: Store, cfg: _Config) -> None:
    short = SHORT_TIMEOUT
    long = cfg.wake_within
    _expect_eq(store.wait_for_change("k", None, short), False, "absent key, current=None")
    _expect_eq(store.wait_for_change("k", b"x", long), True, "absent key, current=b'x'")
    store.set("k", b"v")
    _expect_eq(store.wait_for_change("k", b"v", short), False, "unchanged value times out")
    _expect_eq(store.wait_for_change("k", None, long), True, "present key, current=None")
    _expect_eq(store.wait_for_change("k", b"old", long), True, "different value")
    _expect_eq(store.wait_for_change("k", b"v", timedelta(0)), False, "zero timeout, unchanged")
    store.set("e", b"")
    _expect_eq(store.wait_for_change("e", b"", short), False, "b'' is a value, not absence")
    _expect_eq(store.wait_for_change("e", None, long), True, "b'' differs from absent")


def _wait_for_change_wakes(store: Store, cfg: _Config) -> None:
    long = cfg.wake_within * 2  # returning only at this timeout fails the wake_within check

    def update() -> None:
        store.set("k", b"v2")

    def swap() -> None:
        store.compare_set("k", b"v2", b"v3")

    def delete() -> None:
        store.delete_key("k")

    def create() -> None:
        store.add("k", 1)

    cases: list[tuple[str, bytes | None, Callable[[], None], bytes | None]] = [
        ("an update", b"v1", update, b"v2"),
        ("a compare_set", b"v2", swap, b"v3"),
        ("a delete", b"v3", delete, None),
        ("a creation", None, create, b"1"),
    ]
    store.set("k", b"v1")
    for what, current, write, after in cases:
        writer = _after_delay("writer", write)
        try:
            start = time.monotonic()
            woke = store.wait_for_change("k", current, long)
            took = time.monotonic() - start
        finally:
            _join_all([writer], WRITER_S, f"wait_for_change() and {what}")
        _expect_eq(woke, True, f"wait_for_change() while another thread makes {what}")
        _expect(
            took <= cfg.wake_s,
            f"wait_for_change() took {took:.3g} s to notice {what} (> {cfg.wake_s} s)",
        )
        now = store.get("k") if store.check(["k"]) else None
        _expect_eq(now, after, f"value after {what}")


def _wait_for_change_ignores_no_change(store: Store, cfg: _Config) -> None:
    store.set("k", b"same")
    stop = threading.Event()

    def rewrite() -> None:
        for i in range(200):  # bound: ~0.4 s of rewrites at most
            if stop.is_set():
                return
            store.set("k", b"same")
            store.set("other", str(i))
            stop.wait(0.002)

    writer = _Worker("rewriter", rewrite).start()
    try:
        woke = store.wait_for_change("k", b"same", timedelta(milliseconds=100))
    finally:
        stop.set()
        _join_all([writer], WRITER_S, "rewriting the same value")
    _expect_eq(
        woke,
        False,
        "wait_for_change() while others rewrite the same value and write other keys "
        "(True is allowed only when the value really differs)",
    )


def _prefix_isolation(store: Store, cfg: _Config) -> None:
    a, b = PrefixStore("a", store), PrefixStore("b", store)
    a.set_timeout(SHORT_TIMEOUT)
    a.set("k", b"in a")
    b.set("k", b"in b")
    _expect_eq(a.get("k"), b"in a", "PrefixStore('a') sees its own value")
    _expect_eq(b.get("k"), b"in b", "PrefixStore('b') sees its own value")
    _expect_eq(store.get("a/k"), b"in a", "the underlying key of PrefixStore('a').set('k')")
    a.set("only-a", b"1")
    _expect_eq(b.check(["only-a"]), False, "a key of prefix a must be invisible in prefix b")
    _expect_timeout(lambda: b.get("only-a"), "get() through prefix b of a key of prefix a")
    _expect_eq(a.compare_set("k", b"in a", b"a2"), b"a2", "compare_set through prefix a")
    _expect_eq(b.get("k"), b"in b", "compare_set through prefix a must not touch prefix b")
    _expect_eq(a.add("n", 3), 3, "add through prefix a")
    _expect_eq(b.add("n", 1), 1, "add through prefix b is a separate counter")
    a.multi_set(["x", "y"], [b"1", b"2"])
    _expect_eq(b.check(["x"]), False, "multi_set through prefix a must not write prefix b")
    _expect_eq(b.delete_key("k"), True, "delete_key through prefix b")
    _expect_eq(a.get("k"), b"a2", "delete_key through prefix b must not delete prefix a's key")
    writer = _after_delay("writer", lambda: b.set("w", b"b"))
    try:
        woke = a.wait_for_change("w", None, timedelta(milliseconds=150))
    finally:
        _join_all([writer], WRITER_S, "writing through prefix b")
    _expect_eq(woke, False, "a write through prefix b must not wake a waiter in prefix a")


def _concurrent_add(store: Store, cfg: _Config) -> None:
    n, m = cfg.threads, cfg.increments
    start = threading.Barrier(n, timeout=THREADS_START_S)
    results: list[list[int]] = [[] for _ in range(n)]

    def adder(i: int) -> None:
        start.wait()
        results[i].extend(store.add("count", 1) for _ in range(m))

    workers = [_Worker(f"adder-{i}", functools.partial(adder, i)).start() for i in range(n)]
    _join_all(workers, cfg.wake_s + CONCURRENT_WORK_S, "concurrent add()")
    _expect_eq(store.get("count"), str(n * m).encode(), f"counter after {n}x{m} concurrent add(1)")
    seen = sorted(v for r in results for v in r)
    _expect_eq(seen, list(range(1, n * m + 1)), "the values add() returned (each exactly once)")


def _count_of(value: bytes) -> int:
    head = value.split(b":", 1)[0]
    _expect(head.isdigit(), f"the CAS counter holds {value!r}, not a value the kit wrote")
    return int(head)


def _cas_increment(store: Store, key: str, tag: str) -> int:
    """Increment the counter at ``key`` by one with a get + compare_set loop.

    Values look like ``b"<count>:<tag>:<attempt>"``; ``tag`` must be unique per call,
    so a desired value is never written twice and ``compare_set`` returning it proves
    this call's write won. Bounded by :data:`MAX_CAS_ATTEMPTS`. Returns the attempts used.
    """
    for attempt in range(1, MAX_CAS_ATTEMPTS + 1):
        current = store.get(key)
        desired = f"{_count_of(current) + 1}:{tag}:{attempt}".encode()
        got = store.compare_set(key, current, desired)
        if got == desired:
            return attempt
        _expect(
            got != current,
            f"compare_set({key!r}, {current!r}, ...) did not store, yet returned the expected "
            "value as the current one",
        )
    raise _Broken(f"increment {tag} did not succeed within {MAX_CAS_ATTEMPTS} CAS attempts")


def _concurrent_cas(store: Store, cfg: _Config) -> None:
    n, m = cfg.threads, cfg.increments
    store.set("counter", b"0:init")
    start = threading.Barrier(n, timeout=THREADS_START_S)

    def incrementer(i: int) -> None:
        start.wait()
        for j in range(m):
            _cas_increment(store, "counter", f"t{i}.{j}")

    workers = [_Worker(f"cas-{i}", functools.partial(incrementer, i)).start() for i in range(n)]
    _join_all(workers, cfg.wake_s + CONCURRENT_WORK_S, "concurrent compare_set increments")
    _expect_eq(
        _count_of(store.get("counter")),
        n * m,
        f"counter after {n}x{m} CAS increments (lost updates?)",
    )


# -- member sets and try_get (SetStore) ------------------------------------------------


def _sets_of(store: Store) -> SetStore:
    if not isinstance(store, SetStore):
        lacking = [m for m in SET_STORE_METHODS if not hasattr(store, m)]
        raise _Broken(
            f"{type(store).__name__} lacks {'/'.join(lacking)} (check_store(sets=True) "
            f"requires member sets: {', '.join(SET_STORE_METHODS)})"
        )
    return store


def _member_sets(plain: Store, cfg: _Config) -> None:
    store = _sets_of(plain)
    _expect_eq(store.members("s"), [], "members() of a set never added to")
    _expect_eq(store.add_member("s", b"b"), 1, "add_member() to an absent set: size")
    _expect_eq(store.add_member("s", b"a"), 2, "add_member() of a second member: size")
    _expect_eq(store.add_member("s", b"b"), 2, "add_member() of a member already present")
    _expect_eq(store.add_member("s", "c\u00e9"), 3, "add_member() of a str member: size")
    got = store.members("s")
    _expect(
        type(got) is list and all(type(m) is bytes for m in got),
        f"members() must return a list of bytes, got {got!r}",
    )
    _expect_eq(got, [b"a", b"b", "c\u00e9".encode()], "members() after 4 adds (1 duplicate)")
    odd = [b"\xff", b"Z", b"a\x00", b"a", b"\x00\x01", bytes(range(256)), b"x" * MAX_MEMBER_BYTES]
    for i, member in enumerate(odd, start=1):
        _expect_eq(
            store.add_member("odd set/\u00e9", member), i, f"size after adding {member[:8]!r}"
        )
    _expect_eq(store.members("odd set/\u00e9"), sorted(odd), "members() in bytewise order")
    _expect_eq(store.members("s"), [b"a", b"b", "c\u00e9".encode()], "another set is untouched")
    _expect_eq(store.members("odd set"), [], "a set whose name is a prefix of another's")
    _expect_eq(store.members("s/x"), [], "a set whose name extends another's")
    _expect_eq(store.add_member("s/x", b"a"), 1, "add_member() to a set named like 's/x'")
    _expect_eq(store.members("s"), [b"a", b"b", "c\u00e9".encode()], "set 's' after 's/x'")


def _sets_are_not_keys(plain: Store, cfg: _Config) -> None:
    store = _sets_of(plain)
    store.set_timeout(SHORT_TIMEOUT)
    store.add_member("only-a-set", b"m")
    _expect_eq(store.check(["only-a-set"]), False, "check() of a name that is only a set")
    _expect_eq(store.num_keys(), 0, "num_keys() with one set and no plain key")
    _expect_timeout(lambda: store.get("only-a-set"), "get() of a name that is only a set")
    _expect_eq(store.try_get("only-a-set"), None, "try_get() of a name that is only a set")
    store.set("both", b"plain")
    _expect_eq(store.add_member("both", b"member"), 1, "add_member() to a set named like a key")
    _expect_eq(store.get("both"), b"plain", "a plain key next to a set of the same name")
    _expect_eq(store.members("both"), [b"member"], "a set next to a plain key of the same name")
    _expect_eq(store.num_keys(), 1, "num_keys() counts plain keys only, not sets")
    _expect_eq(store.delete_key("both"), True, "delete_key() of the plain key")
    _expect_eq(store.members("both"), [b"member"], "delete_key() must leave the set alone")
    a, b = PrefixStore("a", store), PrefixStore("b", store)
    _expect_eq(a.add_member("s", b"x"), 1, "add_member() through PrefixStore('a')")
    _expect_eq(b.members("s"), [], "a set of prefix a must be invisible in prefix b")
    _expect_eq(store.members("a/s"), [b"x"], "the underlying set of PrefixStore('a') 's'")
    a.set("k", b"v")
    _expect_eq(a.try_get("k"), b"v", "try_get() through PrefixStore('a')")
    _expect_eq(b.try_get("k"), None, "try_get() through prefix b of a key of prefix a")


def _try_get(plain: Store, cfg: _Config) -> None:
    store = _sets_of(plain)
    # A try_get that waits for the store timeout takes longer than wake_within and fails.
    store.set_timeout(cfg.wake_within * 2)
    got, took = _timed(lambda: store.try_get("absent"))
    _expect_eq(got, None, "try_get() of an absent key")
    _expect(took <= cfg.wake_s, f"try_get() of an absent key took {took:.3g} s: it must not wait")
    store.set("k", b"v")
    got = store.try_get("k")
    _expect(type(got) is bytes, f"try_get() must return bytes, got {type(got).__name__}")
    _expect_eq(got, b"v", "try_get() of a present key")
    store.set("empty", b"")
    _expect_eq(store.try_get("empty"), b"", "try_get() of a key holding b'' (not None)")
    _expect_eq(store.add("n", 7), 7, "add() before try_get()")
    _expect_eq(store.try_get("n"), b"7", "try_get() of a counter")
    _expect_eq(store.delete_key("k"), True, "delete_key() before try_get()")
    _expect_eq(store.try_get("k"), None, "try_get() of a deleted key")


def _expect_rejected(
    call: Callable[[], object], error: type[Exception], says: str, what: str
) -> None:
    try:
        result = call()
    except error as exc:
        _expect(says in str(exc), f"{what}: the {error.__name__} must say {says!r}, got {exc}")
        return
    raise _Broken(f"{what} must raise {error.__name__}, but returned {result!r}")


def _member_bounds(plain: Store, cfg: _Config) -> None:
    store = _sets_of(plain)
    store.add_member("s", b"ok")
    too_long = b"x" * (MAX_MEMBER_BYTES + 1)
    bound = str(MAX_MEMBER_BYTES)  # a clear error names the bound
    _expect_rejected(
        lambda: store.add_member("s", too_long), ValueError, bound, "a 1025-byte member"
    )
    _expect_rejected(
        lambda: store.add_member("s", "\u00e9" * 513), ValueError, bound, "a 1026-byte str member"
    )
    _expect_rejected(lambda: store.add_member("s", b""), ValueError, bound, "an empty member")
    bad: object = 7
    _expect_rejected(
        lambda: store.add_member("s", bad),  # type: ignore[arg-type]
        TypeError,
        "int",
        "an int member",
    )
    bad_key: object = b"s"
    _expect_rejected(
        lambda: store.add_member(bad_key, b"m"),  # type: ignore[arg-type]
        TypeError,
        "bytes",
        "a bytes set name",
    )
    _expect_eq(store.members("s"), [b"ok"], "members() after rejected adds (nothing stored)")
    # remove_member() validates exactly as add_member() does (a bad member is an error,
    # not a no-op that hides the caller's bug).
    _expect_rejected(
        lambda: store.remove_member("s", too_long), ValueError, bound, "removing a 1025-byte member"
    )
    _expect_rejected(
        lambda: store.remove_member("s", b""), ValueError, bound, "removing an empty member"
    )
    _expect_rejected(
        lambda: store.remove_member("s", bad),  # type: ignore[arg-type]
        TypeError,
        "int",
        "removing an int member",
    )
    _expect_rejected(
        lambda: store.remove_member(bad_key, b"ok"),  # type: ignore[arg-type]
        TypeError,
        "bytes",
        "removing from a bytes set name",
    )
    _expect_eq(store.members("s"), [b"ok"], "members() after rejected removes (nothing removed)")


def _sizes_at_once(cfg: _Config, call: Callable[[str], int], what: str, expected: range) -> None:
    """``cfg.threads`` threads, started together, each ``call`` members ``t<i>.<j>`` for
    ``j < cfg.increments``; the sizes returned, sorted, must be ``expected``."""
    n, m = cfg.threads, cfg.increments
    start = threading.Barrier(n, timeout=THREADS_START_S)
    sizes: list[list[int]] = [[] for _ in range(n)]

    def worker(i: int) -> None:
        start.wait()
        sizes[i].extend(call(f"t{i}.{j}") for j in range(m))

    workers = [_Worker(f"{what}-{i}", functools.partial(worker, i)).start() for i in range(n)]
    _join_all(workers, cfg.wake_s + CONCURRENT_WORK_S, f"concurrent {what}()")
    _expect_eq(
        sorted(v for r in sizes for v in r),
        list(expected),
        f"the sizes {n}x{m} concurrent {what}() of distinct members returned (each once)",
    )


def _concurrent_add_member(plain: Store, cfg: _Config) -> None:
    store = _sets_of(plain)
    n, m = cfg.threads, cfg.increments
    add = functools.partial(store.add_member, "joined")
    _sizes_at_once(cfg, add, "add_member", range(1, n * m + 1))
    everyone = sorted(f"t{i}.{j}".encode() for i in range(n) for j in range(m))
    _expect_eq(store.members("joined"), everyone, "members() after the concurrent adds")
    _expect_eq(store.add_member("joined", b"t0.0"), n * m, "re-adding a member afterwards")


def _remove_member(plain: Store, cfg: _Config) -> None:
    store = _sets_of(plain)
    _expect_eq(store.remove_member("s", b"a"), 0, "remove_member() from a set never added to")
    _expect_eq(store.members("s"), [], "members() after a remove_member() from an absent set")
    for member in (b"a", b"b", "c\u00e9"):
        store.add_member("s", member)
    _expect_eq(store.remove_member("s", b"b"), 2, "remove_member() of a present member: size")
    _expect_eq(store.members("s"), [b"a", "c\u00e9".encode()], "members() after remove_member()")
    _expect_eq(store.remove_member("s", b"b"), 2, "remove_member() again (now absent): size")
    _expect_eq(store.remove_member("s", b"zz"), 2, "remove_member() of a member never added")
    _expect_eq(store.remove_member("s", "c\u00e9"), 1, "remove_member() of a str member: size")
    _expect_eq(store.members("s"), [b"a"], "members() after removing the str member")
    _expect_eq(store.remove_member("s", b"a"), 0, "remove_member() of the last member: size")
    _expect_eq(store.members("s"), [], "members() after removing the last member")
    _expect_eq(store.remove_member("s", b"a"), 0, "remove_member() from an emptied set")
    _expect_eq(store.add_member("s", b"b"), 1, "add_member() to an emptied set starts at 1")
    _expect_eq(store.add_member("s", b"a"), 2, "add_member() of a removed member: size")
    _expect_eq(store.members("s"), [b"a", b"b"], "members() after removed members came back")
    # Odd members (NUL, 0xFF, every byte, the largest allowed) go as exactly as they came,
    # and only from their own set: not from a set whose name is a prefix of, or extends,
    # this one's.
    odd = [b"\xff", b"a\x00", b"\x00\x01", bytes(range(256)), b"x" * MAX_MEMBER_BYTES]
    for name in ("odd", "odd/x", "od"):
        for member in odd:
            store.add_member(name, member)
    for i, member in enumerate(odd, start=1):
        _expect_eq(
            store.remove_member("odd", member),
            len(odd) - i,
            f"size after removing {member[:8]!r} from set 'odd'",
        )
    _expect_eq(store.members("odd"), [], "set 'odd' after removing every member")
    _expect_eq(store.members("odd/x"), sorted(odd), "set 'odd/x' after emptying set 'odd'")
    _expect_eq(store.members("od"), sorted(odd), "set 'od' after emptying set 'odd'")
    _expect_eq(store.members("s"), [b"a", b"b"], "set 's' after emptying set 'odd'")


def _removal_is_local(plain: Store, cfg: _Config) -> None:
    store = _sets_of(plain)
    store.set_timeout(SHORT_TIMEOUT)
    store.set("both", b"plain")
    store.add_member("both", b"member")
    _expect_eq(store.remove_member("both", b"member"), 0, "remove_member() beside a plain key")
    _expect_eq(store.get("both"), b"plain", "a plain key after its namesake set was emptied")
    _expect_eq(store.num_keys(), 1, "num_keys() after a set was emptied (plain keys only)")
    _expect_eq(store.remove_member("both", b"plain"), 0, "remove_member() of a key's value")
    _expect_eq(store.get("both"), b"plain", "remove_member() must never touch a plain key")
    store.add_member("both", b"member")
    _expect_eq(store.delete_key("both"), True, "delete_key() of the plain key")
    _expect_eq(store.members("both"), [b"member"], "delete_key() must leave the set alone")
    _expect_eq(store.remove_member("only-a-key", b"m"), 0, "remove_member() of a name with no set")
    store.set("only-a-key", b"m")
    _expect_eq(store.remove_member("only-a-key", b"m"), 0, "remove_member() of a key, no set")
    _expect_eq(store.get("only-a-key"), b"m", "a plain key after remove_member() of its name")
    a, b = PrefixStore("a", store), PrefixStore("b", store)
    for view in (a, b):
        view.add_member("s", b"x")
        view.add_member("s", b"y")
    store.add_member("s", b"x")
    _expect_eq(a.remove_member("s", b"x"), 1, "remove_member() through PrefixStore('a')")
    _expect_eq(a.members("s"), [b"y"], "members() through prefix a after its remove_member()")
    _expect_eq(store.members("a/s"), [b"y"], "the underlying set of PrefixStore('a') 's'")
    _expect_eq(b.members("s"), [b"x", b"y"], "a remove through prefix a must not touch prefix b")
    _expect_eq(store.members("s"), [b"x"], "a remove through prefix a must not touch set 's'")
    _expect_eq(b.remove_member("s", b"z"), 2, "remove_member() of an absent member via prefix b")


def _concurrent_remove_member(plain: Store, cfg: _Config) -> None:
    store = _sets_of(plain)
    n, m = cfg.threads, cfg.increments
    everyone = [f"t{i}.{j}" for i in range(n) for j in range(m)]
    for member in everyone:
        store.add_member("leaving", member)
    _expect_eq(len(store.members("leaving")), n * m, "members() before the concurrent removes")
    remove = functools.partial(store.remove_member, "leaving")
    _sizes_at_once(cfg, remove, "remove_member", range(n * m))
    _expect_eq(store.members("leaving"), [], "members() after every member was removed")
    _expect_eq(store.remove_member("leaving", b"t0.0"), 0, "removing a member again afterwards")


_SET_PROPERTIES: tuple[tuple[str, Callable[[Store, _Config], None]], ...] = (
    ("member sets: add_member sizes, duplicates, members order", _member_sets),
    ("try_get returns None at once or the value", _try_get),
    ("member sets are not keys (get/check/num_keys/PrefixStore)", _sets_are_not_keys),
    ("member bounds give clear errors", _member_bounds),
    ("concurrent add_member() gives each caller its own size", _concurrent_add_member),
    ("remove_member sizes, absent members, emptied sets, re-adds", _remove_member),
    ("remove_member touches only its own set (keys, other sets, prefixes)", _removal_is_local),
    ("concurrent remove_member() gives each caller its own size", _concurrent_remove_member),
)

_PROPERTIES: tuple[tuple[str, Callable[[Store, _Config], None]], ...] = (
    ("a fresh store is empty", _empty),
    ("timeout / set_timeout", _timeout_property),
    ("set and get", _set_and_get),
    ("missing keys time out with StoreTimeoutError", _missing_keys_time_out),
    ("get/wait wake on a write from another thread", _blocking_reads_wake),
    ("compare_set contract", _compare_set),
    ("add", _add),
    ("multi_get / multi_set", _multi),
    ("delete_key, check and num_keys", _delete_and_count),
    ("wait_for_change returns at once or times out", _wait_for_change_immediate),
    ("wait_for_change wakes on a write from another thread", _wait_for_change_wakes),
    ("wait_for_change ignores writes that change nothing", _wait_for_change_ignores_no_change),
    ("PrefixStore isolation", _prefix_isolation),
    ("concurrent add() loses no update", _concurrent_add),
    ("concurrent compare_set increments lose no update", _concurrent_cas),
)

PROPERTY_NAMES: tuple[str, ...] = tuple(name for name, _ in _PROPERTIES + _SET_PROPERTIES)
"""The names of :func:`check_store`'s properties, in the order it runs them (the names
its failure messages quote, and the values ``only=`` takes)."""


def _selected(only: Collection[str] | None) -> frozenset[str] | None:
    if only is None:
        return None
    if isinstance(only, str):
        raise ValueError(
            f"only={only!r} is one string; pass a list of property names, e.g. only=[{only!r}]"
        )
    unknown = sorted(set(only) - set(PROPERTY_NAMES))
    if unknown or not only:
        raise ValueError(
            f"only={sorted(only)!r}: "
            + (f"unknown property name(s) {unknown!r}" if unknown else "no property named")
            + f"; pick from rdzv.testing.PROPERTY_NAMES: {list(PROPERTY_NAMES)!r}"
        )
    return frozenset(only)


def check_store(
    factory: StoreFactory,
    *,
    url: str | None = None,
    opener: str | None = None,
    threads: int = 4,
    increments: int = 50,
    processes: int = 3,
    wake_within: timedelta = timedelta(seconds=5),
    sets: bool | None = None,
    only: Collection[str] | None = None,
) -> None:
    """Run the conformance suite on stores made by ``factory``; raise on the first failure.

    ``threads`` threads each do ``increments`` ``add``, CAS increments, ``add_member``
    and ``remove_member`` calls. When ``url`` is given,
    :func:`check_store_across_processes` also runs on it (``opener`` and ``processes``
    are passed on).

    ``sets`` picks the member-set properties (:class:`~rdzv.store.SetStore`): ``True``
    requires them (a store without ``add_member``/``remove_member``/``members``/
    ``try_get`` fails), ``False`` skips them, ``None`` runs them when the store has these
    methods.

    ``only`` (names from :data:`PROPERTY_NAMES`) runs just those properties, e.g. to
    check that one property catches a store with a known bug without the other
    properties' bounds in the way; ``None`` (the default) runs them all. ``sets`` still
    applies to the member-set properties named, and the check across processes still
    runs when ``url`` is given. An unknown name raises ``ValueError``.
    """
    if threads < 2 or increments < 1:
        raise ValueError(f"need threads >= 2 and increments >= 1, got {threads}, {increments}")
    chosen = _selected(only)
    cfg = _Config(threads=threads, increments=increments, wake_within=wake_within)
    properties = [(name, prop, False) for name, prop in _PROPERTIES]
    if sets is not False:
        properties += [(name, prop, sets is None) for name, prop in _SET_PROPERTIES]
    if chosen is not None:
        properties = [p for p in properties if p[0] in chosen]
    for name, prop, optional in properties:
        store = factory()
        if optional and not isinstance(store, SetStore):
            _close(store)
            continue
        try:
            _expect(
                isinstance(store, Store),
                f"factory() returned {type(store).__name__}, which lacks Store methods",
            )
            _expect_eq(store.num_keys(), 0, "num_keys() of a store from factory() (must be empty)")
            prop(store, cfg)
        except AssertionError as exc:
            raise AssertionError(f"store conformance: {name!r} failed for {store!r}: {exc}") from (
                None if isinstance(exc, _Broken) else exc
            )
        except Exception as exc:
            raise AssertionError(
                f"store conformance: {name!r}: {store!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            _close(store)
    if url is not None:
        check_store_across_processes(
            url, opener=opener, processes=processes, increments=increments, wake_within=wake_within
        )


# -- processes ---------------------------------------------------------------------------


def _open(url: str, opener: str | None, timeout: timedelta) -> Store:
    if opener is None:
        return open_store(url, timeout=timeout)
    module, _, name = opener.partition(":")
    fn = getattr(importlib.import_module(module), name)
    store = fn(url, timeout)
    _expect(isinstance(store, Store), f"opener {opener!r} returned {store!r}, not a Store")
    return store  # type: ignore[no-any-return]


def _child_main(
    url: str, opener: str | None, prefix: str, index: int, increments: int, wait_s: float
) -> None:
    """A child process of :func:`check_store_across_processes` (spawned; args are str/int).

    Announces itself (``add("ready", 1)``), blocks until the parent writes ``go`` (a
    wake-up across processes), joins the member set ``joined`` and leaves the member set
    ``leaving`` when the store has member sets (recording the sizes it got under
    ``size/<index>`` and ``left/<index>``), then increments; reports ``ok`` or the error
    under ``done/<index>`` and exits 0 or 1.
    """
    base = _open(url, opener, timedelta(seconds=wait_s))
    store = PrefixStore(prefix, base)
    try:
        store.add("ready", 1)
        store.wait(["go"])
        if isinstance(base, SetStore):
            store.set(f"size/{index}", str(store.add_member("joined", f"p{index}")))
            store.set(f"left/{index}", str(store.remove_member("leaving", f"p{index}")))
        for j in range(increments):
            store.add("added", 1)
            _cas_increment(store, "counter", f"p{index}.{j}")
        store.set(f"done/{index}", b"ok")
    except BaseException as exc:
        traceback.print_exc()
        try:
            store.set(f"done/{index}", f"{type(exc).__name__}: {exc}")
        finally:
            sys.exit(1)
    finally:
        _close(base)


class _ProcessCheckFailed(AssertionError):
    pass


def check_store_across_processes(
    url: str,
    *,
    opener: str | None = None,
    processes: int = 3,
    increments: int = 20,
    wake_within: timedelta = timedelta(seconds=5),
    start_within: timedelta = timedelta(seconds=60),
) -> None:
    """Spawn ``processes`` children that reopen ``url``; check wake-ups and lost updates.

    Each child announces itself, waits for the parent's ``go`` (the parent sleeps in
    ``wait_for_change`` until every child announced, and each child in ``wait``: both
    are wake-ups across processes), then does ``increments`` ``add(1)`` and CAS
    increments on shared counters; no update may be lost. When the store has member sets
    (:class:`~rdzv.store.SetStore`), each child also joins one set and leaves another
    (filled by the parent with every child's member) at the same moment: the sizes
    ``add_member`` returned must be ``1..processes`` and those ``remove_member`` returned
    ``0..processes-1``, each once.

    The store is opened with :func:`rdzv.stores.open_store`, or with ``opener``, a
    ``"module:function"`` reference to a ``(url, timeout) -> Store`` callable importable
    in a fresh interpreter. Keys live under a fresh prefix, so ``url`` may name a shared
    server; they are deleted afterwards, and the member sets emptied with
    ``remove_member``. Children are started with the ``spawn``
    context and receive only strings and ints. Bounds: children must announce
    themselves within ``start_within`` (interpreter start-up) and finish within
    ``wake_within`` per increment after that; the kit terminates any child left.
    """
    if processes < 2 or increments < 1:
        raise ValueError(f"need processes >= 2 and increments >= 1, got {processes}, {increments}")
    if opener is None and url.lower().startswith("memory:"):
        raise ValueError(
            f"{url!r}: a memory:// store is private to its process, so child processes "
            "cannot share it; use a store that processes share (e.g. sqlite:///path.db)"
        )
    start_s = start_within.total_seconds()
    work_s = wake_within.total_seconds() * (increments + 2)
    base = _open(url, opener, timedelta(seconds=start_s + work_s))
    prefix = f"rdzv-conformance/{uuid.uuid4().hex}"
    store = PrefixStore(prefix, base)
    keys = ["ready", "go", "counter", "added"]
    keys += [f"{kind}/{i}" for kind in ("done", "size", "left") for i in range(processes)]
    sets = base if isinstance(base, SetStore) else None
    everyone = [f"p{i}" for i in range(processes)]
    ctx = multiprocessing.get_context("spawn")
    children = [
        ctx.Process(
            target=_child_main,
            args=(url, opener, prefix, i, increments, start_s + work_s),
            name=f"rdzv-conformance-{i}",
            daemon=True,
        )
        for i in range(processes)
    ]

    def fail(what: str) -> _ProcessCheckFailed:
        return _ProcessCheckFailed(f"store conformance across processes ({url}): {what}")

    def exited_early() -> None:
        for i, child in enumerate(children):
            if not child.is_alive():
                report = store.get(f"done/{i}") if store.check([f"done/{i}"]) else None
                raise fail(
                    f"child {i} exited with code {child.exitcode} before the others were "
                    f"ready, reporting {report!r} (its traceback is on stderr)"
                )

    try:
        store.set("counter", b"0:init")
        if sets is not None:
            for member in everyone:
                store.add_member("leaving", member)
        for child in children:
            child.start()
        # Wait for every child to announce itself; bounded by start_within, in slices of
        # LIVENESS_CHECK_S so a child that dies is reported at once.
        deadline = time.monotonic() + start_s
        while True:
            ready = store.get("ready") if store.check(["ready"]) else None
            if ready is not None and int(ready) >= processes:
                break
            exited_early()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise fail(
                    f"only {int(ready or 0)} of {processes} children announced themselves within "
                    f"{start_s:.3g} s (slow start-up, or a write that other processes never see)"
                )
            step = timedelta(seconds=min(remaining, LIVENESS_CHECK_S))
            store.wait_for_change("ready", ready, step)
        store.set("go", b"1")
        deadline = time.monotonic() + work_s
        # Bounded by the deadline. join() blocks until the child is reaped; a loop over
        # is_alive() and sentinels can see a sentinel ready before the child is reaped.
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
        stuck = [c.name for c in children if c.is_alive()]
        if stuck:
            raise fail(
                f"children {stuck} did not finish within {work_s:.3g} s after 'go' (a lost "
                "wake-up across processes, or a lock that is never released?)"
            )
        for i, child in enumerate(children):
            report = store.get(f"done/{i}") if store.check([f"done/{i}"]) else None
            if child.exitcode != 0 or report != b"ok":
                raise fail(
                    f"child {i} exited with code {child.exitcode}, reporting {report!r} "
                    "(its traceback is on stderr)"
                )
        total = processes * increments
        added = store.get("added")
        if added != str(total).encode():
            raise fail(f"{processes}x{increments} add(1) left {added!r}, expected {total}")
        counter = _count_of(store.get("counter"))
        if counter != total:
            raise fail(
                f"{processes}x{increments} CAS increments reached {counter}, expected {total} "
                "(lost updates: compare_set is not atomic across processes)"
            )
        if sets is not None:
            sizes = sorted(int(v) for v in store.multi_get([f"size/{i}" for i in range(processes)]))
            if sizes != list(range(1, processes + 1)):
                raise fail(
                    f"{processes} processes joining one member set got sizes {sizes}, expected "
                    f"each of 1..{processes} once (add_member is not atomic across processes)"
                )
            joined = store.members("joined")
            expected = sorted(m.encode() for m in everyone)
            if joined != expected:
                raise fail(f"the member set holds {joined!r}, expected {expected!r}")
            left = sorted(int(v) for v in store.multi_get([f"left/{i}" for i in range(processes)]))
            if left != list(range(processes)):
                raise fail(
                    f"{processes} processes leaving one member set got sizes {left}, expected "
                    f"each of 0..{processes - 1} once (remove_member is not atomic across "
                    "processes)"
                )
            stayed = store.members("leaving")
            if stayed:
                raise fail(f"the member set every child left still holds {stayed!r}")
    except _Broken as exc:
        raise fail(str(exc)) from None
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join(PROCESS_STOP_S)
            if child.is_alive():
                child.kill()
            if child.pid is not None:
                child.join(PROCESS_STOP_S)
        try:
            for key in keys:
                store.delete_key(key)
            if sets is not None:
                for name in ("joined", "leaving"):
                    for member in everyone:
                        store.remove_member(name, member)
        finally:
            _close(base)
