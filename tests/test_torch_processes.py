"""The plain handler (no torchrun) in real processes, driven as a torch user drives it.

Each agent (``tests/agents.py``) is a process of its own: it builds a handler, calls
``next_rendezvous()`` and, with ``gloo``, runs
``torch.distributed.init_process_group(backend="gloo", store=info.store, ...)`` and
all-reduces a tensor holding ``rank + 1``. Real stores: SQLite, and Redis and etcd
servers started by the test; a torch ``TCPStore`` server started by the test.

Bounds: every wait is on an agent's log with the generous bounds of ``agents.py``; every
agent is stopped (quit, then killed) when its test ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from agents import Agents, agents, answers_agree
from servers import EtcdServer, RedisServer
from torch._C._distributed_c10d import TCPStore

pytestmark = pytest.mark.slow

PUBLISH_DELAY_S = 3.0
"""How late rank 0 publishes its bootstrap info in the late-rank-0 tests: three times the
TCPStore client's timeout (1 s), so that a wait that gives up at the store's first
timeout fails the test."""

HANDLER_CONFIG = {
    "join_timeout": "90",
    # A round of two completes as soon as both joined (max_nodes = 2); the last call only
    # matters if one of them is starved.
    "last_call_timeout": "5",
    "keep_alive_interval": "1",
    "keep_alive_max_attempt": "10",
}


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def store_url(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    start_redis: Callable[..., RedisServer],
    start_etcd: Callable[..., EtcdServer],
) -> str:
    """A private store of each kind (a missing server binary fails the test)."""
    if request.param == "redis":
        return start_redis().url
    if request.param == "etcd":
        return start_etcd().url
    return f"sqlite://{tmp_path / 'rdzv.db'}"


@pytest.fixture
def tcp_store_server() -> Iterator[TCPStore]:
    """A torch TCPStore server on loopback (stopped when the last reference goes)."""
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    yield server
    del server


def _both_return_one_round(group: Agents) -> list[dict[str, Any]]:
    """Wait until agents 0 and 1 returned; check they got one round of two."""
    answers = [group.wait_for(i, "return") for i in (0, 1)]
    assert answers_agree(group) == []
    assert {a["round"] for a in answers} == {answers[0]["round"]}
    assert sorted(a["rank"] for a in answers) == [0, 1]
    assert {a["world_size"] for a in answers} == {2}
    assert len({a["master"] for a in answers}) == 1
    return answers


def _both_all_reduce(group: Agents) -> None:
    """Wait until agents 0 and 1 all-reduced; 1 + 2 = 3 on both."""
    answers = _both_return_one_round(group)
    reduced = [group.wait_for(i, "allreduce") for i in (0, 1)]
    assert [r["sum"] for r in reduced] == [3.0, 3.0]
    assert {r["round"] for r in reduced} == {answers[0]["round"]}
    assert sorted(r["rank"] for r in reduced) == [0, 1]


def test_two_processes_all_reduce_over_info_store(store_url: str, tmp_path: Path) -> None:
    # issue 25: init_process_group(backend="gloo", store=info.store) from the plain
    # handler, on SQLite, Redis and etcd.
    with agents(
        tmp_path / "agents",
        store_url,
        2,
        2,
        handler_config=HANDLER_CONFIG,
        restart_on_waiting=False,
        gloo=True,
    ) as group:
        group.start(0)
        group.start(1)
        _both_all_reduce(group)


def test_members_wait_for_a_late_rank_0_on_a_torch_tcp_store(
    tcp_store_server: TCPStore, tmp_path: Path
) -> None:
    # issue 22, failure 4: with a torch TCPStore (1 s timeout) as the handler's store and
    # the state in SQLite, rank 0 publishes its bootstrap info 3 s late. The member must
    # wait (a store timeout means "not yet", as torch waits), not give up at the store's
    # first timeout with RendezvousConnectionError while rank 0 returns.
    with agents(
        tmp_path / "agents",
        f"sqlite://{tmp_path / 'rdzv.db'}",
        2,
        2,
        handler_config=HANDLER_CONFIG,
        restart_on_waiting=False,
        torch_store=f"127.0.0.1:{tcp_store_server.port}",
        publish_delay_s=PUBLISH_DELAY_S,
    ) as group:
        group.start(0)
        group.start(1)
        _both_return_one_round(group)
        assert not [e for i in (0, 1) for e in group.events(i) if e["ev"] == "error"]


def test_two_processes_all_reduce_over_a_torch_tcp_store_with_a_late_rank_0(
    tcp_store_server: TCPStore, tmp_path: Path
) -> None:
    # issue 25: the torch user's own setup, only create_handler's import changed: a
    # TCPStore as the handler's store, torch's C10dRendezvousBackend over it and torch's
    # RendezvousParameters; rank 0 publishes 3 s late; then gloo over info.store.
    with agents(
        tmp_path / "agents",
        "unused://",
        2,
        2,
        handler_config=HANDLER_CONFIG,
        restart_on_waiting=False,
        torch_store=f"127.0.0.1:{tcp_store_server.port}",
        torch_backend=True,
        publish_delay_s=PUBLISH_DELAY_S,
        gloo=True,
    ) as group:
        group.start(0)
        group.start(1)
        _both_all_reduce(group)
        assert not [e for i in (0, 1) for e in group.events(i) if e["ev"] == "error"]
