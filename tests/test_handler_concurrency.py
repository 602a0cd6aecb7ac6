"""The handler called from several threads at once, and the resources it owns.

- Queries, ``set_closed`` and ``shutdown`` from another thread return without waiting for
  a ``next_rendezvous`` in progress; a close makes that join raise
  ``RendezvousClosedError``; no keep-alive thread survives a shutdown, however the two
  interleave.
- A member whose round ends before rank 0 published the bootstrap info joins the next
  round instead of waiting out the join timeout.
- ``create_handler`` closes the store it opened: when building the handler fails, and on
  ``shutdown``.
- A sleep on a FakeClock that nobody advances fails with a clear error.

Synchronisation is by events and bounded thread joins; nothing sleeps for a timeout.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

import pytest

import rdzv.driver
import rdzv.handler
from rdzv import (
    DynamicRendezvousHandler,
    FakeClock,
    RendezvousClosedError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeout,
    RendezvousTimeoutError,
    StoreRendezvousBackend,
    create_handler,
)
from rdzv.backend import Token
from rdzv.clock import FAKE_SLEEP_REAL_LIMIT_S, FakeClockStalled
from rdzv.store import Store
from rdzv.stores import MemoryStore, register_scheme, unregister_scheme
from spec.codec import decode
from spec.machine import Done
from spec.state import NodeId, RendezvousState
from spec.vocabulary import Op

THREAD_JOIN = 60.0
"""Real seconds a test waits for its threads (or an event) before declaring a hang."""
JOIN_TIMEOUT = 60.0
"""Seconds: long enough that no join in these tests ends by its deadline."""
STATE_KEY = "rdzv/job/state"


# -- helpers ---------------------------------------------------------------------------------
class Call:
    """``fn()`` in a daemon thread; :meth:`result` joins it (bounded) and returns what it
    returned or raised."""

    def __init__(self, fn: Callable[[], Any], name: str = "call") -> None:
        self._box: list[Any] = []

        def target() -> None:
            try:
                self._box.append(fn())
            except BaseException as exc:
                self._box.append(exc)

        self.thread = threading.Thread(target=target, name=name, daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def result(self) -> Any:
        self.thread.join(THREAD_JOIN)
        assert not self.thread.is_alive(), "a thread of this test hung"
        return self._box[0]


def handler(
    store: Store,
    min_nodes: int = 2,
    max_nodes: int = 2,
    *,
    backend: StoreRendezvousBackend | None = None,
    clock: Any = None,
    **kw: Any,
) -> DynamicRendezvousHandler:
    return DynamicRendezvousHandler.from_backend(
        "job",
        store,
        backend if backend is not None else StoreRendezvousBackend(store, "job"),
        min_nodes,
        max_nodes,
        timeout=RendezvousTimeout(join=timedelta(seconds=JOIN_TIMEOUT)),
        keep_alive_interval=kw.pop("keep_alive_interval", 5),
        clock=clock,
        cache_duration=0,
        # Pinned: these tests watch the stored state for a joining node (joined(),
        # wait_for_state), which under scale, the default, shows only once a fold admits
        # it. scale's concurrency is covered by test_handler_scale.py and the stateful
        # tests; the create_handler tests below run the default.
        protocol=kw.pop("protocol", "hardened"),
        **kw,
    )


@contextlib.contextmanager
def shut_down(*handlers: DynamicRendezvousHandler) -> Iterator[None]:
    """Shut every handler down on the way out, whatever happened, and check that no
    keep-alive thread of theirs is left."""
    try:
        yield
    finally:
        for h in handlers:
            h.shutdown()
        names = {f"rdzv-keep-alive-{h.node}" for h in handlers}
        assert not [t for t in threading.enumerate() if t.name in names and t.is_alive()]


def state(store: Store) -> RendezvousState | None:
    return decode(store.get(STATE_KEY)) if store.check([STATE_KEY]) else None


def wait_for_state(
    store: Store, ready: Callable[[RendezvousState], bool], what: str
) -> RendezvousState:
    """Wait (bounded) until the stored state satisfies ``ready``; woken by each write."""
    for _ in range(1200):
        current = state(store)
        if current is not None and ready(current):
            return current
        raw = store.get(STATE_KEY) if current is not None else None
        store.wait_for_change(STATE_KEY, raw, timedelta(seconds=0.05))
    raise AssertionError(f"the stored state never showed {what}: {state(store)}")


def joined(store: Store, *nodes: NodeId) -> RendezvousState:
    return wait_for_state(
        store, lambda s: all(s.is_participant(n) for n in nodes), f"{nodes} as participants"
    )


# -- queries and close beside a join (review P2) ---------------------------------------------
def test_queries_from_another_thread_answer_while_a_join_waits() -> None:
    store = MemoryStore()
    a, b = handler(store), handler(store)
    with shut_down(a, b):
        join = Call(a.next_rendezvous, "a-join")
        joined(store, a.node)
        # The join holds its lock while it waits for a second node (which never comes
        # here): the queries must answer anyway, and the join must still be waiting.
        assert a._lock.locked()
        assert a.num_nodes_waiting() == 0
        assert a.is_closed() is False
        assert b.num_nodes_waiting() == 0
        assert join.alive(), "the join cannot have ended: nobody else joined"
        # The join's machine was left alone: it is still in its join operation.
        assert a.driver.local.op is Op.JOIN
        a.set_closed()
        error = join.result()
        assert isinstance(error, RendezvousClosedError), error
        assert a.is_closed() and b.is_closed()


def test_set_closed_from_another_handler_ends_a_waiting_join() -> None:
    store = MemoryStore()
    a, b = handler(store), handler(store)
    with shut_down(a, b):
        join = Call(a.next_rendezvous, "a-join")
        joined(store, a.node)
        b.set_closed()
        error = join.result()
        assert isinstance(error, RendezvousClosedError), error
        assert a.heartbeat_thread is None


# -- shutdown beside a join (review P1) --------------------------------------------------------
def test_shutdown_during_a_join_returns_at_once_and_leaves_no_heartbeat() -> None:
    store = MemoryStore()
    a, b = handler(store, keep_alive_interval=0.2), handler(store, keep_alive_interval=0.2)
    with shut_down(a, b):
        join = Call(a.next_rendezvous, "a-join")
        joined(store, a.node)
        # b sees the open run, so it belongs to this job (a node whose first read finds
        # the run closed would start the next job under the same run id instead).
        assert b.num_nodes_waiting() == 0
        assert a.shutdown() is True
        # shutdown did not wait for the join; the join saw the close.
        error = join.result()
        assert isinstance(error, RendezvousClosedError), error
        assert a.heartbeat_thread is None
        with pytest.raises(RendezvousClosedError, match="closed"):
            b.next_rendezvous()
        with pytest.raises(RendezvousClosedError, match="shut down"):
            a.next_rendezvous()
        assert a.heartbeat_thread is None


class _PauseAfterCompletingWrite(StoreRendezvousBackend):
    """Pauses the first write that completes a round, after it reached the store, until
    the test says go: the join has won but not yet returned."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, "job")
        self.written = threading.Event()
        self.go = threading.Event()
        self._paused = False

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        result = super().set_state(state, token)
        if not self._paused and result is not None and result[2] and decode(state).complete:
            self._paused = True
            self.written.set()
            assert self.go.wait(THREAD_JOIN), "the test never let the write return"
        return result


def test_shutdown_between_a_completed_join_and_its_heartbeats_starts_none() -> None:
    # The race of the review: shutdown() runs after the join's winning write but before
    # next_rendezvous starts the heartbeats. No keep-alive thread may start after it.
    store = MemoryStore()
    backend = _PauseAfterCompletingWrite(store)
    a = handler(store, 1, 1, backend=backend, keep_alive_interval=0.01)
    with shut_down(a):
        join = Call(a.next_rendezvous, "a-join")
        try:
            assert backend.written.wait(THREAD_JOIN)
            assert a.shutdown() is True  # does not wait for the paused join
        finally:
            backend.go.set()
        error = join.result()
        # The join had won its round; it is the shut-down handler that refuses to go on.
        assert isinstance(error, RendezvousClosedError), error
        assert "shut down while it joined round 0" in str(error)
        assert a.heartbeat_thread is None
        closed = state(store)
        assert closed is not None and closed.closed


def test_heartbeats_never_start_after_shutdown() -> None:
    store = MemoryStore()
    a = handler(store, 1, 1)
    with shut_down(a):
        a.next_rendezvous()
        assert a.heartbeat_thread is not None
        assert a.shutdown() is True
        assert a._start_heartbeats() is False
        assert a.heartbeat_thread is None


# -- a round that ends before rank 0 published (review P3) --------------------------------------
def _leader_joins_and_leaves(lead: DynamicRendezvousHandler, store: Store) -> None:
    """``lead`` joins through its machine only (its handler is never asked to publish the
    bootstrap info), waits until its round is complete, then leaves it."""
    driver = lead.driver
    deadline = driver.deadline_after(int(JOIN_TIMEOUT * 1000))
    driver.start(Op.JOIN, deadline)
    driver.run()
    assert driver.local.view.rank_of(lead.node) == 0
    driver.start(Op.EXIT, deadline)
    driver.run()


def test_a_round_whose_rank_0_never_publishes_is_left_for_the_next(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(rdzv.driver, "MAX_WAIT_SLICE", 0.05)  # re-check the state often
    store = MemoryStore()
    # Created first, so the smallest node id: rank 0 of the first round.
    lead, b, c = handler(store), handler(store), handler(store)
    with shut_down(lead, b, c), caplog.at_level(logging.WARNING, logger="rdzv.handler"):
        leader = Call(lambda: _leader_joins_and_leaves(lead, store), "lead")
        member = Call(b.next_rendezvous, "b-join")
        assert leader.result() is None  # joined round 0 with b, never published, left
        late = Call(c.next_rendezvous, "c-join")
        info_b, info_c = member.result(), late.result()
        assert isinstance(info_b, RendezvousInfo), info_b
        assert isinstance(info_c, RendezvousInfo), info_c
        assert (info_b.round, info_c.round) == (1, 1)
        assert (info_b.rank, info_c.rank) == (0, 1)
        assert info_b.participants == info_c.participants == [b.node, c.node]
        boot_b, boot_c = info_b.bootstrap_store_info, info_c.bootstrap_store_info
        assert (boot_b.master_addr, boot_b.master_port) == (boot_c.master_addr, boot_c.master_port)
        assert any("ended before its rank 0" in r.getMessage() for r in caplog.records)


def test_a_round_whose_rank_0_died_is_ended_by_keep_alives_and_left() -> None:
    # The review's scenario on a fake clock: rank 0 dies right after its round completed
    # (it never publishes, never beats). The member's keep-alives prune it and end the
    # round (hardened); the member, waiting for the bootstrap info, notices and joins the
    # next round, which a third node completes.
    clock = FakeClock()
    store = MemoryStore()
    lead, b, c = (handler(store, clock=clock) for _ in range(3))
    with shut_down(lead, b, c):
        driver = lead.driver
        driver.start(Op.JOIN, driver.deadline_after(int(JOIN_TIMEOUT * 1000)))
        leader = Call(driver.run, "lead")
        member = Call(b.next_rendezvous, "b-join")
        assert isinstance(leader.result(), Done)
        for _ in range(6):  # bounded: b's last beat of lead expires after 15 s
            current = state(store)
            assert current is not None
            if current.round >= 1:
                break
            assert clock.wait_for_sleepers(1)  # b's keep-alive thread waits for its time
            before = store.get(STATE_KEY)
            clock.advance(5.0)
            assert store.wait_for_change(STATE_KEY, before, timedelta(seconds=THREAD_JOIN))
        # b left the ended round and waits in the next one (alone: no write races on a
        # clock that no longer moves).
        wait_for_state(
            store, lambda s: s.round == 1 and s.participant_nodes() == (b.node,), "b in round 1"
        )
        assert member.alive()
        late = Call(c.next_rendezvous, "c-join")
        info_b, info_c = member.result(), late.result()
        assert isinstance(info_b, RendezvousInfo), info_b
        assert isinstance(info_c, RendezvousInfo), info_c
        assert (info_b.round, info_b.rank, info_c.round, info_c.rank) == (1, 0, 1, 1)
        assert info_b.participants == [b.node, c.node]


def test_a_close_during_the_bootstrap_wait_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rdzv.driver, "MAX_WAIT_SLICE", 0.05)
    store = MemoryStore()
    lead, b = handler(store), handler(store)
    with shut_down(lead, b):
        driver = lead.driver
        driver.start(Op.JOIN, driver.deadline_after(int(JOIN_TIMEOUT * 1000)))
        leader = Call(driver.run, "lead")
        member = Call(b.next_rendezvous, "b-join")
        assert isinstance(leader.result(), Done)
        wait_for_state(store, lambda s: s.complete, "a complete round")
        lead.set_closed()
        error = member.result()
        assert isinstance(error, RendezvousClosedError), error


class _CountingWaits(MemoryStore):
    """Counts the waits for bootstrap keys, and fails the one past ``limit`` (so a wait
    that is not bounded by its slices ends fast, as a connection error)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.waits = 0

    def wait(self, keys: Any, timeout: timedelta | None = None) -> None:
        self.waits += 1
        if self.waits > self.limit:
            raise RuntimeError(f"wait number {self.waits}, past the bound {self.limit}")
        super().wait(keys, timeout)


def _pair_member(store: Store, clock: Any, join_timeout: float) -> DynamicRendezvousHandler:
    """One handler of a min = max = 2 job "job" on ``store`` (no state cache, so every
    call reads the store)."""
    return DynamicRendezvousHandler.from_backend(
        "job",
        store,
        StoreRendezvousBackend(store, "job"),
        2,
        2,
        timeout=RendezvousTimeout(join=timedelta(seconds=join_timeout)),
        clock=clock,
        cache_duration=0,
    )


def test_a_bootstrap_wait_on_a_fake_clock_nobody_advances_ends_after_its_slices() -> None:
    # Rank 0 never publishes and nobody moves the clock, so the deadline never comes: the
    # number of slices the budget allows must end the wait, with the timeout error.
    clock = FakeClock()
    budget = 1.0  # the join timeout, all of it left (the clock stands still)
    bound = rdzv.handler.max_slices(clock, budget)
    assert bound == math.ceil(budget / clock.max_real_wait(rdzv.driver.MAX_WAIT_SLICE)) + 1
    store = _CountingWaits(limit=bound)
    # lead first: the smaller node id, rank 0
    lead, b = _pair_member(store, clock, budget), _pair_member(store, clock, budget)
    with shut_down(lead, b):
        driver = lead.driver
        driver.start(Op.JOIN, driver.deadline_after(int(budget * 1000)))
        leader = Call(driver.run, "lead")
        member = Call(b.next_rendezvous, "b-join")
        assert isinstance(leader.result(), Done)
        error = member.result()
        assert isinstance(error, RendezvousTimeoutError), error
        assert "did not publish the bootstrap info within 1 s" in str(error)
        assert store.waits == bound


# -- participants and wait list in the returned info (review P7) --------------------------------
def test_the_info_names_the_rounds_participants() -> None:
    store = MemoryStore()
    a, b = handler(store), handler(store)
    with shut_down(a, b):
        first, second = Call(a.next_rendezvous), Call(b.next_rendezvous)
        infos = [first.result(), second.result()]
        for info in infos:
            assert isinstance(info, RendezvousInfo), info
            assert info.participants == sorted([a.node, b.node])
            assert info.wait_list == []
        # Fresh lists: a caller cannot change what the info holds.
        infos[0].participants.clear()
        assert infos[0].participants == sorted([a.node, b.node])


# -- the store create_handler opens (review P4) ------------------------------------------------
class _ClosingStore(MemoryStore):
    closed: ClassVar[list[_ClosingStore]] = []

    def close(self) -> None:
        _ClosingStore.closed.append(self)


_S = TypeVar("_S", bound=_ClosingStore)


@contextlib.contextmanager
def _scheme(name: str, make: Callable[[], _S]) -> Iterator[list[_S]]:
    """Register URL scheme ``name`` whose stores ``make`` builds; yields the stores
    opened through it, and unregisters the scheme on every path."""
    _ClosingStore.closed = []
    opened: list[_S] = []

    def opener(url: str, timeout: timedelta) -> Store:
        store = make()
        opened.append(store)
        return store

    register_scheme(name, opener, example=f"{name}://x")
    try:
        yield opened
    finally:
        unregister_scheme(name)


@pytest.fixture
def closing_scheme() -> Iterator[list[_ClosingStore]]:
    with _scheme("closetest", _ClosingStore) as opened:
        yield opened


def test_a_store_opened_for_a_handler_that_cannot_be_built_is_closed(
    closing_scheme: list[_ClosingStore],
) -> None:
    params = RendezvousParameters("rdzv", "closetest://x", "job", 1, 1, keep_alive_max_attempt="0")
    with pytest.raises(ValueError, match="keep_alive_max_attempt"):
        create_handler(params)
    assert len(closing_scheme) == 1
    assert _ClosingStore.closed == closing_scheme


def test_shutdown_closes_the_store_the_handler_opened_once(
    closing_scheme: list[_ClosingStore],
) -> None:
    h = create_handler(RendezvousParameters("rdzv", "closetest://x", "job", 1, 1))
    with shut_down(h):
        h.next_rendezvous()
        assert _ClosingStore.closed == []
        assert h.shutdown() is True
        assert _ClosingStore.closed == closing_scheme
        assert h.shutdown() is True  # again: nothing more to close, same answer
        assert _ClosingStore.closed == closing_scheme


class _HoldingStore(_ClosingStore):
    """Holds every read or write (``check``, ``try_get``, ``set``, ``compare_set``,
    ``add_member``) made by a thread whose name starts with ``hold_thread`` until the test
    opens ``gate`` (bounded). ``try_get`` and ``add_member`` are the first store calls of
    a join under ``scale``, the default protocol (it reads, then announces itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold_thread: str | None = None
        self.held = threading.Event()
        self.gate = threading.Event()

    def _hold(self) -> None:
        name = threading.current_thread().name
        if self.hold_thread is not None and name.startswith(self.hold_thread):
            self.held.set()
            assert self.gate.wait(THREAD_JOIN), "the test never opened the gate"

    def check(self, keys: Any) -> bool:
        self._hold()
        return super().check(keys)

    def set(self, key: str, value: bytes | str) -> None:
        self._hold()
        super().set(key, value)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        self._hold()
        return super().compare_set(key, expected, desired)

    def try_get(self, key: str) -> bytes | None:
        self._hold()
        return super().try_get(key)

    def add_member(self, key: str, member: bytes | str) -> int:
        self._hold()
        return super().add_member(key, member)


@pytest.fixture
def holding_scheme() -> Iterator[list[_HoldingStore]]:
    with _scheme("holdtest", _HoldingStore) as opened:
        try:
            yield opened
        finally:
            for store in opened:
                store.gate.set()


def test_shutdown_leaves_the_store_open_while_its_keep_alive_thread_runs(
    holding_scheme: list[_HoldingStore],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(rdzv.handler, "HEARTBEAT_JOIN_SLACK", 0.0)
    params = RendezvousParameters(
        "rdzv", "holdtest://x", "job", 1, 1, keep_alive_interval="0.01", heartbeat_timeout="0.05"
    )
    h = create_handler(params)
    (store,) = holding_scheme
    with shut_down(h), caplog.at_level(logging.WARNING, logger="rdzv.handler"):
        h.next_rendezvous()
        beating = h.heartbeat_thread
        assert beating is not None
        store.hold_thread = "rdzv-keep-alive"
        assert store.held.wait(THREAD_JOIN)  # a keep-alive is inside a store call
        assert h.shutdown() is True  # closes the rendezvous, gives up joining the thread
        assert _ClosingStore.closed == []  # not closed under the running keep-alive
        assert any("leaves the store" in r.getMessage() for r in caplog.records)
        store.gate.set()
        beating.join(THREAD_JOIN)
        assert not beating.is_alive()
        assert h.shutdown() is True  # everything stopped now: the store is closed
        assert _ClosingStore.closed == [store]
        closed = state(store)
        assert closed is not None and closed.closed


def test_shutdown_leaves_the_store_open_while_a_join_still_runs(
    holding_scheme: list[_HoldingStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rdzv.handler, "SHUTDOWN_DRAIN_TIMEOUT", 0.01)
    h = create_handler(RendezvousParameters("rdzv", "holdtest://x", "job", 2, 2))
    (store,) = holding_scheme
    with shut_down(h):
        store.hold_thread = "a-join"
        join = Call(h.next_rendezvous, "a-join")
        assert store.held.wait(THREAD_JOIN)  # the join is inside a store call
        assert h.shutdown() is True
        assert _ClosingStore.closed == []
        store.gate.set()
        assert isinstance(join.result(), RendezvousClosedError)
        assert h.shutdown() is True
        assert _ClosingStore.closed == [store]


def test_a_store_left_open_by_shutdown_is_closed_when_the_handler_is_collected(
    holding_scheme: list[_HoldingStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rdzv.handler, "SHUTDOWN_DRAIN_TIMEOUT", 0.01)
    h = create_handler(RendezvousParameters("rdzv", "holdtest://x", "job", 2, 2))
    (store,) = holding_scheme
    store.hold_thread = "a-join"
    join = Call(h.next_rendezvous, "a-join")
    assert store.held.wait(THREAD_JOIN)
    assert h.shutdown() is True
    assert _ClosingStore.closed == []
    store.gate.set()
    assert isinstance(join.result(), RendezvousClosedError)
    del h, join  # the join's error holds frames of the handler
    gc.collect()
    assert _ClosingStore.closed == [store]


class _HoldingReads(StoreRendezvousBackend):
    """Holds the state reads of threads named ``hold_thread`` until ``gate`` opens."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, "job")
        self.hold_thread: str | None = None
        self.held = threading.Event()
        self.gate = threading.Event()

    def get_state(self) -> tuple[bytes, Token] | None:
        if threading.current_thread().name == self.hold_thread:
            self.held.set()
            assert self.gate.wait(THREAD_JOIN), "the test never opened the gate"
        return super().get_state()


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_a_join_whose_first_read_follows_its_own_shutdown_fails_closed(protocol: str) -> None:
    # The join is held inside its first read of the state; meanwhile shutdown() closes
    # the run on the other machine state (and gives up leaving it: the join holds the
    # main one). The read then returns the closed run. The node's job was fixed by the
    # close's own first read, so the join fails closed. Before the two machine states
    # shared the job, the join took the node for a newcomer of the next job, reopened the
    # run as epoch 1 and waited there alone until its join timeout.
    store = MemoryStore()
    backend = _HoldingReads(store)
    h = DynamicRendezvousHandler.from_backend(
        "job",
        store,
        backend,
        2,
        2,
        timeout=RendezvousTimeout(join=timedelta(seconds=JOIN_TIMEOUT), close=0.05),
        cache_duration=0,
        protocol=protocol,
    )
    with shut_down(h):
        backend.hold_thread = "a-join"
        join = Call(h.next_rendezvous, "a-join")
        assert backend.held.wait(THREAD_JOIN)  # the join is inside its first read
        assert h.shutdown() is True
        backend.gate.set()
        outcome = join.result()
        assert isinstance(outcome, RendezvousClosedError), outcome
        stored = state(store)
        assert stored is not None and stored.closed and stored.epoch == 0


def test_a_second_shutdown_writes_nothing_and_waits_for_no_query() -> None:
    store = MemoryStore()
    backend = _HoldingReads(store)
    h = handler(store, 1, 1, backend=backend)
    with shut_down(h):
        h.next_rendezvous()
        assert h.shutdown() is True
        before = h.io_stats()
        backend.hold_thread = "query"
        query = Call(h.is_closed, "query")
        try:
            assert backend.held.wait(THREAD_JOIN)  # the query holds the control machine
            assert h.shutdown() is True  # the first call's answer, at once
            assert query.alive(), "shutdown waited for the query"
        finally:
            backend.gate.set()
        assert query.result() is True
        after = h.io_stats()
        assert after.cas_attempts == before.cas_attempts  # the second shutdown wrote nothing
        assert after.reads == before.reads + 1  # the query's read only


def test_shutdown_leaves_a_store_it_was_given_open() -> None:
    store = _ClosingStore()
    _ClosingStore.closed = []
    h = handler(store, 1, 1)
    with shut_down(h):
        h.next_rendezvous()
        assert h.shutdown() is True
    assert _ClosingStore.closed == []


# -- torchrun adapter (review P4, P5) ----------------------------------------------------------
def _two_joined(
    store: Store, clock: Any = None, join_timeout: float = JOIN_TIMEOUT
) -> tuple[DynamicRendezvousHandler, DynamicRendezvousHandler, RendezvousInfo]:
    """Two handlers that joined round 0 together (rank 0 first), and the member's info."""
    lead = _pair_member(store, clock, join_timeout)
    member = _pair_member(store, clock, join_timeout)
    first, second = Call(lead.next_rendezvous, "lead"), Call(member.next_rendezvous, "member")
    assert isinstance(first.result(), RendezvousInfo)
    info = second.result()
    assert isinstance(info, RendezvousInfo), info
    assert info.rank == 1
    return lead, member, info


def _publish_agent_store(info: RendezvousInfo, port: int) -> None:
    """What rank 0's plug-in writes once its agent store runs."""
    from rdzv.store import PrefixStore
    from rdzv.torch_plugin import AGENT_STORE_NAMESPACE

    shared = PrefixStore(AGENT_STORE_NAMESPACE, info.rdzv_store)
    RendezvousStoreInfo.build(0, shared, info.bootstrap_store_info.master_addr, port)


def _leave(lead: DynamicRendezvousHandler) -> None:
    """``lead`` leaves its round (as if it died and was pruned): the round ends."""
    with lead._lock:
        driver = lead.driver
        driver.start(Op.EXIT, driver.deadline_after(int(JOIN_TIMEOUT * 1000)))
        driver.run()


def test_the_agent_store_wait_returns_the_port_rank_0_published() -> None:
    from rdzv.torch_plugin import TorchrunHandler

    store = MemoryStore()
    lead, member, info = _two_joined(store)
    with shut_down(lead, member):
        _publish_agent_store(info, 29400)
        plugin = TorchrunHandler(member)
        addr = info.bootstrap_store_info.master_addr
        deadline = member.clock.monotonic() + JOIN_TIMEOUT
        assert plugin._share_agent_store(1, info.rdzv_store, addr, deadline) == 29400


def test_the_agent_store_wait_uses_what_is_left_of_the_join_deadline() -> None:
    # The handler's wait for rank 0: slices for what is left of the deadline, at least
    # MIN_AGENT_STORE_WAIT. On a clock nobody advances, the slices count the budget.
    from rdzv.torch_plugin import MIN_AGENT_STORE_WAIT, TorchrunHandler

    clock = FakeClock()
    store = _CountingWaits(limit=1_000_000)
    lead, member, info = _two_joined(store, clock)
    with shut_down(lead, member):
        plugin = TorchrunHandler(member)
        addr = info.bootstrap_store_info.master_addr
        for left, budget in ((1.5, 1.5), (-100.0, MIN_AGENT_STORE_WAIT.total_seconds())):
            store.waits = 0
            deadline = clock.monotonic() + left
            with pytest.raises(RendezvousTimeoutError, match="did not publish its agent store"):
                plugin._share_agent_store(1, info.rdzv_store, addr, deadline)
            assert store.waits == rdzv.handler.max_slices(clock, budget)


def test_the_agent_store_wait_ends_when_the_round_ends() -> None:
    # Rank 0 published the bootstrap info, then died before its agent store: the member
    # does not wait out the join deadline but learns that its round is over.
    from rdzv.torch_plugin import TorchrunHandler

    store = MemoryStore()
    lead, member, info = _two_joined(store)
    with shut_down(lead, member):
        _leave(lead)
        plugin = TorchrunHandler(member)
        addr = info.bootstrap_store_info.master_addr
        deadline = member.clock.monotonic() + JOIN_TIMEOUT
        assert plugin._share_agent_store(1, info.rdzv_store, addr, deadline) is None


def test_torchrun_joins_the_next_round_when_rank_0_dies_before_its_agent_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from rdzv.torch_plugin import _torch_handler_class

    store = MemoryStore()
    lead = handler(store)  # rank 0 of round 0: publishes the bootstrap info, not its agent store
    member_handler, late = handler(store), handler(store)
    plugin = _torch_handler_class()(member_handler)
    with shut_down(lead, member_handler, late), caplog.at_level(logging.WARNING):
        try:
            first = Call(lead.next_rendezvous, "lead")
            member = Call(plugin.next_rendezvous, "member")
            assert isinstance(first.result(), RendezvousInfo)
            _leave(lead)
            wait_for_state(
                store,
                lambda s: s.round == 1 and s.is_participant(member_handler.node),
                "the member in round 1",
            )
            third = Call(late.next_rendezvous, "late")
            info, late_info = member.result(), third.result()
        finally:
            plugin.shutdown()  # stops the member's agent store server, if it started one
        assert not isinstance(info, BaseException), info
        assert isinstance(late_info, RendezvousInfo), late_info
        assert (info.rank, late_info.round, late_info.rank) == (0, 1, 1)
        assert any("published its agent store" in r.getMessage() for r in caplog.records)


def test_torchrun_shutdown_stops_the_server_even_when_closing_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rdzv.torch_plugin import TorchrunHandler

    h = handler(MemoryStore(), 1, 1)
    plugin = TorchrunHandler(h)
    plugin._server = object()  # stands for rank 0's TCPStore server

    def broken() -> bool:
        raise RuntimeError("the store went away")

    monkeypatch.setattr(h, "shutdown", broken)
    with pytest.raises(RuntimeError, match="went away"):
        plugin.shutdown()
    assert plugin._server is None
    assert plugin.agent_store_port is None


# -- a FakeClock nobody advances (review P6) ---------------------------------------------------
def test_a_sleep_on_a_fake_clock_nobody_advances_fails_clearly() -> None:
    assert FAKE_SLEEP_REAL_LIMIT_S > 0
    clock = FakeClock(real_sleep_limit=0)
    with pytest.raises(FakeClockStalled, match="nobody advanced this FakeClock"):
        clock.sleep(1.0)
    assert clock.sleepers == 0
    # A sleep with a cancel flag is ended by its flag, never by the limit.
    cancel = threading.Event()
    cancel.set()
    assert clock.sleep(1.0, cancel) is True
    # Time that has come needs no advancing.
    assert clock.sleep(0.0) is False
    with pytest.raises(ValueError, match="real_sleep_limit"):
        FakeClock(real_sleep_limit=-1)


class _AlwaysLoses(StoreRendezvousBackend):
    """Every write loses a race against a writer that keeps the state as it was."""

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        return self._current(written=False)


def test_a_writer_backing_off_on_a_stalled_fake_clock_fails_instead_of_hanging() -> None:
    store = MemoryStore()
    clock = FakeClock(real_sleep_limit=0)
    h = handler(store, 1, 1, backend=_AlwaysLoses(store, "job"), clock=clock)
    with pytest.raises(FakeClockStalled, match="nobody advanced"):
        h.next_rendezvous()
    assert h.heartbeat_thread is None
    # The machine ended the operation, so the handler accepts the next one.
    assert h.driver.finished
