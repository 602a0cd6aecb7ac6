"""Time to complete one min=max rendezvous of N nodes, and the store traffic it costs.

For each store (memory://, sqlite://), mode (threads of one process, or separate
processes started with spawn) and N, every node calls ``next_rendezvous`` at the same
moment; the time is from that moment until the last node returned. CAS attempts,
conflicts (lost compare-and-sets) and reads are summed over the nodes of the rendezvous.
When torch is importable, torch's own DynamicRendezvousHandler runs the same
rendezvous over its c10d TCPStore backend, and the ratio torch / rdzv is printed.

    python3 benchmarks/bench_handler.py            # short: N = 2, 8, 16
    python3 benchmarks/bench_handler.py --full     # N = 2, 4, 8, 16, 32, 64
    python3 benchmarks/bench_handler.py --sizes 4,32 --modes threads --stores sqlite

memory:// is in-process only, so it has no processes row. Processes are timed from a
shared start instant on the system-wide monotonic clock; their start-up is not counted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

SHORT_SIZES = (2, 8, 16)
FULL_SIZES = (2, 4, 8, 16, 32, 64)
JOIN_TIMEOUT = "120"
"""Seconds a benchmark rendezvous may take before it counts as failed."""
START_DELAY = 0.5
"""Seconds between telling processes the start instant and that instant."""
WAIT_LIMIT = 300.0
"""Real seconds the benchmark waits for one measurement before giving up."""


@dataclass
class Result:
    seconds: float
    cas: int
    conflicts: int
    reads: int


def parse_sizes(
    parser: argparse.ArgumentParser, text: str | None, default: Sequence[int]
) -> list[int]:
    """The N values of a ``--sizes`` flag (``default`` when it is not given); a flag that
    is not comma-separated positive integers is a usage error (exit 2)."""
    if not text:
        return list(default)
    try:
        sizes = [int(s) for s in text.split(",") if s]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, e.g. 8,32; got {text!r}")
    if not sizes or any(n < 1 for n in sizes):
        parser.error(f"--sizes {text!r}: every size must be >= 1")
    return sizes


# -- rdzv ------------------------------------------------------------------------------------------
def _params(url: str, run_id: str, n: int, protocol: str | None = None) -> Any:
    from rdzv import RendezvousParameters

    extra = {} if protocol is None else {"protocol": protocol}
    return RendezvousParameters(
        "rdzv", url, run_id, n, n, join_timeout=JOIN_TIMEOUT, keep_alive_interval="5", **extra
    )


def rdzv_threads(url: str, n: int, run_id: str, protocol: str | None = None) -> Result:
    """N handlers (``protocol``: a variant name, None for the handler's default) as threads."""
    from rdzv import create_handler

    handlers = [create_handler(_params(url, run_id, n, protocol)) for _ in range(n)]
    ends = _run_threads([h.next_rendezvous for h in handlers])
    stats = [h.io_stats() for h in handlers]
    for h in handlers:
        h.shutdown()
    return Result(
        ends,
        sum(s.cas_attempts for s in stats),
        sum(s.cas_conflicts for s in stats),
        sum(s.reads for s in stats),
    )


def _run_threads(calls: list[Callable[[], Any]]) -> float:
    """Start every call at one instant (a barrier); seconds until the last returned."""
    barrier = threading.Barrier(len(calls) + 1)
    errors: list[BaseException] = []

    def target(call: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(c,), daemon=True) for c in calls]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join(WAIT_LIMIT)
    elapsed = time.perf_counter() - start
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"a rendezvous failed: {errors[:1] or 'a thread hung'}")
    return elapsed


def _rdzv_process(url: str, n: int, run_id: str, start_file: str, out: str) -> None:
    from rdzv import create_handler

    handler = create_handler(_params(url, run_id, n))
    handler.is_closed()  # open the store connection before the clock runs
    before = handler.io_stats()
    Path(out + ".ready").touch()
    start_at = _wait_start(Path(start_file))
    while time.monotonic() < start_at:  # bounded by START_DELAY
        time.sleep(0.0005)
    handler.next_rendezvous()
    end = time.monotonic()
    s = handler.io_stats()
    counts = [s.cas_attempts, s.cas_conflicts, s.reads - before.reads]
    Path(out).write_text(json.dumps([end, *counts]))
    _wait_finish(Path(start_file))
    handler.shutdown()  # closes the rendezvous: only once every node has its result


def _wait_start(path: Path) -> float:
    end = time.monotonic() + WAIT_LIMIT
    while time.monotonic() < end:  # bounded by WAIT_LIMIT
        if path.exists() and path.stat().st_size:
            return float(path.read_text())
        time.sleep(0.005)
    raise RuntimeError("the benchmark never gave the start signal")


def _wait_finish(start_file: Path) -> None:
    finish = start_file.with_name("finish")
    end = time.monotonic() + WAIT_LIMIT
    while time.monotonic() < end and not finish.exists():  # bounded by WAIT_LIMIT
        time.sleep(0.005)


def _run_processes(
    target: Callable[..., None], n: int, args: Callable[[int, str, str], tuple[Any, ...]]
) -> Result:
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        start_file = str(Path(tmp) / "start")
        outs = [str(Path(tmp) / f"out-{i}.json") for i in range(n)]
        procs = [
            ctx.Process(target=target, args=args(i, start_file, outs[i]), daemon=True)
            for i in range(n)
        ]
        for p in procs:
            p.start()
        # Every process created its handler before the clock runs: start-up is not timed.
        end = time.monotonic() + WAIT_LIMIT
        while time.monotonic() < end and not all(Path(o + ".ready").exists() for o in outs):
            time.sleep(0.01)  # bounded by WAIT_LIMIT
        start_at = time.monotonic() + START_DELAY
        Path(start_file).write_text(repr(start_at))
        end = time.monotonic() + WAIT_LIMIT
        while time.monotonic() < end and not all(Path(o).exists() for o in outs):
            time.sleep(0.005)  # bounded by WAIT_LIMIT
        Path(start_file).with_name("finish").touch()
        for p in procs:
            p.join(WAIT_LIMIT)
        for p in procs:
            if p.is_alive():
                p.kill()
        if not all(Path(o).exists() for o in outs):
            raise RuntimeError("a rendezvous process failed (no result written)")
        rows = [json.loads(Path(o).read_text()) for o in outs]
    return Result(
        max(r[0] for r in rows) - start_at,
        sum(r[1] for r in rows),
        sum(r[2] for r in rows),
        sum(r[3] for r in rows),
    )


def rdzv_processes(url: str, n: int, run_id: str) -> Result:
    return _run_processes(_rdzv_process, n, lambda i, s, o: (url, n, run_id, s, o))


# -- torch (optional) ------------------------------------------------------------------------------
def torch_available() -> bool:
    try:
        import torch.distributed  # noqa: F401
    except Exception:
        return False
    return True


def _torch_handler(port: int, n: int, run_id: str) -> Any:
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    store = dist.TCPStore(  # type: ignore[attr-defined,unused-ignore]
        "127.0.0.1", port, is_master=False, use_libuv=True
    )
    backend = C10dRendezvousBackend(store, run_id)
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", run_id, n, n, join_timeout=JOIN_TIMEOUT
    )
    return create_handler(store, backend, params)


def _torch_server() -> Any:
    import torch.distributed as dist

    return dist.TCPStore(  # type: ignore[attr-defined,unused-ignore]
        "127.0.0.1", 0, is_master=True, wait_for_workers=False
    )


def torch_threads(n: int, run_id: str) -> Result:
    server = _torch_server()
    handlers = [_torch_handler(server.port, n, run_id) for _ in range(n)]
    seconds = _run_threads([h.next_rendezvous for h in handlers])
    for h in handlers:
        h.shutdown()
    return Result(seconds, -1, -1, -1)


def _torch_process(port: int, n: int, run_id: str, start_file: str, out: str) -> None:
    handler = _torch_handler(port, n, run_id)
    Path(out + ".ready").touch()
    start_at = _wait_start(Path(start_file))
    while time.monotonic() < start_at:  # bounded by START_DELAY
        time.sleep(0.0005)
    handler.next_rendezvous()
    Path(out).write_text(json.dumps([time.monotonic(), -1, -1, -1]))
    _wait_finish(Path(start_file))
    handler.shutdown()


def torch_processes(n: int, run_id: str) -> Result:
    server = _torch_server()
    port = server.port
    return _run_processes(_torch_process, n, lambda i, s, o: (port, n, run_id, s, o))


# -- the table -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="N = 2, 4, 8, 16, 32, 64")
    parser.add_argument("--sizes", help="comma-separated N values (overrides --full)")
    parser.add_argument("--modes", default="threads,processes", help="threads,processes")
    parser.add_argument("--stores", default="memory,sqlite", help="memory,sqlite")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if importable")
    args = parser.parse_args(argv)
    sizes = parse_sizes(parser, args.sizes, FULL_SIZES if args.full else SHORT_SIZES)
    modes = [m for m in args.modes.split(",") if m]
    stores = [s for s in args.stores.split(",") if s]
    for m in modes:
        if m not in ("threads", "processes"):
            parser.error(f"unknown mode {m!r}; use threads and/or processes")
    for s in stores:
        if s not in ("memory", "sqlite"):
            parser.error(f"unknown store {s!r}; use memory and/or sqlite")
    with_torch = not args.no_torch and torch_available()
    torch_note = "yes" if with_torch else "off (--no-torch)" if args.no_torch else "not installed"
    print(
        f"bench_handler: sizes={','.join(map(str, sizes))} modes={','.join(modes)} "
        f"stores={','.join(stores)} torch={torch_note}"
    )
    header = (
        f"{'store':<7} {'mode':<9} {'N':>3} {'seconds':>8} {'cas':>6} {'conflicts':>9} "
        f"{'reads':>7} {'cas/node':>8} {'torch s':>8} {'torch/rdzv':>10}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        for store in stores:
            for mode in modes:
                if store == "memory" and mode == "processes":
                    continue  # memory:// cannot be shared between processes
                for n in sizes:
                    run_id = f"bench-{store}-{mode}-{n}"
                    url = (
                        f"memory://{run_id}"
                        if store == "memory"
                        else f"sqlite://{Path(tmp) / (run_id + '.db')}"
                    )
                    run = rdzv_threads if mode == "threads" else rdzv_processes
                    r = run(url, n, run_id)
                    torch_s = ratio = "-"
                    if with_torch and store == "sqlite":
                        t = (torch_threads if mode == "threads" else torch_processes)(n, run_id)
                        torch_s = f"{t.seconds:.3f}"
                        ratio = f"{t.seconds / r.seconds:.1f}x"
                    print(
                        f"{store:<7} {mode:<9} {n:>3} {r.seconds:>8.3f} {r.cas:>6} "
                        f"{r.conflicts:>9} {r.reads:>7} {r.cas / n:>8.2f} {torch_s:>8} "
                        f"{ratio:>10}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
