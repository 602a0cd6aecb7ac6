"""The conformance kit fails loudly: each deliberately broken store below is caught.

Each broken store is a correct store with one planted bug; the test names the property
that must catch it. The racy ones meet at a barrier inside the broken operation, so
the lost update happens on every run (no reliance on thread scheduling luck).
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from test_stores import MemoryWithout

from rdzv.store import Store, as_bytes
from rdzv.stores import MemoryStore, SQLiteStore
from rdzv.stores.common import check_key
from rdzv.stores.sqlite import open_sqlite
from rdzv.testing import PROPERTY_NAMES, check_store, check_store_across_processes

QUICK = timedelta(milliseconds=200)  # wake_within for the stores planted as too slow
THREADS = 4


class OverwritingCompareSet(MemoryStore):
    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        self.set(key, desired)
        return self.get(key)


class SleepsThroughWaitForChange(MemoryStore):
    """Never woken by a write: sleeps the whole timeout, then looks."""

    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool:
        threading.Event().wait(timeout.total_seconds())
        return super().wait_for_change(key, current, timedelta(0))


class WaitForChangeAlwaysFalse(MemoryStore):
    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool:
        threading.Event().wait(min(timeout.total_seconds(), 0.05))
        return False


class WakesOnAnyWrite(MemoryStore):
    """Returns True after any write at all, like a version counter read without re-checking."""

    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool:
        if super().wait_for_change(key, current, timedelta(0)):
            return True
        with self._shared.cond:
            return self._shared.cond.wait(timeout.total_seconds())


class GetSleepsThroughTimeout(MemoryStore):
    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        if not self.check(keys):
            threading.Event().wait(self.timeout.total_seconds())
        return super().multi_get(keys)


class GetOfMissingReturnsEmpty(MemoryStore):
    def get(self, key: str) -> bytes:
        return super().get(key) if self.check([key]) else b""


class BinaryCounter(MemoryStore):
    def add(self, key: str, amount: int) -> int:
        old = int.from_bytes(self.get(key), "big", signed=True) if self.check([key]) else 0
        self.set(key, (old + amount).to_bytes(16, "big", signed=True))
        return old + amount


class CollapsesKeyPaths(MemoryStore):
    """Keeps only the last path segment of a key, so prefixes leak into each other."""

    @staticmethod
    def _last(key: str) -> str:
        return key.rsplit("/", 1)[-1]

    def set(self, key: str, value: bytes | str) -> None:
        super().set(self._last(key), value)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return super().multi_get([self._last(k) for k in keys])

    def check(self, keys: Sequence[str]) -> bool:
        return super().check([self._last(k) for k in keys])


class NumKeysUnsupported(MemoryStore):
    def num_keys(self) -> int:
        raise NotImplementedError("num_keys is not supported")


class _FirstCallRaces(MemoryStore):
    """The first call of each thread on ``key`` reads, meets the others, then writes."""

    key = ""

    def __init__(self) -> None:
        super().__init__()
        self._barrier = threading.Barrier(THREADS, timeout=10)
        self._seen = threading.local()

    def _racing(self, key: str) -> bool:
        if key != self.key or getattr(self._seen, "done", False):
            return False
        self._seen.done = True
        return True


class RacyAdd(_FirstCallRaces):
    key = "count"

    def add(self, key: str, amount: int) -> int:
        if not self._racing(key):
            return super().add(key, amount)
        old = int(self.get(key)) if self.check([key]) else 0
        self._barrier.wait()  # every thread has read the same old value
        self.set(key, str(old + amount))
        return old + amount


class RacyCompareSet(_FirstCallRaces):
    key = "counter"

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        if not self._racing(key):
            return super().compare_set(key, expected, desired)
        current = self.get(key)
        self._barrier.wait()  # every thread compares against the same stale value
        if current == expected:
            self.set(key, desired)
            return self.get(key)
        return current


class RacyAddMember(_FirstCallRaces):
    """Sizes computed from a read before the add: concurrent callers share a size."""

    key = "joined"

    def add_member(self, key: str, member: bytes | str) -> int:
        if not self._racing(key):
            return super().add_member(key, member)
        size = len(self.members(key)) + 1
        self._barrier.wait()  # every thread has counted the same members
        super().add_member(key, member)
        return size


class CountsCallsNotMembers(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self._calls: dict[str, int] = {}

    def add_member(self, key: str, member: bytes | str) -> int:
        super().add_member(key, member)
        self._calls[key] = self._calls.get(key, 0) + 1
        return self._calls[key]


class UnsortedMembers(MemoryStore):
    def members(self, key: str) -> list[bytes]:
        return sorted(super().members(key), reverse=True)


class SetsAreKeys(MemoryStore):
    """Keeps a set's name as a plain key too, so get/check/num_keys see it."""

    def add_member(self, key: str, member: bytes | str) -> int:
        self.set(key, b"a set")
        return super().add_member(key, member)


class TryGetWaits(MemoryStore):
    def try_get(self, key: str) -> bytes | None:
        return self.get(key)


class NoMemberBounds(MemoryStore):
    def add_member(self, key: str, member: bytes | str) -> int:
        with self._shared.cond:
            members = self._shared.sets.setdefault(key, set())
            members.add(as_bytes(member))
            return len(members)


class RemoveReportsSizeBefore(MemoryStore):
    def remove_member(self, key: str, member: bytes | str) -> int:
        size = len(self.members(key))
        super().remove_member(key, member)
        return size


class RemoveFromAbsentSetFails(MemoryStore):
    def remove_member(self, key: str, member: bytes | str) -> int:
        with self._shared.cond:
            members = self._shared.sets[check_key(key)]  # KeyError for an absent set
        return super().remove_member(key, member) if members else 0


class RemoveIgnoresSetName(MemoryStore):
    """Removes the member from every set, not only the one named."""

    def remove_member(self, key: str, member: bytes | str) -> int:
        size = super().remove_member(key, member)
        for name in list(self._shared.sets):
            super().remove_member(name, member)
        return size


class RemoveDeletesNamesakeKey(MemoryStore):
    """Treats an emptied set's name as a plain key to clean up."""

    def remove_member(self, key: str, member: bytes | str) -> int:
        size = super().remove_member(key, member)
        if size == 0:
            self.delete_key(key)
        return size


class RemoveUnchecked(MemoryStore):
    def remove_member(self, key: str, member: bytes | str) -> int:
        with self._shared.cond:
            members = self._shared.sets.get(key, set())
            members.discard(as_bytes(member))
            return len(members)


class RacyRemoveMember(_FirstCallRaces):
    """Sizes computed from a read before the remove: concurrent callers share a size."""

    key = "leaving"

    def remove_member(self, key: str, member: bytes | str) -> int:
        if not self._racing(key):
            return super().remove_member(key, member)
        size = len(self.members(key)) - 1
        self._barrier.wait()  # every thread has counted the same members
        super().remove_member(key, member)
        return size


class RefusesRestoredBytes(MemoryStore):
    """A compare-and-set against a version, not the value: bytes written again after a
    change (A, B, A) do not make the expected A match. The machine's tokens are the
    bytes (spec.storage.value_token)."""

    def __init__(self) -> None:
        super().__init__()
        self._replaced: set[tuple[str, bytes]] = set()

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        want = as_bytes(expected)
        if (key, want) in self._replaced:
            return self.get(key) if self.check([key]) else want
        before = self.get(key) if self.check([key]) else None
        result = super().compare_set(key, expected, desired)
        if before is not None and result != before:
            self._replaced.add((key, before))
        return result


class RemoveMemberIgnored(MemoryStore):
    """remove_member() forgets to remove and reports the size as if it had."""

    def remove_member(self, key: str, member: bytes | str) -> int:
        size = len(self.members(key))
        return size - 1 if as_bytes(member) in self.members(key) else size


class TorchLike(MemoryWithout):
    """A correct store without member sets, like torch's own stores."""

    LACKS = ("add_member", "remove_member", "members", "try_get")


class NoRemoveMember(MemoryWithout):
    """A store with member sets but no ``remove_member`` (one written before it existed)."""

    LACKS = ("remove_member",)


def no_remove_member() -> Store:
    return NoRemoveMember()


def torch_like() -> Store:
    return TorchLike()


# (broken store, the property that must catch it, a fragment of the expected message).
# Each case runs only its property (check_store's ``only=``): the other properties'
# wake-up bounds are real elapsed-time checks, and a stall of the machine in one of them
# would report a different property than the planted bug's.
BROKEN: list[tuple[Callable[[], Store], str, str]] = [
    (
        OverwritingCompareSet,
        "compare_set contract",
        "with a stale expected value must return the current",
    ),
    (
        SleepsThroughWaitForChange,
        "wait_for_change wakes on a write from another thread",
        "SleepsThroughWaitForChange",
    ),
    (
        WaitForChangeAlwaysFalse,
        "wait_for_change returns at once or times out",
        "absent key, current=b'x': expected True, got False",
    ),
    (
        WakesOnAnyWrite,
        "wait_for_change ignores writes that change nothing",
        "rewrite the same value and write other keys (True is allowed only",
    ),
    (
        GetSleepsThroughTimeout,
        "get/wait wake on a write from another thread",
        "GetSleepsThroughTimeout",
    ),
    (
        GetOfMissingReturnsEmpty,
        "missing keys time out with StoreTimeoutError",
        "get() of a missing key must raise StoreTimeoutError, but returned b''",
    ),
    (BinaryCounter, "add", "add() stores decimal ASCII digits"),
    (CollapsesKeyPaths, "PrefixStore isolation", "PrefixStore('a') sees its own value"),
    (NumKeysUnsupported, "a fresh store is empty", "num_keys is not supported"),
    (RacyAdd, "concurrent add() loses no update", "counter after 4x10 concurrent add(1)"),
    (
        RacyCompareSet,
        "concurrent compare_set increments lose no update",
        "counter after 4x10 CAS increments (lost updates?): expected 40, got",
    ),
    (
        RacyAddMember,
        "concurrent add_member() gives each caller its own size",
        "the sizes 4x10 concurrent add_member() of distinct members returned (each once)",
    ),
    (
        CountsCallsNotMembers,
        "member sets: add_member sizes, duplicates, members order",
        "add_member() of a member already present: expected 2, got 3",
    ),
    (
        UnsortedMembers,
        "member sets: add_member sizes, duplicates, members order",
        "members() after 4 adds",
    ),
    (
        SetsAreKeys,
        "member sets are not keys (get/check/num_keys/PrefixStore)",
        "check() of a name that is only a set: expected False, got True",
    ),
    (
        TryGetWaits,
        "try_get returns None at once or the value",
        "raised StoreTimeoutError: timed out after 0.4 s waiting for key(s) ['absent']",
    ),
    (
        NoMemberBounds,
        "member bounds give clear errors",
        "a 1025-byte member must raise ValueError, but returned 2",
    ),
    (
        RemoveReportsSizeBefore,
        "remove_member sizes, absent members, emptied sets, re-adds",
        "remove_member() of a present member: size: expected 2, got 3",
    ),
    (
        RemoveFromAbsentSetFails,
        "remove_member sizes, absent members, emptied sets, re-adds",
        "KeyError",
    ),
    (
        RemoveIgnoresSetName,
        "remove_member sizes, absent members, emptied sets, re-adds",
        "set 'odd/x' after emptying set 'odd'",
    ),
    (
        RemoveDeletesNamesakeKey,
        "remove_member touches only its own set (keys, other sets, prefixes)",
        "raised StoreTimeoutError: timed out after 0.05 s waiting for key(s) ['both']",
    ),
    (
        RemoveUnchecked,
        "member bounds give clear errors",
        "removing a 1025-byte member must raise ValueError, but returned 1",
    ),
    (
        RefusesRestoredBytes,
        "machine reads and compare-and-sets answer as spec.storage defines",
        "the model checker assumes the former",
    ),
    (
        RemoveMemberIgnored,
        "machine requests answer as spec.storage defines",
        "spec.storage answers AnnouncedMembers",
    ),
    (
        RacyRemoveMember,
        "concurrent remove_member() gives each caller its own size",
        "the sizes 4x10 concurrent remove_member() of distinct members returned (each",
    ),
]

# Stores whose planted bug is slowness: their planted sleep is at least twice QUICK
# (the store timeout the properties set is 2 x wake_within), so on a loaded machine they
# only get slower and still fail. Every other case keeps the default bound (5 s). For
# the first two, only the property is pinned: a stalled writer turns "took 0.4 s" into
# "timed out" or "got False", both reported by the same property.
TOO_SLOW = (SleepsThroughWaitForChange, GetSleepsThroughTimeout, TryGetWaits)


@pytest.mark.parametrize(
    ("factory", "prop", "fragment"), BROKEN, ids=[getattr(f, "__name__", "?") for f, *_ in BROKEN]
)
def test_the_kit_catches_a_broken_store(
    factory: Callable[[], Store], prop: str, fragment: str
) -> None:
    threads_before = threading.active_count()
    wake: dict[str, Any] = {"wake_within": QUICK} if factory in TOO_SLOW else {}
    with pytest.raises(AssertionError) as caught:
        check_store(factory, threads=THREADS, increments=10, only=[prop], **wake)
    message = str(caught.value)
    assert message.startswith(f"store conformance: {prop!r}"), message
    assert fragment in message
    assert type(factory()).__name__ in message  # the message names the store
    assert threading.active_count() <= threads_before, "the kit left threads running"


def test_the_planted_bugs_cover_every_property_but_four_basic_ones() -> None:
    # BROKEN names real properties (a typo would make only= raise), and a new property
    # shows up here until it gets a planted bug or joins the list below.
    assert {prop for _, prop, _ in BROKEN} == set(PROPERTY_NAMES) - {
        "timeout / set_timeout",
        "set and get",
        "multi_get / multi_set",
        "delete_key, check and num_keys",
    }


def test_the_whole_suite_reports_the_property_of_the_planted_bug() -> None:
    # The full run (no only=): every other property passes this store with one bug, and
    # the one that fails is named. Its bug is in the last property the suite runs.
    assert PROPERTY_NAMES[-1] == "concurrent remove_member() gives each caller its own size"
    with pytest.raises(AssertionError) as caught:
        check_store(RacyRemoveMember, threads=THREADS, increments=10)
    assert str(caught.value).startswith(f"store conformance: {PROPERTY_NAMES[-1]!r} failed")
    assert "RacyRemoveMember" in str(caught.value)


def test_only_runs_the_named_properties_and_refuses_unknown_names() -> None:
    # A broken compare_set passes when only properties that never call it run.
    check_store(OverwritingCompareSet, threads=THREADS, increments=10, only=["add", "set and get"])
    with pytest.raises(ValueError, match=r"unknown property name\(s\) \['nope'\]; pick from"):
        check_store(MemoryStore, only=["add", "nope"])
    with pytest.raises(ValueError, match="is one string; pass a list"):
        check_store(MemoryStore, only="add")
    with pytest.raises(ValueError, match="no property named"):
        check_store(MemoryStore, only=[])


def test_a_factory_that_reuses_a_store_is_caught() -> None:
    shared = MemoryStore()
    with pytest.raises(AssertionError, match=r"num_keys\(\) of a store from factory\(\) \(must"):
        check_store(lambda: shared)  # the first property leaves keys behind


def test_the_kit_passes_a_correct_store_that_is_a_subclass() -> None:
    # The planted bugs above are the only difference from a passing store.
    class Plain(MemoryStore):
        pass

    check_store(Plain, threads=THREADS, increments=10)


def test_member_sets_are_required_on_request_and_skipped_otherwise() -> None:
    with pytest.raises(AssertionError) as caught:
        check_store(torch_like, threads=THREADS, increments=10, sets=True)
    assert "TorchLike lacks add_member/remove_member/members/try_get" in str(caught.value)
    with pytest.raises(AssertionError) as caught:
        check_store(no_remove_member, threads=THREADS, increments=10, sets=True)
    assert "NoRemoveMember lacks remove_member (" in str(caught.value)
    # Without sets=True the kit checks a store that has no member sets as a plain Store,
    # and sets=False skips the member-set properties even of a broken SetStore.
    check_store(torch_like, threads=THREADS, increments=10)
    check_store(UnsortedMembers, threads=THREADS, increments=10, sets=False)


def test_bad_kit_arguments() -> None:
    with pytest.raises(ValueError, match="threads >= 2"):
        check_store(MemoryStore, threads=1)
    with pytest.raises(ValueError, match="processes >= 2"):
        check_store_across_processes("sqlite:///tmp/x.db", processes=1)
    with pytest.raises(ValueError, match="private to its process"):
        check_store_across_processes("memory://x")
    assert no_kit_children()


# -- across processes: openers are referenced as "module:function" for spawned children ---


def open_add_forgets(url: str, timeout: timedelta) -> Store:
    """An SQLite store whose add() overwrites the kit's "added" counter instead of adding."""

    class AddForgets(SQLiteStore):
        def add(self, key: str, amount: int) -> int:
            if not key.endswith("/added"):
                return super().add(key, amount)
            self.set(key, str(amount))
            return amount

    parsed = open_sqlite(url, timeout)
    parsed.close()
    return AddForgets(parsed.path, timeout=timeout)


def open_add_member_says_one(url: str, timeout: timedelta) -> Store:
    """An SQLite store whose add_member always reports size 1."""

    class SaysOne(SQLiteStore):
        def add_member(self, key: str, member: bytes | str) -> int:
            super().add_member(key, member)
            return 1

    parsed = open_sqlite(url, timeout)
    parsed.close()
    return SaysOne(parsed.path, timeout=timeout)


def open_remove_member_says_zero(url: str, timeout: timedelta) -> Store:
    """An SQLite store whose remove_member always reports size 0."""

    class SaysZero(SQLiteStore):
        def remove_member(self, key: str, member: bytes | str) -> int:
            super().remove_member(key, member)
            return 0

    parsed = open_sqlite(url, timeout)
    parsed.close()
    return SaysZero(parsed.path, timeout=timeout)


def open_fails_in_children(url: str, timeout: timedelta) -> Store:
    if multiprocessing.parent_process() is not None:
        raise RuntimeError("planted failure: cannot open the store in a child")
    return open_sqlite(url, timeout)


def open_private_memory(url: str, timeout: timedelta) -> Store:
    """Children each get a private store, so the parent never sees them."""
    return MemoryStore(timeout=timeout)


def no_kit_children() -> bool:
    return not [c for c in multiprocessing.active_children() if c.name.startswith("rdzv-conf")]


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path}/kit.db"


@pytest.mark.slow
def test_across_processes_catches_lost_adds(db_url: str) -> None:
    with pytest.raises(AssertionError, match=r"3x5 add\(1\) left b'1', expected 15"):
        check_store_across_processes(db_url, opener=f"{__name__}:open_add_forgets", increments=5)
    assert no_kit_children()


@pytest.mark.slow
def test_across_processes_catches_add_member_sizes_that_are_not_distinct(db_url: str) -> None:
    with pytest.raises(
        AssertionError, match=r"3 processes joining one member set got sizes \[1, 1, 1\]"
    ):
        check_store_across_processes(
            db_url, opener=f"{__name__}:open_add_member_says_one", increments=2
        )
    assert no_kit_children()


@pytest.mark.slow
def test_across_processes_catches_remove_member_sizes_that_are_not_distinct(db_url: str) -> None:
    with pytest.raises(
        AssertionError, match=r"3 processes leaving one member set got sizes \[0, 0, 0\]"
    ):
        check_store_across_processes(
            db_url, opener=f"{__name__}:open_remove_member_says_zero", increments=2
        )
    assert no_kit_children()


@pytest.mark.slow
def test_across_processes_reports_a_child_that_cannot_open_the_store(db_url: str) -> None:
    with pytest.raises(AssertionError) as caught:
        check_store_across_processes(db_url, opener=f"{__name__}:open_fails_in_children")
    assert "exited with code 1 before the others were ready" in str(caught.value)
    assert no_kit_children()


@pytest.mark.slow
def test_across_processes_terminates_children_that_never_see_the_parent() -> None:
    with pytest.raises(AssertionError) as caught:
        check_store_across_processes(
            "memory://unshared",
            opener=f"{__name__}:open_private_memory",
            start_within=timedelta(seconds=1),
        )
    assert "only 0 of 3 children announced themselves within 1 s" in str(caught.value)
    assert no_kit_children()


def test_across_processes_passes_sqlite(db_url: str) -> None:
    # Paired with the planted failures above: the same check passes a correct store.
    check_store_across_processes(db_url, processes=2, increments=5)
    assert no_kit_children()
