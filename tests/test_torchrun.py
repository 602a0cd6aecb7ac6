"""The torchrun plug-in: the entry point, the adapter, and real torchrun runs.

The first part drives the adapter in one process (threads; ``memory://`` for a job of
one agent, SQLite for several: the plug-in refuses a memory store for more, since
torchrun's agents could not share it). The second starts real ``torchrun`` agents
(``python -m torch.distributed.run``, CPU, gloo, loopback) that load the ``rdzv`` backend
through the installed ``torchrun.handlers`` entry point, so the package must be installed
with it (``pip install -e '.[torch]'``).

Bounds: every wait of a torchrun test is bounded by :data:`RUN_WITHIN_S` (agents) or
:data:`STEP_WITHIN_S` (one expected event); every process a test starts (agents, and the
worker processes they start in sessions of their own) is SIGKILLed when the test ends,
whatever its outcome.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, cast

import pytest
import torch.distributed as dist
from test_stores import opened_store
from torch._C._distributed_c10d import Store as TorchBaseStore
from torch._C._distributed_c10d import TCPStore
from torch.distributed.elastic.rendezvous import api as torch_api
from torch.distributed.elastic.utils import store as torch_store_util

from rdzv.backend import StoreRendezvousBackend
from rdzv.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    StoreTimeoutError,
)
from rdzv.stores import MemoryStore, drop_memory_store, memory_store_names
from rdzv.torch_plugin import (
    BACKEND_NAME,
    CONFIG_KEYS,
    RedundantNodeExit,
    TorchStore,
    create_torchrun_handler,
    rdzv_parameters,
    setup_torchrun_logging,
    torch_error,
    torchrun_handler_creator,
)
from spec.codec import decode

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "torchrun_scripts"

RUN_WITHIN_S = 150.0
"""Bound on one torchrun agent's whole life in a test."""
STEP_WITHIN_S = 90.0
"""Bound on waiting for one expected event (a world size showing up, a node waiting)."""
POLL_S = 0.1
"""Between two looks at the workers' progress files or the rendezvous state."""
KILL_WITHIN_S = 10.0
"""Bound on a SIGKILLed process being reaped."""
IN_PROCESS_WITHIN_S = 30.0
"""Bound on a thread of the in-process tests."""

FAST_CONF = {
    # Fast failure detection: a silent node is pruned after 0.5 s x 6 (3 s). Shorter
    # expiries prune live but starved agents on a loaded 2-core CI machine (and a spurious
    # prune changes the restart counts the tests assert).
    "keep_alive_interval": "0.5",
    "keep_alive_max_attempt": "6",
    # A round with at least min_nodes completes 3 s after the last join: a starved agent
    # that joins up to 3 s after the others is still in their round.
    "last_call_timeout": "3",
    # torchrun's timeout (the join timeout here): bounds every rendezvous of a test.
    "timeout": "120",
}


def _torch_params(endpoint: str, run_id: str, min_nodes: int, max_nodes: int, **conf: Any) -> Any:
    return torch_api.RendezvousParameters(
        backend=BACKEND_NAME,
        endpoint=endpoint,
        run_id=run_id,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        local_addr="127.0.0.1",
        **conf,
    )


@pytest.fixture
def memory_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A memory store: the plug-in takes it for a job of one agent only."""
    name = f"torchrun-{request.node.name}"
    yield f"memory://{name}"
    drop_memory_store(name)


@pytest.fixture
def sqlite_file(tmp_path: Path) -> str:
    """A shared store for in-process jobs of several agents (threads)."""
    return f"sqlite://{tmp_path / 'rdzv.db'}"


# -- the entry point -------------------------------------------------------------------------


def _installed_entry_point() -> Any:
    found = [ep for ep in entry_points(group="torchrun.handlers") if ep.name == BACKEND_NAME]
    assert found, (
        "no 'rdzv' entry point in the 'torchrun.handlers' group: install the package with "
        "its entry points (python3 -m pip install -e '.[torch]')"
    )
    return found[0]


def test_entry_point_is_installed_and_returns_the_creator() -> None:
    ep = _installed_entry_point()
    assert ep.value == "rdzv.torch_plugin:torchrun_handler_creator"
    creator = ep.load()()
    assert creator is create_torchrun_handler
    assert torchrun_handler_creator() is create_torchrun_handler


def test_torch_registry_builds_a_torch_handler_named_rdzv(memory_url: str) -> None:
    # What torchrun does: register the creator, then build the handler from parameters.
    registry = torch_api.RendezvousHandlerRegistry()
    registry.register(BACKEND_NAME, cast(Any, torchrun_handler_creator()))
    handler = registry.create_handler(_torch_params(memory_url, "job", 1, 1, timeout=900))
    try:
        assert isinstance(handler, torch_api.RendezvousHandler)
        assert handler.get_backend() == "rdzv"
        assert handler.get_run_id() == "job"
        assert handler.use_agent_store is True
    finally:
        handler.shutdown()


def test_importing_the_plugin_imports_torch_only_when_rdzv_works_with_torch() -> None:
    # torch is installed here: rdzv works with it unless RDZV_TORCH=0 (see rdzv._torch);
    # tests/test_torch_compat.py covers a Python without torch.
    code = "import sys, rdzv, rdzv.torch_plugin; print('torch' in sys.modules)"
    for setting, imported in (("", "True"), ("0", "False")):
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
            env={**os.environ, "RDZV_TORCH": setting},
        )
        assert out.stdout.strip() == imported, (setting, out.stderr[-2000:])


# -- parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "join"),
    [
        ({"timeout": 900}, 900.0),
        ({"timeout": "12.5"}, 12.5),
        ({"timeout": 900, "join_timeout": "30"}, 30.0),
    ],
)
def test_torchruns_timeout_is_the_join_timeout_unless_join_timeout_is_given(
    config: dict[str, Any], join: float, memory_url: str
) -> None:
    # The plug-in passes torchrun's ``timeout`` on untouched: the handler reads it.
    ours, _ = rdzv_parameters(_torch_params("memory://x", "job", 1, 1, **config))
    assert ours.config == config
    handler = create_torchrun_handler(_torch_params(memory_url, "job", 1, 1, **config))
    try:
        assert handler.handler.settings.timeout.join == timedelta(seconds=join)
    finally:
        handler.shutdown()


def test_the_join_timeout_reaches_the_handler(memory_url: str) -> None:
    handler = create_torchrun_handler(
        _torch_params(memory_url, "job", 1, 1, timeout="42", keep_alive_interval="0.25")
    )
    try:
        settings = handler.handler.settings
        assert settings.timeout.join == timedelta(seconds=42)
        assert settings.keep_alive_interval == timedelta(seconds=0.25)
    finally:
        handler.shutdown()


def test_plugin_options_parse_strings() -> None:
    _, options = rdzv_parameters(_torch_params("memory://x", "job", 1, 1))
    assert options.use_agent_store and options.exit_when_redundant
    _, options = rdzv_parameters(
        _torch_params("memory://x", "job", 1, 1, use_agent_store="false", exit_when_redundant="no")
    )
    assert not options.use_agent_store and not options.exit_when_redundant


def test_torchs_switch_turns_the_agent_store_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    _, options = rdzv_parameters(_torch_params("memory://x", "job", 1, 1))
    assert not options.use_agent_store


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ({"timeout": "soon"}, "'timeout' is 'soon' (str), which is not a finite number"),
        ({"timeout": "0"}, "'timeout' is '0', which is not a positive number of seconds"),
        ({"use_agent_store": "maybe"}, "'use_agent_store' is 'maybe' (str), which is not a"),
        ({"exit_when_redundant": "2"}, "'exit_when_redundant' is '2' (str), which is not a"),
        ({"is_host": "1"}, "key(s) ['is_host'] are not options of the 'rdzv' rendezvous"),
        ({"keep_alive_interval": "x"}, "'keep_alive_interval' is 'x' (str), which is not a"),
        ({"keep_alive_max_attempt": "1.5"}, "'keep_alive_max_attempt' is '1.5' (str), which"),
    ],
)
def test_bad_conf_values_are_clear_errors(conf: dict[str, str], expected: str) -> None:
    with pytest.raises(ValueError) as raised:
        create_torchrun_handler(_torch_params("memory://bad-conf", "job", 1, 1, **conf))
    # Where torch refuses the same value, the message is torch's and ours is the note.
    assert expected in "\n".join([str(raised.value), *getattr(raised.value, "__notes__", [])])
    drop_memory_store("bad-conf")


def test_every_config_key_is_listed_in_the_unknown_key_error() -> None:
    with pytest.raises(ValueError) as raised:
        rdzv_parameters(_torch_params("memory://x", "job", 1, 1, read_timeout="60"))
    for key in CONFIG_KEYS:
        assert repr(key) in str(raised.value)


MEMORY_REFUSAL = (
    "is a memory:// store, which lives inside one process, but this job allows {n} agents"
)


@pytest.mark.parametrize(("min_nodes", "max_nodes"), [(1, 2), (2, 2), (1, 1024)])
def test_a_memory_store_is_refused_for_a_job_of_several_agents(
    min_nodes: int, max_nodes: int
) -> None:
    # Issue 26, item 6: under torchrun each agent is a process; a memory store is not
    # shared between processes, so the agents would each wait alone until the timeout.
    for build in (rdzv_parameters, create_torchrun_handler):
        with pytest.raises(ValueError) as raised:
            build(_torch_params("memory://job", "job", min_nodes, max_nodes))
        message = str(raised.value)
        assert MEMORY_REFUSAL.format(n=max_nodes) in message
        for shared in ("sqlite://", "redis://", "etcd://", "--nnodes=1"):
            assert shared in message
    assert "job" not in memory_store_names()  # refused before any store was opened


def test_a_memory_store_serves_a_job_of_one_agent(memory_url: str) -> None:
    handler = create_torchrun_handler(_torch_params(memory_url, "job", 1, 1, timeout="30"))
    try:
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
    finally:
        handler.shutdown()


@pytest.fixture
def rdzv_logger() -> Iterator[logging.Logger]:
    """The "rdzv" logger, its level, handlers and propagation restored afterwards."""
    log = logging.getLogger("rdzv")
    saved = (log.level, list(log.handlers), log.propagate)
    try:
        yield log
    finally:
        log.setLevel(saved[0])
        log.handlers[:] = saved[1]
        log.propagate = saved[2]


@pytest.mark.parametrize(
    ("value", "level"),
    [("INFO", logging.INFO), ("debug", logging.DEBUG), (None, logging.WARNING), ("loud", 30)],
)
def test_the_plugin_logs_at_torchs_loglevel(
    rdzv_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch, value: str | None, level: int
) -> None:
    # As torch's elastic modules do: the level from LOGLEVEL, WARNING by default.
    if value is None:
        monkeypatch.delenv("LOGLEVEL", raising=False)
    else:
        monkeypatch.setenv("LOGLEVEL", value)
    rdzv_logger.propagate = False  # as if nothing handled the records: stderr is added
    rdzv_logger.handlers[:] = []
    setup_torchrun_logging()
    setup_torchrun_logging()  # again: no second handler
    assert rdzv_logger.level == level
    (handler,) = rdzv_logger.handlers
    assert isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr


def test_the_plugin_adds_no_handler_when_logging_is_configured(
    rdzv_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGLEVEL", "INFO")
    mine = logging.NullHandler()
    rdzv_logger.handlers[:] = [mine]
    setup_torchrun_logging()
    assert rdzv_logger.handlers == [mine] and rdzv_logger.level == logging.INFO


def test_an_empty_endpoint_names_the_store_urls() -> None:
    # torchrun's default --rdzv-endpoint is the empty string.
    with pytest.raises(ValueError, match=r"--rdzv-endpoint=sqlite:///tmp/job\.db"):
        rdzv_parameters(_torch_params("", "job", 1, 2))


# -- errors and the store --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "name"),
    [
        (RendezvousClosedError("closed"), "RendezvousClosedError"),
        (RendezvousGracefulExitError("redundant"), "RendezvousGracefulExitError"),
        (StoreTimeoutError("slow"), "RendezvousTimeoutError"),
        (RendezvousConnectionError("gone"), "RendezvousConnectionError"),
        (RendezvousStateError("garbage"), "RendezvousStateError"),
        (RendezvousError("other"), "RendezvousError"),
    ],
)
def test_our_errors_leave_as_torchs_of_the_same_name(error: RendezvousError, name: str) -> None:
    # rdzv's errors are torch's already (torch is installed): they leave unchanged.
    translated = torch_error(error)
    assert isinstance(translated, getattr(torch_api, name))
    assert translated is error


def test_store_timeouts_are_torchs_dist_store_error() -> None:
    store = TorchStore(MemoryStore(timeout=timedelta(seconds=5)))
    with pytest.raises(dist.DistStoreError, match="missing"):
        store.wait(["missing"], timedelta(milliseconds=10))
    store.set_timeout(timedelta(milliseconds=10))
    assert store.timeout == timedelta(milliseconds=10)
    with pytest.raises(dist.DistStoreError):
        store.get("missing")


@contextlib.contextmanager
def _joined_threads() -> Iterator[Callable[..., threading.Thread]]:
    """Yield ``start(target, *args)``, which starts a daemon thread. When the block ends,
    also by an exception, every thread started is joined, all within one bound of
    IN_PROCESS_WITHIN_S (each thread's own waits end within it)."""
    threads: list[threading.Thread] = []

    def start(target: Callable[..., object], *args: object) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        threads.append(thread)  # before the next one starts
        return thread

    try:
        yield start
    finally:
        deadline = time.monotonic() + IN_PROCESS_WITHIN_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def test_torchs_store_utilities_run_on_the_store() -> None:
    # The agent's exit barrier and data exchange, as torch runs them, on two threads.
    store = TorchStore(MemoryStore(timeout=timedelta(seconds=IN_PROCESS_WITHIN_S)))
    results: dict[int, list[bytes]] = {}

    def agent(rank: int) -> None:
        results[rank] = torch_store_util.synchronize(
            store, f"data{rank}".encode(), rank, 2, "sync/", timeout=IN_PROCESS_WITHIN_S
        )
        torch_store_util.barrier(store, 2, "exit/", barrier_timeout=IN_PROCESS_WITHIN_S)

    with _joined_threads() as start:
        threads = [start(agent, rank) for rank in (0, 1)]
        for thread in threads:
            thread.join(IN_PROCESS_WITHIN_S)
        assert not any(thread.is_alive() for thread in threads)
    assert results == {0: [b"data0", b"data1"], 1: [b"data0", b"data1"]}
    assert store.timeout == timedelta(seconds=IN_PROCESS_WITHIN_S)  # restored


# -- in-process rendezvous through the adapter -------------------------------------------------


def _in_threads(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run each call on a thread of its own; their results (or exceptions), in order."""
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except BaseException as exc:
            results[index] = exc

    with _joined_threads() as start:
        threads = [start(run, i) for i in range(len(calls))]
        for thread in threads:
            thread.join(IN_PROCESS_WITHIN_S)
        assert not any(thread.is_alive() for thread in threads), "a rendezvous thread hung"
    return results


def test_every_member_gets_rank_0s_agent_store_fresh_each_round(sqlite_file: str) -> None:
    params = _torch_params(sqlite_file, "job", 2, 2, timeout=IN_PROCESS_WITHIN_S)
    handlers = [create_torchrun_handler(params) for _ in range(2)]
    try:
        for round_ in range(2):
            infos = _in_threads([h.next_rendezvous for h in handlers])
            for info in infos:
                assert isinstance(info, torch_api.RendezvousInfo), info
                assert isinstance(info.bootstrap_store_info, torch_api.RendezvousStoreInfo)
                assert isinstance(info.store, TorchBaseStore)
            assert sorted(info.rank for info in infos) == [0, 1]
            assert {info.world_size for info in infos} == {2}
            addresses = {
                (i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port)
                for i in infos
            }
            assert len(addresses) == 1
            ((addr, port),) = addresses
            host = next(h for h, i in zip(handlers, infos, strict=True) if i.rank == 0)
            other = next(h for h in handlers if h is not host)
            assert (addr, host.agent_store_port, other.agent_store_port) == (
                "127.0.0.1",
                port,
                None,
            )
            # The agent store serves the workers (TCPStore clients) of this round only.
            client = TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=10))
            assert not client.check(["from-round-0"])
            client.set(f"from-round-{round_}", "x")
            # The agents' store is a fresh namespace each round too.
            assert not any(i.store.check(["agent-key"]) for i in infos)
            infos[0].store.set("agent-key", b"x")
            assert all(i.store.check(["agent-key"]) for i in infos)
            del client
    finally:
        for handler in handlers:
            handler.shutdown()


def _stored_round(url: str) -> int:
    """The round of run "job" in the store at ``url``."""
    with opened_store(url) as store:
        current = StoreRendezvousBackend(store, "job").get_state()
    assert current is not None
    return decode(current[0]).round


def test_every_round_of_one_call_shares_the_calls_deadline(
    memory_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Round 0 "ends" before its agent store appears: the node joins round 1 with the
    # deadline of the agent's call, not a fresh join timeout.
    handler = create_torchrun_handler(_torch_params(memory_url, "job", 1, 1, timeout="42"))
    deadlines: list[float | None] = []
    until = handler.handler.next_rendezvous_until

    def recording(deadline: float | None) -> Any:
        deadlines.append(deadline)
        return until(deadline)

    share = handler._share_agent_store
    ended = iter([True])

    def first_round_ends(*args: Any) -> int | None:
        return None if next(ended, False) else share(*args)

    monkeypatch.setattr(handler.handler, "next_rendezvous_until", recording)
    monkeypatch.setattr(handler, "_share_agent_store", first_round_ends)
    try:
        start = handler.handler.clock.monotonic()
        info = handler.next_rendezvous()
        assert info.rank == 0 and _stored_round(memory_url) == 1
        assert len(deadlines) == 2 and deadlines[0] == deadlines[1]
        assert deadlines[0] is not None and start + 42 <= deadlines[0] <= start + 42 + 60
    finally:
        handler.shutdown()


def test_a_node_whose_agent_store_fails_stops_its_heartbeats(
    memory_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The call fails after the node joined a round: the node must not go on beating as a
    # member of a round it will not work in (its peers would wait for it).
    handler = create_torchrun_handler(_torch_params(memory_url, "job", 1, 1, timeout="42"))

    def fails(*args: Any) -> int | None:
        raise OSError("Address already in use")

    monkeypatch.setattr(handler, "_share_agent_store", fails)
    try:
        with pytest.raises(OSError, match="Address already in use"):
            handler.next_rendezvous()
        assert _stored_round(memory_url) == 0  # it had joined round 0
        assert handler.handler.heartbeat_thread is None
        monkeypatch.undo()  # the port is free again: the next call works
        info = handler.next_rendezvous()
        assert info.rank == 0 and _stored_round(memory_url) == 1
        assert handler.handler.heartbeat_thread is not None
    finally:
        handler.shutdown()


def test_without_the_agent_store_rank_0_publishes_a_free_port(sqlite_file: str) -> None:
    params = _torch_params(sqlite_file, "job", 2, 2, timeout=IN_PROCESS_WITHIN_S)
    params.config["use_agent_store"] = "0"
    handlers = [create_torchrun_handler(params) for _ in range(2)]
    try:
        infos = _in_threads([h.next_rendezvous for h in handlers])
        assert not any(h.use_agent_store for h in handlers)
        assert all(h.agent_store_port is None for h in handlers)
        assert len({i.bootstrap_store_info.master_port for i in infos}) == 1
    finally:
        for handler in handlers:
            handler.shutdown()


@pytest.mark.parametrize("exit_when_redundant", [True, False])
def test_a_redundant_node_exits_when_the_job_closes(
    memory_url: str, exit_when_redundant: bool
) -> None:
    params = _torch_params(memory_url, "job", 1, 1, timeout=IN_PROCESS_WITHIN_S)
    params.config["exit_when_redundant"] = str(exit_when_redundant)
    member, surplus = (create_torchrun_handler(params) for _ in range(2))
    # On every path: the member shuts down (which ends the surplus node's wait), then the
    # thread is joined, then the surplus node shuts down (it waits for that thread's lock).
    with contextlib.ExitStack() as stack:
        stack.callback(surplus.shutdown)
        start = stack.enter_context(_joined_threads())
        stack.callback(member.shutdown)
        info = member.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        outcome: list[BaseException] = []

        def join() -> None:
            try:
                surplus.next_rendezvous()
            except BaseException as exc:
                outcome.append(exc)

        thread = start(join)
        store = stack.enter_context(opened_store(memory_url))
        backend = StoreRendezvousBackend(store, "job")
        _wait_until(lambda: _redundant_count(backend) == 1, IN_PROCESS_WITHIN_S, "the surplus node")
        member.shutdown()  # the job ends: the rendezvous is closed
        thread.join(IN_PROCESS_WITHIN_S)
        assert not thread.is_alive()
        (error,) = outcome
        if exit_when_redundant:
            assert isinstance(error, RedundantNodeExit) and error.code == 0
            assert "redundant" in str(error)
        else:
            assert isinstance(error, torch_api.RendezvousGracefulExitError)


def test_a_closed_rendezvous_raises_torchs_closed_error(memory_url: str) -> None:
    params = _torch_params(memory_url, "job", 1, 1, timeout=IN_PROCESS_WITHIN_S)
    handler = create_torchrun_handler(params)
    try:
        handler.set_closed()
        assert handler.is_closed()
        with pytest.raises(torch_api.RendezvousClosedError):
            handler.next_rendezvous()
    finally:
        handler.shutdown()


# -- real torchrun ---------------------------------------------------------------------------


def _redundant_count(backend: StoreRendezvousBackend) -> int:
    current = backend.get_state()
    return 0 if current is None else len(decode(current[0]).redundancy_list)


def _wait_until(predicate: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # bounded by ``within``
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within} s")
        time.sleep(POLL_S)


def _children(pid: int) -> list[int]:
    """The pids of ``pid``'s children (from /proc)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _runs_a_test_script(pid: int) -> bool:
    """Whether ``pid`` is (still) a worker running one of this test's scripts, so that a
    pid reused by an unrelated process is never killed."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(SCRIPTS).encode() in command


@dataclass
class Agent:
    """One torchrun process (one node)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    workers: set[int] = field(default_factory=set)

    def tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(f"  [{self.name}] {line}" for line in lines[-40:])

    def kill(self) -> None:
        """SIGKILL the node: the agent and every worker it started (each worker runs in a
        session of its own)."""
        if self.proc.poll() is None:  # not reaped yet: its pid is still its own
            self.workers.update(_children(self.proc.pid))
            _kill_group(self.proc.pid)
        for worker in sorted(self.workers):
            if _runs_a_test_script(worker):
                _kill_group(worker)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(KILL_WITHIN_S)


class Cluster:
    """torchrun agents of one job on this host, and what their workers reported."""

    def __init__(self, folder: Path, endpoint: str, run_id: str) -> None:
        self.folder = folder
        self.endpoint = endpoint
        self.run_id = run_id
        self.agents: list[Agent] = []

    def start(
        self,
        name: str,
        nnodes: str,
        script: str = "train.py",
        max_restarts: int = 0,
        conf: dict[str, str] | None = None,
    ) -> Agent:
        settings = dict(FAST_CONF if conf is None else conf)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            "--nproc-per-node=1",
            f"--max-restarts={max_restarts}",
            "--rdzv-backend=rdzv",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={self.run_id}",
            f"--rdzv-conf={','.join(f'{k}={v}' for k, v in sorted(settings.items()))}",
            "--local-addr=127.0.0.1",
            "--monitor-interval=0.1",
            str(SCRIPTS / script),
            str(self.folder),
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env["RDZV_TEST_NODE"] = name
        env["LOGLEVEL"] = "INFO"
        env["OMP_NUM_THREADS"] = "1"
        env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
        log = self.folder / f"agent-{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                cwd=self.folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        agent = Agent(name, proc, log)
        self.agents.append(agent)
        return agent

    def progress(self, name: str) -> list[dict[str, Any]]:
        """The steps node ``name``'s workers reported (a line being written is skipped)."""
        path = self.folder / f"progress-{name}.jsonl"
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        for agent in self.agents:
            if agent.name == name:
                agent.workers.update(r["pid"] for r in records)
        return records

    def wait_for(self, what: str, predicate: Callable[[], bool]) -> None:
        deadline = time.monotonic() + STEP_WITHIN_S
        while not predicate():  # bounded by STEP_WITHIN_S
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {STEP_WITHIN_S} s\n{self.logs()}")
            time.sleep(POLL_S)

    def sees_world(self, name: str, world_size: int, after_pid: set[int] | None = None) -> bool:
        return any(
            r["world_size"] == world_size and r["pid"] not in (after_pid or set())
            for r in self.progress(name)
        )

    def finish(self) -> None:
        """Tell the workers to stop (they agree on it in their next step)."""
        (self.folder / "finish").touch()

    def wait(self, agent: Agent) -> int:
        try:
            return agent.proc.wait(RUN_WITHIN_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"torchrun {agent.name} still runs after {RUN_WITHIN_S} s\n{self.logs()}"
            ) from None

    def logs(self) -> str:
        return "\n".join(agent.tail() for agent in self.agents)

    def stop_all(self) -> None:
        """Kill every agent and its workers, each even if killing another one raised."""
        with contextlib.ExitStack() as kills:
            for agent in self.agents:
                kills.callback(agent.kill)
                kills.callback(self.progress, agent.name)  # first: learn its worker pids


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    _installed_entry_point()
    clusters: list[Cluster] = []
    with contextlib.ExitStack() as stops:

        def make(endpoint: str, run_id: str | None = None) -> Cluster:
            folder = tmp_path / f"job{len(clusters)}"
            folder.mkdir()
            cluster = Cluster(folder, endpoint, run_id or f"job{len(clusters)}")
            clusters.append(cluster)
            stops.callback(cluster.stop_all)
            return cluster

        yield make


def _sqlite_url(tmp_path: Path) -> str:
    # Agents, their workers and a SIGKILLed agent's recovery share one file on a loaded
    # 2-core machine: allow a generous lock wait so a slow peer is not an error.
    return f"sqlite://{tmp_path / 'rdzv.db'}?busy_timeout_ms=30000"


def _check_allreduce(cluster: Cluster, agents: list[Agent], shared: bool) -> None:
    codes = [cluster.wait(agent) for agent in agents]
    assert codes == [0, 0], cluster.logs()
    records = [json.loads((cluster.folder / f"allreduce-{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in records] == [0, 1]
    assert {r["world_size"] for r in records} == {2}
    assert {r["sum"] for r in records} == {3.0}  # (0 + 1) + (1 + 1)
    assert len({r["master"] for r in records}) == 1
    assert {r["use_agent_store"] for r in records} == {str(shared)}
    # At LOGLEVEL=INFO each agent tells its rendezvous events (issue 26, item 5).
    joined = re.compile(
        rf"^\[I [^]]* rdzv\.handler\] node \S+ joined round \d+ of run "
        rf"'{re.escape(cluster.run_id)}' as rank [01] of 2 ",
        re.MULTILINE,
    )
    for agent in agents:
        assert joined.search(agent.log.read_text()), agent.tail()


@pytest.mark.slow
@pytest.mark.parametrize("shared", [True, False], ids=["agent-store", "worker-store"])
def test_two_agents_allreduce_over_sqlite(
    cluster_factory: Callable[[str], Cluster], tmp_path: Path, shared: bool
) -> None:
    cluster = cluster_factory(_sqlite_url(tmp_path))
    conf = dict(FAST_CONF, use_agent_store=str(shared).lower())
    agents = [cluster.start(n, "2", "allreduce.py", conf=conf) for n in ("a", "b")]
    _check_allreduce(cluster, agents, shared)


@pytest.mark.slow
def test_two_agents_allreduce_over_redis(
    cluster_factory: Callable[[str], Cluster], redis_server: Any
) -> None:
    cluster = cluster_factory(redis_server.url)
    agents = [cluster.start(n, "2", "allreduce.py") for n in ("a", "b")]
    _check_allreduce(cluster, agents, True)


@pytest.mark.slow
def test_two_agents_allreduce_over_etcd(
    cluster_factory: Callable[[str], Cluster], etcd_server: Any
) -> None:
    cluster = cluster_factory(etcd_server.url)
    agents = [cluster.start(n, "2", "allreduce.py") for n in ("a", "b")]
    _check_allreduce(cluster, agents, True)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_second_job_with_the_same_run_id_trains_after_the_first(
    cluster_factory: Callable[..., Cluster],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    store: str,
) -> None:
    """Issue 26, item 1: a requeued job keeps its --rdzv-id, and starts where the job
    before it closed the run (its agents left it at shutdown): the new job reopens the
    run and trains, as it would under c10d."""
    url = (
        _sqlite_url(tmp_path) if store == "sqlite" else request.getfixturevalue("redis_server").url
    )
    first = cluster_factory(url, "requeued")
    _check_allreduce(first, [first.start(n, "2", "allreduce.py") for n in ("a", "b")], True)
    second = cluster_factory(url, "requeued")
    agents = [second.start(n, "2", "allreduce.py") for n in ("a", "b")]
    _check_allreduce(second, agents, True)
    reopened = re.compile(r"started a new job under run 'requeued' \(epoch 1, ")
    assert any(reopened.search(agent.log.read_text()) for agent in agents), second.logs()


@pytest.mark.slow
def test_a_bad_conf_value_stops_torchrun_with_a_clear_error(
    cluster_factory: Callable[[str], Cluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(_sqlite_url(tmp_path))
    agent = cluster.start(
        "a", "1", "allreduce.py", conf=dict(FAST_CONF, keep_alive_interval="soon")
    )
    assert cluster.wait(agent) != 0
    assert (
        "config option 'keep_alive_interval' is 'soon' (str), which is not a finite number"
        in agent.log.read_text()
    )
    assert not list(cluster.folder.glob("allreduce-*.json"))


@pytest.mark.slow
def test_torchrun_refuses_a_memory_store_for_several_agents(
    cluster_factory: Callable[[str], Cluster],
) -> None:
    cluster = cluster_factory("memory://job")
    agent = cluster.start("a", "1:2", "allreduce.py")
    assert cluster.wait(agent) != 0
    log = agent.log.read_text()
    assert MEMORY_REFUSAL.format(n=2) in log, cluster.logs()
    assert "sqlite:///path/job.db, redis://host:6379/0 or etcd://host:2379" in log
    assert not list(cluster.folder.glob("allreduce-*.json"))


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_survivors_rerendezvous_when_an_agent_is_killed(
    cluster_factory: Callable[[str], Cluster], tmp_path: Path, protocol: str
) -> None:
    # The survivor's worker fails at once (its peer's socket closes), so its agent
    # re-rendezvouses before the dead node's heartbeat expired: it leaves the complete
    # round and waits, and must find the dead node itself. Under `scale` it waited for
    # good until waiting nodes watched the first participant.
    cluster = cluster_factory(_sqlite_url(tmp_path))
    conf = dict(FAST_CONF, protocol=protocol)
    a, b = (cluster.start(n, "1:3", max_restarts=3, conf=conf) for n in ("a", "b"))
    cluster.wait_for(
        "both nodes train in a world of 2",
        lambda: cluster.sees_world("a", 2) and cluster.sees_world("b", 2),
    )
    # Kill the node whose worker is rank 0 (its agent hosts the workers' store).
    last = [r for r in cluster.progress("a") if r["world_size"] == 2][-1]
    victim, survivor = (a, b) if last["group_rank"] == 0 else (b, a)
    before = {r["pid"] for r in cluster.progress(survivor.name)}
    victim.kill()
    cluster.wait_for(
        f"{survivor.name} trains alone after {victim.name} died",
        lambda: cluster.sees_world(survivor.name, 1, after_pid=before),
    )
    cluster.finish()
    assert cluster.wait(survivor) == 0, cluster.logs()
    after = [r for r in cluster.progress(survivor.name) if r["pid"] not in before]
    assert {(r["world_size"], r["rank"], r["sum"]) for r in after} == {(1, 0, 1.0)}
    # The survivor said what it waited for (issue 26, item 5: it used to print nothing):
    # the last call of its new round, then the round it joined alone; under `hardened`
    # it prunes the dead node from the state (under `scale` the round it leaves ends,
    # and the dead node is in no later round).
    told = survivor.log.read_text()
    assert " waits for the last call of round " in told, survivor.tail()
    assert " joined round " in told and " as rank 0 of 1 " in told, survivor.tail()
    if protocol == "hardened":
        assert " pruned node " in told and " it was silent for " in told, survivor.tail()
    # A worker failure used one restart: torch counts it, membership changes it does not.
    assert {r["restart_count"] for r in after} == {1}


@pytest.mark.slow
def test_running_agents_grow_the_world_when_a_late_agent_arrives(
    cluster_factory: Callable[[str], Cluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(_sqlite_url(tmp_path))
    a = cluster.start("a", "1:3", max_restarts=3)
    cluster.wait_for("a trains alone", lambda: cluster.sees_world("a", 1))
    alone = {r["pid"] for r in cluster.progress("a")}
    b = cluster.start("b", "1:3", max_restarts=3)
    cluster.wait_for(
        "a restarts its worker into a world of 2 with b",
        lambda: cluster.sees_world("a", 2, after_pid=alone) and cluster.sees_world("b", 2),
    )
    cluster.finish()
    assert [cluster.wait(a), cluster.wait(b)] == [0, 0], cluster.logs()
    grown = [r for r in cluster.progress("a") + cluster.progress("b") if r["world_size"] == 2]
    assert {r["sum"] for r in grown} == {3.0}
    assert sorted({r["rank"] for r in grown}) == [0, 1]
    assert len({r["master"] for r in grown}) == 1  # one master for the whole round
    # Membership changes do not use up restarts; the agent saw b through
    # num_nodes_waiting() (torch's agent logs what it found).
    assert {r["restart_count"] for r in grown} == {0}
    assert "Detected 1 new nodes from group_rank=0; will restart worker group" in (
        a.log.read_text()
    )


@pytest.mark.slow
def test_a_redundant_agent_exits_cleanly_when_the_job_ends(
    cluster_factory: Callable[[str], Cluster], tmp_path: Path
) -> None:
    endpoint = _sqlite_url(tmp_path)
    cluster = cluster_factory(endpoint)
    a, b = (cluster.start(n, "2") for n in ("a", "b"))
    cluster.wait_for(
        "a and b train together", lambda: cluster.sees_world("a", 2) and cluster.sees_world("b", 2)
    )
    c = cluster.start("c", "2")
    with opened_store(endpoint) as store:
        backend = StoreRendezvousBackend(store, cluster.run_id)
        cluster.wait_for("c is on the redundancy list", lambda: _redundant_count(backend) == 1)
    cluster.finish()
    assert [cluster.wait(a), cluster.wait(b), cluster.wait(c)] == [0, 0, 0], cluster.logs()
    assert cluster.progress("c") == []  # c never ran a worker
    assert "was redundant when the rendezvous closed" in c.log.read_text()
