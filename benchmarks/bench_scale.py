"""The ``hardened`` and ``scale`` protocols from 8 to 1,024 nodes, on real Redis and etcd.

``scale`` is the handler's default protocol (``rdzv.api.DEFAULT_PROTOCOL``); its rows say
``scale (default)``, and ``--default-only`` (or ``--protocols default``) measures it alone.

For each N, store and protocol, N handlers call ``next_rendezvous`` at one instant for a
min = max = N round. The nodes are P worker processes x about N/P threads (column
``nodes``; by default at most ``THREADS_PER_PROC`` threads per process, ``--procs``
overrides), each handler with its own store connection; every worker releases its threads
at one start instant on the host's monotonic clock, and the time runs from that instant
until the last node of any worker returned. A row shows that time,
CAS attempts, lost CAS (conflicts) and announcements summed over the nodes, and the bytes
the *server* moved during the round: Redis ``INFO stats`` (``total_net_input_bytes`` +
``total_net_output_bytes``), etcd ``/metrics`` (``etcd_network_client_grpc_received_bytes_total``
+ ``..._sent_bytes_total``, which count the JSON gateway's traffic as gRPC messages).
A second round with ``keep_alive_interval`` = 1 s is then left running: its handlers'
keep-alive threads beat, and the server's bytes (and the nodes' CAS) over
``--steady-intervals`` intervals are reported per interval. For N <= 128 torch's own
DynamicRendezvousHandler over a c10d TCPStore runs the same round (``bench_handler``):
columns ``c10d torch s`` and ``c10d/rdzv`` (torch's seconds divided by the row's).

Every measurement runs in a fresh subprocess bounded by ``--cap`` seconds (the join
timeout) plus start-up slack, so the threads of a failed round cannot slow the next one;
a failed or killed measurement prints ``failed: <reason>`` in its row.

    python3 benchmarks/bench_scale.py                      # N = 8..1024, redis and etcd
    python3 benchmarks/bench_scale.py --quick --stores memory --no-torch --no-plots
    python3 benchmarks/bench_scale.py --sizes 8,64 --stores redis --markdown
    python3 benchmarks/bench_scale.py --sizes 128,1024 --stores redis,etcd --protocols scale \
        --no-torch --no-plots --markdown --cap 60        # the issue's targets
    python3 benchmarks/bench_scale.py --default-only --sizes 8,128,1024 --no-plots \
        --markdown                  # the default protocol beside torch's c10d handler
    python3 benchmarks/bench_scale.py --default-only --sizes 1024 --no-steady --no-torch \
        --no-plots --wait-slices 1,5  # the handler's wait slice, old and new, side by side

Plots (SVG, log-log) go to docs/benchmarks/ unless ``--no-plots``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "tests", ROOT / "benchmarks"):
    if str(extra) not in sys.path:  # run from a checkout without installing
        sys.path.insert(0, str(extra))

import bench_handler  # noqa: E402
from bench_handler import torch_available, torch_threads  # noqa: E402
from bench_stores import store_urls  # noqa: E402
from scale_report import (  # noqa: E402
    Outcome,
    Row,
    load_rows,
    markdown_table,
    save_rows,
    text_header,
    text_line,
    write_plots,
)

SIZES = (8, 64, 128, 512, 1024)
QUICK_SIZES = (8, 64)
STORES = ("redis", "etcd")
ALL_STORES = ("memory", "sqlite", "redis", "etcd")
PROTOCOLS = ("hardened", "scale")
DEFAULT = "default"
"""What ``--protocols`` takes for the handler's default protocol (``rdzv.api.DEFAULT_PROTOCOL``)."""
TORCH_MAX_N = 128
"""Largest N torch's handler is run at (its threads poll a TCPStore once per second)."""
CAP_S = 120.0
"""Default per-measurement cap in seconds (the join timeout of every handler)."""
ROUND_KEEP_ALIVE = "5"
"""keep_alive_interval (s) of the timed round: torch's default."""
STEADY_KEEP_ALIVE_S = 1.0
"""Default keep_alive_interval (s) of the steady-state round (short, so the window is
short; ``--steady-interval`` sets it: at N = 1,024 on two cores, one second is less than
the machine needs to run 1,024 heartbeats, so nodes miss their beats and are pruned)."""
STEADY_INTERVALS = 2
"""Default number of keep-alive intervals the steady-state window lasts."""
SETTLE_INTERVALS = 2.0
"""Keep-alive intervals between the end of the round and the start of the window (every
node has beaten since the round, and the stragglers' first reads are over)."""
CHILD_SLACK_S = 60.0
"""Seconds a measurement subprocess gets beyond its watchdog's bound before it is killed..."""
CHILD_SLACK_PER_NODE_S = 0.1
"""...plus this per node (creating 1,024 handlers and connections takes a while)."""
WATCHDOG_SLACK_S = 30.0
"""A measurement still running this long after its cap (plus its steady window) reports
how many nodes returned and ends its process (the parent's kill is the last resort)."""
PROBE_TIMEOUT_S = 10.0
"""Bound on one read of a server's traffic counters."""
RESULT_PREFIX = "RESULT "


# -- server traffic counters ------------------------------------------------------------------
def _server_of(store: str, url: str) -> tuple[str | None, int]:
    """Which server counters to read for a store URL: (kind, port), kind None if none."""
    if store in ("redis", "etcd"):
        port = urlsplit(url).port
        if port is None:
            raise ValueError(f"the {store} URL {url!r} has no port")
        return store, port
    return None, 0


def _redis_bytes(port: int) -> int:
    """total_net_input_bytes + total_net_output_bytes from ``INFO stats`` (raw RESP)."""
    with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_S) as s:
        s.sendall(b"*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n")
        data = b""
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while time.monotonic() < deadline:  # bounded by PROBE_TIMEOUT_S
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            head, sep, rest = data.partition(b"\r\n")
            if sep and head.startswith(b"$") and len(rest) >= int(head[1:]):
                break
    fields = dict(
        line.split(":", 1) for line in data.decode(errors="replace").splitlines() if ":" in line
    )
    try:
        return int(fields["total_net_input_bytes"]) + int(fields["total_net_output_bytes"])
    except KeyError as exc:
        raise RuntimeError(f"redis INFO stats on port {port} has no {exc}") from exc


ETCD_COUNTERS = (
    "etcd_network_client_grpc_received_bytes_total",
    "etcd_network_client_grpc_sent_bytes_total",
)


def _etcd_bytes(port: int) -> int:
    """The client gRPC byte counters of etcd's Prometheus endpoint (the JSON gateway is a
    gRPC client inside etcd, so its traffic is counted there; /metrics itself is not)."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as reply:
        text = reply.read().decode()
    total = 0.0
    seen = set()
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ETCD_COUNTERS:
            total += float(line.rsplit(" ", 1)[1])
            seen.add(name)
    if len(seen) != len(ETCD_COUNTERS):
        raise RuntimeError(f"etcd /metrics on port {port} lacks {set(ETCD_COUNTERS) - seen}")
    return int(total)


def server_bytes(kind: str | None, port: int) -> int | None:
    if kind == "redis":
        return _redis_bytes(port)
    if kind == "etcd":
        return _etcd_bytes(port)
    return None


class ByteMeter:
    """Deltas of a server's byte counters, minus what reading them costs."""

    def __init__(self, kind: str | None, port: int) -> None:
        self.kind, self.port = kind, port
        first = server_bytes(kind, port)
        second = server_bytes(kind, port)
        # Two probes back to back: their difference is one probe's own request + reply.
        self.overhead = 0 if first is None or second is None else second - first

    def read(self) -> int | None:
        return server_bytes(self.kind, self.port)

    def delta(self, before: int | None, after: int | None) -> int | None:
        if before is None or after is None:
            return None
        return max(0, after - before - self.overhead)


# -- one measurement (runs in a child process) ------------------------------------------------
def _params(url: str, run_id: str, n: int, protocol: str, cap: float, interval: str) -> Any:
    from rdzv import RendezvousParameters

    return RendezvousParameters(
        "rdzv",
        url,
        run_id,
        n,
        n,
        protocol=protocol,
        join_timeout=f"{cap:g}",
        keep_alive_interval=interval,
    )


def _handlers(job: dict[str, Any], interval: str, count: int) -> list[Any]:
    from rdzv import create_handler

    n = int(job["n"])
    return [
        create_handler(_params(job["url"], job["run_id"], n, job["protocol"], job["cap"], interval))
        for _ in range(count)
    ]


class _Returned:
    """How many nodes of the running measurement returned from next_rendezvous, over all
    worker processes (for the watchdog's report)."""

    lock = threading.Lock()
    count = 0

    @classmethod
    def add(cls, k: int = 1) -> None:
        with cls.lock:
            cls.count += k


_RELEASED = threading.Event()
"""Set when the nodes of the running measurement are released (START sent): the watchdog
counts the cap from then, not from the measurement process's start, so the workers'
start-up (imports, torch's included when it is installed: about 3 s of CPU and 230 MB a
process here; creating the handlers and their connections) is bounded by its own bound,
:data:`WORKER_READY_S`, and not charged to the rendezvous."""


COUNTERS = ("cas_attempts", "cas_conflicts", "reads", "announces", "announced_reads", "beats")
"""IoStats counters summed over the nodes (``beats``: writes of a node's own heartbeat key,
in variants that keep heartbeats outside the state; 0 where the handler has none)."""


def _sums(handlers: list[Any]) -> dict[str, int]:
    stats = [h.io_stats() for h in handlers]
    return {name: sum(getattr(s, name, 0) for s in stats) for name in COUNTERS}


# -- worker processes: the nodes --------------------------------------------------------------
# A measurement's N nodes are ``procs`` worker processes, each running its share of the N
# handlers as threads (each handler with its own store connection). Workers talk to the
# measurement process in lines: the worker says READY once its handlers exist and its
# threads wait; it is sent START <monotonic instant> (Linux's monotonic clock is one clock
# for every process of the host), releases its threads at that instant, writes R each time
# a node returned and DONE <json> once all did; STATS asks for its counter sums; EOF on its
# input ends it.
START_DELAY_S = 0.3
"""Seconds between sending START and the start instant (every worker gets it in time)."""
WORKER_READY_S = 120.0
"""Bound on a worker's start-up (imports, creating its handlers and their connections)."""


def split_nodes(n: int, procs: int) -> list[int]:
    """How many of ``n`` nodes each of ``procs`` processes runs (sizes differ by at most
    one; no process gets none)."""
    procs = max(1, min(procs, n))
    return [n // procs + (1 if i < n % procs else 0) for i in range(procs)]


THREADS_PER_PROC = 32
"""Default most nodes (threads) per worker process. Hundreds of threads in one
interpreter spend more time handing its lock around than working (measured at N = 1,024
on Redis, two cores: 2 processes x 512 threads did not finish within 30 s, 8 x 128 took
14 s, 32 x 32 took 7 s), which is a cost of the simulation, not of a node."""


def default_procs(store: str, n: int) -> int:
    """Worker processes for a measurement: memory:// lives in one process; otherwise
    enough processes that none runs more than :data:`THREADS_PER_PROC` nodes."""
    if store == "memory":
        return 1
    return max(1, -(-n // THREADS_PER_PROC))


def _say(line: str) -> None:
    with _printed_line:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


_printed_line = threading.Lock()


def worker(job_json: str) -> NoReturn:
    """One worker process: its share of the nodes, as threads; never returns."""
    job = json.loads(job_json)
    count = int(job["count"])
    bound = float(job["cap"]) + WATCHDOG_SLACK_S + _steady_s(job) + 60.0
    if job.get("wait_slice") is not None:
        import rdzv.driver

        # --wait-slices: the handler's longest blocking wait, for this measurement only.
        rdzv.driver.MAX_WAIT_SLICE = float(job["wait_slice"])
    handlers = _handlers(job, job["interval"], count)
    if not job.get("gc", False):
        # One process holds the decoded states of all its nodes, so each pass of the
        # cyclic collector walks N/P nodes' objects where a one-node process walks one
        # node's (measured at N = 1,024 on Redis, 32 x 32: 19-25 s with the collector,
        # 7 s without). The objects made so far are set aside, and the collector is off
        # for this short-lived process; reference counting still frees everything else.
        gc.collect()
        gc.freeze()
        gc.disable()
    go = threading.Event()
    ends: list[float] = []
    errors: list[str] = []

    def node(handler: Any) -> None:
        if not go.wait(bound):
            return
        try:
            handler.next_rendezvous()
            ends.append(time.monotonic())
        except BaseException as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            _say("R")

    threads = [threading.Thread(target=node, args=(h,), daemon=True) for h in handlers]
    for t in threads:
        t.start()
    _say("READY")
    for line in sys.stdin:  # bounded: the measurement process sends a few commands
        command, _, arg = line.strip().partition(" ")
        if command == "START":
            start_at = float(arg)
            delay = start_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            go.set()
            until = time.monotonic() + bound
            for t in threads:
                t.join(max(0.0, until - time.monotonic()))
            done = {
                "end": max(ends) if ends else None,
                "returned": len(ends),
                "errors": errors[:1],
                **_sums(handlers),
            }
            _say("DONE " + json.dumps(done, sort_keys=True))
        elif command == "STATS":
            _say("STATS " + json.dumps(_sums(handlers), sort_keys=True))
        else:
            break
    os._exit(0)


_LIVE: list[_Worker] = []
"""Worker processes started by this measurement process (killed by :func:`_finish`)."""


class _Worker:
    """The measurement process's end of one worker process."""

    def __init__(self, job: dict[str, Any], count: int) -> None:
        spec = {**job, "count": count}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        _LIVE.append(self)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        try:
            self.reader.start()
        except BaseException:
            self.kill()  # nobody holds this worker yet: stop its process here
            self.proc.wait(PROBE_TIMEOUT_S)
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # ends with the worker
            if line.strip() == "R":
                _Returned.add()
            else:
                self.lines.put(line.strip())
        self.lines.put(None)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def expect(self, word: str, timeout: float) -> str:
        """The argument of the worker's next line, which must start with ``word``."""
        try:
            line = self.lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            raise RuntimeError(f"a worker process sent no {word} within {timeout:g} s") from None
        if line is None:
            raise RuntimeError(f"a worker process exited (code {self.proc.wait()}) before {word}")
        head, _, arg = line.partition(" ")
        if head != word:
            raise RuntimeError(f"a worker process said {line[:200]!r}, expected {word}")
        return arg

    def stop(self) -> None:
        """End the process (closing its stdin ends it; killed if it does not end within
        PROBE_TIMEOUT_S) and then the reader thread (it ends at the end of the output)."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(PROBE_TIMEOUT_S)
        self.reader.join(PROBE_TIMEOUT_S)


class Nodes:
    """N nodes as ``procs`` worker processes x about N/procs threads, started together."""

    def __init__(self, job: dict[str, Any], interval: str) -> None:
        self.n = int(job["n"])
        self.counts = split_nodes(self.n, int(job.get("procs", 1)))
        run_id = f"scale-{job['protocol']}-{self.n}-{uuid.uuid4().hex[:8]}"
        spec = {**job, "run_id": run_id, "interval": interval}
        self.workers: list[_Worker] = []
        try:
            for c in self.counts:
                self.workers.append(_Worker(spec, c))  # before the next one starts
            until = time.monotonic() + WORKER_READY_S + CHILD_SLACK_PER_NODE_S * self.n
            for w in self.workers:
                w.expect("READY", until - time.monotonic())
        except BaseException:
            self.stop()
            raise

    def rendezvous(self, cap: float) -> tuple[float, dict[str, int]]:
        """Release every node at one instant; the seconds until the last returned (over
        all processes) and the counters summed over the nodes."""
        start_at = time.monotonic() + START_DELAY_S
        for w in self.workers:
            w.send(f"START {start_at!r}")
        _RELEASED.set()
        bound = START_DELAY_S + cap + WATCHDOG_SLACK_S + 60.0
        until = time.monotonic() + bound
        results = [json.loads(w.expect("DONE", until - time.monotonic())) for w in self.workers]
        returned = sum(r["returned"] for r in results)
        if returned < self.n:
            first = next((r["errors"][0] for r in results if r["errors"]), "a node hung")
            raise RuntimeError(
                f"a rendezvous failed: {returned} of {self.n} nodes returned; first error: {first}"
            )
        seconds = max(r["end"] for r in results) - start_at
        return seconds, {name: sum(r[name] for r in results) for name in COUNTERS}

    def sums(self) -> dict[str, int]:
        for w in self.workers:
            w.send("STATS")
        results = [json.loads(w.expect("STATS", PROBE_TIMEOUT_S)) for w in self.workers]
        return {name: sum(r[name] for r in results) for name in COUNTERS}

    @property
    def shape(self) -> str:
        """What stands in for the nodes, e.g. ``2x512`` (processes x threads each)."""
        low, high = min(self.counts), max(self.counts)
        return f"{len(self.counts)}x{high}" if low == high else f"{len(self.counts)}x{low}-{high}"

    def stop(self) -> None:
        """Stop every worker, each even if stopping another one raised."""
        with contextlib.ExitStack() as stops:
            for w in self.workers:
                stops.callback(w.stop)


def measure_round(job: dict[str, Any]) -> dict[str, Any]:
    """Time, CAS and server bytes of one min = max = N round (keep-alive 5 s)."""
    meter = ByteMeter(job["server"], job["port"])
    nodes = Nodes(job, ROUND_KEEP_ALIVE)
    try:
        before = meter.read()
        seconds, sums = nodes.rendezvous(float(job["cap"]))
        after = meter.read()
        moved = meter.delta(before, after)
        return {"seconds": seconds, "bytes": moved, "nodes": nodes.shape, **sums}
    finally:
        nodes.stop()


def _steady_s(job: dict[str, Any]) -> float:
    """Seconds the steady-state part of ``job`` sleeps (settling, then the window)."""
    interval = float(job.get("interval", STEADY_KEEP_ALIVE_S))
    return (SETTLE_INTERVALS + float(job.get("intervals", 0))) * interval


def measure_steady(job: dict[str, Any]) -> dict[str, Any]:
    """Per keep-alive interval after a completed round: server bytes, CAS, lost CAS."""
    interval = float(job.get("interval", STEADY_KEEP_ALIVE_S))
    meter = ByteMeter(job["server"], job["port"])
    nodes = Nodes(job, f"{interval:g}")
    try:
        nodes.rendezvous(float(job["cap"]))
        time.sleep(SETTLE_INTERVALS * interval)
        stats0, bytes0 = nodes.sums(), meter.read()
        window = job["intervals"] * interval
        time.sleep(window)
        stats1, bytes1 = nodes.sums(), meter.read()
    finally:
        nodes.stop()
    moved = meter.delta(bytes0, bytes1)
    per = float(job["intervals"])
    return {
        "bytes": None if moved is None else moved / per,
        **{name: (stats1[name] - stats0[name]) / per for name in COUNTERS},
    }


def measure_torch(job: dict[str, Any]) -> dict[str, Any]:
    bench_handler.JOIN_TIMEOUT = f"{job['cap']:g}"  # torch_threads reads it per call
    result = torch_threads(int(job["n"]), f"torch-{job['n']}-{uuid.uuid4().hex[:8]}")
    return {"seconds": result.seconds}


MEASURES = {"round": measure_round, "steady": measure_steady, "torch": measure_torch}


_printed = threading.Lock()


def _finish(result: dict[str, Any]) -> NoReturn:
    """Print the result line once and end the process (lingering handler threads,
    keep-alives included, end with it)."""
    if _printed.acquire(blocking=False):
        for w in list(_LIVE):  # a worker still running nodes would outlive us
            w.kill()
        sys.stdout.write(RESULT_PREFIX + json.dumps(result, sort_keys=True) + "\n")
        sys.stdout.flush()
    os._exit(0)


def child(job_json: str) -> NoReturn:
    """Run one measurement and print its result line; never returns."""
    job = json.loads(job_json)
    limit = float(job["cap"]) + WATCHDOG_SLACK_S + _steady_s(job)

    start_up = WORKER_READY_S + CHILD_SLACK_PER_NODE_S * int(job["n"])

    def watch() -> None:
        if not _RELEASED.wait(start_up + limit):
            error = f"the nodes were not released within {start_up + limit:g} s (worker start-up)"
            _finish({"ok": False, "error": error})
        time.sleep(START_DELAY_S + limit)
        with _Returned.lock:
            returned = _Returned.count
        error = (
            f"not finished {limit:g} s after the nodes were released: {returned} of "
            f"{job['n']} nodes returned"
        )
        _finish({"ok": False, "error": error})

    watchdog = threading.Thread(target=watch, name="watchdog", daemon=True)
    watchdog.start()
    try:
        result: dict[str, Any] = {"ok": True, **MEASURES[job["kind"]](job)}
    except BaseException as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    _finish(result)


# -- the parent: one subprocess per measurement -----------------------------------------------


def _short(reason: str) -> str:
    """One line of at most 160 characters: the innermost error's name and message, node
    ids left out (they differ from run to run)."""
    text = " ".join(reason.split())
    inner = re.search(r"(\w+Error)\(['\"](.*)", text)
    if inner:
        text = f"{inner.group(1)}: {inner.group(2)}"
    text = re.sub(r" of node \S+", "", text).rstrip("')]\"")
    return text if len(text) <= 160 else text[:157] + "..."


def run_child(job: dict[str, Any], cap: float) -> Outcome:
    """Run one measurement in a fresh interpreter, killed (the last resort) a slack after
    its own watchdog would have ended it: worker start-up, cap, steady window."""
    start_up = WORKER_READY_S + CHILD_SLACK_PER_NODE_S * int(job["n"])
    limit = start_up + cap + WATCHDOG_SLACK_S + _steady_s(job) + CHILD_SLACK_S
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(job)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return Outcome(False, error=f"no result within {limit:g} s (cap {cap:g} s + slack)")
    except BaseException:
        _kill(proc)
        raise
    for line in reversed(out.decode(errors="replace").splitlines()):
        if line.startswith(RESULT_PREFIX):
            data = json.loads(line[len(RESULT_PREFIX) :])
            if data.pop("ok"):
                return Outcome(True, data)
            return Outcome(False, error=_short(data["error"]))
    tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    return Outcome(False, error=_short(f"exit {proc.returncode}: {tail[0]}"))


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=PROBE_TIMEOUT_S)


# -- main ----------------------------------------------------------------------------------------
def _list(
    parser: argparse.ArgumentParser, text: str, allowed: Sequence[str], what: str
) -> list[str]:
    items = [s for s in text.split(",") if s]
    for item in items:
        if item not in allowed:
            parser.error(f"unknown {what} {item!r}; choose from {', '.join(allowed)}")
    if not items:
        parser.error(f"--{what}s needs at least one of {', '.join(allowed)}")
    return items


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--sizes", help="comma-separated N values (default 8,64,128,512,1024)")
    parser.add_argument("--quick", action="store_true", help="N = 8, 64 (smoke run)")
    parser.add_argument("--stores", default=",".join(STORES), help="of memory,sqlite,redis,etcd")
    parser.add_argument(
        "--protocols",
        default=",".join(PROTOCOLS),
        help=f"of hardened,scale,{DEFAULT} ({DEFAULT}: the handler's default protocol)",
    )
    parser.add_argument(
        "--default-only",
        action="store_true",
        help="only the handler's default protocol (the same as --protocols default)",
    )
    parser.add_argument("--cap", type=float, default=CAP_S, help="seconds per measurement")
    parser.add_argument("--steady-intervals", type=int, default=STEADY_INTERVALS)
    parser.add_argument(
        "--steady-interval",
        type=float,
        default=STEADY_KEEP_ALIVE_S,
        help="keep_alive_interval in seconds of the steady-state round (default %(default)s)",
    )
    parser.add_argument("--no-steady", action="store_true", help="skip the steady-state window")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if importable")
    parser.add_argument("--no-plots", action="store_true", help="write no SVG files")
    parser.add_argument("--plots-dir", default=str(ROOT / "docs" / "benchmarks"))
    parser.add_argument("--markdown", action="store_true", help="also print a markdown table")
    parser.add_argument("--save", help="also write the raw results to this JSON file")
    parser.add_argument(
        "--from-results", help="measure nothing: print and plot a file written by --save"
    )
    parser.add_argument(
        "--procs",
        type=int,
        help=f"worker processes the N nodes run in (default: N/{THREADS_PER_PROC} rounded up, "
        "memory:// 1)",
    )
    parser.add_argument(
        "--gc",
        action="store_true",
        help="leave Python's cyclic garbage collector on in the worker processes",
    )
    parser.add_argument(
        "--wait-slices",
        help="comma-separated seconds: measure each row once per value of the handler's "
        "longest blocking wait (rdzv.driver.MAX_WAIT_SLICE), side by side; its rows say "
        "e.g. 'scale 1s slice' (default: the handler's own slice, one measurement)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker)
    if args.child is not None:
        child(args.child)
    if args.from_results is not None:
        saved = load_rows(Path(args.from_results))
        print(text_header())
        for row in saved:
            print(text_line(row))
        return report(saved, args)
    sizes = bench_handler.parse_sizes(parser, args.sizes, QUICK_SIZES if args.quick else SIZES)
    slices: list[float | None] = [None]
    if args.wait_slices is not None:
        try:
            given = [float(x) for x in args.wait_slices.split(",") if x.strip()]
        except ValueError:
            parser.error(f"--wait-slices takes comma-separated seconds, got {args.wait_slices!r}")
        if not given or not all(0 < x <= 60 for x in given):
            parser.error(
                f"--wait-slices values must be seconds in (0, 60], got {args.wait_slices!r}"
            )
        slices = list(given)
    if args.cap <= 0:
        parser.error(f"--cap must be a positive number of seconds, got {args.cap}")
    if args.procs is not None and args.procs < 1:
        parser.error(f"--procs must be >= 1, got {args.procs}")
    if args.steady_intervals < 1:
        parser.error(f"--steady-intervals must be >= 1, got {args.steady_intervals}")
    if not args.steady_interval > 0:
        parser.error(
            f"--steady-interval must be a positive number of seconds, got {args.steady_interval}"
        )
    # SIGTERM (and SIGINT, even when the launching shell ignored it) unwind through the
    # finally blocks: the running measurement is killed and the servers are stopped.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stores = _list(parser, args.stores, ALL_STORES, "store")
    if "memory" in stores and args.procs is not None and args.procs > 1:
        parser.error(
            "memory:// keeps its data inside one process, so its nodes cannot span "
            f"--procs {args.procs} processes; use --procs 1, or sqlite to test processes"
        )
    from rdzv.api import DEFAULT_PROTOCOL

    chosen = DEFAULT if args.default_only else args.protocols
    names = _list(parser, chosen, (*PROTOCOLS, DEFAULT), "protocol")
    protocols = list(dict.fromkeys(DEFAULT_PROTOCOL if p == DEFAULT else p for p in names))
    with_torch = not args.no_torch and torch_available()
    window = f"{args.steady_intervals}x{args.steady_interval:g}s"
    print(
        f"bench_scale: sizes={','.join(map(str, sizes))} stores={','.join(stores)} "
        f"protocols={','.join(protocols)} cap={args.cap:g}s "
        f"steady={'off' if args.no_steady else window} "
        f"torch={'yes' if with_torch else 'no'} "
        f"procs={'auto' if args.procs is None else args.procs} gc={'on' if args.gc else 'off'}",
        flush=True,
    )
    print(
        "nodes: P worker processes x about N/P threads each (column nodes = PxT), one "
        "handler and store connection per node, all released at one instant; the "
        "collector of the worker processes is " + ("on" if args.gc else "off (--gc turns it on)"),
        flush=True,
    )
    print(text_header())
    print("-" * len(text_header()), flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp, store_urls(tuple(stores), Path(tmp)) as urls:
        for n in sizes:
            torch = None
            if with_torch and n <= TORCH_MAX_N:
                torch = run_child({"kind": "torch", "n": n, "cap": args.cap}, args.cap)
            for store in stores:
                kind, port = _server_of(store, urls[store])
                for protocol, wait_slice in [(p, w) for p in protocols for w in slices]:
                    job = {
                        "kind": "round",
                        "url": urls[store],
                        "server": kind,
                        "port": port,
                        "protocol": protocol,
                        "n": n,
                        "cap": args.cap,
                        "intervals": args.steady_intervals,
                        "interval": args.steady_interval,
                        "procs": default_procs(store, n) if args.procs is None else args.procs,
                        "gc": args.gc,
                        "wait_slice": wait_slice,
                    }
                    outcome = run_child(job, args.cap)
                    steady = None
                    if outcome.ok and not args.no_steady:
                        steady = run_child({**job, "kind": "steady"}, args.cap)
                    label = protocol if wait_slice is None else f"{protocol} {wait_slice:g}s slice"
                    row = Row(store, label, n, outcome, steady, torch)
                    rows.append(row)
                    print(text_line(row), flush=True)
                    if args.save:
                        save_rows(rows, Path(args.save))
    return report(rows, args)


def report(rows: Sequence[Row], args: argparse.Namespace) -> int:
    if args.markdown:
        print()
        print(markdown_table(rows))
    if not args.no_plots:
        for path in write_plots(rows, Path(args.plots_dir)):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
