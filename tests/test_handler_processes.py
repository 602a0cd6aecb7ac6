"""Separate processes (multiprocessing, spawn) rendezvousing through ``sqlite://``.

Workers report through JSON files (no pickled state). A worker runs rounds on command:
the test creates ``go<k>`` to start round ``k`` and ``stop`` to end. One test kills a
worker with SIGKILL and checks that the others re-form once its heartbeat expired.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from agents import spawn_without_torch

if TYPE_CHECKING:
    from rdzv import DynamicRendezvousHandler

PROCESS_JOIN = 60.0
"""Real seconds the test waits for a worker to report or exit."""
WORKER_POLL = 0.01
"""Real seconds between a worker's looks for its next command file."""

WORKER_POLL_WAITING = 0.1
"""Real seconds between a worker's ``num_nodes_waiting()`` calls after a round."""

ROUND_FILES = 20
"""``stop`` touches ``go0`` .. ``go19``: past the last round any worker can reach."""

pytestmark = pytest.mark.slow


def _wait_for_any(paths: tuple[Path, ...], within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:  # bounded by ``within``
        if any(path.exists() for path in paths):
            return True
        time.sleep(WORKER_POLL)
    return any(path.exists() for path in paths)


def _wait_for_file(path: Path, within: float) -> bool:
    return _wait_for_any((path,), within)


def _worker(
    url: str,
    index: int,
    work: str,
    min_nodes: int,
    max_nodes: int,
    config: str,
    first: int = 0,
    poll_waiting: bool = False,
) -> None:
    """Run rounds ``first``, ``first + 1``, ... on command: round ``k`` starts on the file
    ``go<k>`` (everyone) or ``go<k>-<index>`` (this worker alone). A worker started late
    passes the round it first takes part in, so the ``go`` files of earlier rounds (which
    stay on disk) do not make it re-rendezvous at once. With ``poll_waiting`` a worker
    that joined round ``k`` then polls ``num_nodes_waiting()`` as torch's agent does, and
    writes ``waiting-<k>-<index>.json`` once it is above 0 (see :func:`_poll_waiting`)."""
    from rdzv import RendezvousError, RendezvousParameters, create_handler

    folder = Path(work)
    params = RendezvousParameters("rdzv", url, "job", min_nodes, max_nodes, **json.loads(config))
    handler = create_handler(params)
    (folder / f"ready-{index}").write_text(str(handler.node))
    for k in range(first, first + 10):  # bounded: at most 10 rounds per worker
        commands = (folder / f"go{k}", folder / f"go{k}-{index}")  # everyone's, or its own
        if not _wait_for_any(commands, PROCESS_JOIN) or (folder / "stop").exists():
            break
        try:
            info = handler.next_rendezvous()
            report: dict[str, Any] = {
                "node": str(handler.node),
                "rank": info.rank,
                "world_size": info.world_size,
                "round": info.round,
                "addr": info.bootstrap_store_info.master_addr,
                "port": info.bootstrap_store_info.master_port,
            }
        except RendezvousError as exc:
            report = {"node": str(handler.node), "error": f"{type(exc).__name__}: {exc}"}
        _write_report(folder, f"result-{k}-{index}", report)
        if poll_waiting and "error" not in report:
            _poll_waiting(handler, folder, k, index)
    handler.shutdown()


def _write_report(folder: Path, name: str, report: dict[str, Any]) -> None:
    """Write ``<name>.json`` whole (a reader never sees half a file)."""
    tmp = folder / f"{name}.tmp"
    tmp.write_text(json.dumps(report))
    tmp.rename(folder / f"{name}.json")


def _poll_waiting(handler: DynamicRendezvousHandler, folder: Path, k: int, index: int) -> None:
    """Poll ``num_nodes_waiting()`` every WORKER_POLL_WAITING s, as torch's agent does
    between its health checks, until it is above 0 (write ``waiting-<k>-<index>.json``
    with the count) or the next command comes; bounded by PROCESS_JOIN."""
    commands = (folder / f"go{k + 1}", folder / f"go{k + 1}-{index}", folder / "stop")
    end = time.monotonic() + PROCESS_JOIN
    while time.monotonic() < end and not any(path.exists() for path in commands):
        waiting = handler.num_nodes_waiting()
        if waiting > 0:
            report = {"node": str(handler.node), "waiting": waiting}
            _write_report(folder, f"waiting-{k}-{index}", report)
            return
        time.sleep(WORKER_POLL_WAITING)


class Cluster:
    def __init__(
        self,
        tmp_path: Path,
        n: int,
        min_nodes: int,
        max_nodes: int,
        *,
        own: Sequence[Mapping[str, str]] = (),
        **config: str,
    ):
        """``n`` workers with ``config``; worker ``i`` also with ``own[i]``, if given."""
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.url = f"sqlite://{tmp_path / 'rdzv.db'}"
        ctx = multiprocessing.get_context("spawn")
        config.setdefault("join_timeout", "60")
        config.setdefault("cache_duration", "0")
        configs = [{**config, **(own[i] if i < len(own) else {})} for i in range(n)]
        self.procs = [
            ctx.Process(
                target=_worker,
                args=(self.url, i, str(self.work), min_nodes, max_nodes, json.dumps(configs[i])),
                daemon=True,
            )
            for i in range(n)
        ]

    def start(self) -> None:
        for p in self.procs:  # if one fails to start, stop() skips it and the rest
            with spawn_without_torch():  # the workers never meet torch code
                p.start()
        for i in range(len(self.procs)):
            assert _wait_for_file(self.work / f"ready-{i}", PROCESS_JOIN), f"worker {i} hung"

    def round(self, k: int, members: list[int]) -> list[dict[str, Any]]:
        (self.work / f"go{k}").touch()
        results = []
        for i in members:
            path = self.work / f"result-{k}-{i}.json"
            assert _wait_for_file(path, PROCESS_JOIN), f"worker {i} did not finish round {k}"
            results.append(json.loads(path.read_text()))
        return results

    def alone(self, k: int, i: int) -> dict[str, Any]:
        """Worker ``i`` alone runs round ``k`` (its own ``go`` file); its report."""
        (self.work / f"go{k}-{i}").touch()
        path = self.work / f"result-{k}-{i}.json"
        assert _wait_for_file(path, PROCESS_JOIN), f"worker {i} did not finish round {k}"
        report: dict[str, Any] = json.loads(path.read_text())
        return report

    def stop(self) -> None:
        started = [p for p in self.procs if p.pid is not None]  # start() may have failed
        try:
            (self.work / "stop").touch()
            for k in range(ROUND_FILES):
                (self.work / f"go{k}").touch()
            for p in started:
                p.join(PROCESS_JOIN)
        finally:
            for p in started:  # also if a touch or a join raised
                if p.is_alive():
                    p.kill()
                    p.join(PROCESS_JOIN)


@contextmanager
def cluster(
    tmp_path: Path,
    n: int,
    lo: int,
    hi: int,
    *,
    own: Sequence[Mapping[str, str]] = (),
    **config: str,
) -> Iterator[Cluster]:
    c = Cluster(tmp_path, n, lo, hi, own=own, **config)
    try:
        c.start()
        yield c
    finally:
        c.stop()
    assert all(p.exitcode is not None for p in c.procs if p.pid is not None)


def _check_round(results: list[dict[str, Any]], size: int) -> None:
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors
    assert sorted(r["rank"] for r in results) == list(range(size))
    assert {r["world_size"] for r in results} == {size}
    assert len({r["round"] for r in results}) == 1
    assert len({(r["addr"], r["port"]) for r in results}) == 1


@pytest.mark.parametrize("n", [2, 8, 16])
def test_processes_rendezvous_through_sqlite(tmp_path: Path, n: int) -> None:
    with cluster(tmp_path, n, n, n) as c:
        first = c.round(0, list(range(n)))
        _check_round(first, n)
        second = c.round(1, list(range(n)))
        _check_round(second, n)
        assert second[0]["round"] == first[0]["round"] + 1
        # Ranks follow the sorted node ids, the same in every process.
        by_node = sorted(first, key=lambda r: tuple(_node_key(r["node"])))
        assert [r["rank"] for r in by_node] == list(range(n))


def _node_key(text: str) -> tuple[str, int, int]:
    addr, pid, local_id = text.rsplit("_", 2)
    return addr, int(pid), int(local_id)


def test_a_killed_node_is_pruned_and_the_others_re_form(tmp_path: Path) -> None:
    # Heartbeats every 0.5 s; a node is dead after 6 missed ones (3 s). Shorter expiries
    # prune live but starved processes on a loaded 2-core CI machine (seen with 1 s). The
    # last call (3 s) is how late a starved worker may join round 0 and still be counted;
    # round 1 (two survivors, min 2 < max 3) waits it out once.
    config = {"keep_alive_interval": "0.5", "keep_alive_max_attempt": "6", "last_call_timeout": "3"}
    with cluster(tmp_path, 3, 2, 3, own=[config] * 3) as c:
        first = c.round(0, [0, 1, 2])
        _check_round(first, 3)
        victim = c.procs[2]
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(PROCESS_JOIN)
        assert victim.exitcode == -signal.SIGKILL
        # The survivors start the next round; it can only open once the victim, still a
        # participant of round 0, is pruned for its expired heartbeat.
        second = c.round(1, [0, 1])
        _check_round(second, 2)
        assert second[0]["round"] == first[0]["round"] + 1
        dead = next(r["node"] for r in first if r["node"] not in {s["node"] for s in second})
        from test_stores import opened_store

        from spec.codec import decode

        with opened_store(c.url) as store:
            state = decode(store.get("rdzv/job/state"))
        assert dead not in {str(n) for n, _ in state.last_heartbeats}


@pytest.mark.parametrize(
    ("first", "second"), [("hardened", "scale"), ("scale", "hardened"), ("hardened", "upstream")]
)
def test_a_node_of_another_protocol_fails_at_once_naming_both(
    tmp_path: Path, first: str, second: str
) -> None:
    # Issue 26, item 3: `hardened` beside `scale` hung until the join timeout, beside
    # `upstream` it completed rounds silently. The state names the protocol that wrote
    # it; a node of another one fails its first read (a state error, not the timeout).
    own = [{"protocol": first}, {"protocol": second}]
    with cluster(tmp_path, 2, 1, 1, own=own) as c:
        joined = c.alone(0, 0)
        assert joined.get("world_size") == 1, joined
        refused = c.alone(0, 1)
    error = refused.get("error", "")
    assert error.startswith("RendezvousStateError: "), refused
    assert f"written by a node of protocol {first!r}" in error
    assert f"this node runs protocol {second!r}" in error
    assert "every node of a run must use the same protocol" in error
    assert "--rdzv-conf protocol=NAME" in error
