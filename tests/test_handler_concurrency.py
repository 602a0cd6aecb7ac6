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
import logging
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, ClassVar

import pytest

import rdzv.handler
from rdzv import (
    DynamicRendezvousHandler,
    FakeClock,
    RendezvousClosedError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeout,
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
    monkeypatch.setattr(rdzv.handler, "BOOTSTRAP_SLICE", 0.05)  # re-check the state often
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
    monkeypatch.setattr(rdzv.handler, "BOOTSTRAP_SLICE", 0.05)
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


@pytest.fixture
def closing_scheme() -> Iterator[list[_ClosingStore]]:
    _ClosingStore.closed = []
    opened: list[_ClosingStore] = []

    def opener(url: str, timeout: timedelta) -> Store:
        store = _ClosingStore()
        opened.append(store)
        return store

    register_scheme("closetest", opener, example="closetest://x")
    try:
        yield opened
    finally:
        unregister_scheme("closetest")


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


def test_shutdown_leaves_a_store_it_was_given_open() -> None:
    store = _ClosingStore()
    _ClosingStore.closed = []
    h = handler(store, 1, 1)
    with shut_down(h):
        h.next_rendezvous()
        assert h.shutdown() is True
    assert _ClosingStore.closed == []


# -- torchrun adapter (review P4, P5) ----------------------------------------------------------
class _RecordingStore(MemoryStore):
    """Records the timeout of every wait for keys."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[timedelta | None] = []

    def wait(self, keys: Any, timeout: timedelta | None = None) -> None:
        self.waits.append(timeout)
        super().wait(keys, timeout)


def test_the_agent_store_wait_uses_what_is_left_of_the_join_deadline() -> None:
    from rdzv.torch_plugin import MIN_AGENT_STORE_WAIT, TorchrunHandler

    clock = FakeClock()
    store = _RecordingStore()
    plugin = TorchrunHandler(handler(store, 1, 1, clock=clock))
    # Rank 0 already published its agent store: the member's wait returns at once.
    RendezvousStoreInfo.build(0, _prefixed(store), "host0", 29400)
    store.waits.clear()
    deadline = clock.monotonic() + 42.0
    assert plugin._share_agent_store(1, _round(store), "host0", deadline) == 29400
    assert store.waits == [timedelta(seconds=42.0)]
    clock.advance(100.0)  # past the deadline: the floor applies
    store.waits.clear()
    assert plugin._share_agent_store(1, _round(store), "host0", deadline) == 29400
    assert store.waits == [MIN_AGENT_STORE_WAIT]


def _round(store: Store) -> Store:
    from rdzv.store import PrefixStore

    return PrefixStore("round", store)


def _prefixed(store: Store) -> Store:
    from rdzv.store import PrefixStore
    from rdzv.torch_plugin import AGENT_STORE_NAMESPACE

    return PrefixStore(AGENT_STORE_NAMESPACE, _round(store))


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
