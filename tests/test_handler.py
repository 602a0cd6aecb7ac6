"""The real handler with real stores and real threads.

Scenarios pin down torch's behaviour (ranks, world size, wait list, rounds, close) and
ours (per-round bootstrap info, heartbeat thread lifecycle, errors for bad stores).
No test sleeps for a timeout to expire: timeouts are reached with a FakeClock.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from test_stores import opened_store

from rdzv import (
    DynamicRendezvousHandler,
    FakeClock,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeout,
    RendezvousTimeoutError,
    StoreRendezvousBackend,
    create_handler,
)
from rdzv.backend import Token
from rdzv.handler import BACKOFF_BASE, BACKOFF_CAP
from rdzv.store import PrefixStore, Store
from rdzv.stores import MemoryStore
from spec.codec import decode, encode, encode_node
from spec.machine import Announce, CompareAndSet, Fail, Read, ReadAnnounced
from spec.state import NodeId, RendezvousState
from spec.vocabulary import FailKind, Op

THREAD_JOIN = 60.0
"""Real seconds a test waits for its threads before declaring a hang."""


# -- helpers ---------------------------------------------------------------------------------
def run_all(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run each call in its own thread; return results (or the exceptions raised)."""
    results: list[Any] = [None] * len(calls)

    def target(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(THREAD_JOIN)
    assert not any(t.is_alive() for t in threads), "a rendezvous thread hung"
    return results


def make_handlers(
    url: str,
    n: int,
    min_nodes: int,
    max_nodes: int,
    run_id: str = "job",
    **config: str,
) -> list[DynamicRendezvousHandler]:
    config.setdefault("join_timeout", "60")
    config.setdefault("cache_duration", "0")
    return [
        create_handler(RendezvousParameters("rdzv", url, run_id, min_nodes, max_nodes, **config))
        for _ in range(n)
    ]


@contextlib.contextmanager
def shut(handlers: list[DynamicRendezvousHandler]) -> Iterator[list[DynamicRendezvousHandler]]:
    try:
        yield handlers
    finally:
        for h in handlers:
            h.shutdown()
        for h in handlers:
            thread = h.heartbeat_thread
            assert thread is None or not thread.is_alive()


@contextlib.contextmanager
def stopping(*handlers: DynamicRendezvousHandler) -> Iterator[None]:
    """On the way out, whatever happened: shut every handler's keep-alive thread down for
    good (without closing the rendezvous: that needs a store a test may have broken)."""
    try:
        yield
    finally:
        for h in handlers:
            h._heartbeats.shut()
        for h in handlers:
            thread = h.heartbeat_thread
            assert thread is None or not thread.is_alive()


def assert_one_round(infos: Sequence[Any], size: int) -> None:
    errors = [i for i in infos if isinstance(i, BaseException)]
    assert not errors, errors
    assert sorted(i.rank for i in infos) == list(range(size))
    assert {i.world_size for i in infos} == {size}
    assert len({i.round for i in infos}) == 1
    boot = {(i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port) for i in infos}
    assert len(boot) == 1
    assert all(0 < port < 65536 for _, port in boot)


def stored_state(store: Store, run_id: str = "job") -> RendezvousState:
    return decode(store.get(f"rdzv/{run_id}/state"))


def sqlite_url(tmp_path: Path, name: str = "rdzv.db") -> str:
    return f"sqlite://{tmp_path / name}"


# -- rendezvous through real stores -------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 8, 16])
def test_threads_rendezvous_through_sqlite(tmp_path: Path, n: int) -> None:
    with shut(make_handlers(sqlite_url(tmp_path), n, n, n)) as handlers:
        infos = run_all([h.next_rendezvous for h in handlers])
        assert_one_round(infos, n)
        assert infos[0].round == 0
        # Each node's rank is its position in the sorted node ids, as torch assigns them.
        order = sorted(range(n), key=lambda i: handlers[i].node)
        assert [infos[i].rank for i in order] == list(range(n))


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_sixteen_threads_on_memory_store(protocol: str) -> None:
    url = f"memory://test-sixteen-{protocol}"
    with shut(make_handlers(url, 16, 16, 16, protocol=protocol)) as handlers:
        infos = run_all([h.next_rendezvous for h in handlers])
        assert_one_round(infos, 16)
        stats = [h.io_stats() for h in handlers]
        if protocol == "hardened":
            # Every node's own join write landed (a lost write is retried, not counted).
            assert all(s.cas_attempts - s.cas_conflicts >= 1 for s in stats)
        else:
            # Each node announced itself once; the state was written by the folds only
            # (one fold completes a round of 16 arriving together, a few may race).
            assert [s.announces for s in stats] == [1] * 16
            landed = sum(s.cas_attempts - s.cas_conflicts for s in stats)
            assert 1 <= landed < 16


def test_round_store_is_namespaced_per_run_and_round(tmp_path: Path) -> None:
    with shut(make_handlers(sqlite_url(tmp_path), 2, 2, 2)) as handlers:
        infos: list[RendezvousInfo] = run_all([h.next_rendezvous for h in handlers])
        a, b = infos
        assert isinstance(a.rdzv_store, PrefixStore)
        assert a.rdzv_store.prefix == "rdzv/job/0"
        # info.store (torch's PrefixStore when torch is there) and info.rdzv_store name
        # the same keys.
        a.store.set("greeting", b"hello")
        assert b.rdzv_store.get("greeting") == b"hello"
        b.rdzv_store.set("reply", b"hi")
        assert a.store.get("reply") == b"hi"
        with opened_store(sqlite_url(tmp_path)) as raw:
            assert raw.get("rdzv/job/0/greeting") == b"hello"


def test_late_node_waits_is_counted_and_joins_the_next_round(tmp_path: Path) -> None:
    # On one FakeClock: round 0's last call ends only when the test advances the clock,
    # and round 1 (max 3) cannot complete with two nodes, however slow the third is,
    # because fake time stands still until all three joined.
    url = sqlite_url(tmp_path)
    clock = FakeClock()
    last_call = RendezvousTimeout(last_call=timedelta(seconds=2))
    with contextlib.ExitStack() as stack:
        stores = [stack.enter_context(opened_store(url)) for _ in range(4)]
        store = stores[3]  # the test's own connection
        a, b, late = (fake_clock_handler(s, clock, 2, 3, timeout=last_call) for s in stores[:3])
        stack.enter_context(stopping(a, b, late))
        round0 = run_all_async([a.next_rendezvous, b.next_rendezvous])
        try:
            wait_for_stored(store, lambda s: len(s.participants) == 2, "a and b in round 0")
            assert not stored_state(store).complete, "round 0 must wait out its last call"
            clock.advance(2.001)  # past the last call: round 0 completes with a and b
            wait_for_stored(store, lambda s: s.complete, "round 0 complete")
        except BaseException:
            a.set_closed()  # end a's and b's wait, so that their thread is joined below
            raise
        finally:
            first = round0()
        assert_one_round(first, 2)
        assert a.num_nodes_waiting() == 0

        late_call = run_all_async([late.next_rendezvous])
        try:
            # The late node writes itself onto the wait list of the complete round.
            wait_for_stored(store, lambda s: bool(s.wait_list), "late on the wait list")
            assert stored_state(store).wait_list == (late.node,)
            assert a.num_nodes_waiting() == 1
            assert b.num_nodes_waiting() == 1
            second = run_all([a.next_rendezvous, b.next_rendezvous])
        except BaseException:
            a.set_closed()  # round 1 never formed: end late's wait, so it is joined below
            raise
        finally:
            late_result = late_call()
        infos = [*second, *late_result]
        assert_one_round(infos, 3)
        assert infos[0].round == first[0].round + 1
        assert a.num_nodes_waiting() == 0
        # Node a was rank 0 in both rounds (torch 2.13 keeps its cached bootstrap info then,
        # and a node first joining in round 1 waits forever for it). Here the round-1
        # bootstrap info came from round 1's namespace, written by its rank 0.
        assert first[0].rank == second[0].rank == 0
        leader = next(i for i in infos if i.rank == 0)
        assert (
            store.get("rdzv/job/1/TCP_STORE_PORT")
            == str(leader.bootstrap_store_info.master_port).encode()
        )


def wait_for_stored(
    store: Store, ready: Callable[[RendezvousState], bool], what: str, key: str = "rdzv/job/state"
) -> None:
    """Wait (bounded: :data:`STORED_WAIT_S` of real time, and at most 20,000 looks) until
    the stored state satisfies ``ready``. A change ends a slice early, so the bound is
    one of time, not of slices: a loaded machine may write often and serve slowly."""
    end = time.monotonic() + STORED_WAIT_S
    for _ in range(20_000):  # bounded, and by ``end``
        current = store.get(key) if store.check([key]) else None
        if current is not None and ready(decode(current)):
            return
        if time.monotonic() > end:
            break
        store.wait_for_change(key, current, timedelta(seconds=0.05))
    raise AssertionError(f"the stored state never showed {what} within {STORED_WAIT_S:g} s")


STORED_WAIT_S = 90.0
"""Real seconds :func:`wait_for_stored` waits (generous: nothing is timed)."""


def test_re_rendezvous_advances_the_round_each_time() -> None:
    with shut(make_handlers("memory://test-rounds", 3, 3, 3)) as handlers:
        rounds = []
        for _ in range(3):
            infos = run_all([h.next_rendezvous for h in handlers])
            assert_one_round(infos, 3)
            rounds.append(infos[0].round)
        assert rounds == [0, 1, 2]


def test_close_is_seen_by_everybody_and_is_idempotent(tmp_path: Path) -> None:
    with shut(make_handlers(sqlite_url(tmp_path), 2, 2, 2)) as handlers:
        a, b = handlers
        assert_one_round(run_all([a.next_rendezvous, b.next_rendezvous]), 2)
        assert not b.is_closed()
        a.set_closed()
        a.set_closed()
        assert a.is_closed() and b.is_closed()
        with pytest.raises(RendezvousClosedError, match="closed"):
            b.next_rendezvous()
        assert a.shutdown() is True


def test_the_info_carries_sorted_participants_and_wait_list() -> None:
    store = MemoryStore()
    boot = RendezvousStoreInfo("host", 1234)
    x, y, z = NodeId("b", 1, 0), NodeId("a", 2, 0), NodeId("a", 1, 5)
    info = RendezvousInfo(store, 0, 2, boot, round=3, participants=[x, y], wait_list=(z, x))
    assert info.participants == [y, x]
    assert info.wait_list == [z, x]
    info.participants.append(z)  # a fresh list each time
    assert info.participants == [y, x]
    bare = RendezvousInfo(store, 0, 1, boot)
    assert bare.participants == [] and bare.wait_list == [] and bare.round is None
    with pytest.raises(TypeError, match="participants must be node ids"):
        RendezvousInfo(store, 0, 1, boot, participants="host_1_0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"wait_list must be node ids.*'x'"):
        RendezvousInfo(store, 0, 1, boot, wait_list=[x, "x"])  # type: ignore[list-item]


# -- timeouts, with a fake clock ---------------------------------------------------------------
def fake_clock_handler(
    store: Store, clock: FakeClock, min_nodes: int = 1, max_nodes: int = 1, **kw: Any
) -> DynamicRendezvousHandler:
    return DynamicRendezvousHandler.from_backend(
        "job",
        kw.pop("round_store", store),  # where round namespaces go; the state is in store
        StoreRendezvousBackend(store, "job"),
        min_nodes,
        max_nodes,
        timeout=kw.pop("timeout", None),
        keep_alive_interval=kw.pop("keep_alive_interval", 5),
        clock=clock,
        cache_duration=0,
        rng=kw.pop("rng", None) or NoBackoff(),
        **kw,
    )


class NoBackoff(random.Random):
    """Draws every backoff as 0 s: a writer that lost a race re-reads at once.

    A backoff is a sleep on the handler's clock; on a FakeClock nobody advances in the
    middle of a join, a loser would sleep until FakeClockStalled. The backoff itself is
    tested on its own (test_lost_writes_back_off_with_bounded_jitter_until_the_deadline)."""

    def uniform(self, a: float, b: float) -> float:
        return a


ALONE_IN_ROUND_0 = "rdzv/job/announce/0"
"""Round 0's announcement set (``scale``) in the tests of a node alone in an open round."""


def wait_until_joined_alone(store: MemoryStore, handler: DynamicRendezvousHandler) -> None:
    """Wait (bounded: 200 slices of at most 50 ms) until ``handler``, alone in round 0 of
    a round of two, has joined and waits. Under ``hardened`` it wrote itself into the
    state's participants; under ``scale`` it announced itself into round 0's set, and,
    alone, it reaches neither min_nodes nor max_nodes, so nobody folds and the state is
    never written."""
    member = encode_node(handler.node)

    def joined() -> bool:
        if handler.variant.name == "hardened":
            return stored_state_or_none(store) is not None
        return store.members(ALONE_IN_ROUND_0) == [member]

    for _ in range(200):
        if joined():
            break
        store.wait_for_change("rdzv/job/state", None, timedelta(seconds=0.05))
    if handler.variant.name == "hardened":
        assert stored_state(store).participant_nodes() == (handler.node,)
    else:
        assert store.members(ALONE_IN_ROUND_0) == [member]
        assert not store.check(["rdzv/job/state"])


def pass_the_deadline_alone(
    store: MemoryStore, clock: FakeClock, handler: DynamicRendezvousHandler, seconds: float
) -> None:
    """Move ``clock`` past the join deadline ``seconds`` away of a node that
    :func:`wait_until_joined_alone` saw join, and on until it gives up."""
    if handler.variant.name == "hardened":
        joined = store.get("rdzv/job/state")
        clock.advance(seconds + 0.001)  # past the deadline: the node withdraws within the window
        assert store.wait_for_change("rdzv/job/state", joined, timedelta(seconds=10))
        assert stored_state(store).participants == ()
        clock.advance(5.0)  # past the rollback window: it gives up
    else:
        # Past the deadline the node takes its announcement back (scale's row
        # join.withdraw_announcement) and, listed nowhere in the state, gives up at once: it
        # has no entry to roll back.
        clock.advance(seconds + 0.001)


def check_withdrawn_alone(store: MemoryStore, handler: DynamicRendezvousHandler) -> None:
    """After :func:`pass_the_deadline_alone`: the node left nothing behind."""
    if handler.variant.name == "hardened":
        assert stored_state(store).participants == ()
    else:
        assert store.members(ALONE_IN_ROUND_0) == []
        assert handler.io_stats().withdrawals == 1


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_join_times_out_on_the_fake_clock_without_sleeping(protocol: str) -> None:
    clock = FakeClock()
    store = MemoryStore()
    # Heartbeats far apart, so that the jump of the fake clock expires nobody.
    handler = fake_clock_handler(store, clock, 2, 2, keep_alive_interval=1000, protocol=protocol)
    assert handler.variant.name == protocol
    outcome = run_all_async([handler.next_rendezvous])
    try:
        # The node joined and now waits; nothing progresses until the fake time moves.
        wait_until_joined_alone(store, handler)
        pass_the_deadline_alone(store, clock, handler, 600.0)
        (error,) = outcome()
    finally:
        # On any path the join ends (timed out, or told by the close) and its thread is
        # joined; outcome() may run twice.
        handler.shutdown()
        outcome()
    assert isinstance(error, RendezvousTimeoutError)
    assert "deadline" in str(error) and "min_nodes" in str(error)
    check_withdrawn_alone(store, handler)


def stored_state_or_none(store: Store) -> RendezvousState | None:
    return stored_state(store) if store.check(["rdzv/job/state"]) else None


def run_all_async(calls: Sequence[Callable[[], Any]]) -> Callable[[], list[Any]]:
    box: list[list[Any]] = []
    thread = threading.Thread(target=lambda: box.append(run_all(calls)), daemon=True)
    thread.start()

    def finish() -> list[Any]:
        thread.join(THREAD_JOIN)
        assert not thread.is_alive(), "calls did not finish"
        return box[0]

    return finish


# -- heartbeats --------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_heartbeat_thread_starts_beats_and_stops_on_shutdown(protocol: str) -> None:
    clock = FakeClock()
    store = MemoryStore()
    handler = fake_clock_handler(store, clock, keep_alive_interval=5, protocol=protocol)
    beat_key = f"rdzv/job/beat/{handler.node}"
    with stopping(handler):
        assert handler.heartbeat_thread is None
        handler.next_rendezvous()
        thread = handler.heartbeat_thread
        assert thread is not None and thread.is_alive() and thread.daemon
        beat0 = stored_state(store).heartbeat_of(handler.node)
        assert clock.wait_for_sleepers(1)
        before = store.get("rdzv/job/state")
        assert store.try_get(beat_key) is None  # scale: no beat yet; hardened: no such key
        clock.advance(5.0)
        if protocol == "hardened":
            # The heartbeat is a stamp in the state: the state is written again.
            assert store.wait_for_change("rdzv/job/state", before, timedelta(seconds=10))
            beat1 = stored_state(store).heartbeat_of(handler.node)
            assert beat0 is not None and beat1 == beat0 + 5000
        else:
            # The heartbeat is a count under the node's own key (first beat: 1); the
            # state keeps its admission stamp and is not written again.
            assert store.wait_for_change(beat_key, None, timedelta(seconds=10))
            assert store.try_get(beat_key) == b"1"
            assert store.get("rdzv/job/state") == before
        assert handler.shutdown() is True
        assert not thread.is_alive()
        assert handler.heartbeat_thread is None


def test_heartbeat_thread_stops_when_the_handler_is_garbage_collected() -> None:
    clock = FakeClock()
    store = MemoryStore()
    handler = fake_clock_handler(store, clock)
    handler.next_rendezvous()
    thread = handler.heartbeat_thread
    assert thread is not None and thread.is_alive()
    ref = weakref.ref(handler)
    del handler
    try:
        gc.collect()
        assert ref() is None, "the heartbeat thread must not keep the handler alive"
        thread.join(THREAD_JOIN)
        assert not thread.is_alive()
    finally:
        left = ref()
        if left is not None:  # failed above: stop the thread that kept it alive
            left._heartbeats.shut()
            del left
        thread.join(THREAD_JOIN)


def test_heartbeat_failure_is_logged_and_the_thread_survives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    store = MemoryStore()
    handler = fake_clock_handler(store, clock, keep_alive_interval=5)
    with stopping(handler):
        handler.next_rendezvous()
        thread = handler.heartbeat_thread
        assert thread is not None
        assert clock.wait_for_sleepers(1)
        store.set("rdzv/job/state", b"garbage")

        def warnings() -> list[str]:
            return [r.getMessage() for r in caplog.records if "keep-alive" in r.getMessage()]

        def warned(count: int) -> bool:
            """Wait (bounded: 2000 polls of 5 ms) for ``count`` keep-alive warnings."""
            for _ in range(2000):
                if len(warnings()) >= count:
                    return True
                time.sleep(0.005)
            return False

        with caplog.at_level(logging.WARNING, logger="rdzv.handler"):
            clock.advance(5.0)
            assert warned(1)
            assert "corrupt" in warnings()[0]
            # The thread survived: it went back to sleep for the next beat, which fails too.
            assert clock.wait_for_sleepers(1)
            assert handler.heartbeat_thread is thread and thread.is_alive()
            clock.advance(5.0)
            assert warned(2)
        assert store.get("rdzv/job/state") == b"garbage", "a failed heartbeat must not write"
        assert handler.shutdown() is False  # closing fails on the corrupt state: False
        assert not thread.is_alive()


class _HoldingKeepAlive(StoreRendezvousBackend):
    """Holds the keep-alive thread inside its state read once ``hold`` is set, until
    ``gate`` opens; ``held`` tells the test it is there."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, "job")
        self.hold = threading.Event()
        self.held = threading.Event()
        self.gate = threading.Event()

    def get_state(self) -> tuple[bytes, Token] | None:
        keep_alive = threading.current_thread().name.startswith("rdzv-keep-alive")
        if keep_alive and self.hold.is_set():
            self.held.set()
            assert self.gate.wait(THREAD_JOIN), "the test never opened the gate"
        return super().get_state()


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_queries_run_beside_the_heartbeats_on_a_machine_of_their_own(protocol: str) -> None:
    # Queries never wait for the keep-alive (or a join): they run on the handler's second
    # machine, so they answer while a keep-alive is stuck inside a store call, and the
    # join's machine (which the keep-alive uses) is left alone.
    clock = FakeClock()
    store = MemoryStore()
    backend = _HoldingKeepAlive(store)
    handler = DynamicRendezvousHandler.from_backend(
        "job",
        store,
        backend,
        1,
        1,
        keep_alive_interval=5,
        clock=clock,
        cache_duration=0,
        protocol=protocol,
    )
    with stopping(handler):
        handler.next_rendezvous()
        beat0 = stored_state(store).heartbeat_of(handler.node)
        assert beat0 is not None
        assert clock.wait_for_sleepers(1)  # the keep-alive thread waits for its time
        backend.hold.set()
        clock.advance(5.0)
        queries: Callable[[], list[Any]] | None = None
        try:
            assert backend.held.wait(THREAD_JOIN), "the keep-alive never read the state"
            local, beats = handler.driver.local, handler.driver.stats.copy()
            control = handler._control.stats.copy()
            queries = run_all_async([handler.num_nodes_waiting, handler.is_closed])
            assert queries() == [0, False]  # answered while the keep-alive is held
            assert handler.driver.local is local, "a query changed the join's machine"
            assert handler.driver.stats == beats, "a query ran on the join's machine"
            assert handler._control.stats.reads == control.reads + 2  # one read per query
        finally:
            backend.gate.set()
            if queries is not None:
                queries()
        # The held keep-alive then finishes its beat.
        if protocol == "hardened":  # a stamp in the state
            for _ in range(200):  # bounded: 200 slices of at most 50 ms
                beat = stored_state(store).heartbeat_of(handler.node)
                if beat != beat0:
                    break
                current = store.get("rdzv/job/state")
                store.wait_for_change("rdzv/job/state", current, timedelta(seconds=0.05))
            assert beat == beat0 + 5000
        else:  # a count under the node's own key (the first beat: 1)
            beat_key = f"rdzv/job/beat/{handler.node}"
            assert store.wait_for_change(beat_key, None, timedelta(seconds=10))
            assert store.try_get(beat_key) == b"1"
        assert handler.shutdown() is True


# -- bad inputs -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "garbage",
    [b"\x80\x04pickle", b"{}", b'{"v":99}', b"not json at all", b""],
    ids=["pickle", "empty-object", "future-version", "text", "empty"],
)
def test_corrupt_state_gives_a_state_error_and_is_left_alone(garbage: bytes) -> None:
    store = MemoryStore()
    store.set("rdzv/job/state", garbage)
    handler = fake_clock_handler(store, FakeClock())
    with stopping(handler):
        with pytest.raises(RendezvousStateError) as info:
            handler.next_rendezvous()
        message = str(info.value)
        assert "corrupt" in message and "rdzv/job/state" in message and "run id" in message
        assert store.get("rdzv/job/state") == garbage
        with pytest.raises(RendezvousStateError):
            handler.num_nodes_waiting()
        assert handler.shutdown() is False


def test_unreachable_store_gives_a_connection_error(tmp_path: Path) -> None:
    # The SQLite store refuses at open time, before any handler exists.
    url = f"sqlite://{tmp_path / 'missing-dir' / 'rdzv.db'}"
    params = RendezvousParameters("rdzv", url, "job", 1, 1)
    with pytest.raises(RendezvousConnectionError) as info:
        create_handler(params)
    message = str(info.value)
    assert "missing-dir" in message and "does not exist" in message and "create it" in message


def test_locked_store_gives_a_connection_error_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    handler = create_handler(
        RendezvousParameters("rdzv", f"sqlite://{path}?busy_timeout_ms=50", "job", 1, 1)
    )
    with shut([handler]):
        holder = sqlite3.connect(str(path), isolation_level=None)
        holder.execute("PRAGMA journal_mode = WAL")
        holder.execute("CREATE TABLE IF NOT EXISTS rdzv_kv (key TEXT PRIMARY KEY, value BLOB)")
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(RendezvousConnectionError, match="locked"):
                handler.next_rendezvous()
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        assert handler.shutdown() is True


class _Unreachable(StoreRendezvousBackend):
    """A backend whose store went away after it was created."""

    def get_state(self) -> tuple[bytes, Token] | None:
        raise OSError("connection refused")


def test_store_exceptions_become_connection_errors_with_the_cause() -> None:
    store = MemoryStore()
    handler = DynamicRendezvousHandler.from_backend("job", store, _Unreachable(store, "job"), 1, 1)
    with stopping(handler), pytest.raises(RendezvousConnectionError) as info:
        handler.next_rendezvous()
    assert "connection refused" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_nodes": 3, "max_nodes": 2}, r"max_nodes \(2\) must be >= min_nodes \(3\)"),
        ({"min_nodes": 0, "max_nodes": 2}, r"min_nodes \(0\) must be >= 1"),
        ({"keep_alive_interval": 0}, r"keep_alive_interval is 0 s, which is zero; pass the"),
        ({"keep_alive_max_attempt": 0}, r"keep_alive_max_attempt \(0\) must be >= 1"),
        ({"keep_alive_interval": "5"}, r"keep_alive_interval must be a number of seconds"),
        ({"protocol": "nope"}, r"unknown protocol variant 'nope'; choose one of: "),
        ({"run_id": ""}, r"run_id must be a non-empty string"),
        ({"timeout": RendezvousTimeout(join=timedelta(seconds=0.0001))}, r"join_timeout \(0 ms\)"),
    ],
)
def test_wrong_settings_are_rejected_with_a_clear_message(
    kwargs: dict[str, Any], message: str
) -> None:
    store = MemoryStore()
    args: dict[str, Any] = {"run_id": "job", "min_nodes": 1, "max_nodes": 1}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        DynamicRendezvousHandler.from_backend(
            store=store, backend=StoreRendezvousBackend(store, "job"), **args
        )


@pytest.mark.parametrize(("value", "problem"), [(0, "zero"), ("0", "zero"), ("-2", "negative")])
def test_a_keep_alive_interval_not_above_zero_gets_one_message_however_it_is_given(
    value: int | str, problem: str
) -> None:
    # One check of the interval, for from_backend's argument and create_handler's config.
    store = MemoryStore()
    with pytest.raises(ValueError) as direct:
        DynamicRendezvousHandler.from_backend(
            "job",
            store,
            StoreRendezvousBackend(store, "job"),
            1,
            1,
            keep_alive_interval=float(value),
        )
    params = RendezvousParameters("rdzv", "memory://ka", "job", 1, 1, keep_alive_interval=value)
    with pytest.raises(ValueError) as configured:
        create_handler(params)
    advice = f"which is {problem}; pass the seconds between two keep-alives, above zero"
    assert str(direct.value).startswith(f"keep_alive_interval is {float(value)!r} s, {advice}")
    assert str(configured.value).startswith(
        f"config option 'keep_alive_interval' is {value!r}, {advice}"
    )


def test_a_written_state_round_trips_through_the_codec() -> None:
    # The handler writes spec's canonical bytes, nothing of its own.
    store = MemoryStore()
    handler = fake_clock_handler(store, FakeClock())
    with stopping(handler):
        handler.next_rendezvous()
        raw = store.get("rdzv/job/state")
        assert encode(decode(raw), handler.variant.name) == raw
        assert handler.shutdown() is True


# -- backoff after lost writes -------------------------------------------------------------------
class _RecordingRandom(random.Random):
    def __init__(self) -> None:
        super().__init__(7)
        self.windows: list[float] = []

    def uniform(self, a: float, b: float) -> float:
        self.windows.append(b)
        return super().uniform(a, b)


class _AlwaysLoses(StoreRendezvousBackend):
    """Every write loses a race against a writer that keeps the state as it was."""

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        return self._current(written=False)


FIRST_JOIN_WRITE = {
    "hardened": (Read, CompareAndSet),  # read: nothing stored; the node writes itself in
    # read; announce (the set's size, 1, fills max_nodes 1); read the set; fold it
    "scale": (Read, Announce, ReadAnnounced, CompareAndSet),
}
"""The requests of a lone node's join up to its first write of the state, per protocol."""


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_lost_writes_back_off_with_bounded_jitter_until_the_deadline(protocol: str) -> None:
    clock = FakeClock()
    store = MemoryStore()
    rng = _RecordingRandom()
    handler = DynamicRendezvousHandler.from_backend(
        "job",
        store,
        _AlwaysLoses(store, "job"),
        1,
        1,
        clock=clock,
        rng=rng,
        cache_duration=0,
        protocol=protocol,
    )
    driver = handler.driver
    driver.start(Op.JOIN, driver.deadline_after(2000))
    for kind in FIRST_JOIN_WRITE[protocol]:  # the last one, the write, loses
        assert isinstance(driver.request, kind), driver.request
        assert driver.poll()
    assert not driver.poll(), "a writer that lost must back off before trying again"
    steps = 0
    while not driver.finished and steps < 10_000:  # bounded: the deadline ends it
        if not driver.poll():
            clock.advance(BACKOFF_CAP)
        steps += 1
    assert isinstance(driver.request, Fail) and driver.request.kind is FailKind.TIMEOUT
    assert rng.windows[:7] == [BACKOFF_BASE * 2**k for k in range(7)]
    assert max(rng.windows) == BACKOFF_CAP
    assert driver.stats.cas_conflicts == len(rng.windows) > 7


# -- a dead member of a complete round (model checker finding 2) -------------------------------
@pytest.mark.parametrize(("protocol", "reported"), [("upstream", 0), ("hardened", 1)])
def test_a_dead_member_of_a_complete_round_is_reported_only_by_hardened(
    protocol: str, reported: int
) -> None:
    clock = FakeClock()
    store = MemoryStore()
    a, b = (
        fake_clock_handler(store, clock, 2, 2, keep_alive_interval=5, protocol=protocol)
        for _ in range(2)
    )
    with stopping(a, b):
        infos = run_all([a.next_rendezvous, b.next_rendezvous])
        assert sorted(i.rank for i in infos) == [0, 1]
        b._stop_heartbeats()  # b dies silently: no more heartbeats, no exit
        # Let a's heartbeat thread beat four times (20 s): b's last beat (t=0) expires at 15 s.
        for _ in range(4):
            assert clock.wait_for_sleepers(1)
            before = store.get("rdzv/job/state")
            clock.advance(5.0)
            assert store.wait_for_change("rdzv/job/state", before, timedelta(seconds=10))
        state = stored_state(store)
        assert b.node not in state.participant_nodes()
        # torch's agent polls this and re-rendezvouses only when it is > 0.
        assert a.num_nodes_waiting() == reported
        if protocol == "hardened":
            assert state.round == 1 and not state.complete and state.wait_list == (a.node,)
        else:
            assert state.round == 0 and state.complete and state.participant_nodes() == (a.node,)
        assert a.shutdown() is True
        assert b.shutdown() is True


# -- nodes standing by for a round whose members died -------------------------------------------
STEPS = 400
"""Bound on the 1 s steps of fake time a test below moves on before it gives up."""


class Call:
    """``fn()`` in a daemon thread; ``result`` is what it returned or raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.result = exc

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()


def advance_until(clock: FakeClock, done: Callable[[], bool], what: str) -> None:
    """Move ``clock`` on in 1 s steps, with a little real time after each for the
    handlers' threads to act, until ``done()``; at most STEPS steps."""
    for _ in range(STEPS):  # bounded
        if done():
            return
        clock.advance(1.0)
        time.sleep(0.05)  # real time for the threads to act on the new fake time
    assert done(), f"{what}: not within {STEPS} s of fake time"


@pytest.mark.parametrize("protocol", ["upstream", "hardened", "scale"])
@pytest.mark.parametrize("max_nodes", [1, 2], ids=["redundant", "waiting"])
def test_a_node_standing_by_for_a_round_whose_members_died_forms_the_next(
    protocol: str, max_nodes: int
) -> None:
    # a forms a round alone (min_nodes 1). b calls next_rendezvous later and stands by:
    # on the redundancy list (max_nodes 1: the round is full) or on the wait list
    # (max_nodes 2). Then a dies silently. b must not stand by for a dead round until its
    # deadline (or, redundant, for ever): it finds a dead and forms the next round alone.
    # Found with real torchrun under `scale`, whose waiting nodes watched nobody.
    clock = FakeClock()
    store = MemoryStore()
    timeout = RendezvousTimeout(join=timedelta(seconds=600), last_call=timedelta(seconds=1))
    a, b = (
        fake_clock_handler(store, clock, 1, max_nodes, protocol=protocol, timeout=timeout)
        for _ in range(2)
    )
    with stopping(a, b):
        first = Call(a.next_rendezvous)
        advance_until(clock, lambda: first.done, "a forms a round alone")
        assert isinstance(first.result, RendezvousInfo), first.result
        assert (first.result.round, first.result.world_size) == (0, 1)
        a._stop_heartbeats()  # a dies silently: no more heartbeats, no exit
        late = Call(b.next_rendezvous)
        try:
            wait_for_stored(
                store,
                lambda s: b.node in (*s.wait_list, *s.redundancy_list),
                "b stands by",
            )
            advance_until(clock, lambda: late.done, "b forms the next round")
        finally:
            if not late.done:
                b.shutdown()  # a close ends the join that still stands by
                late.thread.join(THREAD_JOIN)
        info = late.result
        assert isinstance(info, RendezvousInfo), info
        assert (info.round, info.rank, info.world_size) == (1, 0, 1)
        state = stored_state(store)
        assert state.participant_nodes() == (b.node,)
        assert a.node not in (*state.wait_list, *state.redundancy_list)
        assert b.shutdown() is True


class FailingStore:
    """``inner`` until ``fail`` is set; from then on every call raises, as for a process
    that lost its store for good."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.fail = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.fail:
                raise ConnectionResetError(f"connection reset ({name})")
            return attr(*args, **kwargs)

        return call


@pytest.mark.parametrize("protocol", ["upstream", "hardened", "scale"])
def test_a_dead_node_on_the_wait_list_is_pruned(protocol: str) -> None:
    # a and b form a round (min 2, max 3); c joins the wait list, then its process dies
    # (here: its store connection fails, so its join ends and it never beats again).
    # torch's agents re-rendezvous while num_nodes_waiting() > 0, so a dead waiter left
    # listed would restart their workers again and again: the members must prune it once
    # its heartbeat expired. Under `scale` nobody watched waiting nodes.
    clock = FakeClock()
    store = MemoryStore()
    timeout = RendezvousTimeout(last_call=timedelta(seconds=1))
    a, b = (
        fake_clock_handler(store, clock, 2, 3, protocol=protocol, timeout=timeout) for _ in range(2)
    )
    broken = FailingStore(store)
    c = fake_clock_handler(broken, clock, 2, 3, protocol=protocol, timeout=timeout)
    with stopping(a, b, c):
        calls = [Call(a.next_rendezvous), Call(b.next_rendezvous)]
        advance_until(clock, lambda: all(call.done for call in calls), "a and b form a round")
        assert_one_round([call.result for call in calls], 2)
        waiter = Call(c.next_rendezvous)
        wait_for_stored(store, lambda s: s.wait_list == (c.node,), "c waits")
        assert a.num_nodes_waiting() == 1
        broken.fail = True
        waiter.thread.join(THREAD_JOIN)
        assert isinstance(waiter.result, RendezvousConnectionError), waiter.result
        # Keep-alives are run by the test, in step with the clock (no threads).
        a._stop_heartbeats()
        b._stop_heartbeats()
        # 30 s: c stopped beating at t = 0 and expires after 15 s; under the local
        # liveness clock (hardened, scale) that is 15 s after an observer first saw its
        # last value, which the members read first at their keep-alive at t = 5 s.
        for _ in range(6):
            clock.advance(5.0)
            a._keep_alive(threading.Event())
            b._keep_alive(threading.Event())
        state = stored_state(store)
        assert state.wait_list == ()
        assert state.complete and set(state.participant_nodes()) == {a.node, b.node}
        assert a.num_nodes_waiting() == b.num_nodes_waiting() == 0
        assert a.shutdown() is True
        assert b.shutdown() is True


# -- a wall clock stepped back (an NTP correction) ---------------------------------------------
@pytest.mark.parametrize("protocol", ["upstream", "hardened"])
def test_a_wall_clock_stepped_back_silences_a_node_only_under_upstream(protocol: str) -> None:
    # a's system clock is set back an hour after the round formed. upstream times a
    # node's own heartbeats on its wall clock: a thinks its last beat lies in the future,
    # stops beating, and b evicts it. hardened runs on a wall clock that cannot jump
    # (SteadyWallClock), so a beats on and stays a member: only clock rates must agree.
    store = MemoryStore()
    clock_a, clock_b = FakeClock(), FakeClock()
    a = fake_clock_handler(store, clock_a, 2, 2, keep_alive_interval=5, protocol=protocol)
    b = fake_clock_handler(store, clock_b, 2, 2, keep_alive_interval=5, protocol=protocol)
    with stopping(a, b):
        infos = run_all([a.next_rendezvous, b.next_rendezvous])
        assert_one_round(infos, 2)
        # Keep-alives are run by the test, in step with both clocks (no threads).
        a._stop_heartbeats()
        b._stop_heartbeats()
        beat_before = stored_state(store).heartbeat_of(a.node)
        clock_a.skew_wall(-3600.0)
        for _ in range(4):  # 20 s: a silent node expires after 15 s
            clock_a.advance(5.0)
            clock_b.advance(5.0)
            a._keep_alive(threading.Event())
            b._keep_alive(threading.Event())
        state = stored_state(store)
        if protocol == "upstream":
            assert state.heartbeat_of(a.node) is None or state.heartbeat_of(a.node) == beat_before
            assert state.participant_nodes() == (b.node,)
        else:
            assert state.heartbeat_of(a.node) != beat_before
            assert state.participant_nodes() == (a.node, b.node) and state.complete
            assert a.num_nodes_waiting() == b.num_nodes_waiting() == 0


# -- a node that will not work in its round stops its heartbeats ------------------------------
class _RoundStoreDown(MemoryStore):
    """A store every round-namespace call of which fails, as on a lost connection."""

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        raise ConnectionResetError(f"connection reset while writing {list(keys)}")

    def wait_get(self, keys: Sequence[str], timeout: timedelta | None = None) -> list[bytes]:
        raise ConnectionResetError(f"connection reset while reading {list(keys)}")


def _expire_quiet_nodes(
    store: MemoryStore, clock: FakeClock, beater: DynamicRendezvousHandler
) -> None:
    """Let ``beater``'s heartbeat thread, the only one running, beat until a node that
    stopped beating at t = 0 is pruned (keep-alive 5 s, 3 attempts: expiry 15 s).

    ``hardened``: every beat rewrites the state, whose stamp of the quiet node expires at
    15 s: four beats (20 s). ``scale``: ``beater``, the first participant, first reads
    the quiet node's heartbeat key at its first keep-alive (5 s) and prunes it once that
    value stood still for longer than the expiry from then (the local liveness clock):
    five intervals (25 s); only the prune writes the state."""
    if beater.variant.name == "hardened":
        for _ in range(4):
            assert clock.wait_for_sleepers(1)
            before = store.get("rdzv/job/state")
            clock.advance(5.0)
            assert store.wait_for_change("rdzv/job/state", before, timedelta(seconds=10))
        return
    key = f"rdzv/job/beat/{beater.node}"
    for _ in range(5):
        assert clock.wait_for_sleepers(1)  # the previous keep-alive, if any, is over
        beat = store.try_get(key)
        clock.advance(5.0)
        assert store.wait_for_change(key, beat, timedelta(seconds=10))  # it beat...
    assert clock.wait_for_sleepers(1)  # ...and watched (and pruned) before sleeping again


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
@pytest.mark.parametrize("how", ["bootstrap read fails", "abandon_round"])
def test_a_member_that_cannot_work_in_its_round_stops_beating_and_the_round_moves_on(
    how: str, protocol: str
) -> None:
    clock = FakeClock()
    store = MemoryStore()
    # a is created first, so it sorts first and gets rank 0 (see new_node_id); under
    # scale that also makes it the watcher of b's heartbeat key.
    a = fake_clock_handler(store, clock, 2, 2, keep_alive_interval=5, protocol=protocol)
    broken = _RoundStoreDown() if how == "bootstrap read fails" else store
    b = fake_clock_handler(
        store, clock, 2, 2, keep_alive_interval=5, round_store=broken, protocol=protocol
    )
    with stopping(a, b):
        info, outcome = run_all([a.next_rendezvous, b.next_rendezvous])
        assert info.rank == 0
        if how == "bootstrap read fails":
            # b joined round 0 but cannot read rank 0's bootstrap info: the call fails...
            assert isinstance(outcome, RendezvousConnectionError), outcome
            assert "bootstrap info of round 0" in str(outcome)
        else:
            # ...or b's caller failed after the call (torchrun's agent store) and says so.
            assert outcome.rank == 1
            b.abandon_round()
        # ...and b no longer beats, without having left: it is a member until it expires.
        assert b.heartbeat_thread is None
        assert b.node in stored_state(store).participant_nodes()
        _expire_quiet_nodes(store, clock, a)
        state = stored_state(store)
        assert b.node not in state.participant_nodes()
        assert state.round == 1 and state.wait_list == (a.node,)
        assert a.num_nodes_waiting() == 1  # torch's agent re-rendezvouses on this
        # b may try again: both form the next round.
        if how == "bootstrap read fails":
            b._store = store  # the connection is back
        again = run_all([a.next_rendezvous, b.next_rendezvous])
        assert_one_round(again, 2)
        assert again[0].round == 1
        assert a.shutdown() is True
        assert b.shutdown() is True


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_next_rendezvous_until_keeps_the_deadline_it_is_given(protocol: str) -> None:
    clock = FakeClock()
    store = MemoryStore()
    handler = fake_clock_handler(store, clock, 2, 2, keep_alive_interval=1000, protocol=protocol)
    deadline = clock.monotonic() + 10.0  # far before the join timeout (600 s)
    outcome = run_all_async([lambda: handler.next_rendezvous_until(deadline)])
    try:
        wait_until_joined_alone(store, handler)
        pass_the_deadline_alone(store, clock, handler, 10.0)  # the deadline given
        (error,) = outcome()
    finally:
        handler.shutdown()
        outcome()
    assert isinstance(error, RendezvousTimeoutError)
    check_withdrawn_alone(store, handler)


# -- clock skew (model checker finding 1) ------------------------------------------------------
@pytest.mark.parametrize("protocol", ["upstream", "hardened"])
def test_wall_clock_skew_evicts_a_live_node_only_under_upstream(protocol: str) -> None:
    store = MemoryStore()
    slow, fast = FakeClock(), FakeClock()
    fast.skew_wall(100.0)  # b's wall clock runs 100 s ahead; the expiry is 15 s
    a = fake_clock_handler(store, slow, 2, 2, keep_alive_interval=5, protocol=protocol)
    b = fake_clock_handler(store, fast, 2, 2, keep_alive_interval=5, protocol=protocol)
    # Stop the heartbeat threads without closing: a close could lose a write race and
    # then back off on a fake clock that this test never advances.
    with stopping(a, b):
        first = run_all_async([a.next_rendezvous])
        try:
            for _ in range(200):  # a has joined and waits for a second node
                if stored_state_or_none(store) is not None:
                    break
                store.wait_for_change("rdzv/job/state", None, timedelta(seconds=0.05))
            assert stored_state(store).participant_nodes() == (a.node,)
            (info_b,) = run_all([b.next_rendezvous])
        finally:
            if b.driver.local.view.rank_of(b.node) is None:
                a.set_closed()  # b never joined: end a's wait (it raises RendezvousClosedError)
            (info_a,) = first()
        assert not isinstance(info_a, BaseException) and not isinstance(info_b, BaseException)
        if protocol == "upstream":
            # b judged a's fresh heartbeat 100 s old and pruned it from the round it
            # returned: the two members disagree about the world they are in.
            assert (info_a.world_size, info_b.world_size) == (2, 1)
        else:
            assert (info_a.world_size, info_b.world_size) == (2, 2)
            assert sorted((info_a.rank, info_b.rank)) == [0, 1]


# -- the log: one INFO line per real event (issue 26, item 5) ---------------------------------
def _rdzv_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("rdzv.")]


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    """Wait (bounded: 3000 polls of 10 ms) for a line of rdzv's log containing ``text``."""
    for _ in range(3000):
        if any(text in line for line in _rdzv_lines(caplog)):
            return True
        time.sleep(0.01)
    return False


def test_info_lines_tell_each_real_event_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Two nodes over SQLite: both wait for the last call, join round 0, one goes silent
    # and the other prunes it, then closes the rendezvous. Each is one INFO line on the
    # "rdzv.handler" logger; the JSON events stay at DEBUG.
    conf = {"last_call_timeout": "0.5", "keep_alive_interval": "0.2", "keep_alive_max_attempt": "3"}
    with (
        caplog.at_level(logging.INFO, logger="rdzv"),
        shut(make_handlers(sqlite_url(tmp_path), 2, 2, 3, **conf)) as (a, b),
    ):
        infos = run_all([a.next_rendezvous, b.next_rendezvous])
        assert_one_round(infos, 2)
        b.abandon_round()  # b's heartbeats stop: a must find it silent and prune it
        assert _logged(caplog, f"pruned node {b.node} from run 'job'"), _rdzv_lines(caplog)
        a.set_closed()
        lines = _rdzv_lines(caplog)
    for handler, info in zip((a, b), infos, strict=True):
        joined = f"node {handler.node} joined round 0 of run 'job' as rank {info.rank} of 2"
        assert sum(line.startswith(joined) for line in lines) == 1, lines
        waits = f"node {handler.node} waits for the last call of round 0 of run 'job' ("
        (waited,) = [line for line in lines if line.startswith(waits)]
        assert "nodes joined): it ends in " in waited and waited.endswith(" s")
    (pruned,) = [line for line in lines if f"pruned node {b.node}" in line]
    assert pruned.startswith(f"node {a.node} pruned node {b.node} from run 'job' (round ")
    assert "it was silent for " in pruned and "the heartbeat expiry is 0.6 s" in pruned
    closed = f"node {a.node} closed the rendezvous of run 'job'"
    assert sum(line.startswith(closed) for line in lines) == 1, lines
    assert not [r for r in caplog.records if r.name == "rdzv.events"]  # DEBUG only
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "rdzv.handler")


class _GoesAway(StoreRendezvousBackend):
    """Fails every state read and write while ``down`` is set, as a store that is gone."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, "job")
        self.down = threading.Event()

    def get_state(self) -> tuple[bytes, Token] | None:
        if self.down.is_set():
            raise ConnectionRefusedError("connection refused")
        return super().get_state()


def test_an_unreachable_store_is_told_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    store = MemoryStore()
    backend = _GoesAway(store)
    handler = DynamicRendezvousHandler.from_backend(
        "job", store, backend, 1, 1, keep_alive_interval=5, clock=clock, cache_duration=0
    )

    def told(text: str) -> list[str]:
        return [line for line in _rdzv_lines(caplog) if text in line]

    down = f"node {handler.node} cannot reach the store of run 'job' (reading the state failed"
    with stopping(handler), caplog.at_level(logging.INFO, logger="rdzv"):
        handler.next_rendezvous()
        assert clock.wait_for_sleepers(1)
        backend.down.set()
        for _ in (1, 2):  # two keep-alives fail: the outage is told once
            reads = handler.io_stats().reads
            clock.advance(5.0)
            for _ in range(3000):  # bounded: wait for the failed keep-alive's read
                if handler.io_stats().reads > reads:
                    break
                time.sleep(0.01)
            assert clock.wait_for_sleepers(1)
            assert _logged(caplog, "keep-alive of node")
        assert len(told(down)) == 1, _rdzv_lines(caplog)
        # The heartbeat thread's own warning, too, once per run of failures.
        assert len(told("keep-alive of node")) == 1, _rdzv_lines(caplog)
        assert "its keep-alive is retried every 5 s" in told(down)[0]
        backend.down.clear()
        clock.advance(5.0)
        assert _logged(caplog, f"node {handler.node} reaches the store of run 'job' again")
        assert handler.shutdown() is True
    assert len(told("reaches the store of run 'job' again")) == 1
    assert len(told(down)) == 1
