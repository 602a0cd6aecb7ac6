"""The member-set and ``try_get`` properties of a :class:`~rdzv.store.SetStore`; each gets
a fresh, empty store from :func:`rdzv.testing.check_store`."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from rdzv.conformance.common import (
    CONCURRENT_WORK_S,
    SHORT_TIMEOUT,
    THREADS_START_S,
    Broken,
    Config,
    Worker,
    expect,
    expect_eq,
    expect_timeout,
    join_all,
    timed,
)
from rdzv.store import MAX_MEMBER_BYTES, SET_STORE_METHODS, PrefixStore, SetStore, Store

# -- member sets and try_get (SetStore) ------------------------------------------------


def sets_of(store: Store) -> SetStore:
    if not isinstance(store, SetStore):
        lacking = [m for m in SET_STORE_METHODS if not hasattr(store, m)]
        raise Broken(
            f"{type(store).__name__} lacks {'/'.join(lacking)} (check_store(sets=True) "
            f"requires member sets: {', '.join(SET_STORE_METHODS)})"
        )
    return store


def _member_sets(plain: Store, cfg: Config) -> None:
    store = sets_of(plain)
    expect_eq(store.members("s"), [], "members() of a set never added to")
    expect_eq(store.add_member("s", b"b"), 1, "add_member() to an absent set: size")
    expect_eq(store.add_member("s", b"a"), 2, "add_member() of a second member: size")
    expect_eq(store.add_member("s", b"b"), 2, "add_member() of a member already present")
    expect_eq(store.add_member("s", "c\u00e9"), 3, "add_member() of a str member: size")
    got = store.members("s")
    expect(
        type(got) is list and all(type(m) is bytes for m in got),
        f"members() must return a list of bytes, got {got!r}",
    )
    expect_eq(got, [b"a", b"b", "c\u00e9".encode()], "members() after 4 adds (1 duplicate)")
    odd = [b"\xff", b"Z", b"a\x00", b"a", b"\x00\x01", bytes(range(256)), b"x" * MAX_MEMBER_BYTES]
    for i, member in enumerate(odd, start=1):
        expect_eq(
            store.add_member("odd set/\u00e9", member), i, f"size after adding {member[:8]!r}"
        )
    expect_eq(store.members("odd set/\u00e9"), sorted(odd), "members() in bytewise order")
    expect_eq(store.members("s"), [b"a", b"b", "c\u00e9".encode()], "another set is untouched")
    expect_eq(store.members("odd set"), [], "a set whose name is a prefix of another's")
    expect_eq(store.members("s/x"), [], "a set whose name extends another's")
    expect_eq(store.add_member("s/x", b"a"), 1, "add_member() to a set named like 's/x'")
    expect_eq(store.members("s"), [b"a", b"b", "c\u00e9".encode()], "set 's' after 's/x'")


def _sets_are_not_keys(plain: Store, cfg: Config) -> None:
    store = sets_of(plain)
    store.set_timeout(SHORT_TIMEOUT)
    store.add_member("only-a-set", b"m")
    expect_eq(store.check(["only-a-set"]), False, "check() of a name that is only a set")
    expect_eq(store.num_keys(), 0, "num_keys() with one set and no plain key")
    expect_timeout(lambda: store.get("only-a-set"), "get() of a name that is only a set")
    expect_eq(store.try_get("only-a-set"), None, "try_get() of a name that is only a set")
    store.set("both", b"plain")
    expect_eq(store.add_member("both", b"member"), 1, "add_member() to a set named like a key")
    expect_eq(store.get("both"), b"plain", "a plain key next to a set of the same name")
    expect_eq(store.members("both"), [b"member"], "a set next to a plain key of the same name")
    expect_eq(store.num_keys(), 1, "num_keys() counts plain keys only, not sets")
    expect_eq(store.delete_key("both"), True, "delete_key() of the plain key")
    expect_eq(store.members("both"), [b"member"], "delete_key() must leave the set alone")
    a, b = PrefixStore("a", store), PrefixStore("b", store)
    expect_eq(a.add_member("s", b"x"), 1, "add_member() through PrefixStore('a')")
    expect_eq(b.members("s"), [], "a set of prefix a must be invisible in prefix b")
    expect_eq(store.members("a/s"), [b"x"], "the underlying set of PrefixStore('a') 's'")
    a.set("k", b"v")
    expect_eq(a.try_get("k"), b"v", "try_get() through PrefixStore('a')")
    expect_eq(b.try_get("k"), None, "try_get() through prefix b of a key of prefix a")


def _try_get(plain: Store, cfg: Config) -> None:
    store = sets_of(plain)
    # A try_get that waits for the store timeout takes longer than wake_within and fails.
    store.set_timeout(cfg.wake_within * 2)
    got, took = timed(lambda: store.try_get("absent"))
    expect_eq(got, None, "try_get() of an absent key")
    expect(took <= cfg.wake_s, f"try_get() of an absent key took {took:.3g} s: it must not wait")
    store.set("k", b"v")
    got = store.try_get("k")
    expect(type(got) is bytes, f"try_get() must return bytes, got {type(got).__name__}")
    expect_eq(got, b"v", "try_get() of a present key")
    store.set("empty", b"")
    expect_eq(store.try_get("empty"), b"", "try_get() of a key holding b'' (not None)")
    expect_eq(store.add("n", 7), 7, "add() before try_get()")
    expect_eq(store.try_get("n"), b"7", "try_get() of a counter")
    expect_eq(store.delete_key("k"), True, "delete_key() before try_get()")
    expect_eq(store.try_get("k"), None, "try_get() of a deleted key")


def _expect_rejected(
    call: Callable[[], object], error: type[Exception], says: str, what: str
) -> None:
    try:
        result = call()
    except error as exc:
        expect(says in str(exc), f"{what}: the {error.__name__} must say {says!r}, got {exc}")
        return
    raise Broken(f"{what} must raise {error.__name__}, but returned {result!r}")


def _member_bounds(plain: Store, cfg: Config) -> None:
    store = sets_of(plain)
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
    expect_eq(store.members("s"), [b"ok"], "members() after rejected adds (nothing stored)")
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
    expect_eq(store.members("s"), [b"ok"], "members() after rejected removes (nothing removed)")


def _sizes_at_once(cfg: Config, call: Callable[[str], int], what: str, expected: range) -> None:
    """``cfg.threads`` threads, started together, each ``call`` members ``t<i>.<j>`` for
    ``j < cfg.increments``; the sizes returned, sorted, must be ``expected``."""
    n, m = cfg.threads, cfg.increments
    start = threading.Barrier(n, timeout=THREADS_START_S)
    sizes: list[list[int]] = [[] for _ in range(n)]

    def worker(i: int) -> None:
        start.wait()
        sizes[i].extend(call(f"t{i}.{j}") for j in range(m))

    workers = [Worker(f"{what}-{i}", functools.partial(worker, i)).start() for i in range(n)]
    join_all(workers, cfg.wake_s + CONCURRENT_WORK_S, f"concurrent {what}()")
    expect_eq(
        sorted(v for r in sizes for v in r),
        list(expected),
        f"the sizes {n}x{m} concurrent {what}() of distinct members returned (each once)",
    )


def _concurrent_add_member(plain: Store, cfg: Config) -> None:
    store = sets_of(plain)
    n, m = cfg.threads, cfg.increments
    add = functools.partial(store.add_member, "joined")
    _sizes_at_once(cfg, add, "add_member", range(1, n * m + 1))
    everyone = sorted(f"t{i}.{j}".encode() for i in range(n) for j in range(m))
    expect_eq(store.members("joined"), everyone, "members() after the concurrent adds")
    expect_eq(store.add_member("joined", b"t0.0"), n * m, "re-adding a member afterwards")


def _remove_member(plain: Store, cfg: Config) -> None:
    store = sets_of(plain)
    expect_eq(store.remove_member("s", b"a"), 0, "remove_member() from a set never added to")
    expect_eq(store.members("s"), [], "members() after a remove_member() from an absent set")
    for member in (b"a", b"b", "c\u00e9"):
        store.add_member("s", member)
    expect_eq(store.remove_member("s", b"b"), 2, "remove_member() of a present member: size")
    expect_eq(store.members("s"), [b"a", "c\u00e9".encode()], "members() after remove_member()")
    expect_eq(store.remove_member("s", b"b"), 2, "remove_member() again (now absent): size")
    expect_eq(store.remove_member("s", b"zz"), 2, "remove_member() of a member never added")
    expect_eq(store.remove_member("s", "c\u00e9"), 1, "remove_member() of a str member: size")
    expect_eq(store.members("s"), [b"a"], "members() after removing the str member")
    expect_eq(store.remove_member("s", b"a"), 0, "remove_member() of the last member: size")
    expect_eq(store.members("s"), [], "members() after removing the last member")
    expect_eq(store.remove_member("s", b"a"), 0, "remove_member() from an emptied set")
    expect_eq(store.add_member("s", b"b"), 1, "add_member() to an emptied set starts at 1")
    expect_eq(store.add_member("s", b"a"), 2, "add_member() of a removed member: size")
    expect_eq(store.members("s"), [b"a", b"b"], "members() after removed members came back")
    # Odd members (NUL, 0xFF, every byte, the largest allowed) go as exactly as they came,
    # and only from their own set: not from a set whose name is a prefix of, or extends,
    # this one's.
    odd = [b"\xff", b"a\x00", b"\x00\x01", bytes(range(256)), b"x" * MAX_MEMBER_BYTES]
    for name in ("odd", "odd/x", "od"):
        for member in odd:
            store.add_member(name, member)
    for i, member in enumerate(odd, start=1):
        expect_eq(
            store.remove_member("odd", member),
            len(odd) - i,
            f"size after removing {member[:8]!r} from set 'odd'",
        )
    expect_eq(store.members("odd"), [], "set 'odd' after removing every member")
    expect_eq(store.members("odd/x"), sorted(odd), "set 'odd/x' after emptying set 'odd'")
    expect_eq(store.members("od"), sorted(odd), "set 'od' after emptying set 'odd'")
    expect_eq(store.members("s"), [b"a", b"b"], "set 's' after emptying set 'odd'")


def _removal_is_local(plain: Store, cfg: Config) -> None:
    store = sets_of(plain)
    store.set_timeout(SHORT_TIMEOUT)
    store.set("both", b"plain")
    store.add_member("both", b"member")
    expect_eq(store.remove_member("both", b"member"), 0, "remove_member() beside a plain key")
    expect_eq(store.get("both"), b"plain", "a plain key after its namesake set was emptied")
    expect_eq(store.num_keys(), 1, "num_keys() after a set was emptied (plain keys only)")
    expect_eq(store.remove_member("both", b"plain"), 0, "remove_member() of a key's value")
    expect_eq(store.get("both"), b"plain", "remove_member() must never touch a plain key")
    store.add_member("both", b"member")
    expect_eq(store.delete_key("both"), True, "delete_key() of the plain key")
    expect_eq(store.members("both"), [b"member"], "delete_key() must leave the set alone")
    expect_eq(store.remove_member("only-a-key", b"m"), 0, "remove_member() of a name with no set")
    store.set("only-a-key", b"m")
    expect_eq(store.remove_member("only-a-key", b"m"), 0, "remove_member() of a key, no set")
    expect_eq(store.get("only-a-key"), b"m", "a plain key after remove_member() of its name")
    a, b = PrefixStore("a", store), PrefixStore("b", store)
    for view in (a, b):
        view.add_member("s", b"x")
        view.add_member("s", b"y")
    store.add_member("s", b"x")
    expect_eq(a.remove_member("s", b"x"), 1, "remove_member() through PrefixStore('a')")
    expect_eq(a.members("s"), [b"y"], "members() through prefix a after its remove_member()")
    expect_eq(store.members("a/s"), [b"y"], "the underlying set of PrefixStore('a') 's'")
    expect_eq(b.members("s"), [b"x", b"y"], "a remove through prefix a must not touch prefix b")
    expect_eq(store.members("s"), [b"x"], "a remove through prefix a must not touch set 's'")
    expect_eq(b.remove_member("s", b"z"), 2, "remove_member() of an absent member via prefix b")


def _concurrent_remove_member(plain: Store, cfg: Config) -> None:
    store = sets_of(plain)
    n, m = cfg.threads, cfg.increments
    everyone = [f"t{i}.{j}" for i in range(n) for j in range(m)]
    for member in everyone:
        store.add_member("leaving", member)
    expect_eq(len(store.members("leaving")), n * m, "members() before the concurrent removes")
    remove = functools.partial(store.remove_member, "leaving")
    _sizes_at_once(cfg, remove, "remove_member", range(n * m))
    expect_eq(store.members("leaving"), [], "members() after every member was removed")
    expect_eq(store.remove_member("leaving", b"t0.0"), 0, "removing a member again afterwards")


SET_PROPERTIES: tuple[tuple[str, Callable[[Store, Config], None]], ...] = (
    ("member sets: add_member sizes, duplicates, members order", _member_sets),
    ("try_get returns None at once or the value", _try_get),
    ("member sets are not keys (get/check/num_keys/PrefixStore)", _sets_are_not_keys),
    ("member bounds give clear errors", _member_bounds),
    ("concurrent add_member() gives each caller its own size", _concurrent_add_member),
    ("remove_member sizes, absent members, emptied sets, re-adds", _remove_member),
    ("remove_member touches only its own set (keys, other sets, prefixes)", _removal_is_local),
    ("concurrent remove_member() gives each caller its own size", _concurrent_remove_member),
)
