"""Real processes that follow torch's elastic agent rule, and a controller for them.

An *agent* (``python tests/agents.py CONFIG_JSON``) does what torch's elastic agent does
with a rendezvous handler (``torch/distributed/elastic/agent/server/api.py``):

- it calls ``next_rendezvous()``; once that returns, its "workers" run;
- while they run it polls ``num_nodes_waiting()`` every ``poll_s`` seconds (torch's
  monitor interval, 0.1 s under torchrun) and re-rendezvouses as soon as the count is
  above 0;
- when its workers fail it re-rendezvouses at once (here: on the controller's command);
- optionally it polls ``is_closed()`` too and ends once the rendezvous is closed;
- optionally (``gloo``) its "workers" are real: after each return it runs
  ``torch.distributed.init_process_group(backend="gloo", store=info.store, ...)`` and
  all-reduces a tensor holding ``rank + 1``, as a torch user of the plain handler would.

Every agent writes what it does as JSON lines into its own log (a line is written whole
and flushed, so the controller never reads half an event). The controller
(:class:`Agents`) starts agents as separate processes, sends them commands through files,
pauses them with SIGSTOP / SIGCONT, kills them with SIGKILL, and waits on their logs with
generous bounds: the tests built on it assert what happened, never how long it took.

Nothing here is pickled: configurations go in as JSON, results come out as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

EVENT_WAIT_S = 90.0
"""Real seconds the controller waits for an event before it fails the test."""
STOP_WAIT_S = 20.0
"""Real seconds an agent gets to exit after ``quit`` before it is killed."""
COMMAND_POLL_S = 0.02
"""Real seconds between an agent's looks for a command file while its workers run."""
MAX_ROUNDS_PER_AGENT = 200
"""Bound on the rendezvous calls of one agent (a storm ends there, and shows in its log)."""
LOG_POLL_S = 0.05
"""Real seconds between the controller's reads of the logs while it waits."""

REPO = Path(__file__).resolve().parent.parent

S = TypeVar("S")
"""A stored state, as a test's watcher reads it (rdzv's or torch's)."""

NO_TORCH = {"RDZV_TORCH": "0"}
"""The environment of a test process that never meets torch code: rdzv then does not
import torch (about 2-4 s and 200 MB a process on this machine; see rdzv._torch)."""


@contextmanager
def spawn_without_torch() -> Iterator[None]:
    """Processes started (``multiprocessing`` spawn) inside this block inherit
    :data:`NO_TORCH`; the test process's own environment is restored after it."""
    saved = {key: os.environ.get(key) for key in NO_TORCH}
    os.environ.update(NO_TORCH)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass(frozen=True)
class AgentConfig:
    """What one agent process is told (as JSON)."""

    index: int
    url: str
    run_id: str
    min_nodes: int
    max_nodes: int
    folder: str
    handler_config: dict[str, str] = field(default_factory=dict)
    poll_s: float = 0.1
    """Seconds between two ``num_nodes_waiting()`` calls while the workers run."""
    poll_closed: bool = False
    """Also poll ``is_closed()`` (once per ``closed_poll_s``) and end when it is True."""
    closed_poll_s: float = 1.0
    restart_on_waiting: bool = True
    """torch's rule: re-rendezvous when ``num_nodes_waiting() > 0``."""
    hold: bool = False
    """Wait for the command ``go`` before the first ``next_rendezvous`` (so that the test
    chooses the order of the calls independently of the order of the node ids)."""
    events: bool = False
    """Also write the handler's transition events (``rdzv.events``) to
    ``events-<index>.jsonl`` (for trace validation and debugging)."""
    torch_store: str = ""
    """If set, ``host:port`` of a torch ``TCPStore`` server to use as the handler's store
    (the rendezvous state stays in ``url``); needs torch."""
    torch_store_timeout_s: float = 1.0
    """The timeout of that ``TCPStore`` client (its waits raise ``DistStoreError`` after it)."""
    publish_delay_s: float = 0.0
    """With ``torch_store``: a node that is rank 0 publishes its bootstrap info this many
    seconds late (its store's ``multi_set`` of the bootstrap keys sleeps first)."""
    torch_backend: bool = False
    """With ``torch_store``: keep the rendezvous state in that TCPStore too, through torch's
    ``C10dRendezvousBackend``, and pass torch's ``RendezvousParameters`` (the setup of a
    torch user who changed only the import of ``create_handler``); ``url`` is unused."""
    gloo: bool = False
    """After each return, form a gloo process group over ``info.store`` and all-reduce."""
    impl: Literal["rdzv", "torch"] = "rdzv"
    """Whose handler the agent runs: rdzv's, or (``"torch"``, needs ``torch_store``) torch's
    own ``DynamicRendezvousHandler`` with torch's ``C10dRendezvousBackend`` over that
    TCPStore; ``handler_config`` then holds only torch's keys, and ``url`` is unused."""


# -- the agent (runs in its own process) ---------------------------------------------------


class _Log:
    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ev": event, "t": time.time(), **fields}, sort_keys=True)
        self._file.write(line + "\n")
        self._file.flush()


def _take(path: Path) -> bool:
    """Consume the command file ``path`` if it is there."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _make_handler(cfg: AgentConfig) -> Any:
    from rdzv import RendezvousParameters, create_handler

    if cfg.impl == "torch" and not cfg.torch_store:
        raise ValueError("impl 'torch' needs torch_store (host:port of a TCPStore server)")

    params = RendezvousParameters(
        "rdzv", cfg.url, cfg.run_id, cfg.min_nodes, cfg.max_nodes, **cfg.handler_config
    )
    if not cfg.torch_store:
        return create_handler(params)
    from datetime import timedelta

    import torch.distributed as dist

    from rdzv import StoreRendezvousBackend, open_store
    from rdzv.api import RendezvousStoreInfo

    class LatePublisher(dist.TCPStore):  # type: ignore[misc, name-defined]
        """A real TCPStore client whose bootstrap publication is ``publish_delay_s`` late
        (the keys rank 0 writes once the round completed)."""

        def multi_set(self, keys: list[str], values: list[bytes]) -> None:
            if any(k.endswith(RendezvousStoreInfo.TCP_STORE_ADDR_KEY) for k in keys):
                time.sleep(cfg.publish_delay_s)
            super().multi_set(keys, values)

    host, port = cfg.torch_store.rsplit(":", 1)
    store = LatePublisher(
        host, int(port), is_master=False, timeout=timedelta(seconds=cfg.torch_store_timeout_s)
    )
    if cfg.impl == "torch":
        return _torch_handler(cfg, store)
    if cfg.torch_backend:
        from torch.distributed.elastic.rendezvous import RendezvousParameters as TorchParameters
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
            C10dRendezvousBackend,
        )

        torch_params = TorchParameters(
            "c10d", cfg.torch_store, cfg.run_id, cfg.min_nodes, cfg.max_nodes, **cfg.handler_config
        )
        return create_handler(store, C10dRendezvousBackend(store, cfg.run_id), torch_params)
    state_store = open_store(cfg.url)
    return create_handler(store, StoreRendezvousBackend(state_store, cfg.run_id), params)


@dataclass(frozen=True)
class _TorchAnswer:
    """torch's ``RendezvousInfo`` and what rdzv's also carries: the round and its members."""

    store: Any
    rank: int
    world_size: int
    bootstrap_store_info: Any
    round: int
    participants: list[str]


def _torch_handler(cfg: AgentConfig, store: Any) -> Any:
    """torch's own ``DynamicRendezvousHandler`` (what torch's ``create_handler`` builds from
    the same keys), which also tells the round it returned."""
    from datetime import timedelta

    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    class Noting(DynamicRendezvousHandler):
        """Only notes the state its answer comes from: torch's ``_get_world`` reads rank and
        world size from it, and the round and members here are read from the same object."""

        _noted: tuple[int, list[str]] = (-1, [])

        @property
        def node(self) -> Any:
            return self._this_node

        def _get_world(self) -> tuple[int, int]:
            state = self._state_holder.state
            self._noted = (state.round, [str(n) for n in sorted(state.participants)])
            return state.participants[self._this_node], len(state.participants)

        def next_rendezvous(self) -> _TorchAnswer:  # type: ignore[override]  # a superset
            info = super().next_rendezvous()
            return _TorchAnswer(
                info.store, info.rank, info.world_size, info.bootstrap_store_info, *self._noted
            )

    conf = {key: int(value) for key, value in cfg.handler_config.items()}

    def seconds(key: str) -> timedelta | None:
        return timedelta(seconds=conf[key]) if key in conf else None

    timeout = RendezvousTimeout(
        seconds("join_timeout"),
        seconds("last_call_timeout"),
        seconds("close_timeout"),
        seconds("heartbeat_timeout"),
    )
    return Noting.from_backend(
        cfg.run_id,
        store,
        C10dRendezvousBackend(store, cfg.run_id),
        cfg.min_nodes,
        cfg.max_nodes,
        None,
        timeout,
        keep_alive_interval=conf.get("keep_alive_interval", 5),
        keep_alive_max_attempt=conf.get("keep_alive_max_attempt", 3),
    )


def _errors(cfg: AgentConfig) -> tuple[type[Exception], type[Exception], type[Exception]]:
    """The graceful-exit, closed and base errors of the agent's handler: torch's own handler
    raises torch's classes (rdzv's derive from them, not the other way round)."""
    if cfg.impl == "torch":
        from torch.distributed.elastic.rendezvous import api

        return api.RendezvousGracefulExitError, api.RendezvousClosedError, api.RendezvousError
    import rdzv

    return rdzv.RendezvousGracefulExitError, rdzv.RendezvousClosedError, rdzv.RendezvousError


def _all_reduce(info: Any, log: _Log) -> None:
    """What a torch user does with the plain handler's answer: a gloo process group over
    ``info.store``, one all-reduce of ``rank + 1`` (the sum is W(W+1)/2), then tear-down."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group(
        backend="gloo",
        store=info.store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timedelta(seconds=EVENT_WAIT_S),
    )
    try:
        tensor = torch.tensor([float(info.rank + 1)])
        dist.all_reduce(tensor)
        log("allreduce", round=info.round, rank=info.rank, sum=tensor.item())
    finally:
        dist.destroy_process_group()


def agent_main(cfg: AgentConfig) -> int:
    """Run one agent until it is told to quit, the rendezvous closes, or it fails."""
    RendezvousGracefulExitError, RendezvousClosedError, RendezvousError = _errors(cfg)
    folder = Path(cfg.folder)
    log = _Log(folder / f"agent-{cfg.index}.jsonl")
    if cfg.events:
        import logging

        events = logging.getLogger("rdzv.events")
        sink = logging.FileHandler(folder / f"events-{cfg.index}.jsonl", encoding="utf-8")
        sink.setFormatter(logging.Formatter("%(message)s"))
        events.addHandler(sink)
        events.setLevel(logging.DEBUG)
        events.propagate = False
    handler = _make_handler(cfg)
    log("start", node=str(handler.node), pid=os.getpid())
    commands = {
        name: folder / f"{name}-{cfg.index}" for name in ("go", "fail", "close", "quit", "poll-off")
    }
    if cfg.hold:
        log("hold")
        while not _take(commands["go"]):  # bounded: the controller sends go or quit
            if _take(commands["quit"]):
                return 0
            time.sleep(COMMAND_POLL_S)
    polling = cfg.restart_on_waiting
    try:
        for _ in range(MAX_ROUNDS_PER_AGENT):
            log("call")
            try:
                info = handler.next_rendezvous()
            except RendezvousGracefulExitError as exc:
                # Standing by when the job ended: the node leaves quietly.
                log("closed", where="next_rendezvous", graceful=True, msg=str(exc))
                return 0
            except RendezvousClosedError as exc:
                log("closed", where="next_rendezvous", msg=str(exc))
                return 0
            except RendezvousError as exc:
                log("error", where="next_rendezvous", type=type(exc).__name__, msg=str(exc))
                return 3
            log(
                "return",
                round=info.round,
                rank=info.rank,
                world_size=info.world_size,
                participants=[str(n) for n in info.participants],
                master=f"{info.bootstrap_store_info.master_addr}:"
                f"{info.bootstrap_store_info.master_port}",
            )
            if cfg.gloo:
                _all_reduce(info, log)
            why = _run_workers(cfg, handler, log, commands, polling)
            if why == "poll-off":
                polling = False
                why = _run_workers(cfg, handler, log, commands, polling)
            if why in ("quit", "closed"):
                return 0
            log("restart", why=why)
        log("error", where="agent", type="Bound", msg="too many rounds")
        return 4
    finally:
        log("exit")


def _run_workers(
    cfg: AgentConfig,
    handler: Any,
    log: _Log,
    commands: dict[str, Path],
    polling: bool,
) -> str:
    """The agent's monitor loop while its workers run; returns why it ended."""
    RendezvousError = _errors(cfg)[2]
    next_poll = next_closed = time.monotonic()
    last_count: int | None = None
    while True:  # bounded by the commands and the rendezvous (a test ends every agent)
        if _take(commands["quit"]):
            return "quit"
        if _take(commands["fail"]):
            return "worker"
        if _take(commands["poll-off"]):
            log("poll-off")
            return "poll-off"
        if _take(commands["close"]):
            handler.set_closed()
            log("set_closed")
        now = time.monotonic()
        if polling and now >= next_poll:
            next_poll = now + cfg.poll_s
            try:
                count = handler.num_nodes_waiting()
            except RendezvousError as exc:
                log("error", where="num_nodes_waiting", type=type(exc).__name__, msg=str(exc))
                raise
            if count != last_count:
                log("waiting", n=count)
                last_count = count
            if count > 0:
                return "waiting"
        if cfg.poll_closed and now >= next_closed:
            next_closed = now + cfg.closed_poll_s
            asked = time.time()
            closed = handler.is_closed()
            log("is_closed", closed=closed, asked=asked)
            if closed:
                return "closed"
        time.sleep(COMMAND_POLL_S)


# -- the controller (runs in the test) ------------------------------------------------------


class AgentFailed(AssertionError):
    pass


class Agents:
    """Agent processes of one run, their commands, signals and logs."""

    def __init__(self, folder: Path, url: str, min_nodes: int, max_nodes: int, **kw: Any) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.url = url
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.defaults = kw
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, index: int, **kw: Any) -> None:
        options = {"run_id": "job", **self.defaults, **kw}
        cfg = AgentConfig(
            index=index,
            url=self.url,
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            folder=str(self.folder),
            **options,
        )
        env = dict(os.environ)
        if not (cfg.torch_store or cfg.gloo or cfg.impl == "torch"):  # never meets torch
            env.update(NO_TORCH)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")]
        )
        err = (self.folder / f"agent-{index}.stderr").open("wb")
        self.procs[index] = subprocess.Popen(
            [sys.executable, str(Path(__file__)), json.dumps(cfg.__dict__)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
        err.close()
        self.wait_for(index, "start")

    def stop(self) -> None:
        """Quit every agent; kill those that do not exit in time (and resume paused ones)."""
        for i, proc in self.procs.items():
            if proc.poll() is None:
                (self.folder / f"quit-{i}").touch()
                os.kill(proc.pid, signal.SIGCONT)
        end = time.monotonic() + STOP_WAIT_S
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_WAIT_S)

    # -- commands and signals --------------------------------------------------------------
    def command(self, index: int, name: str) -> None:
        (self.folder / f"{name}-{index}").touch()

    def go(self, index: int) -> None:
        """Let an agent started with ``hold=True`` make its first call."""
        self.command(index, "go")

    def fail_worker(self, index: int) -> None:
        self.command(index, "fail")

    def pause(self, index: int) -> None:
        os.kill(self.procs[index].pid, signal.SIGSTOP)

    def resume(self, index: int) -> None:
        os.kill(self.procs[index].pid, signal.SIGCONT)

    def kill(self, index: int) -> None:
        proc = self.procs[index]
        proc.kill()
        proc.wait(STOP_WAIT_S)

    # -- logs -------------------------------------------------------------------------------
    def events(self, index: int) -> list[dict[str, Any]]:
        path = self.folder / f"agent-{index}.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.endswith("}"):
                out.append(json.loads(line))
        return out

    def all_events(self) -> list[tuple[int, dict[str, Any]]]:
        merged = [(i, e) for i in self.procs for e in self.events(i)]
        return sorted(merged, key=lambda ie: ie[1]["t"])

    def returns(self, index: int) -> list[dict[str, Any]]:
        return [e for e in self.events(index) if e["ev"] == "return"]

    def stderr(self, index: int) -> str:
        path = self.folder / f"agent-{index}.stderr"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def _check_alive(self, index: int) -> None:
        proc = self.procs[index]
        if proc.poll() is not None and proc.returncode not in (0, -signal.SIGKILL):
            raise AgentFailed(
                f"agent {index} exited with {proc.returncode}: {self.events(index)[-5:]}\n"
                f"{self.stderr(index)}"
            )

    def until_state(self, what: str, read: Callable[[], S], test: Callable[[S], bool]) -> S:
        """Wait (as :meth:`wait_until`) until a state ``read()`` returns passes ``test``;
        returns that state (the tests' store watchers read it from their own store)."""
        found: list[S] = []

        def check() -> bool:
            state = read()
            if test(state):
                found.append(state)
                return True
            return False

        self.wait_until(what, check)
        return found[0]

    def wait_until(
        self, what: str, predicate: Callable[[], bool], within: float = EVENT_WAIT_S
    ) -> None:
        end = time.monotonic() + within
        while time.monotonic() < end:  # bounded by ``within``
            if predicate():
                return
            for i in self.procs:
                self._check_alive(i)
            time.sleep(LOG_POLL_S)
        if predicate():
            return
        logs = {i: self.events(i)[-8:] for i in self.procs}
        raise AgentFailed(f"timed out after {within:g} s waiting for {what}; last events: {logs}")

    def wait_for(
        self, index: int, event: str, *, after: int = 0, within: float = EVENT_WAIT_S, **match: Any
    ) -> dict[str, Any]:
        """The first event ``event`` (with ``match``-ing fields) of agent ``index`` after
        its first ``after`` events of that kind."""
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            hits = [
                e
                for e in self.events(index)
                if e["ev"] == event and all(e.get(k) == v for k, v in match.items())
            ]
            if len(hits) > after:
                found.append(hits[after])
                return True
            return False

        self.wait_until(f"agent {index}: {event} {match or ''} (#{after + 1})", seen, within)
        return found[0]

    def count(self, index: int, event: str) -> int:
        return sum(1 for e in self.events(index) if e["ev"] == event)


def answers_agree(agents: Agents) -> list[str]:
    """Problems with the answers the agents got: every return of one round must carry the
    same world size, distinct ranks, and rank < world size; empty if none."""
    by_round: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for i in agents.procs:
        for e in agents.returns(i):
            by_round.setdefault(e["round"], []).append((i, e))
    problems = []
    for rnd, got in sorted(by_round.items()):
        sizes = {e["world_size"] for _, e in got}
        if len(sizes) > 1:
            shown = [(i, e["world_size"]) for i, e in got]
            problems.append(f"round {rnd}: world sizes differ: {shown}")
        ranks = [e["rank"] for _, e in got]
        if len(set(ranks)) != len(ranks):
            problems.append(f"round {rnd}: ranks repeat: {[(i, e['rank']) for i, e in got]}")
        for i, e in got:
            if not 0 <= e["rank"] < e["world_size"]:
                problems.append(
                    f"round {rnd}: agent {i} got rank {e['rank']} of world size {e['world_size']}"
                )
    return problems


@contextmanager
def agents(folder: Path, url: str, min_nodes: int, max_nodes: int, **kw: Any) -> Iterator[Agents]:
    group = Agents(folder, url, min_nodes, max_nodes, **kw)
    try:
        yield group
    finally:
        group.stop()


if __name__ == "__main__":
    sys.exit(agent_main(AgentConfig(**json.loads(sys.argv[1]))))
