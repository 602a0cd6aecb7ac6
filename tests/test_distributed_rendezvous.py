"""Rendezvous through real Redis and etcd servers: many processes, and faults.

- Processes (spawned, reporting through JSON files; the worker and its helpers come from
  ``test_handler_processes``): 8 join and agree on ranks and bootstrap info; one killed
  with SIGKILL between rounds is pruned once its heartbeat expired and the rest re-form;
  a late process waits and joins the next round. One killed with SIGKILL inside
  ``next_rendezvous`` of a round still open (on redis, etcd and sqlite) is pruned once
  its heartbeat expired, and the round completes with newcomers, without it. A member
  of a complete round of four killed while the others train (``hardened`` and ``scale``,
  rank 0 or another) is reported to every survivor by ``num_nodes_waiting()``, and the
  three form the next round.
- Faults (real handlers in threads of this process, each with its own store
  connection; under ``hardened`` and under ``scale``): the server restarts
  mid-rendezvous (with persistence the round completes; without it every node gets a
  clear ``RendezvousConnectionError``); a TCP proxy blackholes the traffic (short: the
  nodes recover; long: they fail with ``RendezvousConnectionError`` within their retry
  budget); garbage in the rendezvous key gives ``RendezvousStateError`` until the key is
  deleted (the documented recovery).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from agents import spawn_without_torch
from servers import EtcdServer, RedisServer, TcpProxy
from test_handler_processes import (
    PROCESS_JOIN,
    ROUND_FILES,
    _check_round,
    _wait_for_file,
    _worker,
)
from test_stores import close_store, opened_store

from rdzv import (
    RendezvousConnectionError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    create_handler,
)
from rdzv.store import Store
from spec.codec import decode, decode_node
from spec.state import EMPTY_STATE, RendezvousState

pytestmark = pytest.mark.slow

PROTOCOLS = ["hardened", "scale"]
"""The protocols the thread tests below run under: ``hardened`` (everything inside the one
state; the default over torch's stores), and ``scale``, the default, whose joins go
through announcement sets and whose heartbeats live under keys of their own."""
NODE_JOIN_S = 60.0
"""Bound on how long the test waits for one node thread to finish."""
MAX_WAIT = timedelta(seconds=1)
"""One slice of the test's own waits for a state change."""
STATE_KEY = "rdzv/job/state"
"""The rendezvous key of the worker processes' run (run id ``job``) in their store."""
PARTITION_S = 0.5
"""How long the short network partition lasts (well inside the nodes' retry budget)."""


class StoreCluster:
    """Worker processes rendezvousing through ``url``; rounds start on ``go<k>`` files."""

    def __init__(self, work: Path, url: str, lo: int, hi: int, **config: str) -> None:
        self.work = work
        self.work.mkdir()
        self.url = url
        self.lo, self.hi = lo, hi
        self.poll_waiting = False
        """Workers started from now on poll ``num_nodes_waiting()`` after each round."""
        self.config = {"join_timeout": "60", "cache_duration": "0", **config}
        self.procs: dict[int, multiprocessing.process.BaseProcess] = {}

    def start(self, indices: list[int], first: int = 0) -> None:
        ctx = multiprocessing.get_context("spawn")
        for i in indices:
            config = json.dumps(self.config)
            args = (self.url, i, str(self.work), self.lo, self.hi, config, first, self.poll_waiting)
            proc = ctx.Process(target=_worker, args=args, daemon=True)
            with spawn_without_torch():  # the workers never meet torch code
                proc.start()
            self.procs[i] = proc  # before the next one starts: stop() sees every one
        for i in indices:
            assert _wait_for_file(self.work / f"ready-{i}", PROCESS_JOIN), f"worker {i} hung"

    def result(self, k: int, i: int) -> dict[str, Any]:
        return self.report(f"result-{k}-{i}", f"worker {i} did not finish its round {k}")

    def report(self, name: str, missing: str) -> dict[str, Any]:
        """The report ``<name>.json`` of a worker; fails with ``missing`` after PROCESS_JOIN."""
        path = self.work / f"{name}.json"
        assert _wait_for_file(path, PROCESS_JOIN), missing
        report: dict[str, Any] = json.loads(path.read_text())
        return report

    def round(self, k: int, members: list[int]) -> list[dict[str, Any]]:
        (self.work / f"go{k}").touch()
        return [self.result(k, i) for i in members]

    def stop(self) -> None:
        try:
            (self.work / "stop").touch()
            for k in range(ROUND_FILES):
                (self.work / f"go{k}").touch()
            for p in self.procs.values():
                p.join(PROCESS_JOIN)
        finally:
            for p in self.procs.values():  # also if a touch or a join raised
                if p.is_alive():
                    p.kill()
                    p.join(PROCESS_JOIN)


@contextmanager
def store_cluster(work: Path, url: str, lo: int, hi: int, **config: str) -> Iterator[StoreCluster]:
    c = StoreCluster(work, url, lo, hi, **config)
    try:
        yield c
    finally:
        c.stop()
    assert all(p.exitcode is not None for p in c.procs.values())


# -- one adapter per server kind -----------------------------------------------------------


@dataclass
class Backend:
    """A private server of one kind and how to disturb it."""

    kind: str
    server: RedisServer | EtcdServer
    started: list[Any] = field(default_factory=list)

    def url(self, port: int | None = None, **params: str) -> str:
        port = self.server.port if port is None else port
        query = "&".join(f"{k}={v}" for k, v in {"prefix": "p", **params}.items())
        if self.kind == "redis":
            return f"redis://127.0.0.1:{port}/0?{query}"
        return f"etcd://127.0.0.1:{port}?{query}"

    def timeout_params(self, seconds: str, retries: str) -> dict[str, str]:
        name = "socket_timeout" if self.kind == "redis" else "request_timeout"
        return {name: seconds, "retries": retries}

    def restart_keeping_data(self) -> None:
        self.server.restart()

    def restart_losing_data(self) -> None:
        if isinstance(self.server, EtcdServer):
            self.server.restart_empty()
        else:
            self.server.restart()


@pytest.fixture(params=["redis", "etcd"])
def backend(
    request: pytest.FixtureRequest,
    start_redis: Callable[..., RedisServer],
    start_etcd: Callable[..., EtcdServer],
) -> Backend:
    if request.param == "redis":
        return Backend("redis", start_redis(persistent=True))
    return Backend("etcd", start_etcd())


@pytest.fixture(params=["redis", "etcd"])
def volatile_backend(
    request: pytest.FixtureRequest,
    start_redis: Callable[..., RedisServer],
    start_etcd: Callable[..., EtcdServer],
) -> Backend:
    """A server whose restart loses the data (redis without persistence; a wiped etcd)."""
    if request.param == "redis":
        return Backend("redis", start_redis(persistent=False))
    return Backend("etcd", start_etcd())


# -- processes -----------------------------------------------------------------------------


def test_processes_join_die_and_join_late(backend: Backend, tmp_path: Path) -> None:
    # Heartbeats every 0.5 s; a node is dead after 6 missed ones (3 s). Shorter expiries
    # prune live but starved processes on a loaded 2-core CI machine (seen with 1 s).
    config = {"keep_alive_interval": "0.5", "keep_alive_max_attempt": "6"}
    url = backend.url()
    with (
        opened_store(url) as store,
        store_cluster(tmp_path / "work", url, 6, 8, last_call_timeout="3", **config) as c,
    ):
        c.start(list(range(8)))
        first = c.round(0, list(range(8)))
        print(json.dumps(first, indent=1))  # shown when the checks below fail
        _check_round(first, 8)
        by_node = sorted(first, key=lambda r: _node_key(r["node"]))
        assert [r["rank"] for r in by_node] == list(range(8))

        victim = c.procs[7]
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(PROCESS_JOIN)
        assert victim.exitcode == -signal.SIGKILL
        # The survivors' next round can open only once the victim is pruned.
        second = c.round(1, list(range(7)))
        _check_round(second, 7)
        assert second[0]["round"] == first[0]["round"] + 1
        state = decode(store.get(STATE_KEY))
        dead = next(r["node"] for r in first if r["node"] not in {s["node"] for s in second})
        assert dead not in {str(n) for n, _ in state.last_heartbeats}

        # A late process arrives while round 1 is complete: it waits, and joins the next
        # round together with the survivors.
        c.start([8], first=2)  # its first round is everyone's round 2
        (c.work / "go2-8").touch()  # it calls next_rendezvous now, the others later
        _wait_for_state(store, lambda s: bool(s.wait_list), "the late process joins the wait list")
        assert not (c.work / "result-2-8.json").exists()  # it waits for the next round
        third = c.round(2, [0, 1, 2, 3, 4, 5, 6, 8])
        print(json.dumps(third, indent=1))  # shown when the checks below fail
        _check_round(third, 8)
        assert {r["round"] for r in third} == {second[0]["round"] + 1}


def _node_key(text: str) -> tuple[str, int, int]:
    addr, pid, local_id = text.rsplit("_", 2)
    return addr, int(pid), int(local_id)


def _wait_for_state(
    store: Store, done: Callable[[RendezvousState], bool], what: str
) -> RendezvousState:
    """The first state in ``store`` for which ``done`` holds; fails after PROCESS_JOIN."""
    end = time.monotonic() + PROCESS_JOIN
    while True:  # bounded by PROCESS_JOIN
        data = store.get(STATE_KEY) if store.check([STATE_KEY]) else None
        if data is not None and done(state := decode(data)):
            return state
        assert time.monotonic() < end, f"timed out waiting until {what}"
        store.wait_for_change(STATE_KEY, data, MAX_WAIT)


def _node_ids(work: Path, indices: Iterable[int]) -> dict[int, str]:
    """Each worker's node id, from its ``ready`` file (complete once it rendezvoused)."""
    return {i: (work / f"ready-{i}").read_text() for i in indices}


def _members(state: RendezvousState) -> set[str]:
    return {str(node) for node, _ in state.participants}


@pytest.fixture(params=["redis", "etcd", "sqlite"])
def store_url(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    start_redis: Callable[..., RedisServer],
    start_etcd: Callable[..., EtcdServer],
) -> str:
    """The URL of a private store of each kind (the sqlite one in a file of the test)."""
    if request.param == "redis":
        return Backend("redis", start_redis()).url()
    if request.param == "etcd":
        return Backend("etcd", start_etcd()).url()
    return f"sqlite://{tmp_path / 'rdzv.db'}"


def test_a_process_killed_inside_an_open_round_is_pruned(store_url: str, tmp_path: Path) -> None:
    # Heartbeats every 0.5 s; dead after 6 missed ones (3 s), as in the test above.
    # hardened only: a node joins an open round as a participant of the state there, and
    # the survivors' keep-alives prune it. Under scale (the default) an open round's
    # nodes are announcements until the fold admits them all at once, so there is no
    # participant to prune before the round completes; a killed waiting node under scale
    # is tested in tests/test_agent_workload.py (failure 5).
    config = {"keep_alive_interval": "0.5", "keep_alive_max_attempt": "6", "protocol": "hardened"}
    with (
        opened_store(store_url) as store,
        store_cluster(tmp_path / "work", store_url, 8, 8, **config) as c,
    ):
        c.start(list(range(7)))
        (c.work / "go0").touch()  # the 7 call next_rendezvous; the round needs 8
        joined = _wait_for_state(store, lambda s: len(s.participants) == 7, "7 joined")
        ids = _node_ids(c.work, range(7))  # written before they called next_rendezvous
        assert _members(joined) == set(ids.values())
        assert not joined.complete

        # The victim is a participant of the open round, blocked in next_rendezvous.
        victim = c.procs[6]
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(PROCESS_JOIN)
        assert victim.exitcode == -signal.SIGKILL
        assert not list(c.work.glob("result-*")), "a round of 8 completed with 7"
        dead = ids.pop(6)
        # Only the survivors' keep-alives can take it out: once its heartbeat expired.
        pruned = _wait_for_state(
            store, lambda s: dead not in _members(s), "the killed process is pruned"
        )
        assert _members(pruned) == set(ids.values())
        assert dead not in {str(n) for n, _ in pruned.last_heartbeats}
        assert (pruned.round, pruned.complete) == (joined.round, False)

        # Two newcomers join the same open round (go0 exists: they start at once).
        c.start([7, 8])
        results = [c.result(0, i) for i in [*ids, 7, 8]]
        ids.update(_node_ids(c.work, [7, 8]))
        print(json.dumps(results, indent=1))  # shown when the checks below fail
        _check_round(results, 8)
        assert {r["node"] for r in results} == set(ids.values())
        assert dead not in {r["node"] for r in results}
        assert {r["round"] for r in results} == {joined.round}
        by_node = sorted(results, key=lambda r: _node_key(r["node"]))
        assert [r["rank"] for r in by_node] == list(range(8))


@pytest.mark.parametrize("victim_rank", [0, 2], ids=["rank0", "rank2"])
@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_survivors_learn_that_a_member_of_their_round_was_killed(
    store_url: str, tmp_path: Path, protocol: str, victim_rank: int
) -> None:
    # Model checker finding 2 with real processes: a member of a complete round is
    # SIGKILLed while the others train (nobody calls next_rendezvous). Each survivor's
    # num_nodes_waiting(), which torch's agent polls, must rise above 0 without help, and
    # the survivors then form the next round without the dead one. Under `scale` rank 0
    # (the first member in sorted order) watches everybody's heartbeat key and the others
    # watch rank 0's, so killing rank 0 and killing another member take different paths.
    # Heartbeats every 0.5 s; dead after 6 missed ones (3 s), as in the tests above.
    config = {"keep_alive_interval": "0.5", "keep_alive_max_attempt": "6", "protocol": protocol}
    with store_cluster(tmp_path / "work", store_url, 3, 4, last_call_timeout="1", **config) as c:
        c.poll_waiting = True
        c.start(list(range(4)))
        first = c.round(0, list(range(4)))
        print(json.dumps(first, indent=1))  # shown when the checks below fail
        _check_round(first, 4)
        assert not list(c.work.glob("waiting-*")), "a member was reported gone while all lived"

        victim = next(i for i, r in enumerate(first) if r["rank"] == victim_rank)
        proc = c.procs[victim]
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(PROCESS_JOIN)
        assert proc.exitcode == -signal.SIGKILL
        survivors = [i for i in range(4) if i != victim]
        for i in survivors:
            noticed = c.report(f"waiting-0-{i}", f"survivor {i} was never told of the death")
            assert noticed["waiting"] >= 1

        second = c.round(1, survivors)
        print(json.dumps(second, indent=1))
        _check_round(second, 3)
        assert first[victim]["node"] not in {r["node"] for r in second}
        assert {r["round"] for r in second} == {first[0]["round"] + 1}


# -- threads -------------------------------------------------------------------------------


class Node:
    """One handler in a thread, calling ``next_rendezvous`` once."""

    def __init__(self, url: str, run_id: str, lo: int, hi: int, **config: str) -> None:
        config.setdefault("join_timeout", "30")
        config.setdefault("cache_duration", "0")
        params = RendezvousParameters("rdzv", url, run_id, lo, hi, **config)
        self.handler = create_handler(params)
        self.info: RendezvousInfo | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.info = self.handler.next_rendezvous()
        except BaseException as exc:
            self.error = exc

    def start(self) -> Node:
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join(NODE_JOIN_S)
        assert not self.thread.is_alive(), "a node hung"

    def close(self) -> None:
        """Stop the heartbeats and close the store ``create_handler`` opened for this node
        (not ``shutdown()``: closing the rendezvous would need the store, which a test may
        have broken). Harmless after a ``shutdown()`` that closed the store already."""
        try:
            self.handler._stop_heartbeats()
        finally:
            close_store(self.handler._store)


@contextmanager
def nodes() -> Iterator[list[Node]]:
    """Yield the list that :func:`start_node` adds nodes to; when the block ends, also by
    an exception, wait for every node's thread (each bounded by NODE_JOIN_S), then close
    every node, each even if closing another one raised."""
    started: list[Node] = []
    try:
        yield started
    finally:
        with ExitStack() as closing:
            for node in started:
                closing.callback(node.close)
            for node in started:
                node.thread.join(NODE_JOIN_S)


def start_node(started: list[Node], url: str, run_id: str, lo: int, hi: int, **config: str) -> Node:
    """A new node, added to ``started`` (so :func:`nodes` closes it) before it starts."""
    node = Node(url, run_id, lo, hi, **config)
    started.append(node)
    return node.start()


def _joined(store: Store, run_id: str) -> int:
    """How many nodes joined the current round: its participants and, under ``scale``,
    the nodes only announced in its announcement set so far."""
    key = f"rdzv/{run_id}/state"
    state = decode(store.get(key)) if store.check([key]) else EMPTY_STATE
    members = store.members(f"rdzv/{run_id}/announce/{state.round}")  # type: ignore[attr-defined]
    return len(set(state.participant_nodes()) | {decode_node(m) for m in members})


def _wait_for_joined(url: str, run_id: str, count: int) -> None:
    end = time.monotonic() + NODE_JOIN_S
    with opened_store(url) as store:
        while _joined(store, run_id) < count:  # bounded by NODE_JOIN_S
            assert time.monotonic() < end, f"{count} nodes did not join in time"
            time.sleep(0.02)


def _ranks(started: list[Node]) -> list[int]:
    for node in started:
        node.join()
        assert node.error is None, node.error
    return sorted(node.info.rank for node in started if node.info is not None)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_restart_with_persistence_completes_the_round(backend: Backend, protocol: str) -> None:
    url, run = backend.url(), f"run{uuid.uuid4().hex[:8]}"
    with nodes() as started:
        for _ in range(2):
            start_node(started, url, run, 3, 3, protocol=protocol)
        _wait_for_joined(url, run, 2)
        backend.restart_keeping_data()  # SIGKILL + start on the same port, data kept
        start_node(started, url, run, 3, 3, protocol=protocol)
        assert _ranks(started) == [0, 1, 2]
        rounds = {n.info.round for n in started if n.info is not None}
        assert len(rounds) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_restart_losing_data_is_a_clear_error(volatile_backend: Backend, protocol: str) -> None:
    url, run = volatile_backend.url(), f"run{uuid.uuid4().hex[:8]}"
    with nodes() as started:
        for _ in range(2):
            start_node(started, url, run, 3, 3, protocol=protocol)
        _wait_for_joined(url, run, 2)
        volatile_backend.restart_losing_data()
        for node in started:
            node.join()  # no hang: every node fails on its own
            assert isinstance(node.error, RendezvousConnectionError), node.error
            assert "lost this store's data" in str(node.error)
            assert "restart the job" in str(node.error)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_short_partition_is_survived(
    backend: Backend, tcp_proxy: Callable[[int], TcpProxy], protocol: str
) -> None:
    # Both sides of the rendezvous talk across the partition, so only the retries can
    # carry them through it (with retries=0 every store fails this test): the waiting
    # nodes beat every 0.1 s (dead only after 50 missed beats, 5 s, far beyond the
    # partition), and the third node is created and joins while the traffic is
    # blackholed. A timer heals the partition after PARTITION_S.
    proxy = tcp_proxy(backend.server.port)
    url = backend.url(proxy.port, **backend.timeout_params("0.3", "8"))
    run = f"run{uuid.uuid4().hex[:8]}"
    beats = {"keep_alive_interval": "0.1", "keep_alive_max_attempt": "50"}
    heal = threading.Timer(PARTITION_S, proxy.resume)
    try:
        with nodes() as started:
            for _ in range(2):
                start_node(started, url, run, 3, 3, protocol=protocol, **beats)
            _wait_for_joined(url, run, 2)
            proxy.blackhole()
            heal.start()
            start_node(started, url, run, 3, 3, protocol=protocol, **beats)
            assert _ranks(started) == [0, 1, 2]
    finally:
        heal.cancel()  # a no-op once it fired; harmless if it never started
        if heal.is_alive():
            heal.join()
        proxy.resume()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_long_partition_fails_with_connection_error(
    backend: Backend, tcp_proxy: Callable[[int], TcpProxy], protocol: str
) -> None:
    proxy = tcp_proxy(backend.server.port)
    url = backend.url(proxy.port, **backend.timeout_params("0.3", "1"))
    run = f"run{uuid.uuid4().hex[:8]}"
    with nodes() as started:
        for _ in range(2):
            start_node(started, url, run, 3, 3, protocol=protocol)
        _wait_for_joined(url, run, 2)
        proxy.blackhole()  # until every node gave up
        for node in started:
            node.join()
            assert isinstance(node.error, RendezvousConnectionError), node.error
            assert f"127.0.0.1:{proxy.port}" in str(node.error)
        proxy.resume()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_garbage_written_while_nodes_wait(backend: Backend, protocol: str) -> None:
    url, run = backend.url(), f"run{uuid.uuid4().hex[:8]}"
    key = f"rdzv/{run}/state"
    with opened_store(url) as store, nodes() as started:
        for _ in range(2):
            start_node(started, url, run, 3, 3, protocol=protocol)  # the round needs 3
        _wait_for_joined(url, run, 2)
        store.set(key, b"{not json")  # e.g. another tool writing under our prefix
        for node in started:
            node.join()  # woken by the change, not by their join deadline (30 s)
            assert isinstance(node.error, RendezvousStateError), node.error
            assert "delete the key" in str(node.error)
        assert store.get(key) == b"{not json"  # left as found, for inspection
        assert store.delete_key(key) is True
        retry = [start_node(started, url, run, 3, 3, protocol=protocol) for _ in range(3)]
        assert _ranks(retry) == [0, 1, 2]


def test_garbage_in_the_rendezvous_key(backend: Backend) -> None:
    url, run = backend.url(), f"run{uuid.uuid4().hex[:8]}"
    key = f"rdzv/{run}/state"
    with opened_store(url) as store, nodes() as started:
        store.set(key, b"\x80\x04garbage that is not a state")
        for _ in range(2):
            start_node(started, url, run, 2, 2)
        for node in started:
            node.join()
            assert isinstance(node.error, RendezvousStateError), node.error
            assert "delete the key" in str(node.error)
        # The documented recovery: delete the key once no node of the run is alive.
        assert store.delete_key(key) is True
        retry = [start_node(started, url, run, 2, 2) for _ in range(2)]
        assert _ranks(retry) == [0, 1]
