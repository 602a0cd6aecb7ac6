"""The real handler running the ``scale`` variant (``protocol=scale``).

Threads of one process stand in for nodes; each handler has its own store connection. All
nodes of a min = max = N rendezvous call ``next_rendezvous`` together: they announce
themselves in the round's announcement set and the node whose announcement fills the round
folds the set into the state, so the whole round costs a handful of compare-and-sets
instead of one or more per node. Checked on memory://, sqlite:// and the real Redis and
etcd servers; a store without announcement sets gets a clear error.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from servers import EtcdServer, RedisServer
from test_stores import MemoryWithout, opened_store

from rdzv import (
    RendezvousError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeout,
    create_handler,
)
from rdzv.backend import StoreRendezvousBackend
from rdzv.clock import Clock, FakeClock
from rdzv.errors import RendezvousStateError, RendezvousTimeoutError
from rdzv.handler import DynamicRendezvousHandler, IoStats
from rdzv.store import Store
from rdzv.stores.memory import MemoryStore
from spec.codec import decode, encode_node

JOIN_S = 60.0
"""Bound on how long the test waits for one node thread."""


def _rendezvous(
    url: str,
    n: int,
    before_shutdown: Callable[[list[RendezvousInfo]], None] | None = None,
    **config: str,
) -> tuple[list[RendezvousInfo], list[IoStats]]:
    """``n`` nodes of one round; ``before_shutdown`` looks at their answers while the
    round still stands (shutdown() closes the run and leaves it)."""
    run = "scale-" + uuid.uuid4().hex[:8]
    params = [
        RendezvousParameters("rdzv", url, run, n, n, protocol="scale", join_timeout="60", **config)
        for _ in range(n)
    ]
    handlers = [create_handler(p) for p in params]
    results: list[RendezvousInfo | None] = [None] * n
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def node(i: int) -> None:
        try:
            barrier.wait(JOIN_S)
            results[i] = handlers[i].next_rendezvous()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_S)
        assert not any(t.is_alive() for t in threads), "a node hung"
        assert not errors, errors[:3]
        stats = [h.io_stats() for h in handlers]
        if before_shutdown is not None:
            before_shutdown([r for r in results if r is not None])
    finally:
        for h in handlers:
            h.shutdown()
    infos = [r for r in results if r is not None]
    assert len(infos) == n
    return infos, stats


def _check(infos: list[RendezvousInfo], stats: list[IoStats], n: int) -> None:
    assert sorted(i.rank for i in infos) == list(range(n))
    assert {i.world_size for i in infos} == {n}
    assert len({i.round for i in infos}) == 1
    assert sum(s.announces for s in stats) == n
    # Each node loses at most two compare-and-sets (the bound, here per round).
    assert sum(s.cas_conflicts for s in stats) <= 2 * n


@pytest.mark.parametrize("n", [1, 4, 32])
def test_memory_round_costs_one_write(n: int) -> None:
    infos, stats = _rendezvous(f"memory://{uuid.uuid4().hex}", n)
    _check(infos, stats, n)
    # Threads of one process share nothing but the store; still, the fold is the only
    # write whenever every announcement lands before the filling one is folded.
    assert sum(s.cas_attempts for s in stats) <= n


def test_sqlite_rendezvous(tmp_path: Path) -> None:
    infos, stats = _rendezvous(f"sqlite://{tmp_path / 'rdzv.db'}", 8)
    _check(infos, stats, 8)


def test_redis_rendezvous(redis_server: RedisServer) -> None:
    url = f"{redis_server.url}?prefix=scale{uuid.uuid4().hex[:6]}"
    infos, stats = _rendezvous(url, 24)
    _check(infos, stats, 24)


def test_etcd_rendezvous(etcd_server: EtcdServer) -> None:
    url = f"{etcd_server.url}?prefix=scale{uuid.uuid4().hex[:6]}"
    infos, stats = _rendezvous(url, 24)
    _check(infos, stats, 24)


def test_the_state_records_every_member_with_its_rank() -> None:
    url = f"memory://{uuid.uuid4().hex}"

    def look(infos: list[RendezvousInfo]) -> None:
        assert len(infos) == 6
        with opened_store(url) as store:
            _check_the_members(store, infos)

    _rendezvous(url, 6, look)


def _check_the_members(store: Store, infos: list[RendezvousInfo]) -> None:
    prefixes = {i.rdzv_store.prefix for i in infos}  # type: ignore[attr-defined]
    assert len(prefixes) == 1  # rdzv/<run>/<round>
    _, run, round_ = prefixes.pop().split("/")
    state = decode(store.get(f"rdzv/{run}/state"))
    assert state.complete and state.round == int(round_)
    assert [r for _, r in state.participants] == list(range(6))
    announced = store.members(f"rdzv/{run}/announce/{round_}")  # type: ignore[attr-defined]
    assert len(announced) == 6


class _PlainStore(MemoryWithout):
    """A store with only torch's Store methods (no announcement sets), over memory."""

    LACKS = ("add_member", "members", "remove_member", "try_get")


def test_a_store_without_announcement_sets_is_refused_clearly() -> None:
    store = _PlainStore()
    backend = StoreRendezvousBackend(store, "job")
    handler = DynamicRendezvousHandler.from_backend(
        "job",
        store,
        backend,
        1,
        1,
        timeout=RendezvousTimeout(join=timedelta(seconds=5)),
        protocol="scale",
    )
    try:
        with pytest.raises(RendezvousError, match="keeps no announcement sets"):
            handler.next_rendezvous()
    finally:
        handler.shutdown()


def test_the_decoder_remembers_one_state_per_node() -> None:
    from rdzv.handler import LastDecoded
    from spec.codec import CorruptState, ProtocolMismatch, encode
    from spec.state import NodeId, RendezvousState

    one = encode(RendezvousState.build(round=1, participants={NodeId("a", 1, 1): 0}), "scale")
    two = encode(RendezvousState.build(round=2), "scale")
    memo = LastDecoded()
    first = memo(one)
    assert first == decode(one)
    assert memo(bytes(one)) is first  # equal bytes (a fresh copy): no second decode
    assert memo.decoded == 1
    assert memo(two) == decode(two) and memo.decoded == 2
    assert memo(one) == first and memo.decoded == 3  # only the latest state is kept
    for _ in range(2):  # corrupt bytes are never remembered: they raise every time
        with pytest.raises(CorruptState):
            memo(b"{not json")
    assert memo.decoded == 5
    for _ in range(2):  # the protocol is checked every time, remembered bytes or not
        with pytest.raises(ProtocolMismatch, match="protocol 'scale', but this node runs"):
            memo(one, "hardened")
    assert memo(one, "scale") == first and memo.decoded == 5  # ``one`` is still the latest


def test_keep_alives_of_an_unchanged_state_decode_nothing() -> None:
    # After a round, each keep-alive re-reads the state (the cache is 0 s here); the bytes
    # are the same, so the node's decoder does not decode them again.
    url = f"memory://{uuid.uuid4().hex}"
    run = "decode-" + uuid.uuid4().hex[:8]
    params = RendezvousParameters(
        "rdzv", url, run, 1, 1, protocol="scale", join_timeout="60", cache_duration="0"
    )
    handler = create_handler(params)
    try:
        handler.next_rendezvous()
        memo = handler.driver.config.decode
        decoded, reads = memo.decoded, handler.io_stats().reads  # type: ignore[attr-defined]
        stopping = threading.Event()
        for _ in range(3):
            handler._keep_alive(stopping)
        assert handler.io_stats().reads >= reads + 3  # it did read the state each time
        assert memo.decoded == decoded  # type: ignore[attr-defined]
    finally:
        handler.shutdown()


# -- a node whose join deadline passes while it is only announced ------------------------------
def _store_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    tag = uuid.uuid4().hex[:8]
    if kind == "memory":
        return f"memory://{tag}"
    if kind == "sqlite":
        return f"sqlite://{tmp_path / 'rdzv.db'}"
    server: RedisServer | EtcdServer = request.getfixturevalue(f"{kind}_server")
    return f"{server.url}?prefix=withdraw{tag}"


def _scale_handler(store: Store, run: str, clock: Clock | None = None) -> DynamicRendezvousHandler:
    return DynamicRendezvousHandler.from_backend(
        run,
        store,
        StoreRendezvousBackend(store, run),
        2,
        2,
        timeout=RendezvousTimeout(join=timedelta(seconds=60)),
        keep_alive_interval=1000,
        protocol="scale",
        clock=clock,
        cache_duration=0,
    )


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis", "etcd"])
def test_a_node_past_its_join_deadline_takes_its_announcement_back(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Alone in an open round, a node announces itself and waits; its join deadline passes
    (fake clock), so it takes the announcement back and times out. Two nodes that come
    later form the round without it: the first of them does not fill the round with the
    departed node (it would have: its announcement would have returned 2 = max_nodes)."""
    url = _store_url(kind, request, tmp_path)
    with contextlib.ExitStack() as stores:  # every store this test opens is closed
        store = stores.enter_context(opened_store(url))
        run = "w" + uuid.uuid4().hex[:8]
        key = f"rdzv/{run}/announce/0"
        clock = FakeClock()
        gone = _scale_handler(store, run, clock)
        box: list[BaseException | RendezvousInfo] = []

        def call() -> None:
            try:
                box.append(gone.next_rendezvous())
            except BaseException as exc:
                box.append(exc)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        try:
            member = encode_node(gone.node)
            for _ in range(1_000):  # bounded: 10 s of real time at most
                if store.members(key) == [member]:  # type: ignore[attr-defined]
                    break
                thread.join(0.01)
            assert store.members(key) == [member]  # type: ignore[attr-defined]
            clock.advance(60.001)  # past the join deadline, inside the rollback window
            thread.join(JOIN_S)
            assert not thread.is_alive(), "the node did not give up"
        finally:
            # (shutdown() would close the rendezvous for the late nodes too.)
            clock.advance(3600.0)  # on a failure above: past the rollback window as well
            thread.join(JOIN_S)
        (error,) = box
        assert isinstance(error, RendezvousTimeoutError), error
        assert store.members(key) == []  # type: ignore[attr-defined]
        assert gone.io_stats().withdrawals == 1
        late = [_scale_handler(stores.enter_context(opened_store(url)), run) for _ in range(2)]
        infos: list[RendezvousInfo] = []
        try:
            threads = [
                threading.Thread(target=lambda h=h: infos.append(h.next_rendezvous()), daemon=True)
                for h in late
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(JOIN_S)
            # the round as it stands (shutdown() closes the run and leaves it)
            state = decode(store.get(f"rdzv/{run}/state"))
        finally:
            for h in late:
                h.shutdown()
        assert len(infos) == 2 and {i.world_size for i in infos} == {2}
        assert state.complete and gone.node not in state.participant_nodes()
        assert set(state.participant_nodes()) == {h.node for h in late}


@pytest.mark.parametrize(
    ("member", "why"),
    [(b"junk", "JSONDecodeError"), (b"[" * 1024, "nested too deeply")],
)
def test_a_foreign_member_of_the_announcement_set_is_named_with_its_set(
    member: bytes, why: str
) -> None:
    """Another program put bytes that are not a node identity into the round's
    announcement set (the second is deeper than JSON's parser can go): the node that
    folds the set fails with a state error that names the set, not the state key, and
    the store keeps the member for inspection."""
    store = MemoryStore()
    run = "f" + uuid.uuid4().hex[:8]
    key = f"rdzv/{run}/announce/0"
    store.add_member(key, member)
    handler = _scale_handler(store, run)
    try:
        with pytest.raises(RendezvousStateError) as caught:
            handler.next_rendezvous()  # its announcement fills the round: it folds at once
    finally:
        handler.shutdown()
    message = str(caught.value)
    assert why in message
    assert f"round 0's announcement set (store set {key!r})" in message
    assert "take the member out of the set (the store's remove_member)" in message
    assert "delete the key" not in message
    assert store.members(key) == sorted([member, encode_node(handler.node)])
