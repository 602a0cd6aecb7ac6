"""The key-value properties every :class:`~rdzv.store.Store` must have; each gets a fresh,
empty store from :func:`rdzv.testing.check_store`."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from rdzv.conformance.common import (
    CONCURRENT_WORK_S,
    MAX_CAS_ATTEMPTS,
    SHORT_TIMEOUT,
    THREADS_START_S,
    WRITER_S,
    Broken,
    Config,
    Worker,
    after_delay,
    expect,
    expect_eq,
    expect_timeout,
    join_all,
    timed,
)
from rdzv.store import PrefixStore, Store

# -- the properties (each gets a fresh, empty store) ------------------------------------


def _empty(store: Store, cfg: Config) -> None:
    expect_eq(store.num_keys(), 0, "num_keys() of a fresh store from the factory")
    expect_eq(store.check(["k"]), False, "check(['k']) on an empty store")
    expect_eq(store.check([]), True, "check([]) (no keys: vacuously present)")


def _timeout_property(store: Store, cfg: Config) -> None:
    store.set_timeout(SHORT_TIMEOUT)
    expect_eq(store.timeout, SHORT_TIMEOUT, "timeout after set_timeout(50 ms)")
    store.set_timeout(timedelta(seconds=7))
    expect_eq(store.timeout, timedelta(seconds=7), "timeout after set_timeout(7 s)")


def _set_and_get(store: Store, cfg: Config) -> None:
    store.set("k", b"v1")
    got = store.get("k")
    expect(type(got) is bytes, f"get() must return bytes, got {type(got).__name__}")
    expect_eq(got, b"v1", "get('k') after set('k', b'v1')")
    store.set("k", b"v2")
    expect_eq(store.get("k"), b"v2", "get('k') after overwriting with b'v2'")
    every_byte = bytes(range(256))
    store.set("binary", every_byte)
    expect_eq(store.get("binary"), every_byte, "a value holding every byte 0..255")
    store.set("empty", b"")
    expect_eq(store.get("empty"), b"", "an empty value")
    expect_eq(store.check(["empty"]), True, "check() of a key holding an empty value")
    store.set("text", "h\u00e9llo \u2713")
    expect_eq(store.get("text"), "h\u00e9llo \u2713".encode(), "a str value (stored as UTF-8)")
    store.set("key with spaces/and/slashes \u00e9", b"x")
    expect_eq(store.get("key with spaces/and/slashes \u00e9"), b"x", "an unusual key")
    expect_eq(store.num_keys(), 5, "num_keys() after writing 5 distinct keys")


def _missing_keys_time_out(store: Store, cfg: Config) -> None:
    store.set_timeout(SHORT_TIMEOUT)
    store.set("present", b"p")
    expect_timeout(lambda: store.get("missing"), "get() of a missing key")
    expect_timeout(
        lambda: store.multi_get(["present", "missing"]), "multi_get() with a missing key"
    )
    expect_timeout(lambda: store.wait(["missing"]), "wait() on a missing key (store timeout)")
    expect_timeout(
        lambda: store.wait(["present", "missing"], timedelta(milliseconds=10)),
        "wait() with an explicit 10 ms timeout and a missing key",
    )
    store.wait(["present"])
    store.wait([])
    store.wait(["present"], timedelta(0))
    expect_eq(store.check(["missing"]), False, "check() after a failed get (no side effect)")


def _blocking_reads_wake(store: Store, cfg: Config) -> None:
    # The store timeout is longer than wake_within, so returning only at the timeout fails.
    store.set_timeout(cfg.wake_within * 2)
    writer = after_delay("writer", lambda: store.set("late", b"here"))
    try:
        got, took = timed(lambda: store.get("late"))
    finally:
        join_all([writer], WRITER_S, "get() waking on a write")
    expect_eq(got, b"here", "get() of a key another thread writes while it waits")
    expect(took <= cfg.wake_s, f"get() took {took:.3g} s to see a write (> {cfg.wake_s} s)")

    store.set("a", b"1")
    writer = after_delay("writer", lambda: store.multi_set(["b", "c"], [b"2", b"3"]))
    try:
        _, took = timed(lambda: store.wait(["a", "b", "c"]))
    finally:
        join_all([writer], WRITER_S, "wait() waking on a write")
    expect(took <= cfg.wake_s, f"wait() took {took:.3g} s to see a write (> {cfg.wake_s} s)")
    expect_eq(store.multi_get(["a", "b", "c"]), [b"1", b"2", b"3"], "values after the wait")


def _compare_set(store: Store, cfg: Config) -> None:
    got = store.compare_set("k", b"", b"first")
    expect_eq(got, b"first", "compare_set(absent key, expected=b'', desired) return")
    expect_eq(store.get("k"), b"first", "value after compare_set created the key")

    got = store.compare_set("k", b"first", b"second")
    expect_eq(got, b"second", "compare_set with the matching expected value: return")
    expect_eq(store.get("k"), b"second", "value after a matching compare_set")

    got = store.compare_set("k", b"first", b"third")
    expect_eq(got, b"second", "compare_set with a stale expected value must return the current")
    expect_eq(store.get("k"), b"second", "a compare_set with a stale expected value must not store")

    got = store.compare_set("k", b"", b"fourth")
    expect_eq(got, b"second", "compare_set(present key, expected=b'') must return the current")
    expect_eq(store.get("k"), b"second", "compare_set(present key, expected=b'') must not store")

    got = store.compare_set("absent", b"guess", b"new")
    expect_eq(got, b"guess", "compare_set(absent key, non-empty expected) returns expected")
    expect_eq(store.check(["absent"]), False, "compare_set(absent, non-empty) must not create")

    store.set("e", b"")
    got = store.compare_set("e", b"", b"filled")
    expect_eq(got, b"filled", "compare_set(key holding b'', expected=b'') must match")

    got = store.compare_set("k", "second", "\u00fcber")
    expect(type(got) is bytes, f"compare_set() must return bytes, got {type(got).__name__}")
    expect_eq(got, "\u00fcber".encode(), "compare_set with str expected/desired (UTF-8)")
    expect_eq(store.get("k"), "\u00fcber".encode(), "value after a str compare_set")
    got = store.compare_set("k", "stale", b"x")
    expect_eq(got, "\u00fcber".encode(), "compare_set with a stale str expected value")


def _add(store: Store, cfg: Config) -> None:
    expect_eq(store.add("n", 5), 5, "add() on a missing key starts from 0")
    expect_eq(store.get("n"), b"5", "add() stores decimal ASCII digits")
    expect_eq(store.add("n", 2), 7, "add(2) after 5")
    expect_eq(store.add("n", -10), -3, "add() with a negative amount")
    expect_eq(store.get("n"), b"-3", "a negative counter as ASCII")
    expect_eq(store.add("zero", 0), 0, "add(missing, 0)")
    expect_eq(store.check(["zero"]), True, "add(missing, 0) creates the key")
    store.set("digits", b"41")
    expect_eq(store.add("digits", 1), 42, "add() on a key set to ASCII digits")
    big = 2**62
    expect_eq(store.add("big", big), big, "add() of a large amount")
    expect_eq(store.get("big"), str(big).encode(), "a large counter as ASCII")


def _multi(store: Store, cfg: Config) -> None:
    store.multi_set(["a", "b", "c"], [b"1", "2", b""])
    expect_eq(store.multi_get(["c", "a", "b"]), [b"", b"1", b"2"], "multi_get keeps key order")
    expect_eq(store.multi_get(["a", "a"]), [b"1", b"1"], "multi_get with a repeated key")
    expect_eq(store.multi_get([]), [], "multi_get([])")
    store.multi_set(["a"], [b"10"])
    expect_eq(store.get("a"), b"10", "multi_set overwrites")
    store.multi_set([], [])
    expect_eq(store.num_keys(), 3, "num_keys() after multi_set of 3 keys")
    expect_eq(store.get("b"), b"2", "a str value written by multi_set")


def _delete_and_count(store: Store, cfg: Config) -> None:
    store.set_timeout(SHORT_TIMEOUT)
    store.set("a", b"1")
    store.set("b", b"2")
    store.set("a", b"3")
    expect_eq(store.num_keys(), 2, "num_keys() counts keys, not writes")
    expect_eq(store.delete_key("a"), True, "delete_key() of a present key")
    expect_eq(store.check(["a"]), False, "check() after delete_key()")
    expect_eq(store.check(["b"]), True, "delete_key() must leave other keys")
    expect_eq(store.num_keys(), 1, "num_keys() after delete_key()")
    expect_eq(store.delete_key("a"), False, "delete_key() of a missing key")
    expect_timeout(lambda: store.get("a"), "get() of a deleted key")
    got = store.compare_set("a", b"", b"again")
    expect_eq(got, b"again", "compare_set(expected=b'') on a deleted key")
    expect_eq(store.check(["a", "b"]), True, "check() of two present keys")
    expect_eq(store.check(["a", "b", "c"]), False, "check() with one missing key")


def _wait_for_change_immediate(store: Store, cfg: Config) -> None:
    short = SHORT_TIMEOUT
    long = cfg.wake_within
    expect_eq(store.wait_for_change("k", None, short), False, "absent key, current=None")
    expect_eq(store.wait_for_change("k", b"x", long), True, "absent key, current=b'x'")
    store.set("k", b"v")
    expect_eq(store.wait_for_change("k", b"v", short), False, "unchanged value times out")
    expect_eq(store.wait_for_change("k", None, long), True, "present key, current=None")
    expect_eq(store.wait_for_change("k", b"old", long), True, "different value")
    expect_eq(store.wait_for_change("k", b"v", timedelta(0)), False, "zero timeout, unchanged")
    store.set("e", b"")
    expect_eq(store.wait_for_change("e", b"", short), False, "b'' is a value, not absence")
    expect_eq(store.wait_for_change("e", None, long), True, "b'' differs from absent")


def _wait_for_change_wakes(store: Store, cfg: Config) -> None:
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
        writer = after_delay("writer", write)
        try:
            start = time.monotonic()
            woke = store.wait_for_change("k", current, long)
            took = time.monotonic() - start
        finally:
            join_all([writer], WRITER_S, f"wait_for_change() and {what}")
        expect_eq(woke, True, f"wait_for_change() while another thread makes {what}")
        expect(
            took <= cfg.wake_s,
            f"wait_for_change() took {took:.3g} s to notice {what} (> {cfg.wake_s} s)",
        )
        now = store.get("k") if store.check(["k"]) else None
        expect_eq(now, after, f"value after {what}")


def _wait_for_change_ignores_no_change(store: Store, cfg: Config) -> None:
    store.set("k", b"same")
    stop = threading.Event()

    def rewrite() -> None:
        for i in range(200):  # bound: ~0.4 s of rewrites at most
            if stop.is_set():
                return
            store.set("k", b"same")
            store.set("other", str(i))
            stop.wait(0.002)

    writer = Worker("rewriter", rewrite).start()
    try:
        woke = store.wait_for_change("k", b"same", timedelta(milliseconds=100))
    finally:
        stop.set()
        join_all([writer], WRITER_S, "rewriting the same value")
    expect_eq(
        woke,
        False,
        "wait_for_change() while others rewrite the same value and write other keys "
        "(True is allowed only when the value really differs)",
    )


def _prefix_isolation(store: Store, cfg: Config) -> None:
    a, b = PrefixStore("a", store), PrefixStore("b", store)
    a.set_timeout(SHORT_TIMEOUT)
    a.set("k", b"in a")
    b.set("k", b"in b")
    expect_eq(a.get("k"), b"in a", "PrefixStore('a') sees its own value")
    expect_eq(b.get("k"), b"in b", "PrefixStore('b') sees its own value")
    expect_eq(store.get("a/k"), b"in a", "the underlying key of PrefixStore('a').set('k')")
    a.set("only-a", b"1")
    expect_eq(b.check(["only-a"]), False, "a key of prefix a must be invisible in prefix b")
    expect_timeout(lambda: b.get("only-a"), "get() through prefix b of a key of prefix a")
    expect_eq(a.compare_set("k", b"in a", b"a2"), b"a2", "compare_set through prefix a")
    expect_eq(b.get("k"), b"in b", "compare_set through prefix a must not touch prefix b")
    expect_eq(a.add("n", 3), 3, "add through prefix a")
    expect_eq(b.add("n", 1), 1, "add through prefix b is a separate counter")
    a.multi_set(["x", "y"], [b"1", b"2"])
    expect_eq(b.check(["x"]), False, "multi_set through prefix a must not write prefix b")
    expect_eq(b.delete_key("k"), True, "delete_key through prefix b")
    expect_eq(a.get("k"), b"a2", "delete_key through prefix b must not delete prefix a's key")
    writer = after_delay("writer", lambda: b.set("w", b"b"))
    try:
        woke = a.wait_for_change("w", None, timedelta(milliseconds=150))
    finally:
        join_all([writer], WRITER_S, "writing through prefix b")
    expect_eq(woke, False, "a write through prefix b must not wake a waiter in prefix a")


def _concurrent_add(store: Store, cfg: Config) -> None:
    n, m = cfg.threads, cfg.increments
    start = threading.Barrier(n, timeout=THREADS_START_S)
    results: list[list[int]] = [[] for _ in range(n)]

    def adder(i: int) -> None:
        start.wait()
        results[i].extend(store.add("count", 1) for _ in range(m))

    workers = [Worker(f"adder-{i}", functools.partial(adder, i)).start() for i in range(n)]
    join_all(workers, cfg.wake_s + CONCURRENT_WORK_S, "concurrent add()")
    expect_eq(store.get("count"), str(n * m).encode(), f"counter after {n}x{m} concurrent add(1)")
    seen = sorted(v for r in results for v in r)
    expect_eq(seen, list(range(1, n * m + 1)), "the values add() returned (each exactly once)")


def count_of(value: bytes) -> int:
    head = value.split(b":", 1)[0]
    expect(head.isdigit(), f"the CAS counter holds {value!r}, not a value the kit wrote")
    return int(head)


def cas_increment(store: Store, key: str, tag: str) -> int:
    """Increment the counter at ``key`` by one with a get + compare_set loop.

    Values look like ``b"<count>:<tag>:<attempt>"``; ``tag`` must be unique per call,
    so a desired value is never written twice and ``compare_set`` returning it proves
    this call's write won. Bounded by :data:`MAX_CAS_ATTEMPTS`. Returns the attempts used.
    """
    for attempt in range(1, MAX_CAS_ATTEMPTS + 1):
        current = store.get(key)
        desired = f"{count_of(current) + 1}:{tag}:{attempt}".encode()
        got = store.compare_set(key, current, desired)
        if got == desired:
            return attempt
        expect(
            got != current,
            f"compare_set({key!r}, {current!r}, ...) did not store, yet returned the expected "
            "value as the current one",
        )
    raise Broken(f"increment {tag} did not succeed within {MAX_CAS_ATTEMPTS} CAS attempts")


def _concurrent_cas(store: Store, cfg: Config) -> None:
    n, m = cfg.threads, cfg.increments
    store.set("counter", b"0:init")
    start = threading.Barrier(n, timeout=THREADS_START_S)

    def incrementer(i: int) -> None:
        start.wait()
        for j in range(m):
            cas_increment(store, "counter", f"t{i}.{j}")

    workers = [Worker(f"cas-{i}", functools.partial(incrementer, i)).start() for i in range(n)]
    join_all(workers, cfg.wake_s + CONCURRENT_WORK_S, "concurrent compare_set increments")
    expect_eq(
        count_of(store.get("counter")),
        n * m,
        f"counter after {n}x{m} CAS increments (lost updates?)",
    )


KEY_PROPERTIES: tuple[tuple[str, Callable[[Store, Config], None]], ...] = (
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
