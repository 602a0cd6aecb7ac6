"""A new job under the run id of a closed one (issue 26, item 1), on real stores.

torchrun's default ``--rdzv-id`` is ``none`` and a requeued scheduler job keeps its id, so
a job often starts where the one before it closed the run. Under ``hardened`` and
``scale`` the run's nodes leave it at shutdown; a node whose first read finds the run
closed is a newcomer: it reopens the run one epoch up once nobody of the closed job is
listed (they left, or their heartbeats expired), and never while one still is. A node of
the closed job never joins the new one (its epoch is the old one). The model checker's
``jobs_never_mix`` property (``--next-job``) checks the same rows on every interleaving:
tests/test_model_check_reuse.py.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from store_cases import fresh_url

from rdzv import DynamicRendezvousHandler, create_handler
from rdzv.api import RendezvousParameters
from rdzv.errors import RendezvousClosedError

WITHIN_S = 60.0
"""Bound on every join (real time; generous for a loaded 2-core machine)."""

PROTOCOLS = ("hardened", "scale")


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'rdzv.db'}?busy_timeout_ms=30000"
    server: Any = request.getfixturevalue(f"{request.param}_server")
    return fresh_url(server.url)


@pytest.fixture
def handlers() -> Iterator[Callable[..., DynamicRendezvousHandler]]:
    made: list[DynamicRendezvousHandler] = []

    def make(url: str, name: str, protocol: str, **conf: Any) -> DynamicRendezvousHandler:
        params = RendezvousParameters(
            backend="rdzv",
            endpoint=url,
            run_id="same-id",
            min_nodes=2,
            max_nodes=2,
            local_addr=name,
            protocol=protocol,
            last_call_timeout=0.2,
            join_timeout=conf.pop("join_timeout", WITHIN_S),
            **conf,
        )
        handler = create_handler(params)
        made.append(handler)
        return handler

    yield make
    with contextlib.ExitStack() as stops:
        for handler in made:
            stops.callback(handler.shutdown)


def _rendezvous(*nodes: DynamicRendezvousHandler) -> list[Any]:
    """``next_rendezvous`` on every node at once: each one's info or error."""
    out: list[Any] = [None] * len(nodes)

    def run(i: int) -> None:
        try:
            out[i] = nodes[i].next_rendezvous()
        except Exception as exc:  # the test looks at it
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WITHIN_S * 2)
    assert not any(t.is_alive() for t in threads), "a next_rendezvous did not return"
    return out


def _one_round(infos: list[Any]) -> int:
    assert all(not isinstance(i, BaseException) for i in infos), infos
    assert sorted(i.rank for i in infos) == list(range(len(infos)))
    assert {i.world_size for i in infos} == {len(infos)}
    rounds: set[int] = {i.round for i in infos}
    assert len(rounds) == 1
    return rounds.pop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_second_job_starts_where_the_first_closed_the_run(
    store_url: str, handlers: Callable[..., DynamicRendezvousHandler], protocol: str
) -> None:
    first = [handlers(store_url, n, protocol) for n in ("a", "b")]
    round_1 = _one_round(_rendezvous(*first))
    for h in first:
        h.shutdown()
    second = [handlers(store_url, n, protocol) for n in ("c", "d")]
    round_2 = _one_round(_rendezvous(*second))
    assert round_2 > round_1  # a later round: its bootstrap keys are new
    assert not second[0].is_closed()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_new_job_waits_for_a_member_of_the_closed_job_and_names_it(
    store_url: str, handlers: Callable[..., DynamicRendezvousHandler], protocol: str
) -> None:
    a, b = (handlers(store_url, n, protocol) for n in ("a", "b"))
    _one_round(_rendezvous(a, b))
    a.shutdown()  # closes the run; b is still a member, training, heartbeating
    c = handlers(store_url, "c", protocol, join_timeout=2.0)
    with pytest.raises(RendezvousClosedError) as raised:
        c.next_rendezvous()
    message = str(raised.value)
    assert str(b.node) in message and "same-id" in message
    assert "another run id" in message
    assert b.is_closed()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_new_job_reopens_once_a_silent_member_of_the_closed_job_expires(
    store_url: str, handlers: Callable[..., DynamicRendezvousHandler], protocol: str
) -> None:
    fast = {"keep_alive_interval": 0.2, "keep_alive_max_attempt": 2}
    a, b = (handlers(store_url, n, protocol, **fast) for n in ("a", "b"))
    _one_round(_rendezvous(a, b))
    b.abandon_round()  # b stops beating without leaving: killed, as far as the run knows
    a.shutdown()
    c, d = (handlers(store_url, n, protocol, **fast) for n in ("c", "d"))
    _one_round(_rendezvous(c, d))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_node_of_the_closed_job_never_joins_the_new_one(
    store_url: str, handlers: Callable[..., DynamicRendezvousHandler], protocol: str
) -> None:
    # No state cache: b's last call below reads the store, not its view of the close.
    a = handlers(store_url, "a", protocol)
    b = handlers(store_url, "b", protocol, cache_duration=0)
    _one_round(_rendezvous(a, b))
    a.shutdown()
    # b's workers fail after the close: next_rendezvous leaves the run and says closed.
    with pytest.raises(RendezvousClosedError):
        b.next_rendezvous()
    c, d = (handlers(store_url, n, protocol) for n in ("c", "d"))
    _one_round(_rendezvous(c, d))
    # b calls again (say, its agent retries): its job is over, the new one is not its.
    with pytest.raises(RendezvousClosedError, match="reopened"):
        b.next_rendezvous()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_new_job_reopens_beside_a_stray_member_of_the_closed_job(
    store_url: str, handlers: Callable[..., DynamicRendezvousHandler], protocol: str
) -> None:
    # The model checker's run at N = 4 (docs/findings.md, "Re-run on 2026-12-07"), on a
    # real store: b returned round r, a's workers failed, and a formed the next round
    # with c while b's agent did not poll. b is alive (its keep-alive thread runs) but
    # listed nowhere: its round ended and the next one filled without it.
    a, b = (handlers(store_url, n, protocol, cache_duration=0) for n in ("a", "b"))
    (stray_round,) = {i.round for i in _rendezvous(a, b)}
    c = handlers(store_url, "c", protocol, cache_duration=0)
    later = _one_round(_rendezvous(a, c))
    assert later > stray_round
    c.shutdown()  # the job ends: c closes the run and leaves it; a leaves at shutdown
    a.shutdown()
    # A new job under the same run id reopens the run although b still beats: nobody of
    # the closed job is listed, and its rounds are later ones, with new bootstrap keys.
    d, e = (handlers(store_url, n, protocol) for n in ("d", "e"))
    new_round = _one_round(_rendezvous(d, e))
    assert new_round > later
    # b's agent polls: its job is closed (the run is open, but for the new job), and b is
    # told to re-rendezvous (it counts itself: it is listed nowhere); its next call fails
    # closed: it never joins the new job. The new job's nodes see their run open.
    assert b.is_closed()
    assert b.num_nodes_waiting() > 0
    with pytest.raises(RendezvousClosedError):
        b.next_rendezvous()
    assert not d.is_closed() and d.num_nodes_waiting() == 0
