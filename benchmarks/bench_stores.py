"""Rendezvous time and store traffic per node for N nodes, on every store side by side.

Stores: memory://, sqlite://, redis:// and etcd:// (a real redis-server and etcd are
started on loopback in a temporary directory and stopped afterwards; see
``tests/servers.py``). For each store and N, N handlers (threads of this process, each
with its own store connection) call ``next_rendezvous`` at one instant (the timing is
``bench_handler.rdzv_threads``), once per protocol (``hardened``, the handler's default,
and ``scale``, which joins through an announcement set); the table shows the time until
the last returned and, per node, the reads and compare-and-set attempts it made. With
``--repeat K`` each row is K rounds (a fresh run id each): ``seconds`` is then their
median and ``max s`` the slowest, the column that shows a round stalled until a timeout
(the reads and CAS columns are means over the K rounds). A second table times single
store operations (one thread, loopback).

    python3 benchmarks/bench_stores.py                    # N = 8, 32, 128
    python3 benchmarks/bench_stores.py --sizes 8 --stores redis,etcd --protocols hardened
    python3 benchmarks/bench_stores.py --sizes 8,16 --stores redis --repeat 100
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "tests", ROOT / "benchmarks"):
    if str(extra) not in sys.path:  # run from a checkout without installing
        sys.path.insert(0, str(extra))

from bench_handler import parse_sizes, rdzv_threads  # noqa: E402

SIZES = (8, 32, 128)
STORES = ("memory", "sqlite", "redis", "etcd")
PROTOCOLS = ("hardened", "scale")
OPS = 200
"""Single operations timed per kind and store."""
MAX_REPEAT = 10_000
"""Bound on ``--repeat`` (rounds per row)."""


@contextmanager
def store_urls(stores: tuple[str, ...], folder: Path) -> Iterator[dict[str, str]]:
    """A URL per store; the servers run until the block ends."""
    from servers import EtcdServer, RedisServer

    urls: dict[str, str] = {}
    redis_server = etcd_server = None
    try:
        for store in stores:
            if store == "memory":
                urls[store] = "memory://bench"
            elif store == "sqlite":
                # 128 threads contend for SQLite's one write lock: let writers queue longer.
                urls[store] = f"sqlite://{folder / 'bench.db'}?busy_timeout_ms=60000"
            elif store == "redis":
                redis_server = RedisServer(folder / "redis").start()
                urls[store] = redis_server.url
            elif store == "etcd":
                etcd_server = EtcdServer(folder / "etcd").start()
                urls[store] = etcd_server.url
            else:
                raise SystemExit(f"unknown store {store!r}; choose from {', '.join(STORES)}")
        yield urls
    finally:
        if redis_server is not None:
            redis_server.stop()
        if etcd_server is not None:
            etcd_server.stop()


def time_ops(url: str) -> dict[str, float]:
    """Mean milliseconds of get, set, compare_set and add (one thread)."""
    from rdzv.stores import open_store

    store = open_store(url, timeout=timedelta(seconds=10))
    prefix = uuid.uuid4().hex
    key = f"{prefix}/k"
    store.set(key, b"0")
    results: dict[str, float] = {}
    calls: dict[str, Callable[[int], object]] = {
        "get": lambda i: store.get(key),
        "set": lambda i: store.set(key, str(i)),
        "compare_set": lambda i: store.compare_set(key, str(i), str(i + 1)),
        "add": lambda i: store.add(f"{prefix}/n", 1),
    }
    for name, call in calls.items():
        store.set(key, "0")
        start = time.perf_counter()
        for i in range(OPS):
            call(i)
        results[name] = (time.perf_counter() - start) / OPS * 1000
    close = getattr(store, "close", None)
    if callable(close):
        close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", help="comma-separated N values (default 8,32,128)")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument(
        "--protocols", default=",".join(PROTOCOLS), help="variant names, comma-separated"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help=f"rounds per row (1..{MAX_REPEAT}; default 1): median and slowest are shown",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.repeat <= MAX_REPEAT:
        parser.error(f"--repeat must be between 1 and {MAX_REPEAT}, got {args.repeat}")
    sizes = parse_sizes(parser, args.sizes, SIZES)
    stores = tuple(args.stores.split(","))
    protocols = tuple(args.protocols.split(","))
    from spec import get_variant

    for protocol in protocols:
        try:
            get_variant(protocol)
        except ValueError as exc:
            parser.error(f"--protocols: {exc}")
    with tempfile.TemporaryDirectory() as tmp, store_urls(stores, Path(tmp)) as urls:
        repeat = args.repeat
        rounds = "" if repeat == 1 else f", {repeat} rounds per row"
        print(f"rendezvous of N threads (each its own handler and connection{rounds})")
        slowest = "" if repeat == 1 else f" {'max s':>9}"
        print(
            f"{'store':<8} {'protocol':<9} {'N':>5} {'seconds':>9}{slowest} {'reads/node':>11} "
            f"{'CAS/node':>9}"
        )
        for store in stores:
            for protocol in protocols:
                for n in sizes:
                    try:
                        results = [
                            rdzv_threads(urls[store], n, f"bench-{uuid.uuid4().hex[:8]}", protocol)
                            for _ in range(repeat)
                        ]
                    except RuntimeError as exc:  # report the row, keep measuring the others
                        print(f"{store:<8} {protocol:<9} {n:>5} failed: {str(exc)[:300]}")
                        continue
                    seconds = [r.seconds for r in results]
                    worst = "" if repeat == 1 else f" {max(seconds):>9.3f}"
                    reads = sum(r.reads for r in results) / repeat
                    cas = sum(r.cas for r in results) / repeat
                    print(
                        f"{store:<8} {protocol:<9} {n:>5} {statistics.median(seconds):>9.3f}"
                        f"{worst} {reads / n:>11.1f} {cas / n:>9.1f}",
                        flush=True,
                    )
        print()
        print(f"single operations, mean ms over {OPS} (one thread)")
        print(f"{'store':<8} {'get':>8} {'set':>8} {'CAS':>8} {'add':>8}")
        for store in stores:
            ms = time_ops(urls[store])
            print(
                f"{store:<8} {ms['get']:>8.3f} {ms['set']:>8.3f} {ms['compare_set']:>8.3f} "
                f"{ms['add']:>8.3f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
